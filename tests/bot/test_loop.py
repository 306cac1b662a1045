"""The loop end to end on real parts: SQLite journal, scripted model, in-process tools."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bot import wire
from bot.domain import Budgets, DecisionKind, RunStatus, StopReason, ToolCall, ToolOutcome
from bot.events import AdvisoryEvent
from bot.hooks import HookContext, Hooks, ToolVerdict
from bot.journal.entries import AdvisoryEntry, AssistantTurnEntry, ToolDispatched, ToolResultEntry
from bot.journal.fold import fold
from bot.pii.guard import PiiGuard, PiiSettings
from bot.run.supervisor import Supervisor
from bot.tools.base import ToolResult
from bot.tools.command import CommandTool
from bot.tools.python import function_tool
from tests.fakes.processes import grandchild_tool, wait_dead
from tests.fakes.runtime import (
    Counter,
    ScriptedPrompter,
    TextArgs,
    call,
    counting_tools,
    make_runtime,
    one_call,
    reply,
)


async def run_once(tmp_path: Path, replies: list[dict[str, object]], **kw: object):  # type: ignore[no-untyped-def]
    counter = Counter()
    prompter = kw.pop("prompter", None)
    rt, rec = await make_runtime(tmp_path / "k.db", replies, counting_tools(counter), **kw)  # type: ignore[arg-type]
    sup = Supervisor(rt)
    live = await sup.start_turn("help", requested_by="U0REQ", prompter=prompter)  # type: ignore[arg-type]
    state = await sup.wait(live)
    records = await rt.store.load(live.run_id)
    await rt.store.close()
    return state, counter, records, rec


async def test_a_tool_call_then_an_answer_completes(tmp_path: Path) -> None:
    state, counter, records, _ = await run_once(
        tmp_path, [reply(call("echo", text="hi")), reply(text="done")]
    )
    assert state.result is not None
    assert state.result.status is RunStatus.COMPLETED
    assert state.result.stop_reason is StopReason.ANSWERED
    assert state.result.text == "done"
    assert counter.calls == {"echo": 1}
    kinds = [r.entry.kind for r in records]
    assert kinds == [
        "run_started",
        "user_message",
        "assistant_turn",
        "tool_result",
        "assistant_turn",
        "run_ended",
    ]
    assert [r.seq for r in records] == list(range(len(records)))


async def test_assistant_turn_is_journaled_before_the_tool_runs(tmp_path: Path) -> None:
    _state, counter, records, _ = await run_once(
        tmp_path, [reply(call("write", text="x")), reply(text="ok")]
    )
    kinds = [type(r.entry) for r in records]
    turn = kinds.index(AssistantTurnEntry)
    assert kinds[turn + 1] is ToolDispatched
    assert kinds[turn + 2] is ToolResultEntry
    assert counter.calls == {"write": 1}


async def test_unknown_tool_is_answered_and_never_dispatched(tmp_path: Path) -> None:
    state, counter, records, rec = await run_once(
        tmp_path, [reply(call("nope", text="x")), reply(text="adapted")]
    )
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    result = next(r.entry for r in records if isinstance(r.entry, ToolResultEntry))
    assert result.outcome.value == "unknown_tool"
    assert "unknown tool 'nope'" in result.output
    assert counter.calls == {}
    assert "advisory" in rec.kinds()


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ("{}", "text: Field required"),
        ('{"text": 3}', "text: Input should be a valid string"),
        # Deeper than the journal could read back in the request it would open.
        ('{"text": "v2", "x": ' + "[" * 64 + "]" * 64 + "}", "nest deeper than 64 levels"),
    ],
)
async def test_invalid_arguments_are_answered_not_dispatched(
    tmp_path: Path, arguments: str, problem: str
) -> None:
    replies = [reply({"name": "deploy", "arguments": arguments}), reply(text="ok")]
    prompter = ScriptedPrompter([DecisionKind.APPROVE])
    _state, counter, records, _ = await run_once(tmp_path, replies, prompter=prompter)
    result = next(r.entry for r in records if isinstance(r.entry, ToolResultEntry))
    assert result.outcome.value == "invalid_arguments"
    assert problem in result.output
    assert counter.calls == {}
    assert prompter.asked == []  # an operator is never asked to approve an invalid call


async def test_gated_call_without_prompter_is_refused_without_asking(tmp_path: Path) -> None:
    _state, counter, records, _ = await run_once(
        tmp_path, [reply(call("deploy", text="v2")), reply(text="could not")]
    )
    result = next(r.entry for r in records if isinstance(r.entry, ToolResultEntry))
    assert result.outcome.value == "gate_denied"
    assert "no one is present" in result.output
    assert counter.calls == {}


async def test_gated_call_approved_once_runs_once_and_writes_the_grant_after(
    tmp_path: Path,
) -> None:
    prompter = ScriptedPrompter([DecisionKind.APPROVE, DecisionKind.DENY])
    replies = [
        reply(call("deploy", text="v2")),
        reply(call("deploy", text="v3")),
        reply(text="done"),
    ]
    _state, counter, records, _ = await run_once(tmp_path, replies, prompter=prompter)
    assert counter.calls == {"deploy": 1}
    assert len(prompter.asked) == 2  # a one-shot grant does not cover another call
    kinds = [r.entry.kind for r in records]
    first_result = kinds.index("tool_result")
    assert kinds[first_result + 1] == "grant_written"
    results = [r.entry for r in records if isinstance(r.entry, ToolResultEntry)]
    assert [r.outcome.value for r in results] == ["ok", "gate_denied"]


async def test_standing_grant_covers_the_rest_of_the_run(tmp_path: Path) -> None:
    # Two gated calls in one reply ask for a plan first: taken step by step, the first call
    # asks on its own, and its standing grant covers the rest.
    prompter = ScriptedPrompter([DecisionKind.STEP_BY_STEP, DecisionKind.APPROVE_ALWAYS])
    replies = [
        reply(call("deploy", text="a"), call("deploy", text="b")),
        reply(call("deploy", text="c")),
        reply(text="done"),
    ]
    _state, counter, _, _ = await run_once(tmp_path, replies, prompter=prompter)
    assert counter.calls == {"deploy": 3}
    assert len(prompter.asked) == 2


async def test_non_zero_style_error_results_and_exits_are_counted(tmp_path: Path) -> None:
    replies = [
        reply(call("slow", text="x"), call("boom", text="y"), call("echo", text="z")),
        reply(text="done"),
    ]
    state, _counter, records, _ = await run_once(tmp_path, replies)
    assert state.result is not None
    assert state.result.outcomes == {"timeout": 1, "error": 1, "ok": 1}
    results = [r.entry for r in records if isinstance(r.entry, ToolResultEntry)]
    assert "timed out after 0.2s; the call was cancelled, and what it did so far stands" in (
        results[0].output
    )
    assert "RuntimeError: kaboom" in results[1].output


async def test_outcome_counts_sum_to_the_number_of_calls(tmp_path: Path) -> None:
    replies = [
        reply(
            call("echo", text="a"),
            call("nope"),
            {"name": "echo", "arguments": "{bad"},
            call("deploy", text="x"),
            call("boom", text="b"),
        ),
        reply(text="done"),
    ]
    state, *_ = await run_once(tmp_path, replies)
    assert state.result is not None
    assert sum(state.result.outcomes.values()) == 5


async def test_iteration_limit(tmp_path: Path) -> None:
    replies = [reply(call("echo", text=str(i))) for i in range(10)]
    state, counter, _, _ = await run_once(tmp_path, replies, budgets=Budgets(max_iterations=3))
    assert state.result is not None
    assert state.result.stop_reason is StopReason.ITERATION_LIMIT
    assert state.result.status is RunStatus.FAILED
    assert counter.calls == {"echo": 3}
    # Said with the setting to raise: a looping model's stop is read by whoever set it.
    assert state.result.error == "all 3 model turns used (budgets.max_iterations)"


async def test_tool_call_limit_stops_before_the_batch(tmp_path: Path) -> None:
    replies = [
        reply(call("echo", text="1"), call("echo", text="2")),
        reply(call("echo", text="3"), call("echo", text="4")),
    ]
    state, counter, _, _ = await run_once(tmp_path, replies, budgets=Budgets(max_tool_calls=3))
    assert state.result is not None and state.result.stop_reason is StopReason.TOOL_CALL_LIMIT
    assert counter.calls == {"echo": 2}
    assert state.result.error == (
        "the model asked for 2 tool calls, past the run's 3 (budgets.max_tool_calls; 2 made so"
        " far); none of them was run"
    )


async def test_token_budget_checked_before_a_batch(tmp_path: Path) -> None:
    usage = {"input_tokens": 600, "output_tokens": 10}
    replies = [reply(call("echo", text="1"), usage=usage), reply(text="done", usage=usage)]
    state, counter, _, _ = await run_once(tmp_path, replies, budgets=Budgets(max_tokens=500))
    assert state.result is not None and state.result.stop_reason is StopReason.TOKEN_BUDGET
    assert counter.calls == {}
    assert state.result.error == "610 of 500 tokens used (budgets.max_tokens)"


async def test_the_run_deadline_stops_the_run_at_the_next_boundary(tmp_path: Path) -> None:
    @function_tool(name="linger", idempotent=True)
    async def linger(args: TextArgs) -> str:
        """Answers after the run's deadline has passed."""
        await asyncio.sleep(0.2)
        return args.text

    replies = [reply(call("linger", text="1")), reply(call("linger", text="2"))]
    rt, _ = await make_runtime(
        tmp_path / "k.db", replies, [linger], budgets=Budgets(deadline_seconds=0.1)
    )
    sup = Supervisor(rt)
    state = await sup.wait(await sup.start_turn("go"))
    assert state.result is not None
    assert state.result.stop_reason is StopReason.DEADLINE
    assert state.result.outcomes == {"ok": 1}  # the second call was never made
    assert state.result.error == (
        "the run's deadline passed (0.1s of work, budgets.deadline_seconds)"
    )
    await rt.store.close()


