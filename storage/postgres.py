"""PostgresStore: the shared ``Store`` on an asyncpg pool, for several replicas on one database."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar, Final
from urllib.parse import parse_qs, unquote, urlsplit

import asyncpg

from bot.config.sources import (
    DATABASE_TIMEOUT_SETTING,
    postgres_credentials,
    postgres_target,
    postgres_url_problem,
)
from bot.domain import utcnow
from bot.errors import StoreError
from bot.journal.entries import Entry
from bot.waits import outcome_retrieved
from storage import sql
from storage.common import (
    Refusal,
    Violation,
    beside_entry,
    diagnose,
    entry_body,
    projection,
    wait_for_event,
    work_payload,
)
from storage.postgres_outage import Outage, quiet_pool_reconnects
from storage.postgres_schema import CREATE_VERSION_TABLE, SCHEMA_VERSION, migration_script
from storage.sql import POSTGRES, Step
from storage.sql_store import Params, Row, SqlStore, migrated

_SCHEMA_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# The tables of a schema (a few name it), to refuse one that is another program's.
_FOREIGN_TABLES: Final = (
    "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename LIMIT 5"
)
# What to name instead of another program's schema.
_OWN_SCHEMA: Final = (
    "name a schema of Kestrel's own (?schema=NAME on the database URL) or a database of its own"
)
_CLOSE_TIMEOUT: Final = 10.0
# How long one statement, or the wait for a pooled connection, may take (the setting's default):
# Kestrel's statements take milliseconds on a healthy server, so this bounds only a statement
# stuck behind a lock or on a connection that no longer answers, well within a lease.
COMMAND_TIMEOUT: Final = 30.0
# A migration may rewrite a table under the migration lock, and the replicas starting beside it
# wait for that lock: their statements get at least this long.
_MIGRATION_TIMEOUT: Final = 600.0
# What asyncpg raises for a failed statement, a lost connection or a closed pool.
_DRIVER_ERRORS: Final = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
    TimeoutError,
)

# What a statement raises when its connection was lost under it: the server closed it (a
# backend terminated, a pooler restarting), closed it while it sat in the pool (asyncpg then
# fails the next statement on it), or a transaction's end found it closed. The server may
# answer on another connection at once.
_LOST: Final = (
    asyncpg.PostgresConnectionError,
    asyncpg.AdminShutdownError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
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
_DIAGNOSE_APPEND: Final = POSTGRES.sql(sql.DIAGNOSE_APPEND)
# The notification goes out when the insert commits (one statement, one transaction), so a
# woken replica always finds the row.
_ENQUEUE_WORK: Final = f"""
WITH added AS ({sql.ENQUEUE_WORK}) SELECT id, pg_notify($4, id::text) FROM added
"""
# SKIP LOCKED lets concurrent takers pass over each other's rows instead of queueing on them,
# so each row goes to one taker. MATERIALIZED keeps the locking LIMIT subquery from being
# evaluated more than once.
_TAKE_WORK: Final = f"""
WITH picked AS MATERIALIZED ({sql.UNTAKEN_WORK} FOR UPDATE SKIP LOCKED)
UPDATE work SET taken_by = $1, taken_at = $2 WHERE id IN (SELECT id FROM picked)
RETURNING {sql.TAKEN_WORK}
"""
# Characters that end a URL's host part: in a password as they are, asyncpg splits the DSN
# inside the password.
_UNENCODED: Final = re.compile(r"[/?#@\[\]]")
_UNENCODED_PASSWORD: Final = (
    "invalid DSN: the password holds /, ?, #, @, [ or ] as it is: percent-encode it"
    " (e.g. %23 for #)"
)
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


class _Acquired:
    """``async with`` a pooled connection, as asyncpg's own acquire; a wait for one that
    runs out while every connection is in use says so, not that the server was silent; a
    release that fails fails no statement."""

    __slots__ = ("_conn", "_pool", "_timeout")

    def __init__(self, pool: asyncpg.Pool, timeout: float) -> None:
        self._pool = pool
        self._timeout = timeout
        self._conn: Any = None

    async def __aenter__(self) -> Any:
        try:
            self._conn = await self._pool.acquire(timeout=self._timeout)
        except TimeoutError as exc:
            pool = self._pool
            if str(exc) or pool.get_idle_size() or pool.get_size() < pool.get_max_size():
                raise  # a connection being opened, not one being waited for
            raise TimeoutError(
                f"no free pooled connection within {self._timeout:g} s (all"
                f" {pool.get_max_size()} in use; {DATABASE_TIMEOUT_SETTING})"
            ) from exc
        return self._conn

    async def __aexit__(self, _kind: object, exc: BaseException | None, _tb: object) -> None:
        # asyncpg shields the release from its caller's cancellation (a connection still
        # waiting for its cancelled statement goes back to the pool, or is dropped, either
        # way), but a caller cancelled meanwhile (a stop) leaves its failure to no one, and
        # asyncio logs it as never retrieved. Ours to see, then: shielded as asyncpg does.
        releasing = asyncio.ensure_future(self._pool.release(self._conn))
        releasing.add_done_callback(outcome_retrieved)
        if isinstance(exc, asyncio.CancelledError):
            # Stopped: the release goes on by itself. Waited for, a silent server held the
            # stop a statement's whole timeout, and its failure then replaced the cancel.
            return
        try:
            await asyncio.shield(releasing)
        except _DRIVER_ERRORS:
            # The statements ended before it, and what they did (or the error they raised) is
            # the caller's answer: a connection the server closed as it answered fails the
            # release ("a free connection holder"), and one asyncpg cannot take back it drops.
            return


class SchemaNameError(StoreError, ValueError):
    """A schema name that is not a plain identifier: never quoted into SQL, refused."""


class PostgresStore(SqlStore):
    """The journal, runs, requests and audit in one PostgreSQL schema, shared by replicas."""

    _dialect = POSTGRES
    _take_work = _TAKE_WORK
    _refusals = (asyncpg.IntegrityConstraintViolationError,)
    _failures = _DRIVER_ERRORS
    current_schema: ClassVar[int] = SCHEMA_VERSION  # the version this Kestrel reads and writes

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "public",
        clock: Callable[[], datetime] | None = None,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 10.0,
        command_timeout: float = COMMAND_TIMEOUT,
        read_only: bool = False,
    ) -> None:
        unreadable = postgres_url_problem(dsn)
        if unreadable is not None:
            raise StoreError(f"PostgreSQL: {_invalid_dsn(dsn, unreadable)}")
        scheme = urlsplit(dsn).scheme
        if scheme not in ("postgres", "postgresql"):
            got = f"{scheme}://" if scheme else "no scheme"
            raise StoreError(f"PostgreSQL DSN must start with postgresql:// (got {got})")
        if not command_timeout > 0:
            raise StoreError(f"PostgreSQL: command_timeout must be over 0, not {command_timeout}")
        if not _SCHEMA_NAME.fullmatch(schema):
            raise SchemaNameError(
                "PostgreSQL: ?schema= must be a plain identifier (a letter or _, then letters,"
                f" digits or _, at most 63), got {schema!r}"
            )
        # Leases, deadlines and heartbeats written by one replica are compared by another: by
        # default every replica reads the time on the server's clock (the wall clock plus the
        # offset measured when it connects), so a host whose clock is off never takes a live
        # replica's runs nor keeps a dead one's. An injected clock (tests) is used as it is.
        self._server_offset: timedelta | None = None if clock is None else timedelta()
        super().__init__(clock or self._server_time, f"PostgreSQL {postgres_target(dsn, schema)}")
        self._dsn = dsn
        self._schema = schema
        self._min_size = min_size
        self._max_size = max_size
        self._connect_timeout = connect_timeout
        self._timeout = command_timeout
        self._migration_timeout = max(command_timeout, _MIGRATION_TIMEOUT)
        # The server stops a statement we stopped waiting for (asyncpg's cancel request may
        # not reach it, and the statement would go on holding its locks).
        self._server_timeout = {"statement_timeout": _milliseconds(command_timeout)}
        # A reader (``runs list``, ``audit``) neither migrates nor writes: a store shared with
        # replicas of an older Kestrel, migrated, would take every one of them out of service.
        self._read_only = read_only
        if read_only:
            self._server_timeout["default_transaction_read_only"] = "on"
        self._secrets = _secrets(dsn)
        self._outage = Outage(self._label, lambda exc: self._scrub(_cause(exc)))
        self._pool: asyncpg.Pool | None = None
        # Appends to one run land in submission order, as they do behind SQLite's single
        # writer; appends to different runs use the whole pool at once.
        self._appends = _AppendQueue()
        # A dedicated connection LISTENs for this schema's work (pooled ones would lose it).
        self._channel = _work_channel(schema)
        self._listener: asyncpg.Connection | None = None
        self._listen_lock = asyncio.Lock()

    @property
    def schema(self) -> str:
        """The schema holding the tables."""
        return self._schema

    # -- lifecycle ---------------------------------------------------------------------------

    async def migrate(self) -> int:
        """Open the pool if needed and bring the schema to the current version.

        Read-only, check the schema instead: nothing is created or migrated."""
        if self._closed:
            raise self._closed_error()
        try:
            if self._pool is None:
                self._pool = await self._connect()
            if self._server_offset is None:
                self._server_offset = await self._measure_offset(self._pool)
            if self._read_only:
                return await self._readable_version(self._pool)
            return await self._apply_migrations(self._pool)
        except BaseException:
            pool, self._pool = self._pool, None
            if pool is not None:
                await _close_pool(pool)
            raise

    async def applied_version(self) -> int:
        """The schema version applied, read without creating anything (not the schema, not
        the version table): 0 when either is missing."""
        if self._closed:
            raise self._closed_error()
        if self._pool is None:
            self._pool = await self._connect()
        return await self._read_version(self._pool, "check")

    async def _readable_version(self, pool: asyncpg.Pool) -> int:
        """The applied version, which must be this Kestrel's: a reader migrates nothing."""
        version = await self._read_version(pool, "open")
        if version != SCHEMA_VERSION:
            raise StoreError(f"{self._label}: {sql.version_problem(version, SCHEMA_VERSION)}")
        return version

    async def _read_version(self, pool: asyncpg.Pool, action: str) -> int:
        """The applied version, read without creating anything (0 before any)."""
        with self._errors(action):
            async with self._acquire(pool) as conn:
                table = await conn.fetchval(
                    "SELECT to_regclass(quote_ident($1) || '.schema_version')", self._schema
                )
                if table is None:
                    await self._refuse_foreign(conn)
                    return 0
                return int(
                    await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_version")
                )

    async def _shut_down(self) -> None:
        """Write the appends already submitted, then close every connection. Cancelled (a
        stop out of time), it drops them instead: a statement under way then fails at once,
        rather than being cancelled at a server that may not answer."""
        try:
            await self._appends.drain(_CLOSE_TIMEOUT)
        except asyncio.CancelledError:
            self._drop_connections()
            raise
        listener, self._listener = self._listener, None
        pool, self._pool = self._pool, None
        closing: list[Awaitable[None]] = []
        if listener is not None:
            closing.append(_close_connection(listener))
        if pool is not None:
            closing.append(_close_pool(pool))
        # Side by side: against a silent server each waits its whole bound, and one after the
        # other they held a stopping replica past its orchestrator's grace. A cancelled close
        # of either drops its connections (asyncpg's own close does, and ours below).
        await asyncio.gather(*closing)

    def _drop_connections(self) -> None:
        """Close every connection at once, telling the server nothing."""
        listener, self._listener = self._listener, None
        pool, self._pool = self._pool, None
        if listener is not None:
            listener.terminate()
        if pool is not None:
            pool.terminate()

    # -- journal: the write path -------------------------------------------------------------

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
        body = entry_body(entry)
        moved = projection(entry)
        status, reason = (None, None) if moved is None else (moved.status.value, moved.stop_reason)
        releases = moved is not None and moved.releases
        at = self._now()
        params = (run_id, seq, epoch, entry.kind, body, at, status, reason, releases)
        beside = beside_entry(run_id, entry, lambda: at, self._stamp)
        with self._errors("append"):
            try:
                landed, row = await self._append_once(pool, params, beside)
            except _LOST:
                # Its connection was lost under it (a backend terminated, a pooler restarting),
                # committed or not: the same entry at the same seq is the same append (landed,
                # the diagnosis finds it there), and a claim since fences it. Once more, then,
                # on another connection, rather than stopping the run for a lease.
                landed, row = await self._append_once(pool, params, beside)
        if landed:
            return
        error = diagnose(run_id, seq, epoch, body, row)
        if error is not None:
            raise error

    async def _append_once(
        self, pool: asyncpg.Pool, params: Sequence[Any], beside: Sequence[Step]
    ) -> tuple[bool, Any]:
        """One try of an append: whether it landed, and if not the row that says why."""
        async with self._acquire(pool) as conn:
            if beside:
                landed = await _append_with(conn, params, beside)
            else:
                landed = bool(await conn.fetchval(_APPEND, *params))
            if landed:
                return True, None
            return False, await conn.fetchrow(_DIAGNOSE_APPEND, params[0], params[1])

    # -- work: wake-ups ----------------------------------------------------------------------

    async def enqueue_work(self, kind: str, payload: dict[str, Any]) -> int:
        """Add inbound work and notify every replica listening on this schema; its id."""
        params = (kind, work_payload(kind, payload), self._now(), self._channel)
        rows = await self._write("enqueue_work", _ENQUEUE_WORK, params)
        return int(rows[0][0])

    async def wait_for_work(self, timeout: float) -> None:
        """Return on a notification of new work in this schema, or after ``timeout``."""
        if await self._listen():
            # Nobody heard what was enqueued before the LISTEN: the caller must look again.
            return
        await wait_for_event(self._work_added, timeout)

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
            conn = await self._new_connection(
                self._dsn,
                timeout=self._connect_timeout,
                command_timeout=self._timeout,
                server_settings=self._server_timeout,
            )
            try:
                await conn.add_listener(self._channel, self._on_work)
            except BaseException:
                await _close_connection(conn)
                raise
        # A lost connection may have missed notifications: wake the waiters to look again.
        conn.add_termination_listener(self._on_listener_lost)
        return conn

    def _on_work(self, conn: asyncpg.Connection, pid: int, channel: str, payload: str) -> None:  # noqa: ARG002
        self._work_added.set()

    def _on_listener_lost(self, conn: asyncpg.Connection) -> None:  # noqa: ARG002
        self._work_added.set()

    # -- connections and migrations ----------------------------------------------------------

    async def _connect(self) -> asyncpg.Pool:
        """Open the pool; every connection resolves unqualified names in our schema."""
        with self._errors("connect"):
            try:
                pool = await asyncpg.create_pool(
                    self._dsn,
                    min_size=self._min_size,
                    max_size=self._max_size,
                    timeout=self._connect_timeout,
                    command_timeout=self._timeout,
                    server_settings={
                        "search_path": _quote_ident(self._schema),
                        **self._server_timeout,
                    },
                    reset=_keep_session,
                    connect=self._new_connection,
                )
            except (ValueError, OverflowError) as exc:
                # A DSN asyncpg cannot parse (a port over 65535: the socket's OverflowError);
                # its message may quote the DSN, hence the scrub.
                # A password holding a character that ends the host part is parsed in pieces,
                # and a piece is no secret the scrub knows: its message is not quoted at all.
                said = _invalid_dsn(self._dsn, str(exc))
                raise StoreError(self._message("connect", said)) from None
        # The outage is said by ``_new_connection``: the pool's own warnings would repeat it,
        # with a traceback, at each of its retries.
        quiet_pool_reconnects()
        return pool

    async def _new_connection(self, *args: Any, **kwargs: Any) -> asyncpg.Connection:
        """``asyncpg.connect``, for the pool and the listener: an outage is said when it begins
        and when it ends, and a timed-out attempt says it was connecting (a bare
        ``TimeoutError`` is a statement's, or the wait for a connection)."""
        try:
            conn = await asyncpg.connect(*args, **kwargs)
        except TimeoutError as exc:
            self._connect_failed(exc)
            timeout = kwargs.get("timeout", self._connect_timeout)
            raise TimeoutError(f"no connection within {timeout:g} s") from exc
        except Exception as exc:
            self._connect_failed(exc)
            raise
        self._outage.connected()
        return conn

    def _connect_failed(self, exc: BaseException) -> None:
        """An outage begins, unless the store is closing: then nothing reconnects, and the
        stop says itself whether the store answered."""
        if not self._closed:
            self._outage.failed(exc)

    def _server_time(self) -> datetime:
        """The time on the server's clock: this host's, corrected by the measured offset."""
        return utcnow() + (self._server_offset or timedelta())

    async def _measure_offset(self, pool: asyncpg.Pool) -> timedelta:
        """How far the server's clock is ahead of this host's (halfway through the query)."""
        with self._errors("connect"):
            async with self._acquire(pool) as conn:
                before = utcnow()
                server: datetime = await conn.fetchval("SELECT clock_timestamp()")
                after = utcnow()
        return server - (before + (after - before) / 2)

    async def _apply_migrations(self, pool: asyncpg.Pool) -> int:
        """Apply the missing migrations, one locked transaction each; refuse a newer schema."""
        lock_key = _migration_lock_key(self._schema)
        longer = self._migration_timeout
        with self._errors("migrate"):
            async with self._acquire(pool) as conn:
                while True:
                    # The advisory lock serializes replicas migrating at once: each re-reads
                    # the version under the lock, so every migration is applied exactly once.
                    # Waiting for it, and the migration, may take as long as a migration.
                    async with conn.transaction():
                        # For this transaction alone: the connection goes back to the pool.
                        longest = _milliseconds(longer)
                        await conn.execute(f"SET LOCAL statement_timeout = {longest}")
                        lock = "SELECT pg_advisory_xact_lock($1)"
                        await conn.execute(lock, lock_key, timeout=longer)
                        version = await self._schema_version(conn)
                        if version >= SCHEMA_VERSION:
                            return version
                        await conn.execute(migration_script(version + 1), timeout=longer)
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
            await self._refuse_foreign(conn)
            await conn.execute(CREATE_VERSION_TABLE)
            return 0
        version = int(await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_version"))
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self._label}: schema version {version} is newer than this"
                f" Kestrel supports ({SCHEMA_VERSION}); upgrade Kestrel to open it"
            )
        return version

    async def _refuse_foreign(self, conn: asyncpg.Connection) -> None:
        """Refuse a schema with no version table that holds tables: the first migration makes
        every table of Kestrel's with the version table, in one transaction, so they are
        another program's, and migrating would write Kestrel's beside (or into) them."""
        rows = await conn.fetch(_FOREIGN_TABLES, self._schema)
        if rows:
            tables = [str(row["tablename"]) for row in rows]
            raise StoreError(f"{self._label}: {sql.foreign_problem(tables, _OWN_SCHEMA)}")

    # -- primitives --------------------------------------------------------------------------

    async def _read(self, action: str, statement: str, params: Params) -> list[Row]:
        """One query on a pooled connection: the same round trip as a write."""
        return await self._write(action, statement, params)

    async def _write(
        self, action: str, statement: str, params: Params, refused: Refusal | None = None
    ) -> list[Row]:
        """One statement on a pooled connection (its own implicit transaction); its rows."""
        pool = self._ready()
        with self._errors(action, refused):
            async with self._acquire(pool) as conn:
                return list(await conn.fetch(POSTGRES.sql(statement), *params))

    async def _transaction(
        self, action: str, steps: Sequence[Step], refused: Refusal | None = None
    ) -> list[list[Row]]:
        """Statements in one transaction on one pooled connection; the rows of each."""
        pool = self._ready()
        with self._errors(action, refused):
            async with self._acquire(pool) as conn, conn.transaction():
                return [
                    list(await conn.fetch(POSTGRES.sql(statement), *params))
                    for statement, params in steps
                ]

    def _ready(self) -> asyncpg.Pool:
        return self._opened(self._pool)

    def _acquire(self, pool: asyncpg.Pool) -> _Acquired:
        """A pooled connection, waited for no longer than a statement may take (a pool whose
        connections are all stuck would otherwise keep its next caller waiting forever)."""
        return _Acquired(pool, self._timeout)

    def _failure(self, action: str, exc: Exception) -> StoreError:
        """A driver error as a ``StoreError`` naming the server, the action and the cause."""
        exc = _first_failure(exc)
        if isinstance(exc, TimeoutError) and not str(exc):
            # A statement, or a connection being opened for it, ran out of time.
            return StoreError(self._message(action, self._timed_out(action)))
        if isinstance(exc, asyncpg.QueryCanceledError) and "statement timeout" in str(exc):
            # The same bound, met by the server first.
            return StoreError(self._message(action, self._timed_out(action)))
        return StoreError(self._message(action, _cause(exc)))

    def _timed_out(self, action: str) -> str:
        """What ran out, and which setting bounds it."""
        if action == "migrate":
            return (
                f"no answer within {self._migration_timeout:g} s (a migration's bound:"
                f" {DATABASE_TIMEOUT_SETTING}, at least {_MIGRATION_TIMEOUT:g} s)"
            )
        return f"no answer within {self._timeout:g} s ({DATABASE_TIMEOUT_SETTING})"

    def _violation(self, exc: Exception) -> Violation:
        """asyncpg raises one class per SQLSTATE."""
        if isinstance(exc, asyncpg.ForeignKeyViolationError):
            return Violation.FOREIGN_KEY
        return Violation.OTHER

    def _message(self, action: str, cause: str) -> str:
        return f"{self._label}: {action} failed: {self._scrub(cause)}"

    def _scrub(self, cause: str) -> str:
        """A driver's message on one line, without the password."""
        for secret in self._secrets:
            cause = cause.replace(secret, "***")
        return " ".join(cause.split())


