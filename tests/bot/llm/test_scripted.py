"""The scripted provider: conversation-positioned replies, expectations, script validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.domain import AssistantTurn
from bot.llm.base import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolResultItem,
    ToolResultsMessage,
    UserMessage,
)
from bot.llm.scripted import DEMO_SCRIPT, EXHAUSTED, ScriptedProvider, ScriptError, load_script

CATALOG_TOOLS = {"service_status", "tail_logs", "restart_service", "disk_usage"}

REPLIES = [
    {"text": "Checking.", "calls": [{"name": "service_status", "arguments": {"service": "api"}}]},
    {
        "calls": [
            {"name": "tail_logs", "arguments": {"service": "api", "lines": 5}},
            {"name": "disk_usage", "arguments": "not json"},
        ],
        "expect": "degraded",
    },
    {"text": "All good.", "usage": {"input_tokens": 10, "output_tokens": 3}},
]


def _answer(messages: list[Message], turn: AssistantTurn, output: str) -> list[Message]:
    """The conversation after ``turn`` and one result per call, all with ``output``."""
    results = tuple(ToolResultItem(call_id=c.id, name=c.name, output=output) for c in turn.calls)
    return [*messages, AssistantMessage(turn), ToolResultsMessage(results)]


async def test_replies_follow_the_conversation_position() -> None:
    model = ScriptedProvider.from_replies(REPLIES)
    start: list[Message] = [SystemMessage("sys"), UserMessage("is api ok?")]

    first = await model.complete(start, [], timeout=1)
    after_first = _answer(start, first, "api: degraded")
    second = await model.complete(after_first, [], timeout=1)
    third = await model.complete(_answer(after_first, second, "fine"), [], timeout=1)

    assert first.text == "Checking."
    assert [c.id for c in first.calls] == ["call_1"]
    assert first.calls[0].arguments == '{"service": "api"}'
    assert first.finish_reason == "tool_calls"
    assert [c.id for c in second.calls] == ["call_2", "call_3"]
    assert json.loads(second.calls[0].arguments) == {"service": "api", "lines": 5}
    assert second.calls[1].arguments == "not json"
    assert third.text == "All good."
    assert third.finish_reason == "stop"
    assert (third.usage.input_tokens, third.usage.output_tokens) == (10, 3)


async def test_same_conversation_gets_the_same_reply_in_a_new_provider() -> None:
    messages: list[Message] = [UserMessage("is api ok?")]
    first = await ScriptedProvider.from_replies(REPLIES).complete(messages, [], timeout=1)
    conversation = _answer(messages, first, "degraded")

    asked_twice = ScriptedProvider.from_replies(REPLIES)
    again = await asked_twice.complete(conversation, [], timeout=1)
    repeat = await asked_twice.complete(conversation, [], timeout=1)
    resumed = await ScriptedProvider.from_replies(REPLIES).complete(conversation, [], timeout=1)

    assert again == repeat == resumed
    assert [c.id for c in resumed.calls] == ["call_2", "call_3"]


async def test_usage_is_estimated_when_not_scripted() -> None:
    model = ScriptedProvider.from_replies([{"text": "x" * 40}])

    turn = await model.complete([UserMessage("y" * 400)], [], timeout=1)

    assert turn.usage.input_tokens == 100
    assert turn.usage.output_tokens == 10


async def test_expect_mismatch_answers_with_an_explanation() -> None:
    model = ScriptedProvider.from_replies(REPLIES)
    first = await model.complete([UserMessage("is api ok?")], [], timeout=1)

    turn = await model.complete(_answer([UserMessage("q")], first, "api: healthy"), [], timeout=1)

    assert turn.calls == ()
    assert turn.finish_reason == "stop"
    assert turn.text is not None
    assert "script mismatch at reply 2" in turn.text
    assert "'degraded'" in turn.text
    assert "api: healthy" in turn.text


async def test_expect_checks_user_text() -> None:
    model = ScriptedProvider.from_replies([{"text": "on it", "expect": "checkout"}])

    hit = await model.complete([UserMessage("checkout is failing")], [], timeout=1)
    miss = await model.complete([UserMessage("search is failing")], [], timeout=1)

    assert hit.text == "on it"
    assert miss.text is not None and "script mismatch" in miss.text


async def test_exhausted_script_gives_a_final_text() -> None:
    model = ScriptedProvider.from_replies([])

    turn = await model.complete([UserMessage("hi")], [], timeout=1)

    assert turn.text == EXHAUSTED
    assert turn.calls == ()
    assert turn.finish_reason == "stop"


def test_explicit_finish_reason_is_kept() -> None:
    script = ScriptedProvider.from_replies([{"text": "cut", "finish_reason": "length"}]).script

    assert script.replies[0].finish_reason == "length"


def test_provider_and_model_names(tmp_path: Path) -> None:
    path = tmp_path / "incident.yaml"
    path.write_text("- text: hi\n", encoding="utf-8")

    model = ScriptedProvider(load_script(path))

    assert (model.provider, model.model) == ("scripted", "incident")


@pytest.mark.parametrize(
    ("content", "cause"),
    [
        ("- text: hi\n- txt: typo\n", r"reply 2: txt: Extra inputs are not permitted"),
        ("- calls: [{arguments: {a: 1}}]\n", r"reply 1: calls\.0\.name: Field required"),
        ("- calls: [{name: x, arguments: [1, 2]}]\n", r"reply 1: calls\.0\.arguments"),
        ("- usage: {input_tokens: -1}\n", r"reply 1: usage\.input_tokens"),
        ("text: hi\n", r"a script is a list of replies, got dict"),
        ("", r"a script is a list of replies, got nothing"),
        ("- text: [unclosed\n", r"not valid YAML"),
    ],
)
def test_invalid_script_names_file_and_cause(tmp_path: Path, content: str, cause: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(content, encoding="utf-8")

    with pytest.raises(ScriptError, match=cause) as caught:
        load_script(path)

    assert str(caught.value).startswith(f"{path}: ")
    assert "\n" not in str(caught.value)


def test_missing_script_file(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match=r"missing\.yaml: cannot read the script"):
        load_script(tmp_path / "missing.yaml")


def test_from_replies_validates() -> None:
    with pytest.raises(ScriptError, match=r"<inline>: reply 1: calls"):
        ScriptedProvider.from_replies([{"calls": "service_status"}])


def test_shipped_demo_script_is_valid() -> None:
    script = load_script(DEMO_SCRIPT)

    calls = [call for reply in script.replies for call in reply.calls]
    assert script.name == "demo"
    assert {call.name for call in calls} <= CATALOG_TOOLS | {"ask_human_confirm"}
    assert [call.name for call in calls] == [
        "service_status",
        "tail_logs",
        "restart_service",
        "service_status",
        "ask_human_confirm",
    ]
    assert all(isinstance(call.arguments, dict) for call in calls)
    assert all(call.arguments["service"] == "checkout" for call in calls[:-1])
    final = script.replies[-1]
    assert final.calls == ()
    assert final.text is not None and "OOM" in final.text


async def test_demo_plays_through_to_a_final_answer() -> None:
    model = ScriptedProvider(load_script(DEMO_SCRIPT))
    messages: list[Message] = [UserMessage("checkout is failing, can you look?")]
    names: list[str] = []

    for _ in range(10):
        turn = await model.complete(messages, [], timeout=1)
        if not turn.calls:
            break
        names.extend(c.name for c in turn.calls)
        messages = _answer(messages, turn, "checkout: restarted via kestrel 1 time(s)")

    assert "restart_service" in names
    assert turn.finish_reason == "stop"
    assert turn.text is not None and "Cause" in turn.text
