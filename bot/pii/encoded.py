"""Secrets in a secret-ish context, and secrets encoded in base64 or hex: decoded and
scanned again when they read as text.
"""

from __future__ import annotations

import binascii
import re
import string
from collections.abc import Callable, Iterator

from bot.patterns import on_use
from bot.pii.checks import run_start
from bot.pii.scantext import HEX, WORD, PiiHit, ScanText, priority

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
    "accountkey",  # Azure Storage's connection strings
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
_CONTROL_CHARS = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd"  # in decoded text, as binary
_CONTROL = on_use(f"[{_CONTROL_CHARS}]")
# The same, or a byte that is not UTF-8, as surrogateescape reads one (a lone surrogate).
_NOT_TEXT = on_use(f"[{_CONTROL_CHARS}\\udc80-\\udcff]")
_SHORTEST_TEXT = 6  # decoded, what a base64 or hex token must read as at least
_B64_CONTINUATION = on_use(
    r"(?:\r?\n|\\ )[ \t]*([A-Za-z0-9+/]++=*)(?=[ \t]*(?:\r?\n|\\ |[\"',]|\Z))"
)

Rescan = Callable[[str], list[PiiHit]]


def looks_secret(token: str) -> bool:
    """True if the token mixes letters and digits, as generated secrets do (words do not)."""
    return (
        any(char.isdigit() for char in token)
        and any(char.isalpha() for char in token)
        and len(set(token)) > 4
    )


def decode_base64(token: str, shortest: int = _SHORTEST_TEXT) -> str | None:
    """The token decoded from base64 (standard or URL-safe) if that gives text, else None."""
    raw = _base64_bytes(token)
    return None if raw is None else _as_text(raw, shortest)


def _base64_bytes(token: str) -> bytes | None:
    """The bytes of a base64 token (standard or URL-safe, padded or not); None if it is none."""
    core = token.rstrip("=")
    if "-" in core or "_" in core:
        core = core.replace("-", "+").replace("_", "/")
    if len(core) % 4 == 1:
        return None
    try:
        return binascii.a2b_base64(core + "=" * (-len(core) % 4))
    except binascii.Error:
        return None


def _decode_hex(token: str) -> str | None:
    """The token decoded from hex if it is the hex of text, else None."""
    if len(token) % 2 or token[::2].strip(_HIGH_NIBBLES) or not all(c in HEX for c in token):
        return None
    return _as_text(bytes.fromhex(token), _SHORTEST_TEXT)


def _as_text(raw: bytes, shortest: int) -> str | None:
    text = raw.decode("utf-8", "replace")
    if len(text) < shortest or _CONTROL.search(text):
        return None  # binary: a random token, a digest, compressed data
    return text


# Read backwards from the value: most runs are hex ids after a key such as "trace_id" that is
# not secret-ish, and one anchored match on the reversed text before them decides in C.
# The two forms: a separator right after the key (token=, "apiKey": ", or \"apiKey\": \" in
# JSON inside a JSON string), or blanks after a command-line flag that ends with the key
# (--client-secret VALUE). No label ends another (a test holds that), so the alternation
# cannot pick a shorter label than the text has.
_REVERSED_LABELS = "|".join(re.escape(label[::-1]) for label in _SECRET_LABELS)
_LABEL_BEFORE_REVERSED = on_use(
    rf"(?:[\"']\\*)?[ \t]*(?:[:=]|>=)[ \t]*(?:[\"']\\*)?(?:{_REVERSED_LABELS})"
    rf"|[ \t]+(?:{_REVERSED_LABELS})[a-z0-9_-]{{0,32}}?--(?![a-z0-9_-])"
)
_LABEL_REACH = 48