async def test_token_budget_not_applied_after_a_completed_answer(tmp_path: Path) -> None:
    replies = [reply(text="the answer", usage={"input_tokens": 900, "output_tokens": 100})]
    state, *_ = await run_once(tmp_path, replies, budgets=Budgets(max_tokens=500))
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    assert state.result.usage.total == 1000


async def test_token_budget_checked_at_the_head_of_a_follow_up_turn(tmp_path: Path) -> None:
    replies = [
        reply(call("echo", text="1"), usage={"input_tokens": 400, "output_tokens": 50}),
        reply(call("echo", text="2"), usage={"input_tokens": 400, "output_tokens": 50}),
        reply(text="never asked"),
    ]
    state, counter, records, _ = await run_once(tmp_path, replies, budgets=Budgets(max_tokens=800))
    assert state.result is not None and state.result.stop_reason is StopReason.TOKEN_BUDGET
    assert counter.calls == {"echo": 1}
    assert sum(r.entry.kind == "assistant_turn" for r in records) == 2


async def test_no_progress_stops_with_evidence(tmp_path: Path) -> None:
    replies = [reply(call("echo", text="same")) for _ in range(6)]
    state, counter, _, _ = await run_once(tmp_path, replies)
    assert state.result is not None
    assert state.result.stop_reason is StopReason.NO_PROGRESS
    assert "echo" in state.result.error and "same" in state.result.error
    assert counter.calls == {"echo": 3}


