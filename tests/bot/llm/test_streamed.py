"""Servers that stream a reply nobody asked to be streamed (a gateway set to stream, a server
that only streams), through the real ``openai`` client against the fake server: the chunks
make the completion they stream, and events that make none name why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.domain import AssistantTurn, Reasoning, RunStatus, StopReason
from bot.llm.base import ModelError, ToolSpec, UserMessage
from bot.llm.openai_provider import OpenAIProvider
from bot.llm.streamed import assembled
from bot.run.supervisor import Supervisor
from tests.fakes.growth import assert_linear
from tests.fakes.openai_server import Canned, FakeOpenAI
from tests.fakes.runtime import Counter, counting_tools, make_runtime

ECHO = ToolSpec(name="echo", description="Echo a text.")


def _chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "chatcmpl-s", "object": "chat.completion.chunk", "choices": [choice], **more}


def _stream(*events: object, done: bool = True) -> Canned:
    """A 200 of server-sent events, each a chunk (or text as it is), then ``[DONE]``."""
    lines = [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]
    text = ": keep-alive\n\n" + "".join(lines) + ("data: [DONE]\n\n" if done else "")
    return Canned(status=200, raw=text, content_type="text/event-stream")


async def _complete(canned: Canned) -> AssistantTurn:
    async with FakeOpenAI(canned=[canned]) as fake:
        model = OpenAIProvider("m", api_key="k", base_url=fake.base_url, max_retries=0)
        try:
            return await model.complete([UserMessage("hi")], [ECHO], timeout=5)
        finally:
            await model.aclose()


async def test_a_streamed_answer_is_the_answer() -> None:
    turn = await _complete(
        _stream(
            _chunk({"role": "assistant", "content": ""}),
            _chunk({"reasoning": "They greet "}),
            _chunk({"reasoning": "me."}),
            _chunk({"content": "Hello "}),
            _chunk({"content": "there."}, "stop"),
            {
                "id": "chatcmpl-s",
                "choices": [],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3},
            },
        )
    )

    assert (turn.text, turn.calls, turn.finish_reason) == ("Hello there.", (), "stop")
    assert turn.reasoning == Reasoning(field="reasoning", text="They greet me.")
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (7, 3)


async def test_streamed_content_parts_are_the_answer() -> None:
    # Mistral's API streams a reasoning model's content as parts, thinking among them: the
    # answer was dropped, and the run failed as one that said nothing.
    thinking = {"type": "thinking", "thinking": [{"type": "text", "text": "pods restarted"}]}
    turn = await _complete(
        _stream(
            _chunk({"role": "assistant", "content": [thinking]}),
            _chunk({"content": [{"type": "text", "text": "Checkout is "}]}),
            _chunk({"content": "up."}, "stop"),
        )
    )

    assert (turn.text, turn.finish_reason) == ("Checkout is up.", "stop")


async def test_text_holding_unicode_line_separators_streams_whole() -> None:
    # JSON needs no escape for U+2028, U+2029 or U+0085, and servers that write UTF-8 send
    # them raw: each event was split there, as if at a line end, and was then no JSON.
    said = "Line\u2028separator, paragraph\u2029separator, next\x85line."
    raw = json.dumps(_chunk({"content": said}, "stop"), ensure_ascii=False)
    turn = await _complete(_stream(raw))

    assert turn.text == said


async def test_a_control_character_left_unescaped_streams_whole() -> None:
    # Every other chunk was fine: one tab left raw in a delta failed the whole reply.
    raw = json.dumps(_chunk({"content": "col1\tcol2"}, "stop")).replace("\\t", "\t")
    turn = await _complete(_stream(raw))

    assert turn.text == "col1\tcol2"


async def test_a_streamed_tool_call_runs(tmp_path: Path) -> None:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "echo"}}
    canned = _stream(
        _chunk(
            {
                "role": "assistant",
                "tool_calls": [{**call, "function": {"name": "echo", "arguments": ""}}],
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"text"'}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "a"}'}}]}, "tool_calls"),
    )
    async with FakeOpenAI([{"text": "unused"}, {"text": "done"}], canned=[canned]) as fake:
        model = OpenAIProvider("m", api_key="k", base_url=fake.base_url)
        counter = Counter()
        rt, _ = await make_runtime(tmp_path / "k.db", model, counting_tools(counter))
        try:
            sup = Supervisor(rt)
            state = await sup.wait(await sup.start_turn("echo a", requested_by="U0REQ"))
        finally:
            await rt.store.close()
            await model.aclose()

    assert state.result is not None
    assert (state.result.stop_reason, state.result.text) == (StopReason.ANSWERED, "done")
    assert counter.calls == {"echo": 1}
    (assistant,) = [m for m in fake.requests[1]["messages"] if m["role"] == "assistant"]
    assert assistant["tool_calls"][0]["function"] == {"name": "echo", "arguments": '{"text": "a"}'}


async def test_a_stream_that_stopped_before_the_reply_did_is_asked_for_again() -> None:
    # The server's stream closed cleanly mid-reply (a worker that died behind a proxy): what
    # came is not all the model said, and nothing of it was kept, so it is asked for again.
    cut = _stream(_chunk({"content": "Checkout is"}), done=False)
    async with FakeOpenAI([{"text": "Checkout is down."}], canned=[cut]) as fake:
        model = OpenAIProvider("m", api_key="k", base_url=fake.base_url, max_retries=1)
        try:
            turn = await model.complete([UserMessage("hi")], [ECHO], timeout=5)
        finally:
            await model.aclose()

    assert turn.text == "Checkout is down."
    assert fake.count == 2


@pytest.mark.parametrize(
    ("canned", "said"),
    [
        (
            _stream({"error": {"message": "model overloaded", "type": "server_error"}}),
            "the server answered 200 with an error: model overloaded",
        ),
        (_stream("{not json"), "the server streamed its reply, and an event of it is no JSON"),
        (_stream(), "the server streamed its reply, and it held no chunk"),
        # Older vLLM sends an error mid-stream as a top-level error object, then [DONE].
        (
            _stream(
                _chunk({"content": "Checkout is"}),
                {"object": "error", "message": "CUDA out of memory", "code": 500},
            ),
            "the server answered 200 with an error: CUDA out of memory",
        ),
        # No [DONE] and no finish reason: the connection closed mid-reply; what came is not
        # the answer, and no call of it runs.
        (
            _stream(_chunk({"content": "Checkout is"}), done=False),
            "was streamed, and it ended before the reply did",
        ),
        # Older llama.cpp sends its error as an event field of its own, "error: {…}".
        (
            Canned(
                status=200,
                raw=f"data: {json.dumps(_chunk({'content': 'Checkout'}))}\n\n"
                'error: {"code": 500, "message": "the request exceeds the available context'
                ' size", "type": "exceed_context_size_error"}\n\n',
                content_type="text/event-stream",
            ),
            "the server answered 200 with an error: the request exceeds the available context",
        ),
        (
            Canned(
                status=200,
                raw='error: {"code": 503, "message": "Loading model", "type": "unavailable"}\n\n',
                content_type="text/event-stream",
            ),
            "the server answered 200 with an error: Loading model",
        ),
        (
            _stream(_chunk({"tool_calls": 5}, "tool_calls")),
            "the server streamed its reply, and an event's tool_calls is not a list",
        ),
    ],
)
async def test_a_stream_that_makes_no_completion_names_why(canned: Canned, said: str) -> None:
    with pytest.raises(ModelError) as raised:
        await _complete(canned)

    assert said in str(raised.value)
    assert "Traceback" not in str(raised.value)


async def test_a_streamed_run_fails_naming_its_cut_at_the_output_limit(tmp_path: Path) -> None:
    canned = _stream(
        _chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c", "function": {"name": "echo", "arguments": '{"te'}}
                ]
            },
            "length",
        )
    )
    async with FakeOpenAI([{"text": "unused"}], canned=[canned]) as fake:
        model = OpenAIProvider("m", api_key="k", base_url=fake.base_url)
        counter = Counter()
        rt, _ = await make_runtime(tmp_path / "k.db", model, counting_tools(counter))
        try:
            sup = Supervisor(rt)
            state = await sup.wait(await sup.start_turn("echo a", requested_by="U0REQ"))
        finally:
            await rt.store.close()
            await model.aclose()

    assert state.result is not None
    assert (state.result.status, state.result.stop_reason) == (
        RunStatus.FAILED,
        StopReason.TRUNCATED,
    )
    assert counter.calls == {}


async def test_streamed_calls_without_an_index_are_told_apart_by_their_ids() -> None:
    # Some servers (Gemini's compatible API) send each call whole, with no index.
    first = {"id": "a", "type": "function", "function": {"name": "echo", "arguments": '{"text"'}}
    rest = {"function": {"arguments": ': "a"}'}}
    second = {"id": "b", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
    turn = await _complete(
        _stream(
            _chunk({"tool_calls": [first]}),
            _chunk({"tool_calls": [rest]}),
            _chunk({"tool_calls": [second]}, "tool_calls"),
        )
    )

    assert [(c.id, c.name, c.arguments) for c in turn.calls] == [
        ("a", "echo", '{"text": "a"}'),
        ("b", "echo", "{}"),
    ]


async def test_a_streamed_calls_signature_is_kept() -> None:
    # Gemini 3 may send a call's signature in a delta of its own.
    call = {"id": "a", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
    signed = {"google": {"thought_signature": "c2lnbmVk"}}
    turn = await _complete(
        _stream(
            _chunk({"tool_calls": [call]}),
            _chunk({"tool_calls": [{"extra_content": signed}]}, "stop"),
        )
    )

    assert [(c.id, c.name, json.loads(c.extra_content)) for c in turn.calls] == [
        ("a", "echo", signed)
    ]


def _small_deltas(size: int) -> bytes:
    """A stream of ``size`` bytes, each event one call's next 100 characters of arguments."""
    delta = _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "x" * 100}}]})
    event = f"data: {json.dumps(delta)}\n\n"
    return (event * (size // len(event)) + "data: [DONE]\n\n").encode()


def test_a_stream_of_small_deltas_is_put_together_in_linear_time() -> None:
    # Each argument delta was added to the call's text so far, a copy of it: a 4 MiB stream
    # of short deltas held the event loop (every run of the process) for a second or more,
    # 8 MiB four times that. Read linearly, eight times the stream takes eight times as long.
    small, large = _small_deltas(256 * 1024), _small_deltas(2 * 1024 * 1024)
    assert_linear(assembled, small, large, k=8)

    (call,) = assembled(large)["choices"][0]["message"]["tool_calls"]
    assert len(call["function"]["arguments"]) > 100_000


def _unnumbered_calls(count: int) -> bytes:
    """A stream of ``count`` calls, none with an index, each told apart by its id."""
    events = [
        "data: "
        + json.dumps(_chunk({"tool_calls": [{"id": f"c{n}", "function": {"name": "echo"}}]}))
        + "\n\n"
        for n in range(count)
    ]
    return ("".join(events) + "data: [DONE]\n\n").encode()


def test_many_streamed_calls_without_an_index_are_told_apart_in_linear_time() -> None:
    # Each unnumbered call looked through all the calls before it for the last one: 2 MiB of
    # them (20,000 calls) held the event loop for seconds; read linearly, eight times the calls
    # take eight times as long.
    small, large = _unnumbered_calls(500), _unnumbered_calls(4_000)
    assert_linear(assembled, small, large, k=8)

    assert len(assembled(large)["choices"][0]["message"]["tool_calls"]) == 4_000
