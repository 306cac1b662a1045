"""The text under scan: the entity types and hits, the folding of non-ASCII text, the views
recognizers share (lower case, shape, base64 runs), and what a recognizer is.
"""

from __future__ import annotations

import functools
import importlib
import string
import unicodedata
from bisect import bisect_right
from collections.abc import Callable, Iterator

import msgspec

from bot.patterns import on_use

# Highest priority first: when two overlapping hits are equally long, the earlier type names them.
ENTITY_TYPES: tuple[str, ...] = (
    "PRIVATE_KEY",
    "AWS_SECRET_KEY",
    "AWS_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "GITHUB_TOKEN",
    "GITLAB_TOKEN",
    "SLACK_TOKEN",
    "DISCORD_TOKEN",
    "STRIPE_KEY",
    "OPENAI_API_KEY",
    "GOOGLE_API_KEY",
    "NPM_TOKEN",
    "PYPI_TOKEN",
    "SENDGRID_API_KEY",
    "HUGGINGFACE_TOKEN",
    "TWILIO_KEY",
    "MAILGUN_API_KEY",
    "SHOPIFY_TOKEN",
    "DIGITALOCEAN_TOKEN",
    "GOOGLE_OAUTH_TOKEN",
    "JWT",
    "BEARER_TOKEN",
    "BASIC_AUTH",
    "CONNECTION_STRING_PASSWORD",
    "GENERIC_SECRET",
    "CREDIT_CARD",
    "IBAN_CODE",
    "US_SSN",
    "EMAIL_ADDRESS",
    "IP_ADDRESS",
    "PHONE_NUMBER",
)

_PRIORITY: dict[str, int] = {name: rank for rank, name in enumerate(ENTITY_TYPES)}


def priority(entity_type: str) -> int:
    """Rank of an entity type for tie-breaks between overlapping hits (lower wins)."""
    return _PRIORITY.get(entity_type, len(ENTITY_TYPES))


class PiiHit(msgspec.Struct, frozen=True):
    """One finding: the entity type and its [start, end) span in the scanned text."""

    entity_type: str
    start: int
    end: int


# The views are bytes (the text is ASCII by then, one byte a character): bytes.translate is a
# plain table loop, cheaper than str.translate, and the regex engine scans bytes as fast.
_SHAPE = bytes.maketrans(
    (string.digits[1:] + string.ascii_uppercase).encode(), b"0" * 9 + b"A" * 26
)
WORD = frozenset(string.ascii_letters + string.digits + "_")
HEX = frozenset(string.hexdigits)
_ESCAPE = on_use(r"\\[nrt]")
BASE64_CHARS = frozenset(string.ascii_letters + string.digits + "+/")
_BASE64_VIEW = bytes.maketrans((string.ascii_letters + string.digits + "+/").encode(), b"b" * 64)
# A run this long of base64 characters is a candidate: long enough for "password=hunter2" in
# base64 (24), longer than the 16-hex span ids of tracing logs, which would double the work;
# and every vendor key found from inside a run is this long.
MIN_ENCODED = 20
_MIN_RUN = b"b" * MIN_ENCODED
_RUN_REST = on_use(b"b*+")


# ---------------------------------------------------------------------------------------------
# Folding non-ASCII text for detection

