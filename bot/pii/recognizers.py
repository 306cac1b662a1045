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
scanned again only when they read as text.
"""

from __future__ import annotations

import binascii
import functools
import ipaddress
import itertools
import re
import string
import unicodedata
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# Highest priority first: when two overlapping hits are equally long, the earlier type names them.
ENTITY_TYPES: tuple[str, ...] = (
    "PRIVATE_KEY",
    "AWS_SECRET_KEY",
    "AWS_ACCESS_KEY",
    "GITHUB_TOKEN",
    "SLACK_TOKEN",
    "STRIPE_KEY",
    "OPENAI_API_KEY",
    "GOOGLE_API_KEY",
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


@dataclass(frozen=True, slots=True)
class PiiHit:
    """One finding: the entity type and its [start, end) span in the scanned text."""

    entity_type: str
    start: int
    end: int


# The views are bytes (the text is ASCII by then, one byte a character): bytes.translate is a
# plain table loop, cheaper than str.translate, and the regex engine scans bytes as fast.
_SHAPE = bytes.maketrans(
    (string.digits[1:] + string.ascii_uppercase).encode(), b"0" * 9 + b"A" * 26
)
_WORD = frozenset(string.ascii_letters + string.digits + "_")
_HEX = frozenset(string.hexdigits)
_ESCAPE = re.compile(r"\\[nrt]")
_BASE64_CHARS = frozenset(string.ascii_letters + string.digits + "+/")
_BASE64_VIEW = bytes.maketrans((string.ascii_letters + string.digits + "+/").encode(), b"b" * 64)


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


@dataclass(frozen=True, slots=True)
class _Resizes:
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
    """The text as detection reads it (ASCII, "?" for the rest) and where its length changed."""
    table = _fold_table()
    # Encoding makes every non-ASCII character one "?"; memchr finds them, so text with a few
    # of them costs little more than ASCII (str.translate with a dict costs a lookup per char).
    data = bytearray(text.encode("ascii", "replace"))
    origins: list[int] = []
    replacements: list[str] = []
    position = data.find(b"?")
    while position >= 0:
        folded = table.get(text[position])
        if folded is not None:
            if len(folded) == 1:
                data[position] = ord(folded)
            else:
                origins.append(position)
                replacements.append(folded)
        position = data.find(b"?", position + 1)
    ascii_text = data.decode("ascii")
    if not origins:
        return ascii_text, None
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

    __slots__ = ("_ascii", "_encoded", "_lower", "_resizes", "_shape", "text")

    def __init__(self, text: str) -> None:
        self._resizes: _Resizes | None = None
        if not text.isascii():
            # Folded, full-width digits, no-break and zero-width spaces read as what they show;
            # every other non-ASCII character becomes one "?", so lower() and translate()
            # below keep the length and take CPython's ASCII paths.
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

    @property
    def lower(self) -> str:
        """The text in lower case, for labels such as "Bearer" or "Password="."""
        if self._lower is None:
            self._lower = self.text.lower()
        return self._lower

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

    def original(self, hit: PiiHit) -> PiiHit:
        """The hit with the span it has in the text before folding."""
        if self._resizes is None:
            return hit
        start = self._resizes.original(hit.start)[0]
        end = self._resizes.original(hit.end - 1)[1]
        return PiiHit(hit.entity_type, start, end)


Finder = Callable[[ScanText], Iterator[PiiHit]]


@dataclass(frozen=True)
class Recognizer:
    """A finder and the entity types it can report."""

    entities: frozenset[str]
    find: Finder


# ---------------------------------------------------------------------------------------------
# Small helpers on ASCII text


def _word_before(text: str, index: int) -> bool:
    return index > 0 and text[index - 1] in _WORD


def _word_at(text: str, index: int) -> bool:
    return index < len(text) and text[index] in _WORD


def _anchored(pattern: re.Pattern[str], text: str, anchor: str) -> Iterator[re.Match[str]]:
    """pattern.finditer(text) for a pattern whose every match starts with the character `anchor`.

    The regex engine scans for a literal prefix at about five instructions a character;
    str.find skips to a character with memchr, so for characters that are rare in logs
    ("@", "J", "+") the pass costs next to nothing. Each hit of the anchor costs a Python
    round trip, though: for letters as common as "g" or "k" the engine's own scan is cheaper.
    Lookbehinds still see the text before the match.
    """
    find, match = text.find, pattern.match
    position = find(anchor)
    while position >= 0:
        found = match(text, position)
        if found is None:
            position = find(anchor, position + 1)
        else:
            yield found
            position = find(anchor, found.end())


def _run_start(text: str, end: int, chars: frozenset[str], longest: int) -> int:
    """Start of the run of `chars` ending at `end`; -1 if it is empty or longer than `longest`."""
    start = end
    floor = max(0, end - longest - 1)
    while start > floor and text[start - 1] in chars:
        start -= 1
    if start == end or end - start > longest:
        return -1
    return start


def luhn_ok(digits: str) -> bool:
    """True if the digit string passes the Luhn checksum."""
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if index % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def card_brand_ok(digits: str, grouped: bool) -> bool:
    """True if the number has a card network's prefix and length.

    Runs without separators must be 13-16 digits long: the 17-19 digit runs of logs are
    mostly snowflake ids and epoch nanoseconds, which would pass Luhn one time in ten.
    """
    length = len(digits)
    if not grouped and length > 16:
        return False
    two = int(digits[:2])
    four = int(digits[:4])
    if digits[0] == "4":
        return length in (13, 16, 19)
    if 51 <= two <= 55 or 2221 <= four <= 2720:
        return length == 16
    if two in (34, 37):
        return length == 15
    if four == 6011 or two == 65 or 644 <= int(digits[:3]) <= 649 or two == 62:
        return 16 <= length <= 19
    if 3528 <= four <= 3589:
        return 16 <= length <= 19
    if 300 <= int(digits[:3]) <= 305 or two in (36, 38, 39):
        return 14 <= length <= 19
    return False


def ssn_ok(area: str, group: str, serial: str) -> bool:
    """True unless the SSN has an area, group or serial the SSA never issues."""
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def iban_ok(compact: str) -> bool:
    """True if the IBAN (no spaces, capitals) has its country's length and a valid mod-97."""
    if _IBAN_LENGTHS.get(compact[:2]) != len(compact):
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(char, 36)) for char in rearranged)) % 97 == 1


def _ipv4_ok(octets: Sequence[str]) -> bool:
    """True if the groups of 1-3 digits are an IPv4 address, as ipaddress would judge it.

    Access logs hold an address a line; ipaddress costs microseconds for each of them.
    """
    return all((octet[0] != "0" or octet == "0") and int(octet) <= 255 for octet in octets)


