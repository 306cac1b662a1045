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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

import asyncpg
from pydantic import TypeAdapter, ValidationError

from bot.domain import (
    Decision,
    Entry,
    JournalRecord,
    Request,
    RequestStatus,
    RunEnded,
    RunRecord,
    RunStatus,
    RunSuspended,
    Session,
    status_after,
    utcnow,
)
from bot.store import AuditRecord, SeqConflict, SeqGap, StaleEpoch, StoreError, UnknownRun
from storage.postgres_schema import CREATE_VERSION_TABLE, SCHEMA_VERSION, migration_script

_ENTRY: Final[TypeAdapter[Entry]] = TypeAdapter(Entry)
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
    UPDATE runs SET status = $7::text, stop_reason = $8::text, updated_at = $6
    WHERE $7::text IS NOT NULL AND id IN (SELECT run_id FROM landed)
)
SELECT COUNT(*) FROM landed
"""
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
_RUN_COLUMNS: Final = (
    "id, session_id, prompt, requested_by, status, stop_reason, owner, epoch,"
    " lease_expires, created_at, updated_at"
)
_REQUEST_COLUMNS: Final = "body::text, status, decision::text"


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audited fact as stored."""

    at: datetime
    actor: str
    action: str
    run_id: str
    request_id: str
    detail: str


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
            raise ValueError(f"schema must be a plain identifier, got {schema!r}")
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
        await self._appends.drain(_CLOSE_TIMEOUT)
        pool, self._pool = self._pool, None
        if pool is not None:
            await _close_pool(pool)

    # -- sessions and runs -------------------------------------------------------------------

    async def ensure_session(self, session: Session) -> None:
        """Create the session if it does not exist."""
        await self._execute(
            "ensure_session",
            "INSERT INTO sessions(id, platform, channel, thread, created_at)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
            session.id,
            session.platform,
            session.channel,
            session.thread,
            self._now(),
        )

    async def create_run(self, run: RunRecord, owner: str, lease_seconds: float) -> int:
        """Insert a run owned by ``owner`` at epoch 1 and return that epoch."""

        def refused(exc: asyncpg.IntegrityConstraintViolationError) -> StoreError:
            if isinstance(exc, asyncpg.ForeignKeyViolationError):
                return StoreError(f"unknown session {run.session_id!r}: call ensure_session first")
            return StoreError(f"run {run.id!r} already exists")

        await self._execute(
            "create_run",
            f"INSERT INTO runs({_RUN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8, $9, $10)",
            run.id,
            run.session_id,
            run.prompt,
            run.requested_by,
            run.status.value,
            run.stop_reason,
            owner,
            self._lease_until(lease_seconds),
            _utc(run.created_at),
            _utc(run.updated_at),
            on_integrity=refused,
        )
        return 1

    async def get_run(self, run_id: str) -> RunRecord:
        """The run's row; raises ``UnknownRun``."""
        rows = await self._fetch(
            "get_run", f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = $1", run_id
        )
        if not rows:
            raise UnknownRun(f"unknown run {run_id!r}")
        return _run_from_row(rows[0])

    async def list_runs(self, limit: int = 50, session_id: str | None = None) -> list[RunRecord]:
        """The newest runs first, optionally of one session."""
        where, params = _where(session_id=session_id)
        rows = await self._fetch(
            "list_runs",
            f"SELECT {_RUN_COLUMNS} FROM runs {where}"
            f" ORDER BY created_at DESC, pos DESC LIMIT ${len(params) + 1}",
            *params,
            limit,
        )
        return [_run_from_row(row) for row in rows]

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
        status, reason = _projection(entry)
        with self._errors("append"):
            async with pool.acquire() as conn:
                landed = await conn.fetchval(
                    _APPEND, run_id, seq, epoch, entry.kind, body, self._now(), status, reason
                )
                if landed:
                    return
                row = await conn.fetchrow(_DIAGNOSE_APPEND, run_id, seq)
        error = _diagnose(run_id, seq, epoch, body, row)
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
        return [_record(run_id, int(seq), int(epoch), body) for seq, epoch, body in rows]

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
            _utc(request.created_at),
            None if request.deadline is None else _utc(request.deadline),
            on_integrity=refused,
        )

    async def get_request(self, request_id: str) -> tuple[Request, RequestStatus, Decision | None]:
        """A request, its status and its decision; raises ``KeyError`` if unknown."""
        rows = await self._fetch(
            "get_request", f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE id = $1", request_id
        )
        if not rows:
            raise KeyError(request_id)
        return _request_from_row(rows[0])

    async def list_requests(
        self, *, run_id: str | None = None, status: RequestStatus | None = RequestStatus.OPEN
    ) -> list[tuple[Request, RequestStatus, Decision | None]]:
        """Requests filtered by run and status, oldest first."""
        where, params = _where(run_id=run_id, status=None if status is None else status.value)
        rows = await self._fetch(
            "list_requests",
            f"SELECT {_REQUEST_COLUMNS} FROM requests {where} ORDER BY created_at, pos",
            *params,
        )
        return [_request_from_row(row) for row in rows]

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
        where, params = _where(run_id=run_id)
        rows = await self._fetch(
            "list_audit",
            "SELECT at, actor, action, run_id, request_id, detail FROM ("
            f" SELECT id, at, actor, action, run_id, request_id, detail FROM audit {where}"
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
        return _utc(self._clock())

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
    # This store never changes session state (no SET, LISTEN, cursors or session-level locks),
    # so asyncpg's default reset would cost one more round trip per call; asyncpg still rolls
    # back a transaction left open before calling this.


async def _close_pool(pool: asyncpg.Pool) -> None:
    """Close gracefully, or drop the connections when a statement will not finish."""
    try:
        await asyncio.wait_for(pool.close(), _CLOSE_TIMEOUT)
    except (TimeoutError, *_DRIVER_ERRORS):
        pool.terminate()


def _diagnose(
    run_id: str, seq: int, epoch: int, body: str, row: asyncpg.Record | None
) -> StoreError | None:
    """Why an append did not land: None when an identical record is already there."""
    if row is None:
        return UnknownRun(f"unknown run {run_id!r}")
    current, stored, next_seq = row
    if stored == body:
        return None
    # Fencing first: a stale owner learns it lost the run, whatever now stands at its seq.
    if current != epoch:
        return StaleEpoch(f"run {run_id!r}: epoch {epoch} is stale, the run is at epoch {current}")
    if stored is not None:
        return SeqConflict(f"run {run_id!r}: a different record stands at seq {seq}")
    return SeqGap(f"run {run_id!r}: seq {seq} would leave a gap; next is {next_seq}")


def _projection(entry: Entry) -> tuple[str | None, str | None]:
    """The run status and stop reason an entry moves the run to; (None, None) if it does not."""
    status = status_after(entry)
    if status is None:
        return None, None
    if isinstance(entry, RunSuspended):
        return status.value, entry.reason.value
    if isinstance(entry, RunEnded):
        return status.value, entry.result.stop_reason.value
    return status.value, ""


def _where(**filters: str | None) -> tuple[str, tuple[str, ...]]:
    """A WHERE clause over the given columns, skipping the filters that are None."""
    used = {column: value for column, value in filters.items() if value is not None}
    if not used:
        return "", ()
    clauses = [f"{column} = ${n}" for n, column in enumerate(used, start=1)]
    return "WHERE " + " AND ".join(clauses), tuple(used.values())


def _record(run_id: str, seq: int, epoch: int, body: str) -> JournalRecord:
    try:
        entry = _ENTRY.validate_json(body)
    except ValidationError as exc:
        raise StoreError(
            f"run {run_id!r}: journal entry at seq {seq} is unreadable: {exc.error_count()}"
            " validation error(s)"
        ) from exc
    return JournalRecord(run_id=run_id, seq=seq, epoch=epoch, entry=entry)


def _run_from_row(row: asyncpg.Record) -> RunRecord:
    return RunRecord(
        id=row["id"],
        session_id=row["session_id"],
        prompt=row["prompt"],
        requested_by=row["requested_by"],
        status=RunStatus(row["status"]),
        stop_reason=row["stop_reason"],
        owner=row["owner"],
        epoch=row["epoch"],
        lease_expires=row["lease_expires"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _request_from_row(row: asyncpg.Record) -> tuple[Request, RequestStatus, Decision | None]:
    body, status, decision = row
    return (
        Request.model_validate_json(body),
        RequestStatus(status),
        None if decision is None else Decision.model_validate_json(decision),
    )


def _utc(moment: datetime) -> datetime:
    """An aware UTC datetime; naive ones are taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _migration_lock_key(schema: str) -> int:
    """A stable 64-bit advisory lock key per schema, so schemas migrate independently."""
    digest = hashlib.sha256(f"kestrel.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


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