# Code point ranges worth folding; the large CJK, Hangul and private-use blocks are left out,
# since NFKC leaves them as they are and the fold table is built once, on first use.
_FOLD_RANGES = (
    (0x80, 0x3400),
    (0x4DC0, 0x4E00),
    (0xA4D0, 0xAC00),
    (0xD7A4, 0xD800),
    (0xF900, 0x10A00),
    (0x11000, 0x11E00),
    (0x16A00, 0x16B60),
    (0x1D400, 0x1D800),
    (0x1E100, 0x1E960),
    (0x1F100, 0x1F200),
    (0x1FBF0, 0x1FC00),
    (0xE0000, 0xE01F0),
)
# Invisible: format characters (zero-width spaces and joiners, soft hyphen, BOM, bidi controls,
# tags), combining and enclosing marks (variation selectors, keycaps), C1 controls.
_DROPPED_CATEGORIES = frozenset({"Cf", "Mn", "Me", "Cc"})
# Word-like spaces NFKC leaves alone: the Hangul fillers render as nothing.
_DROPPED_CHARS = frozenset("\u115f\u1160\u3164\uffa0")
_FULL_STOPS = frozenset("\u3002\uff61\u2024\ufe52")
# What a terminal shows as nothing. An escape sequence: a control sequence (colours, as
# ``grep --color=always``, ``jq -C`` or an application's log print them between a key's name
# and its value, or inside a token), or ESC with its intermediate and final bytes (``ESC(B``,
# as ``tput sgr0`` writes it); only ESC and ``]`` of a string's start are dropped, so a
# hyperlink's target (``ESC]8;;URL``) is still read. And the other controls but NUL and the
# blanks (tab, line feed, vertical tab, form feed, carriage return).
_UNSHOWN = on_use(
    rb"\x1b(?:\[[0-?]*+[ -/]*+[@-~]|[ -/]{0,2}[0-~])?|[\x01-\x08\x0e-\x1a\x1c-\x1f\x7f]++"
)
# UTF-16 text as cat prints it (a file a Windows tool wrote): a NUL beside each ASCII
# character, "p\0a\0s\0s\0". Its NULs are nothing; a NUL elsewhere separates values
# (/proc/PID/environ, find -print0), and stays.
_UTF16 = on_use(rb"(?:[^\x00]\x00){4,}")
# Every byte an ASCII text shows: what holds none but these folds only as it is.
_SHOWN = bytes(range(0x20, 0x7F)) + b"\t\n\x0b\x0c\r"


def _holds_controls(text: str) -> bool:
    """Whether an ASCII text holds a control (ESC, NUL, BEL…): two C loops, no regex."""
    return not text.isprintable() and bool(text.encode("ascii").translate(None, _SHOWN))


def _fold_one(char: str) -> str:
    """A character of NFKC output as detection reads it: ASCII where a reader would see ASCII."""
    if char.isascii():
        return char
    category = unicodedata.category(char)
    if category in _DROPPED_CATEGORIES:
        return ""
    if category == "Nd":
        return str(unicodedata.decimal(char))
    if category == "Zs":
        return " "
    if category in ("Zl", "Zp"):
        return "\n"
    if category == "Pd" or char == "\u2212":
        return "-"
    if char in _FULL_STOPS:
        return "."
    return char


def fold_char(char: str) -> str:
    """What one character reads as for detection: "" (invisible), ASCII, or itself."""
    if unicodedata.category(char) in _DROPPED_CATEGORIES or char in _DROPPED_CHARS:
        return ""
    return "".join(map(_fold_one, unicodedata.normalize("NFKC", char)))


@functools.cache
def _fold_table() -> dict[str, str]:
    """What every character that folds reads as, non-ASCII left in it made "?"."""
    table: dict[str, str] = {}
    for low, high in _FOLD_RANGES:
        for code in range(low, high):
            char = chr(code)
            if unicodedata.category(char) in ("Cn", "Co", "Cs"):
                continue
            folded = fold_char(char).encode("ascii", "replace").decode("ascii")
            if folded != "?":  # a lone "?" is what encoding gives it anyway
                table[char] = folded
    return table


class _Resizes(msgspec.Struct, frozen=True):
    """Where folding changed the length: original index, folded index, folded length."""

    origins: list[int]
    folded: list[int]
    lengths: list[int]

    def original(self, index: int) -> tuple[int, int]:
        """The original span of the character read at folded `index`."""
        slot = bisect_right(self.folded, index) - 1
        if slot < 0:
            return index, index + 1
        origin, start, length = self.origins[slot], self.folded[slot], self.lengths[slot]
        if index < start + length:
            return origin, origin + 1  # inside one character's expansion ("½" read as "1/2")
        position = origin + 1 + index - start - length
        return position, position + 1


