"""Provenance: what tracing a consequential call's arguments costs (python -m bench.provenance).

The run holds 64 KiB of earlier tool output (eight outputs of the PII bench's mixed log corpus)
and the requester's prompt; each figure is the median time of ``Tracer.origins`` (the run's
outputs and human texts gathered from its state, then matched), the work executeTool adds to a
consequential call. An idempotent, ungated call (W1's echo) is not traced at all. Then the
demo's normal flow is run, counting the decisions provenance asked for (expected: none).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.pii_throughput import build_corpus, split_chunks
from bot.config.settings import demo_file
from bot.domain import AssistantTurn, Decision, DecisionKind, Request, ToolCall
from bot.journal.fold import RunState
from bot.llm.base import (
    AssistantMessage,
    SystemMessage,
    ToolResultItem,
    ToolResultsMessage,
    UserMessage,
)
from bot.llm.scripted import ScriptedProvider, load_script
from bot.run.origins import Tracer
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from bot.tools.ask_human import ask_human_tools
from bot.tools.base import Tool
from bot.tools.catalog import load_catalog
from bot.tools.source import ToolSource
from bot.tools.toolset import ToolSet
from storage.sqlite import open_sqlite

OUTPUT_BYTES = 64 * 1024
PROMPT = "checkout is failing since the deploy, can you look?"


def _state(outputs: list[str]) -> RunState:
    """A run that read ``outputs`` (one call each) after the prompt."""
    calls = tuple(ToolCall(id=f"call_{n}", name="tail_logs", arguments="{}") for n in range(8))
    state = RunState(run_id="run_bench")
    state.messages = [
        SystemMessage("You are Kestrel."),
        UserMessage(PROMPT),
        AssistantMessage(AssistantTurn(text="Looking.", calls=calls)),
        ToolResultsMessage(
            tuple(
                ToolResultItem(call.id, call.name, text)
                for call, text in zip(calls, outputs, strict=True)
            )
        ),
    ]
    return state


def _time(state: RunState, tool: Tool, arguments: dict[str, Any], repeat: int) -> float:
    """The median microseconds of one trace, by a new batch's tracer (it gathers the run's
    outputs afresh, as the next batch's does)."""
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        Tracer(state, _asks_nobody).origins("call_next", tool, arguments)
        timings.append((time.perf_counter() - started) * 1e6)
    return statistics.median(timings)


def cost(repeat: int = 2000) -> dict[str, float]:
    """Microseconds per consequential call, by where its arguments' values are."""
    corpus = build_corpus(OUTPUT_BYTES)[:OUTPUT_BYTES]
    outputs = split_chunks(corpus, OUTPUT_BYTES // 8)[:8]
    # A value that stands in the last output, as a followed injection's would: found last.
    word = next(w for w in reversed(outputs[-1].split()) if len(w) >= 8 and w.isascii())
    restart = next(
        t for t in load_catalog(demo_file("tools/ops.yaml")) if t.name == "restart_service"
    )
    state = _state(outputs)
    return {
        "value from the prompt": _time(state, restart, {"service": "checkout"}, repeat),
        "value in no text": _time(state, restart, {"service": "zz-no-such-service"}, repeat),
        "value in an output (then asks)": _time(state, restart, {"service": word}, repeat),
        "three values in no text": _time(
            state,
            restart,
            {"service": "zz-one", "spec": {"node": "zz-node-77", "replicas": 12345}},
            repeat,
        ),
    }


def _asks_nobody(_tool: str) -> bool:
    return False


class _Approver:
    """Approves every approval and answers yes, counting what it was asked."""

    present = True

    def __init__(self) -> None:
        self.asked: list[Request] = []

    async def ask(self, request: Request) -> Decision | None:
        self.asked.append(request)
        kind = DecisionKind.APPROVE if request.tool == "restart_service" else DecisionKind.ANSWER
        return Decision(request_id=request.id, kind=kind, text="yes", by="U0BENCH")


async def _demo_flow(folder: Path) -> tuple[int, int]:
    """The demo's incident, run once: (requests asked, requests that carried origins)."""
    os.environ["KESTREL_DEMO_STATE"] = str(folder / "state")
    store = await open_sqlite(folder / "k.db")
    tools = ToolSet.assemble(load_catalog(demo_file("tools/ops.yaml")), ask_human_tools())
    rt = Runtime(
        store=store,
        model=ScriptedProvider(load_script(demo_file("demo.yaml"))),
        tools=ToolSource(tools),
    )
    approver = _Approver()
    sup = Supervisor(rt)
    live = await sup.start_turn(
        "checkout is failing, can you look?", requested_by="U0BENCH", prompter=approver
    )
    state = await sup.wait(live)
    await store.close()
    assert state.result is not None and "back up" in state.result.text, state.result
    return len(approver.asked), sum(1 for r in approver.asked if r.origins)


def report() -> None:
    """Print the cost figures and the demo's false positives."""
    figures = cost()
    print(f"Provenance ({OUTPUT_BYTES // 1024} KiB of earlier tool output in 8 outputs)")
    for name, micros in figures.items():
        print(f"  per consequential call, {name + ':':<33} {micros:7.1f} µs")
    print("  per idempotent, ungated call (W1's echo): not traced")
    with tempfile.TemporaryDirectory() as folder:
        asked, traced = asyncio.run(_demo_flow(Path(folder)))
    print(f"  demo flow: {asked} decisions asked, {traced} of them for provenance")


if __name__ == "__main__":
    report()
