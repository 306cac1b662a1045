"""Store fixtures: every contract test runs once per backend, on a fresh database.

To add a backend, write an async context manager factory like ``_sqlite_backend`` (it gets
``tmp_path`` and the test clock and yields an opener of new store instances on one fresh
database) and register it in ``BACKENDS``. The tests never name a backend.

The PostgreSQL backend runs against the server named by ``KESTREL_TEST_POSTGRES_DSN``: its tests
skip when the variable is unset and fail when it is set but the server cannot be reached. Each
test gets its own schema, dropped afterwards, so tests may run in parallel on one database.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from bot.store import Store
from storage.postgres import PostgresStore
from storage.sqlite import SqliteStore

POSTGRES_DSN_VAR = "KESTREL_TEST_POSTGRES_DSN"

Opener = Callable[[], Awaitable[Store]]
# The opener, and the database's address for another process (a file path or a DSN+schema).
BackendFactory = Callable[[Path, "FakeClock"], AbstractAsyncContextManager[tuple[Opener, str]]]


class FakeClock:
    """A wall clock that moves only when told to."""

    def __init__(self, start: datetime = datetime(2030, 1, 1, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += timedelta(seconds=seconds)


@asynccontextmanager
async def _sqlite_backend(tmp_path: Path, clock: FakeClock) -> AsyncIterator[tuple[Opener, str]]:
    path = tmp_path / "kestrel.db"

    async def open_store() -> Store:
        store = SqliteStore(path, clock=clock)
        await store.migrate()
        return store

    yield open_store, str(path)


def postgres_dsn() -> str:
    """The test server's DSN; skips the calling test when none is configured."""
    dsn = os.environ.get(POSTGRES_DSN_VAR, "")
    if not dsn:
        pytest.skip(f"set {POSTGRES_DSN_VAR} to run the PostgreSQL store tests")
    return dsn


@asynccontextmanager
async def postgres_schema(dsn: str, *, create: bool = True) -> AsyncIterator[str]:
    """A schema name of this test alone (created unless told not to), dropped afterwards."""
    schema = f"kt_{uuid.uuid4().hex}"
    try:
        admin = await asyncpg.connect(dsn, timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        # A configured server that is down is a failure, never a silent skip.
        pytest.fail(f"{POSTGRES_DSN_VAR} is set but the server cannot be reached: {exc!r}")
    try:
        if create:
            await admin.execute(f"CREATE SCHEMA {schema}")
        yield schema
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


@asynccontextmanager
async def _postgres_backend(tmp_path: Path, clock: FakeClock) -> AsyncIterator[tuple[Opener, str]]:
    dsn = postgres_dsn()
    async with postgres_schema(dsn) as schema:

        async def open_store() -> Store:
            store = PostgresStore(dsn, schema=schema, clock=clock)
            await store.migrate()
            return store

        yield open_store, f"{dsn}?schema={schema}"


BACKENDS: dict[str, BackendFactory] = {"sqlite": _sqlite_backend, "postgres": _postgres_backend}


@dataclass
class Backend:
    """One fresh database of one backend; ``open()`` gives another store instance on it."""

    name: str
    opener: Opener
    address: str
    opened: list[Store] = field(default_factory=list)

    async def open(self) -> Store:
        """A new, migrated store instance on the same database (closed after the test)."""
        store = await self.opener()
        self.opened.append(store)
        return store


@pytest.fixture
def clock() -> FakeClock:
    """The clock every store of the test reads."""
    return FakeClock()


@pytest.fixture(params=sorted(BACKENDS))
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[Backend]:
    """A fresh database of each registered backend."""
    async with BACKENDS[request.param](tmp_path, clock) as (opener, address):
        backend = Backend(request.param, opener, address)
        try:
            yield backend
        finally:
            for store in reversed(backend.opened):
                await store.close()


@pytest.fixture
async def store(backend: Backend) -> Store:
    """A migrated store on a fresh database."""
    return await backend.open()


@pytest.fixture
def table_db(tmp_path: Path) -> Path:
    """A WAL-mode SQLite file with one table ``t (x TEXT UNIQUE)``, for the writer's tests."""
    path = tmp_path / "t.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (x TEXT UNIQUE)")
    return path


def table_rows(path: Path) -> list[str]:
    """The values in ``t``, in insertion order."""
    with sqlite3.connect(path) as conn:
        return [x for (x,) in conn.execute("SELECT x FROM t ORDER BY rowid")]