def fold(text: str) -> tuple[str, _Resizes | None]:
    """The text as detection reads it (ASCII, "?" for the rest, a terminal's escape sequences
    and the controls it shows as nothing dropped) and where its length changed."""
    table = _fold_table()
    # Encoding makes every non-ASCII character one "?"; memchr finds them, so text with a few
    # of them costs little more than ASCII (str.translate with a dict costs a lookup per char).
    data = bytearray(text.encode("ascii", "replace"))
    resized: dict[int, str] = {}  # each character that reads as none or as several
    position = data.find(b"?")
    while position >= 0:
        folded = table.get(text[position])
        if folded is not None:
            if len(folded) == 1:
                data[position] = ord(folded)
            else:
                resized[position] = folded
        position = data.find(b"?", position + 1)
    for unshown in _UNSHOWN.finditer(data):
        resized.update(dict.fromkeys(range(unshown.start(), unshown.end()), ""))
    if b"\x00" in data:
        for wide in _UTF16.finditer(data):
            resized.update(dict.fromkeys(range(wide.start() + 1, wide.end(), 2), ""))
    ascii_text = data.decode("ascii")
    if not resized:
        return ascii_text, None
    origins = sorted(resized)
    replacements = [resized[origin] for origin in origins]
    pieces: list[str] = []
    folded_at: list[int] = []
    done = shift = 0
    for origin, replacement in zip(origins, replacements, strict=True):
        pieces.append(ascii_text[done:origin])
        pieces.append(replacement)
        folded_at.append(origin + shift)
        shift += len(replacement) - 1
        done = origin + 1
    pieces.append(ascii_text[done:])
    lengths = [len(replacement) for replacement in replacements]
    return "".join(pieces), _Resizes(origins, folded_at, lengths)


class ScanText:
    """The text under scan and the views of it that recognizers share, each built once."""

    __slots__ = ("_ascii", "_encoded", "_held", "_lower", "_resizes", "_runs", "_shape", "text")

    def __init__(self, text: str) -> None:
        self._resizes: _Resizes | None = None
        if not text.isascii() or _holds_controls(text):
            # Folded, full-width digits, no-break and zero-width spaces read as what they show;
            # every other non-ASCII character becomes one "?", so lower() and translate()
            # below keep the length and take CPython's ASCII paths. Colours and controls read
            # as nothing, as a terminal shows them: "db_ESC[1mpassword" is "db_password".
            text, self._resizes = fold(text)
        if "\\" in text:
            # The escapes of JSON strings separate words like the characters they stand for:
            # "...\n4111 1111..." must not read as the word "n4111", so "\n" becomes "\ ".
            text = _ESCAPE.sub(r"\\ ", text)
        self.text = text
        self._ascii: bytes | None = None
        self._lower: str | None = None
        self._shape: bytes | None = None
        self._encoded: bytes | None = None
        self._runs: list[tuple[int, int]] | None = None
        self._held: dict[str, bool] = {}

    @property
    def lower(self) -> str:
        """The text in lower case, for labels such as "Bearer" or "Password="."""
        if self._lower is None:
            self._lower = self.text.lower()
        return self._lower

    def holds(self, word: str) -> bool:
        """Whether the lower-case text holds ``word``: a C search, done once a text however
        many recognizers ask (several look for "pass" or "secret" before their regexes)."""
        held = self._held.get(word)
        if held is None:
            held = self._held[word] = word in self.lower
        return held

    def _bytes(self) -> bytes:
        # The text is ASCII here (folding made it so): one byte a character, same offsets.
        if self._ascii is None:
            self._ascii = self.text.encode("ascii")
        return self._ascii

    @property
    def shape(self) -> bytes:
        """The text with every digit as "0" and every capital as "A"."""
        if self._shape is None:
            self._shape = self._bytes().translate(_SHAPE)
        return self._shape

    @property
    def encoded(self) -> bytes:
        """The text with every base64 character as "b", to find long runs of them."""
        if self._encoded is None:
            self._encoded = self._bytes().translate(_BASE64_VIEW)
        return self._encoded

    @property
    def runs(self) -> list[tuple[int, int]]:
        """Where each run of MIN_ENCODED base64 characters or more starts and ends: read once
        for the encoded secrets and the vendor keys found from inside one."""
        if self._runs is None:
            # bytes.find skips ahead by up to the needle's length at each other character,
            # where a regex reads every one: a run starts at the first window of the needle.
            encoded, runs = self.encoded, []
            start = encoded.find(_MIN_RUN)
            while start >= 0:
                rest = _RUN_REST.match(encoded, start)  # always a match: b* takes none too
                end = rest.end() if rest else start + MIN_ENCODED
                runs.append((start, end))
                start = encoded.find(_MIN_RUN, end)
            self._runs = runs
        return self._runs

    def original(self, hit: PiiHit) -> PiiHit:
        """The hit with the span it has in the text before folding."""
        if self._resizes is None:
            return hit
        start = self._resizes.original(hit.start)[0]
        end = self._resizes.original(hit.end - 1)[1]
        return PiiHit(hit.entity_type, start, end)


