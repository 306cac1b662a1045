"""W2: 1,000 runs each suspended on an approval, then approved and finished from a fresh process.

Prints the time to suspend them all, the store's size, the memory the process holds while they
wait (measured with 100 and with 1,000 suspended: it must not grow with their number), and the
time to approve and finish all of them from a new process (``--database sqlite|postgres``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.common import bench_command, run_json
from bench.stores import DATABASES, LABELS, open_store, scratch, store_mib
from bot.domain import Budgets, Decision, DecisionKind, Request, RequestKind
from bot.events import FanOut
from bot.journal.fold import RunState
from bot.llm.scripted import ScriptedProvider
from bot.people.policy import Policy, PolicyRules
from bot.prompter import DeferringPrompter
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from bot.store import Store
from bot.tools.python import function_tool
from bot.tools.source import ToolSource
from bot.tools.toolset import ToolSet

RUNS = 1000
CHUNK = 100


class Target(BaseModel):
    """Where to deploy."""

    service: str


@function_tool(confirm=True, idempotent=False)
async def deploy(args: Target) -> str:
    """Deploy a service (gated)."""
    return f"deployed {args.service}"


def runtime(store: Store) -> Runtime:
    """The W2 runtime: a gated tool, a two-reply script, approvers allowed by policy."""
    replies: list[dict[str, Any]] = [
        {"calls": [{"name": "deploy", "arguments": {"service": "checkout"}}]},
        {"text": "deployed"},
    ]
    return Runtime(
        store=store,
        model=ScriptedProvider.from_replies(replies, name="w2"),
        tools=ToolSource(ToolSet([deploy])),
        events=FanOut(),
        budgets=Budgets(),
        policy=Policy(PolicyRules(approvers={"*": ["U0APPROVER"]})),
        owner="bench-w2",
    )


def held_mib() -> float:
    """The process's resident memory now, after a collection, in MiB."""
    gc.collect()
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


async def suspend_all(url: str) -> dict[str, float]:
    """Phase one: start RUNS runs in chunks; each suspends on its approval."""
    store = await open_store(url)
    supervisor = Supervisor(runtime(store))
    held: dict[int, float] = {}
    started = time.perf_counter()
    for done in range(0, RUNS, CHUNK):
        lives = [
            await supervisor.start_turn("ship", requested_by="U0REQ", prompter=DeferringPrompter())
            for _ in range(CHUNK)
        ]
        states = await asyncio.gather(*(supervisor.wait(live) for live in lives))
        assert all(s.status.value == "suspended" for s in states)
        if done + CHUNK in (CHUNK, RUNS):
            held[done + CHUNK] = held_mib()
    elapsed = time.perf_counter() - started
    assert not supervisor.live
    await store.close()
    return {
        "suspend_s": elapsed,
        "held_mib_100": held[CHUNK],
        "held_mib_1000": held[RUNS],
        "store_mib": await store_mib(url),
    }


async def approve_all(url: str) -> dict[str, float]:
    """Phase two, in a fresh process: approve every request and finish every run."""
    store = await open_store(url)
    supervisor = Supervisor(runtime(store))
    started = time.perf_counter()
    pending = await store.list_requests()
    assert len(pending) == RUNS and all(r.kind is RequestKind.WAIT_APPROVAL for r, _, _ in pending)

    async def approve(request: Request) -> RunState:
        decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APPROVER")
        answered = await supervisor.answer(decision, run_id=request.run_id)
        assert answered.ready, answered.message
        live = await supervisor.resume(request.run_id)
        assert live is not None
        return await supervisor.wait(live)

    for chunk in range(0, RUNS, CHUNK):
        batch = pending[chunk : chunk + CHUNK]
        states = await asyncio.gather(*(approve(request) for request, _s, _d in batch))
        assert all(s.result is not None and s.result.text == "deployed" for s in states)
    elapsed = time.perf_counter() - started
    await store.close()
    return {"approve_s": elapsed}


def phase(name: str, url: str) -> dict[str, float]:
    """One phase in a fresh interpreter."""
    return run_json(bench_command("w2", "--phase", name, "--store", url))


def report(database: str = "sqlite") -> None:
    """Print W2's figures on ``database``."""
    with scratch(database) as url:
        first = phase("suspend", url)
        second = phase("approve", url)
    print(f"W2 ({RUNS} runs suspended on an approval, {LABELS[database]})")
    print(f"  time to suspend all:                  {first['suspend_s']:.2f} s")
    size = "store size:" if database == "sqlite" else "store size (tables, indexes):"
    print(f"  {size:<38}{first['store_mib']:.1f} MiB")
    print(
        "  resident memory while they wait:      "
        f"{first['held_mib_100']:.1f} MiB with 100 suspended, "
        f"{first['held_mib_1000']:.1f} MiB with 1,000"
    )
    print(f"  approve and finish all (new process): {second['approve_s']:.2f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", choices=["suspend", "approve"])
    parser.add_argument("--store", help="the store URL both phases use")
    parser.add_argument("--database", choices=DATABASES, default="sqlite")
    args = parser.parse_args()
    if args.phase == "suspend":
        print(json.dumps(asyncio.run(suspend_all(args.store))))
    elif args.phase == "approve":
        print(json.dumps(asyncio.run(approve_all(args.store))))
    else:
        report(args.database)
