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
import uuid
from pathlib import Path

import asyncpg
import pytest
import yaml

from storage.postgres import _migration_lock_key
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
