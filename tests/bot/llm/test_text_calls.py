"""Tool calls a model wrote as text (servers without a tool-call parser for the model), through
the real ``openai`` client against the fake server: read as calls only when they name one of
the run's tools, and the reply's text journaled as the model sent it."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from bot.domain import AssistantTurn, Decision, DecisionKind, RequestKind, RunStatus, StopReason
from bot.journal.entries import AssistantTurnEntry
from bot.journal.fold import RunState
from bot.journal.log import JournalRecord
from bot.llm.base import ToolSpec, UserMessage
from bot.llm.openai_provider import OpenAIProvider
from bot.llm.reply_words import shown
from bot.llm.text_calls import text_calls
from bot.prompter import Prompter
from bot.run.supervisor import Supervisor
from bot.tools.base import Tool
from bot.tools.python import function_tool
from tests.fakes.growth import assert_linear
from tests.fakes.openai_server import Canned, FakeOpenAI, chat_completion
from tests.fakes.runtime import Counter, ScriptedPrompter, counting_tools, make_runtime

STATUS = ToolSpec(name="service_status", description="Show a service's status.")
LOGS = ToolSpec(name="tail_logs", description="Show a service's last log lines.")
CHECKOUT = '{"service": "checkout"}'


async def _turn(content: str, tools: list[ToolSpec] | None = None) -> AssistantTurn:
    """The turn the provider makes of a reply whose content is ``content``."""
    tools = [STATUS, LOGS] if tools is None else tools
    async with FakeOpenAI(canned=[Canned(status=200, body=chat_completion(content))]) as fake:
        model = OpenAIProvider("m", api_key="k", base_url=fake.base_url)
        try:
            return await model.complete([UserMessage("checkout?")], tools, timeout=5)
        finally:
            await model.aclose()


def _calls(turn: AssistantTurn) -> list[tuple[str, str]]:
    return [(call.name, call.arguments) for call in turn.calls]


@dataclass
class _Ran:
    """A run over a model that said ``replies`` in turn, then "done": what a test reads of it."""

    state: RunState
    records: list[JournalRecord]
    requests: list[dict[str, Any]]  # what the model was sent, in order


async def _run_saying(
    tmp_path: Path,
    replies: list[str],
    tools: Sequence[Tool],
    prompt: str = "help",
    prompter: Prompter | None = None,
) -> _Ran:
    """A run of ``prompt`` through the real client, the fake server saying ``replies``."""
    canned = [Canned(status=200, body=chat_completion(said)) for said in replies]
    async with FakeOpenAI(
        [{"text": "unused"}] * len(replies) + [{"text": "done"}], canned=canned
    ) as fake:
        model = OpenAIProvider("m", api_key="k", base_url=fake.base_url)
        rt, _ = await make_runtime(tmp_path / "k.db", model, tools)
        try:
            sup = Supervisor(rt)
            live = await sup.start_turn(prompt, requested_by="U0REQ", prompter=prompter)
            state = await sup.wait(live)
            records = await rt.store.load(state.run_id)
        finally:
            await rt.store.close()
            await model.aclose()
    return _Ran(state, records, fake.requests)


@pytest.mark.parametrize(
    "content",
    [
        # Hermes and Qwen templates (vLLM without --tool-call-parser, Ollama, llama.cpp).
        '<tool_call>\n{"name": "service_status", "arguments": {"service": "checkout"}}\n'
        "</tool_call>",
        # The model's bare JSON, as Mistral's and many small models' templates write it.
        '{"name": "service_status", "arguments": {"service": "checkout"}}',
        # Llama 3.1's JSON tool calling names them parameters.
        '{"name": "service_status", "parameters": {"service": "checkout"}}',
        '<|python_tag|>{"name": "service_status", "parameters": {"service": "checkout"}}',
        '[TOOL_CALLS] [{"name": "service_status", "arguments": {"service": "checkout"}}]',
        # Mistral's tokenizers from v11 on: the name, then the arguments after [ARGS] (early
        # v11 templates leave it out; some write the call's id before it).
        '[TOOL_CALLS]service_status[ARGS]{"service": "checkout"}',
        '[TOOL_CALLS]service_status{"service": "checkout"}',
        '[TOOL_CALLS]service_status[CALL_ID]a1b2c3d4e[ARGS]{"service": "checkout"}\n',
        # ... and as vLLM leaves them without a tool parser: its control tokens dropped.
        'service_status{"service": "checkout"}',
        # Llama 3.2's and 3.3's pythonic calls.
        '[service_status(service="checkout")]',
        '<|python_tag|>[service_status(service="checkout")]',
        # Arguments already as JSON text, as the API sends them.
        '{"name": "service_status", "arguments": "{\\"service\\": \\"checkout\\"}"}',
    ],
)
async def test_a_call_written_as_text_is_a_call(content: str) -> None:
    turn = await _turn(content)

    assert _calls(turn) == [("service_status", CHECKOUT)]
    assert turn.finish_reason == "tool_calls"
    assert turn.calls[0].id.startswith("call_")
    assert turn.text == content  # what the model said, kept as it said it


@pytest.mark.parametrize(
    "call",
    [
        '<tool_call>{"name": "service_status", "arguments": {"service": "checkout"}}</tool_call>',
        '{"name": "service_status", "arguments": {"service": "checkout"}}',
    ],
)
async def test_a_call_after_the_models_reasoning_is_a_call(call: str) -> None:
    # A reasoning model served without a reasoning parser (Qwen3, DeepSeek-R1 on vLLM) writes
    # its thinking first, which may mention the markup it is about to use.
    content = (
        "<think>\nThe user asks about checkout; I will use <tool_call> with service_status."
        "\n</think>\n\n" + call
    )
    turn = await _turn(content)

    assert _calls(turn) == [("service_status", CHECKOUT)]
    assert turn.text == content


async def test_several_tagged_calls_with_words_around_them_are_each_a_call() -> None:
    content = (
        "Let me look at both.\n"
        '<tool_call>{"name": "service_status", "arguments": {"service": "checkout"}}</tool_call>\n'
        '<tool_call>{"name": "tail_logs", "arguments": {"service": "checkout"}}</tool_call>'
    )
    turn = await _turn(content)

    assert _calls(turn) == [("service_status", CHECKOUT), ("tail_logs", CHECKOUT)]
    assert len({call.id for call in turn.calls}) == 2
    assert turn.text == content


async def test_tagged_calls_with_words_on_lines_between_them_are_each_a_call() -> None:
    # Hermes and Qwen2.5 say what they do next between their calls.
    content = (
        "Let me look at the status first.\n"
        '<tool_call>\n{"name": "service_status", "arguments": {"service": "checkout"}}\n'
        "</tool_call>\nNow its logs, with `tail`:\n\n"
        '<tool_call>\n{"name": "tail_logs", "arguments": {"service": "checkout"}}\n</tool_call>'
    )
    turn = await _turn(content)

    assert _calls(turn) == [("service_status", CHECKOUT), ("tail_logs", CHECKOUT)]
    assert turn.text == content
    assert shown(turn) == "Let me look at the status first.\nNow its logs, with `tail`:"


@pytest.mark.parametrize(
    "content",
    [
        '[TOOL_CALLS]service_status[ARGS]{"service": "checkout"}'
        '[TOOL_CALLS]tail_logs[ARGS]{"service": "checkout"}[TOOL_CALLS]service_status[ARGS]{}',
        'service_status{"service": "checkout"}tail_logs{"service": "checkout"}\nservice_status{}',
    ],
)
async def test_several_mistral_calls_are_each_a_call(content: str) -> None:
    turn = await _turn(content)

    assert _calls(turn) == [
        ("service_status", CHECKOUT),
        ("tail_logs", CHECKOUT),
        ("service_status", "{}"),
    ]
    assert len({call.id for call in turn.calls}) == 3
    assert shown(turn) == ""


@pytest.mark.parametrize(
    "arguments",
    ['{"service": "checkout"', '{"service": "checkout"} for checkout', '["checkout"]'],
)
async def test_a_mistral_call_with_arguments_that_do_not_read_keeps_them_for_the_loop(
    arguments: str,
) -> None:
    # The arguments are what follows [ARGS]: the loop's check tells the model what is wrong.
    turn = await _turn(f"[TOOL_CALLS]service_status[ARGS]{arguments}")

    assert _calls(turn) == [("service_status", arguments)]


async def test_several_pythonic_calls_are_each_a_call_with_their_literal_arguments() -> None:
    content = '[service_status(service="checkout"), tail_logs(service="api", lines=20,'
    content += " grep=None, follow=False, levels=['error', 'warn'], tags={'a': (1, -2.5)})]"
    turn = await _turn(content)

    assert [(name, json.loads(arguments)) for name, arguments in _calls(turn)] == [
        ("service_status", {"service": "checkout"}),
        (
            "tail_logs",
            {
                "service": "api",
                "lines": 20,
                "grep": None,
                "follow": False,
                "levels": ["error", "warn"],
                "tags": {"a": [1, -2.5]},
            },
        ),
    ]
    assert turn.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "content",
    [
        # Each names one of the run's tools, with literal keyword arguments, or none is read.
        '[service_status(service="checkout"), delete_everything()]',
        '[os.system("rm -rf /")]',
        '[service_status("checkout")]',
        '[service_status(**{"service": "checkout"})]',
        '[service_status(service=open("/etc/passwd").read())]',
        "[service_status(service=checkout)]",
        '[service_status(service=f"{checkout}")]',
        "[service_status(service={1, 2})]",
        "[service_status(service=1e999)]",
        "[service_status(service=b'checkout')]",
        "[service_status(service={(1, 2): 'x'})]",
        '[service_status(service="checkout")][0]',
        '[service_status(service="checkout")] and then the logs',
        '[service_status(service="checkout"), ]x',
        # Without its brackets, it is a line of code in an answer.
        'service_status(service="checkout")',
        '[lambda: service_status(service="checkout")]',
        "[" * 200 + "]" * 200,
        # Python reads a name in its NFKC form: one written in other letters names no tool,
        # as it names none in a call's JSON.
        '[\uff53\uff45\uff52\uff56\uff49\uff43\uff45_status(service="checkout")]',
        '[service_status(\uff53\uff45\uff52\uff56\uff49\uff43\uff45="checkout")]',
    ],
)
async def test_pythonic_text_that_is_not_all_calls_of_tools_is_left_alone(content: str) -> None:
    turn = await _turn(content)

    assert turn.calls == ()
    assert (turn.text, turn.finish_reason) == (content, "stop")


@pytest.mark.parametrize(
    "content",
    [
        # Not one of the run's tools, and no call's markup: an answer about some other API.
        '{"name": "delete_everything", "arguments": {}}',
        '[delete_everything(service="checkout")]',
        # One of several names no tool: none of them is taken (the other would run).
        '<tool_call>{"name": "service_status", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>',
        # A call shown inside an explanation is not a call.
        'You could run {"name": "service_status", "arguments": {"service": "checkout"}} later.',
        # A structured answer that happens to hold a tool's name.
        '{"name": "service_status", "status": "degraded"}',
        '{"name": "service_status", "arguments": {"service": "checkout"}, "verdict": "down"}',
        # Broken markup stays text for people to read.
        '<tool_call>{"name": "service_status", "arguments": </tool_call>',
        '<tool_call>["service_status"]</tool_call>',
        '{"name": 7, "arguments": {}}',
        # The run's tools listed as data: a schema where a call's arguments would be.
        '[{"name": "service_status", "parameters": {"type": "object", "properties": {}}},'
        ' {"name": "tail_logs", "parameters": {"type": "object", "properties": {}}}]',
        '{"name": "service_status", "arguments": {"type": "object", "properties": {}}}',
        # Mistral's calls name the run's tools, each, or none is read.
        "[TOOL_CALLS]service_status[ARGS]{}[TOOL_CALLS]delete_everything[ARGS]{}",
        "[TOOL_CALLS]service_status is what I would call",
        # Without its markers: a name and its object, and nothing else, each one of the run's.
        'service_status{"service": "checkout"} is what I would call',
        'service_status {"service": "checkout"',
        'service_status{"service": "checkout"}delete_everything{}',
        'Run service_status{"service": "checkout"}',
        'delete_everything{"service": "checkout"}',
        "service_status{}" * 5000,  # a runaway reply, as many calls as it could hold
        "[TOOL_CALLS][ARGS]{}",
        '```\n[TOOL_CALLS]service_status[ARGS]{"service": "checkout"}\n```',
        '[TOOL_CALLS]service_status[ARGS]{"type": "object", "properties": {}}',
        # Reasoning that is all there is, or never closed, calls nothing.
        '<think>{"name": "service_status", "arguments": {}}</think>',
        '<think>\n{"name": "service_status", "arguments": {}}',
    ],
)
async def test_text_that_is_not_a_call_of_a_tool_is_left_alone(content: str) -> None:
    turn = await _turn(content)

    assert turn.calls == ()
    assert (turn.text, turn.finish_reason) == (content, "stop")


async def test_without_tools_no_text_is_a_call() -> None:
    content = '{"name": "service_status", "arguments": {"service": "checkout"}}'
    turn = await _turn(content, tools=[])

    assert turn.calls == ()
    assert turn.text == content


async def test_a_call_written_as_text_runs_and_the_journal_keeps_what_was_said(
    tmp_path: Path,
) -> None:
    # The run ended "answered" with the call's JSON as its answer, the tool never run.
    said = 'Let me echo it.\n<tool_call>\n{"name": "echo", "arguments": {"text": "a"}}\n'
    said += '</tool_call>\nAnd b:\n<tool_call>{"name": "echo", "arguments": {"text": "b"}}'
    said += "</tool_call>"
    counter = Counter()
    ran = await _run_saying(tmp_path, [said], counting_tools(counter))

    assert ran.state.result is not None
    assert (ran.state.result.stop_reason, ran.state.result.text) == (StopReason.ANSWERED, "done")
    assert counter.calls == {"echo": 2}
    first = next(r.entry.turn for r in ran.records if isinstance(r.entry, AssistantTurnEntry))
    assert first.text == said
    assert [(c.name, json.loads(c.arguments)) for c in first.calls] == [
        ("echo", {"text": "a"}),
        ("echo", {"text": "b"}),
    ]
    second = ran.requests[1]["messages"]
    assistant = next(m for m in second if m["role"] == "assistant")
    assert [c["id"] for c in assistant["tool_calls"]] == [c.id for c in first.calls]
    # The calls go back once, as calls: the model's template writes their markup itself.
    assert assistant["content"] == "Let me echo it.\nAnd b:"
    assert [m["content"] for m in second if m["role"] == "tool"] == ["a", "b"]


@pytest.mark.parametrize(
    "said",
    [
        '{"name": "deploy", "arguments": {"text": "v2"}}',
        "<tool_call>\n<function=deploy>\n<parameter=text>\nv2\n</parameter>\n</function>\n"
        "</tool_call>",
        "<tool_call>deploy\n<arg_key>text</arg_key>\n<arg_value>v2</arg_value>\n</tool_call>",
        '[TOOL_CALLS]deploy[ARGS]{"text": "v2"}',
        '<|channel|>commentary to=functions.deploy <|constrain|>json<|message|>{"text": "v2"}',
        "<\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin\uff5c>deploy"
        '<\uff5ctool\u2581sep\uff5c>{"text": "v2"}<\uff5ctool\u2581call\u2581end\uff5c>',
    ],
)
async def test_a_gated_call_written_as_text_waits_for_approval(tmp_path: Path, said: str) -> None:
    counter = Counter()
    prompter = ScriptedPrompter([None])  # asked, and answers later
    ran = await _run_saying(tmp_path, [said], counting_tools(counter), "ship it", prompter)

    assert ran.state.status is RunStatus.SUSPENDED
    assert [(r.kind, r.tool) for r in ran.state.open_requests] == [
        (RequestKind.WAIT_APPROVAL, "deploy")
    ]
    assert counter.calls == {}


STATUS_CALL = (
    '<tool_call>{"name": "service_status", "arguments": {"service": "checkout"}}</tool_call>'
)
LOGS_CALL = '<tool_call>{"name": "tail_logs", "arguments": {"service": "checkout"}}</tool_call>'


@pytest.mark.parametrize(
    "content",
    [
        # The markup explained in inline code, or shown in a fenced block: an answer.
        f"A model calls a tool by writing `{STATUS_CALL}` in its reply.",
        f"To look yourself, send:\n```\n{STATUS_CALL}\n```",
        f"To look yourself, send:\n```xml\n{STATUS_CALL}",
        f"Models write `{STATUS_CALL}",
        # ... in an indented code block, or a fenced block opened with tildes.
        f"To look yourself, send:\n\n    {STATUS_CALL}",
        f"To look yourself, send:\n\n\t{STATUS_CALL}",
        f"To look yourself, send:\n~~~\n{STATUS_CALL}",
        # An earlier call quoted, with words after it, or ending the sentence that quotes it.
        f"I ran {STATUS_CALL} and checkout is up.",
        f"Earlier I ran {STATUS_CALL}",
        f"Checked.\nEarlier I ran {STATUS_CALL}\n",
        # A call's JSON shown in a fenced block is shown, not made, as its markup would be.
        '```json\n{"name": "service_status", "arguments": {"service": "checkout"}}\n```',
        '```\n[{"name": "service_status", "arguments": {"service": "checkout"}}]\n```',
        '```python\n[service_status(service="checkout")]\n```',
        # Calls offered as choices, with words between them.
        f"You could run {STATUS_CALL} or {LOGS_CALL}",
        f"{STATUS_CALL} or\n{LOGS_CALL}",
        f"{STATUS_CALL}\nor {LOGS_CALL}",
        # Words between blocks that leave the next one in code, or that follow the last.
        f"{STATUS_CALL}\nSend this:\n```\n{LOGS_CALL}\n```",
        f"{STATUS_CALL}\nthen `{LOGS_CALL}`",
        f"{STATUS_CALL}\n{LOGS_CALL}\nThat is how I would look.",
        # The reasoning of a model whose template opened the <think> block in the prompt (so
        # the reply holds only its close) weighs a call, then answers in words.
        f"The user wants checkout looked at; {STATUS_CALL} would do.\n</think>\n\nShall I look?",
    ],
)
async def test_markup_shown_in_an_answer_is_no_call(content: str) -> None:
    turn = await _turn(content)

    assert turn.calls == ()
    assert (turn.text, turn.finish_reason) == (content, "stop")


@pytest.mark.parametrize(
    "words",
    [
        "Checking `checkout`\n",
        "```\ncurl checkout/health\n```\nLet me look myself.\n",
    ],
)
async def test_a_call_after_closed_code_in_its_words_is_a_call(words: str) -> None:
    turn = await _turn(words + STATUS_CALL)

    assert _calls(turn) == [("service_status", CHECKOUT)]


@pytest.mark.parametrize(
    "thinking",
    [
        # The <think> block opened by the prompt: only its close is in the reply.
        f"A status would do: {LOGS_CALL} is too much.\n</think>\n\n",
        # Reasoning that names its own closing tag before it ends.
        f"<think>I end with </think>, then maybe {LOGS_CALL}; no, the status.</think>\n",
    ],
)
async def test_only_the_call_after_the_reasoning_is_read(thinking: str) -> None:
    turn = await _turn(thinking + STATUS_CALL)

    assert _calls(turn) == [("service_status", CHECKOUT)]


async def test_a_call_explained_in_an_answer_does_not_run(tmp_path: Path) -> None:
    # The model explained its markup to the user: the consequential, ungated tool it quoted ran.
    said = 'I would write `<tool_call>{"name": "write", "arguments": {"text": "x"}}</tool_call>`.'
    counter = Counter()
    ran = await _run_saying(tmp_path, [said], counting_tools(counter), "how?")

    assert ran.state.result is not None
    assert (ran.state.result.stop_reason, ran.state.result.text) == (StopReason.ANSWERED, said)
    assert counter.calls == {}
    assert len(ran.requests) == 1


async def test_a_resumed_run_answers_each_text_call_by_the_id_it_was_journaled_with(
    tmp_path: Path,
) -> None:
    # The calls' ids are made from the reply's id and each call's place, and kept in the
    # journal: another process resuming the run maps each result to the call it answers.
    said = (
        '<tool_call>{"name": "echo", "arguments": {"text": "a"}}</tool_call>\n'
        '<tool_call>{"name": "deploy", "arguments": {"text": "v2"}}</tool_call>'
    )
    db = tmp_path / "k.db"
    canned = [Canned(status=200, body=chat_completion(said))]
    async with FakeOpenAI([{"text": "unused"}], canned=canned) as first:
        model = OpenAIProvider("m", api_key="k", base_url=first.base_url)
        rt, _ = await make_runtime(db, model, counting_tools(Counter()))
        try:
            sup = Supervisor(rt)
            live = await sup.start_turn(
                "ship", requested_by="U0REQ", prompter=ScriptedPrompter([None])
            )
            (request,) = (await sup.wait(live)).open_requests
            records = await rt.store.load(live.run_id)
        finally:
            await rt.store.close()
            await model.aclose()
    journaled = next(r.entry.turn for r in records if isinstance(r.entry, AssistantTurnEntry))
    ids = [call.id for call in journaled.calls]

    async with FakeOpenAI([{"text": "unused"}, {"text": "done"}]) as second:
        model = OpenAIProvider("m", api_key="k", base_url=second.base_url)
        counter = Counter()
        rt, _ = await make_runtime(db, model, counting_tools(counter))
        try:
            sup = Supervisor(rt)
            decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APP")
            answered = await sup.answer(decision, run_id=live.run_id)
            resumed = await sup.resume(live.run_id, claimed=answered.claimed)
            assert resumed is not None
            state = await sup.wait(resumed)
        finally:
            await rt.store.close()
            await model.aclose()

    assert state.result is not None
    assert state.result.text == "done"
    assert counter.calls == {"deploy": 1}
    messages = second.requests[0]["messages"]
    (assistant,) = [m for m in messages if m["role"] == "assistant"]
    assert assistant["content"] is None  # nothing but the calls, sent as calls
    assert [c["id"] for c in assistant["tool_calls"]] == ids
    results = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    assert results == {ids[0]: "a", ids[1]: "deployed v2"}


TAIL = ToolSpec(
    name="tail_logs",
    description="Show a service's last log lines.",
    parameters={
        "type": "object",
        "properties": {
            "service": {"type": "string"},
            "lines": {"type": "integer"},
            "since": {"type": "number"},
            "follow": {"type": "boolean"},
            "levels": {"type": "array", "items": {"type": "string"}},
            "labels": {"type": "object"},
            "grep": {"type": ["string", "null"]},
            "until": {"type": ["integer", "null"]},
        },
    },
)


def _qwen3_coder(name: str, **values: str) -> str:
    """A call as Qwen3-Coder's template writes it: each value as text, on lines of its own."""
    written = "".join(
        f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in values.items()
    )
    return f"<tool_call>\n<function={name}>\n{written}</function>\n</tool_call>"


