"""Shared pieces of the benchmarks: the W1 runtime, subprocesses, timing and memory helpers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

# Re-exported: the floors import them from bench.bare, which imports nothing of Kestrel.
from bench.bare import median as median
from bench.bare import peak_rss_mib as peak_rss_mib
from bench.bare import w1_replies
from bot.domain import Budgets, ToolCall
from bot.events import FanOut
from bot.hooks import HookContext, Hooks, ToolVerdict
from bot.llm.scripted import ScriptedProvider
from bot.pii.guard import PiiGuard, PiiMode, PiiSettings
from bot.pii.hooks import pii_hooks
from bot.run.runtime import Runtime
from bot.store import Store
from bot.tools.builtin import builtin_tools
from bot.tools.source import ToolSource
from bot.tools.toolset import ToolSet


def w1_runtime(
    store: Store, iterations: int, owner: str = "bench", guarded: bool = False
) -> Runtime:
    """An instant scripted model and the in-process echo tool over ``store``.

    ``guarded`` adds a caller's PreToolUse and PostToolUse hook and the PII guard (redact).
    """
    events = FanOut()
    guard = PiiGuard(PiiSettings(mode=PiiMode.REDACT if guarded else PiiMode.OFF))
    hooks = Hooks(pre_tool_use=[_allow], post_tool_use=[_keep]) if guarded else Hooks()
    return Runtime(
        store=store,
        model=ScriptedProvider.from_replies(w1_replies(iterations), name="w1"),
        tools=ToolSource(ToolSet(builtin_tools())),
        events=events,
        hooks=hooks,
        guard_hooks=lambda: pii_hooks(guard, events),
        budgets=Budgets(max_iterations=iterations + 1, max_tool_calls=iterations + 1),
        owner=owner,
    )


async def _allow(call: ToolCall, ctx: HookContext) -> ToolVerdict:  # noqa: ARG001
    return ToolVerdict()


async def _keep(call: ToolCall, output: str, ctx: HookContext) -> str | None:  # noqa: ARG001
    return None


def size_mib(path: Path) -> float:
    """A SQLite database's size with its WAL, in MiB."""
    files = [path, path.with_name(path.name + "-wal")]
    return sum(f.stat().st_size for f in files if f.exists()) / 2**20


def bench_command(module: str, *args: str) -> list[str]:
    """The command line running ``python -m bench.MODULE ARGS`` with this interpreter."""
    return [sys.executable, "-m", f"bench.{module}", *args]


def run_json(command: list[str]) -> dict[str, Any]:
    """Run a bench subprocess to its end and parse the JSON it prints; its stderr if it fails."""
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{command[2]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def spawn(command: list[str], errors: Path) -> subprocess.Popen[str]:
    """Start a long-lived bench subprocess that talks on stdout; its stderr goes to ``errors``."""
    with errors.open("w") as sink:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=sink, text=True)


def expect(process: subprocess.Popen[str], prefix: str, errors: Path) -> str:
    """The next line ``process`` prints, which must start with ``prefix``."""
    stdout: IO[str] | None = process.stdout
    assert stdout is not None
    line = stdout.readline().strip()
    if not line.startswith(prefix):
        process.kill()
        process.wait()
        tail = errors.read_text()[-3000:] if errors.exists() else ""
        raise RuntimeError(f"expected {prefix!r} from a bench process, got {line!r}\n{tail}")
    return line


def stop(processes: Sequence[subprocess.Popen[str]]) -> None:
    """Kill whichever of ``processes`` still run, and reap them all."""
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()
