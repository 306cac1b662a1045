"""What isolating a catalog command costs: one call of ``true`` with and without it.

Each figure is the median of ``--rounds`` calls through ``CommandTool.call`` (spawn, wait,
group kill, output), in this process; and the start-up check ``kestrel`` makes once. Linux,
with namespaces allowed (root, or user namespaces).

    python -m bench.isolation [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from bot.tools.base import ToolContext
from bot.tools.command import CommandTool
from bot.tools.isolation import Isolation

CTX = ToolContext(run_id="bench", call_id="bench")


async def per_call(tool: CommandTool, rounds: int) -> float:
    """Median milliseconds of one call."""
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        await tool.call({}, CTX)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds) * 1000


def main() -> None:
    """Print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=50)
    rounds = parser.parse_args().rounds
    hidden = Isolation((str(Path("kestrel.example.yaml").resolve()),))
    plain = asyncio.run(per_call(CommandTool("t", "t", ["true"]), rounds))
    isolated = asyncio.run(per_call(CommandTool("t", "t", ["true"], isolation=hidden), rounds))
    checks = []
    for _ in range(min(rounds, 20)):
        started = time.perf_counter()
        hidden.check()
        checks.append(time.perf_counter() - started)
    print(f"call of true, not isolated: {plain:.1f} ms (median of {rounds})")
    print(f"call of true, isolated:     {isolated:.1f} ms (+{isolated - plain:.1f} ms)")
    print(f"start-up check:             {statistics.median(checks) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
