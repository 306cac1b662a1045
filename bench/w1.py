"""W1: runs of 20 iterations, one instant in-process tool call each, every append durable.

Each scenario runs in a fresh process on a fresh store (a SQLite file, or a PostgreSQL schema),
so its peak RSS is its own. Prints the median time per iteration of a lone run, iterations/s
with 1 and with 100 concurrent runs, and peak RSS (``--database sqlite|postgres``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from bench.common import bench_command, median, peak_rss_mib, run_json, w1_runtime
from bench.stores import DATABASES, LABELS, open_store, scratch
from bot.run.supervisor import Supervisor

ITERATIONS = 20


async def scenario(url: str, runs: int, repeats: int, guarded: bool = False) -> dict[str, float]:
    """Time ``repeats`` rounds of ``runs`` concurrent W1 runs on the store at ``url``."""
    store = await open_store(url)
    supervisor = Supervisor(w1_runtime(store, ITERATIONS, guarded=guarded))
    per_iteration, rates = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        lives = [await supervisor.start_turn("go") for _ in range(runs)]
        states = await asyncio.gather(*(supervisor.wait(live) for live in lives))
        elapsed = time.perf_counter() - started
        assert all(s.result is not None and s.result.text == "done" for s in states)
        total = sum(s.iteration - 1 for s in states)
        per_iteration.append(elapsed / ITERATIONS * 1000)
        rates.append(total / elapsed)
    await store.close()
    return {
        "ms_per_iteration": median(per_iteration),
        "iterations_per_s": median(rates),
        "peak_rss_mib": peak_rss_mib(),
    }


def run_scenario(database: str, runs: int, repeats: int, guarded: bool = False) -> dict[str, float]:
    """One scenario in a fresh interpreter on a fresh store."""
    with scratch(database) as url:
        args = ["--scenario", str(runs), "--repeats", str(repeats), "--store", url]
        return run_json(bench_command("w1", *args, *(["--guarded"] if guarded else [])))


def report(database: str = "sqlite") -> None:
    """Print W1's figures on ``database``."""
    lone = run_scenario(database, 1, repeats=15)
    many = run_scenario(database, 100, repeats=5)
    guarded = run_scenario(database, 1, repeats=15, guarded=True)
    guarded_many = run_scenario(database, 100, repeats=5, guarded=True)
    print(f"W1 ({LABELS[database]}, 20 iterations per run, in-process echo tool)")
    print(f"  median time per iteration, 1 run:     {lone['ms_per_iteration']:.3f} ms")
    print(f"  iterations/s, 1 run:                  {lone['iterations_per_s']:.0f}")
    print(f"  iterations/s, 100 concurrent runs:    {many['iterations_per_s']:.0f}")
    print(f"  peak RSS, 100 concurrent runs:        {many['peak_rss_mib']:.1f} MiB")
    extra = (guarded["ms_per_iteration"] - lone["ms_per_iteration"]) * 1000
    print("  with a PreToolUse + PostToolUse hook and the PII guard (redact):")
    print(f"    median time per iteration, 1 run:   {guarded['ms_per_iteration']:.3f} ms")
    print(f"    iterations/s, 100 concurrent runs:  {guarded_many['iterations_per_s']:.0f}")
    print(f"    overhead per tool call (1 run):     {extra:+.0f} µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", type=int)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store", help="the scenario's store URL")
    parser.add_argument("--guarded", action="store_true")
    parser.add_argument("--database", choices=DATABASES, default="sqlite")
    args = parser.parse_args()
    if args.scenario:
        figures = scenario(args.store, args.scenario, args.repeats, args.guarded)
        print(json.dumps(asyncio.run(figures)))
    else:
        report(args.database)
