"""Group commit of SQLite writes.

The writes queued during one pass of the event loop (journal appends, and every other write
of the store) are committed together, in one transaction, by a callback that runs right after
that pass: a hundred runs each waiting on a write share one fsync. The callback commits inline
while SQLite's write lock is free; when another connection holds it, a task waits for it on the
writer's thread, and the writes queued meanwhile go into the next batch.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any, Final, TypeVar

import msgspec

from bot.errors import StoreError
from storage import sql
from storage.common import Projection, diagnose
from storage.sql import SQLITE, Step
from storage.sqlite_steps import run_step
from storage.sqlite_writer import Contended, SqliteWriter

# Bounds one transaction's size (and the latency of the appends queued behind it).
MAX_BATCH: Final = 1024

# An entry lands only if its epoch is the run's current one and its seq the next free one:
# read first (the run's next seq and epoch), then inserted, in the batch's transaction, which
# no other writer enters (BEGIN IMMEDIATE). Not one INSERT ... SELECT guarded by the same
# reads: an insert whose SELECT reads the journal is run through a temporary table, which
# cost each append more than this read (and a fresh process one more statement to prepare,
# beside a new run's plain insert, which this one is).
_FENCE: Final = SQLITE.sql(sql.JOURNAL_LENGTH)
_INSERT_ENTRY: Final = SQLITE.sql(sql.INSERT_ENTRY)
_DIAGNOSE_ENTRY: Final = SQLITE.sql(sql.DIAGNOSE_APPEND)
_PROJECT_STATUS: Final = SQLITE.sql(sql.PROJECT_STATUS)

_T = TypeVar("_T")


class PendingAppend(msgspec.Struct):
    """One append waiting for the transaction that will hold it."""

    run_id: str
    seq: int
    epoch: int
    kind: str
    body: str
    projection: Projection | None
    # Rows the entry writes beside the journal (``storage.common.beside_entry``).
    beside: list[Step]
    done: asyncio.Future[None]

    def params(self, at: str) -> tuple[Any, ...]:
        """The row's values for ``sql.INSERT_ENTRY``."""
        return (self.run_id, self.seq, self.epoch, self.kind, self.body, at)


class _Write(msgspec.Struct):
    """Any other write: a body run in its own savepoint of the batch's transaction."""

    body: Callable[[sqlite3.Connection], Any]
    done: asyncio.Future[Any]


class _Failed(msgspec.Struct, frozen=True):
    """A write whose body raised: its savepoint was rolled back, the batch goes on."""

    error: Exception


_Job = PendingAppend | _Write


class GroupCommit:
    """Queues writes and commits them in batches, in submission order, one batch at a time."""

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
        self._pending: list[_Job] = []
        self._kick: asyncio.Handle | None = None
        self._waiting: asyncio.Task[None] | None = None

    def append(self, item: PendingAppend) -> None:
        """Queue an append; its future settles once the commit holding it is durable (or
        fails with why the row did not land)."""
        self._queue(item)

    def write(self, body: Callable[[sqlite3.Connection], _T]) -> asyncio.Future[_T]:
        """Queue a write; the future has what ``body`` returned once the commit is durable,
        or what it raised (nothing of it written)."""
        done: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        self._queue(_Write(body, done))
        return done

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

    def _queue(self, job: _Job) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Writes queued on another (closed) loop have nobody left to wait for them.
            self._loop, self._pending, self._kick, self._waiting = loop, [], None, None
        self._pending.append(job)
        self._schedule()

    def _schedule(self) -> None:
        if self._kick is None and self._waiting is None and self._pending:
            assert self._loop is not None
            self._kick = self._loop.call_soon(self._commit)

    def _commit(self) -> None:
        self._kick = None
        # A caller cancelled before its turn gives up the write: it is not made.
        batch = [job for job in self._pending[:MAX_BATCH] if not job.done.done()]
        del self._pending[:MAX_BATCH]
        if not batch:
            self._schedule()
            return
        write = _batch_writer(batch, self._now())
        with self._failing_together(batch):
            try:
                outcomes = self._writer.try_inline(write)
            except Contended:
                assert self._loop is not None
                self._waiting = self._loop.create_task(self._commit_waiting(batch, write))
                return
            _settle_all(batch, outcomes)
        self._schedule()

    async def _commit_waiting(
        self, batch: list[_Job], write: Callable[[sqlite3.Connection], list[object]]
    ) -> None:
        try:
            with self._failing_together(batch):
                _settle_all(batch, await self._writer.transact(write))
        finally:
            self._waiting = None
        self._schedule()

    def _failing_together(self, batch: list[_Job]) -> _FailingTogether:
        """Whatever stops the batch's transaction fails every write in it; an interruption
        (Ctrl-C, the loop's cancellation) too, so that nobody is left waiting."""
        return _FailingTogether(self, batch)

    def _fail_all(self, batch: list[_Job], exc: Exception) -> None:
        """The transaction as a whole failed (I/O, busy timeout): so did every write in it."""
        as_store_error = exc if isinstance(exc, StoreError) else self._failure(exc)
        failures: list[object] = [
            _Failed(as_store_error if isinstance(job, PendingAppend) else exc) for job in batch
        ]
        _settle_all(batch, failures)