async def test_qwen3_coder_calls_are_calls_with_values_of_their_schemas_types() -> None:
    content = "<think>\nStatus, then logs.\n</think>\n\nLooking.\n"
    content += _qwen3_coder("service_status", service="checkout") + "\n"
    content += _qwen3_coder(
        "tail_logs",
        service="42",
        lines="20",
        since="1.5",
        follow="true",
        levels='["error", "warn"]',
        labels='{"team": "pay"}',
        grep="null",
        until="null",
    )
    turn = await _turn(content, [STATUS, TAIL])

    assert [(name, json.loads(arguments)) for name, arguments in _calls(turn)] == [
        ("service_status", {"service": "checkout"}),
        (
            "tail_logs",
            {
                "service": "42",  # text, as its schema says: never a number
                "lines": 20,
                "since": 1.5,
                "follow": True,
                "levels": ["error", "warn"],
                "labels": {"team": "pay"},
                "grep": "null",  # text may say null
                "until": None,
            },
        ),
    ]
    assert turn.finish_reason == "tool_calls"
    assert shown(turn) == "Looking."


async def test_a_qwen3_coder_value_keeps_its_lines_and_blanks() -> None:
    script = "set -e\n\n  echo <done>\n"
    turn = await _turn(_qwen3_coder("tail_logs", service=script, lines=" 7 "), [TAIL])

    assert [json.loads(arguments) for _, arguments in _calls(turn)] == [
        {"service": script, "lines": 7}
    ]