def _ip_ok(candidate: str) -> bool:
    try:
        ipaddress.ip_address(candidate)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Secrets with a literal prefix


_A_KEYS = re.compile(
    r"A(?<![0-9A-Za-z_]A)(?:"
    r"(?P<aws>(?:KIA|SIA|BIA|CCA)[A-Z2-7]{16})(?![0-9A-Za-z])"
    r"|(?P<google>Iza[0-9A-Za-z_-]{35})(?![0-9A-Za-z_-]))"
)


# A 40-character secret access key, unlabelled, next to its key id (a credentials CSV,
# "aws configure" answers, two env values pasted on one line).
_AWS_SECRET_SHAPE = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_AWS_PAIR_REACH = 256


def _aws_secrets_near(text: str, start: int, end: int) -> Iterator[PiiHit]:
    low, high = max(0, start - _AWS_PAIR_REACH), min(len(text), end + _AWS_PAIR_REACH)
    for match in _AWS_SECRET_SHAPE.finditer(text, low, high):
        if match.end() == high and high < len(text) and text[high] in _BASE64_CHARS:
            continue  # a longer run cut by the window
        key = match.group()
        # Generated keys mix cases; a git sha or a hex digest of the same length does not.
        if not key.islower() and not key.isupper() and not key.isalpha():
            yield PiiHit("AWS_SECRET_KEY", match.start(), match.end())


def find_a_keys(src: ScanText) -> Iterator[PiiHit]:
    """AWS access key ids (AKIA/ASIA...) with any secret key beside them, Google API keys."""
    text = src.text
    for match in _anchored(_A_KEYS, text, "A"):
        if match.group("aws"):
            yield PiiHit("AWS_ACCESS_KEY", match.start(), match.end())
            yield from _aws_secrets_near(text, match.start(), match.end())
        else:
            yield PiiHit("GOOGLE_API_KEY", match.start(), match.end())


_GITHUB = re.compile(
    r"g(?<![0-9A-Za-z_]g)(?:h[pousr]_[A-Za-z0-9]{36,251}+|ithub_pat_[A-Za-z0-9_]{22,255}+)"
    r"(?![A-Za-z0-9_])"
)


def find_github(src: ScanText) -> Iterator[PiiHit]:
    """GitHub tokens: ghp_, gho_, ghu_, ghs_, ghr_ and fine-grained github_pat_."""
    for match in _GITHUB.finditer(src.text):
        yield PiiHit("GITHUB_TOKEN", match.start(), match.end())


# Anchored on "k" so "sk-", "sk_live_" and "rk_live_" share one pass that skips to a rare letter.
_K_KEYS = re.compile(
    r"k(?<=[sr]k)(?<![0-9A-Za-z_-][sr]k)(?:"
    r"(?<=sk)-(?P<openai>[A-Za-z0-9_-]{32,}+)"
    r"|_(?:live|test)_(?P<stripe>[A-Za-z0-9]{16,}+)(?![A-Za-z0-9_]))"
)


def _looks_random(token: str) -> bool:
    """True if the token mixes capitals, small letters and digits, as generated keys do."""
    return (
        any(char.isdigit() for char in token)
        and any(char.isupper() for char in token)
        and any(char.islower() for char in token)
    )


def find_k_keys(src: ScanText) -> Iterator[PiiHit]:
    """OpenAI keys (sk-, sk-proj-...) and Stripe secret or restricted keys (sk_/rk_live_...)."""
    for match in _K_KEYS.finditer(src.text):
        if match.group("stripe"):
            yield PiiHit("STRIPE_KEY", match.start() - 1, match.end())
        elif _looks_random(match.group("openai")):
            yield PiiHit("OPENAI_API_KEY", match.start() - 1, match.end())


_SLACK = re.compile(r"x(?<![0-9A-Za-z_-]x)(?:ox[abeoprs]|app)-[A-Za-z0-9-]{10,}+")


def find_slack(src: ScanText) -> Iterator[PiiHit]:
    """Slack tokens: xoxb-, xoxp-, xoxa-, xoxe-, xoxo-, xoxr-, xoxs- and app tokens xapp-."""
    text = src.text
    for match in _SLACK.finditer(text):
        end = match.end()
        while text[end - 1] == "-":
            end -= 1
        if any(char.isdigit() for char in text[match.start() + 5 : end]):
            yield PiiHit("SLACK_TOKEN", match.start(), end)


# Anchored on the capital J of "eyJ" (base64 of '{"'), much rarer than its "e".
_JWT = re.compile(
    r"J(?<=eyJ)(?<![0-9A-Za-z_-]eyJ)[A-Za-z0-9_-]{8,}+\.eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]*+"
)


def find_jwt(src: ScanText) -> Iterator[PiiHit]:
    """JSON Web Tokens: three base64url segments, header and payload starting with eyJ."""
    for match in _anchored(_JWT, src.text, "J"):
        yield PiiHit("JWT", match.start() - 2, match.end())


_PEM_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
# A block cut short (head -c, a truncated log line) is covered through its last base64 or
# header line; lines end with real newlines or JSON-escaped ones (read as "\ ", see ScanText).
_PEM_BODY = re.compile(
    r"(?:(?:\r?\n|(?:\\ )?\\ )[ \t]*(?:[A-Za-z0-9+/=]++|[A-Za-z][A-Za-z-]*:[^\r\n\\]*+)?[ \t]*"
    r"(?=\r?\n|\\ |\"|\Z))*+"
)
_PEM_REACH = 65536  # a private key block is a few KB; an END farther away belongs to another


def find_private_keys(src: ScanText) -> Iterator[PiiHit]:
    """PEM and PGP private key blocks, BEGIN through END (or through the key material)."""
    text = src.text
    if "-----BEGIN " not in text:  # a long literal: str's search skips most of the text
        return
    begins = list(_PEM_BEGIN.finditer(text))
    ends = list(_PEM_END.finditer(text, begins[0].end())) if begins else []
    next_end = 0
    for index, begin in enumerate(begins):
        # A block's END lies before the next BEGIN; one beyond it belongs to another key.
        limit = begins[index + 1].start() if index + 1 < len(begins) else len(text)
        while next_end < len(ends) and ends[next_end].start() < begin.end():
            next_end += 1
        end = ends[next_end] if next_end < len(ends) else None
        if end is not None and end.end() <= limit and end.start() - begin.end() <= _PEM_REACH:
            stop = end.end()
        else:
            body = _PEM_BODY.match(text, begin.end(), limit)
            stop = body.end() if body else begin.end()
            while text[stop - 1] in " \t\r\n\\":
                stop -= 1  # blank lines (real or escaped) after the key material are not in it
        yield PiiHit("PRIVATE_KEY", begin.start(), stop)


