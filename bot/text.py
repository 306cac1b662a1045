"""Text from a model, a tool or a user, made safe to show a person."""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Final

from bot.patterns import on_use

# Escape sequences a terminal acts on, 7-bit (ESC ...) and 8-bit (C1) forms: control strings
# (OSC, DCS, SOS, PM, APC) up to their terminator (BEL or ST) or the end of the text, CSI
# sequences, and the two- and three-byte escapes (charset selection, keypad modes, resets).
_ESCAPES: Final = on_use(
    r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]).*?(?:\x07|\x1b\\|\x9c|$)"
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|\x1b[ -/]*[0-~]?",
    re.DOTALL,
)
# Whatever control characters are left, C0 (but tab and newline), DEL and C1.
_CONTROLS: Final = on_use(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Direction overrides and isolates: they make a terminal show a line in another order than it
# is written (a run id, a name, a command read backwards). Marks (LRM, RLM) only nudge.
_REORDERING: Final = on_use("[\u202a-\u202e\u2066-\u2069]")
# Halves of a UTF-16 pair alone (a JSON or YAML escape can make one): no terminal can be sent
# them as UTF-8, so each is shown as the replacement character.
_SURROGATES: Final = on_use("[\ud800-\udfff]")
# A shell's variable written whole: $NAME, ${NAME}, or ${NAME} with a default or a check.
_SHELL_VARIABLE: Final = on_use(r"\$(?:\{[A-Za-z_]\w*(?:[-:?+=][^}]*)?\}|[A-Za-z_]\w*)")


# A URL's scheme, in a line of text: the run of a scheme's characters before "://", read whole
# from its start. Tried from each word's start in it ("a.b.c…"), a long run was read again and
# again: a 64 KiB line took seconds, on the event loop.
_SCHEME_RUN: Final = on_use(r"(?<![A-Za-z0-9+.-])[A-Za-z0-9+.-]++://")
# Where in that run the scheme starts: a letter that starts a word ("-git+ssh://" at "g").
_SCHEME_START: Final = on_use(r"\b[A-Za-z]")
# A URL's authority: up to a path, a query, a fragment, a blank or a quote (a URL inside a
# JSON string).
_AUTHORITY: Final = on_use(r"[^\s/?#\"'<>\\]*+")


def password_masked(url: str, mark: str = "…") -> str:
    """``url`` with the password of its user:password@ shown as ``mark``, parsed by hand (a URL
    being refused may be one urlsplit cannot read): the authority's last "@" ends it, so a
    password holding one is masked whole."""
    scheme, sep, rest = url.partition("://")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    userinfo, at, host = authority.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if not (sep and at):
        return url
    if not colon:  # a user alone: a token given as one (https://ghp_…@github.com) is masked
        shown = mark if _token_like(user) else user
        return f"{scheme}{sep}{shown}@{host}{rest[len(authority) :]}"
    return f"{scheme}{sep}{user}:{mark}@{host}{rest[len(authority) :]}"


# The starts of tokens that a host takes as a URL's user with no password (GitHub's, GitLab's,
# Slack's, OpenAI's keys): a user that starts so, or is long with a digit in it, is a token.
_TOKEN_STARTS: Final = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "xox")
_TOKEN_STARTS_TOO: Final = ("gldt-", "glrt-", "sk-")


def _token_like(user: str) -> bool:
    """Whether a URL's user, given alone, is a token rather than a login name (git, kestrel)."""
    if user.startswith((*_TOKEN_STARTS, *_TOKEN_STARTS_TOO)):
        return True
    return len(user) >= 20 and any(c.isdigit() for c in user)


def _passwords_masked(text: str) -> str:
    """``text`` with the password of each URL's user:password@ masked."""
    shown: list[str] = []
    done = 0  # the end of the last URL's authority
    for run in _SCHEME_RUN.finditer(text):
        if run.start() < done:
            continue  # inside that authority
        scheme = _SCHEME_START.search(text, run.start(), run.end() - 3)
        if scheme is None:
            continue  # no scheme starts a word there ("1http://")
        authority = _AUTHORITY.match(text, run.end())  # it matches even none
        end = run.end() if authority is None else authority.end()
        shown += (text[done : scheme.start()], password_masked(text[scheme.start() : end]))
        done = end
    shown.append(text[done:])
    return "".join(shown)