async def test_a_qwen3_coder_value_not_of_its_type_stays_text_for_the_tools_check() -> None:
    turn = await _turn(
        _qwen3_coder("tail_logs", lines="twenty", follow="yes", levels="error", since="[1]"),
        [TAIL],
    )

    assert [json.loads(arguments) for _, arguments in _calls(turn)] == [
        {"lines": "twenty", "follow": "yes", "levels": "error", "since": "[1]"}
    ]


@pytest.mark.parametrize(
    "content",
    [
        # Broken markup: a parameter or the function left open, words inside, a key twice.
        "<tool_call>\n<function=service_status>\n<parameter=service>\ncheckout\n</function>"
        "\n</tool_call>",
        "<tool_call>\n<function=service_status>\n<parameter=service>\ncheckout\n"
        "</parameter>\n</tool_call>",
        "<tool_call>\n<function=service_status>\nfor checkout\n<parameter=service>\n"
        "checkout\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=service_status>\n<parameter=service>\na\n</parameter>\n"
        "<parameter=service>\nb\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
        # Shown in code, or quoted with words after it.
        "Qwen3-Coder writes:\n```\n" + _qwen3_coder("service_status", service="x") + "\n```",
        _qwen3_coder("service_status", service="checkout") + "\nis how it looks.",
    ],
)
async def test_qwen3_coder_markup_that_is_not_a_call_of_a_tool_is_left_alone(
    content: str,
) -> None:
    turn = await _turn(content, [STATUS, TAIL])

    assert turn.calls == ()
    assert (turn.text, turn.finish_reason) == (content, "stop")


