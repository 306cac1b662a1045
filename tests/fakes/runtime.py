"""Real parts wired for tests: a SQLite file, the scripted model, in-process tools."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bot.domain import Budgets, Decision, DecisionKind, Request, utcnow
from bot.events import Event, FanOut
from bot.hooks import Hooks
from bot.journal.fold import RunState
from bot.journal.log import JournalRecord
from bot.llm.base import ModelProvider
from bot.llm.scripted import ScriptedProvider
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from bot.store import Store
from bot.tools.base import Tool, ToolContext
from bot.tools.python import function_tool
from bot.tools.source import ToolSource
from bot.tools.toolset import ToolSet
from storage.sqlite import open_sqlite


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """One scripted tool call."""
    return {"name": name, "arguments": arguments}


def reply(*calls: dict[str, Any], text: str | None = None, **extra: Any) -> dict[str, Any]:
    """One scripted model reply."""
    out: dict[str, Any] = {"text": text, "calls": list(calls)}
    out.update(extra)
    return out


class Recorder:
    """An event sink that keeps every event."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        """Keep it."""
        self.events.append(event)

    def kinds(self) -> list[str]:
        """The kinds in order."""
        return [e.kind for e in self.events]


class Counter:
    """Counts executions of in-process tools by name (the effect a test asserts on)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def hit(self, name: str) -> None:
        """Count one execution."""
        self.calls[name] = self.calls.get(name, 0) + 1


class TextArgs(BaseModel):
    """A single text argument."""

    text: str


def counting_tools(counter: Counter, **deploy_options: Any) -> list[Tool]:
    """echo (idempotent), deploy (gated, not idempotent), write, slow (sleeps), boom (raises)."""
    import asyncio

    @function_tool(name="echo", idempotent=True)
    async def echo(args: TextArgs) -> str:
        """Return the text."""
        counter.hit("echo")
        return args.text

    @function_tool(name="deploy", confirm=True, idempotent=False, **deploy_options)
    async def deploy(args: TextArgs, ctx: ToolContext) -> str:
        """Deploy something (gated)."""
        counter.hit("deploy")
        return f"deployed {args.text}"

    @function_tool(name="write", idempotent=False)
    async def write(args: TextArgs) -> str:
        """A non-idempotent effect without a gate."""
        counter.hit("write")
        return f"wrote {args.text}"

    @function_tool(name="slow", idempotent=True, timeout=0.2)
    async def slow(args: TextArgs) -> str:
        """Sleep past the timeout."""
        counter.hit("slow")
        await asyncio.sleep(5)
        return "never"

    @function_tool(name="boom", idempotent=True)
    async def boom(args: TextArgs) -> str:
        """Raise."""
        counter.hit("boom")
        raise RuntimeError("kaboom")

    return [echo, deploy, write, slow, boom]


class ScriptedPrompter:
    """A prompter present at the keyboard that answers from a list (None = later)."""

    def __init__(
        self,
        answers: Sequence[DecisionKind | None],
        by: str = "U0APPROVER",
        text: str = "scripted",
    ) -> None:
        self.answers = list(answers)
        self.asked: list[Request] = []
        self.by = by
        self.text = text

    @property
    def present(self) -> bool:
        """Someone is there."""
        return True

    async def ask(self, request: Request) -> Decision | None:
        """The next scripted answer."""
        self.asked.append(request)
        kind = self.answers.pop(0) if self.answers else None
        if kind is None:
            return None
        return Decision(request_id=request.id, kind=kind, by=self.by, text=self.text)


async def make_runtime(
    db: Path,
    replies: Sequence[Mapping[str, Any]] | ModelProvider,
    tools: Sequence[Tool] = (),
    *,
    budgets: Budgets | None = None,
    hooks: Hooks | None = None,
    owner: str = "test-owner",
    lease_seconds: float = 30.0,
    clock: Callable[[], datetime] = utcnow,
    store: Store | None = None,
) -> tuple[Runtime, Recorder]:
    """A runtime on a fresh SQLite file (or on ``store``, opened by the caller) with a
    recorder subscribed to its events (``clock``: the runtime's and the store's, which a test
    may move instead of sleeping)."""
    store = store or await open_sqlite(db, clock=clock)
    model = (
        replies
        if not isinstance(replies, Sequence)
        else ScriptedProvider.from_replies(list(replies), name="test")
    )
    recorder = Recorder()
    rt = Runtime(
        store=store,
        model=model,
        tools=ToolSource(ToolSet(tools)),
        hooks=hooks or Hooks(),
        events=FanOut(recorder),
        budgets=budgets or Budgets(),
        owner=owner,
        lease_seconds=lease_seconds,
        clock=clock,
    )
    return rt, recorder


async def one_call(db: Path, tool: Tool, **arguments: Any) -> tuple[RunState, list[JournalRecord]]:
    """A run whose model calls ``tool`` once with ``arguments``, then answers "done": its last
    state and its journal."""
    replies = [reply(call(tool.name, **arguments)), reply(text="done")]
    rt, _ = await make_runtime(db, replies, [tool])
    supervisor = Supervisor(rt)
    state = await supervisor.wait(await supervisor.start_turn("help"))
    records = await rt.store.load(state.run_id)
    await rt.store.close()
    return state, records
