"""Group commit of SQLite journal appends.

The appends queued during one pass of the event loop are committed together, in one
transaction, by a callback that runs right after that pass: a hundred runs each waiting on an
append share one fsync. The callback commits inline while SQLite's write lock is free; when
another connection holds it, a task waits for it on the writer's thread, and the appends
queued meanwhile go into the next batch.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from bot.store import StoreError
from storage.common import Projection, diagnose
from storage.sqlite_writer import Contended, SqliteWriter

# Bounds one transaction's size (and the latency of the appends queued behind it).
MAX_BATCH: Final = 1024

# It lands only if the epoch is the run's current one and the seq is the next free one, so
# the common case needs no read before the write.
_INSERT_ENTRY: Final = """
INSERT INTO journal(run_id, seq, epoch, kind, body, at)
SELECT ?1, ?2, ?3, ?4, ?5, ?6
WHERE (SELECT epoch FROM runs WHERE id = ?1) = ?3
  AND (SELECT COALESCE(MAX(seq), -1) + 1 FROM journal WHERE run_id = ?1) = ?2
"""
_DIAGNOSE_ENTRY: Final = """
SELECT epoch,
       (SELECT body FROM journal WHERE run_id = ?1 AND seq = ?2),
       (SELECT COALESCE(MAX(seq), -1) + 1 FROM journal WHERE run_id = ?1)
FROM runs WHERE id = ?1
"""
_PROJECT_STATUS: Final = """
UPDATE runs SET status = ?1, stop_reason = ?2, updated_at = ?3,
    owner = CASE WHEN ?5 THEN '' ELSE owner END,
    lease_expires = CASE WHEN ?5 THEN NULL ELSE lease_expires END
WHERE id = ?4
"""

_Outcomes = list[StoreError | None]


@dataclass(slots=True)
class PendingAppend:
    """One append waiting for the transaction that will hold it."""

    run_id: str
    seq: int
    epoch: int
    kind: str
    body: str
    projection: Projection | None
    done: asyncio.Future[None]

    def params(self, at: str) -> tuple[Any, ...]:
        """The row's values for ``_INSERT_ENTRY``."""
        return (self.run_id, self.seq, self.epoch, self.kind, self.body, at)


class GroupCommit:
    """Queues appends and commits them in batches, in submission order, one batch at a time."""

    def __init__(
        self,
        writer: SqliteWriter,
        now: Callable[[], str],
        failure: Callable[[Exception], StoreError],
    ) -> None:
        self._writer = writer
        self._now = now
        self._failure = failure
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[PendingAppend] = []
        self._kick: asyncio.Handle | None = None
        self._waiting: asyncio.Task[None] | None = None

    def submit(self, item: PendingAppend) -> None:
        """Queue ``item``; its future settles once the commit holding it is durable."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Appends queued on another (closed) loop have nobody left to wait for them.
            self._loop, self._pending, self._kick, self._waiting = loop, [], None, None
        self._pending.append(item)
        self._schedule()

    async def drain(self) -> None:
        """Commit everything queued, waiting for a batch on the thread if there is one."""
        if self._loop is not asyncio.get_running_loop():
            return
        if self._kick is not None:
            self._kick.cancel()
            self._kick = None
        while self._waiting is not None or self._pending:
            if self._waiting is not None:
                await self._waiting
            else:
                self._commit()

    def _schedule(self) -> None:
        if self._kick is None and self._waiting is None and self._pending:
            assert self._loop is not None
            self._kick = self._loop.call_soon(self._commit)

    def _commit(self) -> None:
        self._kick = None
        # A caller cancelled before its turn gives up the append: it is not written.
        batch = [item for item in self._pending[:MAX_BATCH] if not item.done.done()]
        del self._pending[:MAX_BATCH]
        if not batch:
            self._schedule()
            return
        write = _rows_writer(batch, self._now())
        try:
            outcomes = self._writer.try_inline(write)
        except Contended:
            assert self._loop is not None
            self._waiting = self._loop.create_task(self._commit_waiting(batch, write))
            return
        except Exception as exc:
            outcomes = self._failed(batch, exc)
        _settle_all(batch, outcomes)
        self._schedule()

    async def _commit_waiting(
        self, batch: list[PendingAppend], write: Callable[[sqlite3.Connection], _Outcomes]
    ) -> None:
        try:
            outcomes = await self._writer.transact(write)
        except Exception as exc:
            outcomes = self._failed(batch, exc)
        except BaseException as exc:
            # Cancelled with the loop: nobody may be left waiting.
            _settle_all(batch, [StoreError(f"append abandoned: {exc!r}")] * len(batch))
            raise
        finally:
            self._waiting = None
        _settle_all(batch, outcomes)
        self._schedule()

    def _failed(self, batch: list[PendingAppend], exc: Exception) -> _Outcomes:
        # The transaction as a whole failed (I/O, busy timeout): every append in it failed.
        error = exc if isinstance(exc, StoreError) else self._failure(exc)
        return [error] * len(batch)


def _rows_writer(batch: list[PendingAppend], at: str) -> Callable[[sqlite3.Connection], _Outcomes]:
    """The transaction's body: each row, its diagnosis if it missed, the status projections."""

    def write(conn: sqlite3.Connection) -> _Outcomes:
        outcomes: _Outcomes = []
        landed: list[PendingAppend] = []
        for item in batch:
            if conn.execute(_INSERT_ENTRY, item.params(at)).rowcount == 1:
                landed.append(item)
                outcomes.append(None)
            else:
                outcomes.append(_diagnose(conn, item))
        _project(conn, landed, at)
        return outcomes

    return write


def _project(conn: sqlite3.Connection, items: list[PendingAppend], at: str) -> None:
    """Move the status (and lease) of the runs whose landed entries change it."""
    updates = [
        (moved.status.value, moved.stop_reason, at, item.run_id, moved.releases)
        for item in items
        if (moved := item.projection) is not None
    ]
    if updates:
        conn.executemany(_PROJECT_STATUS, updates)


def _diagnose(conn: sqlite3.Connection, item: PendingAppend) -> StoreError | None:
    """Why a row did not land: None when an identical record is already there."""
    row = conn.execute(_DIAGNOSE_ENTRY, (item.run_id, item.seq)).fetchone()
    return diagnose(item.run_id, item.seq, item.epoch, item.body, row)


def _settle_all(batch: list[PendingAppend], outcomes: _Outcomes) -> None:
    for item, outcome in zip(batch, outcomes, strict=True):
        _settle(item.done, outcome)


def _settle(future: asyncio.Future[None], outcome: StoreError | None) -> None:
    if future.done():
        return
    if outcome is None:
        future.set_result(None)
        return
    # A fresh exception per waiter: one shared instance would collect every waiter's traceback.
    error = type(outcome)(*outcome.args)
    error.__cause__ = outcome.__cause__
    future.set_exception(error)