class _TailArgs(BaseModel):
    service: str
    lines: int


async def test_a_qwen3_coder_call_runs_and_a_value_not_of_its_type_goes_back_to_the_model(
    tmp_path: Path,
) -> None:
    tailed: list[tuple[str, int]] = []

    @function_tool(name="tail", idempotent=True)
    async def tail(args: _TailArgs) -> str:
        """Tail a service's logs."""
        tailed.append((args.service, args.lines))
        return "ok"

    replies = [
        _qwen3_coder("tail", service="checkout", lines="twenty"),
        _qwen3_coder("tail", service="checkout", lines="20"),
    ]
    ran = await _run_saying(tmp_path, replies, [tail], "logs?")
    state = ran.state

    assert state.result is not None
    assert (state.result.stop_reason, state.result.text) == (StopReason.ANSWERED, "done")
    assert tailed == [("checkout", 20)]
    messages = ran.requests[1]["messages"]
    (refused,) = [m["content"] for m in messages if m["role"] == "tool"]
    assert refused.startswith("invalid arguments: lines:")
    (assistant,) = [m for m in messages if m["role"] == "assistant"]
    assert assistant["content"] is None  # the markup goes back once, as the call it was
    call = assistant["tool_calls"][0]["function"]
    assert json.loads(call["arguments"]) == {"service": "checkout", "lines": "twenty"}


