"""The OpenAI provider's bounds: whole-call timeout, bad bodies, call ids, reply size."""

from __future__ import annotations

import logging
import re
import time
from types import SimpleNamespace
from typing import Any

import openai
import pytest

from bot.domain import AssistantTurn, ToolCall
from bot.llm.base import (
    AssistantMessage,
    Message,
    ModelError,
    ToolResultItem,
    ToolResultsMessage,
    UserMessage,
    unique_call_ids,
)
from bot.llm.error_body import error_message
from bot.llm.openai_provider import OpenAIProvider
from tests.fakes.growth import assert_linear
from tests.fakes.openai_server import (
    Canned,
    FakeOpenAI,
    chat_completion,
    huge_reply,
    non_json_200,
)

KEY = "sk-test-key"
# The request an error of the client's carries, as much of it as the error reads.
NO_REQUEST: Any = SimpleNamespace(method="POST", url="http://model.test/v1", headers={})
HI: list[Message] = [UserMessage("hi")]


def _provider(fake: FakeOpenAI, **options: Any) -> OpenAIProvider:
    return OpenAIProvider("m", api_key=KEY, base_url=fake.base_url, **options)


# The whole call, retries and their backoff included, is bounded by ``timeout``.


async def test_hanging_server_fails_within_the_timeout_despite_retries() -> None:
    async with FakeOpenAI(hang=True) as fake:
        model = _provider(fake, max_retries=2)
        started = time.monotonic()
        with pytest.raises(ModelError, match=r"timed out after 1s waiting for http://127"):
            await model.complete(HI, [], timeout=1.0)
        elapsed = time.monotonic() - started
        await model.aclose()

    # Per attempt, three attempts and two backoffs took over 3 s; the bound is the whole call.
    assert elapsed < 1.0 + 1.5
    assert fake.count >= 1


async def test_a_timeout_says_which_setting_gives_a_slow_model_longer() -> None:
    # A local model loading (Ollama on its first request) outlasts 60 s: the line told a
    # newcomer that time ran out, not that model.timeout is what to raise.
    async with FakeOpenAI(hang=True) as fake:
        model = _provider(fake, max_retries=0)
        with pytest.raises(ModelError) as caught:
            await model.complete(HI, [], timeout=0.5)
        await model.aclose()

    assert str(caught.value) == (
        f"model call failed: timed out after 0.5s waiting for {fake.base_url}"
        " — a slow model may need a longer model.timeout"
    )


async def test_an_attempt_that_times_out_is_the_call_timing_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each attempt is given all the time left, so its own timeout is the call's: retrying it
    # only slept past the deadline, and the line named the timeout as its own cause.
    attempts: list[float] = []

    async def times_out(self: OpenAIProvider, messages: Any, tools: Any, timeout: float) -> bytes:
        attempts.append(timeout)
        raise openai.APITimeoutError(request=NO_REQUEST)

    monkeypatch.setattr(OpenAIProvider, "_post", times_out)
    model = OpenAIProvider("m", api_key=KEY, base_url="http://model.test/v1", max_retries=2)
    with pytest.raises(ModelError) as caught:
        await model.complete(HI, [], timeout=5.0)
    await model.aclose()

    assert len(attempts) == 1
    assert str(caught.value) == (
        "model call failed: timed out after 5s waiting for http://model.test/v1 (retries"
        " included) — a slow model may need a longer model.timeout"
    )


async def test_retry_backoff_counts_against_the_timeout() -> None:
    slow_retry = {"retry-after-ms": "2000"}  # each retry would wait 2 s
    canned = [Canned(status=503, headers=slow_retry)] * 3
    async with FakeOpenAI([{"text": "late"}], canned=canned) as fake:
        model = _provider(fake, max_retries=2)
        started = time.monotonic()
        # A wait the server asks for past the timeout is not slept into: it is the cause.
        with pytest.raises(ModelError, match=r"503 Service Unavailable .*asks to wait 2s"):
            await model.complete(HI, [], timeout=1.0)
        elapsed = time.monotonic() - started
        await model.aclose()

    assert elapsed < 1.0 + 1.5
    assert fake.count == 1  # no retry: its wait would have outlasted the call


