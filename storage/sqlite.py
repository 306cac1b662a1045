"""SqliteStore: the embedded default ``Store`` (WAL).

Reads go through aiosqlite. Every write joins a ``GroupCommit``: one transaction per pass of
the event loop, through ``SqliteWriter``, which commits inline while SQLite's write lock is free.
A store opened ``read_only`` has no writer at all: it neither migrates nor needs write access.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import stat
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, TypeVar

import aiosqlite

from bot.domain import Decision, Request, RequestStatus, Session, utcnow
from bot.journal.entries import Entry
from bot.records import JournalRecord, Replica, RunRecord, WorkItem
from bot.store import AuditRecord, StoreError, UnknownRun
from storage.common import (
    RUN_COLUMNS,
    AuditEntry,
    new_run_row,
    projection,
    qmark,
    record,
    replicas_from_rows,
    replicas_query,
    request_from_row,
    run_from_row,
    utc,
    wait_for_event,
    where,
    work_from_row,
    work_payload,
)
from storage.sqlite_group_commit import GroupCommit, PendingAppend
from storage.sqlite_schema import CREATE_VERSION_TABLE, SCHEMA_VERSION, migration_script
from storage.sqlite_writer import SqliteWriter

_T = TypeVar("_T")
_Row = Sequence[Any]

_SYNCHRONOUS_MODES: Final = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
# The WAL is checkpointed (and then rewritten from its start) at about 1 MiB, not SQLite's
# 4 MiB: a commit that grows the file pays for a second sync of its size, so a process
# reaches cheap commits after a few hundred writes instead of a few thousand.
_WAL_PAGES: Final = 256
_ENSURE_SESSION: Final = """
INSERT INTO sessions(id, platform, channel, thread, created_at) VALUES (?, ?, ?, ?, ?)
ON CONFLICT(id) DO NOTHING
"""
_CREATE_RUN: Final = f"INSERT INTO runs({RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?)"
# A closed request takes no more approvals; the same approver twice counts once.
_INSERT_APPROVAL: Final = """
INSERT INTO approvals(request_id, approver, at)
SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM requests WHERE id = ?1 AND status = 'open')
ON CONFLICT(request_id, approver) DO NOTHING
"""
_COUNT_APPROVALS: Final = """
SELECT (SELECT COUNT(*) FROM approvals WHERE request_id = ?1),
       EXISTS (SELECT 1 FROM requests WHERE id = ?1)
