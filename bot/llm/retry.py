"""Whether a failed model request is tried again, and how long to wait before it."""

from __future__ import annotations

import email.utils
import math
import random
import time

import openai

# As the openai client: these statuses and every 5xx are worth another try.
RETRIED_STATUSES = frozenset({408, 409, 429})
# A server asking for a longer wait than this is not waited for (the client's own limit).
MAX_SERVER_WAIT = 120.0
_FIRST_BACKOFF = 0.5
_MAX_BACKOFF = 8.0
# OpenAI's error code (and type) for an account whose credit or monthly limit is spent: sent
# with 429, a rate limit's status, though no wait ends it, only a change of plan or billing.
OUT_OF_QUOTA = "insufficient_quota"


def retryable(exc: openai.OpenAIError) -> bool:
    """A dropped connection, a timed-out attempt, or a status the server may soon get over."""
    if isinstance(exc, openai.APIConnectionError):  # APITimeoutError included
        return True
    if not isinstance(exc, openai.APIStatusError):
        return False
    if out_of_quota(exc):
        return False  # before the server's word: whatever it says, no retry pays the bill
    told = exc.response.headers.get("x-should-retry")
    if told in ("true", "false"):
        return told == "true"  # the server's own word, which the client obeys too
    return exc.status_code in RETRIED_STATUSES or exc.status_code >= 500


def out_of_quota(exc: BaseException) -> bool:
    """The account's quota is used up: a 429 (or any status) saying ``insufficient_quota``."""
    # The type too: a proxy relaying OpenAI's error may keep one of the two and drop the other.
    return isinstance(exc, openai.APIStatusError) and OUT_OF_QUOTA in (exc.code, exc.type)


def server_wait(exc: openai.OpenAIError) -> float | None:
    """How long the server asked to be left alone (``Retry-After``, ``retry-after-ms``)."""
    if not isinstance(exc, openai.APIStatusError):
        return None
    headers = exc.response.headers
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        seconds = _number(headers.get(name))
        if seconds is not None:
            return seconds / divisor
    return _date_wait(headers.get("retry-after"))


def backoff(retry: int) -> float:
    """The wait before retry ``retry`` (1, 2…) when the server named none: doubling, jittered."""
    seconds = min(_FIRST_BACKOFF * 2.0 ** min(retry - 1, 32), _MAX_BACKOFF)
    return seconds * (1 - 0.25 * random.random())  # spreads many replicas' retries apart


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _date_wait(value: str | None) -> float | None:
    """A ``Retry-After`` given as an HTTP date, as seconds from now."""
    if not value:
        return None
    try:
        parsed = email.utils.parsedate_tz(value)
        if parsed is None:
            return None
        return max(0.0, email.utils.mktime_tz(parsed) - time.time())
    except (TypeError, ValueError, OverflowError):
        return None