async def test_own_backoff_counts_against_the_timeout_and_names_the_cause() -> None:
    # No Retry-After: the backoff doubles (about 0.5 s, then 1 s) and runs into the timeout.
    canned = [Canned(status=503, headers={})] * 3
    async with FakeOpenAI([{"text": "late"}], canned=canned) as fake:
        model = _provider(fake, max_retries=2)
        started = time.monotonic()
        with pytest.raises(ModelError) as caught:
            await model.complete(HI, [], timeout=1.0)
        elapsed = time.monotonic() - started
        await model.aclose()

    assert str(caught.value) == (
        f"model call failed: timed out after 1s waiting for {fake.base_url} (retries included);"
        f" before that: 503 Service Unavailable from {fake.base_url}: fake server error 503"
    )
    assert elapsed < 1.0 + 1.5
    assert fake.count == 2


async def test_no_time_left_fails_without_a_request() -> None:
    async with FakeOpenAI([{"text": "late"}]) as fake:
        model = _provider(fake)
        with pytest.raises(ModelError, match="no time left"):
            await model.complete(HI, [], timeout=0)
        await model.aclose()

    assert fake.count == 0


@pytest.mark.parametrize("seconds", [30, 300])
async def test_a_wait_asked_past_the_timeout_fails_at_once_naming_it(seconds: int) -> None:
    # Sleeping into the timeout only to say "timed out" hid the rate limit for the whole wait.
    canned = [Canned(status=429, headers={"retry-after": str(seconds)})] * 3
    async with FakeOpenAI([{"text": "late"}], canned=canned) as fake:
        model = _provider(fake, max_retries=2)
        started = time.monotonic()
        with pytest.raises(ModelError) as caught:
            await model.complete(HI, [], timeout=5.0)
        elapsed = time.monotonic() - started
        await model.aclose()

    message = str(caught.value)
    assert "429 Too Many Requests" in message
    assert f"the server asks to wait {seconds}s" in message
    assert "rate limited or out of quota" in message
    assert "timed out" not in message
    assert elapsed < 2.0
    assert fake.count == 1


async def test_each_retry_is_logged_with_its_cause_and_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    canned = [Canned(status=503, headers={"retry-after": "0.01"})]
    async with FakeOpenAI([{"text": "late"}], canned=canned) as fake:
        model = _provider(fake, max_retries=2)
        with caplog.at_level(logging.WARNING, logger="kestrel.llm"):
            turn = await model.complete(HI, [], timeout=5.0)
        await model.aclose()

    assert turn.text == "late"
    said = [r.getMessage() for r in caplog.records if r.name == "kestrel.llm"]
    assert said == [
        f"503 Service Unavailable from {fake.base_url}: fake server error 503;"
        " trying again in 0.01s (retry 1 of 2)"
    ]


# A proxy's error page says it is gzip and is not: the client decodes it outside its own
# error handling, so its transport error came out raw and the run panicked.
BAD_GZIP = {"content-encoding": "gzip"}


async def test_an_undecodable_error_page_is_retried_then_a_model_error() -> None:
    canned = [Canned(status=502, raw="<html>Bad Gateway</html>", headers=BAD_GZIP)] * 3
    async with FakeOpenAI([{"text": "late"}], canned=canned) as fake:
        model = _provider(fake, max_retries=2)
        with pytest.raises(ModelError) as caught:
            await model.complete(HI, [], timeout=5.0)
        await model.aclose()

    message = str(caught.value)
    assert message.startswith(f"model call failed: no usable reply from {fake.base_url}")
    assert "(DecodingError: " in message
    assert message.endswith("(gave up after 2 retries)")
    assert fake.count == 3


async def test_an_undecodable_error_page_then_a_good_reply_is_the_reply() -> None:
    canned = [Canned(status=503, raw="<html>Unavailable</html>", headers=BAD_GZIP)]
    async with FakeOpenAI([{"text": "fine"}], canned=canned) as fake:
        model = _provider(fake, max_retries=2)
        turn = await model.complete(HI, [], timeout=5.0)
        await model.aclose()

    assert turn.text == "fine"
    assert fake.count == 2


