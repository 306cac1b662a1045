"""GroupCommit: the writes of one event-loop pass share a transaction; each stands alone."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from bot.errors import StoreError
from storage.sqlite_group_commit import GroupCommit
from storage.sqlite_writer import SqliteWriter
from tests.storage.conftest import table_rows


@pytest.fixture
async def group(table_db: Path) -> AsyncIterator[GroupCommit]:
    writer = await SqliteWriter.open(table_db, "PRAGMA synchronous = FULL;", busy_timeout=5.0)
    yield GroupCommit(writer, now=lambda: "2030-01-01T00:00:00", failure=StoreError)
    await writer.close()


def insert(*values: str) -> Callable[[sqlite3.Connection], str]:
    """A write that inserts ``values`` and returns the last of them."""

    def body(conn: sqlite3.Connection) -> str:
        for value in values:
            conn.execute("INSERT INTO t VALUES (?)", (value,))
        return values[-1]

    return body


async def test_a_failing_write_is_undone_alone_and_the_others_land_in_order(
    group: GroupCommit, table_db: Path
) -> None:
    first = group.write(insert("a"))
    failing = group.write(insert("b", "a"))  # "a" again: UNIQUE fails
    last = group.write(insert("c"))

    results = await asyncio.gather(first, failing, last, return_exceptions=True)

    assert results[0] == "a" and results[2] == "c"
    assert isinstance(results[1], sqlite3.IntegrityError)
    assert table_rows(table_db) == ["a", "c"]  # nothing of the failing write, not even its "b"


async def test_writes_of_later_passes_commit_in_later_batches(
    group: GroupCommit, table_db: Path
) -> None:
    await group.write(insert("one"))
    assert table_rows(table_db) == ["one"]  # durable once awaited

    await asyncio.gather(group.write(insert("two")), group.write(insert("three")))

    assert table_rows(table_db) == ["one", "two", "three"]


async def test_a_cancelled_write_is_not_made(group: GroupCommit, table_db: Path) -> None:
    given_up = group.write(insert("never"))
    given_up.cancel()
    await group.write(insert("kept"))

    assert table_rows(table_db) == ["kept"]


async def test_drain_commits_what_is_queued(group: GroupCommit, table_db: Path) -> None:
    queued = group.write(insert("queued"))
    await group.drain()

    assert queued.done() and table_rows(table_db) == ["queued"]


async def test_a_write_alone_commits_without_a_savepoint(
    group: GroupCommit, table_db: Path
) -> None:
    seen: list[str] = []
    group._writer._conn.set_trace_callback(seen.append)

    await group.write(insert("alone"))

    assert seen == ["BEGIN IMMEDIATE", "INSERT INTO t VALUES ('alone')", "COMMIT"]
    assert table_rows(table_db) == ["alone"]


async def test_a_failing_write_alone_is_undone_whole_and_the_next_one_lands(
    group: GroupCommit, table_db: Path
) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        await group.write(insert("b", "b"))  # "b" again: UNIQUE fails

    assert table_rows(table_db) == []  # not even its first "b"
    assert await group.write(insert("c")) == "c"
    assert table_rows(table_db) == ["c"]


async def test_a_transaction_that_fails_whole_fails_every_write_and_the_next_lands(
    group: GroupCommit, table_db: Path
) -> None:
    def ends_the_transaction(conn: sqlite3.Connection) -> None:
        conn.execute("COMMIT")  # the batch's savepoint and transaction gone under it

    first = group.write(insert("a"))
    ending = group.write(ends_the_transaction)
    results = await asyncio.gather(first, ending, return_exceptions=True)

    assert all(isinstance(result, sqlite3.OperationalError) for result in results)
    assert results[0] is results[1]  # the transaction's one failure, handed to each
    assert await group.write(insert("c")) == "c"


async def test_an_interrupted_transaction_abandons_every_write_and_goes_on(
    group: GroupCommit, table_db: Path
) -> None:
    def interrupted(conn: sqlite3.Connection) -> None:
        raise KeyboardInterrupt  # Ctrl-C while the batch is written

    first = group.write(insert("a"))
    cut = group.write(interrupted)
    with pytest.raises(KeyboardInterrupt):
        group._commit()  # as the loop's callback does, which would end the test's loop
    for write in (first, cut):
        with pytest.raises(StoreError, match=r"write abandoned: KeyboardInterrupt\(\)"):
            await write
    assert table_rows(table_db) == []