# A page's cursor (next_token, NextToken, nextPageToken, NextContinuationToken, page_token,
# --starting-token): the call for the next page needs it, and it opens nothing. Read
# backwards from the value as the labels are.
_PAGE_WORDS = ("next", "page", "continuation", "pagination", "starting", "resume", "sync")
_REVERSED_PAGE_WORDS = "|".join(word[::-1] for word in _PAGE_WORDS)
_PAGE_TOKEN_BEFORE_REVERSED = on_use(
    rf"(?:[\"']\\*)?[ \t]*(?:[:=]|>=)[ \t]*(?:[\"']\\*)?nekot[_-]?(?:egap[_-]?)?"
    rf"(?:{_REVERSED_PAGE_WORDS})"
    rf"|[ \t]+nekot-(?:egap-)?(?:{_REVERSED_PAGE_WORDS})--"
)


def names_a_location(value: str) -> bool:
    """Whether a value says where a secret is kept: a URL (its credentials are read as a
    URL's), an ARN, or a relative path in small letters (a generated value with a slash in it
    is base64, which mixes cases)."""
    if "://" in value or value.startswith("arn:"):
        return True
    return "/" in value and value == value.lower() and "" not in value.split("/")


def page_cursor_name(name: str) -> bool:
    """Whether a key names a page's cursor: NextToken, next_page_token, ContinuationToken."""
    lower = name.lower().replace("_", "").replace("-", "")
    if not lower.endswith("token"):
        return False
    stem = lower.removesuffix("token")
    return stem.endswith(_PAGE_WORDS) or stem.removesuffix("page").endswith(_PAGE_WORDS)


def page_token_before(lower: str, start: int) -> bool:
    """True if the value at `start` follows a page cursor's key: next_token=, "NextToken": "."""
    before = lower[max(0, start - _LABEL_REACH) : start][::-1]
    return _PAGE_TOKEN_BEFORE_REVERSED.match(before) is not None


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


def _wrapped(text: str, start: int, end: int) -> tuple[int, list[str], list[int]]:
    """The end of a base64 block wrapped over lines (as base64(1) prints it), its lines, and
    where each line starts."""
    lines, starts = [text[start:end]], [start]
    width = len(lines[0])
    # Only a full line (64 or 76 characters, no padding) is followed by more of the block.
    while width >= 60 and width % 4 == 0 and len(lines[-1]) == width and text[end - 1] != "=":
        line = _B64_CONTINUATION.match(text, end)
        if line is None or len(line.group(1)) > width:
            break
        lines.append(line.group(1))
        starts.append(line.start(1))
        end = line.end()
    return end, lines, starts