# A query parameter holds a credential when its name ends in one of these words (access_token,
# Azure's sig, X-Amz-Signature) or is an API key's name: "key" alone ends too many names
# (sort_key). The PII guard reads tool output by the same names (bot/pii/web.py).
QUERY_CREDENTIAL_ENDINGS: Final = ("token", "sig", "signature")
QUERY_API_KEYS: Final = frozenset(
    {"key", "apikey", "api_key", "api-key", "x-api-key", "access_key", "subscription-key"}
)
# A password's and a secret's names (?password=, &client_secret=): the guard reads them by its
# key=value and named-secret readers (bot/pii/labelled.py), anywhere in a text; the logs mask
# them in a query. A ticket opens a connection once (Slack's Socket Mode URL, which its SDK
# logs at debug): the logs mask it too.
_QUERY_LABELLED_ENDINGS: Final = ("password", "passwd", "secret", "ticket")
# A URL's parameter: its name after "?", "&", ";" (a path's or a JDBC URL's parameters) or "#"
# (a fragment's: OAuth's implicit grant), percent-encoded or not, and its value up to the next
# one, a fragment, a blank or a quote (a URL inside a JSON string). Tried only after one of
# those four, each try reading at most the name's 64 characters: linear in the line.
_QUERY_PARAMETER: Final = on_use(r"(?<=[?&;#])([A-Za-z0-9_.%-]{1,64})=([^&;\s#\"'<>\\]+)")
# Where a parameter can start: what a line must hold for the parameters to be read at all.
_PARAMETER_STARTS: Final = ("?", "&", ";", "#")
# A percent-encoded byte in a parameter's name ("%74oken", "api%5Fkey").
_PERCENT: Final = on_use(r"%([0-9A-Fa-f]{2})")


def _query_value_masked(found: re.Match[str]) -> str:
    """A URL's parameter, its value shown as "…" when its name is a credential's."""
    name = found.group(1)
    if "%" in name:  # read as the server reads it
        name = _PERCENT.sub(lambda byte: chr(int(byte.group(1), 16)), name)
    return f"{found.group(1)}=…" if _names_a_credential(name) else found.group()


def _names_a_credential(name: str) -> bool:
    """Whether a parameter's or a key's name is a credential's (token, sig, an API key, a
    password, a secret)."""
    name = name.lower()
    if name.endswith((*QUERY_CREDENTIAL_ENDINGS, *_QUERY_LABELLED_ENDINGS)):
        return True
    return name in QUERY_API_KEYS


# A token in a URL's path: Discord's interaction's and webhook's (/interactions/ID/TOKEN,
# /webhooks/ID/TOKEN: discord.py's rate limit warning names the URL), Slack's incoming
# webhook's and a click's response_url (hooks.slack.com/actions/T…/…/SECRET).
_PATH_TOKEN: Final = on_use(
    r"(/(?:interactions|webhooks)/\d{1,20}/)[A-Za-z0-9_.-]++"
    r"|(hooks\.slack\.com/[a-z]{1,16}/(?:[A-Za-z0-9_-]{1,40}/){1,3})[A-Za-z0-9_-]++"
)
_PATH_TOKEN_MARKS: Final = ("/interactions/", "/webhooks/", "hooks.slack.com/")
# A quoted key and its quoted value, as a dict's repr or a JSON object writes them (a
# library's debug line of a payload: Discord's events, Slack's bodies). The value stops at
# the next quote: each quote starts one try, reading at most to the next.
_KEYED_VALUE: Final = on_use(r"""((['"])([A-Za-z0-9_.-]{1,64})\2:\s?(['"]))[^'"\\]*+\4""")


def _path_token_masked(found: re.Match[str]) -> str:
    return f"{found.group(1) or found.group(2)}…"


def _keyed_value_masked(found: re.Match[str]) -> str:
    """A quoted key and its value, the value shown as "…" when the key names a credential;
    the key, its quotes and what separates it from the value kept as written."""
    if not _names_a_credential(found.group(3)):
        return found.group()
    return f"{found.group(1)}…{found.group(4)}"


# An Authorization header's credentials, as text (a command's output, curl -v), a dict's repr or
# JSON (a library's headers at debug; Go's hold a list of values, ``Authorization:[Basic …]``):
# what follows its scheme (Bearer, Basic, token), or the whole value when it names none; and a
# bearer token quoted without its header (a client's error). After a scheme, any credential of
# 8 characters or more; else one holding a digit, as tokens do ("authorization: denied by
# policy", "Bearer authentication" are prose). The PII guard redacts them for the model; the
# logs mask them whatever pii.mode says.
_AUTHORIZATION: Final = on_use(
    r"(?i)(\b(?:proxy-)?authorization['\"]?[ \t]{0,4}[:=][ \t]{0,4}\[?['\"]?"
    r"(?:([a-z][a-z0-9_-]{0,30})[ \t]+)?)([^\s'\"\\,;\]]++)"
)
_BEARER: Final = on_use(r"(?i)(\bbearer[ \t]+)()([a-z0-9._~+/-]{8,}+=*)")
# What a line must hold for them to be read at all (either case).
_AUTHORIZATION_MARKS: Final = ("uthorization", "UTHORIZATION", "earer", "EARER")