async def test_no_progress_says_its_evidence_on_one_line(tmp_path: Path) -> None:
    # `kestrel run` prints the error as the line under the run's status: a command's output
    # of several lines (df, a log tail) spilled over the terminal with no marker.
    replies = [reply(call("echo", text="Filesystem Size\n/dev/vda 252G")) for _ in range(3)]
    state, *_ = await run_once(tmp_path, replies)
    assert state.result is not None
    assert "\n" not in state.result.error
    assert 'echo {"text": "Filesystem Size\\n/dev/vda 252G"}' in state.result.error
    assert "last result: Filesystem Size ⏎ /dev/vda 252G" in state.result.error


async def test_no_progress_within_one_reply_stops_there_naming_the_repeated_call(
    tmp_path: Path,
) -> None:
    # A looping model sent the same read 250 times in one reply: every one ran (a process
    # each) before the run stopped, and the stop named the batch's last call, another one.
    same = [call("echo", text="same") for _ in range(250)]
    replies = [reply(*same, call("write", text="other")), reply(text="never asked")]
    budgets = Budgets(max_tool_calls=1000)
    state, counter, _, _ = await run_once(tmp_path, replies, budgets=budgets)
    assert state.result is not None
    assert state.result.stop_reason is StopReason.NO_PROGRESS
    assert state.result.error.startswith('the same call (echo {"text": "same"}) gave the same')
    assert counter.calls == {"echo": 3}


async def test_truncated_reply_is_never_executed(tmp_path: Path) -> None:
    replies = [reply(call("write", text="half"), finish_reason="length")]
    state, counter, _, _ = await run_once(tmp_path, replies)
    assert state.result is not None
    assert state.result.stop_reason is StopReason.TRUNCATED
    assert counter.calls == {}


async def test_final_json_answer_becomes_the_payload(tmp_path: Path) -> None:
    text = 'Summary below.\n```json\n{"cause": "oom", "fixed": true}\n```'
    state, *_ = await run_once(tmp_path, [reply(text=text)])
    assert state.result is not None
    assert state.result.text == text
    assert state.result.payload == {"cause": "oom", "fixed": True}