Finder = Callable[[ScanText], Iterator[PiiHit]]

DIGITS = string.digits
CAPITALS = string.ascii_uppercase


class Needs(msgspec.Struct, frozen=True):
    """What every text a recognizer finds a hit in holds, as the recognizers read it (folded,
    escapes blanked): one of ``chars``, or one of ``words`` in lower case; and, where given,
    one of the words ``also`` names in lower case and one of the runs ``shaped`` names in its
    shape. A text that lacks them is not given to the recognizer (test_needs.py holds each
    over the corpus)."""

    chars: str
    words: tuple[str, ...] = ()
    also: tuple[str, ...] = ()
    shaped: tuple[bytes, ...] = ()

    def held(self, src: ScanText) -> bool:
        """Whether ``src`` holds what the recognizer needs: a C search for each character
        (memchr: a text holding one finds it early, one holding none is short or rare)."""
        if not self.also_held(src):
            return False
        return any(map(src.text.__contains__, self.chars)) or any(map(src.holds, self.words))

    def also_held(self, src: ScanText) -> bool:
        """Whether ``src`` holds one of the words ``also`` names and one of the runs
        ``shaped`` names in its shape, where either names some."""
        if self.also and not any(map(src.holds, self.also)):
            return False
        return not self.shaped or any(map(src.shape.__contains__, self.shaped))


def needs(
    chars: str, *words: str, also: tuple[str, ...] = (), shaped: tuple[bytes, ...] = ()
) -> Needs:
    """A recognizer's needs: one of the characters of ``chars``, or one of ``words``; and one
    of ``also`` and of ``shaped``, where given (what a finder looks for before its patterns)."""
    return Needs(chars, words, also, shaped)


@functools.cache
def load_finder(name: str) -> Finder:
    """The finder ``name`` ("module.function", a module of bot.pii), its module imported the
    first time one of its finders is asked for: a module another thread is importing is
    waited for (the import lock), so a half-run module is never read."""
    module, _, function = name.rpartition(".")
    found: Finder = getattr(importlib.import_module(f"bot.pii.{module}"), function)
    return found


class Recognizer(msgspec.Struct, frozen=True):
    """A finder, named by its module and function (``load_finder``), the entity types it can
    report, what a text it finds a hit in holds, and whether it finds keys by their prefix."""

    entities: frozenset[str]
    finder: str
    needs: Needs
    prefixed: bool = False
