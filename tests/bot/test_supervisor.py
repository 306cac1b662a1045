"""The supervisor's shutdown: a tool under way may finish for the grace, then it is cut."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import BaseModel

from bot.domain import StopReason
from bot.events import Event, ToolStartedEvent
from bot.journal.entries import RunSuspended, ToolResultEntry
from bot.supervisor import Supervisor
from bot.tools.python import function_tool
from tests.fakes.runtime import call, make_runtime, reply


class Nap(BaseModel):
    """How long to sleep."""

    seconds: float


@function_tool(name="nap", idempotent=True, timeout=0)
async def nap(args: Nap) -> str:
    """Sleep, then say so."""
    await asyncio.sleep(args.seconds)
    return "rested"


class ToolStarted:
    """Sets an event when a tool starts."""

    def __init__(self, started: asyncio.Event) -> None:
        self.started = started

    def emit(self, event: Event) -> None:
        """Watch for the tool's start."""
        if isinstance(event, ToolStartedEvent):
            self.started.set()


async def shut_down_during(tmp_path: Path, seconds: float, grace: float) -> list[object]:
    """Start a run whose tool naps ``seconds``, shut down with ``grace``; the journal."""
    replies = [reply(call("nap", seconds=seconds)), reply(text="done")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, [nap])
    started = asyncio.Event()
    rt.events.add(ToolStarted(started))
    supervisor = Supervisor(rt)
    live = await supervisor.start_turn("rest", prompter=None)
    await started.wait()
    handed_back = await supervisor.shutdown(tool_grace=grace)
    entries = [r.entry for r in await rt.store.load(live.run_id)]
    await rt.store.close()
    assert handed_back == [live.run_id]
    return entries


async def test_a_tool_that_finishes_within_the_grace_keeps_its_result(tmp_path: Path) -> None:
    entries = await shut_down_during(tmp_path, seconds=0.1, grace=10)

    assert [e.output for e in entries if isinstance(e, ToolResultEntry)] == ["rested"]
    (suspended,) = [e for e in entries if isinstance(e, RunSuspended)]
    assert suspended.reason is StopReason.INTERRUPTED


async def test_a_tool_still_running_after_the_grace_is_cut(tmp_path: Path) -> None:
    entries = await asyncio.wait_for(shut_down_during(tmp_path, seconds=60, grace=0.2), 10)

    assert not [e for e in entries if isinstance(e, ToolResultEntry)]
    (suspended,) = [e for e in entries if isinstance(e, RunSuspended)]
    assert suspended.reason is StopReason.INTERRUPTED
