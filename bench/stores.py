"""The stores a benchmark runs on, named by URL: a SQLite file or a fresh PostgreSQL schema.

A scenario's URL is ``sqlite:///PATH`` or ``postgresql://...?schema=NAME`` (``?schema=`` is
Kestrel's, as in the config's ``database``). PostgreSQL figures use the server named by
``KESTREL_BENCH_POSTGRES_DSN``, one fresh ``kb_<uuid>`` schema per scenario, dropped afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from bench.common import size_mib
from bot import install_hint
from bot.store import Store

DATABASES = ("sqlite", "postgres")
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
CONNECT_TIMEOUT = 5.0
SQLITE = "sqlite:///"
LABELS = {
    "sqlite": "SQLite WAL, synchronous=FULL",
    "postgres": "PostgreSQL, a pool of 10 connections per process",
}
_SCHEMA_SIZE = """
SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'm')
"""
_SERVER = """
SELECT current_setting('server_version'), current_setting('fsync'),
       current_setting('synchronous_commit'),
       has_database_privilege(current_user, current_database(), 'CREATE')
"""


def postgres_dsn() -> str:
    """The server of the PostgreSQL figures: ``KESTREL_BENCH_POSTGRES_DSN``, else the default."""
    return os.environ.get("KESTREL_BENCH_POSTGRES_DSN") or DEFAULT_DSN


def split_schema(url: str) -> tuple[str, str]:
    """A PostgreSQL URL's DSN for the driver, and its ``?schema=``."""
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query)
    query = urlencode([(key, value) for key, value in pairs if key != "schema"])
    return urlunsplit(parts._replace(query=query)), dict(pairs).get("schema", "public")


def with_schema(dsn: str, schema: str) -> str:
    """The scenario URL of ``schema`` on the server at ``dsn``."""
    parts = urlsplit(dsn)
    return urlunsplit(
        parts._replace(query=urlencode([*parse_qsl(parts.query), ("schema", schema)]))
    )


def redacted(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***``, fit to print."""
    parts = urlsplit(dsn)
    netloc = parts.netloc
    if parts.password:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:***@{host}"
    pairs = [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(pairs, safe="*")))


async def open_store(url: str) -> Store:
    """Open (and migrate) the store ``url`` names."""
    if url.startswith(SQLITE):
        from storage.sqlite import open_sqlite

        return await open_sqlite(url.removeprefix(SQLITE), synchronous="FULL")
    from storage.postgres import open_postgres

    dsn, schema = split_schema(url)
    return await open_postgres(dsn, schema=schema)


async def prepare(url: str) -> None:
    """Create and migrate the store, so processes started together all find it ready."""
    store = await open_store(url)
    await store.close()


@contextlib.asynccontextmanager
async def connection(url: str) -> AsyncIterator[Any]:
    """A plain asyncpg connection to a PostgreSQL URL, resolving names in its schema."""
    import asyncpg

    dsn, schema = split_schema(url)
    conn = await asyncpg.connect(
        dsn, timeout=CONNECT_TIMEOUT, server_settings={"search_path": schema}
    )
    try:
        yield conn
    finally:
        await conn.close()


async def store_mib(url: str) -> float:
    """The store's size in MiB: the SQLite file with its WAL, or the schema's relations."""
    if url.startswith(SQLITE):
        return size_mib(Path(url.removeprefix(SQLITE)))
    async with connection(url) as conn:
        size = await conn.fetchval(_SCHEMA_SIZE, split_schema(url)[1])
    return int(size) / 2**20


@contextlib.contextmanager
def scratch(database: str) -> Iterator[str]:
    """A fresh store URL for one scenario, removed afterwards (file, or schema and tables)."""
    if database == "sqlite":
        with tempfile.TemporaryDirectory(prefix="kb_") as folder:
            yield f"{SQLITE}{Path(folder) / 'bench.db'}"
        return
    url = with_schema(postgres_dsn(), f"kb_{uuid.uuid4().hex}")
    try:
        yield url
    finally:
        asyncio.run(drop_schema(url))


async def drop_schema(url: str) -> None:
    """Drop a scenario's schema and everything in it."""
    async with connection(url) as conn:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{split_schema(url)[1]}" CASCADE')


def postgres_server() -> tuple[str, str]:
    """The server's description, and why its figures cannot be taken ('' when they can)."""
    dsn = postgres_dsn()
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "", f"asyncpg is not installed ({install_hint('postgres')})"
    try:
        version, fsync, sync_commit, may_create = asyncio.run(_server(dsn))
    except Exception as exc:
        cause = " ".join(str(exc).split()) or type(exc).__name__
        return "", f"cannot reach {redacted(dsn)} ({cause})"
    if not may_create:
        return "", f"{redacted(dsn)}: this user may not create schemas in the database"
    where = urlsplit(dsn).netloc.rpartition("@")[2] + urlsplit(dsn).path
    return f"PostgreSQL {version} at {where}, fsync={fsync}, synchronous_commit={sync_commit}", ""


async def _server(dsn: str) -> tuple[str, str, str, bool]:
    """Version, fsync, synchronous_commit, and whether this user may create schemas."""
    import asyncpg

    conn = await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT)
    try:
        row = await conn.fetchrow(_SERVER)
    finally:
        await conn.close()
    return str(row[0]), str(row[1]), str(row[2]), bool(row[3])
