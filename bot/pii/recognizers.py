"""Built-in recognizers of the PII guard: anchored regexes first, validators after.

The guard scans every tool output, often megabytes of log text, on one core, so each
regex here starts with a literal (or a rarely seen character) that the regex engine's
prefix search skips to; a pattern starting with a digit or letter class would enter the
matcher at a quarter of all positions. Numbers are found from their first separator
("555-123-4567" from its first "-") and their leading digit group is read backwards in
Python; card and IBAN runs without separators are found in a "shape" of the text where
every digit reads 0 and every capital A. Checksums (Luhn, mod-97) and ipaddress run only
on the few candidates that get that far.

Text that is not ASCII is folded for detection first (per-character NFKC, other scripts'
digits, dashes and spaces made ASCII, invisible characters dropped), so full-width digits,
no-break or zero-width spaces cannot hide a number; hits are mapped back to the original.
Encoded secrets (base64, hex) are found from runs of base64 characters and decoded and
scanned again only when they read as text. Keys found by their prefix are looked for again
behind percent-escaped separators (a URL inside another's query), in a view of the same length.

Each recognizer declares what every text it finds a hit in holds (``Needs``: one of a few
characters, or a word; for some, also one of the words or the runs of the shape its finder
looks for first); a short text that lacks them is not given to it, so a chat prompt of plain
words runs none of them, and a fresh process compiles and runs none of their code. Each is
named by its module and function: the modules that hold the finders (some 11 M instructions
to import) are imported when a scan first calls one of their finders, so a text of plain
words, or a command's output with its exit status, imports none or few of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator

from bot.patterns import on_use_written
from bot.pii.scantext import (
    CAPITALS,
    DIGITS,
    ENTITY_TYPES,
    MIN_ENCODED,
    Finder,
    Needs,
    PiiHit,
    Recognizer,
    ScanText,
    load_finder,
    needs,
)

# Each with what every text it finds a hit in holds (``Needs``): the literals its patterns or
# its gates require, read off them; test_needs.py holds each over the tests' samples.
_ALNUM_KEY = needs("-_./" + CAPITALS)  # a vendor key's prefix, or a capital it starts with

RECOGNIZERS: tuple[Recognizer, ...] = (
    # PEM's "-----BEGIN", PuTTY's "Private-Lines:", age's "AGE-SECRET-KEY-1"
    Recognizer(frozenset({"PRIVATE_KEY"}), "credentials.find_private_keys", needs("-")),
    # after a label, "=", ":" or "=>"
    Recognizer(frozenset({"AWS_SECRET_KEY"}), "labelled.find_aws_secret", needs(":=")),
    # AKIA..., AIza...
    Recognizer(
        frozenset({"AWS_ACCESS_KEY", "AWS_SECRET_KEY", "GOOGLE_API_KEY"}),
        "credentials.find_a_keys",
        needs("A"),
        True,
    ),
    # gh?_, github_pat_
    Recognizer(frozenset({"GITHUB_TOKEN"}), "credentials.find_github", needs("_"), True),
    # glpat-..., GR1348941...
    Recognizer(frozenset({"GITLAB_TOKEN"}), "credentials.find_gitlab", needs("-G"), True),
    # xoxb-..., xapp-...
    Recognizer(frozenset({"SLACK_TOKEN"}), "credentials.find_slack", needs("-"), True),
    # found from the "." before the timestamp
    Recognizer(frozenset({"DISCORD_TOKEN"}), "credentials.find_discord", needs(".")),
    # a URL's path
    Recognizer(
        frozenset({"SLACK_TOKEN", "DISCORD_TOKEN"}), "credentials.find_webhooks", needs("/")
    ),
    # sk-..., sk_live_..., rk_test_...
    Recognizer(
        frozenset({"STRIPE_KEY", "OPENAI_API_KEY"}), "credentials.find_k_keys", needs("-_"), True
    ),
    # npm_, pypi-, SG., hf_
    Recognizer(
        frozenset({"NPM_TOKEN", "PYPI_TOKEN", "SENDGRID_API_KEY", "HUGGINGFACE_TOKEN"}),
        "credentials.find_service_tokens",
        needs("_-."),
        True,
    ),
    # key-, shpat_, dop_v1_, whsec_, ya29., 1//0; FwoG..., IQoJ..., eyJw..., SK..., AC...
    Recognizer(
        frozenset(
            {"TWILIO_KEY", "MAILGUN_API_KEY", "SHOPIFY_TOKEN", "DIGITALOCEAN_TOKEN"}
            | {"GOOGLE_OAUTH_TOKEN", "STRIPE_KEY", "AWS_SESSION_TOKEN"}
        ),
        "credentials.find_vendor_keys",
        _ALNUM_KEY,
        True,
    ),
    # eyJ
    Recognizer(frozenset({"JWT"}), "credentials.find_jwt", needs("J"), True),
    # Bearer TOKEN, Basic CREDENTIALS
    Recognizer(
        frozenset({"BEARER_TOKEN", "BASIC_AUTH"}),
        "labelled.find_bearer_and_basic",
        needs("", "bearer", "basic"),
    ),
    # -u USER:PASSWORD
    Recognizer(frozenset({"BASIC_AUTH"}), "labelled.find_user_flag_passwords", needs("-")),
    # Authorization: or =
    Recognizer(frozenset({"GENERIC_SECRET"}), "labelled.find_authorization", needs(":=")),
    # SECRET, TOKEN, PASSPHRASE, CREDENTIAL, KEY, PW: in capitals
    Recognizer(frozenset({"GENERIC_SECRET"}), "labelled.find_env_secrets", needs("STPCK")),
    # name: ... value:
    Recognizer(frozenset({"GENERIC_SECRET"}), "labelled.find_named_values", needs(":")),
    # a value that looks generated holds a digit; its key ends in one of these words
    Recognizer(
        frozenset({"GENERIC_SECRET"}),
        "labelled.find_keyed_secrets",
        needs(DIGITS, also=("secret", "token", "passphrase", "credential", "key", "auth")),
    ),
    # --from-literal, or a Secret
    Recognizer(frozenset({"GENERIC_SECRET"}), "manifests.find_secret_data", needs("-S")),
    # JSON's and YAML's keys; a table's key1, key2; and a word of each pattern's literals
    Recognizer(
        frozenset({"GENERIC_SECRET"}),
        "labelled.find_secure_strings",
        needs(
            ":" + DIGITS,
            also=("securestring", "sensitive", "secretstring", "keyname", "full", "read"),
        ),
    ),
    # the table's "---  -----"
    Recognizer(frozenset({"GENERIC_SECRET"}), "labelled.find_vault_data", needs("-")),
    # <element>, key="...", define(
    Recognizer(frozenset({"GENERIC_SECRET"}), "labelled.find_markup_secrets", needs("<=(")),
    # a query
    Recognizer(frozenset({"GENERIC_SECRET"}), "web.find_query_secrets", needs("?")),
    # Cookie: or Set-Cookie:
    Recognizer(frozenset({"GENERIC_SECRET"}), "web.find_cookies", needs(":")),
    # user:password@host
    Recognizer(
        frozenset({"CONNECTION_STRING_PASSWORD", "GENERIC_SECRET"}),
        "labelled.find_url_passwords",
        needs("@"),
    ),
    # password=, "password": , password:
    Recognizer(
        frozenset({"CONNECTION_STRING_PASSWORD"}), "labelled.find_keyvalue_passwords", needs(":=")
    ),
    # -p, -a, -P, -w, -U, --user; FreeRDP's /p:
    Recognizer(
        frozenset({"CONNECTION_STRING_PASSWORD"}), "labelled.find_cli_passwords", needs("-/")
    ),
    # --password x, requirepass x, PASSWORD 'x', IDENTIFIED BY 'x', .netrc's password x
    Recognizer(
        frozenset({"CONNECTION_STRING_PASSWORD"}),
        "labelled.find_worded_passwords",
        needs("", "pass", "identified"),
    ),
    # .pgpass's and chpasswd's ":", a hash's "$" or "{", ENV, htpasswd -b, add_user, "@"
    Recognizer(
        frozenset({"CONNECTION_STRING_PASSWORD", "GENERIC_SECRET"}),
        "shapes.find_shaped_secrets",
        needs(":${-_@E"),
    ),
    # the printed line under the command's, which names a secret
    Recognizer(
        frozenset({"GENERIC_SECRET"}),
        "shapes.find_printed_secrets",
        needs("\n", also=("secret", "pass", "token", "key", "credential")),
    ),
    # a digit, its separator and a digit
    Recognizer(
        frozenset({"CREDIT_CARD", "US_SSN", "PHONE_NUMBER", "IP_ADDRESS"}),
        "numbers.find_separated_numbers",
        needs(DIGITS, shaped=(b"0-0", b"0.0", b"0 0")),
    ),
    # 13 digits in a row
    Recognizer(
        frozenset({"CREDIT_CARD"}), "numbers.find_card_runs", needs(DIGITS, shaped=(b"0" * 13,))
    ),
    # two capitals, two digits
    Recognizer(frozenset({"IBAN_CODE"}), "numbers.find_ibans", needs(DIGITS, shaped=(b"AA00",))),
    Recognizer(frozenset({"EMAIL_ADDRESS"}), "emails.find_emails", needs("@")),
    # "at" before a bracket or a written "dot"; %40, &#64;, \u0040: their starts, in also
    Recognizer(
        frozenset({"EMAIL_ADDRESS"}),
        "emails.find_loose_emails",
        needs(
            "[](){}<>%&\\",
            "dot",
            also=(
                "at ",
                "at\t",
                "at]",
                "at)",
                "at}",
                "at>",
                "%40",
                "2540",
                "&#",
                "&commat;",
                "\\u0040",
                "\\x40",
            ),
        ),
    ),
    Recognizer(frozenset({"IP_ADDRESS"}), "numbers.find_ipv6", needs(":")),
    Recognizer(frozenset({"PHONE_NUMBER"}), "numbers.find_paren_phones", needs("(")),
    Recognizer(frozenset({"PHONE_NUMBER"}), "numbers.find_intl_phones", needs("+")),
)


def _escaped_separator() -> str:
    """A percent-escape of a separator (a blank, punctuation, a control character; not "_",
    which is a word's) right before the start of a key a prefixed recognizer finds (an access
    log's escaped paths and queries have none, and cost one search)."""
    # Written when first used, which imports the prefixed recognizers' module anyway.
    from bot.pii.credentials import PREFIX_STARTS

    return (
        r"%(?:[01][0-9A-Fa-f]|2[0-9A-Fa-f]|3[A-Fa-f]|40|5[B-Eb-e]|60|7[B-Fb-f])"
        rf"(?={'|'.join(PREFIX_STARTS)})"
    )


_ESCAPED_SEPARATOR = on_use_written(_escaped_separator)

# Up to this length a text's set of characters costs less than the calls it saves: a short
# text (a chat prompt, a command's one line) is given only to the recognizers whose needs it
# holds. A longer one holds nearly every character of their needs (a log's digits, colons and
# capitals), so its set (some 65 instructions a character) would buy nothing.
_GATED_LENGTH = 256
_MAX_DEPTH = 2  # base64 inside base64 is still found; deeper nesting is not worth a scan

# A recognizer as a scanner runs it: its finder, whether its hits need filtering, its needs'
# characters and words, and its needs if they name more (``Needs.also_held``).
_Entry = tuple[Finder, bool, frozenset[str], tuple[str, ...], Needs | None]


def load_finders() -> None:
    """Import every finder's module now, as a long-lived process does at start: a broken
    install then stops it there, and one installed under it later is never mixed with the
    modules it holds (a short-lived command imports only those its texts reach)."""
    for recognizer in RECOGNIZERS:
        load_finder(recognizer.finder)
    load_finder("encoded.find_encoded")


def _more(needs: Needs) -> Needs | None:
    """The needs, if they name more than characters and words; else None (nothing to ask)."""
    return needs if needs.also or needs.shaped else None


class _Unloaded:
    """A finder in a scanner's place until a scan first calls it: that call loads the finder
    (its module imported) and puts it in the scanner's place of this one."""

    __slots__ = ("_name", "_put")

    def __init__(self, name: str, put: Callable[[_Unloaded, Finder], None]) -> None:
        self._name = name
        self._put = put

    def __call__(self, src: ScanText) -> Iterator[PiiHit]:
        find = load_finder(self._name)
        self._put(self, find)
        return find(src)


class Scanner:
    """Runs the recognizers of the enabled entity types over a text."""

    def __init__(self, entities: Iterable[str] | None = None) -> None:
        enabled = frozenset(ENTITY_TYPES if entities is None else entities)
        unknown = sorted(enabled - set(ENTITY_TYPES))
        if unknown:
            raise ValueError(f"unknown entity type(s): {', '.join(unknown)}")
        self.entities = enabled
        chosen = [r for r in RECOGNIZERS if r.entities & enabled]
        finders = [_Unloaded(r.finder, self._put) for r in chosen]
        # Each with whether its hits need filtering: only a recognizer reporting some disabled
        # type does (a generator per recognizer per scan is most of a short text's cost); its
        # needs' characters and words; and its needs, where they name words or runs besides.
        self._recognizers: tuple[_Entry, ...] = tuple(
            (
                find,
                not r.entities <= enabled,
                frozenset(r.needs.chars),
                r.needs.words,
                _more(r.needs),
            )
            for find, r in zip(finders, chosen, strict=True)
        )
        self._prefixed: tuple[Finder, ...] = tuple(
            find for find, r in zip(finders, chosen, strict=True) if r.prefixed
        )

    def _put(self, unloaded: _Unloaded, find: Finder) -> None:
        """``find`` in the place of ``unloaded``: each tuple is replaced whole, so a scan on
        another thread reads the old one or the new, either of them whole (and a lost swap
        leaves a stand-in that loads the same finder again)."""
        self._recognizers = tuple(
            (find if old is unloaded else old, partly, chars, words, more)
            for old, partly, chars, words, more in self._recognizers
        )
        self._prefixed = tuple(find if old is unloaded else old for old in self._prefixed)

    def __call__(self, text: str) -> list[PiiHit]:
        """Every hit of an enabled entity type, as spans of `text`; hits may overlap."""
        return self._scan(text, 0)

    def _scan(self, text: str, depth: int) -> list[PiiHit]:
        if not self.entities:
            return []
        src = ScanText(text)
        enabled = self.entities
        hits: list[PiiHit] = []
        held = frozenset(src.text) if len(src.text) <= _GATED_LENGTH else None
        for find, partly, chars, words, more in self._recognizers:
            if held is not None:
                lacks = held.isdisjoint(chars) and not (words and any(map(src.holds, words)))
                if lacks or (more is not None and not more.also_held(src)):
                    continue  # it would find nothing: no call, no generator, no regex compiled
            if partly:
                hits.extend(hit for hit in find(src) if hit.entity_type in enabled)
            else:
                hits.extend(find(src))
        if "%" in src.text and self._prefixed:
            hits.extend(hit for hit in self._behind_escapes(src) if hit.entity_type in enabled)
        # Every encoded secret is a run of at least MIN_ENCODED base64 characters (ScanText.runs).
        if len(src.text) >= MIN_ENCODED and src.runs:
            from bot.pii.encoded import find_encoded  # with the first text that holds a run

            # Decoded text is scanned by the same recognizers, one level deeper each time.
            rescan = functools.partial(self._scan, depth=depth + 1) if depth < _MAX_DEPTH else None
            hits.extend(hit for hit in find_encoded(src, rescan) if hit.entity_type in enabled)
        if not hits:
            return hits
        return [src.original(hit) for hit in hits]

    def _behind_escapes(self, src: ScanText) -> Iterator[PiiHit]:
        """The keys found by their prefix right after a percent-escaped separator (a URL in
        another's query: ...%3Dghp_...), whose hex digit their lookbehinds read as a word's:
        looked for again where those escapes are blanks, at the same offsets."""
        blanked, count = _ESCAPED_SEPARATOR.subn("   ", src.text)
        if not count:
            return
        view = ScanText(blanked)
        for find in self._prefixed:
            yield from find(view)