# ---------------------------------------------------------------------------------------------
# Passwords, bearer tokens and AWS secret keys: found from their labels


_URL_CREDENTIALS = re.compile(r"://[^\s:/@\"'<>]{0,256}:(?P<password>[^\s/\"'<>]{1,256})@")


def find_url_passwords(src: ScanText) -> Iterator[PiiHit]:
    """The password of scheme://user:password@host."""
    if "@" not in src.text:  # memchr: most outputs have no "@" at all
        return
    for match in _URL_CREDENTIALS.finditer(src.text):
        yield PiiHit("CONNECTION_STRING_PASSWORD", *match.span("password"))


# key=value, and a quoted key with a quoted value ("password": "x"): a colon after a bare
# word ("password: required") is prose as often as it is YAML.
_PASSWORD_KEY = re.compile(r"p(?:ass(?:word|wd)|wd)(?:[ \t]*=[ \t]*|[\"'][ \t]*:[ \t]*(?=[\"']))")
_PASSWORD_VALUE = re.compile(
    r"\"(?P<dq>[^\"\r\n]{1,256})\"|'(?P<sq>[^'\r\n]{1,256})'|\{(?P<br>[^}\r\n]{1,256})\}"
    r"|(?P<bare>[^\s;&,\"'<>]+)"
)

_NEXT_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def find_keyvalue_passwords(src: ScanText) -> Iterator[PiiHit]:
    """The value of password=, passwd= or pwd= in key=value connection strings."""
    text = src.text
    for key in _PASSWORD_KEY.finditer(src.lower):
        value = _PASSWORD_VALUE.match(text, key.end())
        if value is None:
            continue
        group = value.lastgroup or "bare"
        start, end = value.span(group)
        secret = text[start:end]
        if set(secret) == {"*"}:
            continue  # already masked
        if group == "bare" and key.group()[-1] in " \t" and _NEXT_KEY.match(secret):
            continue  # "password= dbname=app": the password is empty, the next key follows
        if key.group().startswith("pwd") and secret[0] in "/~.":
            continue  # PWD=/home/... is the shell's working directory, not a password
        yield PiiHit("CONNECTION_STRING_PASSWORD", start, end)


# curl's -u/--user and -U/--proxy-user USER:PASSWORD on a command line. The flag is a word
# of its own; the value may be quoted or glued to the short flag (-uuser:pass).
_USER_FLAG = re.compile(
    r"(?:--(?:proxy-)?user[ \t]+|-[uU][ \t]*)"
    r"(?:\"(?P<dq>[^\"\r\n]{1,256})\"|'(?P<sq>[^'\r\n]{1,256})'|(?P<bare>[^\s\"'`;|&)]{1,256}))"
)
_FLAG_OPENERS = frozenset(" \t\r\n\"'`=(")
_PLACEHOLDER_STARTS = ("$", "<", "{{", "%")


_DASH_U = re.compile(r"-u")


def _user_flags(text: str, lower: str) -> Iterator[re.Match[str]]:
    """The -u, -U, --user and --proxy-user flags with their values, found from "-u".

    A regex that starts with a lookbehind gets no literal prefix to skip to; the two-character
    literal on the lower-case text, shared with other recognizers, is found in one C pass.
    """
    for dash in _DASH_U.finditer(lower):
        start = position = dash.start()
        if text.startswith("--user", position - 1):
            start = position - 1
        elif text.startswith("--proxy-user", position - 7):
            start = position - 7
        if start == 0 or text[start - 1] in _FLAG_OPENERS:
            found = _USER_FLAG.match(text, start)
            if found is not None:
                yield found


def find_user_flag_passwords(src: ScanText) -> Iterator[PiiHit]:
    """The password of -u USER:PASSWORD, --user USER:PASSWORD (curl) and the proxy forms.

    uid:gid (docker run -u 1000:1000) and user:group (-u app:app) are not credentials, and
    $PASS, <password> or an already masked *** give nothing away.
    """
    text = src.text
    for match in _user_flags(text, src.lower):
        group = match.lastgroup or "bare"
        start, end = match.span(group)
        user, colon, password = text[start:end].partition(":")
        if not colon or not password or password == user or set(password) == {"*"}:
            continue
        if password.startswith(_PLACEHOLDER_STARTS) or (user.isdigit() and password.isdigit()):
            continue
        yield PiiHit("BASIC_AUTH", start + len(user) + 1, end)


# One pass for both schemes: "b" is rarer in logs than two separate six-letter scans cost.
_AUTH_SCHEME = re.compile(r"b(?:earer|asic)[ \t]+")
_BEARER_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]{12,}+=*")
_BASIC_TOKEN = re.compile(r"[A-Za-z0-9+/]{4,}+=*(?![A-Za-z0-9_.~-])")


def find_bearer_and_basic(src: ScanText) -> Iterator[PiiHit]:
    """The token after "Bearer", and the credentials after "Basic" (as in Authorization)."""
    text, lower = src.text, src.lower
    if "bearer" not in lower and "basic" not in lower:  # str's search skips most of the text
        return
    for label in _AUTH_SCHEME.finditer(lower):
        if _word_before(lower, label.start()):
            continue
        if lower[label.start() + 1] == "e":
            token = _BEARER_TOKEN.match(text, label.end())
            # "Bearer authentication" is prose; tokens carry digits or capitals.
            if token and any(char.isdigit() or char.isupper() for char in token.group()):
                yield PiiHit("BEARER_TOKEN", token.start(), token.end())
            continue
        token = _BASIC_TOKEN.match(text, label.end())
        if token is None:
            continue
        decoded = _decode_base64(token.group(), shortest=3)
        # "Basic authentication" is prose; credentials decode to user:password.
        if (decoded is not None and ":" in decoded) or (
            len(token.group()) >= 12 and _looks_random(token.group())
        ):
            yield PiiHit("BASIC_AUTH", token.start(), token.end())


_AUTHORIZATION = re.compile(r"authorization[\"']?[ \t]*[:=][ \t]*[\"']?")
_AUTH_VALUE = re.compile(r"[^\s\"'\\]++(?:[ \t]++[^\s\"'\\]++)*+")
# Schemes whose credentials follow them; Bearer and Basic have recognizers of their own.
_AUTH_SCHEMES = frozenset(
    {"token", "digest", "apikey", "api-key", "key", "sso-key", "ssws", "splunk", "negotiate"}
    | {"ntlm", "hoba", "mutual", "aws4-hmac-sha256", "vapid", "dpop", "gosso", "otp"}
)


