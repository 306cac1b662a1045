"""Decisions a plan saves, on SQLite: one model reply with four gated calls, decided by a
person through the chat service, until the run ends.

* plan: the reply's four calls are one ``wait_plan`` card, approved once;
* step by step: the same card taken step by step, then each call's own card approved;
* one by one: the four calls in four replies, as before plans (a card each).

Each prints the requests opened, the decisions people made, the commands run, and the time
from the first decision to the run's end (median of ``--repeats``).

    python -m bench.plans [--repeats N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from pydantic import BaseModel

from bench.common import median
from bench.stores import open_store, scratch
from bot.chat.service import ChatService
from bot.domain import DecisionKind, RequestKind, RequestStatus
from bot.events import FanOut
from bot.llm.scripted import ScriptedProvider
from bot.people.policy import Actor
from bot.prompter import DeferringPrompter
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from bot.tools.python import function_tool
from bot.tools.source import ToolSource
from bot.tools.toolset import ToolSet

UNITS = ("node-1", "payments-api", "payments-db", "payments-worker")


class Unit(BaseModel):
    """A unit to restart."""

    unit: str


def _replies(together: bool) -> list[dict[str, Any]]:
    calls = [{"name": "restart_unit", "arguments": {"unit": unit}} for unit in UNITS]
    if together:
        return [{"text": "restart four", "calls": calls}, {"text": "done"}]
    return [*({"text": "next", "calls": [c]} for c in calls), {"text": "done"}]


async def scenario(name: str) -> dict[str, float]:
    """Run one scenario on a fresh SQLite file; its figures."""
    ran: list[str] = []

    @function_tool(name="restart_unit", confirm=True, idempotent=False)
    async def restart_unit(args: Unit) -> str:
        """Restart one unit."""
        ran.append(args.unit)
        return f"restarted {args.unit}"

    with scratch("sqlite") as url:
        store = await open_store(url)
        model = ScriptedProvider.from_replies(_replies(name != "one by one"), name="bench")
        rt = Runtime(
            store=store,
            model=model,
            tools=ToolSource(ToolSet([restart_unit])),
            events=FanOut(),
        )
        supervisor = Supervisor(rt)
        chat = ChatService(supervisor)
        live = await supervisor.start_turn(
            "fix it", requested_by="U0REQ", prompter=DeferringPrompter()
        )
        await supervisor.wait(live)
        decisions, began = 0, time.perf_counter()
        while open_ := await store.list_requests(run_id=live.run_id):
            for request, _status, _decision in open_:
                plan = request.kind is RequestKind.WAIT_PLAN
                kind = (
                    DecisionKind.STEP_BY_STEP
                    if plan and name == "step by step"
                    else DecisionKind.APPROVE
                )
                decided = await chat.decide(live.run_id, request.id, kind, user=Actor("U0BOSS"))
                decisions += 1
                if decided.resumed is not None:
                    await supervisor.wait(decided.resumed)
        seconds = time.perf_counter() - began
        every = await store.list_requests(run_id=live.run_id, status=None)
        await store.close()
    assert all(status is RequestStatus.ANSWERED for _, status, _ in every)
    return {
        "requests": len(every),
        "decisions": decisions,
        "commands": len(ran),
        "ms": seconds * 1000,
    }


def report(repeats: int = 3, as_json: bool = False) -> None:
    """Print each scenario's figures."""
    figures = {}
    for name in ("plan", "step by step", "one by one"):
        runs = [asyncio.run(scenario(name)) for _ in range(repeats)]
        figures[name] = {**runs[0], "ms": median([r["ms"] for r in runs])}
    if as_json:
        print(json.dumps(figures))
        return
    print(f"plans: 4 gated calls, decided through the chat service (median of {repeats})")
    for name, f in figures.items():
        print(
            f"  {name:<13} {f['requests']:.0f} requests, {f['decisions']:.0f} decisions,"
            f" {f['commands']:.0f} commands run, {f['ms']:.1f} ms from the first decision"
        )


def main() -> None:
    """``python -m bench.plans``."""
    options = argparse.ArgumentParser(description=__doc__)
    options.add_argument("--repeats", type=int, default=3)
    options.add_argument("--json", action="store_true")
    args = options.parse_args()
    report(args.repeats, args.json)


if __name__ == "__main__":
    main()
