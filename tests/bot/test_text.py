"""``unmask_links``: no text shown to a person keeps a link whose label hides its target."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from bot.text import invisibles_named, printable, unmask_links, url_passwords_masked
from tests.fakes.growth import assert_linear

# What any platform could read as a labelled link: Slack's <target|label> (not a mention or a
# command), Markdown's ](…) and a reference definition with a scheme.
MASKED = re.compile(
    r"<(?![@#!])[^<>|]+\|[^<>]*>|\]\(|^[ \t>*+-]*\[[^\]\n]+\]:[ \t]*\S+:", re.MULTILINE
)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "see <https://evil.example|https://bank.example> now",
            "see https://bank.example (https://evil.example) now",
        ),
        ("[docs](https://evil.example)", "docs (https://evil.example)"),
        ('[docs](https://evil.example "Bank docs")', "docs (https://evil.example)"),
        ("[docs](<https://evil.example/a b>)", "docs (https://evil.example/a%20b)"),
        ("[docs]( https://evil.example )", "docs (https://evil.example)"),
        ("[x](https://e.example/a_(b))", "x (https://e.example/a_(b))"),
        ("![logo](https://evil.example/x.png)", "!logo (https://evil.example/x.png)"),
        ("<mailto:a@bank.example|a@bank.example>", "a@bank.example"),
        ("<mailto:x@evil.example|a@bank.example>", "a@bank.example (mailto:x@evil.example)"),
        # the label is the target: the bare target
        ("[https://x.example](https://x.example)", "https://x.example"),
        ("<https://x.example|https://x.example>", "https://x.example"),
        ("[](https://evil.example)", "https://evil.example"),
        # nested: each link undone from the inside out
        (
            "[[bank](https://a.example)](https://b.example)",
            "bank (https://a.example) (https://b.example)",
        ),
        (
            "<https://b.example|[bank>](https://a.example)",
            "bank (https://b.example) (https://a.example)",
        ),
        (
            "[<https://a.example|bank>](https://b.example)",
            "bank (https://a.example) (https://b.example)",
        ),
        # a label Markdown reads with an escaped bracket: no longer a link at all
        ("[a\\]b](https://evil.example)", "[a\\]b] (https://evil.example)"),
        # invisible characters and direction overrides cannot hide or reorder the target
        ("[bank](https://evil\u200b.example)", "bank (https://evil.example)"),
        ("[bank\u202e](https://evil.example)", "bank (https://evil.example)"),
        ("<\u2066https://evil.example\u2069|bank>", "bank (https://evil.example)"),
        # reference links: resolved, and the definition kept visible but no longer one
        (
            'Read [the docs][d] and [D].\n\n[d]: https://evil.example "t"',
            "Read the docs (https://evil.example) and D (https://evil.example).\n\n"
            'd: https://evil.example "t"',
        ),
        (
            "[docs][]\n> [docs]:\n>   <https://evil.example>",
            "docs (https://evil.example)\n> docs: https://evil.example",
        ),
        (
            "- [ref]: https://evil.example\n\n[x][REF]",
            "- ref: https://evil.example\n\nx (https://evil.example)",
        ),
    ],
)
def test_a_masked_link_shows_its_target(text: str, shown: str) -> None:
    assert unmask_links(text) == shown
    assert not MASKED.search(unmask_links(text))


@pytest.mark.parametrize(
    "text",
    [
        "<@U0123|someone> <#C0123|general> <!here> <!subteam^S1|ops>",  # the mention defusing's
        "plain https://x.example and <https://x.example>",
        "[::1]:8080 and a[0]: int",
        "a list [1, 2] (sorted) and a todo [x]",
        # fullwidth brackets: no platform links them
        "\uff3bbank\uff3d\uff08https://evil.example\uff09",
        "",
    ],
)
def test_text_without_a_masked_link_is_unchanged(text: str) -> None:
    assert unmask_links(text) == text


def test_nothing_nested_deeper_than_the_passes_survives_as_a_link() -> None:
    deep = "[" * 300 + "bank" + "](https://evil.example)" * 300
    slack = "<https://evil.example|" * 300 + "bank" + ">" * 300
    for text in (deep, slack):
        shown = unmask_links(text)
        assert "https://evil.example" in shown
        assert not MASKED.search(shown)


@pytest.mark.parametrize(
    ("hostile", "count"),
    [
        (lambda n: "[a](" + " " * n, 50_000),
        (lambda n: "-  " * n + "[", 20_000),
        (lambda n: "[" * n, 50_000),
        (lambda n: "<a|" * n, 20_000),
        (lambda n: "[a](b" * n, 10_000),
    ],
    ids=lambda value: repr(value(3)) if callable(value) else str(value),
)
def test_hostile_text_is_undone_in_linear_time(hostile: Callable[[int], str], count: int) -> None:
    assert_linear(unmask_links, hostile(count // 8), hostile(count), k=8)


def test_printable_text_keeps_its_order_on_a_terminal() -> None:
    # An override shows "approve run_1 evil" as something else; isolates nest the same trick.
    for control in ("\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2069"):
        assert printable(f"approve {control}run_1 live") == "approve run_1 live"
    assert printable("שלום \u200f عربى") == "שלום \u200f عربى"  # letters and marks stay


@pytest.mark.parametrize("code", [c for c in range(128) if c != 0x1B])
def test_every_ascii_character_is_kept_or_dropped_as_the_patterns_say(code: int) -> None:
    # ASCII text without an unprintable character skips the patterns: each character is
    # checked against what they remove (controls, but tab and newline).
    char = chr(code)
    kept = char if char in "\t\n" or 0x20 <= code < 0x7F else ""
    assert printable(f"a{char}b") == f"a{kept}b"


def test_an_escape_sequence_in_ascii_text_is_removed() -> None:
    assert printable("plain \x1b[2J\x1b]0;title\x07text") == "plain text"


# Characters that show as nothing (zero-width, joiners, the byte-order mark, tags, variation
# selectors) or as a space that is not one: an approver reads "rm -rf /tmp/x" either way.
INVISIBLE = (
    "\u200b\u200c\u200d\u2060\ufeff\u00ad\u034f\u180e\u2800\u3164\ufe0f"
    "\U000e0001\U000e0041\U000e007f\U000e0100\u00a0\u2003\u2028\x7f\x85"
)


def test_each_invisible_character_in_exact_text_is_named_by_its_code_point() -> None:
    shown = invisibles_named(f"rm -rf /tmp/x{INVISIBLE} done")
    assert shown == (
        "rm -rf /tmp/x[U+200B][U+200C][U+200D][U+2060][U+FEFF][U+00AD][U+034F][U+180E]"
        "[U+2800][U+3164][U+FE0F][U+E0001][U+E0041][U+E007F][U+E0100][U+00A0][U+2003]"
        "[U+2028][U+007F][U+0085] done"
    )
    assert invisibles_named("\u202ebd-stnemyap\u202c") == "[U+202E]bd-stnemyap[U+202C]"
    assert invisibles_named("crème brûlée ✓ שלום") == "crème brûlée ✓ שלום"  # visible stays


def test_every_format_control_and_separator_character_is_named() -> None:
    import sys
    import unicodedata

    hidden = {"Cf", "Cc", "Zs", "Zl", "Zp"}
    missed = [
        f"U+{code:04X}"
        for code in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code)) in hidden
        and chr(code) not in " \t\n"
        and invisibles_named(chr(code)) == chr(code)
    ]
    assert missed == []


def test_plain_ascii_exact_text_is_returned_as_is_and_compiles_nothing() -> None:
    import subprocess
    import sys

    probe = (
        'from bot import text; shown = text.invisibles_named(\'restart_unit {"unit": "db"}\');'
        "print(shown, text._INVISIBLE._compiled is None)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split(maxsplit=1)[1] == '{"unit": "db"} True\n'
    assert invisibles_named("a\x1b[2Jb\tc\n") == "a[U+001B][2Jb\tc\n"


@pytest.mark.parametrize(
    ("line", "count", "tail"),
    [
        # Runs of a scheme's characters, each "." or "-" a word's start, no "://" after them.
        (lambda n: "a." * n + " http://probe:hunter22@proxy/", 32_768, " http://probe:…@proxy/"),
        (lambda n: "a-" * n + " http://probe:hunter22@proxy/", 32_768, " http://probe:…@proxy/"),
        (
            lambda n: ("x+y." * n + " ") * 2 + "http://probe:hunter22@proxy/",
            8_192,
            "http://probe:…@proxy/",
        ),
        # Where a parameter may start, again and again, its name never ending in "=".
        (lambda n: ";a" * n + " http://h/x;password=hunter22", 32_768, " http://h/x;password=…"),
        (
            lambda n: "#%" * n + " http://h/#access_token=hunter22",
            32_768,
            " http://h/#access_token=…",
        ),
        (
            lambda n: "?" + "%74" * n + "=1 http://h/?%74oken=hunter22",
            21_845,
            " http://h/?%74oken=…",
        ),
        (lambda n: "&a=" * n + " http://h/?api%5Fkey=hunter22", 21_845, " http://h/?api%5Fkey=…"),
        # A long user alone, and many of them.
        (lambda n: "http://" + "a" * n + "@h http://ghp_hunter22@h/", 65_536, " http://…@h/"),
        (lambda n: "s://u@" * n + " http://ghp_hunter22@h/", 10_922, " http://…@h/"),
        # Quoted keys, path tokens' starts, again and again, none ending as one.
        (lambda n: "'a': '" * n + "' 'token': 'hunter22'", 10_922, "'token': '…'"),
        (lambda n: '"a":"' * n + '" "api_key": "hunter22"', 13_107, '"api_key": "…"'),
        (lambda n: "/webhooks/1/" * n + " /webhooks/2/hunter22", 5_461, " /webhooks/2/…"),
        (
            lambda n: "hooks.slack.com/a/" + "b/" * n + " hooks.slack.com/s/T/B/hunter22",
            32_768,
            "/T/B/…",
        ),
    ],
    ids=lambda value: repr(value(3)) if callable(value) else str(value),
)
def test_a_long_line_is_masked_in_linear_time(
    line: Callable[[int], str], count: int, tail: str
) -> None:
    # Every log line goes through the masker, on the event loop: a 64 KiB line of dotted or
    # hyphenated words with a URL in it took 3 s (26 s for 200 KiB), each word's start read
    # to the run's end again. Read linearly, eight times the line takes eight times as long.
    assert_linear(url_passwords_masked, line(count // 8), line(count), k=8)
    shown = url_passwords_masked(line(count))
    assert shown.endswith(tail) and "hunter22" not in shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("see http://u:pw@h/x", "see http://u:…@h/x"),
        ("...https://u:pw@h/x", "...https://u:…@h/x"),  # a word's start inside a run
        ("-git+ssh://u:pw@h/x", "-git+ssh://u:…@h/x"),
        ("x.y-z://u:pw@h", "x.y-z://u:…@h"),
        ("1http://u:pw@h", "1http://u:pw@h"),  # no scheme starts a word there, as before
        ("_http://u:pw@h", "_http://u:pw@h"),
        ("é.http://u:pw@h and ftp://a:b@c", "é.http://u:…@h and ftp://a:…@c"),
        ("a.b.c ://u:pw@h", "a.b.c ://u:pw@h"),  # no scheme at all
        ("http://u:pw@h://v:pw@i", "http://u:…@h://v:pw@i"),
    ],
)
def test_a_urls_password_is_masked_where_a_scheme_starts_a_word(text: str, shown: str) -> None:
    assert url_passwords_masked(text) == shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ('{"token":"xoxb-1","n":1}', '{"token":"…","n":1}'),
        ("{'client_secret':'Cs-1'}", "{'client_secret':'…'}"),
        ("{'token': 'xoxb-1'}", "{'token': '…'}"),
        ("{'token':\t'xoxb-1'}", "{'token':\t'…'}"),
    ],
)
def test_a_quoted_keys_value_is_masked_and_the_rest_kept_as_written(text: str, shown: str) -> None:
    # The masked value came back after ": " whatever separated it: a compact JSON payload
    # ('"token":"…"') was rewritten beyond its secret, and no longer read as the line it was.
    assert url_passwords_masked(text) == shown
