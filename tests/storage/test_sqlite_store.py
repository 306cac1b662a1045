"""SqliteStore's connections: the settings each is opened with."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.domain import Session
from bot.errors import StoreError, UnknownRun
from bot.journal.entries import UserMessageEntry
from bot.records import RunRecord
from storage.sqlite import SqliteStore, open_sqlite
from storage.sqlite_schema import SCHEMA_VERSION


def _setting(conn: sqlite3.Connection, name: str) -> object:
    return conn.execute(f"PRAGMA {name}").fetchone()[0]


async def test_the_writer_keeps_a_small_page_cache_and_durable_commits(tmp_path: Path) -> None:
    store = await open_sqlite(tmp_path / "k.db")
    try:
        names = ("cache_size", "journal_mode", "synchronous", "foreign_keys")
        found = await store._writer().transact(lambda c: [_setting(c, n) for n in names])
        ((reader_cache,),) = await store._reader().fetchall("PRAGMA cache_size", ())
    finally:
        await store.close()
    assert found == [-512, "wal", 2, 1]  # 512 KiB; WAL; synchronous FULL; keys enforced
    assert reader_cache == -2000  # SQLite's default: reads of whole journals stay cached


async def test_point_and_journal_reads_ride_the_idle_writer_and_a_listing_opens_the_reader(
    tmp_path: Path,
) -> None:
    store = await open_sqlite(tmp_path / "k.db")
    try:
        version = await store.schema_version()
        with pytest.raises(UnknownRun):
            await store.load("run_missing")
        requests = await store.list_requests(run_id="run_missing", status=None)
        opened_before_a_listing = store._rconn is not None
        await store.list_requests()
        opened_by_a_listing = store._rconn is not None
    finally:
        await store.close()
    assert version == store.current_schema
    assert requests == []
    assert not opened_before_a_listing  # a fresh resume opens one connection
    assert opened_by_a_listing


async def test_once_the_reader_is_open_journals_are_read_there(tmp_path: Path) -> None:
    store = await open_sqlite(tmp_path / "k.db")
    seen: dict[str, list[str]] = {"writer": [], "reader": []}
    try:
        await store.list_runs()
        store._writer()._conn.set_trace_callback(seen["writer"].append)
        store._reader()._conn.set_trace_callback(seen["reader"].append)
        with pytest.raises(UnknownRun):
            await store.load("run_missing")
    finally:
        await store.close()
    assert any("FROM journal" in statement for statement in seen["reader"])
    assert not any("FROM journal" in statement for statement in seen["writer"])


async def test_a_point_read_goes_to_the_reader_while_the_writer_is_in_use(tmp_path: Path) -> None:
    store = await open_sqlite(tmp_path / "k.db")
    writer = store._writer()
    try:
        with writer._lock:  # as while a batch waits out another process's lock on the thread
            version = await store.schema_version()
        opened = store._rconn is not None
    finally:
        await store.close()
    assert version == store.current_schema
    assert opened


async def test_a_current_schema_opens_while_another_process_holds_the_write_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "k.db"
    await (await open_sqlite(path)).close()  # migrated
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a replica in the middle of a commit
    try:
        store = SqliteStore(path, busy_timeout=0.1)
        version = await store.migrate()  # the version read needs no lock: no wait, no error
        await store.close()
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert version == SCHEMA_VERSION


def tracing_connections(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement the connections opened from now on run, in order, as SQLite traces it."""
    seen: list[str] = []
    connect: Callable[..., sqlite3.Connection] = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(lambda statement: seen.append(" ".join(statement.split())))
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced)
    return seen


async def test_opening_a_migrated_store_runs_its_settings_and_one_version_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "k.db"
    await (await open_sqlite(path)).close()
    seen = tracing_connections(monkeypatch)

    await (await open_sqlite(path)).close()

    # The busy timeout is the connection's own (no statement); the file keeps WAL mode itself;
    # the version is read without looking the version table up first.
    assert [statement.rstrip(";") for statement in seen] == [
        "PRAGMA foreign_keys = ON",
        "PRAGMA synchronous = FULL",
        "PRAGMA wal_autocheckpoint = 256",
        "PRAGMA cache_size = -512",
        "SELECT COALESCE(MAX(version), 0) FROM schema_version",
    ]