def find_authorization(src: ScanText) -> Iterator[PiiHit]:
    """The credentials of an Authorization header in a scheme other than Bearer or Basic."""
    text = src.text
    if "authorization" not in src.lower:  # a long literal: str's search skips most of the text
        return
    for label in _AUTHORIZATION.finditer(src.lower):
        value = _AUTH_VALUE.match(text, label.end())
        if value is None:
            continue
        scheme, _, rest = value.group().partition(" ")
        rest = rest.lstrip(" \t")
        if scheme.lower() in _AUTH_SCHEMES and rest:
            yield PiiHit("GENERIC_SECRET", value.end() - len(rest), value.end())
        elif not rest and len(scheme) >= 12 and _looks_secret(scheme):
            yield PiiHit("GENERIC_SECRET", value.start(), value.end())


_AWS_SECRET_LABEL = re.compile(r"secret_?(?:access_?)?key")
_AWS_SECRET_VALUE = re.compile(
    r"[\"']?[ \t]*(?:=>|[:=])[ \t]*[\"']?(?P<key>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"
)


def find_aws_secret(src: ScanText) -> Iterator[PiiHit]:
    """A 40-character AWS secret access key after an aws_secret_access_key-like label."""
    lower = src.lower
    if "secret" not in lower:  # a long literal: str's search skips most of the text
        return
    for label in _AWS_SECRET_LABEL.finditer(lower):
        aws_named = lower[max(0, label.start() - 4) : label.start()].rstrip("_-").endswith("aws")
        if "access" not in label.group() and not aws_named:
            continue  # a bare secret_key is too generic to call an AWS key
        value = _AWS_SECRET_VALUE.match(src.text, label.end())
        if value:
            yield PiiHit("AWS_SECRET_KEY", *value.span("key"))


# ---------------------------------------------------------------------------------------------
# Email addresses: found from their "@"

_EMAIL_DOMAIN = re.compile(r"@(?=[A-Za-z0-9])[A-Za-z0-9.-]{1,253}")
# Read backwards from the "@": the reversed local part. "?" stands for a non-ASCII character.
_EMAIL_LOCAL_REVERSED = re.compile(r"[A-Za-z0-9._%+?-]{1,65}")


def _domain_length(domain: str) -> int:
    """Length of the valid host name at the start of `domain`, or 0."""
    domain = domain.rstrip(".-")
    labels = domain.split(".")
    if len(labels) < 2 or not labels[-1].isalpha() or len(labels[-1]) < 2:
        return 0
    for label in labels:
        if not label or len(label) > 63 or label[0] == "-" or label[-1] == "-":
            return 0
    return len(domain)


def _is_url_userinfo(text: str, start: int) -> bool:
    """True if the text before `start` makes user@host the userinfo of a URL."""
    if start == 0 or text[start - 1] not in "/:":
        return False
    if text[start - 1] == "/":
        return True
    scheme = text.rfind("://", max(0, start - 256), start)
    return scheme >= 0 and not any(char.isspace() for char in text[scheme:start])


def _plain_email(text: str, at: int) -> PiiHit | None:
    match = _EMAIL_DOMAIN.match(text, at)
    if match is None:
        return None
    length = _domain_length(match.group()[1:])
    local = _EMAIL_LOCAL_REVERSED.match(text[max(0, at - 65) : at][::-1])
    if not length or local is None or local.end() > 64:
        return None
    start = at - local.end()
    while text[start] == ".":
        start += 1
    if start == at or text[at - 1] == "." or _is_url_userinfo(text, start):
        return None
    return PiiHit("EMAIL_ADDRESS", start, at + 1 + length)


def find_emails(src: ScanText) -> Iterator[PiiHit]:
    """Email addresses, also with spaces around the "@" or a written-out dot after it."""
    text = src.text
    for match in _anchored(_AT_SIGN, text, "@"):
        hit = _plain_email(text, match.start()) or _spaced_at(src, match.start())
        if hit:
            yield hit


# Written-out addresses: "jane at example dot com", "jane[at]example[dot]com",
# "jane%40example.com", "jane @ example.com". Found on the lower-case text from their "at":
# the word or bracketed "at", "%40" and the HTML entities, and every "@" (rare in logs).
_DOT_SEPARATOR = r"(?:\.|%2e|[ \t]*[\[({<][ \t]*(?:dot|\.)[ \t]*[\])}>][ \t]*|[ \t]+dot[ \t]+)"
_LOOSE_DOMAIN = re.compile(rf"[a-z0-9-]{{1,63}}(?:{_DOT_SEPARATOR}[a-z0-9-]{{1,63}})+")
_DOT_SPLIT = re.compile(_DOT_SEPARATOR)
# The word "at" counts only before a written-out dot: "deployed at api.example.com" is prose.
_AT_WORD = re.compile(
    r"at(?:[ \t]*[\])}>]|[ \t]+(?=[a-z0-9-]{1,63}(?:[ \t]+dot[ \t]|[ \t]*[\[({<][ \t]*dot\b)))"
)
# Two passes: an alternation that does not start with one literal is scanned ten times slower.
_AT_PERCENT = re.compile(r"%40")
_AT_ENTITY = re.compile(r"&(?:#0*64|#x0*40|commat);")
_AT_SIGN = re.compile(r"@")
_OPEN_BRACKETS = " \t[({<"


def _loose_email(src: ScanText, at_start: int, at_end: int, plain_dots: bool) -> PiiHit | None:
    """The address around the "at" at [at_start, at_end), if its parts make one."""
    lower = src.lower
    domain = _LOOSE_DOMAIN.match(lower, at_end)
    if domain is None:
        return None
    labels = _DOT_SPLIT.split(domain.group())
    written_out = any(dot != "." for dot in _DOT_SPLIT.findall(domain.group()))
    if not (plain_dots or written_out):
        return None
    if not labels[-1].isalpha() or len(labels[-1]) < 2:
        return None
    if any(label[0] == "-" or label[-1] == "-" for label in labels):
        return None
    local = _EMAIL_LOCAL_REVERSED.match(src.text[max(0, at_start - 65) : at_start][::-1])
    if local is None or local.end() > 64:
        return None
    start = at_start - local.end()
    while src.text[start] == ".":
        start += 1
    if start == at_start or _word_before(src.text, start):
        return None
    return PiiHit("EMAIL_ADDRESS", start, domain.end())


def find_loose_emails(src: ScanText) -> Iterator[PiiHit]:
    """Email addresses written out or encoded to slip past a plain address pattern."""
    lower = src.lower
    for match in _AT_WORD.finditer(lower):
        start = match.start()
        if match.group()[-1] in " \t":  # the word: "jane at example dot com"
            if start and lower[start - 1] in " \t":
                end = start
                while end and lower[end - 1] in " \t":
                    end -= 1
                hit = _loose_email(src, end, match.end(), plain_dots=False)
                if hit:
                    yield hit
            continue
        opening = start  # bracketed: "jane[at]example", "jane (at) example"
        while opening and lower[opening - 1] in " \t":
            opening -= 1
        if opening and lower[opening - 1] in "[({<":
            end = opening - 1
            while end and lower[end - 1] in " \t":
                end -= 1
            after = match.end()
            while after < len(lower) and lower[after] in " \t":
                after += 1
            hit = _loose_email(src, end, after, plain_dots=True)
            if hit:
                yield hit
    for pattern, anchor in ((_AT_PERCENT, "%"), (_AT_ENTITY, "&")):
        for match in _anchored(pattern, lower, anchor):
            hit = _loose_email(src, match.start(), match.end(), plain_dots=True)
            if hit:
                yield hit


