"""A run's journal as its task sees it: fenced appends that keep the folded state in step."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from bot.errors import StaleEpoch
from bot.journal.entries import Entry
from bot.journal.fold import RunState, apply
from bot.journal.log import JournalLog
from bot.waits import outcome_retrieved


class TakenOver(Exception):
    """Another owner claimed the run: this task must stop without any further effect."""


class RunJournal:
    """Appends at the next seq under this task's epoch, then applies the entry to the state."""

    def __init__(
        self,
        store: JournalLog,
        state: RunState,
        epoch: int,
        lease_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.state = state
        # An attribute, not a property: read several times per iteration (a call each on 3.11).
        self.run_id = state.run_id  # the run this journal belongs to
        self.epoch = epoch
        self._lease_seconds = lease_seconds
        self._clock = clock
        self._sure_until = 0.0
        self._pending: list[asyncio.Future[None]] = []
        # Told once their entry, and every entry queued before it, is durable (events that
        # name a request), each with how many queued entries that takes.
        self._when_durable: list[tuple[int, Callable[[], None]]] = []
        self.lease_renewed()

    def lease_renewed(self) -> None:
        """The lease was just taken or renewed: nobody can claim the run for half its length."""
        self._sure_until = self._clock() + self._lease_seconds / 2

    async def append(self, entry: Entry) -> None:
        """Append durably (with every entry queued before it); a stale epoch means takeover."""
        self.append_soon(entry)
        await self.flush()

    def append_soon(self, entry: Entry, then: Callable[[], None] | None = None) -> None:
        """Queue an entry that need not be durable before the task goes on; ``then`` is
        called once it is (at the next ``append`` or ``flush``), never if it fails.

        The next ``append`` (or ``flush``) waits for it: entries commit in order, so an effect
        is never started, nor a model turn taken as had, before what precedes it is durable;
        and entries queued together commit together.
        """
        done = self.store.submit(self.run_id, self.state.next_seq, self.epoch, entry)
        self._pending.append(done)
        if then is not None:
            self._when_durable.append((len(self._pending), then))
        self.state.next_seq += 1
        apply(self.state, entry)

    def written(self, entries: list[Entry]) -> None:
        """Take ``entries`` as the journal's first, already durable (written with the run)."""
        for entry in entries:
            self.state.next_seq += 1
            apply(self.state, entry)

    async def flush(self) -> None:
        """Wait until every queued entry is durable; raise the first failure.

        Where a store commits a flush's entries one by one (PostgreSQL), a failure can leave
        the entries before it durable: their callbacks are still called.
        """
        if not self._pending:
            return  # nothing queued, so no callback either: the loop asks before every turn
        pending, self._pending = self._pending, []
        callbacks: list[tuple[int, Callable[[], None]]] = []
        if self._when_durable:
            callbacks, self._when_durable = self._when_durable, []
        durable = 0
        try:
            for done in pending:
                await done
                durable += 1
        except StaleEpoch as exc:
            raise TakenOver(str(exc)) from exc
        finally:
            if durable < len(pending):
                for done in pending:
                    # Every failure is seen, the first one is raised. An entry still being
                    # written fails too once one before it did (a store writes a run's entries
                    # in order): seen when it settles, or asyncio logs it as never retrieved.
                    done.add_done_callback(outcome_retrieved)  # its flush raised the first
            for needed, callback in callbacks:
                if needed <= durable:
                    callback()

    async def still_owner(self) -> bool:
        """The takeover check: a lease known to be live needs no read; else ask the store.

        A claim succeeds only once a lease has expired, so within half a lease of its last
        renewal (by this process's monotonic clock) nobody can hold a newer epoch. A process
        paused past that point reads the epoch before any effect.
        """
        if self._clock() < self._sure_until:
            return True
        return await self.store.current_epoch(self.run_id) == self.epoch