async def test_a_mistral_call_runs_and_one_whose_arguments_do_not_read_goes_back(
    tmp_path: Path,
) -> None:
    replies = ['[TOOL_CALLS]echo[ARGS]{"text": "a"', '[TOOL_CALLS]echo[ARGS]{"text": "a"}']
    counter = Counter()
    ran = await _run_saying(tmp_path, replies, counting_tools(counter), "echo a")
    state = ran.state

    assert state.result is not None
    assert (state.result.stop_reason, state.result.text) == (StopReason.ANSWERED, "done")
    assert counter.calls == {"echo": 1}
    tools = [m["content"] for m in ran.requests[2]["messages"] if m["role"] == "tool"]
    assert tools[0].startswith("invalid arguments: arguments are not valid JSON")
    assert tools[1] == "a"


ANALYSIS = "<|channel|>analysis<|message|>Need the status; use service_status.<|end|>"
HARMONY_CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.service_status <|constrain|>json"
    '<|message|>{"service": "checkout"}<|call|>'
)


@pytest.mark.parametrize(
    "content",
    [
        # gpt-oss's harmony messages, left as text by a server that does not parse them.
        ANALYSIS + HARMONY_CALL,
        HARMONY_CALL.removeprefix("<|start|>assistant").removesuffix("<|call|>"),
        # The recipient in the header's role part, as harmony also allows.
        "<|start|>assistant to=functions.service_status<|channel|>commentary json<|message|>"
        '{"service": "checkout"}<|call|>',
    ],
)
async def test_a_gpt_oss_call_left_as_harmony_text_is_a_call(content: str) -> None:
    turn = await _turn(content)

    assert _calls(turn) == [("service_status", CHECKOUT)]
    assert turn.finish_reason == "tool_calls"
    assert shown(turn) == ""  # its reasoning is no answer


