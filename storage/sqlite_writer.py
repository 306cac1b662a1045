"""The SQLite writer connection: transactions run inline while uncontended, on its thread else.

An uncontended commit costs one fsync (about 0.3 ms); a hop to a worker thread and back costs
as much again on a small machine, and a journaled run pays it twice per iteration. So a
transaction first tries to take SQLite's write lock without waiting, on the caller's thread;
only when another connection holds it does the transaction move to the writer's own thread,
where it may wait out the busy timeout without stalling the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from storage.sql_store import Params, Row

_T = TypeVar("_T")
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


def busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused for a lock another connection holds (``SQLITE_BUSY_RECOVERY``
    and the other extended codes included: their low byte is the primary code)."""
    return (exc.sqlite_errorcode & 0xFF) in _BUSY_CODES


class Contended(Exception):
    """The write lock (ours or SQLite's) is held: the transaction must wait on the thread."""


class SqliteWriter:
    """One writer connection; every use holds its lock, so no two transactions interleave."""

    def __init__(
        self, conn: sqlite3.Connection, busy_ms: int, thread: ThreadPoolExecutor | None = None
    ) -> None:
        self._conn = conn
        # Made on first need: a process that never meets another's lock makes none.
        self._thread = thread
        self._busy_ms = busy_ms
        self._lock = threading.Lock()
        self._on_thread_jobs = 0  # queued or running there: closing must wait behind them

    @classmethod
    async def open(
        cls,
        path: Path,
        pragmas: str,
        busy_timeout: float,
        setup: Callable[[sqlite3.Connection], None] = lambda _conn: None,
    ) -> SqliteWriter:
        """Connect inline, or on the writer's thread when opening must wait on another
        connection's lock (``setup`` switching to WAL, say).

        ``pragmas`` (which must take no lock, nor set the busy timeout: the connection's is
        the attempt's) and then ``setup`` run before the connection is handed out.
        """
        busy_ms = int(busy_timeout * 1000)

        def connect(patient: bool) -> sqlite3.Connection:
            # Autocommit mode: every transaction is an explicit BEGIN IMMEDIATE ... COMMIT.
            # The timeout is SQLite's busy timeout, set without a statement: none when inline.
            timeout = busy_timeout if patient else 0.0
            conn = sqlite3.connect(
                path, timeout=timeout, isolation_level=None, check_same_thread=False
            )
            try:
                conn.executescript(pragmas)
                setup(conn)
                if patient:
                    conn.execute("PRAGMA busy_timeout = 0")  # inline attempts never wait
            except BaseException:
                conn.close()
                raise
            return conn

        with contextlib.suppress(Exception):
            # A held lock fails the impatient attempt (or leaves the journal mode unswitched,
            # which ``setup`` refuses): the patient one below waits for it, or raises the fault.
            return cls(connect(patient=False), busy_ms)
        thread = _writer_thread()
        try:
            conn = await asyncio.get_running_loop().run_in_executor(thread, connect, True)
        except BaseException:
            thread.shutdown(wait=False)
            raise
        return cls(conn, busy_ms, thread)

    async def transact(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``body`` in one committed transaction; rolled back if it raises."""
        try:
            return self.try_inline(body)
        except Contended:
            return await self._on_thread(lambda: self._waiting(body))

    async def script(self, sql: str) -> None:
        """Run a script that manages its own transaction (migrations); rolled back on error."""

        def run() -> None:
            with self._lock, self._patient():
                try:
                    self._conn.executescript(sql)
                except BaseException:
                    self._rollback()
                    raise

        await self._on_thread(run)

    async def close(self) -> None:
        """Close the connection once the transactions queued on the thread are done (inline
        when none is there: a fresh process need not start the thread just to close)."""

        def close() -> None:
            with self._lock:
                self._conn.close()

        try:
            if self._on_thread_jobs == 0 and self._lock.acquire(blocking=False):
                try:
                    self._conn.close()
                finally:
                    self._lock.release()
                return
            await self._on_thread(close)
        finally:
            if self._thread is not None:
                self._thread.shutdown(wait=False)

    def try_inline(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``body`` in one committed transaction on this thread; ``Contended`` if the
        connection is in use or another connection holds SQLite's write lock."""
        if not self._lock.acquire(blocking=False):
            raise Contended
        try:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if busy(exc):
                    raise Contended from exc
                raise
            return self._finish(body)
        finally:
            self._lock.release()

    def try_read(self, sql: str, params: Params) -> list[Row] | None:
        """The rows of one query, inline on this connection while it is idle; None while a
        transaction holds it (here or on the thread) or SQLite is busy: the caller reads on
        its reader then."""
        return self.try_reading(lambda conn: conn.execute(sql, params).fetchall())

    def try_reading(self, body: Callable[[sqlite3.Connection], _T]) -> _T | None:
        """``body``'s reads (autocommit, no write lock) inline while this connection is idle;
        None while a transaction holds it or SQLite is busy."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._conn.in_transaction:
                return None
            return body(self._conn)
        except sqlite3.OperationalError as exc:
            if busy(exc):
                return None
            raise
        finally:
            self._lock.release()

    def _waiting(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._lock, self._patient():
            self._conn.execute("BEGIN IMMEDIATE")
            return self._finish(body)

    @contextlib.contextmanager
    def _patient(self) -> Iterator[None]:
        """Wait up to the busy timeout for SQLite's lock (on the thread only)."""
        self._conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        try:
            yield
        finally:
            self._conn.execute("PRAGMA busy_timeout = 0")

    def _rollback(self) -> None:
        # Called while another error propagates: that error is the one worth reporting.
        with contextlib.suppress(sqlite3.Error):
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")

    def _finish(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        try:
            result = body(self._conn)
            self._conn.execute("COMMIT")
        except BaseException:
            # A failed statement leaves its transaction (and SQLite's write lock) open.
            self._rollback()
            raise
        return result

    async def _on_thread(self, job: Callable[[], _T]) -> _T:
        if self._thread is None:
            self._thread = _writer_thread()
        self._on_thread_jobs += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, job)
        finally:
            self._on_thread_jobs -= 1


def _writer_thread() -> ThreadPoolExecutor:
    """The writer's one worker thread (started by its first job)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="kestrel-sqlite-writer")