def _empty_database(path: Path) -> None:
    """A database file in rollback mode with a header and no table (a table made and dropped)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.executescript("CREATE TABLE scratch (x TEXT); DROP TABLE scratch;")


async def test_a_file_in_rollback_mode_is_switched_to_wal_and_migrated(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    _empty_database(path)

    store = await open_sqlite(path)
    try:
        found = await store._writer().transact(lambda c: _setting(c, "journal_mode"))
        version = await store.schema_version()
    finally:
        await store.close()
    assert found == "wal"
    assert version == SCHEMA_VERSION


async def test_a_new_file_reads_as_version_0_and_then_as_migrated(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    _empty_database(path)  # no version table yet

    before = await SqliteStore(path).applied_version()
    await (await open_sqlite(path)).close()
    after = await SqliteStore(path).applied_version()

    assert (before, after) == (0, SCHEMA_VERSION)


def _another_programs_database(path: Path, journal_mode: str) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA journal_mode = {journal_mode}")
        conn.executescript("CREATE TABLE users (id INTEGER); CREATE TABLE runs (id INTEGER);")


def _tables_and_mode(path: Path) -> tuple[list[str], str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        tables = conn.execute("SELECT name FROM sqlite_master ORDER BY name").fetchall()
        return [name for (name,) in tables], str(_setting(conn, "journal_mode"))


@pytest.mark.parametrize("journal_mode", ["delete", "wal"])
async def test_another_programs_database_is_refused_and_left_as_it_was(
    tmp_path: Path, journal_mode: str
) -> None:
    path = tmp_path / "app.db"
    _another_programs_database(path, journal_mode)

    with pytest.raises(StoreError, match="not Kestrel's \\(runs, users\\)") as refused:
        await open_sqlite(path)

    assert "kestrel db migrate" not in str(refused.value)
    assert _tables_and_mode(path) == (["runs", "users"], journal_mode)


async def test_a_version_that_is_no_number_is_a_store_error_before_any_switch(
    tmp_path: Path,
) -> None:
    path = tmp_path / "k.db"
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE schema_version (version, applied_at TEXT)")
        conn.execute("INSERT INTO schema_version VALUES ('abc', 'then')")

    with pytest.raises(StoreError, match="holds 'abc', not a version"):
        await open_sqlite(path)


async def test_reading_another_programs_database_says_whose_it_is(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    _another_programs_database(path, "delete")

    with pytest.raises(StoreError, match="not Kestrel's") as read:
        await open_sqlite(path, read_only=True)
    with pytest.raises(StoreError, match="not Kestrel's"):
        await SqliteStore(path).applied_version()  # kestrel db check

    assert "kestrel db migrate" not in str(read.value)


OPEN_AS_NOBODY = """
import asyncio, sys
from storage.sqlite import open_sqlite
try:
    asyncio.run(open_sqlite(sys.argv[1]))
except Exception as exc:
    print(exc)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="another user's read-only folder needs root and setpriv (root may write any folder)",
)
def test_a_folder_the_store_may_not_write_is_named_as_the_cause() -> None:
    # SQLite says only "unable to open database file" where it cannot make the file (or its
    # -wal and -shm) in a folder it may not write: a read-only mount, another user's folder.
    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    with tempfile.TemporaryDirectory() as made:  # pytest's own are root's alone (0700)
        folder = Path(made)
        folder.chmod(0o755)
        said = subprocess.run(
            [*nobody, sys.executable, "-c", OPEN_AS_NOBODY, str(folder / "k.db")],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout

    assert f"its folder {folder} cannot be written" in said, said


async def test_an_append_checks_its_fence_and_inserts_as_a_new_runs_entries_are(
    tmp_path: Path,
) -> None:
    store = await open_sqlite(tmp_path / "k.db")
    seen: list[str] = []
    try:
        store._writer()._conn.set_trace_callback(lambda sql: seen.append(" ".join(sql.split())))
        session = Session(id="s1", platform="console", channel="", thread="")
        run = RunRecord(id="run_1", session_id="s1")
        first = [UserMessageEntry(text="look", by="ann")]
        await store.create_run(run, "w1", 60, session=session, entries=first, alone=True)
        await store.append("run_1", 1, 1, UserMessageEntry(text="again", by="ann"))
        loaded = await store.load("run_1")
    finally:
        await store.close()
    inserts = [statement for statement in seen if statement.startswith("INSERT INTO journal")]
    # One plain insert for both (prepared once, and no temporary table for the append's, as an
    # INSERT ... SELECT reading the journal it writes needs), the append's after its fence read.
    plain = "INSERT INTO journal(run_id, seq, epoch, kind, body, at) VALUES ('run_1', "
    assert len(inserts) == 2
    assert all(statement.startswith(plain) for statement in inserts)
    fence = seen.index(inserts[1]) - 1
    assert seen[fence].startswith("SELECT (SELECT COALESCE(MAX(seq), -1) + 1 FROM journal")
    assert [record.seq for record in loaded] == [0, 1]


def holding_the_file(path: Path) -> sqlite3.Connection:
    """Another connection holding the whole file, readers kept out: as one recovering the WAL
    after a crash, or checkpointing it as the last to close, would for a moment."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("PRAGMA locking_mode = EXCLUSIVE")
    other.execute("BEGIN IMMEDIATE")
    other.execute("DELETE FROM schema_version WHERE version < 0")
    other.execute("COMMIT")  # the exclusive lock stays until the connection closes
    return other


async def test_a_read_only_open_waits_out_a_file_held_for_a_moment(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    await (await open_sqlite(path)).close()
    other = holding_the_file(path)
    # The open runs inline, holding the event loop as it waits: only a thread can let go.
    threading.Timer(0.2, other.close).start()
    store = SqliteStore(path, read_only=True)  # busy timeout: 5 s
    try:
        version = await store.migrate()
    finally:
        await store.close()
    assert version == SCHEMA_VERSION
