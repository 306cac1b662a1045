"""Secrets that web traffic carries by name: a URL's query parameters (?access_token=, &sig=)
and cookies (Cookie:, Set-Cookie:), as access logs, curl -v and header dumps print them."""

from __future__ import annotations

import string
from collections.abc import Iterator

from bot.patterns import on_use
from bot.pii.checks import run_start
from bot.pii.labelled import PLACEHOLDER_STARTS
from bot.pii.scantext import PiiHit, ScanText
from bot.text import QUERY_API_KEYS, QUERY_CREDENTIAL_ENDINGS

# A query parameter named for a credential, by the names the logs mask (bot/text.py): its name
# ends in a credential's word, or "key=" ends an API key's name. Each word costs a str.find over
# the text, in C: four, no more.
_QUERY_WORDS = (*(f"{word}=" for word in QUERY_CREDENTIAL_ENDINGS), "key=")
_QUERY_KEYS = QUERY_API_KEYS
_QUERY_NAME_CHARS = frozenset(string.ascii_lowercase + string.digits + "_-.")
_QUERY_VALUE = on_use(r"[^&\s#\"'<>\\]++")
_SHORTEST = 8  # "?auth=1", "?token=none" hold nothing; a credential is longer


def _credential(value: str) -> bool:
    """Whether a value can be a credential: long enough, and not a word in one case."""
    if len(value) < _SHORTEST or value.startswith(PLACEHOLDER_STARTS):
        return False
    return not (value.isalpha() and (value.islower() or value.isupper()))


def _query_hit(text: str, lower: str, word: int, value: int) -> PiiHit | None:
    """The value of the query parameter whose name ends with the word at ``word``."""
    name = run_start(lower, word, _QUERY_NAME_CHARS, 64)
    name = word if name < 0 else name
    if name == 0 or lower[name - 1] not in "?&":
        return None
    if lower.startswith("key=", word) and lower[name : value - 1] not in _QUERY_KEYS:
        return None
    found = _QUERY_VALUE.match(text, value)
    if found is None or not _credential(found.group()):
        return None
    return PiiHit("GENERIC_SECRET", value, found.end())


def find_query_secrets(src: ScanText) -> Iterator[PiiHit]:
    """The value of a URL's query parameter named for a credential (?access_token=, &sig=)."""
    text, lower = src.text, src.lower
    if "?" not in text:  # memchr: a query starts with one
        return
    for word in _QUERY_WORDS:
        position = lower.find(word)
        while position >= 0:
            value = position + len(word)
            hit = _query_hit(text, lower, position, value)
            if hit is not None:
                yield hit
            position = lower.find(word, value)


# A Cookie or Set-Cookie header, bare or a JSON key ("Cookie": "..."), and its name=value pairs.
_COOKIE_LABEL = on_use(r"cookie(?:\\*[\"'])?[ \t]*:[ \t]*(?:\\*[\"'])?")
_COOKIE_PAIR = on_use(r"[ \t]*+[^=;,\s\"'\\]{1,128}+=(?P<value>[^;\s\"'\\]*+);?")


def find_cookies(src: ScanText) -> Iterator[PiiHit]:
    """The values of a Cookie header's cookies, and of the cookie a Set-Cookie header sets
    (its attributes, Path or Expires, are not secret)."""
    text, lower = src.text, src.lower
    if "cookie" not in lower:  # a long literal: str's search skips most of the text
        return
    covered = 0  # the end of the last header's pairs: a label inside them is part of a value
    for label in _COOKIE_LABEL.finditer(lower):
        if label.start() < covered:
            continue
        only_first = lower.endswith("set-", 0, label.start())
        position = label.end()
        while (pair := _COOKIE_PAIR.match(text, position)) is not None and pair.end() > position:
            position = pair.end()
            if _credential(pair.group("value")):
                yield PiiHit("GENERIC_SECRET", *pair.span("value"))
            if only_first:
                break
        covered = position