class _FailingTogether:
    """``GroupCommit._failing_together``' block. A class, not ``contextlib.contextmanager``:
    every commit runs in one, and a generator's block cost 6,000 instructions more."""

    __slots__ = ("_batch", "_group")

    def __init__(self, group: GroupCommit, batch: list[_Job]) -> None:
        self._group, self._batch = group, batch

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, _tb: object) -> bool:
        if exc is None:
            return False
        if isinstance(exc, Exception):
            self._group._fail_all(self._batch, exc)
            return True  # each write was handed the failure
        self._group._fail_all(self._batch, StoreError(f"write abandoned: {exc!r}"))
        return False


def _batch_writer(batch: list[_Job], at: str) -> Callable[[sqlite3.Connection], list[object]]:
    """The transaction's body: each job in order, with what became of it."""
    if len(batch) == 1 and isinstance(batch[0], _Write):
        # A write alone needs no savepoint: if it raises, the whole transaction is rolled
        # back, and the batch's failure is its own (``_fail_all`` hands it what it raised).
        alone = batch[0].body
        return lambda conn: [alone(conn)]

    def write(conn: sqlite3.Connection) -> list[object]:
        return [
            _append(conn, job, at) if isinstance(job, PendingAppend) else _run(conn, job.body)
            for job in batch
        ]

    return write


def _append(conn: sqlite3.Connection, item: PendingAppend, at: str) -> _Failed | None:
    """Insert one row; on a miss, why (nothing when an identical record is already there)."""
    fence = conn.execute(_FENCE, (item.run_id,)).fetchone()  # next seq, epoch; or no run
    if fence is None or fence != (item.seq, item.epoch):
        refused = _diagnose(conn, item)
        return None if refused is None else _Failed(refused)
    conn.execute(_INSERT_ENTRY, item.params(at))
    if item.projection is not None or item.beside:
        # At once, not at the batch's end: a later write of the batch (a claim) sees it.
        _project(conn, item, at)
    return None


def _run(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], Any]) -> object:
    """A write in its own savepoint: if it raises, only its own changes are undone."""
    conn.execute("SAVEPOINT write")
    try:
        value = body(conn)
    except Exception as exc:
        conn.execute("ROLLBACK TO write")
        conn.execute("RELEASE write")
        return _Failed(exc)
    conn.execute("RELEASE write")
    return value


def _project(conn: sqlite3.Connection, item: PendingAppend, at: str) -> None:
    """Move the status (and lease) of the run whose landed entry changes it, and write the
    rows the entry writes beside the journal."""
    moved = item.projection
    if moved is not None:
        params = (moved.status.value, moved.stop_reason, at, item.run_id, moved.releases)
        conn.execute(_PROJECT_STATUS, params)
    for statement, values in item.beside:
        run_step(conn, statement, values)


def _diagnose(conn: sqlite3.Connection, item: PendingAppend) -> StoreError | None:
    """Why a row did not land: None when an identical record is already there."""
    row = conn.execute(_DIAGNOSE_ENTRY, (item.run_id, item.seq)).fetchone()
    return diagnose(item.run_id, item.seq, item.epoch, item.body, row)


def _settle_all(batch: list[_Job], outcomes: list[object]) -> None:
    """Hand each job what its body gave, or raise in it what made it fail."""
    for job, outcome in zip(batch, outcomes, strict=True):
        if job.done.done():
            continue
        if isinstance(outcome, _Failed):
            job.done.set_exception(_own_copy(outcome.error))
        elif isinstance(job, PendingAppend):
            job.done.set_result(None)
        else:
            job.done.set_result(outcome)


def _own_copy(error: Exception) -> Exception:
    """A store error of its own per waiter: one shared instance would collect every waiter's
    traceback. Other exceptions belong to the one write that raised them."""
    if not isinstance(error, StoreError):
        return error
    copy = type(error)(*error.args)
    copy.__cause__ = error.__cause__
    return copy
