"""A SQLite journal read with the standard library alone: the newest runs and the open requests
as their rows stand, for the read-only commands' fast path (``bot.cli.quick``), which must not
wait for asyncio, aiosqlite or pydantic to import. ``SqliteStore`` opens its read-only reader
on the same URI.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import msgspec

from bot.kinds import RequestStatus, RunStatus
from storage import sql
from storage.sqlite_schema import APPLIED_VERSION, SCHEMA_VERSION

_STATUSES = frozenset(status.value for status in RunStatus)
_NO_VERSION_TABLE: Final = "no such table: schema_version"
# The tables beside the version table, SQLite's own left out (a few name the database).
FOREIGN_TABLES: Final = (
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name != 'schema_version'"
    " AND name NOT LIKE 'sqlite^_%' ESCAPE '^' ORDER BY name LIMIT 5"
)
# A database file's header up to its format versions (https://sqlite.org/fileformat.html).
_HEADER_BYTES: Final = 20


# A struct: a NamedTuple class costs 0.9 M instructions to create, in every process that opens
# SQLite (``kestrel runs approve`` included), and a struct 0.15 M.
class RunRow(msgspec.Struct, frozen=True):
    """A run's row: the columns of ``sql.RUN_COLUMNS``, as SQLite stores them."""

    id: str
    session_id: str
    prompt: str
    requested_by: str
    status: str
    stop_reason: str
    owner: str
    epoch: int
    lease_expires: str | None
    created_at: str
    updated_at: str


class Unreadable(Exception):
    """The file is not a journal this Kestrel reads as it stands (the store says why)."""


def path_problem(path: Path) -> str | None:
    """Why no journal can be at ``path``, in words; None when one is there or may be made."""
    try:
        if path.is_dir():
            return "is a folder, not a database file"
        if not path.parent.is_dir():
            return f"its folder {path.parent} does not exist"
    except OSError as exc:  # a folder one may not look into, a name too long
        return f"cannot be looked at: {exc.strerror or exc}"
    return None


def reader_uri(path: Path) -> str:
    """A read-only reader's URI: ``mode=ro``, or ``immutable`` for a file nobody writes.

    A WAL reader needs the -shm file; ``mode=ro`` creates it (and an empty -wal) when it is
    missing, with the database's permissions, which would leave a read-only -shm behind next to
    a read-only file. Without a -wal no writer is at work (the last one to close removes it) and
    we may not write the file, or make the -shm in its folder (another user's), so it is read
    as it stands.
    """
    uri = path.resolve().as_uri()
    wal = path.with_name(path.name + "-wal")
    if not wal.exists() and not (writable(path) and os.access(path.parent, os.W_OK)):
        return uri + "?immutable=1"
    return uri + "?mode=ro"


def writable(path: Path) -> bool:
    """Whether ``path`` may be written: by its permission bits too, since root may write any file
    and yet a 0444 file says "do not write"."""
    return has_write_bits(path.stat().st_mode) and os.access(path, os.W_OK)


def has_write_bits(mode: int) -> bool:
    """Whether a file's mode lets anyone write it."""
    return bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def newest_runs(path: Path, limit: int) -> list[RunRow]:
    """The newest runs first; none for a file not made yet. ``Unreadable`` unless each row is
    as the store writes one, which the store reads as it stands."""
    rows = [RunRow(*row) for row in _query(path, sql.list_runs("", 1), (limit,))]
    if not all(map(_as_written, rows)):
        raise Unreadable("a run's row is not as the store writes it")
    return rows


def open_request_bodies(path: Path) -> list[str]:
    """The open requests' bodies (their JSON), oldest first; none for a file not made yet.
    Not those left open on a run that ended (``bot.chat.service.pending_requests``)."""
    statement = sql.list_requests(sql.of_unfinished_runs("WHERE status = $1"))
    rows = _query(path, statement, (RequestStatus.OPEN.value,))
    if not all(type(body) is str and decision is None for _, body, _, decision in rows):
        raise Unreadable("an open request's row is not as the store writes it")
    return [body for _, body, _, _ in rows]


def _as_written(row: RunRow) -> bool:
    """Whether ``row`` holds what the store writes: text, a known status, an integer epoch,
    and timestamps it reads back."""
    texts = (row.id, row.session_id, row.prompt, row.requested_by, row.stop_reason, row.owner)
    lease = () if row.lease_expires is None else (row.lease_expires,)
    stamps = (row.created_at, row.updated_at, *lease)
    return (
        all(type(value) is str for value in texts)
        and row.status in _STATUSES
        and type(row.epoch) is int
        and all(map(reads_as_moment, stamps))
    )


def reads_as_moment(value: object) -> bool:
    """Whether ``value`` is stored text the SQLite dialect reads as a moment (``sql.SQLITE``)."""
    if type(value) is not str:
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _query(path: Path, statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    problem = path_problem(path)
    if problem:
        raise Unreadable(problem)
    if not path.is_file():
        return []  # as the store reads it: an empty journal, and no file is created
    try:
        # No waiting for a lock: the store's reader waits, and says so if it must give up.
        conn = sqlite3.connect(reader_uri(path), uri=True, isolation_level=None, timeout=0)
    except (OSError, sqlite3.Error) as exc:
        raise Unreadable(str(exc)) from exc
    try:
        if applied_version(conn) != SCHEMA_VERSION:
            raise Unreadable("not the schema version this Kestrel reads")
        return conn.execute(sql.SQLITE.sql(statement), params).fetchall()
    except sqlite3.Error as exc:
        raise Unreadable(str(exc)) from exc
    finally:
        conn.close()


def applied_version(conn: sqlite3.Connection) -> int:
    """The newest schema version applied to ``conn``'s database, 0 before any; ``Unreadable``
    if its version table holds something else than a version."""
    # One statement: the version table is asked for, not looked up in sqlite_master first
    # (its absence, before any migration, is the rare case).
    try:
        version = conn.execute(APPLIED_VERSION).fetchone()[0]
    except sqlite3.OperationalError as exc:
        if no_version_table(exc):
            return 0
        raise
    return checked_version(version)


def foreign_tables(conn: sqlite3.Connection) -> list[str]:
    """The tables of a database with no Kestrel schema (version 0) that are not Kestrel's: its
    first migration makes every table together with its version row, so any table there but
    the version table (which a failed first migration leaves) is another program's."""
    rows = conn.execute(FOREIGN_TABLES).fetchall()
    return [str(name) for (name,) in rows]


def no_version_table(exc: BaseException | None) -> bool:
    """Whether ``exc`` is SQLite saying the database has no version table (no schema yet)."""
    return isinstance(exc, sqlite3.OperationalError) and str(exc) == _NO_VERSION_TABLE


def in_wal_mode(path: Path) -> bool:
    """Whether the database file at ``path`` is in WAL mode, read from its header (its read
    and write format versions, bytes 18 and 19, are 2): False for no file, or an empty one."""
    try:
        with path.open("rb", buffering=0) as file:
            header = file.read(_HEADER_BYTES)
    except OSError:
        return False
    return header[18:_HEADER_BYTES] == b"\x02\x02"


def checked_version(version: object) -> int:
    """A stored schema version, if it is one; else ``Unreadable`` saying what stands there."""
    if type(version) is not int:
        raise Unreadable(f"schema_version holds {version!r}, not a version")
    return version