def _credential_masked(found: re.Match[str]) -> str:
    """A header's or a bearer's credential shown as "…" (group 3), when it is one: long enough
    after a scheme (group 2), else holding a digit."""
    credential = found.group(3)
    after_scheme = bool(found.group(2)) and len(credential) >= 8
    if not after_scheme and not any(c.isdigit() for c in credential):
        return found.group()
    return f"{found.group(1)}…"


def url_passwords_masked(text: str) -> str:
    """``text`` with the credentials of each URL in it masked (a log line, an error): the
    password of its user:password@, a token given as its user alone (``https://ghp_…@``), and
    the value of each parameter named for one, in its query, path or fragment, its name
    percent-encoded or not (``?token=``, ``&sig=``, ``?api%5Fkey=``, ``;password=``,
    ``#access_token=``, ``&client_secret=``); a token in a path (Discord's interactions and
    webhooks, Slack's hooks), a quoted key's value named so (``'token': '…'``), and an
    Authorization header's credentials (``Authorization: Bearer …``) or a bearer token's."""
    if "@" in text and "://" in text:
        text = _passwords_masked(text)
    if "=" in text and any(start in text for start in _PARAMETER_STARTS):
        text = _QUERY_PARAMETER.sub(_query_value_masked, text)
    if any(mark in text for mark in _PATH_TOKEN_MARKS):
        text = _PATH_TOKEN.sub(_path_token_masked, text)
    if "':" in text or '":' in text:
        text = _KEYED_VALUE.sub(_keyed_value_masked, text)
    if any(mark in text for mark in _AUTHORIZATION_MARKS):
        text = _BEARER.sub(_credential_masked, _AUTHORIZATION.sub(_credential_masked, text))
    return text


def shell_variable(text: str, *, argv: bool = False) -> bool:
    """Whether ``text`` is written whole as a shell variable (``$NAME``, ``${NAME}``,
    ``${NAME:-default}``), which nothing here expands. ``argv``: ``$name`` not in capitals, or
    of one letter, is a program's own text (sed's ``$p`` and ``$G``, on the last line; jq's
    ``$svc``, an ``--arg``)."""
    written = text.strip()
    if "$" not in text or _SHELL_VARIABLE.fullmatch(written) is None:
        return False
    name = written[1:]
    return not argv or written.startswith("${") or (name.isupper() and len(name) > 1)


def shell_variable_within(text: str) -> str | None:
    """The first shell variable written anywhere in ``text`` (``$HOME/ops``: ``$HOME``), or
    None: for a value that is a path, where a ``$`` is never the directory's own name."""
    if "$" not in text:
        return None
    found = _SHELL_VARIABLE.search(text)
    return None if found is None else found.group()


def not_utf8(exc: UnicodeDecodeError) -> str:
    """Why a file's bytes are not text, for people: the first byte that is not UTF-8, and where
    it is (an offset alone read as the byte's value)."""
    return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"


def flattened(text: str) -> str:
    """``text`` with its line breaks and runs of spaces made single spaces: shown inside a line
    of Kestrel's own (a log line, a card's line), it cannot start another."""
    return " ".join(text.split())


def printable(text: str) -> str:
    """``text`` safe for a terminal: escape sequences, control characters (but tab and
    newline) and direction overrides removed, so model and tool text cannot retitle, clear or
    rewrite the screen, nor reorder a line; a lone surrogate is shown as U+FFFD."""
    if text.isascii() and text.replace("\n", "").replace("\t", "").isprintable():
        return text  # nothing to remove: ASCII's unprintables are C0 and DEL
    text = _CONTROLS.sub("", _ESCAPES.sub("", text))
    return _SURROGATES.sub("\ufffd", _REORDERING.sub("", text))


