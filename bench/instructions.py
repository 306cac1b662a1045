"""W1 in instructions per iteration, counted by ``valgrind --tool=callgrind``: a figure the
machine's noise does not move (``python -m bench.instructions``; needs valgrind, about 3 min).

Two processes run under callgrind: one that only sets up (imports, store, runtime), one that
then runs rounds of concurrent W1 runs. Their difference, per iteration, is the loop's cost.
The same is counted for the floor (``bench.floor``), so their ratio is noise-free too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
from pathlib import Path

from bench import floor
from bench.common import bench_command, w1_runtime
from bench.stores import open_store, scratch
from bot.collector import settle_for_service
from bot.run.supervisor import Supervisor

ITERATIONS = 20
RUNS = 50
ROUNDS = 2


async def scenario(url: str, rounds: int) -> None:
    """Set up W1 on ``url`` and play ``rounds`` rounds of ``RUNS`` concurrent runs."""
    store = await open_store(url)
    supervisor = Supervisor(w1_runtime(store, ITERATIONS))
    settle_for_service()  # as ``kestrel serve`` does once started, and bench.w1
    for _ in range(rounds):
        lives = [await supervisor.start_turn("go") for _ in range(RUNS)]
        await asyncio.gather(*(supervisor.wait(live) for live in lives))
    await store.close()


async def floor_scenario(url: str, rounds: int) -> None:
    """The floor's ``scenario``: set up on ``url`` and play ``rounds`` rounds of ``RUNS``."""
    db = await floor.open_floor(url)
    for _ in range(rounds):
        await floor.play(db, RUNS)
    await db.close()


def counted(rounds: int, of_floor: bool = False) -> int:
    """Instructions of one scenario process (Kestrel's, or the floor's) under callgrind, on a
    fresh SQLite store."""
    which = ["--floor"] if of_floor else []
    with scratch("sqlite") as url:
        return instructions(
            bench_command("instructions", "--store", url, "--rounds", str(rounds), *which)
        )


def instructions(
    argv: list[str],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    expect: str = "",
) -> int:
    """The instructions one process executes, counted by callgrind (its children not followed;
    hash randomization off, so that two counts of the same work agree); it must succeed, and
    say ``expect``."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv]
    env = {**(os.environ if env is None else env), "PYTHONHASHSEED": "0"}
    out = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None or expect not in out.stdout:
        said = f"{out.stdout[-1000:]}{out.stderr[-2000:]}"
        raise RuntimeError(f"{' '.join(argv[:4])} under callgrind, exit {out.returncode}:\n{said}")
    return int(found.group(1))


def byte_code_written() -> None:
    """Play one round uncounted: a module changed since its byte code was written is compiled
    here, not in the first counted process alone (which read 7-14% high after a checkout)."""
    for which in ([], ["--floor"]):
        with scratch("sqlite") as url:
            argv = bench_command("instructions", "--store", url, "--rounds", "1", *which)
            subprocess.run(argv, check=True, capture_output=True)


def report() -> None:
    """Print W1's instructions per iteration, or why they cannot be counted."""
    if shutil.which("valgrind") is None:
        print("W1 instructions skipped: valgrind is not installed")
        return
    iterations = ROUNDS * RUNS * ITERATIONS
    byte_code_written()
    ours = (counted(ROUNDS) - counted(0)) / iterations
    floors = (counted(ROUNDS, of_floor=True) - counted(0, of_floor=True)) / iterations
    print(f"W1 under callgrind (SQLite, {ROUNDS} rounds of {RUNS} concurrent runs)")
    print(f"  instructions per iteration:           {ours:,.0f}")
    print(f"  the floor's (bench/floor.py):         {floors:,.0f} ({ours / floors:.2f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", help="run one scenario process on this store URL")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--floor", action="store_true", help="the floor's scenario instead")
    args = parser.parse_args()
    if args.store:
        play = floor_scenario if args.floor else scenario
        asyncio.run(play(args.store, args.rounds))
    else:
        report()
