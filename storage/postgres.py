"""PostgresStore: the shared ``Store`` on an asyncpg pool, for several replicas on one database."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import re
import socket
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timedelta
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

import asyncpg

from bot.domain import Decision, Request, RequestStatus, Session, utcnow
from bot.journal.entries import Entry
from bot.records import JournalRecord, Replica, RunRecord, WorkItem
from bot.store import AuditRecord, StoreError, UnknownRun
from storage.common import (
    RUN_COLUMNS,
    AuditEntry,
    diagnose,
    dollar,
    new_run_row,
    projection,
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
from storage.postgres_schema import CREATE_VERSION_TABLE, SCHEMA_VERSION, migration_script

_SCHEMA_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_CLOSE_TIMEOUT: Final = 10.0
# What asyncpg raises for a failed statement, a lost connection or a closed pool.
_DRIVER_ERRORS: Final = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
    TimeoutError,
)

# One statement, so one round trip and one implicit transaction: the row lands only if the
# epoch is the run's current one and the seq is the next free one, and the run's status moves
# with it. The row lock on ``runs`` orders the append against a concurrent ``claim``: whichever
# commits second re-reads the row, so no stale-epoch row can commit after the claim did. The
# primary key settles two writers racing for one seq (the loser inserts nothing).
_APPEND: Final = """
WITH landed AS (
    INSERT INTO journal(run_id, seq, epoch, kind, body, at)
    SELECT $1::text, $2::bigint, $3::bigint, $4::text, $5::json, $6::timestamptz
    WHERE EXISTS (SELECT 1 FROM runs WHERE id = $1 AND epoch = $3 FOR NO KEY UPDATE)
      AND (SELECT COALESCE(MAX(seq), -1) + 1 FROM journal WHERE run_id = $1) = $2
    ON CONFLICT (run_id, seq) DO NOTHING
    RETURNING run_id
), projected AS (
    UPDATE runs SET status = $7::text, stop_reason = $8::text, updated_at = $6,
        owner = CASE WHEN $9::boolean THEN '' ELSE owner END,
        lease_expires = CASE WHEN $9::boolean THEN NULL ELSE lease_expires END
    WHERE $7::text IS NOT NULL AND id IN (SELECT run_id FROM landed)
)
SELECT COUNT(*) FROM landed
"""
_ENSURE_SESSION: Final = """
INSERT INTO sessions(id, platform, channel, thread, created_at) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (id) DO NOTHING
"""
_CREATE_RUN: Final = (
    f"INSERT INTO runs({RUN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8, $9, $10)"
)
_DIAGNOSE_APPEND: Final = """
SELECT epoch,
       (SELECT body::text FROM journal WHERE run_id = $1 AND seq = $2),
       (SELECT COALESCE(MAX(seq), -1) + 1 FROM journal WHERE run_id = $1)
FROM runs WHERE id = $1
"""
_CLAIM: Final = """
UPDATE runs SET owner = $1, epoch = epoch + 1, lease_expires = $2, updated_at = $3
WHERE id = $4 AND ($5::boolean OR owner = '' OR owner = $1
                   OR lease_expires IS NULL OR lease_expires <= $3)