# What shows as nothing, or as a space it is not, yet is part of a value: controls (C0 but tab
# and newline, DEL, C1), every format character (Cf: zero-width spaces and joiners, word
# joiners, the byte-order mark, overrides, tags U+E0000 on), the other default-ignorables
# (variation selectors, Hangul fillers, the grapheme joiner), the Braille blank, spaces and
# separators but the ASCII space, and lone surrogates. An approver reads "rm -rf /tmp/x" for a
# value that holds them, and two values that differ only by them as one.
_INVISIBLE: Final = on_use(
    "[\x00-\x08\x0b-\x1f\x7f-\xa0\xad\u034f\u0600-\u0605\u061c\u06dd\u070f"
    "\u0890\u0891\u08e2\u115f\u1160\u1680\u17b4\u17b5\u180b-\u180f\u2000-\u200f"
    "\u2028-\u202f\u205f-\u206f\u2800\u3000\u3164\ud800-\udfff\ufe00-\ufe0f\ufeff"
    "\uffa0\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)


def invisibles_named(text: str) -> str:
    """``text`` with each character that shows as nothing or as a space it is not (zero-width
    characters, tags, other format characters, controls) named by its code point
    (``[U+200B]``): where an approver reads a call's exact arguments, so that what is shown is
    every character of what runs."""
    if text.isascii() and text.replace("\n", "").replace("\t", "").isprintable():
        return text  # ASCII's invisibles are its controls
    return _INVISIBLE.sub(_code_point, text)


def _code_point(found: re.Match[str]) -> str:
    return f"[U+{ord(found.group()):04X}]"


def reordering_named(text: str) -> str:
    """``text`` with each direction override or isolate shown as its code point
    (``[U+202E]``): on a page, where the text stays whole but must read in written order."""
    if text.isascii():
        return text
    return _REORDERING.sub(_code_point, text)


# Compiled on first use (``bot.patterns``): a command's answer on a terminal is only made
# printable, and a process that shows no chat text never needs them.
# Labelled links. Slack's ``<target|label>`` (``<@U…>``, ``<#C…>`` and ``<!…>`` are mentions and
# commands, which the Slack adapter breaks where it defuses mentions); Markdown's inline
# ``[label](target "title")`` and ``[label](<target>)``, innermost first (a label holds no
# brackets), so a link nested in a label is undone on the next pass.
_SLACK_LINK: Final = on_use(r"<(?![@#!])([^<>|]+)\|([^<>]*)>")
_MD_LINK: Final = on_use(
    r"\[([^\[\]]*)\]\(\s*+(?:<([^<>\n]*)>|((?:[^\s()\\<]|\\.|\([^\s()]*\))*+))"
    r"(?:\s++(?:\"[^\"]*\"|'[^']*'|\([^()]*\)))?+\s*+\)"
)
# A reference definition (``[ref]: target``, in a quote or a list item too) whose target has a
# scheme: relative targets lead nowhere on a chat platform, and ``[::1]:8080`` stays as written.
_MD_DEFINITION: Final = on_use(
    r"^(?P<lead>[ \t>]*+(?:(?:[*+-]|\d{1,9}[.)])[ \t]++[ \t>]*+)*+)"
    r"\[(?P<ref>(?:[^\[\]\\]|\\.){1,999})\]:[ \t]*+(?:\n[ \t>]*+)?"
    r"(?P<target><[A-Za-z][A-Za-z0-9+.-]{1,31}:[^<>\n]*>|[A-Za-z][A-Za-z0-9+.-]{1,31}:\S*)",
    re.MULTILINE,
)
# ``[label][ref]``, ``[ref][]`` and ``[ref]`` (not followed by what makes it another form).
_MD_REFERENCE: Final = on_use(r"\[([^\[\]]+)\](?:\[([^\[\]]*)\]|(?![(:\[]))")
# Direction overrides and isolates: in a label they could reorder the target shown after it.
_BIDI: Final = on_use("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_MAX_PASSES: Final = 16


def unmask_links(text: str) -> str:
    """``text`` with every link whose label hides its target shown as ``label (target)``:
    Slack's ``<target|label>``, Markdown's ``[label](target)`` and ``[label](<target>)``,
    reference links and their definitions; a link whose label is its target becomes the bare
    target. What is left cannot be read as a masked link: a ``](`` that no pass could undo
    (an escaped bracket in a label, a link nested deeper than the passes) is split apart."""
    for _ in range(_MAX_PASSES):
        done = _MD_LINK.sub(_md_link, _SLACK_LINK.sub(_slack_link, text))
        if done == text:
            break
        text = done
    else:
        text = _SLACK_LINK.sub(lambda m: m.group(0).replace("|", "\u00a6"), text)
    if "]:" in text:
        text = _references(text)
    return text.replace("](", "] (")


def _slack_link(match: re.Match[str]) -> str:
    return _shown(match.group(2), match.group(1))


def _md_link(match: re.Match[str]) -> str:
    target = match.group(2) if match.group(2) is not None else match.group(3)
    return _shown(match.group(1), target)


def _shown(label: str, target: str) -> str:
    """``label (target)``, or the target alone when the label is the target or empty: the
    target without invisible characters, so that the link a platform makes of it is what is
    seen."""
    kept = "".join(c for c in target if unicodedata.category(c) not in ("Cf", "Cc"))
    seen = "%20".join(kept.split())
    label = _BIDI.sub("", label).strip()
    if not seen or label in (seen, seen.removeprefix("mailto:")):
        return label
    if not label:
        return seen
    return f"{label} ({seen})"


def _references(text: str) -> str:
    """Reference links resolved to ``label (target)``, and their definitions shown as
    ``ref: target`` (no longer definitions)."""
    targets: dict[str, str] = {}

    def define(match: re.Match[str]) -> str:
        ref, target = match.group("ref"), match.group("target").strip("<>")
        targets.setdefault(_ref_key(ref), target)
        return f"{match.group('lead')}{ref}: {_shown('', target)}"

    text = _MD_DEFINITION.sub(define, text)
    if not targets:
        return text

    def resolve(match: re.Match[str]) -> str:
        label, ref = match.group(1), match.group(2)
        target = targets.get(_ref_key(ref or label))
        return match.group(0) if target is None else _shown(label, target)

    return _MD_REFERENCE.sub(resolve, text)


def _ref_key(ref: str) -> str:
    """A reference label as Markdown matches it: case and runs of white space do not count."""
    return " ".join(ref.split()).casefold()


__all__ = ["invisibles_named", "printable", "unmask_links"]


# Text in a tool's output that speaks to the agent rather than about the system: the shapes
# prompt injections take. A mark for people, never a filter: it is neither complete nor exact.
# Each anchor word is found by ``str.find`` (fast over a long output); only there is a pattern
# tried: from the anchor on (``after``), or on the few characters before it (``before``).
_AFTER_ANCHORS: Final = {
    "ignore": "ignore",
    "disregard": "ignore",
    "forget": "ignore",
    "you": "you",
    "run": "run",
    "execute": "run",
    "call": "run",
    "invoke": "run",
    "trigger": "run",
    "do not": "do",
    "don't": "do",
}


# Compiled on first use (a process that traces no consequential call never reads an output for
# them): the patterns tried after each anchor kind, and before each word.
_AFTER: Final = {
    "ignore": on_use(
        r"(?:ignore|disregard|forget)\s+(?:(?:all|any|the|your|of|everything)\s+)*"
        r"(?:previous|prior|above|earlier|preceding|former|instructions|rules)\b"
    ),
    "you": on_use(
        r"you\s+(?:must|should|need\s+to|have\s+to|are\s+(?:now\s+)?(?:required|instructed))\b"
    ),
    "run": on_use(
        r"(?:run|execute|call|invoke|trigger)\s+(?:the\s+)?(?:tool\s+|command\s+)?`?"
        r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b"
    ),
    "do": on_use(r"(?:do\s+not|don't)\s+(?:tell|ask|inform|notify|mention)\b"),
}
_BEFORE: Final = {
    "instructions": on_use(r"\b(?:new|updated|system|real|actual)\s+$"),
    "prompt": on_use(r"\b(?:new|updated|system)\s+$"),
    "must": on_use(r"\b(?:assistants?|agents?|ais?|llms?|models?|bots?)\s+$"),
    "should": on_use(r"\b(?:assistants?|agents?|ais?|llms?|models?|bots?)\s+$"),
}


# A run's outputs are asked about again by each call traced against them and by every page
# that shows them; a string's hash is kept on it, so a repeat costs a lookup.
@functools.lru_cache(maxsize=64)
def instruction_like(text: str) -> bool:
    """Whether ``text`` holds instruction-like words ("ignore previous instructions", "run
    restart_unit …", "you must …") that a tool's output should not."""
    lowered = text.lower()
    for anchor, kind in _AFTER_ANCHORS.items():
        pattern = _AFTER[kind]
        at = lowered.find(anchor)
        while at >= 0:
            if _starts_word(lowered, at) and pattern.match(lowered, at):
                return True
            at = lowered.find(anchor, at + 1)
    for anchor, pattern in _BEFORE.items():
        at = lowered.find(anchor)
        while at >= 0:
            if pattern.search(lowered, max(0, at - 24), at):
                return True
            at = lowered.find(anchor, at + 1)
    return False


def _starts_word(text: str, at: int) -> bool:
    return at == 0 or not text[at - 1].isalnum()
