"""The supervisor: shutdown's tool grace, resumes that race, suspends that find their
answers, deadlines that take the lease."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from bot import logs, wire
from bot.chat.service import ChatService
from bot.config.settings import DeadlineSettings
from bot.domain import (
    TERMINAL_STATUSES,
    AssistantTurn,
    Decision,
    DecisionKind,
    Request,
    RequestMaker,
    RequestStatus,
    RunStatus,
    Session,
    StopReason,
    TerminalResult,
    ToolCall,
    utcnow,
)
from bot.errors import CancelRefused, ResumeRefused, StoreError, UnreadableJournal
from bot.events import AnswerSuppliedEvent, Event, RunResumedEvent, ToolStartedEvent
from bot.hooks import HookContext, Hooks
from bot.journal.entries import (
    AdvisoryEntry,
    AssistantTurnEntry,
    Entry,
    RunEnded,
    RunResumed,
    RunStarted,
    RunSuspended,
    ToolDeferred,
    ToolDispatched,
    ToolResultEntry,
    UserMessageEntry,
)
from bot.journal.fold import RunState, fold
from bot.journal.log import JournalRecord
from bot.journal.writer import RunJournal
from bot.kinds import AuditAction, RequestKind
from bot.llm.scripted import ScriptedProvider
from bot.people.policy import Actor, Policy, PolicyRules
from bot.prompter import DeferringPrompter
from bot.records import RunRecord
from bot.replica.schedule import Scheduler
from bot.replica.work import WorkTaker
from bot.run.cancel import STOPPING_HERE
from bot.run.runtime import Runtime
from bot.run.supervisor import LiveRun, Supervisor, cancel_key
from bot.tools.base import Tool, ToolFlags, ToolTraits
from bot.tools.command import CommandTool
from bot.tools.python import function_tool
from bot.tools.source import ToolSource
from bot.tools.toolset import ToolSet
from storage.sql_store import migrated
from storage.sqlite import SqliteStore
from tests.fakes.clock import MovingClock
from tests.fakes.runtime import (
    Counter,
    ScriptedPrompter,
    call,
    counting_tools,
    make_runtime,
    reply,
)
from tests.fakes.waiting import until


class Nap(BaseModel):
    """How long to sleep."""

    seconds: float


@function_tool(name="nap", idempotent=True, timeout=0)
async def nap(args: Nap) -> str:
    """Sleep, then say so."""
    await asyncio.sleep(args.seconds)
    return "rested"


class ToolStarted:
    """Sets an event when a tool starts."""

    def __init__(self, started: asyncio.Event) -> None:
        self.started = started

    def emit(self, event: Event) -> None:
        """Watch for the tool's start."""
        if isinstance(event, ToolStartedEvent):
            self.started.set()


async def shut_down_during(tmp_path: Path, seconds: float, grace: float) -> list[Entry]:
    """Start a run whose tool naps ``seconds``, shut down with ``grace``; the journal."""
    replies = [reply(call("nap", seconds=seconds)), reply(text="done")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, [nap])
    started = asyncio.Event()
    rt.events.add(ToolStarted(started))
    supervisor = Supervisor(rt)
    live = await supervisor.start_turn("rest", prompter=None)
    await started.wait()
    handed_back = await supervisor.shutdown(tool_grace=grace)
    entries = [r.entry for r in await rt.store.load(live.run_id)]
    await rt.store.close()
    assert handed_back == [live.run_id]
    return entries


async def test_a_tool_that_finishes_within_the_grace_keeps_its_result(tmp_path: Path) -> None:
    entries = await shut_down_during(tmp_path, seconds=0.1, grace=10)

    assert [e.output for e in entries if isinstance(e, ToolResultEntry)] == ["rested"]
    (suspended,) = [e for e in entries if isinstance(e, RunSuspended)]
    assert suspended.reason is StopReason.INTERRUPTED