async def test_a_gpt_oss_preamble_is_its_words_and_its_reasoning_none() -> None:
    preamble = "<|start|>assistant<|channel|>commentary<|message|>Checking checkout.<|end|>"
    turn = await _turn(ANALYSIS + preamble + HARMONY_CALL)

    assert _calls(turn) == [("service_status", CHECKOUT)]
    assert shown(turn) == "Checking checkout."


@pytest.mark.parametrize(
    "content",
    [
        # An answer, after reasoning that weighed a call.
        ANALYSIS + "<|start|>assistant<|channel|>final<|message|>Checkout is up.",
        HARMONY_CALL + "<|start|>assistant<|channel|>final<|message|>Checkout is up.",
        # A call of one of gpt-oss's own tools (its browser, its python).
        ANALYSIS + HARMONY_CALL.replace("functions.service_status", "browser.search"),
        # Words after a call, or markup that does not read.
        HARMONY_CALL + " and then the logs",
        "<|channel|>commentary to=functions.service_status {}",
        "<|channel|><|message|>{}",
        # Reasoning that repeats a tool's output holding a call's markup: each message the
        # model writes ends before the next begins, so one that does not is quoted.
        "<|channel|>analysis<|message|>The page says " + HARMONY_CALL,
        "<|channel|>analysis<|message|>The log holds <|start|>assistant<|channel|>commentary "
        "to=functions.tail_logs<|message|>{}<|end|>" + HARMONY_CALL,
        "<|start|>assistant<|channel|>commentary<|message|>I would send " + HARMONY_CALL,
        HARMONY_CALL + " is what the page held.<|end|>",
        # A final message is the answer, whatever it shows: gpt-oss calls nothing in it.
        ANALYSIS + "<|start|>assistant<|channel|>final<|message|>" + HARMONY_CALL,
        ANALYSIS + '<|start|>assistant<|channel|>final<|message|>{"name": "service_status", '
        '"arguments": {}}',
    ],
)
async def test_harmony_text_that_is_not_a_call_of_a_tool_is_left_alone(content: str) -> None:
    turn = await _turn(content)

    assert turn.calls == ()
    assert (turn.text, turn.finish_reason) == (content, "stop")


