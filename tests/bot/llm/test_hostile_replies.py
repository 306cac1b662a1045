"""Whole runs against replies a hostile or broken model server sends: each ends with its
cause named, its journal readable, and no panic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from bot.domain import Reasoning, RunStatus, StopReason, ToolOutcome
from bot.journal.fold import RunState
from bot.llm.base import AssistantMessage, ModelError, UserMessage
from bot.llm.http_client import ERROR_BODY_BYTES
from bot.llm.openai_provider import OpenAIProvider
from bot.run.supervisor import Supervisor
from tests.fakes.openai_server import Canned, FakeOpenAI, chat_completion
from tests.fakes.runtime import Counter, Recorder, counting_tools, make_runtime

DEEP = 5000  # past the interpreter's recursion limit, where json.loads gives up
KEY = "sk-hostile-secret-0123456789"


async def _run(tmp_path: Path, *bodies: Any) -> tuple[RunState, Counter, Recorder]:
    return await _run_canned(tmp_path, [Canned(status=200, body=body) for body in bodies])


async def _run_canned(tmp_path: Path, canned: list[Canned]) -> tuple[RunState, Counter, Recorder]:
    """A run against the fake server answering ``canned``, then its journal read back."""
    async with FakeOpenAI([{"text": "unused"}, {"text": "done"}], canned=canned) as fake:
        model = OpenAIProvider("m", api_key=KEY, base_url=fake.base_url, max_retries=0)
        counter = Counter()
        rt, rec = await make_runtime(tmp_path / "k.db", model, counting_tools(counter))
        try:
            sup = Supervisor(rt)
            state = await sup.wait(await sup.start_turn("help", requested_by="U0REQ"))
            # The journal reads back whole: what `kestrel runs show` needs.
            await rt.store.load(state.run_id)
        finally:
            await rt.store.close()
            await model.aclose()
    return state, counter, rec


def _ended(state: RunState) -> tuple[RunStatus, StopReason]:
    assert state.result is not None, "the run did not end"
    return state.result.status, state.result.stop_reason


async def test_arguments_nested_past_the_decoder_are_invalid_not_a_panic(tmp_path: Path) -> None:
    deep = "[" * DEEP + "]" * DEEP
    state, counter, rec = await _run(tmp_path, chat_completion(calls=[("c1", "echo", deep)]))

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert state.outcomes() == {ToolOutcome.INVALID_ARGUMENTS: 1}
    assert counter.calls == {}
    assert "panic" not in rec.kinds()


async def test_one_call_sent_twice_nested_past_the_decoder_is_not_a_panic(
    tmp_path: Path,
) -> None:
    deep = "[" * DEEP + "]" * DEEP
    calls = [("c1", "echo", deep), ("c1", "echo", deep + " ")]
    state, counter, rec = await _run(tmp_path, chat_completion(calls=calls))

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert counter.calls == {}
    assert "panic" not in rec.kinds()


async def test_an_answer_nested_past_the_decoder_is_text_not_a_panic(tmp_path: Path) -> None:
    deep = '{"a":' * DEEP + "1" + "}" * DEEP
    state, _, rec = await _run(tmp_path, chat_completion(deep))

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert state.result is not None and state.result.payload is None
    assert state.result.text == deep
    assert "panic" not in rec.kinds()


def _raw_completion(content_json: str) -> Canned:
    """A 200 whose message content is the JSON text given, escapes and all."""
    return Canned(
        status=200,
        raw='{"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",'
        f' "content": {content_json}}}}}]}}',
        content_type="application/json",
    )


async def test_a_lone_surrogate_in_the_answer_is_replaced_not_a_stuck_run(tmp_path: Path) -> None:
    state, _, _ = await _run_canned(tmp_path, [_raw_completion('"bad \\ud800 text"')])

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert state.result is not None and state.result.text == "bad \ufffd text"


async def test_a_lone_surrogate_in_arguments_reaches_no_tool_and_no_journal(
    tmp_path: Path,
) -> None:
    calls = [("c1", "echo", '{"text": "a\\ud800b"}')]
    state, counter, rec = await _run(tmp_path, chat_completion(calls=calls))

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert state.outcomes() == {ToolOutcome.INVALID_ARGUMENTS: 1}
    assert counter.calls == {}
    assert "panic" not in rec.kinds()


async def _model_error(*canned: Canned) -> str:
    async with FakeOpenAI(canned=canned) as fake:
        model = OpenAIProvider("m", api_key=KEY, base_url=fake.base_url, max_retries=0)
        try:
            await model.complete([UserMessage("hi")], [], timeout=10)
        except ModelError as exc:
            return str(exc)
        finally:
            await model.aclose()
    raise AssertionError("the call did not fail")


async def test_a_200_error_body_echoing_the_key_does_not_show_it() -> None:
    echo = {"error": {"message": f"Incorrect API key provided: {KEY}."}}
    line = await _model_error(Canned(status=200, body=echo))

    assert KEY not in line
    assert "Incorrect API key provided: ***" in line


async def test_an_html_page_echoing_the_key_does_not_show_it() -> None:
    page = f"<html>proxy refused key {KEY}</html>"
    line = await _model_error(Canned(status=200, raw=page, content_type="text/html"))

    assert KEY not in line
    assert "expected a chat completion" in line


async def test_a_200_web_page_is_named_by_what_it_says() -> None:
    # A sign-in proxy or captive portal answers 200 with its page: the line quoted the first
    # 80 characters of its markup, which name no cause.
    page = (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<link rel='stylesheet' href='/static/sso.css'>\n"
        "<title>Sign in - Example Corp SSO</title></head><body><form></form></body></html>"
    )
    line = await _model_error(Canned(status=200, raw=page, content_type="text/html"))

    assert "expected a chat completion, got a web page: 'Sign in - Example Corp SSO'" in line
    assert "<" not in line


async def test_an_error_message_cut_mid_key_shows_none_of_it() -> None:
    # The detail is cut at 200 characters: the key straddles the cut.
    echo = {"error": {"message": "x" * 185 + f" key {KEY}"}}
    line = await _model_error(Canned(status=401, body=echo))

    assert KEY[:8] not in line


def _with_message(body: dict[str, Any], finish: str, **message: Any) -> dict[str, Any]:
    body["choices"][0]["message"].update(message)
    body["choices"][0]["finish_reason"] = finish
    return body


async def test_a_refusal_is_the_answer_not_an_empty_one(tmp_path: Path) -> None:
    refused = _with_message(chat_completion(), "stop", refusal="I can't help with that.")
    state, _, _ = await _run(tmp_path, refused)

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert state.result is not None and state.result.text == "I can't help with that."


async def test_an_empty_reply_fails_the_run_saying_so(tmp_path: Path) -> None:
    # No text, no tool call: not an answer to complete the run with (adapters showed "(no
    # text)"). The reply is journaled, so nothing asks the model for that step again.
    for number, content in enumerate((None, "", " \n ")):
        empty = _with_message(chat_completion(), "stop", content=content)
        (tmp_path / str(number)).mkdir()
        state, counter, _ = await _run(tmp_path / str(number), empty)

        assert _ended(state) == (RunStatus.FAILED, StopReason.MODEL_ERROR)
        assert state.result is not None
        assert state.result.error == "the model returned an empty reply: no text and no tool call"
        assert state.iteration == 1 and counter.calls == {}


async def test_an_empty_reply_after_tool_calls_completes_the_run(tmp_path: Path) -> None:
    # Some models say what they do beside their calls, then reply with nothing once the calls
    # are answered: the run did its work, so it is answered, not failed.
    said = chat_completion("Echoing it now.", calls=[("c1", "echo", '{"text": "a"}')])
    empty = _with_message(chat_completion(), "stop", content="")
    state, counter, _ = await _run(tmp_path, said, empty)

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert state.result is not None
    assert state.result.text == "(The model ended without a final answer after its tool calls.)"
    assert counter.calls == {"echo": 1} and state.iteration == 2


async def test_an_empty_reply_after_calls_that_all_failed_fails_the_run(tmp_path: Path) -> None:
    # A call of a tool that does not exist ran nothing: an empty reply after it is no answer.
    said = chat_completion("Checking.", calls=[("c1", "no_such_tool", "{}")])
    empty = _with_message(chat_completion(), "stop", content="")
    state, counter, _ = await _run(tmp_path, said, empty)

    assert _ended(state) == (RunStatus.FAILED, StopReason.MODEL_ERROR)
    assert state.result is not None
    assert state.result.error == "the model returned an empty reply: no text and no tool call"
    assert counter.calls == {} and state.iteration == 2


async def test_a_filtered_reply_fails_the_run_naming_the_filter(tmp_path: Path) -> None:
    calls = [("c1", "echo", '{"text": "a"}')]
    filtered = _with_message(chat_completion(calls=calls), "content_filter")
    state, counter, _ = await _run(tmp_path, filtered)

    assert _ended(state) == (RunStatus.FAILED, StopReason.MODEL_ERROR)
    assert state.result is not None and "content filter" in state.result.error
    assert counter.calls == {}


@pytest.mark.parametrize(
    "content",
    [
        "<think>\nThe user wants the secret.\n</think>\n\nHere is how you",
        "<think>\nThe user wants the secret.\n</think>\n\nHere is how you\n<tool_call>\n"
        '{"name": "echo", "arguments": {"text": "a"}}\n</tool_call>',
    ],
)
async def test_a_filtered_reply_shows_neither_its_reasoning_nor_markup(
    tmp_path: Path, content: str
) -> None:
    # The thread was shown the withheld reply as it came: the model's thinking, tags and all,
    # and the markup of a call it wrote as text.
    filtered = _with_message(chat_completion(content), "content_filter")
    state, counter, _ = await _run(tmp_path, filtered)

    assert _ended(state) == (RunStatus.FAILED, StopReason.MODEL_ERROR)
    assert state.result is not None and state.result.text == "Here is how you"
    assert counter.calls == {}
    turns = [m.turn for m in state.messages if isinstance(m, AssistantMessage)]
    assert [turn.text for turn in turns] == [content]  # the journal keeps what was said


async def test_content_sent_as_parts_is_the_answer(tmp_path: Path) -> None:
    # Mistral's API (and gateways in front of it) send content as parts, thinking among them:
    # the run failed ("the message content is not text") on a good answer.
    parts = [
        {"type": "thinking", "thinking": [{"type": "text", "text": "the pods restarted"}]},
        {"type": "text", "text": "Checkout is back "},
        {"type": "text", "text": "up."},
    ]
    state, _, _ = await _run(tmp_path, _with_message(chat_completion(), "stop", content=parts))

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert state.result is not None and state.result.text == "Checkout is back up."


async def test_content_parts_that_are_not_text_fail_naming_the_cause() -> None:
    body = _with_message(chat_completion(), "stop", content=[{"type": "text", "text": 7}])
    line = await _model_error(Canned(status=200, body=body))

    assert "the message content is not text" in line


async def test_a_function_call_that_is_not_an_object_fails_naming_the_cause() -> None:
    body = _with_message(chat_completion(), "function_call", function_call="echo")
    line = await _model_error(Canned(status=200, body=body))

    assert "the message's function_call is not an object" in line


async def test_a_function_call_cut_at_the_output_limit_runs_no_tool(tmp_path: Path) -> None:
    cut = {"name": "echo", "arguments": '{"text": "a'}
    state, counter, _ = await _run(
        tmp_path, _with_message(chat_completion(), "length", function_call=cut)
    )

    assert _ended(state) == (RunStatus.FAILED, StopReason.TRUNCATED)
    assert counter.calls == {}


async def test_a_function_call_in_a_reply_without_an_id_is_given_one(tmp_path: Path) -> None:
    legacy = {"name": "echo", "arguments": '{"text": "a"}'}
    body = _with_message(chat_completion(), "function_call", function_call=legacy)
    del body["id"]
    state, counter, _ = await _run(tmp_path, body)

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert counter.calls == {"echo": 1}
    turns = [m.turn for m in state.messages if isinstance(m, AssistantMessage)]
    assert [call.id for turn in turns for call in turn.calls] == ["call_1"]


async def test_a_call_written_as_text_with_bad_arguments_is_refused_not_a_panic(
    tmp_path: Path,
) -> None:
    # Read from the reply's text, the call meets the checks any call does.
    said = [
        '{"name": "echo", "arguments": "not json"}',
        '{"name": "echo", "arguments": {"text": "a\\ud800b"}}',
        '{"name": "echo", "arguments": ' + '{"a":' * 100 + "1" + "}" * 100 + "}",
    ]
    state, counter, rec = await _run(
        tmp_path, *(chat_completion(text) for text in said), chat_completion("done")
    )

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert state.outcomes() == {ToolOutcome.INVALID_ARGUMENTS: 3}
    assert counter.calls == {}
    assert "panic" not in rec.kinds()


async def test_text_calls_past_the_decoder_or_the_batch_end_the_run_plainly(
    tmp_path: Path,
) -> None:
    deep = '{"name": "echo", "arguments": ' + '{"a":' * DEEP + "1" + "}" * DEEP + "}"
    state, counter, rec = await _run(tmp_path, chat_completion(deep))
    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert state.result is not None and state.result.text == deep

    many = '<tool_call>{"name": "echo", "arguments": {"text": "a"}}</tool_call>' * 1000
    (tmp_path / "many").mkdir()
    state, counter, rec = await _run(tmp_path / "many", chat_completion(many))
    assert _ended(state) == (RunStatus.FAILED, StopReason.TOOL_CALL_LIMIT)
    assert counter.calls == {}
    assert "panic" not in rec.kinds()


async def test_an_error_reply_of_any_size_is_read_only_so_far() -> None:
    # The client read a failed request's whole body to quote it: a 500 whose body did not end
    # (a proxy's runaway page) filled the memory, 1.2 GB for 300 MB, before the timeout.
    pad = 48 * 1024 * 1024
    error = '{"error": {"message": "boom"}}'
    huge = Canned(status=500, raw=error, content_type="application/json", chunked=True, pad=pad)
    async with FakeOpenAI(canned=[huge]) as fake:
        model = OpenAIProvider("m", api_key=KEY, base_url=fake.base_url, max_retries=0)
        try:
            with pytest.raises(ModelError) as failed:
                await model.complete([UserMessage("hi")], [], timeout=30)
        finally:
            await model.aclose()

    assert str(failed.value).startswith("model call failed: 500 Internal Server Error from")
    assert str(failed.value).endswith(": boom")
    assert fake.sent[0] < pad // 4  # what the sockets' buffers held when the client stopped


async def test_a_compressed_error_reply_is_read_only_so_far_once_inflated() -> None:
    # The cap counted the bytes as sent: a proxy's gzip shrinks a runaway page of blanks a
    # thousandfold, so 64 KiB of it was 64 MB once inflated (here all 48 MB were read).
    pad = 48 * 1024 * 1024
    error = '{"error": {"message": "boom"}}'
    huge = Canned(
        status=500, raw=error, content_type="application/json", chunked=True, pad=pad, gzip=True
    )
    async with FakeOpenAI([{"text": "fine"}], canned=[huge]) as fake:
        model = OpenAIProvider("m", api_key=KEY, base_url=fake.base_url, max_retries=0)
        try:
            with pytest.raises(ModelError) as failed:
                await model.complete([UserMessage("hi")], [], timeout=30)
            after = await model.complete([UserMessage("hi")], [], timeout=30)
        finally:
            await model.aclose()

    assert str(failed.value).endswith(": boom")
    cause = failed.value.__cause__
    assert isinstance(cause, openai.APIStatusError)
    assert len(cause.response.content) == ERROR_BODY_BYTES
    assert after.text == "fine"  # the connection the cut body was on is not used again


async def test_a_small_compressed_error_reply_is_read_whole() -> None:
    error = json.dumps({"error": {"message": "no such model: " + "m" * 100}})
    small = Canned(status=404, raw=error, content_type="application/json", chunked=True, gzip=True)
    async with FakeOpenAI(canned=[small]) as fake:
        model = OpenAIProvider("m", api_key=KEY, base_url=fake.base_url, max_retries=0)
        try:
            with pytest.raises(ModelError) as failed:
                await model.complete([UserMessage("hi")], [], timeout=30)
        finally:
            await model.aclose()

    assert "404 Not Found" in str(failed.value)
    assert "no such model: mmm" in str(failed.value)


@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip"])
async def test_a_reply_past_the_error_cap_is_read_whole(gzip: bool) -> None:
    # Only an error's body is cut at 64 KiB: a long answer is the model's, every byte of it.
    text = "x" * (1 << 20)
    body = json.dumps(chat_completion(text))
    long = Canned(status=200, raw=body, content_type="application/json", chunked=True, gzip=gzip)
    async with FakeOpenAI(canned=[long]) as fake:
        model = OpenAIProvider("m", api_key=KEY, base_url=fake.base_url, max_retries=0)
        try:
            turn = await model.complete([UserMessage("hi")], [], timeout=30)
        finally:
            await model.aclose()

    assert turn.text == text


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('Let me check.\n<tool_call>\n{"name": "echo", "arguments": {"te', "Let me check."),
        ('<tool_call>\n{"name": "echo", "arguments": {"text": "a"}}\n</tool_call>\n<tool_', ""),
        ('[TOOL_CALLS] [{"name": "echo", "arguments": {"te', ""),
        ('[TOOL_CALLS]echo[ARGS]{"te', ""),
        ('echo{"te', ""),
        # gpt-oss's harmony messages, its reasoning never shown; DeepSeek's markers.
        (
            "<|channel|>analysis<|message|>Echo it.<|end|><|start|>assistant<|channel|>"
            'commentary to=functions.echo <|constrain|>json<|message|>{"te',
            "",
        ),
        (
            "<|channel|>analysis<|message|>Echo it.<|end|><|start|>assistant<|channel|>"
            "commentary to=functions.echo <|const",
            "",
        ),
        (
            "Echoing.<\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin"
            '\uff5c>echo<\uff5ctool\u2581sep\uff5c>{"te',
            "Echoing.",
        ),
        # A bare call's JSON, or Llama's pythonic list, naming one of the run's tools.
        ('{"name": "echo", "arguments": {"te', ""),
        ('[{"name": "echo", "arguments": {}}, {"name": "echo", "argu', ""),
        ('<think>\nEcho it.\n</think>\n[echo(text="a"), echo(te', ""),
        # Its reasoning, and nothing said before the call, shows nothing.
        ('<think>\nEcho it.\n</think>\n<tool_call>\n{"name": "echo", "arguments": {"te', ""),
        (
            '<think>\nEcho it.\n</think>\n<tool_call>\n{"name": "echo", "arguments": {}}\n'
            "</tool_call>\n<tool_",
            "",
        ),
    ],
)
async def test_a_call_written_as_text_cut_at_the_output_limit_names_the_cut(
    tmp_path: Path, content: str, words: str
) -> None:
    # The run's answer was the cut markup, shown to the thread as if the model had said it.
    state, counter, _ = await _run(tmp_path, _with_message(chat_completion(content), "length"))

    assert _ended(state) == (RunStatus.FAILED, StopReason.TRUNCATED)
    assert state.result is not None
    assert state.result.error == (
        "the model's reply was cut at its output limit while it wrote a tool call; no tool was run"
    )
    assert state.result.text == words
    assert counter.calls == {}
    turns = [m.turn for m in state.messages if isinstance(m, AssistantMessage)]
    assert [turn.text for turn in turns] == [content]  # the journal keeps what was said


@pytest.mark.parametrize(
    "content", ['{"name": "checkout", "status": "degr', '[checkout(region="eu"), x', "[Docs](ht"]
)
async def test_an_answer_cut_at_the_output_limit_that_begins_no_call_shows_what_it_said(
    tmp_path: Path, content: str
) -> None:
    # Data that names no tool, or a link, is an answer cut short, not a call.
    state, _, _ = await _run(tmp_path, _with_message(chat_completion(content), "length"))

    assert state.result is not None
    assert state.result.error == "the model's reply was cut at its output limit; no tool was run"
    assert state.result.text == content


async def test_a_gpt_oss_final_message_cut_at_the_output_limit_is_an_answer_cut(
    tmp_path: Path,
) -> None:
    # Its final message is its answer, which calls nothing, whatever it opens with.
    answer = '{"name": "echo", "arguments": {"te'
    content = (
        "<|channel|>analysis<|message|>Show it.<|end|><|start|>assistant<|channel|>final"
        "<|message|>" + answer
    )
    state, _, _ = await _run(tmp_path, _with_message(chat_completion(content), "length"))

    assert state.result is not None
    assert state.result.error == "the model's reply was cut at its output limit; no tool was run"
    assert state.result.text == answer


async def test_a_structured_call_cut_at_the_output_limit_names_the_cut(tmp_path: Path) -> None:
    cut = chat_completion("Checking.", calls=[("c1", "echo", '{"text": "a')])
    state, counter, _ = await _run(tmp_path, _with_message(cut, "length"))

    assert _ended(state) == (RunStatus.FAILED, StopReason.TRUNCATED)
    assert state.result is not None
    assert "cut at its output limit while it wrote a tool call" in state.result.error
    assert state.result.text == "Checking."
    assert counter.calls == {}


async def test_an_answer_cut_at_the_output_limit_keeps_its_words(tmp_path: Path) -> None:
    cut = _with_message(chat_completion("Checkout restarted at 09:41 because"), "length")
    state, _, _ = await _run(tmp_path, cut)

    assert _ended(state) == (RunStatus.FAILED, StopReason.TRUNCATED)
    assert state.result is not None
    assert state.result.error == "the model's reply was cut at its output limit; no tool was run"
    assert state.result.text == "Checkout restarted at 09:41 because"


@pytest.mark.parametrize(
    "content",
    [
        # A reasoning model served without a reasoning parser (Qwen3 on vLLM, llama.cpp
        # without --reasoning-format) leaves its thinking in the text.
        "<think>\nThe user asks about checkout. It is up.\n</think>\n\nCheckout is up.",
        # DeepSeek-R1's template opens the block in the prompt: only its close is written.
        "The user asks about checkout. It is up.\n</think>\n\nCheckout is up.",
    ],
)
async def test_the_answer_is_what_follows_the_models_reasoning(
    tmp_path: Path, content: str
) -> None:
    # The thread was shown the model's thinking, tags and all, before its answer.
    state, _, _ = await _run(tmp_path, chat_completion(content))

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert state.result is not None and state.result.text == "Checkout is up."
    turns = [m.turn for m in state.messages if isinstance(m, AssistantMessage)]
    assert [turn.text for turn in turns] == [content]  # the journal keeps what was said


@pytest.mark.parametrize(
    "content",
    [
        "DeepSeek-R1 writes its thinking between <think> and </think>, then its answer.",
        "Qwen3 wraps it in `<think>…</think>`:\n```\n<think>\nplan\n</think>\n\nanswer\n```",
    ],
)
async def test_an_answer_that_names_the_reasoning_tags_is_shown_whole(
    tmp_path: Path, content: str
) -> None:
    # Everything up to the tag it named was taken for reasoning: the thread was shown
    # ", then its answer." of an answer about the tags.
    state, _, _ = await _run(tmp_path, chat_completion(content))

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert state.result is not None and state.result.text == content


@pytest.mark.parametrize(
    "content",
    ["<think>\nCheckout is up, I think.\n</think>", "<think>\nCheckout is up, I think."],
)
async def test_a_reply_of_reasoning_left_in_its_text_fails_the_run_saying_so(
    tmp_path: Path, content: str
) -> None:
    # The thread was shown the model's thinking, tags and all, as its answer; served with a
    # reasoning parser, the same reply failed the run as one of reasoning alone.
    state, counter, _ = await _run(tmp_path, chat_completion(content))

    assert _ended(state) == (RunStatus.FAILED, StopReason.MODEL_ERROR)
    assert state.result is not None
    assert state.result.error == (
        "the model returned only its reasoning: no answer text and no tool call"
    )
    assert state.result.text == ""
    assert counter.calls == {}
    turns = [m.turn for m in state.messages if isinstance(m, AssistantMessage)]
    assert [turn.text for turn in turns] == [content]


async def test_a_reply_of_reasoning_alone_fails_the_run_saying_so(tmp_path: Path) -> None:
    # A reasoning parser (DeepSeek's API, vLLM's) moves all of a reply that never left its
    # thinking to reasoning_content: the run failed as if the model had said nothing at all.
    alone = _with_message(chat_completion(), "stop", content="", reasoning="Hmm, the")
    state, counter, _ = await _run(tmp_path, alone)

    assert _ended(state) == (RunStatus.FAILED, StopReason.MODEL_ERROR)
    assert state.result is not None
    assert state.result.error == (
        "the model returned only its reasoning: no answer text and no tool call"
    )
    assert counter.calls == {}
    turns = [m.turn for m in state.messages if isinstance(m, AssistantMessage)]
    assert [turn.reasoning for turn in turns] == [Reasoning(field="reasoning", text="Hmm, the")]


@pytest.mark.parametrize(
    ("content", "reasoning"),
    [
        ("", "The user wants checkout looked at. First I"),
        ("<think>\nThe user wants checkout looked at. First I", None),
    ],
)
async def test_a_reply_cut_in_its_reasoning_says_so(
    tmp_path: Path, content: str, reasoning: str | None
) -> None:
    # A reasoning model can spend its whole output limit thinking: the run said only that the
    # reply was cut, and showed the thinking as the run's words.
    cut = _with_message(chat_completion(content), "length", reasoning_content=reasoning)
    state, counter, _ = await _run(tmp_path, cut)

    assert _ended(state) == (RunStatus.FAILED, StopReason.TRUNCATED)
    assert state.result is not None
    assert state.result.error == (
        "the model's reply was cut at its output limit while it was still reasoning;"
        " no tool was run"
    )
    assert state.result.text == ""
    assert counter.calls == {}


def _raw_bytes_completion(content: bytes) -> Canned:
    """A 200 whose answer holds ``content`` as it is, between the quotes of a JSON string."""
    head = b'{"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",'
    body = head + b' "content": "' + content + b'"}}]}'
    return Canned(status=200, raw=body, content_type="application/json")


async def test_a_character_cut_between_tokens_is_replaced_not_a_failed_run(
    tmp_path: Path,
) -> None:
    # A server that cuts a character's bytes between two tokens (€ is E2 82 AC) sends
    # invalid UTF-8 in an otherwise whole completion: the answer is had, not "no API there".
    state, _, _ = await _run_canned(tmp_path, [_raw_bytes_completion(b"costs 5 \xe2\x82 now")])

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert state.result is not None and state.result.text == "costs 5 \ufffd now"


async def test_a_control_character_left_unescaped_is_kept_not_a_failed_run(
    tmp_path: Path,
) -> None:
    state, _, _ = await _run_canned(tmp_path, [_raw_bytes_completion(b"col1\tcol2")])

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert state.result is not None and state.result.text == "col1\tcol2"


def _failed_mid_reply(finish: str, *calls: tuple[str | None, str, str]) -> dict[str, Any]:
    body = chat_completion("The checkout service is", calls=calls)
    body["choices"][0]["finish_reason"] = finish
    return body


@pytest.mark.parametrize("finish", ["error", "abort"])
async def test_a_reply_the_model_failed_mid_way_is_no_answer_and_runs_no_call(
    tmp_path: Path, finish: str
) -> None:
    # OpenRouter ends a reply whose provider failed mid-way with "error", vLLM one its engine
    # dropped with "abort": the run completed with half a sentence as its answer, or ran the
    # calls of a reply nobody finished.
    body = _failed_mid_reply(finish, ("c1", "echo", '{"text": "x"}'))
    state, counter, rec = await _run(tmp_path, body)

    assert _ended(state) == (RunStatus.FAILED, StopReason.MODEL_ERROR)
    assert state.result is not None
    assert f"ended with finish_reason {finish!r}: the model failed mid-reply" in state.result.error
    assert counter.calls == {}
    assert "panic" not in rec.kinds()


async def test_a_reply_the_model_failed_mid_way_is_asked_for_again() -> None:
    failed = Canned(status=200, body=_failed_mid_reply("error"))
    async with FakeOpenAI([{"text": "the whole answer"}], canned=[failed]) as fake:
        model = OpenAIProvider("m", api_key=KEY, base_url=fake.base_url, max_retries=1)
        try:
            turn = await model.complete([UserMessage("hi")], [], timeout=10)
        finally:
            await model.aclose()

    assert turn.text == "the whole answer"
    assert fake.count == 2


@pytest.mark.parametrize("finish", [["stop"], {"type": "stop"}])
async def test_a_finish_reason_that_is_no_text_is_none_not_a_panic(
    tmp_path: Path, finish: object
) -> None:
    # A call written as text, in a reply whose finish_reason is a list or an object: looked
    # up among the reasons that cut a reply short, it raised TypeError (a panic).
    text = '<tool_call>\n{"name": "echo", "arguments": {"text": "x"}}\n</tool_call>'
    body = chat_completion(text)
    body["choices"][0]["finish_reason"] = finish
    state, counter, rec = await _run(tmp_path, body)

    assert _ended(state) == (RunStatus.COMPLETED, StopReason.ANSWERED)
    assert counter.calls == {"echo": 1}
    assert "panic" not in rec.kinds()