def _text_tail(lines: list[str]) -> tuple[int, str] | None:
    """The longest tail of a wrapped block that decodes to text, from a line's start, when the
    whole block does not (binary data, then a text): which line, and its text. The block is
    decoded once: a tail can start only after its last byte that is no text's, at a line whose
    first byte starts a character, so every byte is read a few times, however long the block
    (a decode tried from each line read the rest of the block into each error it raised)."""
    raw = _base64_bytes("".join(lines))
    if raw is None:
        return None
    per_line = len(lines[0]) * 3 // 4  # every line but the last is full: whole quanta
    # The first line that starts after that byte: the line it falls in holds it.
    line = -(-_after_last_non_text(raw) // per_line)
    while line * per_line < len(raw) and 0x80 <= raw[line * per_line] < 0xC0:
        line += 1  # inside a character: the next line may start one
    # From a byte that starts a character, UTF-8 reads as it does in the whole block: the
    # tail holds no byte that is not UTF-8.
    text = raw[line * per_line :].decode("utf-8")
    return (line, text) if len(text) >= _SHORTEST_TEXT else None


def _after_last_non_text(raw: bytes) -> int:
    """Where the bytes after the last one that is no text's begin: a control byte, a
    replacement character, or a byte that is not UTF-8 (one decode finds all three)."""
    escaped = raw.decode("utf-8", "surrogateescape")
    last = _NOT_TEXT.search(escaped[::-1])
    if last is None:
        return 0
    return len(escaped[: len(escaped) - last.start()].encode("utf-8", "surrogateescape"))


# In decoded text a colon after a password key counts too: "password: required" is prose in
# a log, but nobody base64-encodes prose about passwords (a config blob, a Secret's data).
_DECODED_PASSWORD = on_use(
    r"(?<![a-z0-9_])p(?:ass(?:word|wd)|wd)[\"']?[ \t]*:[ \t]*[\"']?(?P<value>[^\s\"'*][^\s\"']*)"
)


def _decoded_password(decoded: str) -> bool:
    """True if the decoded text gives a password as "password: value" (YAML, a header)."""
    return _DECODED_PASSWORD.search(decoded.lower()) is not None


def _decoded_hit(text: str, start: int, end: int, rescan: Rescan) -> tuple[PiiHit | None, int]:
    """A hit over the encoded token at [start, end) if what it decodes to has one, and how far
    the runs were read with it: a block wrapped over lines is read once, whole (its lines read
    again one by one made a scan of a wrapped block quadratic in its length)."""
    token = text[start:end]
    decoded = _decode_hex(token)
    read = end
    if decoded is None and not token.islower() and not token.isupper():
        end, lines, starts = _wrapped(text, start, end)
        # The last "line" may be the next line of text after a block that ended full: read
        # apart, as a run of its own, unless the block's text takes it.
        read = starts[-1] if len(lines) > 1 else end
        decoded = decode_base64("".join(lines))
        if decoded is None and len(lines) > 1:
            decoded = decode_base64("".join(lines[:-1]))
        if decoded is None and len(lines) > 2:
            tail = _text_tail(lines) or _text_tail(lines[:-1])
            if tail is not None:
                start, decoded = starts[tail[0]], tail[1]
    if decoded is None:
        return None, read
    hits = rescan(decoded)
    if not hits:
        if _decoded_password(decoded):
            return PiiHit("CONNECTION_STRING_PASSWORD", start, end), end
        return None, read
    return PiiHit(min((hit.entity_type for hit in hits), key=priority), start, end), end


# HashiCorp Vault's tokens since 1.10: hvs. (service), hvb. (batch), hvr. (recovery), then a
# long base64url body that no label precedes and that decodes to binary. Read here, from the
# body's run, where a search of the text for the prefix would cost a pass of its own.
_VAULT_PREFIXES = ("hvs.", "hvb.", "hvr.")
_VAULT_BODY = 24


def _vault_token(text: str, start: int, end: int) -> bool:
    """Whether the run at [start, end), after a ".", is a Vault token's body."""
    prefix = start - len(_VAULT_PREFIXES[0])
    if end - start < _VAULT_BODY or not text.startswith(_VAULT_PREFIXES, prefix):
        return False
    return prefix == 0 or text[prefix - 1] not in WORD


def find_encoded(src: ScanText, rescan: Rescan | None) -> Iterator[PiiHit]:
    """Long tokens after a secret-ish key, and base64 or hex whose decoded text has a hit.

    `rescan` scans decoded text; None when the nesting is already too deep to decode again.
    """
    text, lower = src.text, src.lower
    size = len(text)
    done = 0
    # Most runs are hex ids and digests after a key that is not secret-ish; the loop keeps
    # their path to a few C calls.
    for start, end in src.runs:
        if start < done:
            continue
        before = text[start - 1] if start else ""
        if before in "-_" and before:
            joined = run_start(text, start, _TOKEN_CHARS, _TOKEN_REACH)
            start = start if joined < 0 else joined
            before = text[start - 1] if start else ""
        if end < size and text[end] in "-_=":
            end = _token_end(text, end)
        done = end
        if before == "." and _vault_token(text, start, end):
            yield PiiHit("GENERIC_SECRET", start - len(_VAULT_PREFIXES[0]), end)
            continue
        token = text[start:end]
        if (
            before in _VALUE_OPENERS
            and _secret_label_before(lower, start)
            and looks_secret(token)
            and not page_token_before(lower, start)
            and not names_a_location(token)
        ):
            yield PiiHit("GENERIC_SECRET", start, end)
        elif rescan is not None and (
            not (token.islower() or token.isupper() or token.isdigit())
            or not token[::2].strip(_HIGH_NIBBLES)
        ):
            hit, done = _decoded_hit(text, start, end, rescan)
            if hit:
                yield hit
