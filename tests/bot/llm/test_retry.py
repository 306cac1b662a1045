"""When the provider tries a model request again, against the fake server's replies."""

from __future__ import annotations

import json
from email.utils import formatdate
from time import time

import pytest

from bot.llm.base import ModelError, UserMessage
from bot.llm.openai_provider import OpenAIProvider
from tests.fakes.openai_server import Canned, FakeOpenAI, account_error, insufficient_quota


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


# Other providers' words for an account that must pay before any request succeeds.
OUT_OF_CREDIT = {
    "OpenRouter": account_error(
        402, "Insufficient credits. Add more using https://openrouter.ai/credits", code=402
    ),
    "OpenRouter, max_tokens": account_error(
        402,
        "This request requires more credits, or fewer max_tokens. You requested up to 4096"
        " tokens, but can only afford 222. To increase, visit https://openrouter.ai/credits",
        code=402,
    ),
    "Together": account_error(
        402,
        "Credit limit exceeded. Please navigate to https://api.together.xyz/settings/billing"
        " to add credit or upgrade your plan.",
        kind="credit_limit",
    ),
    "402 with no words": Canned(status=402, raw="", headers={}),
    "xAI": account_error(
        429,
        "Your team has either used all available credits or reached its monthly spending"
        " limit. To continue making API requests, please purchase more credits.",
    ),
    "a proxy dropping OpenAI's code": account_error(
        429, "You exceeded your current quota, please check your plan and billing details."
    ),
    "a monthly usage limit": account_error(429, "Monthly usage limit reached for this workspace."),
    "a quota exceeded": account_error(429, "Quota exceeded: upgrade the plan to continue."),
    "a balance too low": account_error(429, "Your account balance is too low."),
    "a 402 asking to retry": account_error(
        402, "Payment required", headers={"x-should-retry": "true", "retry-after-ms": "1"}
    ),
}


@pytest.mark.parametrize("canned", OUT_OF_CREDIT.values(), ids=OUT_OF_CREDIT.keys())
async def test_an_account_out_of_credit_fails_at_once_naming_the_billing(canned: Canned) -> None:
    # A 429 was retried as a rate limit (said to the thread as one); a 402 failed with no hint.
    outcome, count = await _attempts(canned, canned, canned)
    assert outcome.endswith(QUOTA_HINT)
    assert "retr" not in outcome.removesuffix(QUOTA_HINT)
    assert count == 1


# Rate limits whose words mention a quota, billing or credits (in a link, or beside a wait):
# waiting ends them, so they are tried again.
RATE_LIMITED = {
    "Azure": account_error(
        429,
        "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version"
        " 2024-02-01 have exceeded token rate limit of your current OpenAI S0 pricing tier."
        " Please retry after 1 second. Please go here: https://aka.ms/oai/quotaincrease if you"
        " would like to further increase the default rate limit.",
        code="429",
    ),
    "Groq": account_error(
        429,
        "Rate limit reached for model `llama-3.3-70b-versatile` on tokens per minute (TPM):"
        " Limit 6000, Used 5034, Requested 1443. Please try again in 0.1s. Need more tokens?"
        " Upgrade to Dev Tier today at https://console.groq.com/settings/billing",
        kind="tokens",
        code="rate_limit_exceeded",
    ),
    "Together": account_error(
        429,
        "You have been rate limited. Your rate limit is 60 queries per minute. Please navigate"
        " to https://api.together.xyz/settings/billing to upgrade to a paid plan.",
        kind="credit_limit",
    ),
    "Gemini, per minute": account_error(
        429,
        "You exceeded your current quota, please check your plan and billing details."
        " Quota exceeded for metric: generate_content_free_tier_requests, limit: 10."
        " Please retry in 0.1s.",
    ),
    "Gemini, exhausted": account_error(429, "Resource has been exhausted (e.g. check quota)."),
    # Gemini's per-minute limit relayed by a gateway: the words of a spent account, the wait
    # only in its link to the rate-limits page and in Google's RetryInfo details.
    "Gemini, relayed": account_error(
        429,
        json.dumps(
            {
                "error": {
                    "code": 429,
                    "message": "You exceeded your current quota, please check your plan and"
                    " billing details. For more information on this error, head to:"
                    " https://ai.google.dev/gemini-api/docs/rate-limits.",
                    "status": "RESOURCE_EXHAUSTED",
                    "details": [
                        {
                            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                            "violations": [
                                {"quotaId": "GenerateRequestsPerMinutePerProjectPerModel"}
                            ],
                        },
                        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1s"},
                    ],
                }
            },
            indent=2,
        ),
        code=429,
    ),
    "rate limiting": account_error(
        429, "Request was rejected due to request rate limiting. Add credits to raise it."
    ),
    "a wait in the headers": account_error(
        429, "Out of credits for this minute.", headers={"retry-after-ms": "1"}
    ),
}


@pytest.mark.parametrize("canned", RATE_LIMITED.values(), ids=RATE_LIMITED.keys())
async def test_a_rate_limit_speaking_of_quota_or_billing_is_tried_again(canned: Canned) -> None:
    outcome, count = await _attempts(canned)
    assert (outcome, count) == ("fine", 2)
