"""The SQLite reader connection: queries run inline, on aiosqlite's thread only while busy.

In WAL mode a reader never waits for the writer, so a query costs its own work (tens of
microseconds for a request or a run's journal), while a hop to a worker thread and back costs
0.3 ms or more on a small machine, and a fresh process pays a thread's start on top. Only a
busy database (another connection recovering the WAL, say) answers ``SQLITE_BUSY`` at once;
that query then waits out the busy timeout on aiosqlite's thread, opened on first need.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from storage.sql_store import Row
from storage.sqlite_writer import busy

# aiosqlite is imported by the first busy query, which needs its thread: a process whose reads
# all run inline (nearly every one) does not pay for its import.
if TYPE_CHECKING:
    import aiosqlite


class SqliteReader:
    """One read-only connection queried inline, and a patient one for a busy database."""

    def __init__(
        self, conn: sqlite3.Connection, target: str, uri: bool, busy_timeout: float, setup: str
    ) -> None:
        self._conn = conn
        self._target = target
        self._uri = uri
        self._busy_timeout = busy_timeout
        self._setup = setup
        self._patient: aiosqlite.Connection | None = None

    @classmethod
    def open(
        cls, target: str | Path, *, uri: bool, busy_timeout: float, setup: str
    ) -> SqliteReader:
        """Connect to ``target`` and run the ``setup`` script (pragmas, or a whole schema for
        an in-memory database), inline: waiting out the busy timeout only if the file is held
        (a pragma such as ``synchronous`` reads the schema)."""
        # No busy timeout (set without a statement): an inline query never waits.
        conn = sqlite3.connect(
            target, timeout=0, isolation_level=None, uri=uri, check_same_thread=False
        )
        try:
            try:
                conn.executescript(setup)
            except sqlite3.OperationalError as exc:
                if not busy(exc):
                    raise
                # Another connection holds the file (recovering the WAL, say): wait for it
                # as the store's busy timeout says, then never again (pragmas run twice alike).
                conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
                conn.executescript(setup)
                conn.execute("PRAGMA busy_timeout = 0")
        except BaseException:
            conn.close()
            raise
        return cls(conn, str(target), uri, busy_timeout, setup)

    async def fetchall(self, sql: str, params: Any) -> list[Row]:
        """The rows of one query: inline, or on the patient connection while SQLite is busy."""
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if not busy(exc):
                raise
        patient = await self._patient_connection()
        return list(await patient.execute_fetchall(sql, params))

    async def close(self) -> None:
        """Close both connections (and stop aiosqlite's thread, if it ever started)."""
        patient, self._patient = self._patient, None
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()
        if patient is not None:
            await _close_quietly(patient)

    async def _patient_connection(self) -> aiosqlite.Connection:
        if self._patient is None:
            import aiosqlite

            conn = await aiosqlite.connect(
                self._target, timeout=self._busy_timeout, isolation_level=None, uri=self._uri
            )
            try:
                await conn.executescript(self._setup)
            except BaseException:
                await _close_quietly(conn)
                raise
            self._patient = conn
        return self._patient


async def _close_quietly(conn: aiosqlite.Connection) -> None:
    # Closing must stop aiosqlite's (non-daemon) thread, whatever the connection's state.
    with contextlib.suppress(sqlite3.Error, ValueError):
        await conn.close()