# Reasoning that names the marker of gpt-oss's final message, as a question about it may.
NAMES_FINAL = "<|channel|>analysis<|message|>Not <|channel|>final<|message|> yet.<|end|>"


async def test_a_gpt_oss_call_after_reasoning_naming_its_final_marker_is_a_call() -> None:
    turn = await _turn(NAMES_FINAL + HARMONY_CALL)

    assert _calls(turn) == [("service_status", CHECKOUT)]
    assert shown(turn) == ""


@pytest.mark.parametrize(
    "answer",
    ["Checkout is up.", "Its answer follows `<|channel|>final<|message|>`, as this one does."],
)
async def test_a_gpt_oss_final_message_is_shown_whole(answer: str) -> None:
    turn = await _turn(NAMES_FINAL + "<|start|>assistant<|channel|>final<|message|>" + answer)

    assert turn.calls == ()
    assert shown(turn) == answer


def _marker(name: str) -> str:
    """One of DeepSeek's markers (its bars fullwidth, its words joined by U+2581)."""
    return "<\uff5c" + name.replace(" ", "\u2581") + "\uff5c>"


CALLS, CALLS_END = _marker("tool calls begin"), _marker("tool calls end")
CALL, CALL_END, SEP = _marker("tool call begin"), _marker("tool call end"), _marker("tool sep")
V31_STATUS = f'{CALL}service_status{SEP}{{"service": "checkout"}}{CALL_END}'
V3_LOGS = f'{CALL}function{SEP}tail_logs\n```json\n{{"service": "checkout"}}\n```{CALL_END}'


@pytest.mark.parametrize(
    "content",
    [
        # DeepSeek V3.1's calls, and V3's and R1's (the name after "function", JSON fenced).
        f"{CALLS}{V31_STATUS}{V3_LOGS}{CALLS_END}",
        f"{CALLS}\n{V31_STATUS}\n{V3_LOGS}\n{CALLS_END}{_marker('end of sentence')}",
        f"{CALLS}{V31_STATUS}{V3_LOGS}",  # the server left out the last marker
    ],
)
async def test_deepseek_calls_are_calls(content: str) -> None:
    turn = await _turn(f"<think>Both.</think>Looking at checkout.{content}")

    assert _calls(turn) == [("service_status", CHECKOUT), ("tail_logs", CHECKOUT)]
    assert shown(turn) == "Looking at checkout."


@pytest.mark.parametrize(
    "content",
    [
        f"{CALLS}{V31_STATUS}{CALLS_END} and then the logs",
        f"{CALLS}first {V31_STATUS}{CALLS_END}",
        f"{CALLS}{V31_STATUS} then{CALLS_END}",
        f"{CALLS}{CALL}service_status{CALL_END}{CALLS_END}",
        f"{CALLS}{CALLS_END}",
        f"DeepSeek writes `{CALLS}{V31_STATUS}{CALLS_END}`",
        # A tool's output holding its markup, repeated as a Markdown quote.
        f"The log reads:\n> {CALLS}{V31_STATUS}{CALLS_END}",
        f"The log reads:\n  > line 3: {CALLS}{V31_STATUS}{CALLS_END}",
    ],
)
async def test_deepseek_markup_that_is_not_a_call_of_a_tool_is_left_alone(content: str) -> None:
    turn = await _turn(content)

    assert turn.calls == ()
    assert (turn.text, turn.finish_reason) == (content, "stop")


async def test_a_gpt_oss_answer_left_as_harmony_text_shows_only_its_final_message(
    tmp_path: Path,
) -> None:
    said = ANALYSIS + "<|start|>assistant<|channel|>final<|message|>Checkout is up."
    ran = await _run_saying(tmp_path, [said], counting_tools(Counter()), "checkout?")
    state = ran.state

    assert state.result is not None
    # Its reasoning ("Need the status; …") is its own: the journal keeps it, people never see it.
    assert (state.result.stop_reason, state.result.text) == (StopReason.ANSWERED, "Checkout is up.")


@pytest.mark.parametrize(
    "content",
    [
        '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>',
        _qwen3_coder("delete_everything", service="checkout"),
        '[TOOL_CALLS]delete_everything[ARGS]{"service": "checkout"}',
        '[TOOL_CALLS] [{"name": "delete_everything", "arguments": {}}]',
        ANALYSIS + HARMONY_CALL.replace("service_status", "delete_everything"),
        f"{CALLS}{V31_STATUS.replace('service_status', 'delete_everything')}{CALLS_END}",
    ],
)
async def test_calls_in_a_calls_markup_naming_no_tool_of_the_run_are_calls(content: str) -> None:
    # The loop tells the model its tools (nothing runs) rather than end with the markup shown.
    turn = await _turn(content)

    assert [call.name for call in turn.calls] == ["delete_everything"]
    assert turn.finish_reason == "tool_calls"