# A proxy's error page: its markup is no cause, and a long head left only markup in the line.
CLOUDFLARE_PAGE = (
    "<!DOCTYPE html>\n<!--[if lt IE 7]> <html class='no-js ie6 oldie' lang='en-US'>"
    " <![endif]-->\n<html><head>\n<title>api.example.com | 502: Bad gateway</title>\n"
    "<meta charset='UTF-8' />\n<style>body{margin:0;padding:0}</style>\n</head>"
    "<body><h1>Bad gateway</h1><span>Error code 502</span></body></html>"
)
NGINX_PAGE = (
    "<html>\r\n<body>\r\n<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n"
    "<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)


@pytest.mark.parametrize(
    ("page", "shown"),
    [
        (CLOUDFLARE_PAGE, ": api.example.com | 502: Bad gateway (gave up"),
        (NGINX_PAGE, ": 503 Service Temporarily Unavailable nginx (gave up"),
    ],
)
async def test_an_html_error_page_is_quoted_by_its_text_not_its_markup(
    page: str, shown: str
) -> None:
    canned = [Canned(status=502, raw=page, content_type="text/html", headers={})] * 3
    async with FakeOpenAI([{"text": "late"}], canned=canned) as fake:
        model = _provider(fake, max_retries=2)
        with pytest.raises(ModelError) as caught:
            await model.complete(HI, [], timeout=10.0)
        await model.aclose()

    message = str(caught.value)
    assert shown in message
    assert "<" not in message


@pytest.mark.parametrize(
    "page",
    [("<title>", 9_000), ("<script>", 8_000), ("<style>", 9_000), ("<!--", 16_000), ("<", 65_000)],
    ids=lambda page: repr(page[0]),
)
def test_an_error_page_of_openers_is_read_in_linear_time(page: tuple[str, int]) -> None:
    # Each opener ran its ".*?" to the end of the page, looking for a closer: a broken or
    # hostile proxy's 64 KiB page held the event loop, every run of the process, for seconds
    # on each attempt. Read linearly, eight times the page takes eight times as long.
    opener, count = page
    assert_linear(error_message, opener * (count // 8), opener * count, k=8)


def test_an_error_page_is_read_without_its_scripts_styles_and_comments() -> None:
    page = "<html><script>x()</script><STYLE>p{}</style ><!-- c --><p>Bad &amp; gone</p>"
    assert " ".join(error_message(page).split()) == "Bad & gone"
    assert error_message("<html><TITLE lang=en>Down</title ><p>x</p>") == "Down"


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        (
            {"detail": [{"loc": ["body", "messages", 2, "content"], "msg": "field required"}]},
            ": body.messages.2.content: field required",
        ),
        ({"detail": "Not authenticated"}, ": Not authenticated"),
    ],
)
async def test_a_python_servers_detail_is_the_cause(body: dict[str, Any], shown: str) -> None:
    # FastAPI-based servers (vLLM's and LiteLLM's routes among them) say what they refused in
    # "detail", not "message": the line named the status alone.
    async with FakeOpenAI([{"text": "late"}], canned=[Canned(status=422, body=body)]) as fake:
        model = _provider(fake, max_retries=0)
        with pytest.raises(ModelError) as caught:
            await model.complete(HI, [], timeout=5.0)
        await model.aclose()

    assert (
        str(caught.value)
        == f"model call failed: 422 Unprocessable Entity from {fake.base_url}{shown}"
    )


# A 200 that is not a chat completion is a model error, never an escaping exception.


@pytest.mark.parametrize(
    ("canned", "cause"),
    [
        (non_json_200(), r"expected a chat completion, got '\{\"choices\": \['"),
        (non_json_200(""), "expected a chat completion, got an empty body"),
        (non_json_200("[" * 100_000), "expected a chat completion"),
        (Canned(status=200, body=["not", "an", "object"]), "expected a chat completion"),
        (
            Canned(status=200, body={"error": {"message": "worker crashed"}}),
            "the server answered 200 with an error: worker crashed",
        ),
    ],
)
async def test_a_200_that_is_not_a_completion_is_a_model_error(canned: Canned, cause: str) -> None:
    async with FakeOpenAI([{"text": "unused"}], canned=[canned]) as fake:
        model = _provider(fake)
        with pytest.raises(ModelError, match=f"bad response from {fake.base_url}: {cause}"):
            await model.complete(HI, [], timeout=5)
        await model.aclose()

    assert fake.count == 1  # a bad 200 is not retried


# Call ids are unique in the run, whatever the server sent.


async def _turn_for(canned: Canned, messages: list[Message] = HI) -> AssistantTurn:
    async with FakeOpenAI([{"text": "unused"}], canned=[canned]) as fake:
        model = _provider(fake)
        turn = await model.complete(messages, [], timeout=5)
        await model.aclose()
    return turn


async def test_duplicate_call_ids_are_renamed_and_every_call_kept() -> None:
    body = chat_completion(
        calls=[
            ("call_0", "service_status", '{"service": "checkout"}'),
            ("call_0", "service_status", '{"service": "payments"}'),
            ("call_0", "tail_logs", "{}"),
        ]
    )

    turn = await _turn_for(Canned(status=200, body=body))

    assert [c.id for c in turn.calls] == ["call_0", "call_0_2", "call_0_3"]
    assert [c.arguments for c in turn.calls][:2] == [
        '{"service": "checkout"}',
        '{"service": "payments"}',
    ]


async def test_missing_and_empty_call_ids_get_fresh_ones() -> None:
    body = chat_completion(calls=[(None, "disk_usage", "{}"), ("", "disk_usage", "{}")])

    turn = await _turn_for(Canned(status=200, body=body))

    assert [c.id for c in turn.calls] == ["call_1", "call_2"]


async def test_ids_already_used_in_the_run_are_renamed() -> None:
    # Some servers number calls per reply, so "call_0" comes back every turn; one-shot grants
    # and results are keyed by id across the run, so a reused id must not look like the old one.
    earlier = ToolCall(id="call_0", name="disk_usage")
    messages: list[Message] = [
        UserMessage("disk?"),
        AssistantMessage(AssistantTurn(calls=(earlier,), finish_reason="tool_calls")),
        ToolResultsMessage((ToolResultItem("call_0", "disk_usage", "42%"),)),
    ]
    body = chat_completion(calls=[("call_0", "disk_usage", "{}")])

    turn = await _turn_for(Canned(status=200, body=body), messages)

    assert [c.id for c in turn.calls] == ["call_0_2"]


async def test_unique_ids_are_left_alone() -> None:
    body = chat_completion(calls=[("a", "x", "{}"), ("b", "y", "{}")])

    turn = await _turn_for(Canned(status=200, body=body))

    assert [c.id for c in turn.calls] == ["a", "b"]


MANY = 20_000  # a reply of this many calls fits well under the reply cap (about 80 bytes each)


@pytest.mark.parametrize("same_id", [False, True], ids=["distinct ids", "one id"])
async def test_a_reply_of_very_many_calls_is_read_in_linear_time(same_id: bool) -> None:
    # Each call's id was checked against every earlier call's, and a repeated one renamed by
    # counting up from 2 each time: 20,000 calls held the event loop for a minute (a looping
    # model writes as many before its output limit), and every run of the replica with it.
    calls = [("call_0" if same_id else f"c{i}", "echo", f'{{"n": {i}}}') for i in range(MANY)]
    body = chat_completion(calls=calls)

    turn = await _turn_for(Canned(status=200, body=body))

    assert len({c.id for c in turn.calls}) == MANY
    # Made unique linearly, eight times the calls take eight times as long.
    small, large = _many_calls(MANY // 16, same_id), _many_calls(MANY // 2, same_id)
    assert_linear(lambda many: unique_call_ids(many, []), small, large, k=8)


def _many_calls(count: int, same_id: bool) -> AssistantTurn:
    """A turn of ``count`` calls, each with its own arguments, all of one id or each its own."""
    return AssistantTurn(
        calls=tuple(
            ToolCall(id="call_0" if same_id else f"c{i}", name="echo", arguments=f'{{"n": {i}}}')
            for i in range(count)
        )
    )


async def test_the_warning_of_renamed_ids_names_the_first_few(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # It listed every id sent and kept: one log line of 600 KB for 20,000 calls.
    calls = [("call_0", "echo", f'{{"n": {i}}}') for i in range(MANY)]
    with caplog.at_level(logging.WARNING, logger="kestrel.llm"):
        await _turn_for(Canned(status=200, body=chat_completion(calls=calls)))

    [said] = [r.getMessage() for r in caplog.records if r.name == "kestrel.llm"]
    assert len(said) < 600
    assert "sent missing or repeated tool-call ids ['call_0', 'call_0'," in said
    assert f"…] ({MANY} in all); kept ['call_0', 'call_0_2', 'call_0_3'," in said


async def test_a_call_repeated_with_its_arguments_in_another_order_is_kept_once() -> None:
    body = chat_completion(
        calls=[
            ("call_0", "tail_logs", '{"service": "checkout", "lines": 5}'),
            ("call_0", "tail_logs", '{"lines": 5, "service": "checkout"}'),
            ("call_0", "tail_logs", '{"lines": 6, "service": "checkout"}'),
            ("call_0", "service_status", '{"lines": 5, "service": "checkout"}'),
        ]
    )

    turn = await _turn_for(Canned(status=200, body=body))

    assert [(c.id, c.name) for c in turn.calls] == [
        ("call_0", "tail_logs"),
        ("call_0_2", "tail_logs"),
        ("call_0_3", "service_status"),
    ]


# A reply is capped in bytes before it is parsed.


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_reply_over_the_cap_is_a_model_error(chunked: bool) -> None:
    async with FakeOpenAI([{"text": "unused"}], canned=[huge_reply(1 << 20, chunked=chunked)]) as f:
        model = _provider(f, max_reply_bytes=64 * 1024)
        with pytest.raises(ModelError) as caught:
            await model.complete(HI, [], timeout=5)
        await model.aclose()

    message = str(caught.value)
    assert "larger than 65536 bytes" in message
    assert "model.max_reply_bytes" in message
    assert f.count == 1  # an oversized reply is not asked for again


async def test_a_reply_under_the_cap_is_parsed() -> None:
    async with FakeOpenAI([{"text": "unused"}], canned=[huge_reply(32 * 1024, chunked=True)]) as f:
        model = _provider(f, max_reply_bytes=64 * 1024)
        turn = await model.complete(HI, [], timeout=5)
        await model.aclose()

    assert turn.text == "x" * 32 * 1024


def _cut_reply() -> Canned:
    return Canned(status=200, body=chat_completion(text="x" * 1000), chunked=True, cut_after=100)


async def test_a_body_cut_off_midway_is_asked_for_again() -> None:
    # The connection dropped mid-reply (a proxy's idle timeout, a server restarted), as it
    # may before one: nothing was kept, so the reply is asked for again, not the run failed.
    async with FakeOpenAI([{"text": "whole"}], canned=[_cut_reply()]) as fake:
        model = _provider(fake)
        turn = await model.complete(HI, [], timeout=5)
        await model.aclose()

    assert turn.text == "whole"
    assert fake.count == 2


async def test_a_body_cut_off_every_time_is_a_model_error_naming_the_retries() -> None:
    async with FakeOpenAI([{"text": "unused"}], canned=[_cut_reply(), _cut_reply()]) as fake:
        model = _provider(fake, max_retries=1)
        with pytest.raises(ModelError) as caught:
            await model.complete(HI, [], timeout=5)
        await model.aclose()

    said = str(caught.value)
    assert re.search(r"the reply from .* broke off after \d+ bytes", said), said
    assert "(gave up after 1 retry)" in said
    assert fake.count == 2


def test_the_cap_must_fit_a_completion() -> None:
    with pytest.raises(ValueError, match="max_reply_bytes"):
        OpenAIProvider("m", api_key=KEY, base_url=None, max_reply_bytes=10)