def _spaced_at(src: ScanText, at: int) -> PiiHit | None:
    """An address with spaces around its "@" or a written-out dot after it."""
    lower = src.lower
    start, end = at, at + 1
    while start and lower[start - 1] in " \t":
        start -= 1
    while end < len(lower) and lower[end] in " \t":
        end += 1
    return _loose_email(src, start, end, plain_dots=(start, end) != (at, at + 1))


# ---------------------------------------------------------------------------------------------
# Numbers with separators: cards, SSNs, phones, IPv4


_Group = int | tuple[int, int]

# Digit groups after the first one, per separator. A tail must name a real format: dates
# (4-2-2), versions (1-2-2) and times never match, so the regex fails without calling Python.
_CARD_TAILS: tuple[tuple[_Group, ...], ...] = ((4, 4, 4, 3), (4, 4, 4), (6, 5), (6, 4))
_EU_TAILS: tuple[tuple[_Group, ...], ...] = (
    (2, 2, 2, 2),
    (4, 4),
    (3, 4),
    (4, 3),
    (3, 3),
    ((5, 9),),
)
_US_TAILS: tuple[tuple[_Group, ...], ...] = ((3, 3, 4), (3, 4))
_SSN_TAILS: tuple[tuple[_Group, ...], ...] = ((2, 4),)
_IPV4_TAILS: tuple[tuple[_Group, ...], ...] = (((1, 3), (1, 3), (1, 3)),)


def _lengths(group: _Group) -> range:
    return range(group[0], group[1] + 1) if isinstance(group, tuple) else range(group, group + 1)


def _trie(words: Iterable[str], sep: str) -> str:
    """A regex of `words` ("d" a digit, as "0" in the shape; "s" the separator) as a trie.

    A flat alternation makes the engine retry a dozen formats at every date or UUID;
    the trie reads each character once and fails at the first one no format allows.
    """
    root: dict[str, dict[str, Any]] = {}
    for word in words:
        node = root
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        parts = [
            ("0" if key == "d" else sep) + emit(node[key]) for key in ("d", "s") if key in node
        ]
        if "" in node:
            parts.append("")
        return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"

    return emit(root)


def _family(sep: str, tails: Iterable[tuple[_Group, ...]]) -> re.Pattern[bytes]:
    """A regex for the shape of the text, anchored on the first `sep` of a number and matching
    one of the `tails` after it.

    In the shape every digit is "0", so the regex starts with the two-character literal
    `sep` "0": the engine's prefix search skips the separators of ordinary text ("a - b",
    prose spaces, the dots of host names) without entering the matcher, and the trie
    compares literals instead of classes.
    """
    escaped = re.escape(sep)
    words = set()
    for tail in tails:
        for lengths in itertools.product(*map(_lengths, tail)):
            words.add("s".join("d" * length for length in lengths)[1:])
    # The second branch takes any other run with at least seven more digits: a card in an
    # odd grouping ("41 11 11 ...", "4111.1111.1111.1111"), judged in Python.
    return re.compile(
        (
            rf"{escaped}0(?<=0{escaped}0)(?:{_trie(words, escaped)}"
            rf"(?![0-9A-Za-z_]|{escaped}0)"
            rf"|{f'{escaped}?0' * 6}(?P<run>0*+(?:{escaped}0++)*+)(?![0-9A-Za-z_]))"
        ).encode()
    )


_DASH = _family("-", _CARD_TAILS + _EU_TAILS + _US_TAILS + _SSN_TAILS)
# Two-group dotted numbers are left out: 3.510216 and every other long decimal would match.
_DOT = _family(".", _IPV4_TAILS + _EU_TAILS[:-1] + _US_TAILS)
_SPACE = _family(" ", _CARD_TAILS + _EU_TAILS + _SSN_TAILS)
_CARD_SIGNATURES = frozenset({(4, 4, 4, 4), (4, 4, 4, 4, 3), (4, 6, 5), (4, 6, 4)})


def _us_phone(groups: Sequence[str]) -> bool:
    if len(groups) == 4 and groups[0] == "1":
        groups = groups[1:]
    # NANP area codes never start with 0 or 1; exchanges are not checked, since the
    # 555-123-4567 of examples and test data is what people write.
    return tuple(map(len, groups)) == (3, 3, 4) and groups[0][0] not in "01"


def _eu_phone(groups: Sequence[str]) -> bool:
    """A national number with a trunk 0 (020 7946 0958, 06-12345678, 01 23 45 67 89)."""
    first = groups[0]
    total = sum(map(len, groups))
    return (
        2 <= len(first) <= 5
        and first[0] == "0"
        and first[1] != "0"
        and 9 <= total <= 12
        and all(len(group) >= 2 for group in groups)
    )


def _classify(groups: Sequence[str], sep: str) -> str | None:
    """The entity a separated number is, if any."""
    signature = tuple(map(len, groups))
    if signature == (3, 2, 4) and sep != ".":
        return "US_SSN" if ssn_ok(*groups) else None
    if signature in _CARD_SIGNATURES and sep != ".":
        digits = "".join(groups)
        if card_brand_ok(digits, grouped=True) and luhn_ok(digits):
            return "CREDIT_CARD"
        return None
    if sep == "." and len(groups) == 4 and max(signature) <= 3:
        return "IP_ADDRESS" if _ipv4_ok(groups) else None
    if sep != " " and _us_phone(groups):
        return "PHONE_NUMBER"
    return "PHONE_NUMBER" if _eu_phone(groups) else None


def _odd_card(groups: Sequence[str]) -> str | None:
    """CREDIT_CARD if the groups, however cut, spell a valid card number."""
    digits = "".join(groups)
    if len(groups) < 3 or not 13 <= len(digits) <= 19 or max(map(len, groups)) > 6:
        return None  # two groups: a decimal (3.7123456789012) or two numbers of a table
    return "CREDIT_CARD" if card_brand_ok(digits, grouped=True) and luhn_ok(digits) else None


# "version 10.2.3.4" and "kernel: 5.15.0.1" name versions, whatever they look like.
_VERSION_LABEL = re.compile(
    r"(?:version|release|firmware|kernel|build|driver|ver)[\"']?[ \t]*[:=]?[ \t]*[\"']?\Z"
)