RETURNING epoch
"""
# The request's row lock makes concurrent approvers count one after another, so the last of
# them sees every approval (two racing "last" approvers must not both see one too few).
_LOCK_REQUEST: Final = "SELECT status FROM requests WHERE id = $1 FOR NO KEY UPDATE"
_INSERT_APPROVAL: Final = """
INSERT INTO approvals(request_id, approver, at) VALUES ($1, $2, $3)
ON CONFLICT (request_id, approver) DO NOTHING
"""
_REQUEST_COLUMNS: Final = "body::text, status, decision::text"
# The notification goes out when the insert commits (one statement, one transaction), so a
# woken replica always finds the row.
_ENQUEUE_WORK: Final = """
WITH added AS (
    INSERT INTO work(kind, payload, created_at) VALUES ($1, $2::json, $3) RETURNING id
)
SELECT id, pg_notify($4, id::text) FROM added
"""
# SKIP LOCKED lets concurrent takers pass over each other's rows instead of queueing on them,
# so each row goes to one taker. MATERIALIZED keeps the locking LIMIT subquery from being
# evaluated more than once. RETURNING order is unspecified: callers sort.
_TAKE_WORK: Final = """
WITH picked AS MATERIALIZED (
    SELECT id FROM work
    WHERE done_at IS NULL AND (taken_at IS NULL OR taken_at < $3)
    ORDER BY id LIMIT $4
    FOR UPDATE SKIP LOCKED
)
UPDATE work SET taken_by = $1, taken_at = $2
WHERE id IN (SELECT id FROM picked)
RETURNING id, kind, payload::text, created_at
"""
_HEARTBEAT: Final = """
INSERT INTO replicas(owner, info, started_at, last_seen) VALUES ($1, $2, $3, $3)
ON CONFLICT (owner) DO UPDATE SET info = excluded.info, last_seen = excluded.last_seen
"""
# The longest channel name: LISTEN cuts longer ones short and pg_notify refuses them.
_MAX_IDENTIFIER: Final = 63


class _AppendQueue:
    """The appends in flight: each one waits for the one submitted before it to the same run."""

    def __init__(self) -> None:
        self._tails: dict[str, asyncio.Task[None]] = {}
        self._pending: set[asyncio.Task[None]] = set()

    def submit(self, run_id: str, write: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """Start ``write`` once the run's previous append has settled, whatever its outcome."""
        task = asyncio.get_running_loop().create_task(_after(self._tails.get(run_id), write))
        self._tails[run_id] = task
        self._pending.add(task)
        task.add_done_callback(functools.partial(self._settled, run_id))
        return task

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until every submitted append has settled."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout)

    def _settled(self, run_id: str, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if self._tails.get(run_id) is task:
            del self._tails[run_id]


class SchemaNameError(StoreError, ValueError):
    """A schema name that is not a plain identifier: never quoted into SQL, refused."""


class PostgresStore:
    """The journal, runs, requests and audit in one PostgreSQL schema, shared by replicas."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "public",
        clock: Callable[[], datetime] = utcnow,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 10.0,
    ) -> None:
        scheme = urlsplit(dsn).scheme
        if scheme not in ("postgres", "postgresql"):
            got = f"{scheme}://" if scheme else "no scheme"
            raise StoreError(f"PostgreSQL DSN must start with postgresql:// (got {got})")
        if not _SCHEMA_NAME.fullmatch(schema):
            raise SchemaNameError(
                "PostgreSQL: ?schema= must be a plain identifier (a letter or _, then letters,"
                f" digits or _, at most 63), got {schema!r}"
            )
        self._dsn = dsn
        self._schema = schema
        self._clock = clock
        self._min_size = min_size
        self._max_size = max_size
        self._connect_timeout = connect_timeout
        self._target = _describe(dsn, schema)
        self._secrets = _secrets(dsn)
        self._pool: asyncpg.Pool | None = None
        # Appends to one run land in submission order, as they do behind SQLite's single
        # writer; appends to different runs use the whole pool at once.
        self._appends = _AppendQueue()
        # A dedicated connection LISTENs for this schema's work (pooled ones would lose it).
        self._channel = _work_channel(schema)
        self._listener: asyncpg.Connection | None = None
        self._listen_lock = asyncio.Lock()
        self._work_added = asyncio.Event()
        self._closed = False

    @property
    def schema(self) -> str:
        """The schema holding the tables."""
        return self._schema

    # -- lifecycle ---------------------------------------------------------------------------

    async def migrate(self) -> int:
        """Open the pool if needed and bring the schema to the current version."""
        if self._closed:
            raise self._closed_error()
        try:
            if self._pool is None:
                self._pool = await self._connect()
            return await self._apply_migrations(self._pool)
        except BaseException:
            pool, self._pool = self._pool, None
            if pool is not None:
                await _close_pool(pool)
            raise

    async def close(self) -> None:
        """Write the appends already submitted, then close every pooled connection."""
        if self._closed:
            return
        self._closed = True
        self._work_added.set()  # waiters return, and their next call reports the closed store
        await self._appends.drain(_CLOSE_TIMEOUT)
        listener, self._listener = self._listener, None
        if listener is not None:
            await _close_connection(listener)
        pool, self._pool = self._pool, None
        if pool is not None:
            await _close_pool(pool)

    # -- sessions and runs -------------------------------------------------------------------

    async def ensure_session(self, session: Session) -> None:
        """Create the session if it does not exist."""
        await self._execute("ensure_session", _ENSURE_SESSION, *self._session_row(session))

    async def create_run(
        self, run: RunRecord, owner: str, lease_seconds: float, session: Session | None = None
    ) -> int:
        """Insert a run owned by ``owner`` at epoch 1 (and ``session``, if new); the epoch."""

        def refused(exc: asyncpg.IntegrityConstraintViolationError) -> StoreError:
            if isinstance(exc, asyncpg.ForeignKeyViolationError):
                return StoreError(f"unknown session {run.session_id!r}: call ensure_session first")
            return StoreError(f"run {run.id!r} already exists")

        row = new_run_row(run, owner, self._lease_until(lease_seconds), utc)
        pool = self._ready()
        with self._errors("create_run", refused):
            async with pool.acquire() as conn, conn.transaction():
                if session is not None:
                    await conn.execute(_ENSURE_SESSION, *self._session_row(session))
                await conn.execute(_CREATE_RUN, *row)
        return 1

    def _session_row(self, session: Session) -> tuple[Any, ...]:
        return (session.id, session.platform, session.channel, session.thread, self._now())

    async def get_run(self, run_id: str) -> RunRecord:
        """The run's row; raises ``UnknownRun``."""
        rows = await self._fetch("get_run", f"SELECT {RUN_COLUMNS} FROM runs WHERE id = $1", run_id)
        if not rows:
            raise UnknownRun(f"unknown run {run_id!r}")
        return run_from_row(rows[0], utc)

    async def list_runs(self, limit: int = 50, session_id: str | None = None) -> list[RunRecord]:
        """The newest runs first, optionally of one session."""
        clause, params = where(dollar, session_id=session_id)
        rows = await self._fetch(
            "list_runs",
            f"SELECT {RUN_COLUMNS} FROM runs {clause}"
            f" ORDER BY created_at DESC, pos DESC LIMIT ${len(params) + 1}",
            *params,
            limit,
        )
        return [run_from_row(row, utc) for row in rows]

    async def orphaned_runs(self, limit: int = 100) -> list[str]:
        """Runs marked running whose owner's lease expired or was given up: nobody drives them."""
        rows = await self._fetch(
            "orphaned_runs",
            "SELECT id FROM runs WHERE status = 'running'"
            " AND (owner = '' OR lease_expires IS NULL OR lease_expires < $1)"
            " ORDER BY updated_at LIMIT $2",
            self._now(),
            limit,
        )
        return [str(row["id"]) for row in rows]

    # -- leases ------------------------------------------------------------------------------

    async def claim(
        self, run_id: str, owner: str, lease_seconds: float, *, force: bool = False
    ) -> int | None:
        """Take the lease (free, expired, already ours, or forced) and return the new epoch."""
        now = self._now()
        epoch = await self._fetchval(
            "claim", _CLAIM, owner, self._lease_until(lease_seconds), now, run_id, force
        )
        if epoch is not None:
            return int(epoch)
        await self.current_epoch(run_id)  # unknown runs raise UnknownRun, not None
        return None

    async def renew(self, run_id: str, owner: str, epoch: int, lease_seconds: float) -> bool:
        """Extend a lease still held at ``epoch``; False when it was taken."""
        renewed = await self._fetchval(
            "renew",
            "UPDATE runs SET lease_expires = $1, updated_at = $2"
            " WHERE id = $3 AND owner = $4 AND epoch = $5 RETURNING true",
            self._lease_until(lease_seconds),
            self._now(),
            run_id,
            owner,
            epoch,
        )
        return renewed is True

    async def release(self, run_id: str, owner: str, epoch: int) -> None:
        """Give the lease up if still held at ``epoch``."""
        await self._execute(
            "release",
            "UPDATE runs SET owner = '', lease_expires = NULL, updated_at = $1"
            " WHERE id = $2 AND owner = $3 AND epoch = $4",
            self._now(),
            run_id,
            owner,
            epoch,
        )

    async def current_epoch(self, run_id: str) -> int:
        """The run's epoch as the database has it now."""
        epoch = await self._fetchval(
            "current_epoch", "SELECT epoch FROM runs WHERE id = $1", run_id
        )
        if epoch is None:
            raise UnknownRun(f"unknown run {run_id!r}")
        return int(epoch)

    # -- journal -----------------------------------------------------------------------------

    async def append(self, run_id: str, seq: int, epoch: int, entry: Entry) -> None:
        """Append at ``seq`` fenced by ``epoch``; returns once the row is committed."""
        await self.submit(run_id, seq, epoch, entry)

    def submit(self, run_id: str, seq: int, epoch: int, entry: Entry) -> asyncio.Future[None]:
        """Queue an append now (written after the run's earlier ones); settles after commit."""
        self._ready()  # fail at once when closed or not migrated
        write = functools.partial(self._write_entry, run_id, seq, epoch, entry)
        return self._appends.submit(run_id, write)

    async def _write_entry(self, run_id: str, seq: int, epoch: int, entry: Entry) -> None:
        """The append itself: one conditional insert, and a diagnosis only when it missed."""
        # Not ``_ready()``: close() lets the appends submitted before it land.
        pool = self._pool
        if pool is None:
            raise self._closed_error()
        body = entry.model_dump_json()
        moved = projection(entry)
        status, reason = (None, None) if moved is None else (moved.status.value, moved.stop_reason)
        releases = moved is not None and moved.releases
        with self._errors("append"):
            async with pool.acquire() as conn:
                landed = await conn.fetchval(
                    _APPEND,
                    run_id,
                    seq,
                    epoch,
                    entry.kind,
                    body,
                    self._now(),
                    status,
                    reason,
                    releases,
                )
                if landed:
                    return
                row = await conn.fetchrow(_DIAGNOSE_APPEND, run_id, seq)
        error = diagnose(run_id, seq, epoch, body, row)
        if error is not None:
            raise error

    async def load(self, run_id: str) -> list[JournalRecord]:
        """The run's whole journal, in order; raises ``UnknownRun``."""
        rows = await self._fetch(
            "load",
            "SELECT seq, epoch, body::text FROM journal WHERE run_id = $1 ORDER BY seq",
            run_id,
        )
        if not rows:
            await self.current_epoch(run_id)  # unknown runs raise UnknownRun
        return [record(run_id, int(seq), int(epoch), body) for seq, epoch, body in rows]

    # -- requests ----------------------------------------------------------------------------

    async def open_request(self, request: Request) -> None:
        """Record a request as open; a second call with the same id changes nothing."""

        def refused(exc: asyncpg.IntegrityConstraintViolationError) -> StoreError:
            return UnknownRun(f"unknown run {request.run_id!r} for request {request.id!r}")

        await self._execute(
            "open_request",
            "INSERT INTO requests(id, run_id, kind, call_id, tool, body, status, decision,"
            " created_at, deadline) VALUES ($1, $2, $3, $4, $5, $6::json, $7, NULL, $8, $9)"
            " ON CONFLICT (id) DO NOTHING",
            request.id,
            request.run_id,
            request.kind.value,
            request.call_id,
            request.tool,
            request.model_dump_json(),
            RequestStatus.OPEN.value,
            utc(request.created_at),
            None if request.deadline is None else utc(request.deadline),
            on_integrity=refused,
        )

    async def get_request(self, request_id: str) -> tuple[Request, RequestStatus, Decision | None]:
        """A request, its status and its decision; raises ``KeyError`` if unknown."""
        rows = await self._fetch(
            "get_request", f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE id = $1", request_id
        )
        if not rows:
            raise KeyError(request_id)
        return request_from_row(rows[0])

    async def list_requests(
        self, *, run_id: str | None = None, status: RequestStatus | None = RequestStatus.OPEN
    ) -> list[tuple[Request, RequestStatus, Decision | None]]:
        """Requests filtered by run and status, oldest first."""
        clause, params = where(
            dollar, run_id=run_id, status=None if status is None else status.value
        )
        rows = await self._fetch(
            "list_requests",
            f"SELECT {_REQUEST_COLUMNS} FROM requests {clause} ORDER BY created_at, pos",
            *params,
        )
        return [request_from_row(row) for row in rows]

    async def decide(self, decision: Decision, status: RequestStatus) -> bool:
        """Close an open request; True only for the one caller whose update changed it."""
        if status is RequestStatus.OPEN:
            raise ValueError("decide() needs a closing status, not 'open'")
        won = await self._fetchval(
            "decide",
            "UPDATE requests SET status = $1, decision = $2::json"
            " WHERE id = $3 AND status = 'open' RETURNING true",
            status.value,
            decision.model_dump_json(),
            decision.request_id,
        )
        if won is True:
            return True
        await self.get_request(decision.request_id)  # unknown ids raise KeyError, not False
        return False

    async def add_approval(self, request_id: str, by: str) -> int:
        """Record ``by`` as an approver of an open request; the number of distinct approvers."""
        pool = self._ready()
        with self._errors("add_approval"):
            async with pool.acquire() as conn, conn.transaction():
                status = await conn.fetchval(_LOCK_REQUEST, request_id)
                if status is None:
                    raise KeyError(request_id)
                # A closed request takes no more approvals; the same approver twice counts once.
                if status == RequestStatus.OPEN.value:
                    await conn.execute(_INSERT_APPROVAL, request_id, by, self._now())
                count = await conn.fetchval(
                    "SELECT COUNT(*) FROM approvals WHERE request_id = $1", request_id
                )
        return int(count)

    async def mark_once(self, key: str) -> bool:
        """Claim ``key``; True only for the first caller ever, across replicas."""
        first = await self._fetchval(
            "mark_once",
            "INSERT INTO once_keys(key, at) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING"
            " RETURNING true",
            key,
            self._now(),
        )
        return first is True

    # -- work and replicas -------------------------------------------------------------------

    async def enqueue_work(self, kind: str, payload: dict[str, Any]) -> int:
        """Add inbound work and notify every replica listening on this schema; its id."""
        work_id = await self._fetchval(
            "enqueue_work",
            _ENQUEUE_WORK,
            kind,
            work_payload(kind, payload),
            self._now(),
            self._channel,
        )
        return int(work_id)

    async def take_work(
        self, owner: str, limit: int = 10, retake_after: float = 60.0
    ) -> list[WorkItem]:
        """Take up to ``limit`` untaken or abandoned items, oldest first, for ``owner``."""
        if limit <= 0:
            return []
        now = self._now()
        abandoned_before = now - timedelta(seconds=retake_after)
        rows = await self._fetch("take_work", _TAKE_WORK, owner, now, abandoned_before, limit)
        items = [work_from_row(row, utc) for row in rows]
        return sorted(items, key=lambda item: item.id)

    async def finish_work(self, work_id: int) -> None:
        """Mark an item done so nobody takes it again; finishing it twice changes nothing."""
        await self._execute(
            "finish_work",
            "UPDATE work SET done_at = $1 WHERE id = $2 AND done_at IS NULL",
            self._now(),
            work_id,
        )

    async def wait_for_work(self, timeout: float) -> None:
        """Return on a notification of new work in this schema, or after ``timeout``."""
        if await self._listen():
            # Nobody heard what was enqueued before the LISTEN: the caller must look again.
            return
        await wait_for_event(self._work_added, timeout)

    async def heartbeat(self, owner: str, info: str = "") -> None:
        """Register replica ``owner``, or refresh its info and last-seen time."""
        await self._execute("heartbeat", _HEARTBEAT, owner, info, self._now())

    async def list_replicas(self, alive_within: float = 60.0) -> list[Replica]:
        """Replicas seen within ``alive_within`` seconds, with the runs they own."""
        since = self._now() - timedelta(seconds=alive_within)
        rows = await self._fetch("list_replicas", replicas_query(dollar), since)
        return replicas_from_rows(rows, utc)

    async def _listen(self) -> bool:
        """Open the listening connection unless it is open; True when it was just opened."""
        self._ready()  # fail fast when closed or not migrated
        async with self._listen_lock:
            if self._listener is not None and not self._listener.is_closed():
                return False
            listener = await self._connect_listener()
            if self._closed:  # close() ran while we connected, before this connection existed
                await _close_connection(listener)
                raise self._closed_error()
            self._listener = listener
        # What woke waiters before (a lost connection) is covered by the caller looking again.
        self._work_added.clear()
        return True

    async def _connect_listener(self) -> asyncpg.Connection:
        """A connection of its own that LISTENs on this schema's work channel."""
        with self._errors("listen"):
            conn = await asyncpg.connect(self._dsn, timeout=self._connect_timeout)
            try:
                await conn.add_listener(self._channel, self._on_work)
            except BaseException:
                await _close_connection(conn)
                raise
        # A lost connection may have missed notifications: wake the waiters to look again.
        conn.add_termination_listener(self._on_listener_lost)
        return conn

    def _on_work(self, conn: asyncpg.Connection, pid: int, channel: str, payload: str) -> None:
        self._work_added.set()

    def _on_listener_lost(self, conn: asyncpg.Connection) -> None:
        self._work_added.set()

    # -- audit -------------------------------------------------------------------------------

    async def audit(
        self, actor: str, action: str, run_id: str = "", request_id: str = "", detail: str = ""
    ) -> None:
        """Record one audited fact."""
        await self._execute(
            "audit",
            "INSERT INTO audit(at, actor, action, run_id, request_id, detail)"
            " VALUES ($1, $2, $3, $4, $5, $6)",
            self._now(),
            actor,
            action,
            run_id,
            request_id,
            detail,
        )

    async def list_audit(self, run_id: str | None = None, limit: int = 200) -> list[AuditRecord]:
        """The newest ``limit`` audited facts (of one run, if given), oldest first."""
        clause, params = where(dollar, run_id=run_id)
        rows = await self._fetch(
            "list_audit",
            "SELECT at, actor, action, run_id, request_id, detail FROM ("
            f" SELECT id, at, actor, action, run_id, request_id, detail FROM audit {clause}"
            f" ORDER BY id DESC LIMIT ${len(params) + 1}) AS newest ORDER BY id",
            *params,
            limit,
        )
        entries = [AuditEntry(*row) for row in rows]
        return list[AuditRecord](entries)

    # -- connections and migrations ----------------------------------------------------------

    async def _connect(self) -> asyncpg.Pool:
        """Open the pool; every connection resolves unqualified names in our schema."""
        with self._errors("connect"):
            try:
                return await asyncpg.create_pool(
                    self._dsn,
                    min_size=self._min_size,
                    max_size=self._max_size,
                    timeout=self._connect_timeout,
                    server_settings={"search_path": _quote_ident(self._schema)},
                    reset=_keep_session,
                )
            except ValueError as exc:
                # A DSN asyncpg cannot parse; its message may quote the DSN, hence the scrub.
                raise StoreError(self._message("connect", f"invalid DSN: {exc}")) from None

    async def _apply_migrations(self, pool: asyncpg.Pool) -> int:
        """Apply the missing migrations, one locked transaction each; refuse a newer schema."""
        lock_key = _migration_lock_key(self._schema)
        with self._errors("migrate"):
            async with pool.acquire() as conn:
                while True:
                    # The advisory lock serializes replicas migrating at once: each re-reads
                    # the version under the lock, so every migration is applied exactly once.
                    async with conn.transaction():
                        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key)
                        version = await self._schema_version(conn)
                        if version >= SCHEMA_VERSION:
                            return version
                        await conn.execute(migration_script(version + 1))
                        await conn.execute(
                            "INSERT INTO schema_version(version) VALUES ($1)", version + 1
                        )

    async def _schema_version(self, conn: asyncpg.Connection) -> int:
        """The applied version, creating the schema and the version table when missing."""
        exists = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", self._schema
        )
        if not exists:
            await conn.execute(f"CREATE SCHEMA {_quote_ident(self._schema)}")
        table = await conn.fetchval(
            "SELECT to_regclass(quote_ident($1) || '.schema_version')", self._schema
        )
        if table is None:
            await conn.execute(CREATE_VERSION_TABLE)
            return 0
        version = int(await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_version"))
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"PostgreSQL {self._target}: schema version {version} is newer than this"
                f" Kestrel supports ({SCHEMA_VERSION}); upgrade Kestrel to open it"
            )
        return version

    # -- statement helpers -------------------------------------------------------------------

    async def _fetch(self, action: str, sql: str, *args: Any) -> list[asyncpg.Record]:
        pool = self._ready()
        with self._errors(action):
            return list(await pool.fetch(sql, *args))

    async def _fetchval(self, action: str, sql: str, *args: Any) -> Any:
        pool = self._ready()
        with self._errors(action):
            return await pool.fetchval(sql, *args)

    async def _execute(
        self,
        action: str,
        sql: str,
        *args: Any,
        on_integrity: Callable[[asyncpg.IntegrityConstraintViolationError], StoreError]
        | None = None,
    ) -> None:
        pool = self._ready()
        with self._errors(action, on_integrity):
            await pool.execute(sql, *args)

    def _ready(self) -> asyncpg.Pool:
        if self._closed:
            raise self._closed_error()
        if self._pool is None:
            raise StoreError(f"PostgreSQL {self._target}: not open; await migrate() first")
        return self._pool

    def _closed_error(self) -> StoreError:
        return StoreError(f"PostgreSQL {self._target}: the store is closed")

    @contextlib.contextmanager
    def _errors(
        self,
        action: str,
        on_integrity: Callable[[asyncpg.IntegrityConstraintViolationError], StoreError]
        | None = None,
    ) -> Iterator[None]:
        """Turn driver errors into one-line ``StoreError``s naming the server and the cause."""
        try:
            yield
        except asyncpg.IntegrityConstraintViolationError as exc:
            if on_integrity is None:
                raise StoreError(self._message(action, _cause(exc))) from exc
            raise on_integrity(exc) from exc
        except _DRIVER_ERRORS as exc:
            raise StoreError(self._message(action, _cause(exc))) from exc

    def _message(self, action: str, cause: str) -> str:
        for secret in self._secrets:
            cause = cause.replace(secret, "***")
        return f"PostgreSQL {self._target}: {action} failed: {' '.join(cause.split())}"

    def _now(self) -> datetime:
        return utc(self._clock())

    def _lease_until(self, lease_seconds: float) -> datetime:
        return self._now() + timedelta(seconds=lease_seconds)


