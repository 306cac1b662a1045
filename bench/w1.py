"""W1: runs of 20 iterations, one instant in-process tool call each, every append durable.

Each scenario runs in a fresh process on a fresh store (a SQLite file, or a PostgreSQL schema),
so its peak RSS is its own. Prints the median time per iteration of a lone run, iterations/s
with 1 and with 100 concurrent runs, and peak RSS (``--database sqlite|postgres``). On SQLite,
Kestrel's scenarios alternate with the floor's (``bench.floor``, a plain loop doing the same
work) three times, and the medians are printed side by side with their ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from bench.common import bench_command, median, peak_rss_mib, run_json, w1_runtime
from bench.stores import DATABASES, LABELS, open_store, scratch
from bot.collector import settle_for_service
from bot.run.supervisor import Supervisor

ITERATIONS = 20
REPEATS = 3  # Kestrel's and the floor's scenarios, alternating


async def scenario(
    url: str, runs: int, repeats: int, guarded: bool = False, default_collector: bool = False
) -> dict[str, float]:
    """Time ``repeats`` rounds of ``runs`` concurrent W1 runs on the store at ``url``, the
    collector settled as ``kestrel serve`` settles it (else as the interpreter starts)."""
    store = await open_store(url)
    supervisor = Supervisor(w1_runtime(store, ITERATIONS, guarded=guarded))
    if not default_collector:
        settle_for_service()  # as ``kestrel serve`` does once started
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


def run_scenario(
    module: str, runs: int, repeats: int, database: str = "sqlite", *flags: str
) -> dict[str, float]:
    """One scenario of ``bench.MODULE`` (``w1``, or the ``floor``) in a fresh interpreter on a
    fresh store; ``flags``: ``--guarded``, ``--default-collector``."""
    with scratch(database) as url:
        args = ["--scenario", str(runs), "--repeats", str(repeats), "--store", url]
        return run_json(bench_command(module, *args, *flags))


def beside_floor(repeats: int = REPEATS) -> dict[str, dict[str, float]]:
    """Kestrel's and the floor's figures on SQLite, their scenarios alternating so both see the
    same minute of the machine; the median of ``repeats`` of each, by scenario."""
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in _BESIDE}
    for _ in range(repeats):
        for name, (module, runs, scenario_repeats, *flags) in _BESIDE.items():
            rounds[name].append(run_scenario(module, runs, scenario_repeats, "sqlite", *flags))
    return {
        name: {key: median([figures[key] for figures in found]) for key in found[0]}
        for name, found in rounds.items()
    }


# Scenario name: (module, concurrent runs, rounds within the process); Kestrel's and the
# floor's alternate.
_BESIDE: dict[str, tuple[str, int, int, *tuple[str, ...]]] = {
    "lone": ("w1", 1, 15),
    "floor_lone": ("floor", 1, 15),
    "many": ("w1", 100, 5),
    "floor_many": ("floor", 100, 5),
    "many_default": ("w1", 100, 5, "--default-collector"),
}


def report(database: str = "sqlite") -> None:
    """Print W1's figures on ``database``; on SQLite beside the floor's, as ratios."""
    if database == "sqlite":
        found = beside_floor()
        lone, many = found["lone"], found["many"]
        _print_beside_floor(found)
    else:
        lone = run_scenario("w1", 1, 15, database)
        many = run_scenario("w1", 100, 5, database)
        print(f"W1 ({LABELS[database]}, 20 iterations per run, in-process echo tool)")
        print(f"  median time per iteration, 1 run:     {lone['ms_per_iteration']:.3f} ms")
        print(f"  iterations/s, 1 run:                  {lone['iterations_per_s']:.0f}")
        print(f"  iterations/s, 100 concurrent runs:    {many['iterations_per_s']:.0f}")
        print(f"  peak RSS, 100 concurrent runs:        {many['peak_rss_mib']:.1f} MiB")
    guarded = run_scenario("w1", 1, 15, database, "--guarded")
    guarded_many = run_scenario("w1", 100, 5, database, "--guarded")
    extra = (guarded["ms_per_iteration"] - lone["ms_per_iteration"]) * 1000
    print("  with a PreToolUse + PostToolUse hook and the PII guard (redact):")
    print(f"    median time per iteration, 1 run:   {guarded['ms_per_iteration']:.3f} ms")
    print(f"    iterations/s, 100 concurrent runs:  {guarded_many['iterations_per_s']:.0f}")
    print(f"    overhead per tool call (1 run):     {extra:+.0f} µs")


def _print_beside_floor(found: dict[str, dict[str, float]]) -> None:
    lone, many = found["lone"], found["many"]
    floor_lone, floor_many = found["floor_lone"], found["floor_many"]
    print(f"W1 ({LABELS['sqlite']}, 20 iterations per run, in-process echo tool)")
    print(f"  beside the floor (bench/floor.py), interleaved, medians of {REPEATS} repeats;")
    print("  Kestrel's collector settled as `kestrel serve` settles it (bot/collector.py):")
    print("                                         Kestrel      floor   Kestrel/floor")
    rows = [
        ("median time per iteration, 1 run", lone, floor_lone, "ms_per_iteration", "ms", 3),
        ("iterations/s, 1 run", lone, floor_lone, "iterations_per_s", "", 0),
        ("iterations/s, 100 concurrent runs", many, floor_many, "iterations_per_s", "", 0),
        ("peak RSS, 100 concurrent runs", many, floor_many, "peak_rss_mib", "MiB", 1),
    ]
    for label, ours, theirs, key, unit, digits in rows:
        ratio = ours[key] / theirs[key]
        mine, floor = f"{ours[key]:,.{digits}f} {unit}", f"{theirs[key]:,.{digits}f} {unit}"
        print(f"  {label + ':':<37}{mine:>10} {floor:>10}   {ratio:.2f}x")
    default = found["many_default"]["iterations_per_s"]
    ratio = default / floor_many["iterations_per_s"]
    print(f"  the same at 100 runs, the interpreter's collector: {default:>8,.0f}   {ratio:.2f}x")
    print("  targets: time per iteration ≤ 1.0x the floor, iterations/s at 100 runs ≥ 0.9x,")
    print("  peak RSS at 100 runs ≤ 40 MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", type=int)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store", help="the scenario's store URL")
    parser.add_argument("--guarded", action="store_true")
    parser.add_argument("--default-collector", action="store_true")
    parser.add_argument("--database", choices=DATABASES, default="sqlite")
    args = parser.parse_args()
    if args.scenario:
        figures = scenario(
            args.store, args.scenario, args.repeats, args.guarded, args.default_collector
        )
        print(json.dumps(asyncio.run(figures)))
    else:
        report(args.database)
