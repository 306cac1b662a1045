"""Whether a failed model request is tried again, and how long to wait before it."""

from __future__ import annotations

import email.utils
import math
import random
import re
import time

import openai

from bot.llm.error_body import error_message
from bot.patterns import on_use

# As the openai client: these statuses and every 5xx are worth another try.
RETRIED_STATUSES = frozenset({408, 409, 429})
# A server asking for a longer wait than this is not waited for (the client's own limit).
MAX_SERVER_WAIT = 120.0
_FIRST_BACKOFF = 0.5
_MAX_BACKOFF = 8.0
# OpenAI's error code (and type) for an account whose credit or monthly limit is spent: sent
# with 429, a rate limit's status, though no wait ends it, only a change of plan or billing.
OUT_OF_QUOTA = "insufficient_quota"
# OpenRouter's and Together's status for an account out of credit; no wait ends it either.
PAYMENT_REQUIRED = 402
# Others send 429 and say it in words (xAI's credits, a proxy that drops OpenAI's code). Read
# without the links: Azure's and Groq's rate limits link to a quota or billing page.
_LINK = on_use(r"\b(?:https?://|www\.)\S*", re.IGNORECASE)
_BILLING = on_use(
    r"\b(?:billing|payments?|credits?|spending limit|monthly usage limit|out of budget"
    r"|insufficient[ _](?:quota|balance|funds)|(?:account|available|credit) balance"
    r"|quota exceeded|(?:exceeded|used up|out of) (?:your |the )?(?:current |monthly )?quota)\b",
    re.IGNORECASE,
)
# Words of a rate limit, which a wait ends, read links and all: Gemini's "You exceeded your
# current quota" is a per-minute limit when it says when to retry, links to its rate-limits
# page, or (relayed by a gateway) holds Google's RetryInfo with its retryDelay.
_WAIT = on_use(
    r"\b(?:rate[ -]?limit(?:s|ed|ing)?|try again in|retry ?(?:in|after|delay)"
    r"|per (?:second|minute|hour))\b",
    re.IGNORECASE,
)


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
    """The account's quota or credit is used up: any status saying ``insufficient_quota``, a
    402, or a 429 that says so in words and names no wait."""
    if not isinstance(exc, openai.APIStatusError):
        return False
    # The type too: a proxy relaying OpenAI's error may keep one of the two and drop the other.
    if OUT_OF_QUOTA in (exc.code, exc.type) or exc.status_code == PAYMENT_REQUIRED:
        return True
    return exc.status_code == 429 and server_wait(exc) is None and _says_billing(exc.body)


def _says_billing(body: object) -> bool:
    """The error's message speaks of billing or credit (a link's words aside), and not of a
    rate limit or a wait (a link to a rate-limits page included)."""
    message = error_message(body)
    return _BILLING.search(_LINK.sub(" ", message)) is not None and _WAIT.search(message) is None


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
