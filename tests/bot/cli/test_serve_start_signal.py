"""A SIGTERM that reaches ``kestrel serve`` while it starts (here: waiting for the migration
lock another replica holds) stops it once it has started, with exit status 0. As PID 1 (the
image's ``ENTRYPOINT ["kestrel"]``) a signal without a handler is dropped, so a replica told
to stop while starting used to start anyway, take work, and be killed at the end of the grace."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import asyncpg
import pytest
import yaml

from bot.cli.chat_cmd import STOP_MARGIN_SECONDS
from storage.postgres import PostgresStore, _migration_lock_key
from storage.postgres_schema import CREATE_VERSION_TABLE, SCHEMA_VERSION, migration_script
from tests.fakes.processes import KESTREL, clean_env
from tests.fakes.waiting import until

DSN = os.environ.get("KESTREL_TEST_POSTGRES_DSN", "")
pytestmark = pytest.mark.skipif(not DSN, reason="set KESTREL_TEST_POSTGRES_DSN")
AS_PID_1 = ["unshare", "--pid", "--fork", "--kill-child"]


def _pid_1_why_not() -> str | None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "PID 1 of a PID namespace needs root and unshare"
    return None


def kestrel_pid(process: subprocess.Popen[str], as_pid_1: bool) -> int:
    """The ``kestrel`` process: ``process`` itself, or the one ``unshare`` forked."""
    if not as_pid_1:
        return process.pid
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    return int(children[0]) if children else 0


async def migration_waits(conn: asyncpg.Connection, key: int) -> bool:
    """Whether a session waits for the schema's migration lock (bigint keys: two halves)."""
    high, low = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
    found = await conn.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND classid::bigint = $1 AND objid::bigint = $2",
        high,
        low,
    )
    return bool(found)


@pytest.mark.parametrize("as_pid_1", [False, True], ids=["child", "pid 1"])
async def test_sigterm_while_starting_stops_serve_once_started(
    tmp_path: Path, as_pid_1: bool
) -> None:
    if as_pid_1 and (why := _pid_1_why_not()):
        pytest.skip(why)
    schema = f"start_signal_{uuid.uuid4().hex[:12]}"
    config = {"database": f"{DSN}?schema={schema}", "tools": [], "model": {"provider": "scripted"}}
    (tmp_path / "kestrel.yaml").write_text(yaml.safe_dump(config))
    key = _migration_lock_key(schema)
    holder = await asyncpg.connect(DSN)  # another replica, migrating
    await holder.execute("SELECT pg_advisory_lock($1)", key)
    serve = subprocess.Popen(  # noqa: ASYNC220 - a process that outlives this call
        [*(AS_PID_1 if as_pid_1 else []), *KESTREL, "serve", "--port", "0"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        await until(lambda: migration_waits(holder, key), timeout=30)
        os.kill(kestrel_pid(serve, as_pid_1), signal.SIGTERM)
        await holder.execute("SELECT pg_advisory_unlock($1)", key)
        _, err = await asyncio.to_thread(serve.communicate, timeout=30)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        await holder.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await holder.close()
    assert serve.returncode == 0, err
    assert "stopped: live runs suspended and their leases released" in err


async def migration_blocked(conn: asyncpg.Connection, schema: str) -> bool:
    """Whether a session waits for a lock on the schema's ``sessions`` table (the migration
    that alters it, behind ``conn``'s lock)."""
    found = await conn.fetchval(
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE NOT l.granted AND c.relname = 'sessions' AND n.nspname = $1",
        schema,
    )
    return bool(found)


async def at_version(conn: asyncpg.Connection, schema: str, version: int) -> None:
    """The schema as release 0.1 left it: the first ``version`` migrations applied."""
    await conn.execute(f"CREATE SCHEMA {schema}")
    await conn.execute(f"SET search_path TO {schema}")
    await conn.execute(CREATE_VERSION_TABLE)
    for applied in range(1, version + 1):
        await conn.execute(migration_script(applied))
        await conn.execute("INSERT INTO schema_version(version) VALUES ($1)", applied)
    await conn.execute("RESET search_path")


async def test_sigterm_during_a_long_migration_stops_serve_by_the_stop_deadline(
    tmp_path: Path,
) -> None:
    # A migration (or the wait for another replica's) may take 600 s, and a SIGTERM that came
    # meanwhile waited for it all: past the 40 s that Helm, Compose and the unit give before
    # SIGKILL. The migration is cut short by the stop's deadline, in its own transaction: the
    # schema stays at the version before it, and the next start applies it whole.
    schema = f"start_signal_{uuid.uuid4().hex[:12]}"
    config = {
        "database": f"{DSN}?schema={schema}",
        "tools": [],
        "model": {"provider": "scripted"},
        "replica": {"shutdown_grace_seconds": 1},
    }
    (tmp_path / "kestrel.yaml").write_text(yaml.safe_dump(config))
    holder = await asyncpg.connect(DSN)
    await at_version(holder, schema, 5)  # the next migration alters sessions
    reader = await asyncpg.connect(DSN)
    holding = holder.transaction()
    await holding.start()
    await holder.execute(f"LOCK TABLE {schema}.sessions IN ACCESS EXCLUSIVE MODE")
    serve = subprocess.Popen(  # noqa: ASYNC220 - a process that outlives this call
        [*KESTREL, "serve", "--port", "0"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        await until(lambda: migration_blocked(reader, schema), timeout=30)
        signalled = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(serve.communicate, timeout=30)
        took = time.monotonic() - signalled
        await holding.rollback()
        # Nothing of the cut migration is left: no backend of ours still waits to apply it.
        await until(lambda: _no_one_waits(reader, schema), timeout=10)
        version = await reader.fetchval(f"SELECT max(version) FROM {schema}.schema_version")
        column = await reader.fetchval(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_schema = $1 AND table_name = 'sessions' AND column_name = 'workspace'",
            schema,
        )
        store = PostgresStore(DSN, schema=schema)
        try:
            migrated = await store.migrate()
        finally:
            await store.close()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        await holder.close()  # its lock, if the test failed while holding it, goes with it
        await reader.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await reader.close()
    # The grace (1 s) and the stop's margin: well within the orchestrators' 40 s.
    assert took < 1 + STOP_MARGIN_SECONDS + 3, (took, err)
    assert serve.returncode == 0, err
    assert "Traceback" not in err
    assert "stopped on SIGTERM while starting: the start-up was cut short" in err, err
    assert (version, column) == (5, 0)
    assert migrated == SCHEMA_VERSION


async def _no_one_waits(conn: asyncpg.Connection, schema: str) -> bool:
    return not await migration_blocked(conn, schema)