async def test_suspend_is_polled_at_the_boundary_without_using_an_iteration(
    tmp_path: Path,
) -> None:
    counter = Counter()
    rt, _ = await make_runtime(
        tmp_path / "k.db",
        [reply(call("echo", text="1")), reply(text="done")],
        counting_tools(counter),
    )
    sup = Supervisor(rt)
    live = await sup.start_turn("hi")
    live.signals.suspend.set()
    state = await sup.wait(live)
    assert state.status is RunStatus.SUSPENDED
    assert state.iteration == 0
    resumed = await sup.resume(live.run_id)
    assert resumed is not None
    state = await sup.wait(resumed)
    assert state.result is not None and state.result.text == "done"
    assert counter.calls == {"echo": 1}
    await rt.store.close()


async def test_cancel_at_the_boundary(tmp_path: Path) -> None:
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(text="x")], [])
    sup = Supervisor(rt)
    live = await sup.start_turn("hi")
    live.signals.cancel.set()
    state = await sup.wait(live)
    assert state.result is not None and state.result.status is RunStatus.CANCELLED
    await rt.store.close()


async def test_takeover_stops_before_the_effect(tmp_path: Path) -> None:
    counter = Counter()
    store_box: list[object] = []

    async def steal(tool_call: ToolCall, ctx: HookContext) -> ToolVerdict:
        """Another owner claims the run while this call passes its checks."""
        await store_box[0].claim(ctx.run_id, "other-owner", 30, force=True)  # type: ignore[attr-defined]
        return ToolVerdict()

    rt, rec = await make_runtime(
        tmp_path / "k.db",
        [reply(call("write", text="x")), reply(text="done")],
        counting_tools(counter),
        hooks=Hooks(pre_tool_use=[steal]),
    )
    store_box.append(rt.store)
    sup = Supervisor(rt)
    live = await sup.start_turn("hi")
    await sup.wait(live)
    assert counter.calls == {}
    assert "run_taken_over" in rec.kinds()
    state = fold(await rt.store.load(live.run_id), live.run_id)
    assert state.result is None
    assert not any(isinstance(r.entry, ToolDispatched) for r in await rt.store.load(live.run_id))
    await rt.store.close()


@pytest.mark.parametrize("flags", [{"operator_paced": True, "timeout": 0.1}, {"timeout": 0}])
async def test_timeout_exemptions_operator_paced_and_none(
    tmp_path: Path, flags: dict[str, Any]
) -> None:
    @function_tool(name="wait_for_operator", **flags)
    async def wait_for_operator(args: TextArgs) -> str:
        """Takes longer than a tool timeout would allow."""
        await asyncio.sleep(0.3)
        return "the operator answered"

    replies = [reply(call("wait_for_operator", text="?")), reply(text="done")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, [wait_for_operator])
    sup = Supervisor(rt)
    state = await sup.wait(await sup.start_turn("go"))
    assert state.result is not None and state.result.outcomes == {"ok": 1}
    await rt.store.close()


async def test_a_stop_requested_as_a_tool_is_about_to_start_keeps_it_from_starting(
    tmp_path: Path,
) -> None:
    counter = Counter()
    supervisors: list[Supervisor] = []

    async def shut_down_once(tool_call: ToolCall, ctx: HookContext) -> ToolVerdict:
        """A replica's graceful shutdown arrives while this call passes its checks."""
        if counter.calls.get("stops", 0) == 0:
            counter.hit("stops")
            supervisors[0].interrupt_all(spare_tools=True)
        return ToolVerdict()

    rt, _ = await make_runtime(
        tmp_path / "k.db",
        [reply(call("echo", text="1")), reply(text="done")],
        counting_tools(counter),
        hooks=Hooks(pre_tool_use=[shut_down_once]),
    )
    supervisors.append(Supervisor(rt))
    live = await supervisors[0].start_turn("hi")
    state = await supervisors[0].wait(live)
    assert state.status is RunStatus.SUSPENDED
    assert counter.calls == {"stops": 1}  # the tool never began, not even its first step
    resumed = await supervisors[0].resume(live.run_id)
    assert resumed is not None
    state = await supervisors[0].wait(resumed)
    assert state.result is not None and state.result.text == "done"
    assert counter.calls == {"stops": 1, "echo": 1}
    await rt.store.close()


