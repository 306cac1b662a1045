"""The scripted provider: conversation-positioned replies, expectations, script validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.config.settings import ConfigError, demo_file, load_settings
from bot.domain import AssistantTurn
from bot.llm.base import (
    AssistantMessage,
    Message,
    ModelError,
    SystemMessage,
    ToolResultItem,
    ToolResultsMessage,
    UserMessage,
)
from bot.llm.scripted import (
    EXHAUSTED,
    Choice,
    Reply,
    ScriptedProvider,
    ScriptError,
    ScriptMismatch,
    load_script,
)
from tests.fakes.fresh import fresh_json

CATALOG_TOOLS = {"service_status", "tail_logs", "restart_service", "disk_usage"}

REPLIES: list[dict[str, Any]] = [
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

DEMO_SCRIPT = demo_file("demo.yaml")


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


async def test_expect_mismatch_is_a_model_error_naming_the_script() -> None:
    model = ScriptedProvider.from_replies(REPLIES, name="incident")
    first = await model.complete([UserMessage("is api ok?")], [], timeout=1)

    with pytest.raises(ModelError) as caught:
        await model.complete(_answer([UserMessage("q")], first, "api: healthy"), [], timeout=1)

    message = str(caught.value)
    assert isinstance(caught.value, ScriptMismatch)
    assert "'incident'" in message and "reply 2" in message
    assert "'degraded'" in message and "api: healthy" in message


async def test_expect_checks_user_text() -> None:
    model = ScriptedProvider.from_replies([{"text": "on it", "expect": "checkout"}])

    hit = await model.complete([UserMessage("checkout is failing")], [], timeout=1)

    assert hit.text == "on it"
    with pytest.raises(ScriptMismatch, match="expected 'checkout'"):
        await model.complete([UserMessage("search is failing")], [], timeout=1)


CHOICE: list[dict[str, Any]] = [
    {"text": "restarting", "calls": [{"name": "restart_service", "arguments": {"service": "a"}}]},
    {
        "one_of": [
            {"match": "^denied by (?P<who>[^:]+): (?P<why>.+)", "text": "{who} said: {why}."},
            {"match": "^denied", "text": "denied, no reason"},
            {"expect": "restarted", "calls": [{"name": "service_status", "arguments": {}}]},
            {"text": "something else"},
        ]
    },
    {"text": "healthy", "calls": [{"name": "disk_usage", "arguments": {}}]},
]


@pytest.mark.parametrize(
    ("output", "text", "calls"),
    [
        ("denied by U0BOSS: not now", "U0BOSS said: not now.", []),
        ("denied by U0BOSS", "denied, no reason", []),
        ("a: restarted", None, ["call_2"]),
        ("refused: no one is present", "something else", []),
    ],
)
async def test_one_of_plays_the_first_alternative_that_matches(
    output: str, text: str | None, calls: list[str]
) -> None:
    model = ScriptedProvider.from_replies(CHOICE)
    first = await model.complete([UserMessage("go")], [], timeout=1)

    turn = await model.complete(_answer([UserMessage("go")], first, output), [], timeout=1)

    assert turn.text == text
    assert [c.id for c in turn.calls] == calls


async def test_call_ids_stay_unique_whichever_alternative_played() -> None:
    model = ScriptedProvider.from_replies(CHOICE)
    start: list[Message] = [UserMessage("go")]
    first = await model.complete(start, [], timeout=1)
    second_messages = _answer(start, first, "a: restarted")
    second = await model.complete(second_messages, [], timeout=1)

    third = await model.complete(_answer(second_messages, second, "ok"), [], timeout=1)

    assert [c.id for c in (*first.calls, *second.calls, *third.calls)] == [
        "call_1",
        "call_2",
        "call_3",
    ]


async def test_no_alternative_matching_lists_every_expectation() -> None:
    model = ScriptedProvider.from_replies(
        [{"one_of": [{"expect": "yes", "text": "a"}, {"match": "^no", "text": "b"}]}]
    )

    with pytest.raises(ScriptMismatch, match=r"expected 'yes' or /\^no/ in the latest input"):
        await model.complete([UserMessage("maybe")], [], timeout=1)


async def test_a_chat_sessions_history_does_not_move_the_script() -> None:
    model = ScriptedProvider.from_replies(REPLIES)
    history: list[Message] = [
        UserMessage("earlier"),
        AssistantMessage(AssistantTurn(text="earlier answer")),
    ]

    turn = await model.complete([*history, UserMessage("is api ok?")], [], timeout=1)

    assert turn.text == "Checking."


async def test_exhausted_script_gives_a_final_text() -> None:
    model = ScriptedProvider.from_replies([])

    turn = await model.complete([UserMessage("hi")], [], timeout=1)

    assert turn.text == EXHAUSTED
    assert turn.calls == ()
    assert turn.finish_reason == "stop"


def test_explicit_finish_reason_is_kept() -> None:
    script = ScriptedProvider.from_replies([{"text": "cut", "finish_reason": "length"}]).script

    first = script.replies[0]
    assert isinstance(first, Reply) and first.finish_reason == "length"


def test_provider_and_model_names(tmp_path: Path) -> None:
    path = tmp_path / "incident.yaml"
    path.write_text("- text: hi\n", encoding="utf-8")

    model = ScriptedProvider(load_script(path))

    assert (model.provider, model.model) == ("scripted", "incident")


@pytest.mark.parametrize(
    ("content", "cause"),
    [
        ("- text: hi\n- txt: typo\n", r"reply 2: txt: Object contains unknown field `txt`$"),
        ("- calls: [{arguments: {a: 1}}]\n", r"reply 1: calls\.0\.name: Object missing required"),
        ("- calls: [{name: x, arguments: [1, 2]}]\n", r"reply 1: calls\.0\.arguments: Expected"),
        ("- calls: [{name: x, arguments: {1: 2}}]\n", r"reply 1: calls\.0\.arguments: .* key"),
        ("- calls: [{name: ''}]\n", r"reply 1: calls\.0\.name: Expected `str` of length >= 1$"),
        ("- calls: [{name: x, arguments: {when: 2024-01-01}}]\n", r"calls\.0: .*quote a date"),
        ("- calls: [{name: x, arguments: {n: .nan}}]\n", r"reply 1: calls\.0: arguments must be"),
        ("- usage: {input_tokens: -1}\n", r"reply 1: usage\.input_tokens: Expected `int` >= 0$"),
        ("- just text\n", r"reply 1: Expected `object`, got `str`$"),
        ("text: hi\n", r"a script is a list of replies, got dict"),
        ("", r"a script is a list of replies, got nothing"),
        ("- match: '(unclosed'\n", r"reply 1: match: not a valid regular expression"),
        ("- one_of: [{match: '('}]\n", r"reply 1: one_of\.0: match: not a valid regular"),
        ("- one_of: []\n", r"reply 1: one_of: Expected `array` of length >= 1$"),
        ("- one_of: [{txt: typo}]\n", r"reply 1: one_of\.0\.txt: Object contains unknown field"),
    ],
)
def test_invalid_script_names_file_and_cause(tmp_path: Path, content: str, cause: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(content, encoding="utf-8")

    with pytest.raises(ScriptError, match=cause) as caught:
        load_script(path)

    assert str(caught.value).startswith(f"{path}: ")
    assert "\n" not in str(caught.value)


def test_a_script_that_is_not_yaml_says_where_as_the_configuration_does(tmp_path: Path) -> None:
    text = "- text: hi\n-x: [\n"
    script, config = tmp_path / "script.yaml", tmp_path / "kestrel.yaml"
    script.write_text(text)
    config.write_text(text)

    with pytest.raises(ScriptError) as caught:
        load_script(script)
    with pytest.raises(ConfigError) as refused:
        load_settings(str(config))

    said = f"{script}:2: not valid YAML (expected <block end>, but found '?')"
    assert str(caught.value) == said
    assert str(refused.value) == said.replace(str(script), str(config))


def test_a_script_that_is_not_utf8_is_named_with_the_byte(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_bytes(b"- text: caf\xe9\n")

    with pytest.raises(ScriptError) as caught:
        load_script(script)

    assert str(caught.value) == f"{script}: not UTF-8 text (byte 0xe9 at offset 11)"


def test_missing_script_file(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match=r"missing\.yaml: cannot read the script"):
        load_script(tmp_path / "missing.yaml")


def test_from_replies_validates() -> None:
    with pytest.raises(
        ScriptError, match=r"<inline>: reply 1: calls: Expected `array`, got `str`$"
    ):
        ScriptedProvider.from_replies([{"calls": "service_status"}])


def test_from_replies_takes_structs_as_given() -> None:
    reply = Reply(text="hi")
    choice = Choice(one_of=(Reply(expect="x", text="a"), Reply(text="b")))

    script = ScriptedProvider.from_replies([reply, choice, {"text": "c"}]).script

    assert script.replies[:2] == (reply, choice)
    assert script.replies[2] == Reply(text="c")


PLAYED_IN_CODE = """
import asyncio, json, sys
from bot.llm.base import UserMessage
from bot.llm.scripted import ScriptedProvider
model = ScriptedProvider.from_replies([{"text": "hi", "calls": [{"name": "x"}]}], name="code")
turn = asyncio.run(model.complete([UserMessage("go")], [], timeout=1))
print(json.dumps([turn.text, "pydantic" in sys.modules]))
"""


def test_replies_given_in_code_are_played_without_pydantic() -> None:
    # A bench's process plays replies given in code; pydantic would cost it some 8 MiB resident
    # and tens of milliseconds of start-up.
    assert fresh_json(PLAYED_IN_CODE) == ["hi", False]


def _alternatives(script_path: Path = DEMO_SCRIPT) -> list[tuple[Reply, ...]]:
    script = load_script(script_path)
    return [s.one_of if isinstance(s, Choice) else (s,) for s in script.replies]


def test_shipped_demo_script_is_valid() -> None:
    positions = _alternatives()

    calls = [call for options in positions for reply in options for call in reply.calls]
    assert load_script(DEMO_SCRIPT).name == "demo"
    assert {call.name for call in calls} <= CATALOG_TOOLS | {"ask_human_confirm"}
    assert [call.name for call in calls] == [
        "service_status",
        "tail_logs",
        "restart_service",
        "service_status",
        "ask_human_confirm",
    ]
    arguments = [call.arguments for call in calls]
    assert all(isinstance(each, dict) and each["service"] == "checkout" for each in arguments[:-1])
    assert isinstance(arguments[-1], dict)


def test_the_demo_cannot_leave_its_script() -> None:
    # Every position ends with a reply that takes any input, and every path ends in a text:
    # whatever a run does, the demo answers like a model, never with a script mismatch.
    for options in _alternatives():
        assert not options[-1].guarded
        assert all(reply.calls or reply.text for reply in options)
    assert all(not reply.calls for reply in _alternatives()[-1])


DEMO_PATHS = [
    # (the results each call gets, in order; what the final answer says)
    (
        [
            "checkout: degraded",
            "Killed: out of memory",
            "refused: this command needs approval and no one is present",
        ],
        "no one was there",
    ),
    (
        ["checkout: degraded", "out of memory", "denied by U0BOSS: busy"],
        'U0BOSS denied the restart ("busy")',
    ),
    (["checkout: degraded", "out of memory", "denied by U0BOSS"], "U0BOSS denied the restart."),
    (
        ["checkout: degraded", "out of memory", "refused: the approval request expired before"],
        "the approval request expired",
    ),
    (
        ["checkout: degraded", "out of memory", "refused: the run's deadline has passed"],
        "refused (the run's deadline has passed)",
    ),
    (["checkout: degraded", "out of memory", "exit status 1"], "did not go through"),
    (["checkout: degraded", "out of memory", "restarted", "degraded"], "not look healthy yet"),
    (
        ["checkout: degraded", "out of memory", "restarted", "restarted via kestrel 1", "yes"],
        "Follow-up (as you asked)",
    ),
    (
        [
            "checkout: degraded",
            "out of memory",
            "restarted",
            "restarted via kestrel 1",
            "no (answered by U0REQ)",
        ],
        "no follow-up recorded",
    ),
    (
        [
            "checkout: degraded",
            "out of memory",
            "restarted",
            "restarted via kestrel 1",
            "no answer before the deadline",
        ],
        "no one answered",
    ),
    (["checkout: active (running) for 0 days"], "nothing for me to restart"),
    (["unknown service"], "could not get checkout's status"),
    (["checkout: degraded", "timed out"], "could not read its logs"),
]


@pytest.mark.parametrize(("results", "answer"), DEMO_PATHS)
async def test_demo_answers_every_path_like_a_model(results: list[str], answer: str) -> None:
    model = ScriptedProvider(load_script(DEMO_SCRIPT))
    messages: list[Message] = [UserMessage("checkout is failing, can you look?")]

    for output in results:
        turn = await model.complete(messages, [], timeout=1)
        assert turn.calls, (output, turn.text)
        messages = _answer(messages, turn, output)
    final = await model.complete(messages, [], timeout=1)

    assert final.calls == () and final.text is not None
    assert answer in final.text
    assert "script" not in final.text and "{" not in final.text


async def test_demo_answers_another_question_with_what_it_can_do() -> None:
    model = ScriptedProvider(load_script(DEMO_SCRIPT))

    turn = await model.complete([UserMessage("what is the disk usage on db1?")], [], timeout=1)

    assert turn.calls == ()
    assert turn.text is not None and "checkout is failing, can you look?" in turn.text