def _is_version(text: str, start: int) -> bool:
    return _VERSION_LABEL.search(text[max(0, start - 16) : start].lower()) is not None


_SHORTEST_CARD = 16  # 4-6-4 with its separators: the shortest card grouping


def _cards_inside(text: str, start: int, end: int, sep: str) -> Iterator[PiiHit]:
    """Cards written in a card's grouping inside a longer run of digit groups.

    A time, a quantity or a year beside a card joins its run ("12:00:01 4111 1111 1111 1111",
    "4111 1111 1111 1111 2024"), and the run as a whole is no card. Only whole groups in one
    of the card groupings (4-4-4-4, 4-4-4-4-3, 4-6-5, 4-6-4) are tried, with the network
    prefix and Luhn checks, so runs of ordinary numbers stay as they are.
    """
    groups = text[start:end].split(sep)
    lengths = [len(group) for group in groups]
    offsets = list(itertools.accumulate((length + 1 for length in lengths), initial=start))
    index = 0
    while index < len(groups):
        found = 0
        if lengths[index] == 4:
            for size in (5, 4, 3):  # the longest grouping first: 19 digits before 16
                if len(lengths) - index < size:
                    continue
                if tuple(lengths[index : index + size]) in _CARD_SIGNATURES:
                    digits = "".join(groups[index : index + size])
                    if card_brand_ok(digits, grouped=True) and luhn_ok(digits):
                        found = size
                        break
        if found:
            yield PiiHit("CREDIT_CARD", offsets[index], offsets[index + found] - 1)
            index += found
        else:
            index += 1


def _separated(src: ScanText, pattern: re.Pattern[bytes], sep: str) -> Iterator[PiiHit]:
    text, shape = src.text, src.shape
    # A word character before the leading digits, "+" (an international number) or "." or
    # the separator itself (part of a longer dotted or dashed id); a space may start a number.
    rejected = _WORD | {"+", "."} | ({sep} - {" "})
    # Dotted runs are versions, addresses and OIDs: no card is looked for inside them.
    inside = _cards_inside if sep != "." else None
    for match in pattern.finditer(shape):
        at, end = match.span()
        odd = match.lastindex is not None  # only the odd-grouping branch has a group
        # The leading digit group, read backwards in the shape: one C call, not a loop.
        longest = 6 if odd else 5
        window = shape[max(0, at - longest - 1) : at]
        start = at - (len(window) - len(window.rstrip(b"0")))
        # A leading group too long for a number, or glued to a word or a longer id, is not
        # part of one; a card may still follow it ("card2 4111 1111 1111 1111").
        glued = at - start > longest or (
            start > 0
            and (
                text[start - 1] in rejected
                or (text[start - 1] == "/" and _word_before(text, start - 1))  # Chrome/124.0
            )
        )
        if glued:
            if inside is not None and end - at > _SHORTEST_CARD:
                yield from inside(text, at + 1, end, sep)
            continue
        groups = text[start:end].split(sep)
        kind = _odd_card(groups) if odd else _classify(groups, sep)
        if kind == "IP_ADDRESS" and _is_version(text, start):
            continue
        if kind:
            yield PiiHit(kind, start, end)
        elif inside is not None and end - start >= _SHORTEST_CARD:
            yield from inside(text, start, end, sep)


def find_separated_numbers(src: ScanText) -> Iterator[PiiHit]:
    """Cards, SSNs, US/EU phones and IPv4 addresses written with - . or space separators."""
    yield from _separated(src, _DASH, "-")
    yield from _separated(src, _DOT, ".")
    yield from _separated(src, _SPACE, " ")


_PAREN_PHONE = re.compile(
    r"\((?<![0-9A-Za-z_]\()(?P<area>[0-9]{2,5})\)[ -]?"
    r"(?P<rest>[0-9]{2,8}(?:[ .-][0-9]{2,8}){0,2})(?![0-9A-Za-z_]|[ .-][0-9])"
)
_NOT_DIGIT = re.compile(r"[^0-9]")


def find_paren_phones(src: ScanText) -> Iterator[PiiHit]:
    """Phones with the area code in parentheses: (555) 123-4567, (030) 1234567."""
    for match in _PAREN_PHONE.finditer(src.text):
        area = match.group("area")
        groups = [area, *_NOT_DIGIT.split(match.group("rest"))]
        if (len(area) == 3 and _us_phone(groups)) or _eu_phone(groups):
            yield PiiHit("PHONE_NUMBER", match.start(), match.end())


_INTL_PHONE = re.compile(
    r"\+(?<![0-9A-Za-z_+]\+)[1-9][0-9]*+"
    r"(?:[ .-]?\((?P<trunk>0)\)[ .-]?[0-9]++|[ .-]?\([0-9]{1,4}\)[ .-]?[0-9]++|[ .-][0-9]++)*+"
    r"(?![0-9A-Za-z_])"
)


def find_intl_phones(src: ScanText) -> Iterator[PiiHit]:
    """International numbers: +44 20 7946 0958, +1-555-123-4567, +4915112345678."""
    for match in _anchored(_INTL_PHONE, src.text, "+"):
        digits = sum(char.isdigit() for char in match.group()) - (1 if match.group("trunk") else 0)
        if 8 <= digits <= 15:
            yield PiiHit("PHONE_NUMBER", match.start(), match.end())


# ---------------------------------------------------------------------------------------------
# Runs without separators, searched in the shape of the text


# Written out: a repeat like 0{13} would not give the regex engine a literal prefix to skip to.
_CARD_RUN = re.compile(rb"0000000000000(?<![0-9A-Za-z_.]0000000000000)0{0,3}(?![0-9A-Za-z_])")


def find_card_runs(src: ScanText) -> Iterator[PiiHit]:
    """Card numbers written as one run of 13-16 digits."""
    text = src.text
    for match in _CARD_RUN.finditer(src.shape):
        start, end = match.span()
        # Every card network starts with 2-6; the epoch milliseconds of JSON logs start with 1.
        if text[start] not in "23456":
            continue
        digits = text[start:end]
        if card_brand_ok(digits, grouped=False) and luhn_ok(digits):
            yield PiiHit("CREDIT_CARD", start, end)


_IBAN_RUN = re.compile(rb"AA00(?<![0-9A-Za-z_]AA00)(?: ?[A0]{4}){2,7}(?: ?[A0]{1,4})?")
_IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22,
    "BH": 22, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28,
    "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20,
    "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27,
    "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15,
    "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24,
    "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28,
    "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}  # fmt: skip


