"""The OpenAI provider through the real ``openai`` client against a local fake server."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest

from bot.domain import AssistantTurn, ToolCall
from bot.llm.base import (
    AssistantMessage,
    ModelError,
    SystemMessage,
    ToolResultItem,
    ToolResultsMessage,
    ToolSpec,
    UserMessage,
)
from bot.llm.openai_provider import OpenAIProvider
from tests.fakes.openai_server import (
    Canned,
    FakeOpenAI,
    chat_completion,
    function_call_completion,
)

KEY = "sk-test-very-secret-key"
# A refused connection is answered at once: a call's timeout there only bounds a test gone
# wrong, and must outlast a loaded machine's pause, which would make the refusal a timeout.
REFUSAL_TIMEOUT = 30.0
STATUS_TOOL = ToolSpec(
    name="service_status",
    description="Show a service's status.",
    parameters={
        "type": "object",
        "properties": {"service": {"type": "string"}},
        "required": ["service"],
    },
)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI([{"text": "first"}, {"text": "second"}]) as server:
        yield server


@pytest.fixture
async def provider(fake: FakeOpenAI) -> AsyncIterator[OpenAIProvider]:
    model = OpenAIProvider("gpt-test", api_key=KEY, base_url=fake.base_url, max_retries=2)
    yield model
    await model.aclose()


def _conversation() -> list[SystemMessage | UserMessage | AssistantMessage | ToolResultsMessage]:
    turn = AssistantTurn(
        text="Checking both.",
        calls=(
            ToolCall(id="call_a", name="service_status", arguments='{"service": "checkout"}'),
            ToolCall(id="call_b", name="tail_logs", arguments='{"service": "checkout"}'),
        ),
        finish_reason="tool_calls",
    )
    results = (
        ToolResultItem(call_id="call_a", name="service_status", output="checkout: degraded"),
        ToolResultItem(call_id="call_b", name="tail_logs", output="OOMKilled"),
    )
    return [
        SystemMessage("You are Kestrel."),
        UserMessage("checkout is failing"),
        AssistantMessage(turn),
        ToolResultsMessage(results),
    ]


async def test_request_maps_messages_and_tools(fake: FakeOpenAI, provider: OpenAIProvider) -> None:
    turn = await provider.complete(_conversation(), [STATUS_TOOL], timeout=5)

    body = fake.requests[0]
    assert body["model"] == "gpt-test"
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool", "tool"]
    assistant = body["messages"][2]
    assert assistant["content"] == "Checking both."
    assert assistant["tool_calls"] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "service_status", "arguments": '{"service": "checkout"}'},
        },
        {
            "id": "call_b",
            "type": "function",
            "function": {"name": "tail_logs", "arguments": '{"service": "checkout"}'},
        },
    ]
    assert body["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_a",
        "content": "checkout: degraded",
    }
    assert body["messages"][4]["tool_call_id"] == "call_b"
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "service_status",
                "description": "Show a service's status.",
                "parameters": STATUS_TOOL.parameters,
            },
        }
    ]
    # One assistant message in the request: the fake answered its second reply.
    assert turn.text == "second"


async def test_no_tools_key_when_no_tools(fake: FakeOpenAI, provider: OpenAIProvider) -> None:
    turn = await provider.complete([UserMessage("hi")], [], timeout=5)

    assert "tools" not in fake.requests[0]
    assert fake.requests[0]["messages"] == [{"role": "user", "content": "hi"}]
    assert turn.text == "first"
    assert turn.calls == ()
    assert turn.finish_reason == "stop"


async def test_assistant_with_calls_and_no_text_sends_null_content(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    turn = AssistantTurn(calls=(ToolCall(id="c1", name="disk_usage"),), finish_reason="tool_calls")
    results = ToolResultsMessage((ToolResultItem(call_id="c1", name="disk_usage", output="42%"),))

    await provider.complete([UserMessage("disk?"), AssistantMessage(turn), results], [], timeout=5)

    assistant = fake.requests[0]["messages"][1]
    assert assistant["content"] is None
    assert assistant["tool_calls"][0]["function"] == {"name": "disk_usage", "arguments": "{}"}


async def test_tool_calls_and_usage_are_parsed() -> None:
    reply = {
        "text": "Looking.",
        "calls": [
            {"name": "service_status", "arguments": {"service": "checkout"}},
            {"name": "disk_usage"},
        ],
        "usage": {"input_tokens": 120, "output_tokens": 17},
    }
    async with FakeOpenAI([reply]) as fake:
        model = OpenAIProvider("m", api_key=KEY, base_url=fake.base_url)
        turn = await model.complete([UserMessage("status?")], [STATUS_TOOL], timeout=5)
        await model.aclose()

    assert turn.text == "Looking."
    assert turn.calls == (
        ToolCall(id="call_1", name="service_status", arguments='{"service": "checkout"}'),
        ToolCall(id="call_2", name="disk_usage", arguments="{}"),
    )
    assert turn.finish_reason == "tool_calls"
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (120, 17)


async def test_a_legacy_function_call_is_one_tool_call_with_an_id_from_the_reply() -> None:
    # Older vLLM and LocalAI answer in the shape from before tool_calls; it was read as text.
    legacy = function_call_completion("service_status", '{"service": "checkout"}')
    again = function_call_completion("service_status", '{"service": "checkout"}')
    other = function_call_completion("disk_usage", "{}", response_id="chatcmpl-other")
    canned = [Canned(status=200, body=body) for body in (legacy, again, other)]
    async with FakeOpenAI(canned=canned) as fake:
        model = OpenAIProvider("m", api_key=KEY, base_url=fake.base_url)
        turns = [await model.complete([UserMessage("status?")], [STATUS_TOOL], 5) for _ in canned]
        await model.aclose()

    first, replayed, third = turns
    assert first.text is None
    assert [(c.name, c.arguments) for c in first.calls] == [
        ("service_status", '{"service": "checkout"}')
    ]
    assert first.finish_reason == "tool_calls"
    assert first.calls[0].id.startswith("call_")
    assert replayed == first  # the same reply, the same call id: a replay reads the same
    assert third.calls[0].id not in ("", first.calls[0].id)


async def test_tool_calls_win_over_a_function_call_sent_beside_them() -> None:
    body = chat_completion(calls=[("call_x", "disk_usage", "{}")])
    body["choices"][0]["message"]["function_call"] = {"name": "disk_usage", "arguments": "{}"}
    async with FakeOpenAI(canned=[Canned(status=200, body=body)]) as fake:
        model = OpenAIProvider("m", api_key=KEY, base_url=fake.base_url)
        turn = await model.complete([UserMessage("disk?")], [], timeout=5)
        await model.aclose()

    assert turn.calls == (ToolCall(id="call_x", name="disk_usage", arguments="{}"),)


async def test_invalid_json_arguments_pass_through_untouched() -> None:
    raw = '{"service": "checkout",'
    async with FakeOpenAI([{"calls": [{"name": "service_status", "arguments": raw}]}]) as fake:
        model = OpenAIProvider("m", api_key=KEY, base_url=fake.base_url)
        turn = await model.complete([UserMessage("status?")], [STATUS_TOOL], timeout=5)
        await model.aclose()

    assert turn.calls[0].arguments == raw


async def test_length_finish_reason_passes_through() -> None:
    async with FakeOpenAI([{"text": "The cause is", "finish_reason": "length"}]) as fake:
        model = OpenAIProvider("m", api_key=KEY, base_url=fake.base_url)
        turn = await model.complete([UserMessage("why?")], [], timeout=5)
        await model.aclose()

    assert turn.finish_reason == "length"
    assert turn.text == "The cause is"


async def test_missing_usage_is_zero(fake: FakeOpenAI, provider: OpenAIProvider) -> None:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
    }
    fake.add_canned(Canned(status=200, body=body))

    turn = await provider.complete([UserMessage("hi")], [], timeout=5)

    assert turn.text == "ok"
    assert turn.usage.total == 0


async def test_a_count_past_jsons_exact_integers_is_no_count(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    # Journaled as sent, 10**20 tokens overflowed PostgreSQL's bigint where a run page sums a
    # suspended run's usage: its page and `kestrel runs export` failed ("out of range").
    body = chat_completion(text="ok")
    body["usage"] = {"prompt_tokens": 10**20, "completion_tokens": 2**53 + 1}
    fake.add_canned(Canned(status=200, body=body))

    turn = await provider.complete([UserMessage("hi")], [], timeout=5)

    assert turn.text == "ok"
    assert turn.usage.total == 0


async def test_401_names_the_cause_without_the_key(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    echo = {"error": {"message": f"Incorrect API key provided: {KEY}", "type": "invalid_request"}}
    fake.add_canned(Canned(status=401, body=echo))

    with pytest.raises(ModelError) as caught:
        await provider.complete([UserMessage("hi")], [], timeout=5)

    message = str(caught.value)
    assert message.startswith(f"model call failed: 401 Unauthorized from {fake.base_url}")
    assert "check OPENAI_API_KEY" in message
    assert KEY not in message
    assert "\n" not in message
    assert fake.count == 1  # a 401 is not retried


async def test_a_key_refused_when_none_was_set_says_it_is_not_set(fake: FakeOpenAI) -> None:
    # OPENAI_BASE_URL alone, for a server that does want a key: "check OPENAI_API_KEY" had the
    # newcomer look at a variable they never set (the client sent its placeholder).
    keyless = OpenAIProvider("gpt-test", api_key=None, base_url=fake.base_url)
    for status in (401, 403):
        fake.add_canned(Canned(status=status))
        with pytest.raises(ModelError) as caught:
            await keyless.complete([UserMessage("hi")], [], timeout=5)
        assert str(caught.value).endswith(
            " — OPENAI_API_KEY is not set, and this server wants one: set it"
        ), caught.value
    await keyless.aclose()


async def test_404_hints_at_model_and_base_url(fake: FakeOpenAI, provider: OpenAIProvider) -> None:
    fake.add_canned(Canned(status=404))

    with pytest.raises(ModelError, match=r"404 Not Found .*check the model name"):
        await provider.complete([UserMessage("hi")], [], timeout=5)


async def test_404_names_the_setting_and_the_model_asked_for(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    # Ollama's 404 says only "model not found, try pulling it first": a newcomer with the
    # minimal config's model name needs to know which setting names the model.
    missing = {"error": {"message": 'model "gpt-test" not found, try pulling it first'}}
    fake.add_canned(Canned(status=404, body=missing))

    with pytest.raises(ModelError) as caught:
        await provider.complete([UserMessage("hi")], [], timeout=5)

    assert str(caught.value).endswith(
        "— check the model name (model.name: gpt-test) and OPENAI_BASE_URL"
    )


async def test_404_from_a_base_url_without_a_path_suggests_v1(fake: FakeOpenAI) -> None:
    # OPENAI_BASE_URL=http://127.0.0.1:11434 (Ollama's own port, no /v1): every server answers
    # 404 for /chat/completions, and the line blamed the model name first.
    bare = fake.base_url.removesuffix("/v1")
    model = OpenAIProvider("gpt-test", api_key=KEY, base_url=bare, max_retries=0)
    with pytest.raises(ModelError) as caught:
        await model.complete([UserMessage("hi")], [], timeout=5)
    await model.aclose()

    assert str(caught.value).endswith(
        f"— OPENAI_BASE_URL has no path: OpenAI-compatible servers answer under /v1 ({bare}/v1)"
    )


async def test_500_is_retried_then_fails(fake: FakeOpenAI, provider: OpenAIProvider) -> None:
    fake.add_canned(*[Canned(status=500)] * 3)

    with pytest.raises(ModelError, match=r"500 Internal Server Error .*after 2 retries"):
        await provider.complete([UserMessage("hi")], [], timeout=5)

    assert fake.count == 3


async def test_429_then_success_is_retried_transparently(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake.add_canned(Canned(status=429))

    turn = await provider.complete([UserMessage("hi")], [], timeout=5)

    assert turn.text == "first"
    assert fake.count == 2


async def test_timeout_becomes_model_error() -> None:
    async with FakeOpenAI([{"text": "late"}], delay=1.0) as fake:
        model = OpenAIProvider("m", api_key=KEY, base_url=fake.base_url, max_retries=0)
        with pytest.raises(ModelError, match=r"timed out after 0.2s waiting for http://127"):
            await model.complete([UserMessage("hi")], [], timeout=0.2)
        await model.aclose()


async def test_connection_refused_becomes_model_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    model = OpenAIProvider("m", api_key=KEY, base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)

    with pytest.raises(ModelError, match=rf"cannot connect to http://127.0.0.1:{port}/v1") as e:
        await model.complete([UserMessage("hi")], [], timeout=REFUSAL_TIMEOUT)
    await model.aclose()

    # What to do: the usual cause is a local server not started, or a mistyped address.
    assert str(e.value).endswith(" — is the server running there? check OPENAI_BASE_URL")


async def test_openai_unreachable_says_to_check_the_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No OPENAI_BASE_URL to blame: here a proxy nobody listens on stands for a host cut off.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    model = OpenAIProvider("m", api_key=KEY, base_url=None, max_retries=0)

    with pytest.raises(ModelError, match=r"cannot connect to https://api\.openai\.com/v1") as e:
        await model.complete([UserMessage("hi")], [], timeout=REFUSAL_TIMEOUT)
    await model.aclose()

    assert str(e.value).endswith(" — check this host's network, or its proxy (HTTPS_PROXY)")


@pytest.mark.parametrize(
    ("canned", "cause"),
    [
        (Canned(status=200, raw="<html>proxy login</html>"), "expected a chat completion"),
        (Canned(status=200, body={"object": "chat.completion", "choices": []}), "no choices"),
        (Canned(status=200, body={"choices": [{"index": 0}]}), "no message"),
    ],
)
async def test_bad_response_shape_becomes_model_error(
    fake: FakeOpenAI, provider: OpenAIProvider, canned: Canned, cause: str
) -> None:
    fake.add_canned(canned)

    with pytest.raises(ModelError, match=f"bad response from .*{cause}"):
        await provider.complete([UserMessage("hi")], [], timeout=5)


NOT_THE_API = (
    " — OPENAI_BASE_URL answers, but not as an OpenAI-compatible API: point it at the"
    " server's API (most answer under /v1)"
)


@pytest.mark.parametrize(
    "canned",
    [
        Canned(status=200, raw="<!doctype html><title>Welcome to nginx!</title>"),
        Canned(status=200, raw="[1, 2]"),
        Canned(status=200, body={"status": "ok"}),
    ],
    ids=["html", "not an object", "no choices"],
)
async def test_a_reply_that_is_no_chat_api_says_to_check_the_base_url(
    fake: FakeOpenAI, provider: OpenAIProvider, canned: Canned
) -> None:
    # A web server or another service at the address answers 200 with a page of its own.
    fake.add_canned(canned)

    with pytest.raises(ModelError) as caught:
        await provider.complete([UserMessage("hi")], [], timeout=5)

    assert str(caught.value).endswith(NOT_THE_API)


@pytest.mark.parametrize(
    ("raw", "said"),
    [("null", "JSON null"), ('"ok"', "a JSON string"), ("[1, 2]", "a JSON array")],
)
async def test_a_reply_that_is_no_object_is_named_in_jsons_words(
    fake: FakeOpenAI, provider: OpenAIProvider, raw: str, said: str
) -> None:
    # It was named by Python's type: "got NoneType", "got str".
    fake.add_canned(Canned(status=200, raw=raw, content_type="application/json"))

    with pytest.raises(ModelError) as caught:
        await provider.complete([UserMessage("hi")], [], timeout=5)

    assert f"expected a chat completion, got {said} — " in str(caught.value)


@pytest.mark.parametrize("status", [405, 501])
async def test_a_server_that_takes_no_post_says_to_check_the_base_url(
    fake: FakeOpenAI, provider: OpenAIProvider, status: int
) -> None:
    # A static web server (python -m http.server: 501) or a proxy's page (405) takes no POST
    # at all: it is no chat API, whatever model is named.
    # Three times: the client tries a 5xx again, twice here.
    page = Canned(status=status, raw="<html><title>Error response</title></html>")
    fake.add_canned(page, page, page)

    with pytest.raises(ModelError) as caught:
        await provider.complete([UserMessage("hi")], [], timeout=5)

    assert str(caught.value).endswith(NOT_THE_API)


async def test_a_completion_with_a_broken_message_is_the_model_servers_not_the_url(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake.add_canned(Canned(status=200, body={"choices": [{"index": 0}]}))

    with pytest.raises(ModelError) as caught:
        await provider.complete([UserMessage("hi")], [], timeout=5)

    assert str(caught.value).endswith("the first choice has no message")


async def test_a_completion_with_no_choices_is_the_model_servers_not_the_url(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    # A chat completion whose choices came back empty (a gateway that dropped a filtered
    # one): the server is the API, and pointing OPENAI_BASE_URL elsewhere mends nothing.
    fake.add_canned(Canned(status=200, body={"object": "chat.completion", "choices": []}))

    with pytest.raises(ModelError) as caught:
        await provider.complete([UserMessage("hi")], [], timeout=5)

    assert str(caught.value).endswith("the completion has no choices")


async def test_a_redirected_request_says_where_it_went(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    # A proxy moves http:// to https:// (here: another path): the client follows, the POST
    # arrives as a GET, and the run failed blaming the model's name or the address's API.
    moved = f"http://127.0.0.1:{fake.port}/v2/chat/completions"
    fake.add_canned(Canned(status=301, raw="", headers={"Location": moved}))

    with pytest.raises(ModelError) as caught:
        await provider.complete([UserMessage("hi")], [], timeout=5)

    assert str(caught.value).endswith(
        f" — the server redirected the request to {moved}: set OPENAI_BASE_URL to"
        f" http://127.0.0.1:{fake.port}/v2"
    )


def test_missing_key_fails_at_construction() -> None:
    with pytest.raises(ModelError, match="OPENAI_API_KEY is not set"):
        OpenAIProvider("gpt-test", api_key=None, base_url=None)


async def test_base_url_alone_uses_a_placeholder_key(fake: FakeOpenAI) -> None:
    model = OpenAIProvider("llama3", api_key=None, base_url=fake.base_url)

    turn = await model.complete([UserMessage("hi")], [], timeout=5)
    await model.aclose()

    assert turn.text == "first"
    assert (model.provider, model.model) == ("openai", "llama3")


@pytest.mark.parametrize("environment", ["", "   "])
def test_no_base_url_is_openai_whatever_the_environment_says(
    monkeypatch: pytest.MonkeyPatch, environment: str
) -> None:
    # The settings have read OPENAI_BASE_URL already (an empty one is unset); the client read
    # the environment again and took "" for the URL: every request of a Compose deployment
    # with `OPENAI_BASE_URL: ${OPENAI_BASE_URL}` failed with "cannot connect to  (…)".
    monkeypatch.setenv("OPENAI_BASE_URL", environment)
    model = OpenAIProvider("m", api_key=KEY, base_url=None)

    assert model.base_url == "https://api.openai.com/v1"


PROXY_PASSWORD = "pr0xy-S3cret"


async def test_a_password_in_the_base_url_is_used_but_never_said(fake: FakeOpenAI) -> None:
    # A proxy in front of the model that wants HTTP basic auth: httpx sends the URL's user and
    # password, and every message naming where the call went shows the URL without them.
    guarded = fake.base_url.replace("http://", f"http://kestrel:{PROXY_PASSWORD}@")
    model = OpenAIProvider("m", api_key=KEY, base_url=guarded, max_retries=0)
    assert (await model.complete([UserMessage("hi")], [], timeout=5)).text == "first"
    assert fake.headers[-1]["authorization"].startswith("Basic ")
    assert PROXY_PASSWORD not in model.base_url
    fake.add_canned(Canned(status=404), Canned(status=200, raw="<html>login</html>"))
    for _ in range(2):
        with pytest.raises(ModelError) as caught:
            await model.complete([UserMessage("hi")], [], timeout=5)
        assert PROXY_PASSWORD not in str(caught.value)
        assert "kestrel:***@127.0.0.1" in str(caught.value)
    await model.aclose()


async def test_a_password_in_the_base_url_is_not_said_when_it_cannot_connect() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    guarded = f"http://kestrel:{PROXY_PASSWORD}@127.0.0.1:{port}/v1"
    model = OpenAIProvider("m", api_key=KEY, base_url=guarded, max_retries=0)
    with pytest.raises(ModelError) as caught:
        await model.complete([UserMessage("hi")], [], timeout=REFUSAL_TIMEOUT)
    await model.aclose()
    assert PROXY_PASSWORD not in str(caught.value)
    assert f"cannot connect to http://kestrel:***@127.0.0.1:{port}/v1" in str(caught.value)


async def test_a_key_the_client_will_not_send_is_not_said_in_the_error(
    fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    # A key with a line break (a Secret made --from-file, read into a variable) is refused by
    # the HTTP client itself, whose error quotes the header, the key escaped as repr escapes it.
    model = OpenAIProvider("m", api_key=KEY + "\n", base_url=fake.base_url, max_retries=1)
    with pytest.raises(ModelError) as caught:
        await model.complete([UserMessage("hi")], [], timeout=REFUSAL_TIMEOUT)
    await model.aclose()
    assert KEY not in str(caught.value)
    assert "Bearer ***" in str(caught.value)
    assert "retry 1 of 1" in caplog.text  # the retry's warning says it too, scrubbed
    assert KEY not in caplog.text
