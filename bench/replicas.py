"""Two replicas on one store: two processes, each driving 50 concurrent W1 runs, started together.

The bench migrates the store, starts both processes, and waits until each says it is ready
(store open, supervisor built); then it creates a go file both are polling for, so their runs
overlap. Each process reports its start and end (wall clock) and the iterations it ran; a
round's figure is the iterations of both divided by the wall time from the first start to the
last end. The median of a few rounds is printed, with how much of that time both were running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import bench_command, expect, median, spawn, stop, w1_runtime
from bench.stores import DATABASES, open_store, prepare, scratch
from bench.w1 import ITERATIONS
from bot.journal.fold import RunState
from bot.run.supervisor import Supervisor

REPLICAS = 2
RUNS_PER_REPLICA = 50
ROUNDS = 3
BARRIER_TIMEOUT = 120.0
NAMES = {"sqlite": "SQLite (one WAL file)", "postgres": "PostgreSQL (one schema)"}


async def drive(url: str, runs: int, rounds: int, go: Path) -> None:
    """One replica: per round, say ready, wait for the go file, run W1 runs, print figures."""
    store = await open_store(url)
    supervisor = Supervisor(w1_runtime(store, ITERATIONS, owner=f"bench-{os.getpid()}"))
    for index in range(rounds):
        print("ready", flush=True)
        wait_for(go.with_name(f"{go.name}{index}"))
        print(json.dumps(await timed_round(supervisor, runs)), flush=True)
    await store.close()


def wait_for(path: Path) -> None:
    """Poll every millisecond until ``path`` exists (the start barrier).

    Blocking on purpose: between rounds this process has nothing else to run.
    """
    deadline = time.monotonic() + BARRIER_TIMEOUT
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no go file {path} within {BARRIER_TIMEOUT:g} s")
        time.sleep(0.001)


async def timed_round(supervisor: Supervisor, runs: int) -> dict[str, float]:
    """Start ``runs`` W1 runs at once and wait for all; wall-clock start and end, iterations."""
    started = time.time()
    lives = [await supervisor.start_turn("go") for _ in range(runs)]
    states = await asyncio.gather(*(supervisor.wait(live) for live in lives))
    ended = time.time()
    return {
        "start": started,
        "end": ended,
        "iterations": sum(max(s.iteration - 1, 0) for s in states),
        "completed": sum(_completed(s) for s in states),
    }


def _completed(state: RunState) -> bool:
    """Whether a W1 run reached its answer."""
    return state.result is not None and state.result.text == "done"


def measure(database: str) -> dict[str, float]:
    """Rounds of two replicas on a fresh store; the median rate, worst overlap and completions."""
    with scratch(database) as url, tempfile.TemporaryDirectory(prefix="kb_") as folder:
        asyncio.run(prepare(url))
        go = Path(folder) / "go"
        args = ["--drive", url, "--go", str(go), "--runs", str(RUNS_PER_REPLICA)]
        logs = [Path(folder) / f"replica{i}.log" for i in range(REPLICAS)]
        replicas = [spawn(bench_command("replicas", *args), log) for log in logs]
        try:
            rounds = [one_round(replicas, logs, go, index) for index in range(ROUNDS)]
            for replica, log in zip(replicas, logs, strict=True):
                if replica.wait(timeout=60) != 0:
                    raise RuntimeError(f"a replica failed:\n{log.read_text()[-3000:]}")
        finally:
            stop(replicas)
    return {
        "iterations_per_s": median([r["iterations_per_s"] for r in rounds]),
        "overlap": min(r["overlap"] for r in rounds),
        "skew_ms": max(r["skew_ms"] for r in rounds),
        "completed": min(r["completed"] for r in rounds),
    }


def one_round(
    replicas: list[subprocess.Popen[str]], logs: list[Path], go: Path, index: int
) -> dict[str, float]:
    """Release both replicas at once and combine what they report."""
    for replica, log in zip(replicas, logs, strict=True):
        expect(replica, "ready", log)
    go.with_name(f"{go.name}{index}").touch()
    parts = [json.loads(expect(r, "{", log)) for r, log in zip(replicas, logs, strict=True)]
    first, last = min(p["start"] for p in parts), max(p["end"] for p in parts)
    both = min(p["end"] for p in parts) - max(p["start"] for p in parts)
    return {
        "iterations_per_s": sum(p["iterations"] for p in parts) / (last - first),
        "overlap": max(both, 0.0) / (last - first),
        "skew_ms": (max(p["start"] for p in parts) - first) * 1000,
        "completed": sum(p["completed"] for p in parts),
    }


def report(databases: tuple[str, ...] = DATABASES) -> None:
    """Print the two-replica throughput on each of ``databases``."""
    total = REPLICAS * RUNS_PER_REPLICA
    print(
        f"Two replicas ({REPLICAS} processes x {RUNS_PER_REPLICA} concurrent W1 runs, started"
        f" together; median of {ROUNDS} rounds)"
    )
    for database in databases:
        figures = measure(database)
        done = "" if figures["completed"] == total else f", only {figures['completed']:.0f} done"
        print(
            f"  iterations/s, {total} runs, {NAMES[database] + ':':<24}"
            f"{figures['iterations_per_s']:>6.0f}  (both running for"
            f" {figures['overlap']:.0%} of the wall time, starts {figures['skew_ms']:.0f} ms"
            f" apart{done})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--drive", metavar="URL", help="run as one replica on this store")
    parser.add_argument("--go", help="the start barrier's file (one per round, numbered)")
    parser.add_argument("--runs", type=int, default=RUNS_PER_REPLICA)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--database", choices=DATABASES, action="append")
    args = parser.parse_args()
    if args.drive:
        asyncio.run(drive(args.drive, args.runs, args.rounds, Path(args.go)))
    else:
        report(tuple(args.database or DATABASES))
