"""The W1 floor: a plain asyncio loop doing W1's work, which Kestrel is measured against.

Runs of 20 iterations, one instant in-process tool call each, with the SQLite settings of
Kestrel's store (WAL, ``synchronous=FULL``, the same pragmas) and the same durable commits:
one to create the run, one per model turn, one per tool result, one for the answer and the
end. It is what one would write by hand with aiosqlite (one shared connection, an
``await commit()`` after each write) and no validation, no fencing, no projection, no events.
Each scenario runs in a fresh process on a fresh file, like ``bench.w1``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from datetime import UTC, datetime
from typing import Any

import aiosqlite

from bench.bare import median, peak_rss_mib, w1_replies

ITERATIONS = 20
_PRAGMAS = """
PRAGMA busy_timeout = 5000;
PRAGMA foreign_keys = ON;
PRAGMA synchronous = FULL;
PRAGMA journal_mode = WAL;
PRAGMA wal_autocheckpoint = 256;
"""
_SCHEMA = """
CREATE TABLE runs (id TEXT PRIMARY KEY, status TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE journal (
    run_id TEXT NOT NULL REFERENCES runs(id),
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    at TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
"""
_APPEND = "INSERT INTO journal (run_id, seq, kind, body, at) VALUES (?, ?, ?, ?, ?)"
_ids = itertools.count()


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _echo(text: str) -> str:
    return text


class FloorRun:
    """One run of the plain loop: a scripted model, the echo tool, a journal row per step."""

    def __init__(self, db: aiosqlite.Connection, replies: list[dict[str, Any]]) -> None:
        self.db = db
        self.replies = iter(replies)
        self.run_id = f"run-{next(_ids)}"
        self.messages: list[dict[str, Any]] = []
        self.seq = 0
        self.iterations = 0

    async def append(self, kind: str, body: dict[str, Any]) -> None:
        """One journal row, committed before the loop goes on."""
        await self.db.execute(_APPEND, (self.run_id, self.seq, kind, json.dumps(body), _now()))
        await self.db.commit()
        self.seq += 1

    async def run(self) -> str:
        """Start, iterate until the model answers, end; the answer."""
        await self.db.execute("INSERT INTO runs VALUES (?, 'running', ?)", (self.run_id, _now()))
        self.messages.append({"role": "user", "content": "go"})
        await self.append("user_message", self.messages[-1])
        while True:
            reply = await self.complete()
            turn = {"role": "assistant", "content": reply.get("text"), "calls": reply.get("calls")}
            self.messages.append(turn)
            if not turn["calls"]:
                return await self.end(turn)
            self.iterations += 1
            await self.append("assistant_turn", turn)
            for number, call in enumerate(turn["calls"]):
                output = _echo(**call["arguments"])
                result = {"role": "tool", "call_id": f"c{number}", "content": output}
                self.messages.append(result)
                await self.append("tool_result", result)

    async def complete(self) -> dict[str, Any]:
        """The instant model: the next scripted reply."""
        return next(self.replies)

    async def end(self, turn: dict[str, Any]) -> str:
        """The answer and the run's status, in one commit."""
        await self.db.execute(_APPEND, (self.run_id, self.seq, "answer", json.dumps(turn), _now()))
        await self.db.execute(
            "UPDATE runs SET status = 'completed', updated_at = ? WHERE id = ?",
            (_now(), self.run_id),
        )
        await self.db.commit()
        return str(turn["content"])


async def open_floor(url: str) -> aiosqlite.Connection:
    """The floor's database at the SQLite URL ``url``, created with Kestrel's pragmas."""
    db = await aiosqlite.connect(url.removeprefix("sqlite:///"))
    await db.executescript(_PRAGMAS + _SCHEMA)
    return db


async def play(db: aiosqlite.Connection, runs: int) -> int:
    """One round of ``runs`` concurrent floor runs; the iterations they made."""
    replies = w1_replies(ITERATIONS)
    floor_runs = [FloorRun(db, replies) for _ in range(runs)]
    answers = await asyncio.gather(*(run.run() for run in floor_runs))
    assert all(answer == "done" for answer in answers)
    return sum(run.iterations for run in floor_runs)


async def scenario(url: str, runs: int, repeats: int) -> dict[str, float]:
    """Time ``repeats`` rounds of ``runs`` concurrent floor runs on the SQLite file at ``url``."""
    db = await open_floor(url)
    per_iteration, rates = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        iterations = await play(db, runs)
        elapsed = time.perf_counter() - started
        per_iteration.append(elapsed / ITERATIONS * 1000)
        rates.append(iterations / elapsed)
    await db.close()
    return {
        "ms_per_iteration": median(per_iteration),
        "iterations_per_s": median(rates),
        "peak_rss_mib": peak_rss_mib(),
    }


def report() -> None:
    """Print the floor's W1 figures alone (``bench.w1`` measures it beside Kestrel)."""
    # Here, not at the top: a scenario's process imports nothing of Kestrel.
    from bench.w1 import run_scenario

    lone = run_scenario("floor", 1, repeats=15)
    many = run_scenario("floor", 100, repeats=5)
    print("W1 floor (a plain asyncio loop, aiosqlite, SQLite WAL, synchronous=FULL)")
    print(f"  median time per iteration, 1 run:     {lone['ms_per_iteration']:.3f} ms")
    print(f"  iterations/s, 100 concurrent runs:    {many['iterations_per_s']:.0f}")
    print(f"  peak RSS, 100 concurrent runs:        {many['peak_rss_mib']:.1f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", type=int)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store", help="the scenario's SQLite URL")
    args = parser.parse_args()
    if args.scenario:
        print(json.dumps(asyncio.run(scenario(args.store, args.scenario, args.repeats))))
    else:
        report()
