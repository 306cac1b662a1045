"""Cancels: a live run at its next loop boundary, a suspended one at once, and one another
process holds through the store's once-mark (``cancel:RUN``), which its driver reads at each
lease renewal, before each consequential call and at its suspend, and any process reads as it
resumes or adopts the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, NoReturn

from bot.domain import TERMINAL_STATUSES, RunStatus, StopReason
from bot.errors import CancelRefused, StoreError, already_ended, unanswered
from bot.journal.fold import RunState, fold
from bot.journal.writer import TakenOver
from bot.kinds import AuditAction
from bot.people.decisions import Decisions
from bot.people.policy import Actor, NotPermitted
from bot.run.loop import unsettled
from bot.run.runtime import Runtime
from bot.waits import paused, time_left

if TYPE_CHECKING:
    # Types only: the supervisor holds this collaborator, and hands it its runs and their locks.
    from bot.run.supervisor import KeyedLocks, LiveRun

log = logging.getLogger("kestrel.supervisor")

# What a cancel recorded of a run this process drives says, the run still going: in words a
# chat thread reads ("the next loop boundary" told nobody that a command under way runs on).
STOPPING_HERE: Final = "cancelling: the run ends once the step under way is done"

# Ends a run no loop drives: journals its end (giving the lease at ``epoch`` up), RunEnd.
EndOutside = Callable[[RunState, int, RunStatus, StopReason, str], Awaitable[None]]


def asker(by: str) -> str:
    """Who asked a cancel, as the run's end names them ("" when the audit names nobody)."""
    return by or "an operator"


def cancel_key(run_id: str) -> str:
    """The once-mark that asks whichever process drives ``run_id`` to cancel it."""
    return f"cancel:{run_id}"


