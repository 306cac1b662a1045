"""Takeover latency: how long after a replica is SIGKILLed another one resumes its run.

Per trial, on one PostgreSQL schema: an adopter process polls ``Supervisor.adopt_orphans()``
every 50 ms; a holder process starts a run whose in-process tool holds it (sleeps). Once the
tool holds, the bench waits a little (spread over one renewal interval, so the kill lands at
every phase of the holder's lease renewals), SIGKILLs the holder, and reads the run's lease as
the dead holder left it. The latency is from the kill to the ``at`` of the adopter's first
journal entry on the run (its RunResumed). Both processes use the same ``lease_seconds``; a
claim succeeds only once the dead owner's lease has expired, so the latency is lease-bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.common import bench_command, expect, median, spawn, stop
from bench.stores import connection, open_store, prepare, scratch
from bot.events import FanOut
from bot.llm.scripted import ScriptedProvider
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from bot.store import Store
from bot.tools.base import ToolContext
from bot.tools.python import function_tool
from bot.tools.source import ToolSource
from bot.tools.toolset import ToolSet

LEASE = 1.0
POLL = 0.05
TRIALS = 6
FIRST_DELAY = 0.5
HOLD_SECONDS = 120.0
ADOPT_TIMEOUT = 30.0


class Hold(BaseModel):
    """What the held tool is called with."""

    name: str


@function_tool(idempotent=False, timeout=HOLD_SECONDS * 2)
async def hold(args: Hold, ctx: ToolContext) -> str:  # noqa: ARG001
    """Say which run it holds, then hold it far longer than a trial lasts."""
    print(f"holding {ctx.run_id}", flush=True)
    await asyncio.sleep(HOLD_SECONDS)
    return "released"


def runtime(store: Store) -> Runtime:
    """The same runtime in both processes (so the fingerprint matches): one held call."""
    replies: list[dict[str, Any]] = [
        {"calls": [{"name": "hold", "arguments": {"name": "run"}}]},
        {"text": "done"},
    ]
    return Runtime(
        store=store,
        model=ScriptedProvider.from_replies(replies, name="takeover"),
        tools=ToolSource(ToolSet([hold])),
        events=FanOut(),
        lease_seconds=LEASE,
    )


async def hold_one(url: str) -> None:
    """The holder: start one run and drive it until killed."""
    store = await open_store(url)
    supervisor = Supervisor(runtime(store))
    await supervisor.wait(await supervisor.start_turn("hold"))
    await store.close()


async def adopt_one(url: str) -> None:
    """The adopter: poll for orphans every POLL seconds, adopt, let the run settle, report it."""
    store = await open_store(url)
    supervisor = Supervisor(runtime(store))
    print("ready", flush=True)
    deadline = time.monotonic() + ADOPT_TIMEOUT
    while not (adopted := await supervisor.adopt_orphans()):
        if time.monotonic() > deadline:
            raise SystemExit(f"nothing to adopt within {ADOPT_TIMEOUT:g} s")
        await asyncio.sleep(POLL)
    await asyncio.gather(*(supervisor.wait(live) for live in list(supervisor.live.values())))
    print(json.dumps({"adopted": adopted}), flush=True)
    await store.close()


async def lease_left_by(url: str, run_id: str) -> float:
    """When the dead holder's lease expires (epoch time), checking nobody claimed it yet."""
    async with connection(url) as conn:
        row = await conn.fetchrow("SELECT epoch, lease_expires FROM runs WHERE id = $1", run_id)
    assert row["epoch"] == 1, "the run was claimed before its lease could be read"
    return float(row["lease_expires"].timestamp())


async def first_append_after_takeover(url: str, run_id: str) -> float:
    """The ``at`` (epoch time) of the first journal entry written under a later epoch."""
    async with connection(url) as conn:
        row = await conn.fetchrow(
            "SELECT kind, at FROM journal WHERE run_id = $1 AND epoch > 1 ORDER BY seq LIMIT 1",
            run_id,
        )
    assert row is not None and row["kind"] == "run_resumed", row
    return float(row["at"].timestamp())


def trial(url: str, folder: Path, delay: float) -> dict[str, float]:
    """One kill and adoption; the latency, the lease the dead holder had left, and the rest."""
    logs = [folder / "adopter.log", folder / "holder.log"]
    adopter = spawn(bench_command("takeover", "--adopt", url), logs[0])
    holder = spawn(bench_command("takeover", "--hold", url), logs[1])
    try:
        expect(adopter, "ready", logs[0])
        run_id = expect(holder, "holding", logs[1]).split()[1]
        time.sleep(delay)
        killed = kill(holder)
        expires = asyncio.run(lease_left_by(url, run_id))
        adopted = json.loads(expect(adopter, "{", logs[0]))["adopted"]
        assert adopted == [run_id], adopted
        resumed = asyncio.run(first_append_after_takeover(url, run_id))
    finally:
        stop([adopter, holder])
    return {
        "latency_ms": (resumed - killed) * 1000,
        "lease_left_ms": (expires - killed) * 1000,
        "after_expiry_ms": (resumed - expires) * 1000,
    }


def kill(process: subprocess.Popen[str]) -> float:
    """SIGKILL ``process``, reap it, and return when (epoch time) the signal was sent."""
    killed = time.time()
    process.kill()
    process.wait()
    return killed


def measure() -> list[dict[str, float]]:
    """TRIALS kills on one fresh schema, their delays spread over one renewal interval."""
    renewal = LEASE / 3
    with scratch("postgres") as url, tempfile.TemporaryDirectory(prefix="kb_") as folder:
        asyncio.run(prepare(url))
        delays = [FIRST_DELAY + renewal * i / TRIALS for i in range(TRIALS)]
        return [trial(url, Path(folder), delay) for delay in delays]


def spread(values: list[float]) -> str:
    """``median M ms (min A, max B)``."""
    return f"median {median(values):.0f} ms (min {min(values):.0f}, max {max(values):.0f})"


def report() -> None:
    """Print the takeover latency, with the lease it is bound by."""
    trials = measure()
    lease, renewal, poll = LEASE * 1000, LEASE / 3 * 1000, POLL * 1000
    print(
        f"Takeover after SIGKILL (PostgreSQL, {len(trials)} kills; lease_seconds={LEASE:.1f},"
        f" renewed every {renewal:.0f} ms; adopter polls adopt_orphans every {poll:.0f} ms)"
    )
    print(f"  kill -> adopter's first append (RunResumed):  {spread(col(trials, 'latency_ms'))}")
    print(
        f"    lease the dead owner still held at the kill: {spread(col(trials, 'lease_left_ms'))}"
    )
    print(
        f"    lease expiry -> RunResumed appended:         {spread(col(trials, 'after_expiry_ms'))}"
    )
    print(
        "  lease-bound by design: a claim succeeds only once the dead owner's lease expires,"
        f" {lease - renewal:.0f}-{lease:.0f} ms after its last renewal"
    )


def col(rows: list[dict[str, float]], key: str) -> list[float]:
    """One figure of every trial."""
    return [row[key] for row in rows]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--hold", metavar="URL", help="run as the holder on this store")
    parser.add_argument("--adopt", metavar="URL", help="run as the adopter on this store")
    args = parser.parse_args()
    if args.hold:
        asyncio.run(hold_one(args.hold))
    elif args.adopt:
        asyncio.run(adopt_one(args.adopt))
    else:
        report()
