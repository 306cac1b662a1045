"""Email addresses: found from their "@", and written out ("jane at example dot com")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from bot.patterns import finditer_with, on_use
from bot.pii.checks import anchored_finditer, word_before
from bot.pii.scantext import PiiHit, ScanText

_EMAIL_DOMAIN = on_use(r"@(?=[A-Za-z0-9])[A-Za-z0-9.-]{1,253}")
# Read backwards from the "@": the reversed local part. "?" stands for a non-ASCII character.
_EMAIL_LOCAL_REVERSED = on_use(r"[A-Za-z0-9._%+?-]{1,65}")


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
    end = at + 1 + length
    if text.startswith(":", end) and end + 1 < len(text) and not text[end + 1].isspace():
        return None  # scp's user@host:path, git's remote git@github.com:org/repo.git
    return PiiHit("EMAIL_ADDRESS", start, end)


def find_emails(src: ScanText) -> Iterator[PiiHit]:
    """Email addresses, also with spaces around the "@" or a written-out dot after it."""
    text = src.text
    for match in anchored_finditer(_AT_SIGN, text, "@"):
        hit = _plain_email(text, match.start()) or _spaced_at(src, match.start())
        if hit:
            yield hit


# Written-out addresses: "jane at example dot com", "jane[at]example[dot]com",
# "jane%40example.com" (and "%2540", encoded twice or more), "jane\u0040example.com" (a JSON
# or Python escape kept as text), "jane @ example.com". Found on the lower-case text from
# their "at": the word or bracketed "at", "%40", the escapes and the HTML entities, and every
# "@" (rare in logs).
_DOT_SEPARATOR = (
    r"(?:\.|%(?:25)*2e|\\u002e|\\x2e"
    r"|[ \t]*[\[({<][ \t]*(?:dot|\.)[ \t]*[\])}>][ \t]*|[ \t]+dot[ \t]+)"
)
_LOOSE_DOMAIN = on_use(rf"[a-z0-9-]{{1,63}}(?:{_DOT_SEPARATOR}[a-z0-9-]{{1,63}})+")
_DOT_SPLIT = on_use(_DOT_SEPARATOR)
# The word "at" counts only before a written-out dot: "deployed at api.example.com" is prose.
_AT_WORD = on_use(
    r"at(?:[ \t]*[\])}>]|[ \t]+(?=[a-z0-9-]{1,63}(?:[ \t]+dot[ \t]|[ \t]*[\[({<][ \t]*dot\b)))"
)
# Two passes: an alternation that does not start with one literal is scanned ten times slower.
_AT_PERCENT = on_use(r"%(?:25)*40")
_AT_ENTITY = on_use(r"&(?:#0*64|#x0*40|commat);")
_AT_ESCAPE = on_use(r"\\(?:u0040|x40)")
_AT_SIGN = on_use(r"@")
# What every written-out address holds in lower case, read off the anchors above: the word
# "at" then a blank or a closing bracket, "%40" or "%2540"..., an HTML entity, an escape. Looked
# for first, and the recognizer's gate: "[exit status 0]" holds a bracket, but none of these.
LOOSE_AT_STARTS: Final = (
    *(f"at{after}" for after in " \t])}>"),
    *("%40", "2540"),
    *("&#", "&commat;"),
    *("\\u0040", "\\x40"),
)
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
    if start == at_start or word_before(src.text, start):
        return None
    return PiiHit("EMAIL_ADDRESS", start, domain.end())


def find_loose_emails(src: ScanText) -> Iterator[PiiHit]:
    """Email addresses written out or encoded to slip past a plain address pattern."""
    if not any(map(src.holds, LOOSE_AT_STARTS)):
        return
    lower = src.lower
    for match in finditer_with(_AT_WORD, lower, "at"):
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
    escapes = ((_AT_ESCAPE, "\\u0040"), (_AT_ESCAPE, "\\x40"))  # not every backslash
    for pattern, anchor in ((_AT_PERCENT, "%"), (_AT_ENTITY, "&"), *escapes):
        for match in anchored_finditer(pattern, lower, anchor):
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