async def test_a_tool_raising_timeout_error_without_a_timeout_fails_its_call(
    tmp_path: Path,
) -> None:
    @function_tool(name="ask_operator", operator_paced=True)
    async def ask_operator(args: TextArgs) -> str:
        """Its own client gave up waiting: a TimeoutError, though no timeout was set."""
        raise TimeoutError("the operator's console did not answer")

    replies = [reply(call("ask_operator", text="?")), reply(text="done")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, [ask_operator])
    sup = Supervisor(rt)
    state = await sup.wait(await sup.start_turn("go"))
    assert state.result is not None and state.result.outcomes == {"error": 1}
    (result,) = [
        r.entry for r in await rt.store.load(state.run_id) if r.entry.kind == "tool_result"
    ]
    assert isinstance(result, ToolResultEntry)
    assert result.output == "the tool failed: TimeoutError: the operator's console did not answer"
    await rt.store.close()


async def test_a_command_past_its_timeout_is_stopped_with_its_whole_group(
    tmp_path: Path,
) -> None:
    # A command waits from its first step on: the timeout must hold it through the loop.
    pidfile = tmp_path / "pid"
    spawner = grandchild_tool("spawner", "wait", timeout=0.5)
    replies = [reply(call("spawner", pidfile=str(pidfile))), reply(text="done")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, [spawner])
    sup = Supervisor(rt)
    async with asyncio.timeout(10):  # without the tool's timeout, the command waits 60 s
        state = await sup.wait(await sup.start_turn("go"))
    assert state.result is not None and state.result.outcomes == {"timeout": 1}
    assert await wait_dead(int(pidfile.read_text()))
    await rt.store.close()


async def test_the_final_answer_is_journaled_once(tmp_path: Path) -> None:
    answer = 'Here you are:\n```json\n{"healthy": true}\n```' + " padding" * 1000
    state, _, records, _ = await run_once(tmp_path, [reply(text=answer)])

    stored = [wire.to_json(r.entry) for r in records]
    assert sum(answer[-2000:] in row for row in stored) == 1
    replayed = fold(records)
    assert replayed.result is not None
    assert replayed.result.text == answer
    assert replayed.result.payload == {"healthy": True}
    assert replayed.result == state.result


async def test_a_command_that_cannot_start_counts_as_a_failed_call(tmp_path: Path) -> None:
    missing = CommandTool("probe", "Probe", ["/nonexistent/prog"])

    state, records = await one_call(tmp_path / "k.db", missing)

    assert state.result is not None and state.result.outcomes == {"error": 1}
    (answer,) = [r.entry for r in records if isinstance(r.entry, ToolResultEntry)]
    assert (answer.outcome, answer.is_error) == (ToolOutcome.ERROR, True)
    assert answer.output.startswith("cannot start '/nonexistent/prog'")


async def test_a_tool_answering_with_no_text_fails_the_call_not_the_journal(
    tmp_path: Path,
) -> None:
    @function_tool
    async def count(args: TextArgs) -> ToolResult:
        """Answers with a number where text belongs."""
        return ToolResult(output=len(args.text))  # type: ignore[arg-type]

    state, records = await one_call(tmp_path / "k.db", count, text="abc")

    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    (answer,) = [r.entry for r in records if isinstance(r.entry, ToolResultEntry)]
    assert answer.outcome is ToolOutcome.ERROR and answer.is_error
    assert answer.output == "the tool answered with int output, is_error False, not text"


async def test_an_advisory_is_journaled_and_said_as_the_pii_guard_leaves_it(
    tmp_path: Path,
) -> None:
    # An MCP server's refused change says why, and its error may carry the server's URL
    # with a token: the journal (and the run page, the console) must not keep it.
    guard = PiiGuard(PiiSettings())
    rt, rec = await make_runtime(tmp_path / "k.db", [reply(text="done")])
    rt = msgspec.structs.replace(rt, redact=lambda text: guard.scan_output(text).text)
    secret = "q7Zt4mW9xK2pL8vN3bR6"
    rt.tools.replace(
        rt.tools.current(),
        f"MCP server ops: tool list failed: 401 for https://mcp.example/mcp?token={secret}",
    )
    sup = Supervisor(rt)
    live = await sup.start_turn("help", requested_by="U0REQ")
    state = await sup.wait(live)
    records = await rt.store.load(live.run_id)
    await rt.store.close()
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    (advisory,) = [r.entry for r in records if isinstance(r.entry, AdvisoryEntry)]
    assert advisory.text.startswith("MCP server ops: tool list failed: 401 for https://mcp")
    assert secret not in advisory.text
    said = [e.text for e in rec.events if isinstance(e, AdvisoryEvent)]
    assert said == [advisory.text]
