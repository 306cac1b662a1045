"""The supervisor: one asyncio task per live run; start, resume, cancel, leases, panics."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import traceback
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC
from typing import Any

import msgspec

from bot import wire
from bot.domain import (
    TERMINAL_STATUSES,
    Decision,
    Request,
    RunStatus,
    Session,
    StopReason,
    TerminalResult,
    new_id,
)
from bot.errors import (
    ResumeRefused,
    StoreError,
    ThreadBusy,
    UnreadableJournal,
    unanswered,
)
from bot.events import (
    AdvisoryEvent,
    JournalFailedEvent,
    PanicEvent,
    RunEndedEvent,
    RunStartedEvent,
    RunTakenOverEvent,
)
from bot.hooks import HookContext, HookFailure, Hooks
from bot.journal.entries import Entry, RunEnded, RunResumed, RunStarted, UserMessageEntry
from bot.journal.fold import RunState, fold
from bot.journal.writer import RunJournal, TakenOver
from bot.kinds import AuditAction
from bot.llm.base import UserMessage
from bot.logs import run_context
from bot.people.decisions import Answered, Decisions
from bot.people.policy import Actor
from bot.prompter import DeferringPrompter, Prompter
from bot.records import RunRecord
from bot.run.cancel import Cancels, asker
from bot.run.cancel import cancel_key as cancel_key  # where callers have always found it
from bot.run.context import RunContext
from bot.run.loop import AgentLoop, LoopDeps, Signals
from bot.run.renewals import RenewalTrouble
from bot.run.runtime import Runtime
from bot.waits import paused, time_left, waited

log = logging.getLogger("kestrel.supervisor")

HISTORY_TURNS = 5


# The journal's decoder, built with this module rather than by a run. Only a process that
# drives runs imports the supervisor, and every run it drives writes entries that the store
# checks read back as their kind: the first entry of each kind had its field types inspected
# inside the run (1.9 M of a fresh process's first suspend's 8.6 M instructions, bench.cold).
# One inspection of the union serves every kind (0.5 ms, once, at start-up).
wire.prepare(Entry)


class LiveRun(msgspec.Struct):
    """A run driven by a task of this process."""

    run_id: str
    # The lease it was resumed under (0: a new run's, the first there is).
    epoch: int = 0
    signals: Signals = msgspec.field(default_factory=Signals)
    task: asyncio.Task[RunState] | None = None
    error: str = ""
    created: asyncio.Event = msgspec.field(default_factory=asyncio.Event)
    # Who asked for the cancel picked up at the next loop boundary (or at the suspend).
    cancelled_by: str = ""
    # The task that went on with the run when this one suspended on requests already answered.
    next: LiveRun | None = None
    # Set once the task has left ``Supervisor.live`` (its run suspended, ended or given up).
    left: asyncio.Event = msgspec.field(default_factory=asyncio.Event)


class KeyedLocks:
    """One ``asyncio.Lock`` per key, kept only while someone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold ``key``'s lock for the block."""
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class _Renewal:
    """A run's lease renewals (``Supervisor._renew``), on a task of their own from the first
    one due: a turn that suspends or ends before then, as most do, starts no task for them."""

    __slots__ = ("_renew", "_task", "_timer")

    def __init__(self, renew: Callable[[], Coroutine[Any, Any, None]], every: float) -> None:
        self._renew = renew
        self._task: asyncio.Task[None] | None = None
        # The timer's callback runs in the run's context (its log lines name the run), and
        # so does the task it starts.
        self._timer = asyncio.get_running_loop().call_later(every, self._start)

    def _start(self) -> None:
        self._task = asyncio.create_task(self._renew())

    def stop(self) -> None:
        """No renewal from now on: the timer cancelled, or the task under way."""
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()