def find_ibans(src: ScanText) -> Iterator[PiiHit]:
    """IBANs, compact or in groups of four, cut to their country's length and mod-97 checked."""
    text = src.text
    for match in _IBAN_RUN.finditer(src.shape):
        length = _IBAN_LENGTHS.get(text[match.start() : match.start() + 2])
        if length is None:
            continue
        end, kept = match.start(), 0
        while kept < length and end < match.end():
            kept += text[end] != " "
            end += 1
        compact = text[match.start() : end].replace(" ", "")
        if kept == length and not _word_at(text, end) and iban_ok(compact):
            yield PiiHit("IBAN_CODE", match.start(), end)


# ---------------------------------------------------------------------------------------------
# IPv6, found from its first colon


# The lookahead demands what every IPv6 address has, "::" or seven colons, so the colons of
# times and "key: value" fail inside the regex engine. The seven colons are written out: a
# repeated group costs the engine an allocation at every colon of the text.
_SEVEN_COLONS = "[0-9A-Fa-f]{1,4}:" * 6 + "[0-9A-Fa-f]"
_IPV6_REST = r"[0-9A-Fa-f:]++(?:\.[0-9]{1,3}){0,3}(?:%[0-9A-Za-z]{1,15})?"
_IPV6_TAIL = re.compile(rf":(?=:|[0-9A-Fa-f:]{{0,40}}::|{_SEVEN_COLONS}){_IPV6_REST}")
# The same where the text has no "::" (most logs): its first two branches cannot hold, and
# trying them at every colon (a digest after "sha256:" is 40 characters of backtracking) is
# much of the recognizer's cost.
_IPV6_FULL_TAIL = re.compile(rf":(?={_SEVEN_COLONS}){_IPV6_REST}")


def find_ipv6(src: ScanText) -> Iterator[PiiHit]:
    """IPv6 addresses, full or compressed, validated by ipaddress."""
    text = src.text
    pattern = _IPV6_TAIL if "::" in text else _IPV6_FULL_TAIL
    for match in pattern.finditer(text):
        start = _run_start(text, match.start(), _HEX, 4)
        if start < 0:
            start = match.start()
        if start > 0 and (text[start - 1] in _WORD or text[start - 1] in ":."):
            continue
        end = match.end()
        if _ip_ok(text[start:end]):
            yield PiiHit("IP_ADDRESS", start, end)
        elif text[end - 1] == ":" and text[end - 2] != ":" and _ip_ok(text[start : end - 1]):
            yield PiiHit("IP_ADDRESS", start, end - 1)


# ---------------------------------------------------------------------------------------------
# Secrets in a secret-ish context, and secrets encoded in base64 or hex


# A run this long of base64 characters is a candidate: long enough for "password=hunter2" in
# base64 (24), longer than the 16-hex span ids of tracing logs, which would double the work.
_MIN_ENCODED = 20
_ENCODED_RUN = re.compile(b"b" * _MIN_ENCODED + b"b*")
_TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "+/_-")
_TOKEN_REACH = 512
# The end of a key that names a secret; matched on the lower-case text before the value.
_SECRET_LABELS = (
    "secret",
    "token",
    "password",
    "passwd",
    "passphrase",
    "apikey",
    "api_key",
    "api-key",
    "secretkey",
    "secret_key",
    "secret-key",
    "privatekey",
    "private_key",
    "private-key",
    "accesskey",
    "access_key",
    "access-key",
    "signingkey",
    "signing_key",
    "encryption_key",
    "master_key",
    "auth",
    "credential",
    "credentials",
    "session",
)
_VALUE_OPENERS = frozenset("=:\"' \t")
_HIGH_NIBBLES = "234567"  # hex of printable ASCII: every other digit is one of these
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")
_MAX_DEPTH = 2  # base64 inside base64 is still found; deeper nesting is not worth a scan
_B64_CONTINUATION = re.compile(
    r"(?:\r?\n|\\ )[ \t]*([A-Za-z0-9+/]++=*)(?=[ \t]*(?:\r?\n|\\ |[\"',]|\Z))"
)

Rescan = Callable[[str], list[PiiHit]]


def _looks_secret(token: str) -> bool:
    """True if the token mixes letters and digits, as generated secrets do (words do not)."""
    return (
        any(char.isdigit() for char in token)
        and any(char.isalpha() for char in token)
        and len(set(token)) > 4
    )


def _decode_base64(token: str, shortest: int = 6) -> str | None:
    """The token decoded from base64 (standard or URL-safe) if that gives text, else None."""
    core = token.rstrip("=")
    if "-" in core or "_" in core:
        core = core.replace("-", "+").replace("_", "/")
    if len(core) % 4 == 1:
        return None
    try:
        raw = binascii.a2b_base64(core + "=" * (-len(core) % 4))
    except binascii.Error:
        return None
    return _as_text(raw, shortest)


def _decode_hex(token: str) -> str | None:
    """The token decoded from hex if it is the hex of text, else None."""
    if len(token) % 2 or token[::2].strip(_HIGH_NIBBLES) or not all(c in _HEX for c in token):
        return None
    return _as_text(bytes.fromhex(token), 6)


def _as_text(raw: bytes, shortest: int) -> str | None:
    text = raw.decode("utf-8", "replace")
    if len(text) < shortest or _CONTROL.search(text):
        return None  # binary: a random token, a digest, compressed data
    return text


# Read backwards from the value: most runs are hex ids after a key such as "trace_id" that is
# not secret-ish, and one anchored match on the reversed text before them decides in C.
# The two forms: a separator right after the key (token=, "apiKey": "), or blanks after a
# command-line flag that ends with the key (--client-secret VALUE). No label ends another
# (a test holds that), so the alternation cannot pick a shorter label than the text has.
_REVERSED_LABELS = "|".join(re.escape(label[::-1]) for label in _SECRET_LABELS)
_LABEL_BEFORE_REVERSED = re.compile(
    rf"[\"']?[ \t]*(?:[:=]|>=)[ \t]*[\"']?(?:{_REVERSED_LABELS})"
    rf"|[ \t]+(?:{_REVERSED_LABELS})[a-z0-9_-]{{0,32}}?--(?![a-z0-9_-])"
)
_LABEL_REACH = 48


def _secret_label_before(lower: str, start: int) -> bool:
    """True if the value at `start` follows a secret-ish key: token=, "apiKey": ", --secret ."""
    before = lower[max(0, start - _LABEL_REACH) : start][::-1]
    return _LABEL_BEFORE_REVERSED.match(before) is not None


def _token_end(text: str, end: int) -> int:
    limit = min(len(text), end + _TOKEN_REACH)
    while end < limit and text[end] in _TOKEN_CHARS:
        end += 1
    while end < len(text) and text[end] == "=":
        end += 1
    return end