async def test_a_call_of_no_tool_of_the_run_goes_back_to_the_model_and_nothing_runs(
    tmp_path: Path,
) -> None:
    replies = [
        '<tool_call>\n{"name": "echo_text", "arguments": {"text": "a"}}\n</tool_call>',
        '<tool_call>\n{"name": "echo", "arguments": {"text": "a"}}\n</tool_call>',
    ]
    counter = Counter()
    ran = await _run_saying(tmp_path, replies, counting_tools(counter), "echo a")
    state = ran.state

    assert state.result is not None
    assert (state.result.stop_reason, state.result.text) == (StopReason.ANSWERED, "done")
    assert counter.calls == {"echo": 1}
    (told,) = [m["content"] for m in ran.requests[1]["messages"] if m["role"] == "tool"]
    assert told == "unknown tool 'echo_text'; tools: boom, deploy, echo, slow, write"


def _glm(name: str, **values: str) -> str:
    """A call as GLM-4.5's and later templates write it (text as it is, the rest as JSON)."""
    written = "".join(
        f"<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n"
        for key, value in values.items()
    )
    return f"<tool_call>{name}\n{written}</tool_call>"


async def test_glm_calls_are_calls_with_values_of_their_schemas_types() -> None:
    content = "<think>Status, then logs.</think>\nLooking.\n" + _glm("service_status") + "\n"
    content += _glm("tail_logs", service=" checkout ", lines="20", follow="false")
    # GLM-4.7 writes the first key on the name's line.
    content += '\n<tool_call>tail_logs<arg_key>levels</arg_key><arg_value>["error"]'
    content += "</arg_value></tool_call>"
    turn = await _turn(content, [STATUS, TAIL])

    assert [(name, json.loads(arguments)) for name, arguments in _calls(turn)] == [
        ("service_status", {}),
        ("tail_logs", {"service": " checkout ", "lines": 20, "follow": False}),
        ("tail_logs", {"levels": ["error"]}),
    ]
    assert shown(turn) == "Looking."


@pytest.mark.parametrize(
    "content",
    [
        "<tool_call>service_status please</tool_call>",
        "<tool_call>service_status\n<arg_key>service</arg_key>checkout</tool_call>",
        "<tool_call>service_status\n<arg_key>service</arg_key><arg_value>a</tool_call>",
        "<tool_call>service_status\nfor <arg_key>service</arg_key><arg_value>a</arg_value>"
        "</tool_call>",
        "<tool_call>service_status\n<arg_key>service</arg_key><arg_value>a</arg_value>\nthen"
        "</tool_call>",
        "Run:\n```\n" + _glm("service_status", service="checkout") + "\n```",
    ],
)
async def test_glm_markup_that_is_not_a_call_is_left_alone(content: str) -> None:
    turn = await _turn(content, [STATUS, TAIL])

    assert turn.calls == ()
    assert (turn.text, turn.finish_reason) == (content, "stop")


@pytest.mark.parametrize(
    "content",
    [
        '<|channel|>commentary to=functions.service_status <|constrain|>json<|message|>{"serv',
        f"{CALLS}{CALL}service_status{SEP}{{'service': 'checkout'}}{CALL_END}{CALLS_END}",
    ],
)
async def test_marked_arguments_that_do_not_read_are_left_for_the_loops_check(
    content: str,
) -> None:
    # The loop tells the model its arguments are not JSON, rather than end with the markup.
    turn = await _turn(content)

    assert [call.name for call in turn.calls] == ["service_status"]
    with pytest.raises(ValueError):
        json.loads(turn.calls[0].arguments)


REPLY_CAP = 4 * 1024 * 1024  # the most a reply may hold (DEFAULT_MAX_REPLY_BYTES)


def _runaway_words_between(size: int) -> str:
    """A model stuck repeating a call and a line of words after it."""
    unit = f"{STATUS_CALL}\nNow the logs:\n"
    return "Looking.\n" + unit * (size // len(unit))


def _runaway_qwen3_coder_parameters(size: int) -> str:
    """Qwen3-Coder stuck writing parameters of one call, each of another name."""
    count = size // 40
    written = "".join(f"<parameter=p{i}>\n1\n</parameter>\n" for i in range(count))
    return f"<tool_call>\n<function=service_status>\n{written}</function>\n</tool_call>"


def _runaway_glm_arguments(size: int) -> str:
    """GLM stuck writing arguments of one call, each of another name."""
    count = size // 50
    written = "".join(f"<arg_key>p{i}</arg_key><arg_value>1</arg_value>" for i in range(count))
    return f"<tool_call>service_status\n{written}</tool_call>"


@pytest.mark.parametrize(
    "runaway",
    [_runaway_words_between, _runaway_qwen3_coder_parameters, _runaway_glm_arguments],
)
def test_a_runaway_reply_of_markup_is_read_in_linear_time(runaway: Callable[[int], str]) -> None:
    # Read quadratically, a reply of REPLY_CAP held the event loop for seconds (15 for the words
    # between calls, a minute for Qwen3-Coder's parameters): eight times the markup took near
    # 64 times as long. Read linearly, near eight times.
    tools: dict[str, dict[str, object]] = {"service_status": {}, "tail_logs": {}}
    small, large = runaway(REPLY_CAP // 256), runaway(REPLY_CAP // 32)
    assert_linear(lambda text: text_calls(text, tools), small, large, k=8)