async def open_postgres(
    dsn: str,
    *,
    schema: str = "public",
    clock: Callable[[], datetime] | None = None,
    command_timeout: float = COMMAND_TIMEOUT,
    read_only: bool = False,
) -> PostgresStore:
    """Open the PostgreSQL store at ``dsn`` and bring its schema up to date (``read_only``:
    check that it is, and write nothing)."""
    store = PostgresStore(
        dsn, schema=schema, clock=clock, command_timeout=command_timeout, read_only=read_only
    )
    return await migrated(store)


# -- module helpers -----------------------------------------------------------------------------


async def _append_with(
    conn: asyncpg.Connection, params: Sequence[Any], beside: Sequence[Step]
) -> bool:
    """The append and, if it landed, the rows written beside it, in one transaction."""
    async with conn.transaction():
        landed = bool(await conn.fetchval(_APPEND, *params))
        if landed:
            for statement, values in beside:
                await conn.execute(POSTGRES.sql(statement), *values)
    return landed


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
    except asyncio.CancelledError:  # before asyncpg's close began, which drops it too
        conn.terminate()
        raise


async def _close_pool(pool: asyncpg.Pool) -> None:
    """Close gracefully, or drop the connections when a statement will not finish."""
    try:
        await asyncio.wait_for(pool.close(), _CLOSE_TIMEOUT)
    except (TimeoutError, *_DRIVER_ERRORS):
        pool.terminate()
    except asyncio.CancelledError:  # before asyncpg's close began, which drops them too
        pool.terminate()
        raise