class Supervisor:
    """Starts and resumes runs, each on exactly one task, and keeps their leases alive."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.decisions = Decisions(runtime)
        self.live: dict[str, LiveRun] = {}
        self._resuming = KeyedLocks()
        # Set as ``shutdown`` begins: this process takes up no run, and a wait on the store
        # (a cancel's, an end's read back) ends there.
        self._stop = asyncio.Event()
        self.cancels = Cancels(
            runtime, self.decisions, self.live, self._resuming, self._end_outside, self._stop
        )
        # Every run task until it returns: a task that left ``live`` may still be resuming.
        self._tasks: set[asyncio.Task[RunState]] = set()
        self._stopped: list[asyncio.Task[RunState]] = []  # the tasks shutdown waits on
        self._hand_back = False  # what ``shutdown`` suspends its runs as (``Interrupt``)
        self._renewals = RenewalTrouble()  # said once per outage, not per run and renewal

    # --- entry points -------------------------------------------------------------------

    async def start_turn(
        self,
        prompt: str,
        *,
        session: Session | None = None,
        requested_by: str = "",
        prompter: Prompter | None = None,
        run_id: str = "",
        alone: bool = False,
    ) -> LiveRun:
        """Start a run for one human message; its task runs in the background. ``alone``: the
        run is created only if no other run of ``session`` is unfinished (see ``begun``)."""
        run_id = run_id or new_id("run")
        live = LiveRun(run_id)
        work = self._start(live, prompt, session, requested_by, prompter, alone)
        self._drive_on_task(live, work, session.id if session is not None else "")
        return live

    async def begun(self, live: LiveRun) -> bool:
        """Wait until a run this process started exists; False if it never will (its task
        ended first: its thread was busy, or the store failed, ``live.error`` says which)."""
        if live.task is None or live.created.is_set():
            return live.created.is_set()
        created = asyncio.ensure_future(live.created.wait())
        await asyncio.wait({created, live.task}, return_when=asyncio.FIRST_COMPLETED)
        created.cancel()
        return live.created.is_set()

    async def resume(
        self,
        run_id: str,
        *,
        prompter: Prompter | None = None,
        force: bool = False,
        claimed: int | None = None,
        by: str = "",
    ) -> LiveRun | None:
        """Continue a suspended (or orphaned) run; None when it has nothing to do yet.

        ``claimed``: the epoch of the lease this process already took for the run (a decision
        that closed its last open request takes it in the same commit). ``by``: who resumes
        it, audited (empty: this process, on its own).
        """
        # One look-and-claim at a time per run: a decider's claimed resume and a plain one (a
        # deadline, adoption, work taken, a suspend that found its answers) must not both
        # drive the run, nor one drive it again after the other ended it.
        while True:
            async with self._resuming.hold(run_id):
                live = self.live.get(run_id)
                if live is None and claimed is not None:
                    return await self._resume_claimed(run_id, claimed, prompter, force, by)
                if live is None:
                    return await self._resume_free(run_id, prompter, force, by)
                if claimed is None or live.epoch >= claimed:
                    return live
            # A decision took the lease this run's suspend gave up, before the suspended task
            # left: that task drives nothing more, so go on with the claim once it has left.
            await live.left.wait()

    async def _resume_free(
        self, run_id: str, prompter: Prompter | None, force: bool, by: str
    ) -> LiveRun | None:
        record = await self.rt.store.get_run(run_id)
        if record.status in TERMINAL_STATUSES:
            return None
        state = fold(await self.rt.store.load(run_id), run_id)
        try:
            self._check_fingerprint(state, force)
        except ResumeRefused:
            if await self.cancels.instead(run_id):
                return None
            await self._left_to_a_person(run_id)
            raise
        asked = None
        if prompter is not None and state.open_requests:
            # Someone present (the console) is offered what the run waits on, unless it was
            # asked to cancel: then it ends (its resume goes by this read of the mark, which
            # stays once written), and nobody is asked about a step it never takes. One given
            # no prompter asks nobody now (``_prompter_for`` defers): read below only if idle.
            asked = await self.cancels.asked(run_id)
            if asked is None:
                await self.decisions.ask_again(state, prompter)
        has_work = asked is not None or await self._has_work(state)
        if not has_work and prompter is None and state.open_requests:
            # Nothing to do yet for a run that waits on people: unless it was asked to cancel
            # (a cancel whose end the store failed at its suspend), which it is ended for here,
            # not said to wait on a card nobody may answer any more.
            asked = await self.cancels.asked(run_id)
            has_work = asked is not None
        cancelled = asked is not None
        prompter = _prompter_for(state, prompter)
        if not has_work or self._stop.is_set():
            # Stopping: no claim either, which a run released while waiting would take for
            # one (``ORPHANED_RUNS``: its epoch is its journal's last only until claimed).
            return None
        claimed = await self._claim_with_work(run_id, cancelled)
        if claimed is None:
            return None
        epoch, state = claimed
        return self._resumed(run_id, epoch, state, prompter, force, record.owner, by, asked)

    async def _claim_with_work(
        self, run_id: str, cancelled: bool = False
    ) -> tuple[int, RunState] | None:
        """The run's lease and its state, if it still has work once claimed (``cancelled``:
        ending it is work enough); else None (the claim given back, or left to expire by a
        process that began to stop)."""
        while True:
            epoch = await self.rt.store.claim(run_id, self.rt.owner, self.rt.lease_seconds)
            if epoch is None:
                held = await self._held_elsewhere(run_id)
                if cancelled or await self.cancels.asked(run_id) is not None:
                    # Not as if it went on once taken up: its cancel ends it there, or here.
                    held += "; it was asked to cancel: it ends cancelled wherever it is driven"
                raise ResumeRefused(held)
            if self._stop.is_set():
                # It began to shut down since the look: the lease is left to expire, and another
                # replica adopts the run. Given back, the claim's epoch would have hidden the
                # run from every sweep (``ORPHANED_RUNS``), as a refused resume is.
                return None
            state = fold(await self.rt.store.load(run_id), run_id)
            if await self._goes_on(state, cancelled):
                return epoch, state
            # Another owner moved it on between our look and our claim: nothing left to do.
            await self.rt.store.release(run_id, self.rt.owner, epoch)
            # Unless the answer it waits on came while we held the claim: its decider found the
            # lease taken and left the run to us, and given back without a journal entry, the
            # run is hidden from every sweep. Looked at after the release, an answer written
            # since took the lease itself.
            if not await self._goes_on(fold(await self.rt.store.load(run_id), run_id), cancelled):
                return None

    async def _goes_on(self, state: RunState, cancelled: bool = False) -> bool:
        """Whether a run not ended has work to resume (``_has_work``; or, ``cancelled``, its
        end)."""
        return state.result is None and (cancelled or await self._has_work(state))

    async def _left_to_a_person(self, run_id: str) -> None:
        """A run no resume may take up without --force is claimed and given back, as a refused
        decider's is: its lease's epoch is then past its journal's last, and no sweep is
        refused it again at every pass (``ORPHANED_RUNS``, oldest first: enough such runs would
        hide every other orphan). One held elsewhere is left to its holder."""
        epoch = await self.rt.store.claim(run_id, self.rt.owner, self.rt.lease_seconds)
        if epoch is not None:
            await self.rt.store.release(run_id, self.rt.owner, epoch)

    async def _resume_claimed(
        self, run_id: str, epoch: int, prompter: Prompter | None, force: bool, by: str
    ) -> LiveRun | None:
        records = await self.rt.store.load(run_id)
        state = fold(records, run_id)
        if state.result is not None or any(r.epoch > epoch for r in records):
            # Resumed meanwhile under a newer lease (and since suspended or ended): that
            # resume answered what this decision allowed.
            return None
        if self._stop.is_set():
            # Shutting down: the lease is left to expire, and another replica adopts the run.
            return None
        try:
            self._check_fingerprint(state, force)
        except ResumeRefused:
            if await self.cancels.instead(run_id, epoch):
                return None
            await self.rt.store.release(run_id, self.rt.owner, epoch)
            raise
        return self._resumed(run_id, epoch, state, prompter, force, "", by)

    def _resumed(
        self,
        run_id: str,
        epoch: int,
        state: RunState,
        prompter: Prompter | None,
        force: bool,
        owner: str,
        by: str,
        asked: str | None = None,
    ) -> LiveRun:
        """Drive a run whose lease this process holds at ``epoch`` on a task of its own
        (``asked``: who asked it to cancel, if this resume read the mark already)."""
        prompter = _prompter_for(state, prompter)
        # Who asked, for whoever resumed it: the run ends cancelled instead (``_resume``).
        live = LiveRun(run_id, epoch, cancelled_by=asker(asked) if asked is not None else "")
        previous = owner if owner != self.rt.owner else ""
        accepted = self.rt.fingerprint() if force else None
        resumed = RunResumed(
            owner=self.rt.owner,
            forced=force,
            taken_over_from=previous,
            by=by,
            fingerprint=accepted,
        )
        work = self._resume(live, epoch, state, prompter, resumed, asked)
        self._drive_on_task(live, work, state.started.session_id if state.started else "")
        return live

    def _drive_on_task(
        self, live: LiveRun, work: Coroutine[Any, Any, RunState], session_id: str
    ) -> None:
        """Run ``work`` on a task of its own behind the panic barrier; the run is live."""
        # Every log line the run's task writes names the run and its session (``bot.logs``).
        context = run_context(live.run_id, session_id)
        task = asyncio.create_task(self._barrier(live, work), name=live.run_id, context=context)
        live.task = task
        self.live[live.run_id] = live
        self._tasks.add(task)
        if self._stop.is_set():
            self._stopped.append(task)
            # A turn taken as this process stops suspends before its first model call: after
            # ``shutdown`` returned nothing else would stop it, and its tools would run until
            # the process exits. Not handed back through the work queue then, it is adopted
            # (``handed_back``) or its lease expires.
            live.signals.interrupt.request(hand_back=self._hand_back)
        task.add_done_callback(self._tasks.discard)

    async def answer(
        self, decision: Decision, *, run_id: str, actor: Actor | None = None, digest: str = ""
    ) -> Answered:
        """Check a decision against the store and policy and write it (see ``Decisions``).

        A decision that closes its run's last open request takes the run's lease with it
        (``Answered.claimed``): the caller resumes the run with ``resume(claimed=...)``.
        """
        return await self.decisions.answer(decision, run_id=run_id, actor=actor, digest=digest)

    async def adopt_orphans(self) -> list[str]:
        """Resume the runs whose owner died (lease expired while running); each once."""
        adopted = []
        for run_id in await self.rt.store.orphaned_runs():
            try:
                live = await self.resume(run_id)
            except ResumeRefused as exc:
                log.info("not adopting %s: %s", run_id, exc)
                continue
            except UnreadableJournal as exc:
                # That run's alone: the runs after it (oldest first) must still be adopted.
                log.error("not adopting %s until its journal is repaired: %s", run_id, exc)
                continue
            if live is not None:
                adopted.append(run_id)
        return adopted

    async def expire(self, request: Request) -> bool:
        """Close a request whose deadline passed; the run goes on if nothing else is open."""
        settled = await self.decisions.expire(request)
        if not settled.won:
            return False
        try:
            if settled.epoch is not None:
                await self.resume(request.run_id, claimed=settled.epoch, by="deadline")
            elif not await self.rt.store.list_requests(run_id=request.run_id):
                await self.resume(request.run_id, by="deadline")
        except ResumeRefused as exc:
            # Expired all the same; the run waits for someone to resume it (say --force).
            log.warning("run %s not resumed after %s expired: %s", request.run_id, request.id, exc)
        except UnreadableJournal as exc:
            # Expired all the same; and the sweep goes on to the other runs' requests.
            log.error("run %s not resumed after %s expired: %s", request.run_id, request.id, exc)
        return True

    async def expire_overdue(self, run_id: str) -> int | None:
        """Expire the run's open requests whose deadline passed, as a replica's sweep does, so
        that a run resumed where no replica runs (the command line) goes on past an answer
        that can no longer come; the lease's epoch if that closed its last open request (the
        caller resumes the run with it, as itself), else None."""
        now = self.rt.clock()
        claimed = None
        for request, _status, _decision in await self.rt.store.list_requests(run_id=run_id):
            if request.deadline is None or request.deadline > now:
                continue
            settled = await self.decisions.expire(request)
            if settled.won and settled.epoch is not None:
                claimed = settled.epoch
        return claimed

    async def cancel(self, run_id: str, by: str = "", actor: Actor | None = None) -> str:
        """Cancel a run: a live one at its next loop boundary, a suspended one at once.

        Only the run's requester or on-call may; anyone else gets ``NotPermitted`` (audited).
        """
        return await self.cancels.cancel(run_id, by, actor)

    async def wait(self, live: LiveRun) -> RunState:
        """Wait for a live run's task to end (suspended, ended, or given up), and for the
        task that went on with it if it suspended on requests already answered.

        A waiter that is cancelled (Ctrl-C) leaves the run's task alone: ``shutdown`` stops it.
        """
        while True:
            assert live.task is not None
            state = await _ended(live.task)
            if live.next is None:
                return state
            live = live.next

    def interrupt_all(self, *, spare_tools: bool = False, hand_back: bool = False) -> None:
        """Cut every live run's model call, prompt or tool short; each suspends at once (after
        the tool under way, with ``spare_tools``; ``handed_back``, with ``hand_back``)."""
        for live in self.live.values():
            live.signals.interrupt.request(spare_tools=spare_tools, hand_back=hand_back)

    async def shutdown(
        self, tool_grace: float = 0.0, *, hand_back: bool = False, until: float | None = None
    ) -> list[str]:
        """Suspend every live run now, letting a tool under way finish for ``tool_grace``
        seconds first; wait for their tasks, and return the runs suspended only because of
        it (for another process to take on).

        ``hand_back`` (a replica stopping): each run suspends ``handed_back``, which any
        replica's sweep adopts (``ORPHANED_RUNS``), so that one is not lost if this process
        dies before it queues their resumes.

        ``until`` (the event loop's time): no wait past it. A run whose suspension is still
        being written then is left to end by itself and is not returned: its lease, kept,
        runs out, and another replica adopts it as after a kill.
        """
        self._stop.set()
        self._hand_back = hand_back
        self._stopped.extend(self._tasks)
        self.interrupt_all(spare_tools=tool_grace > 0, hand_back=hand_back)
        if self._tasks and tool_grace > 0:
            await asyncio.wait(list(self._tasks), timeout=time_left(until, tool_grace))
            self._say_tools_cut(tool_grace)
        # A run started while this one stops (a turn taken during the grace) is stopped and
        # handed back too (``_drive_on_task`` counts it), not stranded with no owner.
        while self._tasks:
            self.interrupt_all(hand_back=hand_back)
            _, pending = await asyncio.wait(list(self._tasks), timeout=time_left(until))
            if pending and time_left(until) == 0:
                break
        # A cancel the store failed to record is waited for within the deadline: recorded, it
        # ends the run wherever it is taken up; else it is said lost, never silently.
        await self.cancels.settle(until)
        handed_back = []
        for task in self._stopped:
            if not task.done() or task.cancelled() or task.exception() is not None:
                continue
            if await self._in_time(self._for_another(task.result(), hand_back), until):
                handed_back.append(task.result().run_id)
        return handed_back

    async def _in_time(self, asked: Coroutine[Any, Any, bool], until: float | None) -> bool:
        """``asked``'s answer, or True when the store fails or (past ``until``) has not
        answered: whoever takes the run up looks again. One left unanswered ends by itself:
        cancelling a PostgreSQL statement waits for the server too."""
        task = await waited(asked, time_left(until))
        if not task.done() or isinstance(task.exception(), StoreError):
            return True
        return task.result()

    def _say_tools_cut(self, grace: float) -> None:
        """One line per run whose tool outlived the grace and is about to be killed: on-call
        looks for what a command left half done."""
        for live in self.live.values():
            tool = live.signals.interrupt.tool_under_way()
            if tool:
                log.warning(
                    "run %s: tool %s was killed after the shutdown grace period (%g s,"
                    " replica.shutdown_grace_seconds); what it did so far stands",
                    live.run_id,
                    tool,
                    grace,
                )

    async def _for_another(self, state: RunState, hand_back: bool) -> bool:
        """Whether a run that ``shutdown`` stopped is for another process to go on with: it
        waits on nobody, and, handing back, no person paused it."""
        if not await self._can_go_on(state):
            return False
        if not hand_back:
            return True
        # Handing back suspends every run `handed_back` but one a person paused first
        # (``Interrupt.request``), which waits for that person's resume.
        record = await self.rt.store.get_run(state.run_id)
        return record.stop_reason != StopReason.INTERRUPTED

    @property
    def stopping(self) -> bool:
        """Whether this process is shutting down: it takes up no run (a resume gives it back)."""
        return self._stop.is_set()

    async def _has_work(self, state: RunState) -> bool:
        """Whether resuming the run does anything: an orphan (its owner died mid-run) always
        has, if only to settle what its batch left in flight and suspend on its requests; a
        suspended run once every request it waits on was answered."""
        return state.status is RunStatus.RUNNING or await self.decisions.has_work(state)

    def _may_go_on(self, live: LiveRun, state: RunState) -> bool:
        """Whether a run that suspended waiting for people, not because it was told to, may
        go on in this process (which is not shutting down)."""
        return bool(state.open_requests) and not live.signals.stopping and not self._stop.is_set()

    async def _can_go_on(self, state: RunState) -> bool:
        """Whether a run that suspended waits on nobody: it was stopped, not waiting, or every
        request it waits on was answered while it still ran (the decider found it live and
        left it to its task)."""
        if state.status is not RunStatus.SUSPENDED:
            return False
        return not state.open_requests or await self.decisions.has_work(state)

    # --- one task per run ---------------------------------------------------------------

    async def _start(
        self,
        live: LiveRun,
        prompt: str,
        session: Session | None,
        requested_by: str,
        prompter: Prompter | None,
        alone: bool = False,
    ) -> RunState:
        hooks = self.rt.run_hooks()
        ctx = HookContext(run_id=live.run_id, requested_by=requested_by)
        refusal, text, cause = await _screen_prompt(hooks, prompt, ctx)
        # A session made up for this run has no history to read.
        history = await self._history(session.id) if session else ()
        session = session or Session(id=new_id("ses"))
        record = RunRecord(
            id=live.run_id, session_id=session.id, prompt=text[:200], requested_by=requested_by
        )
        started = RunStarted(
            run_id=live.run_id,
            session_id=session.id,
            requested_by=requested_by,
            system_prompt=self.rt.system_prompt,
            fingerprint=self.rt.fingerprint(),
            budgets=self.rt.budgets,
            has_prompter=prompter is not None,
            history=history,
        )
        opening: Entry = UserMessageEntry(text=text, by=requested_by)
        if refusal:
            result = TerminalResult(
                status=RunStatus.FAILED, stop_reason=StopReason.POLICY, error=refusal
            )
            opening = RunEnded(result=result)
        # The run's row and its first entries are one commit: a run never exists without them.
        first = [started, opening]
        lease = self.rt.lease_seconds
        epoch = await self.rt.store.create_run(
            record, self.rt.owner, lease, session=session, entries=first, alone=alone
        )
        live.created.set()
        journal = RunJournal(self.rt.store, RunState(live.run_id), epoch, lease)
        journal.written(first)
        self.rt.events.emit(RunStartedEvent(live.run_id, requested_by))
        if cause:
            self.rt.events.emit(AdvisoryEvent(live.run_id, cause))
        if refusal:
            await self._finished(journal.state, hooks)
            return journal.state
        return await self._drive(live, journal, prompter, hooks)

    async def _resume(
        self,
        live: LiveRun,
        epoch: int,
        state: RunState,
        prompter: Prompter | None,
        resumed: RunResumed,
        asked: str | None = None,
    ) -> RunState:
        if await self.cancels.at_resume(state, epoch, asked):
            # Cancelled from another process while it ran elsewhere, or waited: it goes no
            # further, whoever takes it up.
            return state
        journal = RunJournal(self.rt.store, state, epoch, self.rt.lease_seconds)
        # The loop journals ``resumed`` (audited as it lands) with the answers it reads, and
        # says so once that is durable.
        return await self._drive(live, journal, prompter, self.rt.run_hooks(), resumed)

    async def _drive(
        self,
        live: LiveRun,
        journal: RunJournal,
        prompter: Prompter | None,
        hooks: Hooks,
        resumed: RunResumed | None = None,
    ) -> RunState:
        run = RunContext(
            journal=journal,
            hooks=hooks,
            events=self.rt.events,
            open_request=self.decisions.open_request,
            stamp=self.rt.stamp,
            # Whichever client decides inline, its decisions are checked by the policy and audited.
            prompter=self.decisions.checked(prompter),
            workdir=self.rt.workdir,
            interrupt=live.signals.interrupt,
            provenance=self.rt.provenance,
            redact=self.rt.redact,
            look_for_cancel=functools.partial(self.cancels.asked_elsewhere, live),
        )
        deps = LoopDeps(
            model=self.rt.model,
            tools=self.rt.tools.current,
            model_timeout=self.rt.model_timeout,
            advisories=self.rt.tools.drain,
            lookup_request=self.decisions.lookup,
        )
        renewal = _Renewal(functools.partial(self._renew, journal, live), self.rt.renew_every)
        try:
            state = await AgentLoop(run, deps, live.signals).run(resumed)
        except Exception as exc:
            # What the loop queued is being written: the panic barrier, which reads the journal
            # back and appends the run's end, must come after it, not race it for its seq.
            with contextlib.suppress(Exception):
                await journal.flush()
            if not await self._end_landed(journal, exc, patient=True):
                raise
            state = journal.state  # its end is durable: announced below, as any end
        finally:
            renewal.stop()
        if state.result is not None:
            await self._finished(state, hooks)
        return state

    async def _barrier(self, live: LiveRun, work: Coroutine[Any, Any, RunState]) -> RunState:
        """The panic barrier: whatever escapes the run ends it failed, RunEnd fires once."""
        state = RunState(live.run_id)
        try:
            state = await work
        except ThreadBusy as exc:
            # Never created: another run of its thread came first. No event, no panic: it is
            # for the one who asked alone (``begun``).
            live.error = str(exc)
        except TakenOver as exc:
            log.warning("run %s taken over: %s", live.run_id, exc)
            self.rt.events.emit(RunTakenOverEvent(live.run_id, str(exc)))
            with contextlib.suppress(StoreError):
                await self.rt.store.audit(self.rt.owner, AuditAction.TAKEN_OVER, run_id=live.run_id)
        except StoreError as exc:
            # The journal cannot be written: stop here; the run resumes from what is durable.
            live.error = str(exc)
            log.warning("run %s stopped: %s", live.run_id, exc)
            self.rt.events.emit(JournalFailedEvent(live.run_id, str(exc)))
        except Exception as exc:
            stack = traceback.format_exc()
            state = await self._panic(live.run_id, exc, stack)
        finally:
            self.live.pop(live.run_id, None)
            live.left.set()
            # A suspended or ended run's last entry gave the lease up as it was written.
            if state.status is RunStatus.RUNNING:
                with contextlib.suppress(Exception):
                    await self._give_back(live.run_id)
        if state.status is RunStatus.SUSPENDED:
            await self._after_suspend(live, state)
        return state

    async def _give_back(self, run_id: str) -> None:
        """Release a run its task left running (the store failed under it, or its panic could
        not be journaled) if its journal holds an entry under this claim; else leave the claim
        to expire. Released with an epoch past its journal's last, it would be taken for a
        refused resume, which no sweep takes up again (``ORPHANED_RUNS``); expired, any
        replica's sweep adopts it."""
        store = self.rt.store
        record = await store.get_run(run_id)
        if record.owner != self.rt.owner:
            return  # taken over: not ours to give
        length = await store.journal_length(run_id)
        last = await store.load_range(run_id, length - 1, length) if length else []
        if last and last[0].epoch == record.epoch:
            await store.release(run_id, self.rt.owner, record.epoch)

    async def _after_suspend(self, live: LiveRun, state: RunState) -> None:
        """A cancel asked for while the run ran ends it now that it suspended (its batch
        ended in a wait before any loop boundary); a run that suspended on requests already
        answered goes on at once, on a task of its own."""
        try:
            if await self.cancels.at_suspend(live):
                return
            if self._may_go_on(live, state) and await self._can_go_on(state):
                live.next = await self.resume(state.run_id)
        except (ResumeRefused, StoreError) as exc:
            # Another process took it on, or the store is away: adoption or a resume will do.
            log.info("run %s: nothing more after its suspend: %s", state.run_id, exc)

    async def _panic(self, run_id: str, exc: Exception, stack: str) -> RunState:
        try:
            self.rt.events.emit(PanicEvent(run_id, stack))
        except Exception:
            log.exception("event sink failed while reporting a panic in %s", run_id)
        log.error("run %s panicked:\n%s", run_id, stack)
        try:
            record = await self.rt.store.get_run(run_id)
            state = fold(await self.rt.store.load(run_id), run_id)
            if state.result is not None:
                return state
            cause = f"internal error: {type(exc).__name__}: {exc}"
            await self._end_outside(state, record.epoch, RunStatus.FAILED, StopReason.PANIC, cause)
            return state
        except Exception:
            log.exception("could not journal the panic of %s", run_id)
            return RunState(run_id)

    async def _end_outside(
        self, state: RunState, epoch: int, status: RunStatus, reason: StopReason, error: str
    ) -> None:
        """End a run that no loop drives (cancel of a suspended run, a panic): journal, RunEnd."""
        result = TerminalResult(
            status=status,
            stop_reason=reason,
            error=error,
            usage=state.usage,
            outcomes=state.outcomes(),
        )
        journal = RunJournal(self.rt.store, state, epoch)
        try:
            await journal.append(RunEnded(result=result))
        except StoreError as exc:
            if not await self._end_landed(journal, exc):
                raise
        await self._finished(state)

    async def _end_landed(self, journal: RunJournal, exc: Exception, patient: bool = False) -> bool:
        """Whether the run's end, whose append failed with ``exc``, is durable all the same: a
        store that did not answer may have committed it (a connection dropped after COMMIT),
        and an end that landed unannounced would tell no RunEnd hook, thread or waiter that the
        run ended. Read back at its seq; ``patient``: read again until the store answers or
        this process stops (the run's task, which nobody else announces the end for)."""
        if not unanswered(exc) or journal.state.result is None:
            return False  # a store that answered (taken over, unreadable), or no end queued
        seq = journal.state.next_seq - 1
        while True:
            try:
                found = await self.rt.store.load_range(journal.run_id, seq, seq + 1)
            except StoreError as again:
                # A store that answered (an entry it cannot read) gives the same answer again.
                answered = not unanswered(again)
                if answered or not patient or await paused(self._stop, self.rt.renew_every):
                    log.warning(
                        "run %s: whether its end was journaled is unknown (%s); if it was,"
                        " no RunEnd hook was told",
                        journal.run_id,
                        again,
                    )
                    return False
                continue
            landed = bool(found) and isinstance(found[0].entry, RunEnded)
            return landed and found[0].epoch == journal.epoch

    async def _finished(self, state: RunState, hooks: Hooks | None = None) -> None:
        """RunEnd hooks and the end event, exactly once, when a terminal result is journaled."""
        assert state.result is not None
        self.cancels.ended(state.run_id)
        hooks = hooks or self.rt.run_hooks()
        ctx = HookContext(
            run_id=state.run_id, requested_by=state.started.requested_by if state.started else ""
        )
        await hooks.on_run_end(state.result, ctx)
        self.rt.events.emit(RunEndedEvent(state.run_id, state.result))

    async def _renew(self, journal: RunJournal, live: LiveRun) -> None:
        """Renew the run's lease, now and then every ``renew_every``, while its task drives it
        (``_Renewal`` starts this once the first renewal is due); and, at each renewal, look
        for a cancel another process asked of it (``Cancels.asked_elsewhere``)."""
        try:
            while True:
                try:
                    held = await self.rt.store.renew(
                        journal.run_id, self.rt.owner, journal.epoch, self.rt.lease_seconds
                    )
                except StoreError as exc:
                    # A store that blinks must not cost the run its lease: a long command would
                    # be adopted, and its effect asked about, though this process drives it.
                    self._renewals.failed(journal.run_id, exc)
                else:
                    self._renewals.renewed(journal.run_id)
                    if not held:
                        log.warning("run %s: lease lost", journal.run_id)
                        return
                    journal.lease_renewed()
                    await self.cancels.asked_elsewhere(live)
                await asyncio.sleep(self.rt.renew_every)
        finally:
            self._renewals.left(journal.run_id)

    # --- helpers ------------------------------------------------------------------------

    def _check_fingerprint(self, state: RunState, force: bool) -> None:
        """``ResumeRefused`` unless the run goes on as it started, or as a forced resume since
        accepted; the provider never changes."""
        if state.started is None or state.fingerprint is None:
            return
        before, now = state.fingerprint, self.rt.fingerprint()
        if before.provider != now.provider:
            raise ResumeRefused(
                f"run was started with provider {before.provider!r}, now {now.provider!r}; "
                "a run cannot change provider"
            )
        changed = [
            name
            for name, old, new in (
                ("model", before.model, now.model),
                ("tool set", before.tools_digest, now.tools_digest),
                ("system prompt", before.system_prompt_digest, now.system_prompt_digest),
            )
            if old != new
        ]
        if changed and not force:
            # Since a forced resume, a process configured as the run started differs too: "since
            # the run started" sent its operator looking for a change that is none.
            since = "the run started" if before == state.started.fingerprint else "it was forced on"
            # The command named whole: said after `runs approve` too, whose --force is none.
            raise ResumeRefused(
                f"the {', '.join(changed)} changed since {since}; resume with --force"
                f" (kestrel runs resume {state.run_id} --force)"
            )

    async def _held_elsewhere(self, run_id: str) -> str:
        """Why a run cannot be taken now: who holds its lease, when that lease expires, and
        what happens then (a live replica adopts it, or the next resume takes it over)."""
        record = await self.rt.store.get_run(run_id)
        owner = record.owner or "another process"
        replicas = await self.rt.store.list_replicas()
        holder = next((r for r in replicas if r.owner == record.owner), None)
        if holder is not None and not holder.stopping:
            return f"run {run_id} is live on replica {owner}, which drives it now"
        expires = record.lease_expires
        left = (expires - self.rt.clock()).total_seconds() if expires else 0
        if expires is None or left <= 0:
            return f"run {run_id} was held by {owner}, whose lease just expired: try again"
        others = [
            r.owner for r in replicas if r.owner not in (self.rt.owner, owner) and not r.stopping
        ]
        then = (
            f"a kestrel serve replica ({others[0]}) adopts it"
            if others
            else f"`kestrel runs resume {run_id}` takes it over"
        )
        if holder is not None:
            # It began to stop: it hands the run back, or its claim runs out; either way it
            # drives the run no further.
            at = f"{expires.astimezone(UTC):%H:%M:%S} UTC (in {math.ceil(left)} s)"
            return (
                f"run {run_id} is held by {owner}, which is stopping: its claim expires at {at}"
                f" unless it hands the run back first; then {then}"
            )
        return (
            f"run {run_id} is held by {owner}, whose lease expires in {math.ceil(left)} s unless"
            f" {owner} is alive and renews it; then {then}"
        )

    async def _history(self, session_id: str) -> tuple[tuple[str, str], ...]:
        """The last few finished turns of the session, as (role, text) pairs."""
        runs = await self.rt.store.list_runs(limit=HISTORY_TURNS, session_id=session_id)
        pairs: list[tuple[str, str]] = []
        for record in reversed(runs):
            try:
                state = fold(await self.rt.store.load(record.id), record.id)
            except UnreadableJournal as exc:
                # That turn is left out of the history, not every new turn of the thread.
                log.warning("session %s: a turn left out of the history: %s", session_id, exc)
                continue
            prompt = _own_prompt(state)
            answer = _answer_of(state.result) if state.result else ""
            if prompt and answer:
                pairs += [("user", prompt), ("assistant", answer)]
        return tuple(pairs)


def _answer_of(result: TerminalResult) -> str:
    """What a finished turn answered, for the history: its text, else its payload, else how
    it ended. A turn that failed (the model down, a budget spent) stays in the history, so
    that "try again" in its thread still says what to try; and the roles still alternate,
    which some servers' chat templates require."""
    if result.text:
        return result.text
    if result.payload:
        return wire.to_json(result.payload)
    status, how = result.status.value, result.stop_reason.value.replace("_", " ")
    return f"(no answer: the run {status if how == status else f'{status}, {how}'})"


def _own_prompt(state: RunState) -> str:
    """A run's own prompt: its first user message after the thread's history it was given."""
    history = state.started.history if state.started else ()
    earlier = sum(1 for role, _ in history if role == "user")
    prompts = [message.text for message in state.messages if isinstance(message, UserMessage)]
    return prompts[earlier] if len(prompts) > earlier else ""


async def _screen_prompt(hooks: Hooks, prompt: str, ctx: HookContext) -> tuple[str, str, str]:
    """UserPromptSubmit: (refusal, text, failure cause); a failing hook refuses (fails closed)."""
    try:
        verdict = await hooks.on_prompt(prompt, ctx)
    except HookFailure as exc:
        log.warning("run %s: %s", ctx.run_id, exc)
        return f"the prompt could not be checked by the policy hook {exc.hook}", "", str(exc)
    if not verdict.allow:
        return f"the prompt was refused: {verdict.reason or 'policy'}", "", ""
    return "", verdict.text if verdict.text is not None else prompt, ""


async def _ended(task: asyncio.Task[RunState]) -> RunState:
    """What ``task`` returned (or raised) once it is done, as ``asyncio.shield`` gives it: a
    waiter cancelled leaves the task alone. One callback and a future, where shield's take
    three callbacks and two futures (a fresh run waits on one)."""
    if not task.done():
        done: asyncio.Future[None] = task.get_loop().create_future()

        def wake(_task: object) -> None:
            if not done.done():  # not cancelled with its waiter
                done.set_result(None)

        task.add_done_callback(wake)
        try:
            await done
        finally:
            task.remove_done_callback(wake)  # a cancelled waiter leaves nothing on a long run
    return task.result()


def _prompter_for(state: RunState, prompter: Prompter | None) -> Prompter | None:
    """``prompter``; or, for a run started where people could be asked (chat, ``--defer``),
    one that defers its questions: they still can be asked, later."""
    if prompter is None and state.started is not None and state.started.has_prompter:
        return DeferringPrompter()
    return prompter
