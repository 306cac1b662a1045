"""The panic barrier: a bug ends its run failed, RunEnd fires once, and nothing else is hurt."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from bot.domain import AssistantTurn, RunStatus, StopReason, ToolCall
from bot.events import Event, FanOut, PanicEvent, RunEndedEvent
from bot.hooks import HookContext, Hooks, ToolVerdict
from bot.llm.base import AssistantMessage, Message, Notice, ToolSpec, UserMessage
from tests.fakes.kit import Kit, RecordingModel, build_kit, results
from tests.fakes.runtime import call, reply

BUG = "list index out of range in the adapter"

Build = Callable[..., Awaitable[Kit]]


@pytest.fixture
async def kit(tmp_path: Path) -> AsyncIterator[Build]:
    made: list[Kit] = []

    async def build(model: Any, **options: Any) -> Kit:
        made.append(await build_kit(tmp_path / f"k{len(made)}.db", model, **options))
        return made[-1]

    yield build
    for done in made:
        await done.rt.store.close()


class BuggyModel(RecordingModel):
    """Plays a script, but raises a plain RuntimeError (a bug, not a ModelError) when asked to.

    A conversation whose prompt says "explode" raises on model call ``explode_at``; one that
    says "wait" holds its first call until ``release`` is set. With ``paired``, the explosion
    waits until a "wait" conversation is holding, so that run is surely mid-flight.
    """

    def __init__(
        self, replies: Sequence[Mapping[str, Any]], explode_at: int = 0, paired: bool = False
    ) -> None:
        super().__init__(replies)
        self.explode_at = explode_at
        self.paired = paired
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        timeout: float,
        *,
        notice: Notice | None = None,
    ) -> AssistantTurn:
        prompt = next(m.text for m in messages if isinstance(m, UserMessage))
        turns = sum(isinstance(m, AssistantMessage) for m in messages)
        if "explode" in prompt and turns == self.explode_at:
            if self.paired:
                await asyncio.wait_for(self.holding.wait(), timeout=5)
            raise RuntimeError(BUG)
        if "wait" in prompt and turns == 0:
            self.holding.set()
            await asyncio.wait_for(self.release.wait(), timeout=5)
        turn: AssistantTurn = await super().complete(messages, tools, timeout, notice=notice)
        return turn


class Releases:
    """An event sink that lets a held model call go once a panic has been reported."""

    def __init__(self, model: BuggyModel) -> None:
        self.model = model

    def emit(self, event: Event) -> None:
        if event.kind == "panic":
            self.model.release.set()


class RaisesOn:
    """An event sink that raises on the kinds it is given (every kind when given none)."""

    def __init__(self, *kinds: str) -> None:
        self.kinds = set(kinds)
        self.raised = 0

    def emit(self, event: Event) -> None:
        if not self.kinds or event.kind in self.kinds:
            self.raised += 1
            raise RuntimeError(f"sink broke on {event.kind}")


class PanicReportFails(FanOut):
    """An event fan-out whose delivery of the panic itself raises (the barrier must recover)."""

    def emit(self, event: Event) -> None:
        super().emit(event)
        if event.kind == "panic":
            raise RuntimeError("the panic report could not be delivered")


def assert_panicked(k: Kit, run_id: str) -> None:
    """The run ended failed with stop_reason panic, once, with the stack on the event only."""
    (result,) = k.ends.of(run_id)
    assert result.status is RunStatus.FAILED
    assert result.stop_reason is StopReason.PANIC
    assert result.error == f"internal error: RuntimeError: {BUG}"
    assert "Traceback" not in result.error and 'File "' not in result.error
    ended = [e for e in k.rec.events if isinstance(e, RunEndedEvent) and e.run_id == run_id]
    assert len(ended) == 1
    assert ended[0].result.stop_reason == "panic"


async def test_a_bug_in_the_model_ends_the_run_failed_and_a_concurrent_run_completes(
    kit: Build,
) -> None:
    model = BuggyModel([reply(call("echo", text="hi")), reply(text="all good")], paired=True)
    k = await kit(model)
    k.rt.events.add(Releases(model))
    exploding = await k.sup.start_turn("explode please")
    waiting = await k.sup.start_turn("wait for the other one")
    bad, good = await asyncio.gather(k.sup.wait(exploding), k.sup.wait(waiting))

    assert bad.result is not None and bad.result.stop_reason is StopReason.PANIC
    assert_panicked(k, exploding.run_id)
    (panic,) = [e for e in k.rec.events if isinstance(e, PanicEvent)]
    assert panic.run_id == exploding.run_id
    stack = panic.traceback
    assert stack.startswith("Traceback (most recent call last)")
    assert f"RuntimeError: {BUG}" in stack and "in complete" in stack
    record = await k.rt.store.get_run(exploding.run_id)
    assert (record.status, record.stop_reason) == (RunStatus.FAILED, "panic")

    # The other run was mid-model-call while the panic was handled, and finished after it.
    kinds = [(e.kind, e.run_id) for e in k.rec.events]
    assert kinds.index(("panic", exploding.run_id)) < kinds.index(("model_turn", waiting.run_id))
    assert good.result is not None
    assert (good.result.status, good.result.text) == (RunStatus.COMPLETED, "all good")
    assert len(k.ends.of(waiting.run_id)) == 1
    assert k.counter.calls == {"echo": 1}
    assert k.sup.live == {}


async def test_a_panic_mid_run_keeps_what_was_done(kit: Build) -> None:
    k = await kit(BuggyModel([reply(call("echo", text="x")), reply(text="never")], explode_at=1))
    state, records = await k.run("explode after one tool")
    assert_panicked(k, state.run_id)
    assert state.result is not None and state.result.outcomes == {"ok": 1}
    assert [r.output for r in results(records)] == ["x"]
    assert records[-1].entry.kind == "run_ended"


async def test_the_process_goes_on_running_runs_after_a_panic(kit: Build) -> None:
    k = await kit(BuggyModel([reply(text="fine")]))
    first, _ = await k.run("explode")
    second, _ = await k.run("hello")
    assert first.result is not None and first.result.stop_reason is StopReason.PANIC
    assert second.result is not None and second.result.status is RunStatus.COMPLETED


async def test_a_sink_raising_on_every_event_does_not_stop_runs(
    kit: Build, caplog: pytest.LogCaptureFixture
) -> None:
    broken = RaisesOn()
    k = await kit(BuggyModel([reply(call("echo", text="x")), reply(text="done")]), sinks=[broken])
    state, _ = await k.run("hello")
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    assert k.rec.kinds().count("run_ended") == 1
    assert broken.raised == len(k.rec.events)  # every event reached the other sink anyway
    assert "event sink" in caplog.text and "sink broke on run_ended" in caplog.text
    assert "panic" not in k.rec.kinds()

    panicking, _ = await k.run("explode")
    assert_panicked(k, panicking.run_id)


async def test_a_sink_raising_on_the_panic_event_still_ends_the_run(kit: Build) -> None:
    broken = RaisesOn("panic", "run_ended")
    k = await kit(BuggyModel([reply(text="never")]), sinks=[broken])
    state, _ = await k.run("explode")
    assert_panicked(k, state.run_id)
    assert broken.raised == 2
    assert k.sup.live == {}


async def test_the_panic_report_itself_failing_still_ends_the_run_once(
    kit: Build, caplog: pytest.LogCaptureFixture
) -> None:
    k = await kit(BuggyModel([reply(text="never")]))
    k.rt.events = PanicReportFails(k.rec)
    state, records = await k.run("explode")
    assert_panicked(k, state.run_id)
    assert records[-1].entry.kind == "run_ended"
    assert "the panic report could not be delivered" in caplog.text
    assert f"RuntimeError: {BUG}" in caplog.text  # the stack still reaches the log
    assert k.sup.live == {}


async def test_a_raising_tool_is_an_error_result_not_a_panic(kit: Build) -> None:
    k = await kit(BuggyModel([reply(call("boom", text="x")), reply(text="it failed")]))
    state, records = await k.run("hello")
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    (result,) = results(records)
    assert (result.outcome.value, result.is_error) == ("error", True)
    assert "RuntimeError: kaboom" in result.output
    assert k.tool_outputs_seen() == [result.output]
    assert "panic" not in k.rec.kinds()


async def test_a_raising_hook_fails_closed_not_a_panic(kit: Build) -> None:
    async def broken(tool_call: ToolCall, ctx: HookContext) -> ToolVerdict:
        raise RuntimeError("hook bug")

    k = await kit(
        BuggyModel([reply(call("write", text="x")), reply(text="denied")]),
        hooks=Hooks(pre_tool_use=[broken]),
    )
    state, records = await k.run("hello")
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    assert [r.outcome.value for r in results(records)] == ["hook_denied"]
    assert k.counter.calls == {}
    assert "panic" not in k.rec.kinds()


async def test_a_panic_fires_run_end_once_even_when_a_run_end_hook_fails(
    kit: Build, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)

    async def failing_end(*args: object) -> None:
        raise RuntimeError("RunEnd hook bug")

    k = await kit(BuggyModel([reply(text="never")]), hooks=Hooks(run_end=[failing_end]))
    state, _ = await k.run("explode")
    assert_panicked(k, state.run_id)
    assert "RunEnd hook bug" in caplog.text


async def test_a_panic_right_after_a_queued_entry_still_ends_the_run(
    kit: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The final turn is queued to commit with the run's end; a bug between the two must not
    # leave the panic's own entry racing it for the same seq (and the run "running").
    def broken(_text: str) -> None:
        raise RuntimeError(BUG)

    monkeypatch.setattr("bot.run.loop.extract_payload", broken)
    k = await kit(RecordingModel([reply(text="the answer")]))
    state, records = await k.run("hello")

    assert_panicked(k, state.run_id)
    assert [r.entry.kind for r in records][-2:] == ["assistant_turn", "run_ended"]
    record = await k.rt.store.get_run(state.run_id)
    assert (record.status, record.stop_reason) == (RunStatus.FAILED, "panic")