async def test_a_call_a_shutdown_kept_from_starting_runs_on_resume_without_asking(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    counter = Counter()
    replies = [reply(call("nap", seconds=0.1), call("write", text="x")), reply(text="done")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, [nap, *counting_tools(counter)])
    opened.append(rt)
    started = asyncio.Event()
    rt.events.add(ToolStarted(started))
    stopping = Supervisor(rt)
    live = await stopping.start_turn("rest, then write", prompter=None)
    await started.wait()
    # The nap finishes within the grace; the write after it in the batch never starts.
    assert await stopping.shutdown(tool_grace=10) == [live.run_id]
    assert counter.calls == {}

    taking_up = Supervisor(rt)
    resumed = await taking_up.resume(live.run_id)
    assert resumed is not None
    state = await taking_up.wait(resumed)

    # Nothing was in flight: the write runs, once, with no uncertain effect for on-call.
    assert state.result is not None and state.result.status is RunStatus.COMPLETED, state.result
    assert counter.calls == {"write": 1}
    assert "wait_effect" not in json.dumps(
        [wire.to_plain(r.entry) for r in await rt.store.load(live.run_id)]
    )


class StoppedAsItDispatches(SqliteStore):
    """The real store, where a stop is asked (``stop``) while a dispatch record is written."""

    stop: Callable[[], None] | None = None

    def submit(self, run_id: str, seq: int, epoch: int, entry: Entry) -> asyncio.Future[None]:
        """Queue the append; ask for the stop, once, as a dispatch record goes to disk."""
        done = super().submit(run_id, seq, epoch, entry)
        if isinstance(entry, ToolDispatched) and self.stop is not None:
            stop, self.stop = self.stop, None
            stop()
        return done


async def test_a_call_whose_dispatch_a_shutdown_met_runs_once_and_asks_nobody(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    counter = Counter()
    store = await migrated(StoppedAsItDispatches(tmp_path / "k.db"))
    tools = ToolSource(ToolSet(counting_tools(counter)))
    model = ScriptedProvider.from_replies([reply(call("write", text="x")), reply(text="done")])
    rt = Runtime(store=store, model=model, tools=tools, owner="replica-a")
    opened.append(rt)
    stopping = Supervisor(rt)
    store.stop = lambda: stopping.interrupt_all(spare_tools=True)  # a graceful shutdown's
    live = await stopping.start_turn("write", prompter=None)
    await stopping.wait(live)
    assert store.stop is None and live.signals.interrupt.requested

    resumed = await Supervisor(rt).resume(live.run_id)
    assert resumed is not None
    state = await Supervisor(rt).wait(resumed)

    # Its dispatch was journaled: it was under way, and ran then, once; nothing is uncertain.
    assert state.result is not None and state.result.status is RunStatus.COMPLETED, state.result
    assert counter.calls == {"write": 1}
    assert "wait_effect" not in json.dumps(
        [wire.to_plain(r.entry) for r in await rt.store.load(live.run_id)]
    )


class BlinkingStore(SqliteStore):
    """The real store, whose first lease renewal fails as a store that blinked would."""

    blinked = False
    renewed = 0  # renewals that held the lease since the blink

    async def renew(self, run_id: str, owner: str, epoch: int, lease_seconds: float) -> bool:
        """Fail once, then renew."""
        if not self.blinked:
            self.blinked = True
            raise StoreError("the database is unreachable")
        held = await super().renew(run_id, owner, epoch, lease_seconds)
        self.renewed += held
        return held


async def test_a_lease_is_still_renewed_after_one_renewal_failed(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # A lease of 3 s, renewed every second: the renewal after the blink has a second to land
    # before the lease runs out. With 0.3 s it had 0.1 s, which a loaded machine's pause
    # outlasted, and the sweep below adopted a run whose renewals were fine.
    counter, release = Counter(), asyncio.Event()
    replies = [reply(call("hold"), call("write", text="x")), reply(text="done")]
    store = await migrated(BlinkingStore(tmp_path / "k.db"))
    tools = ToolSource(ToolSet([holding_tool(release), *counting_tools(counter)]))
    model = ScriptedProvider.from_replies(replies, name="test")
    rt = Runtime(store=store, model=model, tools=tools, owner="replica-a", lease_seconds=3)
    other, _ = await make_runtime(
        tmp_path / "k.db", [], counting_tools(counter), owner="replica-b", lease_seconds=3
    )
    opened += [rt, other]
    owner, sweeper = Supervisor(rt), Supervisor(other)
    live = await owner.start_turn("hold, then write", prompter=None)

    # Another replica sweeps for orphans all the while the call is held, until the lease has
    # been renewed twice since the blink: a renewal loop that gave up would never get there.
    adopted: list[str] = []

    async def swept() -> bool:
        adopted.extend(await sweeper.adopt_orphans())
        return store.renewed >= 2

    await until(swept)
    release.set()
    state = await owner.wait(live)

    assert store.blinked
    assert adopted == []
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    assert counter.calls == {"write": 1}


async def _napping(
    tmp_path: Path, opened: list[Runtime]
) -> tuple[Supervisor, LiveRun, asyncio.Event]:
    """A run started whose one tool naps 0.2 s, then answers "done"; the event is set as the
    tool starts."""
    replies = [reply(call("nap", seconds=0.2)), reply(text="done")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, [nap])
    opened.append(rt)
    started = asyncio.Event()
    rt.events.add(ToolStarted(started))
    supervisor = Supervisor(rt)
    return supervisor, await supervisor.start_turn("rest", prompter=None), started


async def test_a_waiter_cancelled_leaves_the_run_to_go_on(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # Ctrl-C on ``kestrel run`` cancels its wait, not the run: shutdown stops that.
    supervisor, live, started = await _napping(tmp_path, opened)
    waiting = asyncio.create_task(supervisor.wait(live))
    await started.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting

    state = await supervisor.wait(live)

    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    assert state.result.text == "done"


async def test_cancelled_waiters_leave_nothing_on_the_run(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # A long run waited on and given up many times (Ctrl-C on a console) must not keep a
    # callback per waiter until it ends. ``_callbacks`` is CPython's list of a future's.
    supervisor, live, started = await _napping(tmp_path, opened)
    await started.wait()
    assert live.task is not None
    before = len(live.task._callbacks or ())
    for _ in range(5):
        waiting = asyncio.create_task(supervisor.wait(live))
        await asyncio.sleep(0)  # one pass of the loop: the waiter reaches its await
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    assert len(live.task._callbacks or ()) == before
    state = await supervisor.wait(live)
    assert state.result is not None and state.result.status is RunStatus.COMPLETED


async def test_a_tool_still_running_after_the_grace_is_cut(tmp_path: Path) -> None:
    entries = await asyncio.wait_for(shut_down_during(tmp_path, seconds=60, grace=0.2), 10)

    assert not [e for e in entries if isinstance(e, ToolResultEntry)]
    (suspended,) = [e for e in entries if isinstance(e, RunSuspended)]
    assert suspended.reason is StopReason.INTERRUPTED


async def test_a_run_started_during_the_grace_is_handed_back_too(tmp_path: Path) -> None:
    # A replica taking a turn while it stops: that run is stopped and handed back as well, not
    # left suspended with no owner.
    replies = [reply(call("nap", seconds=60)), reply(call("nap", seconds=60))]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, [nap])
    started = asyncio.Event()
    rt.events.add(ToolStarted(started))
    supervisor = Supervisor(rt)
    first = await supervisor.start_turn("rest", prompter=None)
    await started.wait()
    stopping = asyncio.create_task(supervisor.shutdown(tool_grace=0.5))
    late = await supervisor.start_turn("rest again", prompter=None)
    handed_back = await asyncio.wait_for(stopping, 20)
    assert sorted(handed_back) == sorted([first.run_id, late.run_id])
    for run_id in (first.run_id, late.run_id):
        record = await rt.store.get_run(run_id)
        assert record.status is RunStatus.SUSPENDED and not record.owner
    await rt.store.close()


async def handed_back_and_not_queued(tmp_path: Path, opened: list[Runtime]) -> tuple[Runtime, str]:
    """A run that replica-a handed back as it stopped, cutting its tool; replica-a then died
    before it queued the run's resume (no work item says the run waits)."""
    replies = [reply(call("nap", seconds=0.2)), reply(text="rested")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, [nap], owner="replica-a")
    opened.append(rt)
    run_id = await handed_back_mid_tool(rt, "rest")
    record = await rt.store.get_run(run_id)
    assert record.status is RunStatus.SUSPENDED and record.stop_reason == "handed_back"
    assert record.owner == "" and await rt.store.take_work("replica-a", 10) == []
    return rt, run_id


async def handed_back_mid_tool(rt: Runtime, prompt: str, requested_by: str = "") -> str:
    """Start a turn on ``rt`` and, once its tool runs, stop as a replica does (hand_back):
    the run's id, handed back."""
    started = asyncio.Event()
    rt.events.add(ToolStarted(started))
    supervisor = Supervisor(rt)
    prompter = DeferringPrompter() if requested_by else None
    live = await supervisor.start_turn(prompt, requested_by=requested_by, prompter=prompter)
    await started.wait()
    assert await supervisor.shutdown(hand_back=True) == [live.run_id]
    return live.run_id


async def replica(tmp_path: Path, owner: str, opened: list[Runtime]) -> Supervisor:
    """Another replica on the same store, whose model answers the cut run's next turn."""
    rt, _ = await make_runtime(
        tmp_path / "k.db", [reply(text="rested")], [nap], owner=owner, lease_seconds=0.3
    )
    opened.append(rt)
    return Supervisor(rt)


async def test_a_run_handed_back_by_a_replica_that_died_is_adopted(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, run_id = await handed_back_and_not_queued(tmp_path, opened)
    other = await replica(tmp_path, "replica-b", opened)

    assert await other.adopt_orphans() == [run_id]

    assert (await other.wait(other.live[run_id])).status is RunStatus.COMPLETED
    assert await rt.store.orphaned_runs() == []


async def test_a_sweep_cut_by_its_replica_stopping_leaves_the_run_to_the_next(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, run_id = await handed_back_and_not_queued(tmp_path, opened)
    stopping = await replica(tmp_path, "replica-b", opened)
    claim = stopping.rt.store.claim

    async def claimed_as_it_stops(*args: Any) -> Any:
        epoch = await claim(*args)
        await stopping.shutdown(hand_back=True)  # SIGTERM between the sweep's look and claim
        return epoch

    setattr(stopping.rt.store, "claim", claimed_as_it_stops)  # noqa: B010 (a method, patched)
    assert await stopping.adopt_orphans() == []
    # Its claim is left to expire: given back, the run would be hidden from every sweep.
    assert (await rt.store.get_run(run_id)).owner == "replica-b"
    survivor = await replica(tmp_path, "replica-c", opened)

    assert await until(survivor.adopt_orphans) == [run_id]

    assert (await survivor.wait(survivor.live[run_id])).status is RunStatus.COMPLETED


# --- resumes that race, suspends that find their answers, deadlines that take the lease ---


@pytest.fixture
async def opened() -> AsyncIterator[list[Runtime]]:
    """Runtimes a test opened, their stores closed after it, passed or failed (an open store's
    thread would keep the test process from exiting)."""
    runtimes: list[Runtime] = []
    yield runtimes
    for rt in runtimes:
        await rt.store.close()


async def waiting_for_approval(
    tmp_path: Path,
    opened: list[Runtime],
    *extra: Tool,
    first: dict[str, Any] | None = None,
) -> tuple[Runtime, Supervisor, Counter, str]:
    """A run that asked for ``deploy`` (and whatever ``first`` adds to its batch), started
    where people can be asked later."""
    counter = Counter()
    calls = [call("deploy", text="v2"), *([first] if first else [])]
    replies = [reply(*calls), reply(text="finished")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, [*counting_tools(counter), *extra])
    opened.append(rt)
    sup = Supervisor(rt)
    live = await sup.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    return rt, sup, counter, live.run_id


def approval(request: Request, by: str = "U0APPROVER") -> Decision:
    """Approve ``request`` once."""
    return Decision(request_id=request.id, kind=DecisionKind.APPROVE, by=by)


async def kinds_of(rt: Runtime, run_id: str) -> list[str]:
    """The run's journal, entry kinds in order."""
    return [r.entry.kind for r in await rt.store.load(run_id)]


async def test_a_claimed_resume_after_the_run_ended_asks_the_model_nothing(
    tmp_path: Path,
    opened: list[Runtime],
) -> None:
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    (request,) = (await sup.wait(sup.live[run_id])).open_requests
    answered = await sup.answer(approval(request), run_id=run_id)
    assert answered.claimed is not None
    # A plain resume (a sweep, work taken) gets there first and ends the run...
    live = await sup.resume(run_id)
    assert live is not None
    assert (await sup.wait(live)).result is not None

    # ...then the decider's own resume, with the lease it took, finds nothing left to do.
    assert await sup.resume(run_id, claimed=answered.claimed) is None

    kinds = await kinds_of(rt, run_id)
    assert kinds.count("assistant_turn") == 2
    assert kinds.count("run_resumed") == 1
    assert kinds.count("run_ended") == 1
    assert counter.calls == {"deploy": 1}


async def test_a_resume_after_an_answer_given_here_reads_its_request_once(
    tmp_path: Path,
    opened: list[Runtime],
) -> None:
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    (request,) = (await sup.wait(sup.live[run_id])).open_requests
    assert isinstance(rt.store, SqliteStore)
    seen: list[str] = []
    rt.store._writer()._conn.set_trace_callback(seen.append)

    answered = await sup.answer(approval(request), run_id=run_id)
    live = await sup.resume(run_id, claimed=answered.claimed)
    assert live is not None
    assert (await sup.wait(live)).result is not None

    # The decider read it to check the decision; the resume takes the answer it closed it with.
    read = f"SELECT id, body, status, decision FROM requests WHERE id = '{request.id}'"
    assert seen.count(read) == 1
    assert counter.calls == {"deploy": 1}
    supplied = [r.entry for r in await rt.store.load(run_id) if r.entry.kind == "answer_supplied"]
    assert [entry.decision.by for entry in supplied] == ["U0APPROVER"]


async def test_racing_resumes_in_one_process_drive_the_run_once(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    (request,) = (await sup.wait(sup.live[run_id])).open_requests
    answered = await sup.answer(approval(request), run_id=run_id)

    lives = await asyncio.gather(
        sup.resume(run_id), sup.resume(run_id, claimed=answered.claimed), sup.resume(run_id)
    )

    assert len({id(live) for live in lives}) == 1
    assert lives[0] is not None
    assert (await sup.wait(lives[0])).result is not None
    kinds = await kinds_of(rt, run_id)
    assert kinds.count("assistant_turn") == 2
    assert kinds.count("run_resumed") == 1
    assert counter.calls == {"deploy": 1}


class Held(BaseModel):
    """Nothing to say."""


def holding_tool(release: asyncio.Event) -> Tool:
    """``hold``: a tool that runs until ``release`` is set."""

    @function_tool(name="hold", idempotent=True, timeout=0)
    async def hold(args: Held) -> str:
        """Wait for the test."""
        await release.wait()
        return "held"

    return hold


async def card_out_while_running(
    tmp_path: Path, opened: list[Runtime]
) -> tuple[Runtime, Supervisor, Counter, str, Request, asyncio.Event]:
    """A run whose approval card is out while the batch's next call (``hold``) still runs."""
    release = asyncio.Event()
    rt, sup, counter, run_id = await waiting_for_approval(
        tmp_path, opened, holding_tool(release), first=call("hold")
    )
    await until(lambda: has_open_requests(rt, run_id))
    (request, _status, _decision) = (await rt.store.list_requests(run_id=run_id))[0]
    return rt, sup, counter, run_id, request, release


async def test_a_request_answered_while_its_run_still_ran_lets_it_go_on(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id, request, release = await card_out_while_running(tmp_path, opened)
    # The approval card is out while the batch's next call still runs: someone clicks.
    decided = await ChatService(sup).decide(
        run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
    )
    assert decided.accepted
    release.set()

    await until(lambda: has_ended(rt, run_id))

    state = fold(await rt.store.load(run_id), run_id)
    assert state.result is not None and state.result.text == "finished"
    assert counter.calls == {"deploy": 1}


def recording_tool(release: asyncio.Event, counter: Counter) -> Tool:
    """``record``: an effect (not idempotent) that runs until ``release`` is set."""

    @function_tool(name="record", idempotent=False, timeout=0)
    async def record(args: Held) -> str:
        """Record something once the test lets it."""
        await release.wait()
        counter.hit("record")
        return "recorded"

    return record


async def test_an_approval_while_the_runs_own_lease_lapsed_leaves_it_to_its_task(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    clock, release, counter = MovingClock(), asyncio.Event(), Counter()
    replies = [reply(call("deploy", text="v2"), call("record")), reply(text="finished")]
    tools = [*counting_tools(counter), recording_tool(release, counter)]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, tools, clock=clock)
    opened.append(rt)
    sup = Supervisor(rt)
    live = await sup.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    await until(lambda: has_open_requests(rt, live.run_id))
    (request, _status, _decision) = (await rt.store.list_requests(run_id=live.run_id))[0]
    # The card is out while ``record`` runs, and the run's lease lapses meanwhile: its renewal
    # is late (a starved process). Nobody else took the run: its own task still drives it.
    clock.advance(rt.lease_seconds + 1)

    deciding = asyncio.ensure_future(
        ChatService(sup).decide(
            live.run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
        )
    )
    await until(lambda: audited(rt, live.run_id, "approve"))
    release.set()
    decided = await deciding
    await sup.wait(decided.resumed or live)
    await sup.wait(live)

    state = fold(await rt.store.load(live.run_id), live.run_id)
    # The batch's own task kept its call's result: nobody is asked whether it ran.
    assert [r.kind for r in state.open_requests] == []
    assert state.result is not None and state.result.text == "finished"
    assert counter.calls == {"deploy": 1, "record": 1}
    assert not await audited(rt, live.run_id, "taken_over")
    assert decided.accepted


class PausedLook(SqliteStore):
    """The real store, where the run's own task (once ``armed``) waits for ``go`` at its
    first look at a request: the look its suspend takes at what it waits on."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.armed, self.reached, self.go = "", asyncio.Event(), asyncio.Event()

    async def get_request(self, request_id: str) -> tuple[Request, RequestStatus, Decision | None]:
        """Pause the armed run's task here once, then read."""
        task = asyncio.current_task()
        if self.armed and task is not None and task.get_name() == self.armed:
            self.armed = ""
            self.reached.set()
            await self.go.wait()
        return await super().get_request(request_id)


async def test_an_approval_between_the_suspend_and_its_look_resumes_the_run_once(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    release, counter = asyncio.Event(), Counter()
    store = await migrated(PausedLook(tmp_path / "k.db"))
    replies = [reply(call("deploy", text="v2"), call("hold")), reply(text="finished")]
    model = ScriptedProvider.from_replies(replies, name="test")
    tools = ToolSource(ToolSet([*counting_tools(counter), holding_tool(release)]))
    rt = Runtime(store=store, model=model, tools=tools, owner="test-owner")
    opened.append(rt)
    sup = Supervisor(rt)
    live = await sup.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    await until(lambda: has_open_requests(rt, live.run_id))
    (request, _status, _decision) = (await rt.store.list_requests(run_id=live.run_id))[0]
    store.armed = live.run_id
    release.set()
    # The run suspended (its lease given up with it) and has not looked at its card yet.
    await store.reached.wait()
    assert (await rt.store.get_run(live.run_id)).status is RunStatus.SUSPENDED

    decided = await ChatService(sup).decide(
        live.run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
    )
    store.go.set()
    await sup.wait(live)
    if decided.resumed is not None:
        await sup.wait(decided.resumed)

    state = fold(await rt.store.load(live.run_id), live.run_id)
    assert state.result is not None and state.result.text == "finished"
    assert counter.calls == {"deploy": 1}
    assert [r.entry.kind for r in await rt.store.load(live.run_id)].count("run_resumed") == 1
    assert decided.accepted


async def audited(rt: Runtime, run_id: str, action: str) -> bool:
    """Whether the audit holds ``action`` on the run."""
    return action in [a.action for a in await rt.store.list_audit(run_id=run_id)]


async def has_open_requests(rt: Runtime, run_id: str) -> bool:
    """Whether the store holds an open request of the run."""
    return bool(await rt.store.list_requests(run_id=run_id))


async def has_ended(rt: Runtime, run_id: str) -> bool:
    """Whether the run's row says it ended."""
    return (await rt.store.get_run(run_id)).status in TERMINAL_STATUSES


async def cancels_audited(rt: Runtime, run_id: str) -> list[str]:
    """Who the audit says cancelled the run, or was refused a cancel of it, once per line."""
    audited = await rt.store.list_audit(run_id=run_id)
    return [a.actor for a in audited if a.action in ("cancel", "cancel_refused")]


async def test_expiring_the_last_request_takes_the_lease_for_the_resume(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    (request,) = (await sup.wait(sup.live[run_id])).open_requests

    settled = await sup.decisions.expire(request)

    assert settled.won and settled.epoch is not None
    record = await rt.store.get_run(run_id)
    assert (record.owner, record.epoch) == (rt.owner, settled.epoch)
    # Had this process died here, the run would be an orphan that adoption finds.
    assert not (await sup.decisions.expire(request)).won
    live = await sup.resume(run_id, claimed=settled.epoch)
    assert live is not None
    state = await sup.wait(live)
    assert state.result is not None and counter.calls == {}


async def test_an_expiry_whose_run_cannot_resume_is_still_an_expiry(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    (request,) = (await sup.wait(sup.live[run_id])).open_requests
    rt.system_prompt = "changed since the run started"  # its resume needs --force now
    later = (request.deadline or utcnow()) + timedelta(seconds=1)
    scheduler = Scheduler(sup, DeadlineSettings(), [], store=rt.store, clock=lambda: later)

    assert await scheduler.sweep() == ([request.id], [])

    record = await rt.store.get_run(run_id)
    assert record.status is RunStatus.SUSPENDED and record.owner == ""
    assert counter.calls == {}


async def test_a_run_whose_resume_was_refused_after_its_answer_is_left_to_a_person(
    tmp_path: Path, opened: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    (request,) = (await sup.wait(sup.live[run_id])).open_requests
    rt.system_prompt = "changed since the run started"  # its resume needs --force now
    later = (request.deadline or utcnow()) + timedelta(seconds=1)
    scheduler = Scheduler(sup, DeadlineSettings(), [], store=rt.store, clock=lambda: later)
    assert await scheduler.sweep() == ([request.id], [])

    # Every adoption sweep after: none takes it up, nor is refused it again and again.
    with caplog.at_level(logging.INFO, logger="kestrel"):
        assert await sup.adopt_orphans() == []
        assert await sup.adopt_orphans() == []
    assert not [r for r in caplog.records if "not adopting" in r.getMessage()]
    assert await rt.store.orphaned_runs() == []
    assert counter.calls == {}


class DurableAtEmission:
    """A sink that, when a resume or an answer is said, reads the journal from another
    connection: what the event names must already be committed."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.seen: list[tuple[str, int]] = []

    def emit(self, event: Event) -> None:
        """Count the entry the event names, as another reader sees the file now."""
        kinds = {RunResumedEvent: "run_resumed", AnswerSuppliedEvent: "answer_supplied"}
        kind = kinds.get(type(event))
        if kind is None:
            return
        with sqlite3.connect(self.db) as conn:
            (count,) = conn.execute(
                "SELECT COUNT(*) FROM journal WHERE run_id = ? AND kind = ?",
                (event.run_id, kind),
            ).fetchone()
        self.seen.append((kind, count))


async def test_a_resume_and_an_answer_are_said_once_durable(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    (request,) = (await sup.wait(sup.live[run_id])).open_requests
    sink = DurableAtEmission(tmp_path / "k.db")
    rt.events.add(sink)

    decided = await ChatService(sup).decide(
        run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
    )
    assert decided.resumed is not None
    await sup.wait(decided.resumed)

    assert sink.seen == [("run_resumed", 1), ("answer_supplied", 1)]
    assert counter.calls == {"deploy": 1}


async def test_a_decision_for_a_run_live_in_another_process_stands(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, _sup, counter, run_id, request, release = await card_out_while_running(tmp_path, opened)
    # A second replica on the same store takes the click while the first still runs the batch.
    other, _ = await make_runtime(tmp_path / "k.db", [], counting_tools(Counter()), owner="other")
    opened.append(other)

    decided = await ChatService(Supervisor(other)).decide(
        run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
    )

    assert decided.accepted and decided.resumed is None
    assert "not resumed here" in decided.message
    release.set()
    await until(lambda: has_ended(rt, run_id))
    assert counter.calls == {"deploy": 1}


async def test_a_cancel_taken_while_the_run_ran_ends_it_at_its_suspend(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id, request, release = await card_out_while_running(tmp_path, opened)
    chat = ChatService(sup)
    assert (await chat.decide(run_id, request.id, DecisionKind.APPROVE, user=Actor("U0A"))).accepted
    assert await chat.cancel(run_id, user=Actor("U0REQ")) == STOPPING_HERE
    # The batch ends in a wait before any loop boundary: the cancel still holds there.
    release.set()

    await until(lambda: has_ended(rt, run_id))

    record = await rt.store.get_run(run_id)
    assert record.status is RunStatus.CANCELLED
    assert counter.calls == {}
    assert await rt.store.list_requests(run_id=run_id) == []
    assert await cancels_audited(rt, run_id) == ["U0REQ"]  # one cancel, audited once


async def test_a_cancel_taken_while_a_call_runs_starts_no_other_call_of_its_batch(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    counter, release = Counter(), asyncio.Event()
    batch = reply(call("hold"), call("write", text="after"), call("deploy", text="v2"))
    tools = [*counting_tools(counter), holding_tool(release)]
    rt, seen = await make_runtime(tmp_path / "k.db", [batch, reply(text="finished")], tools)
    opened.append(rt)
    sup = Supervisor(rt)
    live = await sup.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    await until(lambda: "tool_started" in seen.kinds())
    # On-call cancels while the batch's first call still runs: the calls after it are moot.
    assert await sup.cancel(live.run_id, by="U0REQ") == STOPPING_HERE
    release.set()

    await sup.wait(live)

    assert (await rt.store.get_run(live.run_id)).status is RunStatus.CANCELLED
    assert counter.calls == {}
    assert await rt.store.list_requests(run_id=live.run_id) == []
    # Ended, never paused: the thread is not told to resume a run someone cancelled.
    assert "run_suspended" not in seen.kinds()


async def test_a_cancelled_run_whose_command_a_shutdown_cut_says_its_outcome_is_unknown(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    release = asyncio.Event()

    @function_tool(name="migrate", idempotent=False, timeout=0)
    async def migrate(args: Held) -> str:
        """A consequential step that runs until the test lets it finish."""
        await release.wait()
        return "migrated"

    rt, seen = await make_runtime(tmp_path / "k.db", [reply(call("migrate"))], [migrate])
    opened.append(rt)
    sup = Supervisor(rt)
    live = await sup.start_turn("migrate", requested_by="U0REQ", prompter=None)
    await until(lambda: "tool_started" in seen.kinds())
    await sup.cancel(live.run_id, by="U0REQ")  # the step under way is let finish...

    await sup.shutdown(tool_grace=0)  # ...until a stop that spares nothing cuts it

    state = fold(await rt.store.load(live.run_id), live.run_id)
    assert state.result is not None and state.result.status is RunStatus.CANCELLED
    assert "migrate had started" in state.result.error, state.result.error


async def test_a_cancel_from_another_process_stops_the_run_where_it_runs(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    counter, release = Counter(), asyncio.Event()
    batch = reply(call("hold"), call("write", text="after"))
    tools = [*counting_tools(counter), holding_tool(release)]
    replies = [batch, reply(text="finished")]
    rt, seen = await make_runtime(tmp_path / "k.db", replies, tools, lease_seconds=0.3)
    terminal, _ = await make_runtime(tmp_path / "k.db", [], owner="terminal")
    opened += [rt, terminal]
    serving = Supervisor(rt)
    live = await serving.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    await until(lambda: "tool_started" in seen.kinds())

    # `kestrel runs cancel` at a terminal, while `kestrel serve` runs the batch's first call.
    said = await Supervisor(terminal).cancel(live.run_id, by="U0REQ")
    assert said.startswith("cancelling:"), said
    await until(lambda: live.signals.cancel.is_set())  # read at its next lease renewal
    release.set()
    await serving.wait(live)

    record = await rt.store.get_run(live.run_id)
    assert record.status is RunStatus.CANCELLED
    assert counter.calls == {}  # the write after the cancel never started
    state = fold(await rt.store.load(live.run_id), live.run_id)
    assert state.result is not None and "on request" in state.result.error


async def test_a_run_asked_to_cancel_that_suspends_first_is_cancelled_at_its_suspend(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # A lease of 30 s: the driver renews it (and reads the cancel) only in 10 s.
    rt, _sup, counter, run_id, _request, release = await card_out_while_running(tmp_path, opened)
    terminal, _ = await make_runtime(tmp_path / "k.db", [], owner="terminal")
    opened.append(terminal)
    said = await Supervisor(terminal).cancel(run_id, by="U0REQ")
    assert said.startswith("cancelling:"), said

    release.set()  # the batch ends waiting on its card: the run suspends, the cancel read then
    await until(lambda: has_ended(rt, run_id))

    assert (await rt.store.get_run(run_id)).status is RunStatus.CANCELLED
    assert await rt.store.list_requests(run_id=run_id) == []  # the card closed with it
    assert counter.calls == {}
    assert await cancels_audited(rt, run_id) == ["U0REQ"]  # asked once, neither refused nor again


async def test_a_run_asked_to_cancel_is_cancelled_by_whoever_resumes_it(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    (request,) = (await sup.wait(sup.live[run_id])).open_requests
    # The cancel was asked while another process held the run, which died before it read it.
    await rt.store.mark_once(cancel_key(run_id))
    await rt.store.audit("U0ONCALL", AuditAction.CANCEL, run_id=run_id, detail="asked")

    decided = await ChatService(sup).decide(
        run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
    )
    if decided.resumed is not None:
        await sup.wait(decided.resumed)

    record = await rt.store.get_run(run_id)
    assert record.status is RunStatus.CANCELLED
    assert counter.calls == {}
    state = fold(await rt.store.load(run_id), run_id)
    assert state.result is not None and state.result.error == "cancelled by U0ONCALL"
    assert await cancels_audited(rt, run_id) == ["U0ONCALL"]  # as asked, not again as ended


class RacedClaims(SqliteStore):
    """The real store, where something else happens (``first``) just before the next claim."""

    first: Callable[[], Awaitable[object]] | None = None

    async def claim(
        self, run_id: str, owner: str, lease_seconds: float, *, force: bool = False
    ) -> int | None:
        """Let ``first`` happen, once, then claim."""
        first, self.first = self.first, None
        if first is not None:
            await first()
        return await super().claim(run_id, owner, lease_seconds, force=force)


async def test_a_cancel_whose_run_ended_as_it_claimed_it_ends_nothing_twice(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    (request,) = (await sup.wait(sup.live[run_id])).open_requests
    store = await migrated(RacedClaims(tmp_path / "k.db"))
    model = ScriptedProvider.from_replies([], name="test")
    other = Runtime(store=store, model=model, tools=rt.tools, owner="terminal")
    opened.append(other)

    async def approved_and_finished() -> None:
        decided = await ChatService(sup).decide(
            run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
        )
        assert decided.resumed is not None
        await sup.wait(decided.resumed)

    # The run is approved, deploys and completes between the cancel's look and its claim.
    store.first = approved_and_finished
    with pytest.raises(CancelRefused, match="already ended \\(completed\\)"):
        await Supervisor(other).cancel(run_id, by="U0REQ")

    assert (await rt.store.get_run(run_id)).status is RunStatus.COMPLETED
    assert (await kinds_of(rt, run_id)).count("run_ended") == 1
    assert counter.calls == {"deploy": 1}


class RacedMark(SqliteStore):
    """The real store, where something else happens (``then``) just after a once-mark."""

    then: Callable[[], Awaitable[object]] | None = None

    async def mark_once(self, key: str) -> bool:
        """Mark, then let ``then`` happen, once."""
        marked = await super().mark_once(key)
        then, self.then = self.then, None
        if then is not None:
            await then()
        return marked


async def test_a_cancel_carried_to_a_decider_that_ends_the_run_is_said_done_once(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    (request,) = (await sup.wait(sup.live[run_id])).open_requests
    answered = await sup.answer(approval(request), run_id=run_id)
    assert answered.claimed is not None  # the decider holds the run, about to resume it
    store = await migrated(RacedMark(tmp_path / "k.db"))
    model = ScriptedProvider.from_replies([], name="test")
    other = Runtime(store=store, model=model, tools=rt.tools, owner="terminal")
    opened.append(other)

    async def resumed_by_the_decider() -> None:
        live = await sup.resume(run_id, claimed=answered.claimed)
        assert live is not None
        await sup.wait(live)

    # The cancel finds the run held and carries it; the decider's resume reads it and ends it.
    store.then = resumed_by_the_decider
    said = await Supervisor(other).cancel(run_id, by="U0REQ")

    assert said == "cancelled"
    assert counter.calls == {}
    state = fold(await rt.store.load(run_id), run_id)
    assert state.result is not None and state.result.error == "cancelled by U0REQ"
    assert await cancels_audited(rt, run_id) == ["U0REQ"]


async def test_waiting_on_a_run_follows_it_past_a_suspend_that_found_its_answers(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    _rt, sup, counter, run_id, request, release = await card_out_while_running(tmp_path, opened)
    first = sup.live[run_id]
    assert (await sup.answer(approval(request), run_id=run_id)).accepted
    release.set()

    state = await sup.wait(first)  # as `kestrel run --defer` waits on the run it started

    assert state.result is not None and state.result.text == "finished"
    assert counter.calls == {"deploy": 1}


async def test_shutdown_hands_back_a_run_whose_answers_came_while_it_ran(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id, request, _release = await card_out_while_running(tmp_path, opened)
    assert (await sup.answer(approval(request), run_id=run_id)).accepted

    handed_back = await sup.shutdown()  # `hold` is cut; the run suspends, told to

    assert handed_back == [run_id]
    assert not sup.live and counter.calls == {}
    assert (await rt.store.get_run(run_id)).status is RunStatus.SUSPENDED


async def test_a_resume_taken_by_a_stopping_replica_is_left_for_a_live_one(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, _counter, run_id, request, _release = await card_out_while_running(tmp_path, opened)
    assert (await sup.answer(approval(request), run_id=run_id)).accepted
    assert await sup.shutdown() == [run_id]  # suspended and released: to be taken up
    await rt.store.enqueue_work("resume", {"run_id": run_id})
    # Another replica takes the resume just as it starts to stop: it may not drive the run.
    stopping = Supervisor(rt)
    await stopping.shutdown()
    taker = WorkTaker(stopping, rt.store)
    (item,) = await rt.store.take_work("replica-b", 1)
    await taker._handle(item)
    assert (await rt.store.get_run(run_id)).owner == ""
    # Not finished: a live replica takes it up once it is older than a lease.
    (again,) = await rt.store.take_work("replica-c", 1, retake_after=0)
    assert again.id == item.id and again.payload == {"run_id": run_id}


async def test_an_answer_given_on_resume_is_audited_only_if_it_closed_the_request(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, _counter, run_id = await waiting_for_approval(tmp_path, opened)
    (request,) = (await sup.wait(sup.live[run_id])).open_requests

    class SlowConsole:
        """Shows the prompt on /resume; someone approves in chat before the answer is typed."""

        present = True

        async def ask(self, asked: Request) -> Decision | None:
            assert (await sup.answer(approval(asked, by="U0SLACK"), run_id=run_id)).accepted
            return approval(asked, by="U0CONSOLE")

    await sup.decisions.ask_again(fold(await rt.store.load(run_id), run_id), SlowConsole())

    audited = [(a.actor, a.action) for a in await rt.store.list_audit(run_id=run_id)]
    assert audited.count(("U0SLACK", "approve")) == 1
    assert ("U0CONSOLE", "approve") not in audited
    _, _, decision = await rt.store.get_request(request.id)
    assert decision is not None and decision.by == "U0SLACK"


async def orphan(rt: Runtime, run_id: str, text: str) -> None:
    """A run whose owner died right after dispatching ``write`` (lease gone at once)."""
    await rt.store.ensure_session(Session(id=f"ses_{run_id}"))
    record = RunRecord(id=run_id, session_id=f"ses_{run_id}")
    epoch = await rt.store.create_run(record, "dead", 0.0)
    journal = RunJournal(rt.store, RunState(run_id), epoch)
    arguments = json.dumps({"text": text})
    turn = AssistantTurn(calls=(ToolCall(id=f"call_{text}", name="write", arguments=arguments),))
    for entry in (
        RunStarted(run_id=run_id, session_id=f"ses_{run_id}", fingerprint=rt.fingerprint()),
        UserMessageEntry(text="write"),
        AssistantTurnEntry(iteration=0, turn=turn),
        ToolDispatched(call_id=f"call_{text}", tool="write"),
    ):
        await journal.append(entry)


# A reply that ends the run, and how it ends it (a cut one's call is never run).
ENDING_REPLIES = [
    (AssistantTurn(text="All good."), RunStatus.COMPLETED, StopReason.ANSWERED, "All good."),
    (
        AssistantTurn(
            text="Writing it",
            calls=(ToolCall(id="call_cut", name="write", arguments='{"text": "x"}'),),
            finish_reason="length",
        ),
        RunStatus.FAILED,
        StopReason.TRUNCATED,
        "Writing it",
    ),
]


@pytest.mark.parametrize(("turn", "status", "reason", "text"), ENDING_REPLIES)
async def test_an_orphan_whose_reply_ended_it_ends_so_without_asking_the_model_again(
    tmp_path: Path,
    opened: list[Runtime],
    turn: AssistantTurn,
    status: RunStatus,
    reason: StopReason,
    text: str,
) -> None:
    counter = Counter()
    rt, _ = await make_runtime(
        tmp_path / "k.db", [reply(text="Asked again.")], counting_tools(counter)
    )
    opened.append(rt)
    # Its owner died with the reply durable and the run's end not (on PostgreSQL each append
    # commits on its own; or its lease was taken between the two).
    await rt.store.ensure_session(Session(id="ses_1"))
    epoch = await rt.store.create_run(RunRecord(id="run_1", session_id="ses_1"), "dead", 0.0)
    journal = RunJournal(rt.store, RunState("run_1"), epoch)
    for entry in (
        RunStarted(run_id="run_1", session_id="ses_1", fingerprint=rt.fingerprint()),
        UserMessageEntry(text="how is it?"),
        AssistantTurnEntry(iteration=0, turn=turn),
    ):
        await journal.append(entry)
    sup = Supervisor(rt)

    assert await sup.adopt_orphans() == ["run_1"]
    state = await sup.wait(sup.live["run_1"])

    assert state.result is not None
    assert (state.result.status, state.result.stop_reason) == (status, reason)
    assert state.result.text == text  # the reply it had, as a live run ends with it
    kinds = await kinds_of(rt, "run_1")
    assert kinds.count("assistant_turn") == 1  # the model was not asked again
    assert counter.calls == {}


async def test_a_journal_no_process_can_read_holds_up_no_other_adoption(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    counter = Counter()
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(text="x")], counting_tools(counter))
    opened.append(rt)
    await orphan(rt, "run_bad", "a")  # the older orphan: the first a sweep comes to
    await orphan(rt, "run_good", "b")
    with sqlite3.connect(tmp_path / "k.db") as conn:  # cut short, as a bad copy or hand edit
        conn.execute(
            "UPDATE journal SET body = substr(body, 1, 20) WHERE run_id = 'run_bad' AND seq = 3"
        )

    adopted = await Supervisor(rt).adopt_orphans()

    assert adopted == ["run_good"]
    assert (await rt.store.get_run("run_bad")).status is RunStatus.RUNNING  # left as it was
    assert counter.calls == {}  # the good run's uncertain effect waits for on-call


async def test_a_journal_missing_an_entry_is_refused_not_read_past(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    counter = Counter()
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(text="x")], counting_tools(counter))
    opened.append(rt)
    await orphan(rt, "run_gap", "a")
    journal = RunJournal(rt.store, fold(await rt.store.load("run_gap"), "run_gap"), 1)
    await journal.append(AdvisoryEntry(text="noted after the dispatch"))
    with sqlite3.connect(tmp_path / "k.db") as conn:  # a partial copy, a hand edit
        conn.execute("DELETE FROM journal WHERE run_id = 'run_gap' AND seq = 3")

    with pytest.raises(UnreadableJournal, match="seq 3 is missing"):
        await Supervisor(rt).resume("run_gap")

    # Read past, the lost dispatch record would have let the write run a second time.
    assert counter.calls == {}


async def test_an_earlier_run_that_cannot_be_read_keeps_no_new_turn_from_starting(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(text="answered")])
    opened.append(rt)
    sup = Supervisor(rt)
    session = Session(id="ses_thread")
    earlier = []
    for prompt in ("first question", "second question"):
        earlier.append((await sup.wait(await sup.start_turn(prompt, session=session))).run_id)
    with sqlite3.connect(tmp_path / "k.db") as conn:  # the older run's, cut short on disk
        cut = "UPDATE journal SET body = substr(body, 1, 20) WHERE run_id = ? AND seq = 1"
        conn.execute(cut, (earlier[0],))

    state = await sup.wait(await sup.start_turn("third question", session=session))

    # The thread's history holds what can be read; the turn is not refused for the rest.
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    assert state.started is not None
    assert state.started.history == (("user", "second question"), ("assistant", "answered"))


async def two_waiting_one_unreadable(
    tmp_path: Path, opened: list[Runtime], lease_seconds: float = 30.0
) -> tuple[Runtime, Supervisor, Counter, list[tuple[str, Request]]]:
    """Two runs waiting for approval (the first's request the older), the first's journal
    then cut short on disk, as a bad copy or a hand edit leaves it."""
    counter = Counter()
    replies = [reply(call("deploy", text="v1")), reply(text="not deployed")]  # for each run
    rt, _ = await make_runtime(
        tmp_path / "k.db", replies, counting_tools(counter), lease_seconds=lease_seconds
    )
    opened.append(rt)
    sup = Supervisor(rt)
    waiting = []
    for prompt in ("ship v1", "ship v2"):
        live = await sup.start_turn(prompt, requested_by="U0REQ", prompter=DeferringPrompter())
        (request,) = (await sup.wait(live)).open_requests
        waiting.append((live.run_id, request))
    with sqlite3.connect(tmp_path / "k.db") as conn:
        conn.execute(
            "UPDATE journal SET body = substr(body, 1, 20) WHERE run_id = ? AND seq = 1",
            (waiting[0][0],),
        )
    return rt, sup, counter, waiting


async def test_a_cancel_of_a_run_whose_journal_cannot_be_read_leaves_it_free(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, _counter, waiting = await two_waiting_one_unreadable(tmp_path, opened)
    run_id = waiting[0][0]

    with pytest.raises(UnreadableJournal, match="seq 1 is unreadable"):
        await sup.cancel(run_id, by="U0REQ")

    # Not claimed by a process that could do nothing with it: another is told the same, not
    # that the run is held until a lease runs out.
    assert (await rt.store.get_run(run_id)).owner == ""
    other, _ = await make_runtime(tmp_path / "k.db", [], owner="replica-b")
    opened.append(other)
    with pytest.raises(UnreadableJournal, match="seq 1 is unreadable"):
        await Supervisor(other).cancel(run_id, by="U0REQ")


async def test_an_approval_of_a_run_whose_journal_cannot_be_read_stands_and_says_so(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, waiting = await two_waiting_one_unreadable(tmp_path, opened)
    run_id, request = waiting[0]

    decided = await ChatService(sup).decide(
        run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
    )

    assert decided.accepted and decided.resumed is None
    assert "not resumed here" in decided.message and "unreadable" in decided.message
    _, status, decision = await rt.store.get_request(request.id)
    assert status is RequestStatus.ANSWERED and decision is not None  # it counted, as said
    assert counter.calls == {}


async def test_a_journal_no_process_can_read_holds_up_no_other_expiry(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, waiting = await two_waiting_one_unreadable(tmp_path, opened)
    (_, first), (good, second) = waiting
    later = (second.deadline or utcnow()) + timedelta(seconds=1)
    scheduler = Scheduler(sup, DeadlineSettings(), [], store=rt.store, clock=lambda: later)

    expired, _ = await scheduler.sweep()

    assert expired == [first.id, second.id]  # each expiry stands, resumed or not
    await until(lambda: has_ended(rt, good))
    assert counter.calls == {}


async def test_a_journal_no_process_can_read_holds_up_no_other_resume_work(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, waiting = await two_waiting_one_unreadable(tmp_path, opened, 0.3)
    for run_id, request in waiting:  # answered where the run's lease was not taken
        assert await rt.store.decide(approval(request), RequestStatus.ANSWERED)
        await rt.store.enqueue_work("resume", {"run_id": run_id})
    taker = WorkTaker(sup, rt.store, poll=0.05)
    taking = asyncio.create_task(taker.run())

    await until(lambda: has_ended(rt, waiting[1][0]), timeout=10)

    taker.stop()
    await taking
    assert counter.calls == {"deploy": 1}
    assert await rt.store.take_work("probe", retake_after=0) == []  # the bad one dropped too


async def test_a_handed_back_run_taken_by_its_work_item_and_a_sweep_at_once_runs_once(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # Replica-a handed a run back as it stopped, cutting its nap, and queued its resume. Replica
    # b takes the work item as replica c's sweep adopts it: both have looked before either
    # claims; one drives it, and its consequential `write` runs once.
    counter, release = Counter(), asyncio.Event()
    tools = [holding_tool(release), *counting_tools(counter)]
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(call("hold"))], tools)
    opened.append(rt)
    run_id = await handed_back_mid_tool(rt, "rest")
    release.set()  # the cut `hold` is done again at once
    await WorkTaker(Supervisor(rt), rt.store).submit_resume(run_id)
    assert await rt.store.orphaned_runs() == [run_id]  # and swept too

    supervisors = []
    for owner in ("replica-b", "replica-c"):
        # The model's replies by iteration: the first was the handing replica's.
        replies = [reply(call("hold")), reply(call("write", text="x")), reply(text="written")]
        other, _ = await make_runtime(tmp_path / "k.db", replies, tools, owner=owner)
        opened.append(other)
        claim = other.store.claim

        async def late_claim(*args: Any, claim: Any = claim) -> Any:
            await asyncio.sleep(0.05)  # the other has looked too
            return await claim(*args)

        setattr(other.store, "claim", late_claim)  # noqa: B010 (a method, patched)
        supervisors.append(Supervisor(other))
    taking, sweeping = supervisors
    (item,) = await rt.store.take_work("replica-b", 1)

    _, adopted = await asyncio.gather(
        WorkTaker(taking, taking.rt.store)._handle(item), sweeping.adopt_orphans()
    )

    await until(lambda: has_ended(rt, run_id))
    state = fold(await rt.store.load(run_id), run_id)
    assert state.result is not None and state.result.text == "written"
    resumes = [r.entry for r in await rt.store.load(run_id) if r.entry.kind == "run_resumed"]
    assert adopted == [run_id] if resumes[0].owner == "replica-c" else adopted == []
    assert counter.calls == {"write": 1}
    kinds = await kinds_of(rt, run_id)
    assert kinds.count("run_resumed") == 1 and kinds.count("run_ended") == 1
    assert await rt.store.take_work("replica-c", 1, retake_after=0) == []  # item finished


async def test_an_answer_that_finds_a_sweeps_claim_about_to_be_given_back_is_not_lost(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # Replica c's sweep looks at a handed-back run; replica b takes it up first (its work item)
    # and it suspends on an approval; c claims it, finds nothing to do and gives the claim back,
    # but the approval (on replica d) lands between the two: d finds the lease held by c and
    # leaves the run to it. The run must not be left suspended, released and hidden from every
    # sweep (its lease's epoch above its journal's last), with nothing open and no work queued.
    counter, release = Counter(), asyncio.Event()
    tools = [holding_tool(release), *counting_tools(counter)]
    replies = [reply(call("hold")), reply(call("deploy", text="v2")), reply(text="finished")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, tools, owner="replica-a")
    opened.append(rt)
    run_id = await handed_back_mid_tool(rt, "ship it", requested_by="U0REQ")
    release.set()

    async def other(owner: str) -> Supervisor:
        made, _ = await make_runtime(tmp_path / "k.db", replies, tools, owner=owner)
        opened.append(made)
        return Supervisor(made)

    b, c, d, e = [await other(f"replica-{name}") for name in "bcde"]
    claim, give_back = c.rt.store.claim, c.rt.store.release
    firsts: list[str] = []

    async def b_first(*args: Any) -> Any:
        if not firsts:
            firsts.append("b")
            moved = await b.resume(run_id)
            assert moved is not None and (await b.wait(moved)).open_requests
        return await claim(*args)

    async def answered_first(*args: Any) -> Any:
        if firsts == ["b"]:
            firsts.append("d")
            ((request, _, _),) = await rt.store.list_requests(run_id=run_id)
            decided = await ChatService(d).decide(
                run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
            )
            assert decided.accepted and decided.resumed is None  # c holds the lease
        return await give_back(*args)

    setattr(c.rt.store, "claim", b_first)  # noqa: B010 (a method, patched)
    setattr(c.rt.store, "release", answered_first)  # noqa: B010 (a method, patched)
    await c.adopt_orphans()
    assert firsts == ["b", "d"]

    async def taken_up() -> bool:
        await e.adopt_orphans()
        return await has_ended(rt, run_id)

    await until(taken_up, timeout=5)
    assert counter.calls == {"deploy": 1}


async def test_a_handed_back_run_no_replica_may_resume_is_left_to_a_person(
    tmp_path: Path, opened: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    # A rolling restart onto a new version whose system prompt changed: the run a stopping
    # replica handed back takes --force now. Refused once, it is left to a person (as before
    # it was handed back `handed_back`), not refused at every sweep of every replica, at the
    # head of the sweep's oldest-first list, where enough of them hid every other orphan.
    rt, run_id = await handed_back_and_not_queued(tmp_path, opened)
    other = await replica(tmp_path, "replica-b", opened)
    other.rt.system_prompt = "changed since the run started"

    assert await other.adopt_orphans() == []

    with caplog.at_level(logging.INFO, logger="kestrel"):
        assert await other.adopt_orphans() == []
    assert not [r for r in caplog.records if "not adopting" in r.getMessage()]
    assert await rt.store.orphaned_runs() == []
    record = await rt.store.get_run(run_id)
    assert record.status is RunStatus.SUSPENDED and record.owner == ""
    live = await other.resume(run_id, force=True)  # a person still may
    assert live is not None
    assert (await other.wait(live)).status is RunStatus.COMPLETED


async def test_a_forced_resume_is_what_later_resumes_compare_with(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # Each step a process of its own, as commands and replicas are. An upgrade changed what the
    # run started with: one --force accepts it, and a decision on a request asked since resumes
    # the run as any would (each needed its own --force); a change after the accepted one
    # needs one again.
    counter = Counter()
    calls = [reply(call("deploy", text=f"v{n}")) for n in (2, 3, 4)]

    async def process(system_prompt: str = "") -> Supervisor:
        rt, _ = await make_runtime(
            tmp_path / "k.db", [*calls, reply(text="done")], counting_tools(counter)
        )
        opened.append(rt)
        rt.system_prompt = system_prompt or rt.system_prompt
        return Supervisor(rt)

    async def decided(sup: Supervisor, run_id: str) -> LiveRun | None:
        ((request, _, _),) = await sup.rt.store.list_requests(run_id=run_id)
        answered = await sup.answer(approval(request), run_id=run_id)
        return await sup.resume(run_id, claimed=answered.claimed)

    first = await process()
    live = await first.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    run_id = live.run_id
    await first.wait(live)

    upgraded = await process("an upgrade's prompt")
    with pytest.raises(ResumeRefused, match="resume with --force"):
        await decided(upgraded, run_id)
    forced = await upgraded.resume(run_id, force=True)
    assert forced is not None and (await upgraded.wait(forced)).open_requests
    again = await process("an upgrade's prompt")
    resumed = await decided(again, run_id)  # asked since the --force: no --force again
    assert resumed is not None and (await again.wait(resumed)).open_requests
    assert counter.calls == {"deploy": 2}

    next_upgrade = await process("the next upgrade's prompt")
    with pytest.raises(ResumeRefused, match="resume with --force"):
        await decided(next_upgrade, run_id)
    last = await next_upgrade.resume(run_id, force=True)
    assert last is not None
    assert (await next_upgrade.wait(last)).status is RunStatus.COMPLETED
    assert counter.calls == {"deploy": 3}
    entries = [r.entry for r in await next_upgrade.rt.store.load(run_id)]
    forced_with = [e.fingerprint for e in entries if isinstance(e, RunResumed) and e.forced]
    assert forced_with == [again.rt.fingerprint(), next_upgrade.rt.fingerprint()]


async def test_a_resume_refused_after_a_forced_one_says_what_it_compared_with(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # Forced on by a process configured otherwise (an operator's checkout), the run is then
    # refused by one configured as it started (a serving replica): "changed since the run
    # started" was said of a configuration that had not.
    calls = [reply(call("deploy", text=f"v{n}")) for n in (2, 3)]

    async def process(system_prompt: str = "") -> Supervisor:
        rt, _ = await make_runtime(
            tmp_path / "k.db", [*calls, reply(text="done")], counting_tools(Counter())
        )
        opened.append(rt)
        rt.system_prompt = system_prompt or rt.system_prompt
        return Supervisor(rt)

    async def decided(sup: Supervisor, run_id: str, force: bool = False) -> LiveRun | None:
        ((request, _, _),) = await sup.rt.store.list_requests(run_id=run_id)
        answered = await sup.answer(approval(request), run_id=run_id)
        return await sup.resume(run_id, claimed=answered.claimed, force=force)

    first = await process()
    live = await first.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    await first.wait(live)
    operator = await process("the operator's prompt")
    forced = await decided(operator, live.run_id, force=True)
    assert forced is not None and (await operator.wait(forced)).open_requests
    replica = await process()
    said = "the system prompt changed since it was forced on; resume with --force"
    with pytest.raises(ResumeRefused, match=said):
        await decided(replica, live.run_id)


async def test_a_decision_taken_by_a_stopping_replica_is_resumed_once_its_lease_expires(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # Replica b takes the approval's click as it stops: its claim, taken with the decision, is
    # left to expire. Until then a person's resume is told who holds the run; then a live
    # replica's sweep adopts it, and the approved deploy runs once.
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    (request,) = (await sup.wait(sup.live[run_id])).open_requests
    replies = [reply(call("deploy", text="v2")), reply(text="finished")]
    made, _ = await make_runtime(
        tmp_path / "k.db", replies, counting_tools(counter), owner="replica-b", lease_seconds=0.5
    )
    opened.append(made)
    stopping = Supervisor(made)
    await stopping.shutdown(hand_back=True)
    decided = await ChatService(stopping).decide(
        run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
    )
    assert decided.accepted and decided.resumed is None
    assert (await rt.store.get_run(run_id)).owner == "replica-b"
    with pytest.raises(ResumeRefused, match="held by replica-b"):
        await sup.resume(run_id)

    adopted = await until(sup.adopt_orphans)

    assert adopted == [run_id]
    state = await sup.wait(sup.live[run_id])
    assert state.result is not None and state.result.text == "finished"
    assert counter.calls == {"deploy": 1}


async def test_a_turn_taken_after_shutdown_returned_is_handed_back_not_run(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # `kestrel serve` queues the handed-back runs' resumes and stops its chat front after
    # `shutdown` returned: a Slack event or a work item handled meanwhile starts a turn there.
    # Nothing interrupts it any more: it would run its tools until the process exits and
    # kills them. It suspends at once, handed back, for a live replica's sweep to adopt.
    counter = Counter()
    replies = [reply(call("write", text="x")), reply(text="written")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, counting_tools(counter))
    opened.append(rt)
    stopping = Supervisor(rt)
    assert await stopping.shutdown(hand_back=True) == []

    live = await stopping.start_turn("write x", prompter=None)
    state = await asyncio.wait_for(stopping.wait(live), 10)

    assert state.status is RunStatus.SUSPENDED and counter.calls == {}
    record = await rt.store.get_run(live.run_id)
    assert record.stop_reason == "handed_back" and record.owner == ""
    other = await replica(tmp_path, "replica-b", opened)
    other.rt.tools = rt.tools
    assert await other.adopt_orphans() == [live.run_id]


async def test_a_run_a_person_stopped_is_adopted_by_no_replica(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # Ctrl-C at `kestrel run` or `kestrel chat` on a store replicas share: the run waits for
    # that person's resume, whatever the replicas' sweeps find.
    release = asyncio.Event()
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(call("hold"))], [holding_tool(release)])
    opened.append(rt)
    started = asyncio.Event()
    rt.events.add(ToolStarted(started))
    supervisor = Supervisor(rt)
    chat = ChatService(supervisor)
    live = await supervisor.start_turn("hold on", prompter=None)
    await started.wait()

    chat.interrupt(live)
    await supervisor.shutdown()  # as `kestrel chat` leaves

    record = await rt.store.get_run(live.run_id)
    assert record.stop_reason == "interrupted" and record.owner == ""
    assert await rt.store.orphaned_runs() == []
    other = await replica(tmp_path, "replica-b", opened)
    other.rt.tools = rt.tools  # it could resume the run, were it an orphan
    assert await other.adopt_orphans() == []


async def test_a_command_killed_after_the_grace_is_named_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "started"
    slow = CommandTool(
        "slow_check",
        "Checks, slowly.",
        ["/bin/sh", "-c", ': > "$0"; exec sleep 60', str(marker)],
        flags=ToolFlags(traits=ToolTraits(idempotent=True, timeout=120)),
    )
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(call("slow_check"))], [slow])
    supervisor = Supervisor(rt)
    live = await supervisor.start_turn("check", prompter=None)
    await until(marker.exists)
    caplog.set_level(logging.WARNING, logger="kestrel.supervisor")
    handed_back = await asyncio.wait_for(supervisor.shutdown(tool_grace=0.2, hand_back=True), 10)
    await rt.store.close()
    assert handed_back == [live.run_id]
    said = [r.getMessage() for r in caplog.records if r.name == "kestrel.supervisor"]
    assert said == [
        f"run {live.run_id}: tool slow_check was killed after the shutdown grace period"
        " (0.2 s, replica.shutdown_grace_seconds); what it did so far stands"
    ]


async def test_a_tool_that_finishes_within_the_grace_is_not_said_killed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kestrel.supervisor")
    await shut_down_during(tmp_path, seconds=0.1, grace=10)
    assert [r for r in caplog.records if r.name == "kestrel.supervisor"] == []


async def test_a_persons_pause_is_not_turned_into_a_hand_back_by_sigterm(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # Ctrl-C at a chat on a store replicas share, then SIGTERM to that process before the run
    # reached its suspend: the person's pause wins. The run suspends `interrupted`, is not
    # queued for another replica, and no sweep adopts it.
    release = asyncio.Event()
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(call("hold"))], [holding_tool(release)])
    opened.append(rt)
    started = asyncio.Event()
    rt.events.add(ToolStarted(started))
    supervisor = Supervisor(rt)
    live = await supervisor.start_turn("hold on", prompter=None)
    await started.wait()

    ChatService(supervisor).interrupt(live)
    handed_back = await supervisor.shutdown(hand_back=True)

    record = await rt.store.get_run(live.run_id)
    assert record.stop_reason == "interrupted" and record.owner == ""
    assert handed_back == []
    assert await rt.store.orphaned_runs() == []
    other = await replica(tmp_path, "replica-b", opened)
    other.rt.tools = rt.tools
    assert await other.adopt_orphans() == []


async def test_a_running_orphan_that_takes_force_is_claimed_by_one_sweep_only(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # Its owner died mid-run and the system prompt changed since: the first sweep is refused
    # and leaves it to a person. The next ones leave it alone, its epoch as it was, and still
    # adopt the orphans behind it.
    counter = Counter()
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(text="x")], counting_tools(counter))
    opened.append(rt)
    await orphan(rt, "run_forced", "a")
    started_with, rt.system_prompt = rt.system_prompt, "changed since the run started"
    supervisor = Supervisor(rt)
    assert await supervisor.adopt_orphans() == []
    epoch = (await rt.store.get_run("run_forced")).epoch

    for _ in range(3):
        assert await supervisor.adopt_orphans() == []

    record = await rt.store.get_run("run_forced")
    assert (record.epoch, record.owner, record.status) == (epoch, "", RunStatus.RUNNING)
    rt.system_prompt = started_with
    await orphan(rt, "run_later", "b")
    assert await supervisor.adopt_orphans() == ["run_later"]
    live = await supervisor.resume("run_forced", force=True)  # a person still may
    assert live is not None
    assert (await supervisor.wait(live)).open_requests  # its uncertain `write` asks on-call


async def test_a_cancel_of_a_run_whose_command_was_under_way_says_its_outcome_is_unknown(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    counter = Counter()
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(text="x")], counting_tools(counter))
    opened.append(rt)
    rt.policy = Policy(PolicyRules(oncall=["U0ONCALL"]))
    await orphan(rt, "run_died", "a")  # its process died as `write` ran

    assert await Supervisor(rt).cancel("run_died", by="U0ONCALL") == "cancelled"

    # Nobody is asked about the write now (the run ended): who reads how it ended is told.
    state = fold(await rt.store.load("run_died"), "run_died")
    assert state.result is not None and state.result.status is RunStatus.CANCELLED
    assert "write had started" in state.result.error, state.result.error
    assert "unknown" in state.result.error, state.result.error
    assert counter.calls == {}


async def test_an_orphan_asked_to_cancel_is_ended_though_no_sweep_may_resume_it(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    counter = Counter()
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(text="x")], counting_tools(counter))
    opened.append(rt)
    await orphan(rt, "run_asked", "a")
    # Cancelled at the terminal while its replica held it; that replica then died, and the
    # system prompt changed since (an upgrade): no sweep may resume it without --force.
    await rt.store.audit("U0ONCALL", AuditAction.CANCEL, run_id="run_asked", detail="asked")
    await rt.store.mark_once(cancel_key("run_asked"))
    rt.system_prompt = "changed since the run started"

    await Supervisor(rt).adopt_orphans()

    # Whoever takes the run up ends it, as the person who asked was told: ending runs nothing.
    assert (await rt.store.get_run("run_asked")).status is RunStatus.CANCELLED
    state = fold(await rt.store.load("run_asked"), "run_asked")
    assert state.result is not None and state.result.error.startswith("cancelled by U0ONCALL;")
    assert counter.calls == {}
    assert await cancels_audited(rt, "run_asked") == ["U0ONCALL"]


async def orphan_waiting(rt: Runtime, run_id: str) -> Request:
    """A run whose owner died as it asked for ``deploy``: its card out (the request open)."""
    await rt.store.ensure_session(Session(id=f"ses_{run_id}"))
    epoch = await rt.store.create_run(RunRecord(id=run_id, session_id=f"ses_{run_id}"), "dead", 0.0)
    journal = RunJournal(rt.store, RunState(run_id), epoch)
    deploy = ToolCall(id="call_deploy", name="deploy", arguments='{"text": "v2"}')
    digest = rt.tools.current().call_digest("deploy", {"text": "v2"})
    request = RequestMaker(run_id, "U0REQ")(
        RequestKind.WAIT_APPROVAL, deploy.id, "deploy", {"text": "v2"}, digest=digest
    )
    started = RunStarted(
        run_id=run_id,
        session_id=f"ses_{run_id}",
        requested_by="U0REQ",
        fingerprint=rt.fingerprint(),
        has_prompter=True,
    )
    for entry in (
        started,
        UserMessageEntry(text="ship it", by="U0REQ"),
        AssistantTurnEntry(iteration=0, turn=AssistantTurn(calls=(deploy,))),
        ToolDeferred(call_id=deploy.id, tool="deploy", request=request),
    ):
        await journal.append(entry)
    return request


@pytest.mark.parametrize("answer", [DecisionKind.APPROVE, None])
async def test_an_orphan_asked_to_cancel_is_ended_without_asking_anyone_again(
    tmp_path: Path, opened: list[Runtime], answer: DecisionKind | None
) -> None:
    counter = Counter()
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(text="x")], counting_tools(counter))
    opened.append(rt)
    await orphan_waiting(rt, "run_asked")
    # Cancelled at the terminal while its replica held it; that replica then died.
    await rt.store.audit("U0ONCALL", AuditAction.CANCEL, run_id="run_asked", detail="asked")
    await rt.store.mark_once(cancel_key("run_asked"))
    console = ScriptedPrompter([answer])  # approves it, or says later
    sup = Supervisor(rt)

    # Taken up where someone is present to answer what it waits on (`kestrel chat`'s /resume):
    # whatever they would say, the run ends cancelled.
    live = await sup.resume("run_asked", prompter=console)
    assert live is not None
    await sup.wait(live)

    assert console.asked == []  # its card is not put to anyone again: the run ends
    state = fold(await rt.store.load("run_asked"), "run_asked")
    assert state.result is not None and state.result.status is RunStatus.CANCELLED
    assert state.result.error == "cancelled by U0ONCALL"
    assert await rt.store.list_requests(run_id="run_asked") == []
    assert counter.calls == {}
    audited = [(a.actor, a.action) for a in await rt.store.list_audit(run_id="run_asked")]
    assert ("U0APPROVER", "approve") not in audited


async def test_a_suspended_run_asked_to_cancel_is_ended_by_a_resume_that_asks_nobody(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    await sup.wait(sup.live[run_id])
    # The cancel's asker died between its mark and its claim: nobody ended the run.
    await rt.store.audit("U0ONCALL", AuditAction.CANCEL, run_id=run_id, detail="asked")
    await rt.store.mark_once(cancel_key(run_id))
    console = ScriptedPrompter([None])

    live = await sup.resume(run_id, prompter=console)
    assert live is not None  # not "still waits on someone": it ends
    await sup.wait(live)

    assert console.asked == []
    assert (await rt.store.get_run(run_id)).status is RunStatus.CANCELLED
    assert await rt.store.list_requests(run_id=run_id) == []
    assert counter.calls == {}


class MarksCounted(SqliteStore):
    """The real store, counting how often a once-mark (a cancel's) is read."""

    marks_read = 0

    async def marked(self, key: str) -> bool:
        """``SqliteStore.marked``, counted."""
        self.marks_read += 1
        return await super().marked(key)


async def test_a_resume_at_the_console_of_a_run_asked_to_cancel_reads_the_mark_once(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    await sup.wait(sup.live[run_id])
    await rt.store.audit("U0ONCALL", AuditAction.CANCEL, run_id=run_id, detail="asked")
    await rt.store.mark_once(cancel_key(run_id))
    await rt.store.close()
    store = rt.store = await migrated(MarksCounted(tmp_path / "k.db"))

    live = await sup.resume(run_id, prompter=ScriptedPrompter([None]))
    assert live is not None
    await sup.wait(live)

    assert (await store.get_run(run_id)).status is RunStatus.CANCELLED
    assert store.marks_read == 1  # not again once claimed: a mark, once written, stays
    assert counter.calls == {}


# Writes the store fails (a statement that errs), by what they write: a run's end, a card's close.
FAILING = {
    "end": "BEFORE INSERT ON journal WHEN NEW.kind = 'run_ended'",
    "close": "BEFORE UPDATE ON requests WHEN NEW.status = 'cancelled'",
}


def store_fails(db: Path, what: str = "end", failing: bool = True) -> None:
    """Make the store fail every write of ``what`` (``FAILING``), or no longer."""
    with sqlite3.connect(db) as conn:
        if not failing:
            conn.execute("DROP TRIGGER blip")
            return
        conn.execute(
            f"CREATE TRIGGER blip {FAILING[what]} BEGIN SELECT json('the store is away'); END"
        )


async def cancelled_as_the_store_fails(
    tmp_path: Path, opened: list[Runtime], caplog: pytest.LogCaptureFixture, what: str = "end"
) -> tuple[Runtime, Supervisor, Counter, str, Request]:
    """A run cancelled here while its batch ran, its card out; the store failed the cancel
    that its suspend applied."""
    caplog.set_level(logging.INFO, logger="kestrel")
    counter, release = Counter(), asyncio.Event()
    batch = reply(call("deploy", text="v2"), call("hold"))
    tools = [*counting_tools(counter), holding_tool(release)]
    rt, _ = await make_runtime(
        tmp_path / "k.db", [batch, reply(text="finished")], tools, lease_seconds=0.3
    )
    opened.append(rt)
    sup = Supervisor(rt)
    live = await sup.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    await until(lambda: has_open_requests(rt, live.run_id))
    (request, _status, _decision) = (await rt.store.list_requests(run_id=live.run_id))[0]
    said = await ChatService(sup).cancel(live.run_id, user=Actor("U0REQ"))
    assert said == STOPPING_HERE
    store_fails(tmp_path / "k.db", what)
    release.set()  # the batch ends waiting on its card: the run suspends, its cancel applied then
    await until(lambda: "malformed JSON" in caplog.text)
    return rt, sup, counter, live.run_id, request


@pytest.mark.parametrize("what", FAILING)
async def test_a_cancel_the_store_failed_at_the_suspend_ends_the_run_once_it_is_back(
    tmp_path: Path, opened: list[Runtime], caplog: pytest.LogCaptureFixture, what: str
) -> None:
    rt, _sup, counter, run_id, _request = await cancelled_as_the_store_fails(
        tmp_path, opened, caplog, what
    )

    store_fails(tmp_path / "k.db", failing=False)  # the store is back

    await until(lambda: ended_and_closed(rt, run_id))  # its card closed too
    assert (await rt.store.get_run(run_id)).status is RunStatus.CANCELLED
    assert counter.calls == {}
    assert await cancels_audited(rt, run_id) == ["U0REQ"]


async def test_a_cancel_the_store_failed_outlives_the_process_that_took_it(
    tmp_path: Path, opened: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    rt, sup, counter, run_id, request = await cancelled_as_the_store_fails(tmp_path, opened, caplog)

    await sup.shutdown()  # it stops while the store still fails
    store_fails(tmp_path / "k.db", failing=False)
    await until(lambda: lease_expired(rt, run_id))
    # An approval reaches the run's card afterwards, at another replica.
    tools = [*counting_tools(counter), holding_tool(asyncio.Event())]
    other, _ = await make_runtime(
        tmp_path / "k.db", [reply(text="finished")], tools, owner="replica-b"
    )
    opened.append(other)
    later = Supervisor(other)
    decided = await ChatService(later).decide(
        run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
    )
    if decided.resumed is not None:
        await later.wait(decided.resumed)

    # The cancel was not lost with the process: nothing it forbade ran.
    assert (await rt.store.get_run(run_id)).status is RunStatus.CANCELLED
    assert counter.calls == {}
    assert await rt.store.list_requests(run_id=run_id) == []


async def test_a_cancel_at_a_suspend_whose_journal_cannot_be_read_is_not_tried_again(
    tmp_path: Path, opened: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kestrel")
    rt, sup, _counter, run_id, _request, release = await card_out_while_running(tmp_path, opened)
    live = sup.live[run_id]
    assert await sup.cancel(run_id, by="U0REQ") == STOPPING_HERE
    with sqlite3.connect(tmp_path / "k.db") as conn:  # a hand edit, under the running batch
        conn.execute("DELETE FROM journal WHERE run_id = ? AND seq = 1", (run_id,))

    release.set()  # the run suspends; its cancel reads a journal no process can read

    # What the store answered stays so: the task leaves, the run left to whoever repairs it.
    assert live.task is not None
    await until(live.task.done)
    assert "is missing" in caplog.text
    assert (await rt.store.get_run(run_id)).status is RunStatus.SUSPENDED


async def test_a_cancel_at_a_suspend_whose_card_cannot_be_read_is_not_tried_again(
    tmp_path: Path, opened: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kestrel")
    rt, sup, _counter, run_id, request, release = await card_out_while_running(tmp_path, opened)
    live = sup.live[run_id]
    assert await sup.cancel(run_id, by="U0REQ") == STOPPING_HERE
    with sqlite3.connect(tmp_path / "k.db") as conn:  # written by a newer version, say
        conn.execute("UPDATE requests SET body = ? WHERE id = ?", ('{"kind": "new"}', request.id))

    release.set()  # the run suspends; its cancel ends it, and cannot read the card it closes

    # What the store answered stays so: the task leaves, once, not warning every few seconds.
    assert live.task is not None
    await until(live.task.done)
    assert (await rt.store.get_run(run_id)).status is RunStatus.CANCELLED
    assert f"request {request.id}: unreadable" in caplog.text
    assert "trying again" not in caplog.text


async def test_a_cancel_at_a_suspend_whose_run_is_taken_over_as_it_ends_leaves_it_to_them(
    tmp_path: Path, opened: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kestrel")
    rt, sup, counter, run_id, _request, release = await card_out_while_running(tmp_path, opened)
    live = sup.live[run_id]
    assert await sup.cancel(run_id, by="U0REQ") == STOPPING_HERE
    with sqlite3.connect(tmp_path / "k.db") as conn:
        # Whatever this process claims once the run is free, another takes over at once (its
        # lease ran out under a stalled store, a forced resume): the end it journals is fenced.
        conn.execute(
            "CREATE TRIGGER thief AFTER UPDATE OF owner ON runs"
            " WHEN OLD.owner = '' AND NEW.owner = 'test-owner'"
            " BEGIN UPDATE runs SET owner = 'replica-b', epoch = epoch + 1 WHERE id = NEW.id; END"
        )

    release.set()  # the run suspends; its cancel claims it, and finds it taken over

    # The run is the other process's now: its task here ends, said, not with an error.
    assert live.task is not None
    await until(live.task.done)
    assert live.task.exception() is None
    assert "taken over as its cancel was applied" in caplog.text
    assert (await rt.store.get_run(run_id)).owner == "replica-b"
    assert await rt.store.marked(cancel_key(run_id))  # whoever holds it now ends it
    assert counter.calls == {}


async def ended_and_closed(rt: Runtime, run_id: str) -> bool:
    """Whether the run ended, and none of its requests is open."""
    return await has_ended(rt, run_id) and not await has_open_requests(rt, run_id)


async def lease_expired(rt: Runtime, run_id: str) -> bool:
    """Whether nobody holds the run's lease now."""
    record = await rt.store.get_run(run_id)
    return not record.owner or record.lease_expires is None or record.lease_expires <= utcnow()


async def test_a_cancel_names_its_asker_however_much_was_audited_since(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id = await waiting_for_approval(tmp_path, opened)
    (request,) = (await sup.wait(sup.live[run_id])).open_requests
    await rt.store.audit("U0ONCALL", AuditAction.CANCEL, run_id=run_id, detail="asked")
    await rt.store.mark_once(cancel_key(run_id))
    for n in range(1000):  # a long run's audit after the cancel was asked: refusals, say
        await rt.store.audit("U0OTHER", AuditAction.REFUSED, run_id, request.id, f"no {n}")

    decided = await ChatService(sup).decide(
        run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
    )
    assert decided.resumed is not None
    await sup.wait(decided.resumed)

    state = fold(await rt.store.load(run_id), run_id)
    assert state.result is not None and state.result.error == "cancelled by U0ONCALL"
    assert counter.calls == {}


@pytest.mark.parametrize(
    ("said", "status"),
    [("All good.", "completed"), ("", "failed"), (None, "cancelled")],
)
async def test_a_cancel_of_an_ended_run_says_how_it_ended(
    tmp_path: Path, said: str | None, status: str
) -> None:
    # An empty reply fails the run; a call to approve suspends it, cancelled below.
    first = reply(text=said) if said is not None else reply(call("deploy", text="v2"))
    rt, _ = await make_runtime(tmp_path / "k.db", [first], counting_tools(Counter()))
    supervisor = Supervisor(rt)
    live = await supervisor.start_turn("go", prompter=DeferringPrompter(), requested_by="U0REQ")
    await supervisor.wait(live)
    if status == "cancelled":
        assert await supervisor.cancel(live.run_id, by="U0REQ") == "cancelled"
    assert (await rt.store.get_run(live.run_id)).status.value == status

    with pytest.raises(ResumeRefused) as refused:
        await supervisor.cancel(live.run_id, by="U0REQ")

    assert str(refused.value) == f"run {live.run_id} already ended ({status}): nothing to cancel"
    await rt.store.close()


async def test_an_orphan_whose_adoption_could_not_be_journaled_is_adopted_later(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # A sweep claims the orphan, then the store fails its first entry (a blip, a statement
    # timeout): the claim, with nothing journaled under it, must not look like a refused
    # resume, which no sweep takes up again. Once the store is back, a sweep adopts the run.
    counter = Counter()
    rt, _ = await make_runtime(
        tmp_path / "k.db", [reply(text="x")], counting_tools(counter), lease_seconds=0.3
    )
    opened.append(rt)
    await orphan(rt, "run_blip", "a")
    with sqlite3.connect(tmp_path / "k.db") as conn:  # every journal write fails
        conn.execute(
            "CREATE TRIGGER blip BEFORE INSERT ON journal BEGIN INSERT INTO gone VALUES (1); END"
        )
    supervisor = Supervisor(rt)
    assert await supervisor.adopt_orphans() == ["run_blip"]
    stopped = await supervisor.wait(supervisor.live["run_blip"])
    assert stopped.status is RunStatus.RUNNING  # stopped on the store failure
    with sqlite3.connect(tmp_path / "k.db") as conn:
        conn.execute("DROP TRIGGER blip")

    adopted = await until(supervisor.adopt_orphans, timeout=10)

    assert adopted == ["run_blip"]
    resumed = await supervisor.wait(supervisor.live["run_blip"])
    assert resumed.open_requests  # its uncertain `write` asks on-call


async def test_a_cancel_of_a_run_that_ended_as_its_end_hooks_run_says_it_ended(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_run_end(result: TerminalResult, ctx: HookContext) -> None:
        entered.set()
        await release.wait()  # a RunEnd hook that takes its time (a webhook, say)

    hooks = Hooks(run_end=[slow_run_end])
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(text="All good.")], hooks=hooks)
    opened.append(rt)
    sup = Supervisor(rt)
    live = await sup.start_turn("go", requested_by="U0REQ")
    await entered.wait()  # its end is journaled; its task runs the RunEnd hooks

    with pytest.raises(CancelRefused) as refused:
        await sup.cancel(live.run_id, by="U0REQ")
    release.set()
    await sup.wait(live)

    said = f"run {live.run_id} already ended (completed): nothing to cancel"
    assert str(refused.value) == said
    assert (await rt.store.get_run(live.run_id)).status is RunStatus.COMPLETED
    audited = [(a.actor, a.action) for a in await rt.store.list_audit(run_id=live.run_id)]
    assert ("U0REQ", "cancel") not in audited  # no cancel said to be under way


def store_wholly_fails(db: Path, failing: bool = True) -> None:
    """Make the store fail every write (journal, audit, marks, runs, requests), or no longer."""
    tables = {"journal": "INSERT", "audit": "INSERT", "once_keys": "INSERT", "runs": "UPDATE"}
    with sqlite3.connect(db) as conn:
        for table, verb in tables.items():
            if not failing:
                conn.execute(f"DROP TRIGGER away_{table}")
                continue
            conn.execute(
                f"CREATE TRIGGER away_{table} BEFORE {verb} ON {table}"
                " BEGIN SELECT json('the store is away'); END"
            )


async def cancelled_while_the_store_is_away(
    tmp_path: Path, opened: list[Runtime]
) -> tuple[Runtime, Supervisor, Counter, str, Request, str]:
    """A run driven here, its card out, cancelled while every write of the store fails: what
    the canceller was told."""
    counter = Counter()
    batch = reply(call("deploy", text="v2"), call("hold"))
    tools = [*counting_tools(counter), holding_tool(asyncio.Event())]
    rt, _ = await make_runtime(
        tmp_path / "k.db", [batch, reply(text="finished")], tools, lease_seconds=0.3
    )
    opened.append(rt)
    sup = Supervisor(rt)
    live = await sup.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    await until(lambda: has_open_requests(rt, live.run_id))
    (request, _status, _decision) = (await rt.store.list_requests(run_id=live.run_id))[0]
    store_wholly_fails(tmp_path / "k.db")
    said = await ChatService(sup).cancel(live.run_id, user=Actor("U0REQ"))
    return rt, sup, counter, live.run_id, request, said


async def approved_elsewhere(
    tmp_path: Path, opened: list[Runtime], counter: Counter, run_id: str, request: Request
) -> None:
    """Another process, once the run's lease ran out, approves its card and drives it on."""
    tools = [*counting_tools(counter), holding_tool(asyncio.Event())]
    other, _ = await make_runtime(
        tmp_path / "k.db", [reply(text="finished")], tools, owner="replica-b"
    )
    opened.append(other)
    later = Supervisor(other)
    await until(lambda: lease_expired(other, run_id))
    await later.adopt_orphans()  # the run stopped mid-batch as the store failed its writes
    for live in list(later.live.values()):
        await later.wait(live)
    decided = await ChatService(later).decide(
        run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
    )
    if decided.resumed is not None:
        await later.wait(decided.resumed)


async def test_a_cancel_the_store_failed_is_recorded_within_the_stop_once_it_is_back(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    rt, sup, counter, run_id, request, said = await cancelled_while_the_store_is_away(
        tmp_path, opened
    )
    assert "not recorded yet" in said and "cancel it again" in said, said

    loop = asyncio.get_running_loop()
    stopping = asyncio.create_task(sup.shutdown(until=loop.time() + 20))
    await until(lambda: not sup.live)  # its runs stopped; the stop waits on the cancel's record
    store_wholly_fails(tmp_path / "k.db", failing=False)  # back within the stop's deadline
    await stopping

    assert await rt.store.marked(cancel_key(run_id))
    await approved_elsewhere(tmp_path, opened, counter, run_id, request)
    assert (await rt.store.get_run(run_id)).status is RunStatus.CANCELLED
    assert counter.calls == {}  # the deploy the cancel was asked to stop never ran
    assert await cancels_audited(rt, run_id) == ["U0REQ"]


async def test_a_cancel_the_store_never_took_before_the_stop_is_said_lost(
    tmp_path: Path, opened: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    _rt, sup, _counter, run_id, _request, said = await cancelled_while_the_store_is_away(
        tmp_path, opened
    )

    await sup.shutdown(until=asyncio.get_running_loop().time() + 0.5)

    assert "not recorded yet" in said
    assert f"run {run_id}: the cancel U0REQ asked was never recorded" in caplog.text
    store_wholly_fails(tmp_path / "k.db", failing=False)


class StaleRead(SqliteStore):
    """The real store, where something else happens (``then``) just after the next read of a
    run's row: the reader goes on with a row that is no longer so."""

    then: Callable[[], Awaitable[object]] | None = None
    reads_before: int = 0  # rows read as they are before ``then`` happens

    async def get_run(self, run_id: str) -> RunRecord:
        """Read, then let ``then`` happen once ``reads_before`` reads went by."""
        record = await super().get_run(run_id)
        if self.then is not None and self.reads_before == 0:
            then, self.then = self.then, None
            await then()
        self.reads_before -= 1
        return record


async def test_a_cancel_of_a_live_run_that_completed_as_it_was_asked_says_so(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    entered, release_end = asyncio.Event(), asyncio.Event()

    async def slow_run_end(result: TerminalResult, ctx: HookContext) -> None:
        entered.set()
        await release_end.wait()  # its task stays live while its RunEnd hooks run

    release = asyncio.Event()
    rt, _ = await make_runtime(
        tmp_path / "k.db",
        [reply(call("hold")), reply(text="All good.")],
        [holding_tool(release)],
        hooks=Hooks(run_end=[slow_run_end]),
    )
    await rt.store.close()
    store = rt.store = await migrated(StaleRead(tmp_path / "k.db"))
    opened.append(rt)
    started = asyncio.Event()
    rt.events.add(ToolStarted(started))
    sup = Supervisor(rt)
    live = await sup.start_turn("go", requested_by="U0REQ")
    await started.wait()  # `hold` runs

    async def completed() -> None:
        release.set()
        await entered.wait()  # its end is journaled

    # The run completes just after the cancel read its row (running), before it is stopped.
    store.then, store.reads_before = completed, 1
    with pytest.raises(CancelRefused) as refused:
        await sup.cancel(live.run_id, by="U0REQ")
    release_end.set()
    await sup.wait(live)

    assert str(refused.value) == f"run {live.run_id} already ended (completed): nothing to cancel"
    assert (await rt.store.get_run(live.run_id)).status is RunStatus.COMPLETED
    assert await cancels_audited(rt, live.run_id) == ["U0REQ"]  # asked, once


async def test_a_cancel_from_another_process_keeps_the_next_effect_from_starting(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    counter, release = Counter(), asyncio.Event()
    batch = reply(call("hold"), call("write", text="after"))
    tools = [*counting_tools(counter), holding_tool(release)]
    # A lease of 30 s: the driver renews it (and reads the cancel there) only in 10 s.
    rt, seen = await make_runtime(tmp_path / "k.db", [batch, reply(text="finished")], tools)
    terminal, _ = await make_runtime(tmp_path / "k.db", [], owner="terminal")
    opened += [rt, terminal]
    serving = Supervisor(rt)
    live = await serving.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    await until(lambda: "tool_started" in seen.kinds())
    said = await Supervisor(terminal).cancel(live.run_id, by="U0REQ")
    assert said.startswith("cancelling: test-owner holds the run"), said

    release.set()  # `hold` ends before any renewal: the batch's next call is an effect
    await serving.wait(live)

    assert counter.calls == {}  # the write, not started when the cancel was taken, never ran
    assert (await rt.store.get_run(live.run_id)).status is RunStatus.CANCELLED
    assert await cancels_audited(rt, live.run_id) == ["U0REQ"]


class OutageStore(SqliteStore):
    """The real store, whose lease renewals fail while ``down``, as in a store's outage."""

    down = False
    failed = 0

    async def renew(self, run_id: str, owner: str, epoch: int, lease_seconds: float) -> bool:
        """Fail while down; renew otherwise."""
        if self.down:
            self.failed += 1
            raise StoreError("PostgreSQL is unreachable: connection refused")
        return await super().renew(run_id, owner, epoch, lease_seconds)


async def test_a_store_outage_says_two_lease_lines_not_one_per_renewal(
    tmp_path: Path, opened: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    # Each run said "lease not renewed, trying again" at each renewal the store failed: three
    # runs with 30 s leases, a line every 10 s each; a hundred runs, ten lines a second, for
    # as long as the outage lasted. One line says the renewals fail, one that they work again.
    caplog.set_level(logging.INFO, "kestrel.supervisor")
    replies = [reply(call("nap", seconds=60)) for _ in range(3)]
    store = await migrated(OutageStore(tmp_path / "k.db"))
    model = ScriptedProvider.from_replies(replies, name="test")
    rt = Runtime(store=store, model=model, tools=ToolSource(ToolSet([nap])), lease_seconds=0.3)
    opened.append(rt)
    supervisor = Supervisor(rt)
    runs = [await supervisor.start_turn(f"rest {n}", prompter=None) for n in range(3)]
    await until(lambda: all(live.run_id in supervisor.live for live in runs))

    store.down = True
    await until(lambda: store.failed >= 12)
    store.down = False
    await until(lambda: any("work again" in r.getMessage() for r in caplog.records))
    failed = store.failed
    await supervisor.shutdown()

    lines = [r.getMessage() for r in caplog.records if "lease" in r.getMessage()]
    assert len(lines) == 2, lines
    assert lines[0].startswith("lease renewals fail (PostgreSQL is unreachable"), lines
    assert f"after {failed} failed renewal(s) of 3 run(s)" in lines[1], lines


class Note(BaseModel):
    """What to note."""

    text: str


@function_tool(name="note", idempotent=True)
async def note(args: Note) -> str:
    """Log a line, as a tool's library would."""
    logging.getLogger("kestrel.tools.note").warning("noted %s", args.text)
    return "noted"


async def test_a_runs_json_log_lines_name_its_run_and_its_session(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    # A JSON line from a run's task named the run alone: an operator looking for what went
    # wrong in a Slack channel or a Discord thread had to look each run up to find where.
    stream = io.StringIO()
    logs.configure(logging.WARNING, "json", stream)
    replies = [reply(call("note", text="x")), reply(text="done")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, [note])
    opened.append(rt)
    session = Session(
        id="slack:T0001:C0002:1714000000.000100",
        platform="slack",
        workspace="T0001",
        channel="C0002",
        thread="1714000000.000100",
    )
    supervisor = Supervisor(rt)
    live = await supervisor.start_turn("note x", session=session, prompter=None)
    await supervisor.wait(live)

    (line,) = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert line["message"] == "noted x"
    assert line["run_id"] == live.run_id
    assert line["session"] == "slack:T0001:C0002:1714000000.000100"


async def test_a_cancel_unrecorded_of_a_run_it_ended_is_not_said_lost_at_the_stop(
    tmp_path: Path, opened: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    """The store fails the cancel's audit and mark, not the run's end: the run ends cancelled
    here, and the stop does not tell on-call that it goes on and must be cancelled again."""
    release = asyncio.Event()
    batch = reply(call("deploy", text="v2"), call("hold"))
    tools = [*counting_tools(Counter()), holding_tool(release)]
    rt, _ = await make_runtime(
        tmp_path / "k.db", [batch, reply(text="finished")], tools, lease_seconds=0.3
    )
    opened.append(rt)
    sup = Supervisor(rt)
    live = await sup.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    await until(lambda: has_open_requests(rt, live.run_id))
    with sqlite3.connect(tmp_path / "k.db") as conn:
        for table in ("audit", "once_keys"):
            conn.execute(
                f"CREATE TRIGGER away_{table} BEFORE INSERT ON {table}"
                " BEGIN SELECT json('the store is away'); END"
            )

    said = await ChatService(sup).cancel(live.run_id, user=Actor("U0REQ"))
    release.set()
    await sup.wait(live)
    await until(lambda: has_ended(rt, live.run_id))
    await sup.shutdown(until=asyncio.get_running_loop().time() + 0.5)

    assert "not recorded yet" in said
    assert (await rt.store.get_run(live.run_id)).status is RunStatus.CANCELLED
    assert "was never recorded" not in caplog.text, caplog.text


class BlinksAfterAMark(SqliteStore):
    """The real store, which fails the first look at a run after a once-mark is written (a
    store that blinks as a cancel is recorded)."""

    blink = False

    async def mark_once(self, key: str) -> bool:
        """Mark, then blink at the next look."""
        won = await super().mark_once(key)
        self.blink = True
        return won

    async def get_run(self, run_id: str) -> RunRecord:
        """Fail once after a mark, then look."""
        if self.blink:
            self.blink = False
            raise StoreError("the database is unreachable")
        return await super().get_run(run_id)


async def test_a_cancel_recorded_of_a_run_driven_here_is_not_said_uncounted_if_a_look_fails(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    release = asyncio.Event()
    store = await migrated(BlinksAfterAMark(tmp_path / "k.db"))
    model = ScriptedProvider.from_replies([reply(call("hold")), reply(text="finished")])
    tools = ToolSource(ToolSet([holding_tool(release)]))
    rt = Runtime(store=store, model=model, tools=tools, owner="replica-a")
    opened.append(rt)
    sup = Supervisor(rt)
    live = await sup.start_turn("hold on", requested_by="U0REQ", prompter=None)
    await until(lambda: live.signals.interrupt.tool_under_way())

    said = await ChatService(sup).cancel(live.run_id, user=Actor("U0REQ"))
    release.set()
    state = await sup.wait(live)

    # Recorded and stopped here: said so, not that it may not have counted and may go on.
    assert said == STOPPING_HERE
    assert state.result is not None and state.result.status is RunStatus.CANCELLED
    assert await rt.store.marked(cancel_key(live.run_id))


class EndUnansweredThenUnreadable(SqliteStore):
    """The real store, where a run's end commits but its answer is lost, and the entry at its
    seq then reads as none (written over by a newer version that adopted the run)."""

    def submit(self, run_id: str, seq: int, epoch: int, entry: Entry) -> asyncio.Future[None]:
        """Commit; for a run's end, answer a failure all the same."""
        done = super().submit(run_id, seq, epoch, entry)
        if not isinstance(entry, RunEnded):
            return done
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.add_done_callback(lambda _: lost.set_exception(StoreError("connection lost")))
        return lost

    async def load_range(self, run_id: str, start: int, stop: int) -> list[JournalRecord]:
        """The end's seq reads as no entry."""
        raise UnreadableJournal(f"run {run_id}: entry {start} reads as none")


async def test_an_end_read_back_as_unreadable_is_not_read_again_and_again(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    store = await migrated(EndUnansweredThenUnreadable(tmp_path / "k.db"))
    model = ScriptedProvider.from_replies([reply(text="All good.")])
    rt = Runtime(store=store, model=model, tools=ToolSource(ToolSet([])), lease_seconds=0.3)
    opened.append(rt)
    sup = Supervisor(rt)
    live = await sup.start_turn("how is checkout?", requested_by="U0REQ")

    # The store answered: reading again gives the same answer, and the run's task ends.
    await asyncio.wait_for(sup.wait(live), 5)
    assert "connection lost" in live.error


class CancelledElsewhereAsItDispatches(SqliteStore):
    """The real store, where another process's cancel (``cancel``) lands as a dispatch record
    is written: after the driver's look before the call, before the record's commit."""

    cancel: Callable[[], Awaitable[str]] | None = None
    said = ""  # what the cancel said

    def submit(self, run_id: str, seq: int, epoch: int, entry: Entry) -> asyncio.Future[None]:
        """Append; the first dispatch record once the cancel is written."""
        if not isinstance(entry, ToolDispatched) or self.cancel is None:
            return super().submit(run_id, seq, epoch, entry)
        cancel, self.cancel = self.cancel, None
        append = super().submit

        async def after_the_cancel() -> None:
            self.said = await cancel()
            await append(run_id, seq, epoch, entry)

        return asyncio.ensure_future(after_the_cancel())


async def test_a_cancel_taken_elsewhere_as_a_call_is_dispatched_keeps_it_from_starting(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    counter = Counter()
    store = await migrated(CancelledElsewhereAsItDispatches(tmp_path / "k.db"))
    model = ScriptedProvider.from_replies([reply(call("write", text="x")), reply(text="done")])
    rt = Runtime(
        store=store, model=model, tools=ToolSource(ToolSet(counting_tools(counter))), owner="a"
    )
    other, _ = await make_runtime(tmp_path / "k.db", [], owner="b")
    opened += [rt, other]
    driving, elsewhere = Supervisor(rt), Supervisor(other)
    live = await driving.start_turn("write x", requested_by="U0REQ", prompter=None)
    store.cancel = lambda: elsewhere.cancel(live.run_id, by="U0REQ")

    state = await driving.wait(live)

    # The asker was told the run ends at its next step: the write, whose record landed after
    # the cancel, never starts, and the run ends cancelled saying no command had started.
    assert store.said.startswith("cancelling: a holds the run"), store.said
    assert counter.calls == {}
    assert state.result is not None and state.result.status is RunStatus.CANCELLED
    assert "started" not in state.result.error, state.result.error
    results = [r.entry for r in await rt.store.load(live.run_id)]
    (written,) = [e for e in results if isinstance(e, ToolResultEntry)]
    assert written.output.startswith("not run: the run was cancelled"), written


async def test_a_cancel_asked_elsewhere_does_not_promise_an_end_the_run_may_outrun(
    tmp_path: Path, opened: list[Runtime]
) -> None:
    """Asked while the run's driver holds a tool that changes nothing: its final answer comes
    before its next lease renewal, and the run completes; the asker was not told otherwise."""
    release = asyncio.Event()
    replies = [reply(call("hold")), reply(text="finished")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, [holding_tool(release)], owner="a")
    other, _ = await make_runtime(tmp_path / "k.db", [], owner="b")
    opened += [rt, other]
    driving = Supervisor(rt)
    live = await driving.start_turn("hold on", requested_by="U0REQ", prompter=None)
    await until(lambda: live.signals.interrupt.tool_under_way())

    said = await Supervisor(other).cancel(live.run_id, by="U0REQ")
    release.set()
    state = await driving.wait(live)

    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    assert said.startswith("cancelling: a holds the run"), said
    assert "unless it finishes first" in said, said
