"""The database the crash tests' processes share: a SQLite file, or a PostgreSQL schema of the
test's own on the server named by ``KESTREL_TEST_POSTGRES_DSN`` (skipped without it)."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.storage.conftest import POSTGRES_DSN_VAR, postgres_dsn

# Both stores, for a test parametrised over them: ``@pytest.mark.parametrize("store_name",
# STORES)``. A test that names none runs on SQLite.
STORES = ["sqlite", "postgres"]

Script = list[dict[str, object]]


def kill_points(
    paths: dict[str, tuple[Script, list[str]]],
    on_postgres: dict[str, list[str]],
    *,
    exactly: bool = False,
) -> list[Any]:
    """``(world, store_name, path, crash)`` for each path's kill points on SQLite, and for each
    path of ``on_postgres`` on PostgreSQL too, with the kinds it adds there: PostgreSQL commits
    each append on its own, so an append SQLite lands with its neighbour is a kill point.
    ``exactly``: on PostgreSQL, only the kinds ``on_postgres`` names."""
    points = [
        pytest.param(script, "sqlite", path, crash, id=f"{path}-{crash}")
        for path, (script, kinds) in paths.items()
        for crash in kinds
    ]
    return points + [
        pytest.param(script, "postgres", path, crash, id=f"{path}-{crash}-postgres")
        for path, more in on_postgres.items()
        for script, kinds in [paths[path]]
        for crash in (more if exactly else kinds + more)
    ]


@contextmanager
def crash_database(folder: Path, store_name: str) -> Iterator[dict[str, str]]:
    """The child's ``--db`` and ``--schema`` on a fresh database, dropped afterwards."""
    if store_name == "sqlite":
        yield {"db": str(folder / "k.db"), "schema": "public"}
        return
    dsn = postgres_dsn()
    schema = f"kc_{uuid.uuid4().hex}"
    asyncio.run(_execute(dsn, f"CREATE SCHEMA {schema}"))
    try:
        yield {"db": dsn, "schema": schema}
    finally:
        asyncio.run(_execute(dsn, f"DROP SCHEMA IF EXISTS {schema} CASCADE"))


def rows(world: dict[str, Path | str], statement: str, *params: Any) -> list[tuple[Any, ...]]:
    """What ``statement`` (``?`` placeholders, as SQLite's) reads from the world's database."""
    db, schema = str(world["db"]), str(world["schema"])
    if not db.startswith("postgresql://"):
        with sqlite3.connect(db) as conn:
            return list(conn.execute(statement, params))
    numbered = statement.split("?")
    postgres = numbered[0] + "".join(f"${n}{part}" for n, part in enumerate(numbered[1:], 1))
    return asyncio.run(_fetch(db, schema, postgres, params))


async def _execute(dsn: str, statement: str) -> None:
    try:
        conn = await asyncpg.connect(dsn, timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        # A configured server that is down is a failure, never a silent skip.
        pytest.fail(f"{POSTGRES_DSN_VAR} is set but the server cannot be reached: {exc!r}")
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def _fetch(
    dsn: str, schema: str, statement: str, params: tuple[Any, ...]
) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(dsn, timeout=10, server_settings={"search_path": schema})
    try:
        return [tuple(row) for row in await conn.fetch(statement, *params)]
    finally:
        await conn.close()