"""
_REQUEST_COLUMNS: Final = "body, status, decision"
# Runs inside the writer's BEGIN IMMEDIATE: no other connection, in any process, can take the
# same rows between the select and the update. RETURNING order is unspecified: callers sort.
_TAKE_WORK: Final = """
UPDATE work SET taken_by = ?1, taken_at = ?2
WHERE id IN (
    SELECT id FROM work
    WHERE done_at IS NULL AND (taken_at IS NULL OR taken_at < ?3)
    ORDER BY id LIMIT ?4
)
RETURNING id, kind, payload, created_at
"""
_HEARTBEAT: Final = """
INSERT INTO replicas(owner, info, started_at, last_seen) VALUES (?1, ?2, ?3, ?3)
ON CONFLICT(owner) DO UPDATE SET info = excluded.info, last_seen = excluded.last_seen
"""
# SQLite cannot wake other processes: a waiter polls at this interval for their work.
_WORK_POLL: Final = 0.2


class SqliteStore:
    """The journal, runs, requests and audit in one SQLite file (WAL, one writer connection)."""

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "FULL",
        clock: Callable[[], datetime] = utcnow,
        busy_timeout: float = 5.0,
        read_only: bool = False,
    ) -> None:
        # The reader is a second connection: an in-memory database would be a different one.
        if str(path) == ":memory:":
            raise StoreError("SqliteStore needs a database file; ':memory:' is not shared")
        if synchronous.upper() not in _SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {sorted(_SYNCHRONOUS_MODES)}")
        self._path = Path(path)
        self._synchronous = synchronous.upper()
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._read_only = read_only
        self._wconn: SqliteWriter | None = None
        self._rconn: aiosqlite.Connection | None = None
        self._group: GroupCommit | None = None
        # Set by this instance's enqueues (and by close): wakes its ``wait_for_work`` callers.
        self._work_added = asyncio.Event()
        self._closed = False

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    # -- lifecycle ---------------------------------------------------------------------------

    async def migrate(self) -> int:
        """Open the connections if needed and bring the schema to the current version.

        Read-only, open the reader alone and check the schema instead: nothing is written.
        """
        if self._closed:
            raise self._closed_error()
        if self._read_only:
            return await self._open_read_only()
        try:
            if self._wconn is None:
                self._wconn = await self._connect_writer()
                self._group = GroupCommit(self._wconn, self._now, self._append_failure)
            version = await self._apply_migrations(self._wconn)
            if self._rconn is None:
                self._rconn = await self._connect_reader()
        except BaseException:
            await self._disconnect()
            raise
        return version

    async def close(self) -> None:
        """Write what is queued and close both connections."""
        if self._closed:
            return
        self._closed = True
        self._work_added.set()
        if self._group is not None:
            await self._group.drain()
        await self._disconnect()

    # -- sessions and runs -------------------------------------------------------------------

    async def ensure_session(self, session: Session) -> None:
        """Create the session if it does not exist."""
        await self._write("ensure_session", _ENSURE_SESSION, self._session_row(session))

    async def create_run(
        self, run: RunRecord, owner: str, lease_seconds: float, session: Session | None = None
    ) -> int:
        """Insert a run owned by ``owner`` at epoch 1 (and ``session``, if new); the epoch."""

        def refused(cause: str) -> StoreError:
            if "FOREIGN KEY" in cause:
                return StoreError(f"unknown session {run.session_id!r}: call ensure_session first")
            return StoreError(f"run {run.id!r} already exists")

        def insert(conn: sqlite3.Connection) -> None:
            if session is not None:
                conn.execute(_ENSURE_SESSION, self._session_row(session))
            conn.execute(_CREATE_RUN, row)

        lease_expires = self._clock() + timedelta(seconds=lease_seconds)
        row = new_run_row(run, owner, lease_expires, _ts)
        await self._transact("create_run", insert, refused)
        return 1

    def _session_row(self, session: Session) -> tuple[Any, ...]:
        return (session.id, session.platform, session.channel, session.thread, self._now())

    async def get_run(self, run_id: str) -> RunRecord:
        """The run's row; raises ``UnknownRun``."""
        rows = await self._read(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
        if not rows:
            raise UnknownRun(f"unknown run {run_id!r}")
        return run_from_row(rows[0], _parse_ts)

    async def list_runs(self, limit: int = 50, session_id: str | None = None) -> list[RunRecord]:
        """The newest runs first, optionally of one session."""
        clause, params = where(qmark, session_id=session_id)
        rows = await self._read(
            f"SELECT {RUN_COLUMNS} FROM runs {clause} ORDER BY created_at DESC, rowid DESC LIMIT ?",
            (*params, limit),
        )
        return [run_from_row(row, _parse_ts) for row in rows]

    async def orphaned_runs(self, limit: int = 100) -> list[str]:
        """Runs marked running whose owner's lease expired or was given up: nobody drives them."""
        rows = await self._read(
            "SELECT id FROM runs WHERE status = 'running'"
            " AND (owner = '' OR lease_expires IS NULL OR lease_expires < ?)"
            " ORDER BY updated_at LIMIT ?",
            (self._now(), limit),
        )
        return [str(row[0]) for row in rows]

    # -- leases ------------------------------------------------------------------------------

    async def claim(
        self, run_id: str, owner: str, lease_seconds: float, *, force: bool = False
    ) -> int | None:
        """Take the lease (free, expired, already ours, or forced) and return the new epoch."""
        now = self._now()
        rows = await self._write_returning(
            "claim",
            "UPDATE runs SET owner = ?1, epoch = epoch + 1, lease_expires = ?2, updated_at = ?3"
            " WHERE id = ?4 AND (?5 OR owner = '' OR owner = ?1"
            "   OR lease_expires IS NULL OR lease_expires <= ?3)"
            " RETURNING epoch",
            (owner, self._lease_until(lease_seconds), now, run_id, int(force)),
        )
        if rows:
            return int(rows[0][0])
        await self._require_run(run_id)
        return None

    async def renew(self, run_id: str, owner: str, epoch: int, lease_seconds: float) -> bool:
        """Extend a lease still held at ``epoch``; False when it was taken."""
        changed = await self._write(
            "renew",
            "UPDATE runs SET lease_expires = ?, updated_at = ?"
            " WHERE id = ? AND owner = ? AND epoch = ?",
            (self._lease_until(lease_seconds), self._now(), run_id, owner, epoch),
        )
        return changed == 1

    async def release(self, run_id: str, owner: str, epoch: int) -> None:
        """Give the lease up if still held at ``epoch``."""
        await self._write(
            "release",
            "UPDATE runs SET owner = '', lease_expires = NULL, updated_at = ?"
            " WHERE id = ? AND owner = ? AND epoch = ?",
            (self._now(), run_id, owner, epoch),
        )

    async def current_epoch(self, run_id: str) -> int:
        """The run's epoch as the database has it now."""
        rows = await self._read("SELECT epoch FROM runs WHERE id = ?", (run_id,))
        if not rows:
            raise UnknownRun(f"unknown run {run_id!r}")
        return int(rows[0][0])

    # -- journal -----------------------------------------------------------------------------

    async def append(self, run_id: str, seq: int, epoch: int, entry: Entry) -> None:
        """Append at ``seq`` fenced by ``epoch``; returns once the commit holding it is durable."""
        await self.submit(run_id, seq, epoch, entry)

    def submit(self, run_id: str, seq: int, epoch: int, entry: Entry) -> asyncio.Future[None]:
        """Queue an append now (written in submission order); the future settles after commit."""
        self._writer()  # fail fast when closed or not migrated
        assert self._group is not None
        item = PendingAppend(
            run_id=run_id,
            seq=seq,
            epoch=epoch,
            kind=entry.kind,
            body=entry.model_dump_json(),
            projection=projection(entry),
            done=asyncio.get_running_loop().create_future(),
        )
        self._group.append(item)
        return item.done

    async def load(self, run_id: str) -> list[JournalRecord]:
        """The run's whole journal, in order; raises ``UnknownRun``."""
        rows = await self._read(
            "SELECT seq, epoch, body FROM journal WHERE run_id = ? ORDER BY seq", (run_id,)
        )
        if not rows:
            await self._require_run(run_id)
        return [record(run_id, int(seq), int(epoch), body) for seq, epoch, body in rows]

    # -- requests ----------------------------------------------------------------------------

    async def open_request(self, request: Request) -> None:
        """Record a request as open; a second call with the same id changes nothing."""

        def refused(cause: str) -> StoreError:
            return UnknownRun(f"unknown run {request.run_id!r} for request {request.id!r}")

        await self._write(
            "open_request",
            "INSERT INTO requests(id, run_id, kind, call_id, tool, body, status, decision,"
            " created_at, deadline) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)"
            " ON CONFLICT(id) DO NOTHING",
            (
                request.id,
                request.run_id,
                request.kind.value,
                request.call_id,
                request.tool,
                request.model_dump_json(),
                RequestStatus.OPEN.value,
                _ts(request.created_at),
                None if request.deadline is None else _ts(request.deadline),
            ),
            on_integrity=refused,
        )

    async def get_request(self, request_id: str) -> tuple[Request, RequestStatus, Decision | None]:
        """A request, its status and its decision; raises ``KeyError`` if unknown."""
        rows = await self._read(
            f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE id = ?", (request_id,)
        )
        if not rows:
            raise KeyError(request_id)
        return request_from_row(rows[0])

    async def list_requests(
        self, *, run_id: str | None = None, status: RequestStatus | None = RequestStatus.OPEN
    ) -> list[tuple[Request, RequestStatus, Decision | None]]:
        """Requests filtered by run and status, oldest first."""
        clause, params = where(
            qmark, run_id=run_id, status=None if status is None else status.value
        )
        rows = await self._read(
            f"SELECT {_REQUEST_COLUMNS} FROM requests {clause} ORDER BY created_at, rowid",
            params,
        )
        return [request_from_row(row) for row in rows]

    async def decide(self, decision: Decision, status: RequestStatus) -> bool:
        """Close an open request; True only for the one caller whose update changed it."""
        if status is RequestStatus.OPEN:
            raise ValueError("decide() needs a closing status, not 'open'")
        changed = await self._write(
            "decide",
            "UPDATE requests SET status = ?, decision = ? WHERE id = ? AND status = 'open'",
            (status.value, decision.model_dump_json(), decision.request_id),
        )
        if changed == 1:
            return True
        await self.get_request(decision.request_id)  # unknown ids raise KeyError, not False
        return False

    async def add_approval(self, request_id: str, by: str) -> int:
        """Record ``by`` as an approver of an open request; the number of distinct approvers."""

        def run(conn: sqlite3.Connection) -> list[_Row]:
            conn.execute(_INSERT_APPROVAL, (request_id, by, self._now()))
            return conn.execute(_COUNT_APPROVALS, (request_id,)).fetchall()

        rows = await self._transact("add_approval", run, None)
        count, known = rows[0]
        if not known:
            raise KeyError(request_id)
        return int(count)

    async def mark_once(self, key: str) -> bool:
        """Claim ``key``; True only for the first caller ever, across processes."""
        changed = await self._write(
            "mark_once",
            "INSERT INTO once_keys(key, at) VALUES (?, ?) ON CONFLICT(key) DO NOTHING",
            (key, self._now()),
        )
        return changed == 1

    # -- work and replicas -------------------------------------------------------------------

    async def enqueue_work(self, kind: str, payload: dict[str, Any]) -> int:
        """Add inbound work and wake this instance's waiters (other processes poll); its id."""
        rows = await self._write_returning(
            "enqueue_work",
            "INSERT INTO work(kind, payload, created_at) VALUES (?, ?, ?) RETURNING id",
            (kind, work_payload(kind, payload), self._now()),
        )
        self._work_added.set()
        return int(rows[0][0])

    async def take_work(
        self, owner: str, limit: int = 10, retake_after: float = 60.0
    ) -> list[WorkItem]:
        """Take up to ``limit`` untaken or abandoned items, oldest first, for ``owner``."""
        if limit <= 0:
            return []
        now = self._clock()
        abandoned_before = _ts(now - timedelta(seconds=retake_after))
        rows = await self._write_returning(
            "take_work", _TAKE_WORK, (owner, _ts(now), abandoned_before, limit)
        )
        items = [work_from_row(row, _parse_ts) for row in rows]
        return sorted(items, key=lambda item: item.id)

    async def finish_work(self, work_id: int) -> None:
        """Mark an item done so nobody takes it again; finishing it twice changes nothing."""
        await self._write(
            "finish_work",
            "UPDATE work SET done_at = ? WHERE id = ? AND done_at IS NULL",
            (self._now(), work_id),
        )

    async def wait_for_work(self, timeout: float) -> None:
        """Return once this instance enqueued work, or after ``timeout`` (0.2 s at most)."""
        self._reader()  # fail fast when closed or not migrated
        await wait_for_event(self._work_added, min(timeout, _WORK_POLL))

    async def heartbeat(self, owner: str, info: str = "") -> None:
        """Register replica ``owner``, or refresh its info and last-seen time."""
        await self._write("heartbeat", _HEARTBEAT, (owner, info, self._now()))

    async def list_replicas(self, alive_within: float = 60.0) -> list[Replica]:
        """Replicas seen within ``alive_within`` seconds, with the runs they own."""
        since = _ts(self._clock() - timedelta(seconds=alive_within))
        rows = await self._read(replicas_query(qmark), (since,))
        return replicas_from_rows(rows, _parse_ts)

    # -- audit -------------------------------------------------------------------------------

    async def audit(
        self, actor: str, action: str, run_id: str = "", request_id: str = "", detail: str = ""
    ) -> None:
        """Record one audited fact."""
        await self._write(
            "audit",
            "INSERT INTO audit(at, actor, action, run_id, request_id, detail)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (self._now(), actor, action, run_id, request_id, detail),
        )

    async def list_audit(self, run_id: str | None = None, limit: int = 200) -> list[AuditRecord]:
        """The newest ``limit`` audited facts (of one run, if given), oldest first."""
        clause, params = where(qmark, run_id=run_id)
        rows = await self._read(
            "SELECT at, actor, action, run_id, request_id, detail FROM ("
            f" SELECT id, at, actor, action, run_id, request_id, detail FROM audit {clause}"
            " ORDER BY id DESC LIMIT ?) ORDER BY id",
            (*params, limit),
        )
        entries = [
            AuditEntry(_parse_ts(at), actor, action, rid, req, detail)
            for at, actor, action, rid, req, detail in rows
        ]
        return list[AuditRecord](entries)

    # -- connections and helpers -------------------------------------------------------------

    async def _connect_writer(self) -> SqliteWriter:
        """Open the writer: WAL, durable commits, enforced foreign keys."""
        self._refuse_read_only_file()

        def wal(conn: sqlite3.Connection) -> None:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"SQLite database {self._path}: cannot switch to WAL mode")

        pragmas = self._connection_pragmas() + f"PRAGMA wal_autocheckpoint = {_WAL_PAGES};"
        with self._errors("open"):
            return await SqliteWriter.open(self._path, pragmas, self._busy_timeout, setup=wal)

    async def _connect_reader(self) -> aiosqlite.Connection:
        """Open the reader: autocommit, so every query sees the latest commit."""
        target: str | Path = self._reader_uri() if self._read_only else self._path
        with self._errors("open"):
            conn = await aiosqlite.connect(
                target, timeout=self._busy_timeout, isolation_level=None, uri=self._read_only
            )
        try:
            with self._errors("open"):
                await conn.executescript(self._connection_pragmas() + "PRAGMA query_only = ON;")
        except BaseException:
            await _close_quietly(conn)
            raise
        return conn

    def _reader_uri(self) -> str:
        """The read-only reader's URI: ``mode=ro``, or ``immutable`` for a file nobody writes.

        A WAL reader needs the -shm file; ``mode=ro`` creates it (and an empty -wal) when it
        is missing, with the database's permissions, which would leave a read-only -shm behind
        next to a read-only file. Without a -wal no writer is at work (the last one to close
        removes it) and nobody may write the file, so it is read as it stands.
        """
        uri = self._path.resolve().as_uri()
        wal = self._path.with_name(self._path.name + "-wal")
        if not self._writable() and not wal.exists():
            return uri + "?immutable=1"
        return uri + "?mode=ro"

    def _writable(self) -> bool:
        # Permission bits too: root may write any file, yet a 0444 file says "do not write".
        mode = self._path.stat().st_mode
        has_bits = bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        return has_bits and os.access(self._path, os.W_OK)

    async def _open_read_only(self) -> int:
        """Open the reader on a database whose schema this Kestrel can read.

        A database that does not exist yet reads as an empty journal; no file is created.
        """
        try:
            if self._rconn is None:
                exists = self._path.is_file()
                self._rconn = await (self._connect_reader() if exists else self._connect_empty())
            version = await self._read_schema_version()
        except BaseException:
            await self._disconnect()
            raise
        if version != SCHEMA_VERSION:
            newer = version > SCHEMA_VERSION
            fix = "upgrade Kestrel to read it" if newer else "run `kestrel db migrate` first"
            raise StoreError(
                f"SQLite database {self._path}: schema version {version}, this Kestrel reads"
                f" {SCHEMA_VERSION}; {fix}"
            )
        return version

    async def _connect_empty(self) -> aiosqlite.Connection:
        """An empty journal in memory, with the current schema, for a database not made yet."""
        conn = await aiosqlite.connect(":memory:", isolation_level=None)
        scripts = [migration_script(version) for version in range(1, SCHEMA_VERSION + 1)]
        try:
            with self._errors("open"):
                await conn.executescript(
                    CREATE_VERSION_TABLE + "".join(scripts) + "PRAGMA query_only = ON;"
                )
        except BaseException:
            await _close_quietly(conn)
            raise
        return conn

    async def _read_schema_version(self) -> int:
        """The applied version as the reader sees it; 0 without a version table."""
        exists = await self._read(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'", ()
        )
        if not exists:
            return 0
        rows = await self._read("SELECT COALESCE(MAX(version), 0) FROM schema_version", ())
        return int(rows[0][0])

    def _connection_pragmas(self) -> str:
        return (
            f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)};"
            "PRAGMA foreign_keys = ON;"
            f"PRAGMA synchronous = {self._synchronous};"
        )

    def _refuse_read_only_file(self) -> None:
        """Refuse a file without write permission bits, even for root, whom SQLite lets write."""
        try:
            mode = self._path.stat().st_mode
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreError(f"SQLite database {self._path}: cannot open: {exc.strerror}") from exc
        if stat.S_ISREG(mode) and not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
            raise StoreError(f"SQLite database {self._path}: cannot open: the file is read-only")

    async def _apply_migrations(self, writer: SqliteWriter) -> int:
        """Apply the missing migrations, one transaction each; refuse a newer schema."""
        with self._errors("migrate"):
            await writer.script(CREATE_VERSION_TABLE)
        version = await self._schema_version(writer)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"SQLite database {self._path}: schema version {version} is newer than this"
                f" Kestrel supports ({SCHEMA_VERSION}); upgrade Kestrel to open it"
            )
        while version < SCHEMA_VERSION:
            await self._apply_migration(writer, version + 1)
            version = await self._schema_version(writer)
        return version

    async def _apply_migration(self, writer: SqliteWriter, version: int) -> None:
        try:
            await writer.script(migration_script(version))
        except sqlite3.IntegrityError:
            pass  # another process applied this version first; the caller re-reads the version
        except sqlite3.Error as exc:
            raise self._store_error(f"migration {version}", exc) from exc

    async def _schema_version(self, writer: SqliteWriter) -> int:
        def read(conn: sqlite3.Connection) -> int:
            return int(
                conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]
            )

        with self._errors("migrate"):
            return await writer.transact(read)

    async def _disconnect(self) -> None:
        wconn, rconn = self._wconn, self._rconn
        self._wconn = self._rconn = None
        if wconn is not None:
            with contextlib.suppress(sqlite3.Error):
                await wconn.close()
        if rconn is not None:
            await _close_quietly(rconn)

    async def _read(self, sql: str, params: Sequence[Any]) -> list[_Row]:
        """One query on the reader connection (one thread hop)."""
        conn = self._reader()
        with self._errors("read"):
            return list(await conn.execute_fetchall(sql, params))

    async def _write(
        self,
        action: str,
        sql: str,
        params: Sequence[Any],
        *,
        on_integrity: Callable[[str], StoreError] | None = None,
    ) -> int:
        """One write statement in its own committed transaction; the rows it changed."""

        def run(conn: sqlite3.Connection) -> int:
            return conn.execute(sql, params).rowcount

        return await self._transact(action, run, on_integrity)

    async def _write_returning(self, action: str, sql: str, params: Sequence[Any]) -> list[_Row]:
        """One write statement with RETURNING in its own committed transaction."""
        return await self._transact(action, lambda conn: conn.execute(sql, params).fetchall(), None)

    async def _transact(
        self,
        action: str,
        body: Callable[[sqlite3.Connection], _T],
        on_integrity: Callable[[str], StoreError] | None,
    ) -> _T:
        """Run ``body`` in the next group commit (its own savepoint); its result once durable."""
        self._writer()  # fail fast when closed or not migrated
        assert self._group is not None
        with self._errors(action, on_integrity):
            return await self._group.write(body)

    async def _require_run(self, run_id: str) -> None:
        if not await self._read("SELECT 1 FROM runs WHERE id = ?", (run_id,)):
            raise UnknownRun(f"unknown run {run_id!r}")

    def _writer(self) -> SqliteWriter:
        if self._closed:
            raise self._closed_error()
        if self._read_only:
            raise StoreError(f"SQLite database {self._path}: opened read-only; cannot write")
        if self._wconn is None:
            raise StoreError(f"SQLite database {self._path}: not open; await migrate() first")
        return self._wconn

    def _reader(self) -> aiosqlite.Connection:
        if self._closed:
            raise self._closed_error()
        if self._rconn is None:
            raise StoreError(f"SQLite database {self._path}: not open; await migrate() first")
        return self._rconn

    def _closed_error(self) -> StoreError:
        return StoreError(f"SQLite database {self._path}: the store is closed")

    @contextlib.contextmanager
    def _errors(
        self, action: str, on_integrity: Callable[[str], StoreError] | None = None
    ) -> Iterator[None]:
        """Turn sqlite3 errors into one-line ``StoreError``s naming the file and the cause."""
        try:
            yield
        except sqlite3.IntegrityError as exc:
            if on_integrity is None:
                raise self._store_error(action, exc) from exc
            raise on_integrity(str(exc)) from exc
        except sqlite3.Error as exc:
            raise self._store_error(action, exc) from exc

    def _append_failure(self, exc: Exception) -> StoreError:
        if isinstance(exc, sqlite3.Error):
            return self._store_error("append", exc)
        return StoreError(f"SQLite database {self._path}: append failed: {exc!r}")

    def _store_error(self, action: str, exc: sqlite3.Error) -> StoreError:
        cause = " ".join(str(exc).split()) or type(exc).__name__
        if "locked" in cause or "busy" in cause:
            cause += f" (still busy after the {self._busy_timeout:g} s busy timeout)"
        return StoreError(f"SQLite database {self._path}: {action} failed: {cause}")

    def _now(self) -> str:
        return _ts(self._clock())

    def _lease_until(self, lease_seconds: float) -> str:
        return _ts(self._clock() + timedelta(seconds=lease_seconds))


async def open_sqlite(
    path: str | Path, *, synchronous: str = "FULL", read_only: bool = False
) -> SqliteStore:
    """Open the SQLite store at ``path`` and bring its schema up to date (read-only: check it)."""
    store = SqliteStore(path, synchronous=synchronous, read_only=read_only)
    try:
        await store.migrate()
    except BaseException:
        await store.close()
        raise
    return store


# -- module helpers -----------------------------------------------------------------------------


async def _close_quietly(conn: aiosqlite.Connection) -> None:
    # Closing must also stop aiosqlite's (non-daemon) thread, whatever the connection's state.
    with contextlib.suppress(sqlite3.Error, ValueError):
        await conn.close()


def _ts(moment: datetime) -> str:
    """A UTC timestamp in one fixed format, so that text order is time order in SQL."""
    return utc(moment).isoformat(timespec="microseconds")


def _parse_ts(text: str) -> datetime:
    return datetime.fromisoformat(text)
