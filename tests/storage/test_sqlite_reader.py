"""SqliteReader: queries inline, with no thread at all, until SQLite answers busy; then on
aiosqlite's thread, waiting out the busy timeout without blocking the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.sqlite_reader import SqliteReader
from storage.sqlite_writer import SqliteWriter, busy
from tests.fakes.waiting import until
from tests.storage.conftest import table_rows

SELECT = "SELECT x FROM t ORDER BY rowid"


@pytest.fixture
def rollback_db(tmp_path: Path) -> Path:
    """A rollback-journal file with ``t`` holding 'a': there a held EXCLUSIVE lock keeps
    readers out, as a WAL being recovered would."""
    path = tmp_path / "r.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x TEXT)")
        conn.execute("INSERT INTO t VALUES ('a')")
    return path


@pytest.fixture
def locker(rollback_db: Path) -> Iterator[sqlite3.Connection]:
    """Another connection, as another process would hold one."""
    conn = sqlite3.connect(rollback_db, isolation_level=None, check_same_thread=False)
    yield conn
    conn.close()


async def test_reads_run_inline_and_start_no_thread(rollback_db: Path) -> None:
    before = threading.active_count()
    reader = SqliteReader.open(rollback_db, uri=False, busy_timeout=5.0, setup="")
    try:
        rows = [await reader.fetchall(SELECT, ()) for _ in range(3)]
    finally:
        await reader.close()

    assert rows == [[("a",)]] * 3
    assert threading.active_count() == before


async def test_a_busy_database_is_waited_out_on_a_thread_while_the_loop_runs(
    rollback_db: Path, locker: sqlite3.Connection
) -> None:
    before = threading.active_count()
    reader = SqliteReader.open(rollback_db, uri=False, busy_timeout=5.0, setup="")
    locker.execute("BEGIN EXCLUSIVE")
    locker.execute("INSERT INTO t VALUES ('b')")
    read = asyncio.create_task(reader.fetchall(SELECT, ()))
    try:
        # The inline attempt was refused: the read went to aiosqlite's thread.
        await until(lambda: threading.active_count() > before, interval=0.001)
        assert not read.done()
        locker.execute("COMMIT")
        rows = await asyncio.wait_for(read, 10)
        assert rows == [("a",), ("b",)]
        assert await reader.fetchall(SELECT, ()) == [("a",), ("b",)]  # inline again
    finally:
        await reader.close()

    await until(lambda: threading.active_count() == before)  # closing stopped it


async def test_a_lock_held_past_the_busy_timeout_fails_the_read(
    rollback_db: Path, locker: sqlite3.Connection
) -> None:
    reader = SqliteReader.open(rollback_db, uri=False, busy_timeout=0.1, setup="")
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await reader.fetchall(SELECT, ())
        locker.execute("ROLLBACK")
        assert await reader.fetchall(SELECT, ()) == [("a",)]
    finally:
        await reader.close()


def to_wal(conn: sqlite3.Connection) -> None:
    if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
        raise RuntimeError("not switched to WAL")


async def test_a_writer_opened_while_another_holds_the_lock_waits_for_it(
    table_db: Path,
) -> None:
    # Switching a fresh file to WAL needs the lock the other connection holds.
    fresh = table_db.with_name("fresh.db")
    locker = sqlite3.connect(fresh, isolation_level=None, check_same_thread=False)
    locker.execute("CREATE TABLE t (x TEXT UNIQUE)")
    locker.execute("BEGIN EXCLUSIVE")
    locker.execute("INSERT INTO t VALUES ('first')")
    opening = asyncio.create_task(SqliteWriter.open(fresh, "", busy_timeout=5.0, setup=to_wal))
    await until(lambda: any(t.name.startswith("kestrel-sqlite") for t in threading.enumerate()))
    assert not opening.done()
    locker.execute("COMMIT")
    locker.close()
    writer = await asyncio.wait_for(opening, 10)
    await writer.transact(lambda conn: conn.execute("INSERT INTO t VALUES ('second')"))
    await writer.close()

    assert table_rows(fresh) == ["first", "second"]


@pytest.mark.parametrize(
    ("code", "is_busy"),
    [
        (sqlite3.SQLITE_BUSY, True),
        (sqlite3.SQLITE_LOCKED, True),
        (261, True),  # SQLITE_BUSY_RECOVERY: another connection recovering the WAL
        (517, True),  # SQLITE_BUSY_SNAPSHOT
        (262, True),  # SQLITE_LOCKED_SHAREDCACHE
        (sqlite3.SQLITE_ERROR, False),
        (sqlite3.SQLITE_READONLY, False),
        (sqlite3.SQLITE_CORRUPT, False),
    ],
)
def test_busy_knows_sqlites_extended_codes(code: int, is_busy: bool) -> None:
    error = sqlite3.OperationalError("refused")
    error.sqlite_errorcode = code

    assert busy(error) is is_busy
