"""When the provider tries a model request again, against the fake server's replies."""

from __future__ import annotations

from email.utils import formatdate
from time import time

import pytest

from bot.llm.base import ModelError, UserMessage
from bot.llm.openai_provider import OpenAIProvider
from tests.fakes.openai_server import Canned, FakeOpenAI, insufficient_quota


async def _attempts(*canned: Canned, timeout: float = 5.0) -> tuple[str, int]:
    """The call's outcome (its text, or its error) and how many requests it made."""
    async with FakeOpenAI([{"text": "fine"}], canned=canned) as fake:
        model = OpenAIProvider("m", api_key="k", base_url=fake.base_url, max_retries=2)
        try:
            outcome = (await model.complete([UserMessage("hi")], [], timeout=timeout)).text or ""
        except ModelError as exc:
            outcome = str(exc)
        finally:
            await model.aclose()
    return outcome, fake.count


async def test_the_servers_word_against_a_retry_is_kept() -> None:
    outcome, count = await _attempts(Canned(status=500, headers={"x-should-retry": "false"}))
    assert outcome.startswith("model call failed: 500 Internal Server Error")
    assert count == 1


async def test_the_servers_word_for_a_retry_is_kept() -> None:
    outcome, count = await _attempts(
        Canned(status=400, headers={"x-should-retry": "true", "retry-after-ms": "1"})
    )
    assert (outcome, count) == ("fine", 2)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_a_request_the_server_refuses_is_not_retried(status: int) -> None:
    _, count = await _attempts(Canned(status=status))
    assert count == 1


async def test_a_retry_after_date_past_the_timeout_is_said_at_once() -> None:
    later = formatdate(time() + 600, usegmt=True)
    outcome, count = await _attempts(Canned(status=429, headers={"retry-after": later}))
    assert "the server asks to wait" in outcome
    assert "longer than Kestrel waits (120s)" in outcome
    assert count == 1


async def test_a_wait_the_server_asks_for_within_the_time_left_is_waited() -> None:
    outcome, count = await _attempts(Canned(status=429, headers={"retry-after": "0.2"}))
    assert (outcome, count) == ("fine", 2)


QUOTA_HINT = (
    "— the account's quota is used up: check its plan and billing (the account of"
    " OPENAI_API_KEY); trying again cannot help"
)


async def test_an_exhausted_quota_fails_at_once_naming_the_billing() -> None:
    # A 429 like a rate limit's, and it was retried like one, until the call's time ran out.
    outcome, count = await _attempts(insufficient_quota())
    assert outcome.startswith("model call failed: 429 Too Many Requests from http://127")
    assert "You exceeded your current quota" in outcome
    assert outcome.endswith(QUOTA_HINT)
    assert "retr" not in outcome.removesuffix(QUOTA_HINT)
    assert count == 1


async def test_an_exhausted_quota_is_named_when_the_server_says_nothing_of_it() -> None:
    # A proxy that keeps OpenAI's code and puts its own words in place of OpenAI's.
    outcome, count = await _attempts(insufficient_quota("upstream error"), insufficient_quota())
    assert outcome.endswith("upstream error " + QUOTA_HINT)
    assert count == 1


async def test_an_exhausted_quota_is_not_retried_whatever_the_server_says() -> None:
    outcome, count = await _attempts(insufficient_quota(headers={"x-should-retry": "true"}))
    assert outcome.endswith(QUOTA_HINT)
    assert count == 1