def _wrapped(text: str, start: int, end: int) -> tuple[int, list[str]]:
    """The end of a base64 block wrapped over lines (as base64(1) prints it), and its lines."""
    lines = [text[start:end]]
    width = len(lines[0])
    # Only a full line (64 or 76 characters, no padding) is followed by more of the block.
    while width >= 60 and width % 4 == 0 and len(lines[-1]) == width and text[end - 1] != "=":
        line = _B64_CONTINUATION.match(text, end)
        if line is None or len(line.group(1)) > width:
            break
        lines.append(line.group(1))
        end = line.end()
    return end, lines


# In decoded text a colon after a password key counts too: "password: required" is prose in
# a log, but nobody base64-encodes prose about passwords (a config blob, a Secret's data).
_DECODED_PASSWORD = re.compile(
    r"(?<![a-z0-9_])p(?:ass(?:word|wd)|wd)[\"']?[ \t]*:[ \t]*[\"']?(?P<value>[^\s\"'*][^\s\"']*)"
)


def _decoded_password(decoded: str) -> bool:
    """True if the decoded text gives a password as "password: value" (YAML, a header)."""
    return _DECODED_PASSWORD.search(decoded.lower()) is not None


def _decoded_hit(text: str, start: int, end: int, rescan: Rescan) -> PiiHit | None:
    """A hit over the encoded token at [start, end) if what it decodes to has one."""
    token = text[start:end]
    decoded = _decode_hex(token)
    if decoded is None and not token.islower() and not token.isupper():
        end, lines = _wrapped(text, start, end)
        decoded = _decode_base64("".join(lines))
        if decoded is None and len(lines) > 1:
            # The last "line" may be the next line of text after a block that ended full.
            decoded = _decode_base64("".join(lines[:-1]))
    if decoded is None:
        return None
    hits = rescan(decoded)
    if not hits:
        if _decoded_password(decoded):
            return PiiHit("CONNECTION_STRING_PASSWORD", start, end)
        return None
    return PiiHit(min((hit.entity_type for hit in hits), key=priority), start, end)


def find_encoded(src: ScanText, rescan: Rescan | None) -> Iterator[PiiHit]:
    """Long tokens after a secret-ish key, and base64 or hex whose decoded text has a hit.

    `rescan` scans decoded text; None when the nesting is already too deep to decode again.
    """
    text, lower = src.text, src.lower
    size = len(text)
    done = 0
    # Most runs are hex ids and digests after a key that is not secret-ish; the loop keeps
    # their path to a few C calls.
    for match in _ENCODED_RUN.finditer(src.encoded):
        start, end = match.span()
        if start < done:
            continue
        before = text[start - 1] if start else ""
        if before in "-_" and before:
            joined = _run_start(text, start, _TOKEN_CHARS, _TOKEN_REACH)
            start = start if joined < 0 else joined
            before = text[start - 1] if start else ""
        if end < size and text[end] in "-_=":
            end = _token_end(text, end)
        done = end
        token = text[start:end]
        if before in _VALUE_OPENERS and _secret_label_before(lower, start) and _looks_secret(token):
            yield PiiHit("GENERIC_SECRET", start, end)
        elif rescan is not None and (
            not (token.islower() or token.isupper() or token.isdigit())
            or not token[::2].strip(_HIGH_NIBBLES)
        ):
            hit = _decoded_hit(text, start, end, rescan)
            if hit:
                done = hit.end
                yield hit


# ---------------------------------------------------------------------------------------------


RECOGNIZERS: tuple[Recognizer, ...] = (
    Recognizer(frozenset({"PRIVATE_KEY"}), find_private_keys),
    Recognizer(frozenset({"AWS_SECRET_KEY"}), find_aws_secret),
    Recognizer(frozenset({"AWS_ACCESS_KEY", "AWS_SECRET_KEY", "GOOGLE_API_KEY"}), find_a_keys),
    Recognizer(frozenset({"GITHUB_TOKEN"}), find_github),
    Recognizer(frozenset({"SLACK_TOKEN"}), find_slack),
    Recognizer(frozenset({"STRIPE_KEY", "OPENAI_API_KEY"}), find_k_keys),
    Recognizer(frozenset({"JWT"}), find_jwt),
    Recognizer(frozenset({"BEARER_TOKEN", "BASIC_AUTH"}), find_bearer_and_basic),
    Recognizer(frozenset({"BASIC_AUTH"}), find_user_flag_passwords),
    Recognizer(frozenset({"GENERIC_SECRET"}), find_authorization),
    Recognizer(frozenset({"CONNECTION_STRING_PASSWORD"}), find_url_passwords),
    Recognizer(frozenset({"CONNECTION_STRING_PASSWORD"}), find_keyvalue_passwords),
    Recognizer(
        frozenset({"CREDIT_CARD", "US_SSN", "PHONE_NUMBER", "IP_ADDRESS"}),
        find_separated_numbers,
    ),
    Recognizer(frozenset({"CREDIT_CARD"}), find_card_runs),
    Recognizer(frozenset({"IBAN_CODE"}), find_ibans),
    Recognizer(frozenset({"EMAIL_ADDRESS"}), find_emails),
    Recognizer(frozenset({"EMAIL_ADDRESS"}), find_loose_emails),
    Recognizer(frozenset({"IP_ADDRESS"}), find_ipv6),
    Recognizer(frozenset({"PHONE_NUMBER"}), find_paren_phones),
    Recognizer(frozenset({"PHONE_NUMBER"}), find_intl_phones),
)


class Scanner:
    """Runs the recognizers of the enabled entity types over a text."""

    def __init__(self, entities: Iterable[str] | None = None) -> None:
        enabled = frozenset(ENTITY_TYPES if entities is None else entities)
        unknown = sorted(enabled - set(ENTITY_TYPES))
        if unknown:
            raise ValueError(f"unknown entity type(s): {', '.join(unknown)}")
        self.entities = enabled
        self._recognizers = tuple(r for r in RECOGNIZERS if r.entities & enabled)

    def __call__(self, text: str) -> list[PiiHit]:
        """Every hit of an enabled entity type, as spans of `text`; hits may overlap."""
        return self._scan(text, 0)

    def _scan(self, text: str, depth: int) -> list[PiiHit]:
        if not self.entities:
            return []
        src = ScanText(text)
        enabled = self.entities
        hits: list[PiiHit] = []
        for recognizer in self._recognizers:
            hits.extend(hit for hit in recognizer.find(src) if hit.entity_type in enabled)
        # Decoded text is scanned by the same recognizers, one level deeper each time.
        rescan = functools.partial(self._scan, depth=depth + 1) if depth < _MAX_DEPTH else None
        hits.extend(hit for hit in find_encoded(src, rescan) if hit.entity_type in enabled)
        return [src.original(hit) for hit in hits]