class Cancels:
    """Cancels asked of runs, wherever the run is: driven here, suspended, or held elsewhere."""

    def __init__(
        self,
        runtime: Runtime,
        decisions: Decisions,
        live: dict[str, LiveRun],
        locks: KeyedLocks,
        end_outside: EndOutside,
        stop: asyncio.Event,
    ) -> None:
        self.rt = runtime
        self.decisions = decisions
        self._live = live  # the supervisor's runs driven by a task of this process
        self._locks = locks  # the supervisor's, under which a resume looks and claims
        self._end_outside = end_outside
        # The supervisor's, set as this process stops: a cancel the store failed is tried here
        # no more.
        self._shutdown = stop
        # Cancels of runs driven here that the store failed to record: who asked, and the
        # task recording them (``_record_later``), until the store takes them.
        self._recording: dict[str, tuple[str, asyncio.Task[None]]] = {}

    async def cancel(self, run_id: str, by: str = "", actor: Actor | None = None) -> str:
        """Cancel a run: a live one at its next loop boundary, a suspended one at once.

        Only the run's requester or on-call may; anyone else gets ``NotPermitted`` (audited).
        """

        actor = actor or Actor(by)
        by = by or actor.user
        record = await self.rt.store.get_run(run_id)
        run = await self.decisions.place_of(run_id) if actor.place is not None else None
        policy = self.rt.policy
        refusal = await policy.check_operate(actor, "cancel", run_id, record.requested_by, run)
        if refusal:
            await self._audit_refusal(run_id, by, refusal.reason)
            raise NotPermitted(refusal.reason)
        return await self._cancel(run_id, by)

    async def _cancel(self, run_id: str, by: str) -> str:
        # A resume of this process between its claim and its task must not drive a run this
        # cancel ends: both look and claim under the run's lock.
        async with self._locks.hold(run_id):
            return await self._cancel_held(run_id, by)

    async def _cancel_held(self, run_id: str, by: str) -> str:
        # Looked at first: a run's task keeps it live while it runs its RunEnd hooks, after
        # its end, which no cancel undoes (nor would one ever come to say so).
        record = await self.rt.store.get_run(run_id)
        if record.status in TERMINAL_STATUSES:
            await self._refuse(run_id, by, already_ended(run_id, record.status, "cancel"))
        live = self._live.get(run_id)
        if live is not None:
            self._stop(live, by)
            if await self._recorded(run_id, by):
                return await self._stopping_here(run_id)
            return (
                "cancelling here once the step under way is done; but Kestrel's store did not"
                " answer, so the cancel is not recorded yet (tried again until it is): should"
                f" Kestrel stop first, run {run_id} goes on where it is taken up, so cancel it"
                " again then"
            )
        # A journal no process can read is said before any claim: claimed, the run would be
        # held for a lease by a process that did nothing with it.
        await self.rt.store.load(run_id)
        epoch = await self.rt.store.claim(run_id, self.rt.owner, self.rt.lease_seconds)
        if epoch is None:
            return await self._cancel_elsewhere(run_id, by)
        return await self._cancel_claimed(run_id, epoch, by)

    async def _stopping_here(self, run_id: str) -> str:
        """What a cancel recorded of a run driven here says: it stops at its boundary, unless
        its end was journaled since the look (asked too late: audited once, as asked). A store
        that fails the look changes nothing of that: the run stops here, its cancel recorded."""
        try:
            record = await self.rt.store.get_run(run_id)
        except StoreError as exc:
            if not unanswered(exc):
                raise
            return STOPPING_HERE
        if record.status is RunStatus.CANCELLED:
            return "cancelled"
        if record.status in TERMINAL_STATUSES:
            raise CancelRefused(already_ended(run_id, record.status, "cancel"))
        return STOPPING_HERE

    async def _recorded(self, run_id: str, by: str) -> bool:
        """Record the cancel of a run this process drives (stopped here already): audited, and
        carried by the store too, so that should this process die before the boundary, or an
        approval take the run up elsewhere between its suspend and the end applied there,
        whoever takes it up ends it (``at_resume``) instead of going on. A store that fails it
        is tried again until it takes it (``_record_later``); False then."""
        try:
            await self._record(run_id, by, audited=False)
        except StoreError as exc:
            if not unanswered(exc):
                raise  # what the store answered, not a failure: trying again would meet it again
            log.warning("run %s: its cancel is not recorded yet, trying again: %s", run_id, exc)
            if run_id not in self._recording:  # a cancel asked again meanwhile is the same one
                task = asyncio.create_task(self._record_later(run_id, by))
                self._recording[run_id] = (by, task)
                task.add_done_callback(lambda _: self._recording.pop(run_id, None))
            return False
        return True

    async def _record(self, run_id: str, by: str, audited: bool) -> None:
        """The cancel's audit (unless ``audited`` already), then its mark."""
        if not audited:
            await self.rt.store.audit(
                by, AuditAction.CANCEL, run_id=run_id, detail="at the loop boundary"
            )
        await self.rt.store.mark_once(cancel_key(run_id))

    async def _record_later(self, run_id: str, by: str) -> None:
        """Record a cancel the store failed, until it takes it. Audited once: an audit whose
        answer the store lost may have landed, so it is looked for first."""
        while True:
            await asyncio.sleep(self.rt.renew_every)
            with contextlib.suppress(StoreError):
                await self._record(run_id, by, await self._audited(run_id, by))
                log.warning("run %s: its cancel is recorded now", run_id)
                return

    async def _audited(self, run_id: str, by: str) -> bool:
        """Whether ``by``'s cancel of the run is the newest one audited."""
        asked = await self.rt.store.list_audit(run_id, limit=1, action=AuditAction.CANCEL)
        return bool(asked) and asked[-1].actor == by

    def ended(self, run_id: str) -> None:
        """The run's end is journaled: a cancel of it still being recorded has nothing left to
        stop (its end names who cancelled it), and is neither tried again nor said lost."""
        recording = self._recording.pop(run_id, None)
        if recording is not None:
            recording[1].cancel()

    async def settle(self, until: float | None) -> None:
        """Wait (no later than ``until``; without it, one lease) for the cancels the store
        failed to be recorded; each one still not recorded is said, for on-call: the run goes
        on wherever it is taken up, and its cancel must be asked again."""
        if not self._recording:
            return
        tasks = [task for _by, task in self._recording.values()]
        await asyncio.wait(tasks, timeout=time_left(until, self.rt.lease_seconds))
        for run_id, (by, task) in list(self._recording.items()):
            if task.done():
                continue
            task.cancel()
            log.error(
                "run %s: the cancel %s asked was never recorded (the store did not answer):"
                " the run goes on where it is taken up; cancel it again",
                run_id,
                asker(by),
            )

    async def _cancel_elsewhere(self, run_id: str, by: str) -> str:
        """Cancel a run another process holds: asked through the store, which its driver
        reads at every lease renewal and suspend, and any process at a resume (one that died
        holding it, its successor)."""
        owner = (await self.rt.store.get_run(run_id)).owner or "another process"
        # Audited before the mark, once: whoever reads the mark finds who asked (``asked``).
        await self.rt.store.audit(by, AuditAction.CANCEL, run_id=run_id, detail=f"asked of {owner}")
        await self.rt.store.mark_once(cancel_key(run_id))
        # Tried again once the mark is written: a run its driver suspended since (its lease
        # given up) is cancelled here; one still held is sure to see the mark.
        try:
            epoch = await self.rt.store.claim(run_id, self.rt.owner, self.rt.lease_seconds)
            if epoch is not None:
                return await self._cancel_claimed(run_id, epoch, by, audited=True)
        except StoreError as exc:
            if not unanswered(exc):
                raise
            # The mark holds whatever failed after it: the run goes no further anywhere.
            log.warning("run %s: its cancel is marked, not applied here: %s", run_id, exc)
            return (
                "cancelling: the cancel is written, but Kestrel's store did not answer as"
                " the run was taken up here to end it; whoever takes the run up ends it"
            )
        return (
            f"cancelling: {owner} holds the run and ends it at its next step, unless it"
            " finishes first (if it died, whoever takes the run up ends it)"
        )

    async def _cancel_claimed(
        self, run_id: str, epoch: int, by: str, *, audited: bool = False
    ) -> str:
        """Cancel a run whose lease this process just took at ``epoch``, unless it ended
        between the look and the claim (a claim does not ask whether a run ended). ``audited``:
        the cancel was audited as asked already."""
        state = fold(await self.rt.store.load(run_id), run_id)  # as it is under the claim
        if state.result is not None:
            await self.rt.store.release(run_id, self.rt.owner, epoch)
            ended = already_ended(run_id, state.result.status, "cancel")
            if audited and state.result.status is RunStatus.CANCELLED:
                return "cancelled"  # by whoever read the mark this cancel wrote, as asked
            if audited:  # asked too late: one line for one cancel, the asking
                raise CancelRefused(ended)
            await self._refuse(run_id, by, ended)
        if not audited:  # as it is asked: a store that fails the audit has ended nothing
            await self.rt.store.audit(by, AuditAction.CANCEL, run_id=run_id)
        try:
            await self._end(state, epoch, by)
        except StoreError as exc:
            # Failed after the end landed (its cards' closing): the run is cancelled all the
            # same, and must not be said to go on.
            if not unanswered(exc) or not await self._is_cancelled(run_id):
                raise
            log.warning("run %s cancelled; its open requests were not closed: %s", run_id, exc)
        return "cancelled"

    async def _is_cancelled(self, run_id: str) -> bool:
        """Whether the run's row says it ended cancelled; False if the store fails the look."""
        try:
            return (await self.rt.store.get_run(run_id)).status is RunStatus.CANCELLED
        except StoreError:
            return False

    async def at_suspend(self, live: LiveRun) -> bool:
        """Whether a cancel ends a run that just suspended: one asked while it ran (its batch
        ended in a wait before any loop boundary), or by another process (the mark, read
        once); if so, the run is ended here."""
        if not live.signals.cancel.is_set():
            asked = await self.asked(live.run_id)  # from another process
            if asked is not None:
                live.cancelled_by = asked
                live.signals.cancel.set()
        if not live.signals.cancel.is_set():
            return False
        await self._honour(live.run_id, live.cancelled_by)
        return True

    async def _honour(self, run_id: str, by: str) -> None:
        """End a run, just suspended, whose cancel ``by`` asked and was audited for already
        (here, or through the store): neither audited again nor refused in ``by``'s name. A run
        another process holds meanwhile (the asker, ending it; a decider) is left to the mark.

        A store that fails it (not one that answers: an unreadable journal or row) is tried again
        until it takes it, or this process stops: its card is closed once the store is back,
        not left open until a decision or its deadline.
        """
        again = False
        while True:
            try:
                async with self._locks.hold(run_id):
                    await self._honour_held(run_id, by, again)
                return
            except TakenOver as exc:
                # Another process took the run over between this claim and its end: held
                # there, it is left to the mark, which that process reads as it takes it up.
                log.warning("run %s taken over as its cancel was applied: %s", run_id, exc)
                with contextlib.suppress(StoreError):
                    await self.rt.store.mark_once(cancel_key(run_id))
                return
            except StoreError as exc:
                if not unanswered(exc):
                    # What the store answered (a journal, a run or a card it cannot read), not
                    # a failure: so it stays, however often it is asked.
                    raise
                log.warning("run %s: its cancel is not applied yet, trying again: %s", run_id, exc)
            again = True
            # Carried by the store meanwhile: should this process stop before the store takes
            # the end, whoever takes the run up (the resume of a decision too) ends it instead.
            with contextlib.suppress(StoreError):
                await self.rt.store.mark_once(cancel_key(run_id))
            if await paused(self._shutdown, self.rt.renew_every):
                log.warning("run %s: its cancel is left to whoever takes the run up", run_id)
                return

    async def _honour_held(self, run_id: str, by: str, again: bool) -> None:
        """``_honour`` under the run's lock; ``again``: after a store failure, which may have
        come between the run's end and the closing of its requests."""
        live = self._live.get(run_id)
        if live is not None:  # a task of this process took it on since
            self._stop(live, by)
            return
        await self._end_asked(run_id, by)
        if again and (await self.rt.store.get_run(run_id)).status is RunStatus.CANCELLED:
            await self.decisions.close_requests(run_id, by)

    async def asked_elsewhere(self, live: LiveRun) -> bool:
        """At a lease renewal of a run this process drives, and around its next effect: stop
        it if another process asked for its cancel (the mark); whether the run was asked to
        cancel, here or there. A store that fails the look is looked at again next time."""
        if live.signals.cancel.is_set():
            return True
        with contextlib.suppress(StoreError):  # looked at again at the next renewal
            asked = await self.asked(live.run_id)
            if asked is not None:
                self._stop(live, asked)
        return live.signals.cancel.is_set()

    async def at_resume(self, state: RunState, epoch: int, asked: str | None = None) -> bool:
        """Whether a run this process just took up (its lease held at ``epoch``) was asked to
        cancel, and is ended so here: it goes no further, whoever takes it up. ``asked``: who
        asked, if the resume read the mark already (once written, it stays): not read again."""
        if asked is None:
            asked = await self.asked(state.run_id)
        if asked is None:
            return False
        await self._end(state, epoch, asked)
        return True

    async def _end_asked(self, run_id: str, by: str, epoch: int | None = None) -> None:
        """End, as ``by`` asked, a run no task of this process drives, under the lease held at
        ``epoch`` or claimed now; one another process holds is left to the mark."""
        if epoch is None:
            epoch = await self.rt.store.claim(run_id, self.rt.owner, self.rt.lease_seconds)
        if epoch is None:
            await self.rt.store.mark_once(cancel_key(run_id))
            return
        state = fold(await self.rt.store.load(run_id), run_id)
        if state.result is not None:  # ended meanwhile (its asker claimed it first)
            await self.rt.store.release(run_id, self.rt.owner, epoch)
            return
        await self._end(state, epoch, by)

    async def instead(self, run_id: str, epoch: int | None = None) -> bool:
        """Whether a run no resume may take up without --force (its configuration changed) was
        asked to cancel, and is ended so here (under ``epoch``, if this process holds it):
        its end runs nothing, and whoever asked was told whoever takes the run up ends it."""
        asked = await self.asked(run_id)
        if asked is None:
            return False
        await self._end_asked(run_id, asked, epoch)
        return True

    async def _end(self, state: RunState, epoch: int, by: str) -> None:
        """End a run whose lease this process holds at ``epoch`` (no task of it runs), cancelled
        by ``by``, and close its requests (the cancel is audited by whoever asked it)."""
        cause = f"cancelled by {asker(by)}{await unsettled(state)}"
        # The end first (RunEnded gives the lease up as it is written): a request closed on a
        # run not yet ended reads as answered, and a crash between the two would let any
        # resume take the run on past its cancel. Left open on an ended run, it resumes nothing.
        await self._end_outside(state, epoch, RunStatus.CANCELLED, StopReason.CANCELLED, cause)
        await self.decisions.close_requests(state.run_id, by)

    async def asked(self, run_id: str) -> str | None:
        """Who asked through the store that the run be cancelled (``_cancel_elsewhere``), ""
        if nobody is named; None if nobody asked."""
        if not await self.rt.store.marked(cancel_key(run_id)):
            return None
        # The newest cancel audited of the run, alone: however much was audited since.
        asked = await self.rt.store.list_audit(run_id, limit=1, action=AuditAction.CANCEL)
        return asked[-1].actor if asked else ""

    def _stop(self, live: LiveRun, by: str) -> None:
        """Cancel a run this process drives, at once: the model call is cut, the call under way
        finishes, and no other call of its batch runs."""
        live.cancelled_by = by
        live.signals.cancel.set()
        live.signals.interrupt.request(spare_tools=True)

    async def _refuse(self, run_id: str, by: str, reason: str) -> NoReturn:
        """Refuse a cancel of a run that ended, audited."""
        await self._audit_refusal(run_id, by, reason)
        raise CancelRefused(reason)

    async def _audit_refusal(self, run_id: str, by: str, reason: str) -> None:
        """Audit a refused cancel; a store that fails it changes nothing of the refusal, which
        the asker is told (not that the cancel may not have counted)."""
        try:
            await self.rt.store.audit(by, AuditAction.CANCEL_REFUSED, run_id=run_id, detail=reason)
        except StoreError as exc:
            log.warning("run %s: the cancel refused %s was not audited: %s", run_id, asker(by), exc)
