"""Hooks around the loop, through the real Supervisor: deny, rewrite, order, fail closed, RunEnd."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from bot.domain import Budgets, Decision, DecisionKind, RunStatus, StopReason, ToolCall
from bot.events import ToolStartedEvent
from bot.hooks import HookContext, Hooks, PromptVerdict, ToolVerdict
from bot.journal.entries import AssistantTurnEntry, ToolDispatched, ToolResultEntry
from bot.llm.base import ToolResultsMessage, UserMessage
from bot.prompter import DeferringPrompter
from bot.run.execute import WITHHELD_BY_HOOK
from tests.fakes.kit import Ends, Kit, build_kit, results, user_messages
from tests.fakes.runtime import ScriptedPrompter, call, reply

# What a failing hook's exception says: it is for the operator, never for the model.
SECRET_CAUSE = "db password is hunter2"

Build = Callable[..., Awaitable[Kit]]


@pytest.fixture
async def kit(tmp_path: Path) -> AsyncIterator[Build]:
    made: list[Kit] = []

    async def build(replies: Sequence[Mapping[str, Any]], **options: Any) -> Kit:
        made.append(await build_kit(tmp_path / f"k{len(made)}.db", replies, **options))
        return made[-1]

    yield build
    for done in made:
        await done.rt.store.close()


# --- UserPromptSubmit ------------------------------------------------------------------------


async def test_prompt_denied_ends_the_run_failed_and_nothing_reaches_the_model(kit: Build) -> None:
    async def deny(text: str, ctx: HookContext) -> PromptVerdict:
        return PromptVerdict(allow=False, reason="not in this channel")

    k = await kit([reply(text="never")], hooks=Hooks(user_prompt_submit=[deny]))
    state, records = await k.run("deploy everything")
    assert state.result is not None
    assert state.result.status is RunStatus.FAILED
    assert state.result.stop_reason is StopReason.POLICY
    assert "not in this channel" in state.result.error
    assert k.model.calls == []
    assert user_messages(records) == []
    assert [r.entry.kind for r in records] == ["run_started", "run_ended"]
    assert len(k.ends.of(state.run_id)) == 1


async def test_prompt_rewrite_is_what_is_journaled_and_sent(kit: Build) -> None:
    async def rewrite(text: str, ctx: HookContext) -> PromptVerdict:
        return PromptVerdict(text=f"[from {ctx.requested_by}] {text}")

    k = await kit([reply(text="ok")], hooks=Hooks(user_prompt_submit=[rewrite]))
    state, records = await k.run("restart checkout")
    assert user_messages(records) == ["[from U0REQ] restart checkout"]
    (first,) = k.model.calls
    assert [m.text for m in first if isinstance(m, UserMessage)] == [
        "[from U0REQ] restart checkout"
    ]
    assert (await k.rt.store.get_run(state.run_id)).prompt == "[from U0REQ] restart checkout"


async def test_prompt_hooks_run_in_order_each_seeing_the_previous_rewrite(kit: Build) -> None:
    seen: list[tuple[str, str]] = []

    def appender(tag: str) -> Callable[[str, HookContext], Awaitable[PromptVerdict]]:
        async def hook(text: str, ctx: HookContext) -> PromptVerdict:
            seen.append((tag, text))
            return PromptVerdict(text=f"{text}+{tag}")

        return hook

    k = await kit(
        [reply(text="ok")], hooks=Hooks(user_prompt_submit=[appender("a"), appender("b")])
    )
    _state, records = await k.run("p")
    assert seen == [("a", "p"), ("b", "p+a")]
    assert user_messages(records) == ["p+a+b"]


# --- PreToolUse ------------------------------------------------------------------------------


async def test_pre_tool_deny_answers_hook_denied_and_never_runs_the_tool(kit: Build) -> None:
    async def deny_writes(tool_call: ToolCall, ctx: HookContext) -> ToolVerdict:
        if tool_call.name == "write":
            return ToolVerdict(allow=False, reason="writes are frozen")
        return ToolVerdict()

    k = await kit(
        [reply(call("write", text="x"), call("echo", text="y")), reply(text="ok")],
        hooks=Hooks(pre_tool_use=[deny_writes]),
    )
    state, records = await k.run()
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    denied, echoed = results(records)
    assert denied.outcome.value == "hook_denied"
    assert "writes are frozen" in denied.output
    assert echoed.outcome.value == "ok"
    assert k.counter.calls == {"echo": 1}
    assert not any(isinstance(r.entry, ToolDispatched) for r in records)


async def test_pre_tool_rewrite_of_arguments_is_what_the_tool_sees(kit: Build) -> None:
    async def rewrite(tool_call: ToolCall, ctx: HookContext) -> ToolVerdict:
        return ToolVerdict(arguments='{"text": "rewritten"}')

    k = await kit(
        [reply(call("echo", text="original")), reply(text="ok")],
        hooks=Hooks(pre_tool_use=[rewrite]),
    )
    _state, records = await k.run()
    (result,) = results(records)
    assert result.output == "rewritten"
    started = [e for e in k.rec.events if isinstance(e, ToolStartedEvent)]
    assert [e.arguments for e in started] == [{"text": "rewritten"}]


async def test_pre_tool_sees_the_call_the_model_asked_for(kit: Build) -> None:
    seen: list[ToolCall] = []

    async def first(tool_call: ToolCall, ctx: HookContext) -> ToolVerdict:
        seen.append(tool_call)
        return ToolVerdict(tool="write", arguments='{"text": "changed"}')

    async def second(tool_call: ToolCall, ctx: HookContext) -> ToolVerdict:
        seen.append(tool_call)
        return ToolVerdict()

    k = await kit(
        [reply(call("echo", text="asked")), reply(text="ok")],
        hooks=Hooks(pre_tool_use=[first, second]),
    )
    _state, records = await k.run()
    (asked,) = [
        c for r in records if isinstance(r.entry, AssistantTurnEntry) for c in r.entry.turn.calls
    ]
    assert seen[0] == asked  # the model's call, untouched: id, name and raw arguments
    assert (seen[1].name, seen[1].arguments) == ("write", '{"text": "changed"}')
    assert seen[1].id == asked.id
    assert k.counter.calls == {"write": 1}


async def test_rewrite_into_a_gated_tool_is_gated_without_a_prompter(kit: Build) -> None:
    async def to_deploy(tool_call: ToolCall, ctx: HookContext) -> ToolVerdict:
        return ToolVerdict(tool="deploy")

    k = await kit(
        [reply(call("echo", text="v2")), reply(text="ok")], hooks=Hooks(pre_tool_use=[to_deploy])
    )
    _state, records = await k.run()
    (result,) = results(records)
    assert result.outcome.value == "gate_denied"
    assert k.counter.calls == {}


async def test_rewrite_into_a_gated_tool_asks_about_the_effective_call(kit: Build) -> None:
    async def to_deploy(tool_call: ToolCall, ctx: HookContext) -> ToolVerdict:
        return ToolVerdict(tool="deploy")

    k = await kit(
        [reply(call("echo", text="v2")), reply(text="ok")], hooks=Hooks(pre_tool_use=[to_deploy])
    )
    prompter = ScriptedPrompter([DecisionKind.APPROVE])
    _state, records = await k.run(prompter=prompter)
    assert [(r.tool, r.arguments) for r in prompter.asked] == [("deploy", {"text": "v2"})]
    assert k.counter.calls == {"deploy": 1}
    assert results(records)[0].output == "deployed v2"


async def test_gated_original_rewritten_to_an_ungated_tool_is_still_gated(kit: Build) -> None:
    async def to_echo(tool_call: ToolCall, ctx: HookContext) -> ToolVerdict:
        return ToolVerdict(tool="echo")

    k = await kit(
        [reply(call("deploy", text="v2")), reply(text="ok")], hooks=Hooks(pre_tool_use=[to_echo])
    )
    _state, records = await k.run()
    (result,) = results(records)
    assert result.outcome.value == "gate_denied"
    assert k.counter.calls == {}


@pytest.mark.parametrize(
    ("verdict", "why"),
    [
        (ToolVerdict(tool="no_such_tool"), "unknown tool 'no_such_tool'"),
        (ToolVerdict(arguments="{not json"), "invalid JSON"),
        (ToolVerdict(tool="echo", arguments='{"text": '), "invalid JSON"),
    ],
)
async def test_malformed_rewrite_aborts_the_run_and_dispatches_nothing(
    kit: Build, verdict: ToolVerdict, why: str
) -> None:
    async def malformed(tool_call: ToolCall, ctx: HookContext) -> ToolVerdict:
        return verdict

    k = await kit(
        [reply(call("write", text="x")), reply(text="never")],
        hooks=Hooks(pre_tool_use=[malformed]),
    )
    state, records = await k.run()
    assert state.result is not None
    assert state.result.status is RunStatus.FAILED
    assert state.result.stop_reason is StopReason.HOOK_ABORT
    assert why in state.result.error
    assert k.counter.calls == {}
    assert not any(isinstance(r.entry, ToolDispatched | ToolResultEntry) for r in records)
    assert "tool_started" not in k.rec.kinds()
    assert len(k.model.calls) == 1
    assert len(k.ends.of(state.run_id)) == 1


# --- PostToolUse -----------------------------------------------------------------------------


async def test_post_tool_rewrite_reaches_the_journal_and_the_next_model_call(kit: Build) -> None:
    async def shout(tool_call: ToolCall, output: str, ctx: HookContext) -> str:
        return output.upper()

    async def keep(tool_call: ToolCall, output: str, ctx: HookContext) -> str | None:
        return None  # None leaves the output as it is

    k = await kit(
        [reply(call("echo", text="quiet")), reply(text="ok")],
        hooks=Hooks(post_tool_use=[shout, keep]),
    )
    _state, records = await k.run()
    (result,) = results(records)
    assert result.output == "QUIET"
    last = k.model.calls[1][-1]
    assert isinstance(last, ToolResultsMessage)
    assert [item.output for item in last.results] == ["QUIET"]


async def test_post_tool_hooks_run_in_order_on_the_substituted_timeout_message(
    kit: Build,
) -> None:
    seen: list[str] = []

    def tagger(tag: str) -> Callable[[ToolCall, str, HookContext], Awaitable[str]]:
        async def hook(tool_call: ToolCall, output: str, ctx: HookContext) -> str:
            seen.append(output)
            return f"{output} [{tag}]"

        return hook

    k = await kit(
        [reply(call("slow", text="x")), reply(text="ok")],
        hooks=Hooks(post_tool_use=[tagger("1"), tagger("2")]),
    )
    _state, records = await k.run()
    (result,) = results(records)
    assert seen[0].startswith("timed out after 0.2s")
    assert seen[1] == seen[0] + " [1]"
    assert result.output == seen[0] + " [1] [2]"
    assert result.outcome.value == "timeout"


# --- failing hooks fail closed ---------------------------------------------------------------


async def _raises(*args: object) -> Any:
    raise RuntimeError(SECRET_CAUSE)


async def _hangs(*args: object) -> Any:
    await asyncio.sleep(10)


@pytest.mark.parametrize("bad", [_raises, _hangs], ids=["raises", "times_out"])
async def test_failing_prompt_hook_refuses_the_prompt(kit: Build, bad: Any) -> None:
    k = await kit([reply(text="never")], hooks=Hooks(user_prompt_submit=[bad], timeout=0.05))
    state, records = await k.run("hello")
    assert state.result is not None
    assert state.result.status is RunStatus.FAILED
    assert state.result.stop_reason is StopReason.POLICY
    assert SECRET_CAUSE not in state.result.error
    assert f"policy hook {bad.__qualname__}" in state.result.error  # which one, not why
    assert k.model.calls == []
    assert user_messages(records) == []
    assert len(k.ends.of(state.run_id)) == 1
    assert "panic" not in k.rec.kinds()


@pytest.mark.parametrize("bad", [_raises, _hangs], ids=["raises", "times_out"])
async def test_failing_prompt_hook_cause_reaches_an_advisory(kit: Build, bad: Any) -> None:
    k = await kit([reply(text="never")], hooks=Hooks(user_prompt_submit=[bad], timeout=0.05))
    await k.run("hello")
    cause = SECRET_CAUSE if bad is _raises else "timed out after 0.05s"
    assert any(cause in text for text in k.advisories())


@pytest.mark.parametrize("bad", [_raises, _hangs], ids=["raises", "times_out"])
async def test_failing_pre_tool_hook_denies_the_call(
    kit: Build, bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    k = await kit(
        [reply(call("write", text="x")), reply(text="ok")],
        hooks=Hooks(pre_tool_use=[bad], timeout=0.05),
    )
    state, records = await k.run()
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    (result,) = results(records)
    assert result.outcome.value == "hook_denied"
    assert k.counter.calls == {}
    cause = SECRET_CAUSE if bad is _raises else "timed out after 0.05s"
    assert any(cause in text for text in k.advisories())
    assert cause in caplog.text
    assert cause not in result.output
    assert cause not in k.seen_by_model()
    assert "panic" not in k.rec.kinds()


async def _blocks_then_waits(*args: object) -> Any:
    # A blocking call (a synchronous HTTP client, say) past the timeout: what is tested.
    time.sleep(0.3)  # noqa: ASYNC251
    await asyncio.sleep(0.01)


async def test_a_pre_tool_hook_that_blocks_past_its_timeout_and_then_waits_denies_the_call(
    kit: Build,
) -> None:
    # The timeout counts from the call, not from the hook's first wait: its first step,
    # taken at once, is part of the time it took.
    k = await kit(
        [reply(call("write", text="x")), reply(text="ok")],
        hooks=Hooks(pre_tool_use=[_blocks_then_waits], timeout=0.2),
    )
    state, records = await k.run()
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    (result,) = results(records)
    assert result.outcome.value == "hook_denied"
    assert k.counter.calls == {}
    assert any("timed out after 0.2s" in text for text in k.advisories())


@pytest.mark.parametrize("bad", [_raises, _hangs], ids=["raises", "times_out"])
async def test_failing_post_tool_hook_withholds_the_output(
    kit: Build, bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    k = await kit(
        [reply(call("echo", text="the real output")), reply(text="ok")],
        hooks=Hooks(post_tool_use=[bad], timeout=0.05),
    )
    state, records = await k.run()
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    (result,) = results(records)
    assert result.output == WITHHELD_BY_HOOK
    assert k.counter.calls == {"echo": 1}
    cause = SECRET_CAUSE if bad is _raises else "timed out after 0.05s"
    assert any(cause in text for text in k.advisories())
    assert cause in caplog.text
    assert cause not in k.seen_by_model()
    last = k.model.calls[1][-1]
    assert isinstance(last, ToolResultsMessage)
    assert [item.output for item in last.results] == [WITHHELD_BY_HOOK]


def _sync_raises(*args: object) -> Any:
    raise ValueError(SECRET_CAUSE)


def _not_awaitable(*args: object) -> Any:
    return ToolVerdict()  # an allow, but not awaitable: it must not let the call through


async def _returns_none(*args: object) -> Any:
    return None


async def _arguments_as_dict(*args: object) -> Any:
    return ToolVerdict(arguments={"text": "x"})  # type: ignore[arg-type]


async def _tool_as_number(*args: object) -> Any:
    return ToolVerdict(tool=7)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        _sync_raises,
        _not_awaitable,
        _returns_none,
        _arguments_as_dict,
        _tool_as_number,
        lambda: None,
    ],
    ids=["sync_raises", "not_awaitable", "none", "dict_arguments", "int_tool", "wrong_arity"],
)
async def test_broken_pre_tool_hook_fails_closed_not_a_panic(kit: Build, bad: Any) -> None:
    k = await kit(
        [reply(call("write", text="x")), reply(text="ok")], hooks=Hooks(pre_tool_use=[bad])
    )
    state, records = await k.run()
    assert "panic" not in k.rec.kinds()
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    (result,) = results(records)
    assert result.outcome.value == "hook_denied"
    assert k.counter.calls == {}
    assert k.advisories()


async def _text_as_list(text: str, ctx: HookContext) -> Any:
    return PromptVerdict(text=[text])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [_sync_raises, _returns_none, lambda text, ctx: PromptVerdict(text=text), _text_as_list],
    ids=["sync_raises", "none", "not_awaitable", "list_text"],
)
async def test_broken_prompt_hook_refuses_not_a_panic(kit: Build, bad: Any) -> None:
    k = await kit([reply(text="never")], hooks=Hooks(user_prompt_submit=[bad]))
    state, _records = await k.run()
    assert "panic" not in k.rec.kinds()
    assert state.result is not None
    assert state.result.stop_reason is StopReason.POLICY
    assert k.model.calls == []
    assert len(k.ends.of(state.run_id)) == 1


async def _output_as_number(*args: object) -> Any:
    return 42


@pytest.mark.parametrize("bad", [_sync_raises, _output_as_number], ids=["sync_raises", "int"])
async def test_broken_post_tool_hook_withholds_not_a_panic(kit: Build, bad: Any) -> None:
    k = await kit(
        [reply(call("echo", text="x")), reply(text="ok")], hooks=Hooks(post_tool_use=[bad])
    )
    state, records = await k.run()
    assert "panic" not in k.rec.kinds()
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    assert [r.output for r in results(records)] == [WITHHELD_BY_HOOK]


async def test_a_hook_keeps_its_own_timeout_when_composed_with_the_guard(kit: Build) -> None:
    async def patient(tool_call: ToolCall, output: str, ctx: HookContext) -> str:
        await asyncio.sleep(0.15)
        return output + " (checked)"

    async def quick(tool_call: ToolCall, output: str, ctx: HookContext) -> str:
        await asyncio.sleep(10)
        return output

    k = await kit(
        [reply(call("echo", text="x")), reply(text="ok")],
        hooks=Hooks(post_tool_use=[patient], timeout=5.0),
    )
    k.rt.guard_hooks = lambda: Hooks(post_tool_use=[quick], timeout=0.05)
    _state, records = await k.run()
    # The caller's 5 s covers its slow hook; the guard's own 0.05 s still bounds the guard.
    assert [r.output for r in results(records)] == [WITHHELD_BY_HOOK]
    (advisory,) = k.advisories()
    assert "quick" in advisory and "0.05s" in advisory


async def test_a_caller_timeout_does_not_bound_the_guard(kit: Build) -> None:
    async def guard_scan(tool_call: ToolCall, output: str, ctx: HookContext) -> str:
        await asyncio.sleep(0.1)
        return output + " (scanned)"

    k = await kit([reply(call("echo", text="x")), reply(text="ok")], hooks=Hooks(timeout=0.02))
    k.rt.guard_hooks = lambda: Hooks(post_tool_use=[guard_scan], timeout=5.0)
    _state, records = await k.run()
    assert [r.output for r in results(records)] == ["x (scanned)"]


# --- RunEnd ----------------------------------------------------------------------------------


async def test_run_end_fires_once_on_completion(kit: Build) -> None:
    k = await kit([reply(call("echo", text="x")), reply(text="done")])
    state, _ = await k.run()
    (result,) = k.ends.of(state.run_id)
    assert result.status is RunStatus.COMPLETED and result.text == "done"
    assert k.rec.kinds().count("run_ended") == 1


async def test_run_end_fires_once_on_failure(kit: Build) -> None:
    k = await kit(
        [reply(call("echo", text=str(i))) for i in range(5)], budgets=Budgets(max_iterations=2)
    )
    state, _ = await k.run()
    (result,) = k.ends.of(state.run_id)
    assert result.stop_reason is StopReason.ITERATION_LIMIT
    assert k.rec.kinds().count("run_ended") == 1


async def test_run_end_fires_once_on_cancellation(kit: Build) -> None:
    k = await kit([reply(text="never")])
    live = await k.sup.start_turn("hi")
    live.signals.cancel.set()
    state = await k.sup.wait(live)
    (result,) = k.ends.of(state.run_id)
    assert result.status is RunStatus.CANCELLED
    assert k.model.calls == []


async def test_run_end_fires_once_at_the_end_of_a_suspend_and_resume(kit: Build) -> None:
    k = await kit([reply(call("echo", text="1")), reply(text="done")])
    live = await k.sup.start_turn("hi")
    live.signals.suspend.set()
    state = await k.sup.wait(live)
    assert state.status is RunStatus.SUSPENDED
    assert k.ends.seen == []
    resumed = await k.sup.resume(live.run_id)
    assert resumed is not None
    await k.sup.wait(resumed)
    (result,) = k.ends.of(live.run_id)
    assert result.status is RunStatus.COMPLETED and result.text == "done"


async def test_run_end_fires_once_after_a_deferred_approval_is_answered(kit: Build) -> None:
    k = await kit([reply(call("deploy", text="v2")), reply(text="deployed")])
    state, _ = await k.run(prompter=DeferringPrompter())
    assert state.status is RunStatus.SUSPENDED
    assert k.ends.seen == []
    (request,) = state.open_requests
    decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0BOSS")
    assert (await k.sup.answer(decision, run_id=state.run_id)).ready
    resumed = await k.sup.resume(state.run_id)
    assert resumed is not None
    await k.sup.wait(resumed)
    (result,) = k.ends.of(state.run_id)
    assert result.status is RunStatus.COMPLETED
    assert k.counter.calls == {"deploy": 1}


async def test_run_end_fires_once_when_a_suspended_run_is_cancelled(kit: Build) -> None:
    k = await kit([reply(call("deploy", text="v2")), reply(text="never")])
    state, _ = await k.run(prompter=DeferringPrompter())
    assert await k.sup.cancel(state.run_id, by="U0REQ") == "cancelled"
    (result,) = k.ends.of(state.run_id)
    assert result.status is RunStatus.CANCELLED


async def test_a_failing_run_end_hook_does_not_stop_the_others(
    kit: Build, caplog: pytest.LogCaptureFixture
) -> None:
    later = Ends()
    k = await kit([reply(text="done")], hooks=Hooks(run_end=[_raises, _sync_raises, later]))
    state, _ = await k.run()
    assert len(later.of(state.run_id)) == 1
    assert len(k.ends.of(state.run_id)) == 1
    assert k.rec.kinds().count("run_ended") == 1
    assert "panic" not in k.rec.kinds()
    assert SECRET_CAUSE in caplog.text