def _milliseconds(seconds: float) -> str:
    """``seconds`` as PostgreSQL's ``statement_timeout`` (whole milliseconds, at least 1)."""
    return str(max(1, round(seconds * 1000)))


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


def _invalid_dsn(dsn: str, said: str) -> str:
    """Why ``dsn`` is refused: ``said``, unless its password holds a character that ends the
    host part, whose pieces no scrub knows (then that, and nothing quoted)."""
    if _UNENCODED.search(postgres_credentials(dsn)[1]):
        return _UNENCODED_PASSWORD
    return f"invalid DSN: {said}"


def _secrets(dsn: str) -> frozenset[str]:
    """Every spelling of the DSN's password, to scrub from driver messages."""
    _, password, rest = postgres_credentials(dsn)
    found = {password, *parse_qs(urlsplit(f"postgresql://{rest}").query).get("password", [])}
    found |= {unquote(secret) for secret in found}
    return frozenset(secret for secret in found if secret)


def _first_failure(exc: Exception) -> Exception:
    """The failure ``exc`` met again: a transaction's end on a connection lost under it says
    only that the connection is closed (asyncpg's ``Transaction.__aexit__``), the loss itself,
    why it closed, being what it was raised in."""
    context = exc.__context__
    if isinstance(exc, asyncpg.InterfaceError) and isinstance(context, _DRIVER_ERRORS):
        return context
    return exc


def _cause(exc: BaseException) -> str:
    """The driver's reason in words: the OS reason for socket errors, not their tuple."""
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host: {exc.strerror}"
    if isinstance(exc, TimeoutError):
        return str(exc) or "timed out"
    if isinstance(exc, ssl.SSLError):  # its errno is OpenSSL's, not the OS's
        return str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)
    return str(exc) or type(exc).__name__