async def open_postgres(dsn: str, *, schema: str = "public") -> PostgresStore:
    """Open the PostgreSQL store at ``dsn`` and bring its schema up to date."""
    store = PostgresStore(dsn, schema=schema)
    try:
        await store.migrate()
    except BaseException:
        await store.close()
        raise
    return store


# -- module helpers -----------------------------------------------------------------------------


async def _after(previous: asyncio.Task[None] | None, write: Callable[[], Awaitable[None]]) -> None:
    """Run ``write`` after ``previous`` has settled; its outcome is its own caller's."""
    if previous is not None:
        await asyncio.wait({previous})
    await write()


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release a connection as it is: no reset query."""
    # Pooled connections never change session state (no SET, LISTEN, cursors or session-level
    # locks; LISTEN has a connection of its own), so asyncpg's default reset would cost one
    # more round trip per call; asyncpg still rolls back a transaction left open before this.


async def _close_connection(conn: asyncpg.Connection) -> None:
    """Close gracefully, or drop the connection when it will not close in time."""
    try:
        await asyncio.wait_for(conn.close(), _CLOSE_TIMEOUT)
    except (TimeoutError, *_DRIVER_ERRORS):
        conn.terminate()


async def _close_pool(pool: asyncpg.Pool) -> None:
    """Close gracefully, or drop the connections when a statement will not finish."""
    try:
        await asyncio.wait_for(pool.close(), _CLOSE_TIMEOUT)
    except (TimeoutError, *_DRIVER_ERRORS):
        pool.terminate()


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _migration_lock_key(schema: str) -> int:
    """A stable 64-bit advisory lock key per schema, so schemas migrate independently."""
    digest = hashlib.sha256(f"kestrel.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _work_channel(schema: str) -> str:
    """The NOTIFY channel of one schema's work, so replicas of other schemas never hear it."""
    channel = f"kestrel_work.{schema}"
    if len(channel) <= _MAX_IDENTIFIER:
        return channel
    # Schema names are ASCII, so characters are bytes; a long one is replaced by its digest.
    return f"kestrel_work.{hashlib.sha256(schema.encode()).hexdigest()[:32]}"


def _describe(dsn: str, schema: str) -> str:
    """The server as a message names it: user, hosts and database, never the password."""
    parts = urlsplit(dsn)
    query = parse_qs(parts.query)
    hosts = parts.netloc.rpartition("@")[2] or query.get("host", ["localhost"])[0]
    userinfo = parts.netloc.rpartition("@")[0]
    user = unquote(userinfo.partition(":")[0])
    database = unquote(parts.path.lstrip("/"))
    target = f"{user}@{hosts}" if user else hosts
    if database:
        target += f"/{database}"
    return target if schema == "public" else f"{target} (schema {schema})"


def _secrets(dsn: str) -> frozenset[str]:
    """Every spelling of the DSN's password, to scrub from driver messages."""
    parts = urlsplit(dsn)
    userinfo = parts.netloc.rpartition("@")[0]
    found = {userinfo.partition(":")[2], *parse_qs(parts.query).get("password", [])}
    found |= {unquote(secret) for secret in found}
    return frozenset(secret for secret in found if secret)


def _cause(exc: BaseException) -> str:
    """The driver's reason in words: the OS reason for socket errors, not their tuple."""
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host: {exc.strerror}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)
    return str(exc) or type(exc).__name__
