"""SqliteWriter: inline while SQLite's write lock is free, on its thread (never blocking the
event loop) while another connection holds it."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from storage.sqlite_writer import SqliteWriter
from tests.storage.conftest import table_rows

PRAGMAS = "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;"


@pytest.fixture
async def writer(table_db: Path) -> AsyncIterator[SqliteWriter]:
    opened = await SqliteWriter.open(table_db, PRAGMAS, busy_timeout=5.0)
    yield opened
    await opened.close()


@pytest.fixture
def other(table_db: Path) -> Iterator[sqlite3.Connection]:
    """Another connection, as another process would hold one."""
    conn = sqlite3.connect(table_db, isolation_level=None, check_same_thread=False)
    yield conn
    conn.close()


def insert(value: str) -> Callable[[sqlite3.Connection], int]:
    """A transaction body that inserts ``value`` and returns the thread it ran on."""

    def body(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO t VALUES (?)", (value,))
        return threading.get_ident()

    return body


async def test_an_uncontended_transaction_commits_on_the_callers_thread(
    writer: SqliteWriter, table_db: Path
) -> None:
    thread = await writer.transact(insert("a"))

    assert thread == threading.get_ident()
    assert table_rows(table_db) == ["a"]


async def test_a_held_lock_is_waited_out_on_the_thread_while_the_loop_runs(
    writer: SqliteWriter, other: sqlite3.Connection, table_db: Path
) -> None:
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO t VALUES ('other')")
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    asyncio.get_running_loop().call_later(0.3, other.execute, "COMMIT")
    thread = await writer.transact(insert("mine"))
    ticker.cancel()

    assert thread != threading.get_ident()
    assert ticks >= 10  # the event loop kept running while the writer waited
    assert table_rows(table_db) == ["other", "mine"]


async def test_a_lock_held_past_the_busy_timeout_fails_without_writing(
    table_db: Path, other: sqlite3.Connection
) -> None:
    writer = await SqliteWriter.open(table_db, PRAGMAS, busy_timeout=0.2)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await writer.transact(insert("late"))
        other.execute("ROLLBACK")
        await writer.transact(insert("after"))
    finally:
        await writer.close()

    assert table_rows(table_db) == ["after"]


async def test_a_failing_body_rolls_back_and_leaves_the_writer_usable(
    writer: SqliteWriter, table_db: Path
) -> None:
    def half_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES ('half')")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await writer.transact(half_then_fail)
    await writer.transact(insert("whole"))

    assert table_rows(table_db) == ["whole"]


async def test_transactions_never_interleave_on_the_connection(
    writer: SqliteWriter, other: sqlite3.Connection, table_db: Path
) -> None:
    # All wait on the thread while the lock is held; none may start a transaction inside
    # another's (SQLite would refuse a nested BEGIN), and each lands whole.
    other.execute("BEGIN IMMEDIATE")
    asyncio.get_running_loop().call_later(0.1, other.execute, "COMMIT")
    await asyncio.gather(*(writer.transact(insert(str(i))) for i in range(5)))

    assert sorted(table_rows(table_db)) == ["0", "1", "2", "3", "4"]
