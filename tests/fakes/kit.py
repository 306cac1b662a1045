"""A real runtime and supervisor for tests of what surrounds the loop: hooks, guard, panics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot import wire
from bot.domain import TerminalResult
from bot.events import AdvisoryEvent, EventSink
from bot.hooks import HookContext, Hooks
from bot.journal.entries import ToolResultEntry, UserMessageEntry
from bot.journal.fold import RunState
from bot.journal.log import JournalRecord
from bot.llm.base import (
    Message,
    ModelProvider,
    Notice,
    SystemMessage,
    ToolResultsMessage,
    ToolSpec,
    UserMessage,
)
from bot.llm.scripted import ScriptedProvider
from bot.pii.guard import PiiGuard
from bot.pii.hooks import pii_hooks
from bot.prompter import Prompter
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from bot.tools.base import Tool
from tests.fakes.runtime import Counter, Recorder, counting_tools, make_runtime


class RecordingModel:
    """Wraps a model (the scripted one by default) and records every conversation it is sent."""

    def __init__(self, inner: ModelProvider | Sequence[Mapping[str, Any]]) -> None:
        self.inner: ModelProvider = (
            ScriptedProvider.from_replies(list(inner), name="test")
            if isinstance(inner, Sequence)
            else inner
        )
        self.calls: list[list[Message]] = []

    @property
    def provider(self) -> str:
        """The wrapped provider's kind."""
        return self.inner.provider

    @property
    def model(self) -> str:
        """The wrapped model's name."""
        return self.inner.model

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        timeout: float,
        *,
        notice: Notice | None = None,
    ) -> Any:
        """Record the conversation, then ask the wrapped model."""
        self.calls.append(list(messages))
        return await self.inner.complete(messages, tools, timeout, notice=notice)


class Ends:
    """A RunEnd hook that records every result it is told about."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, TerminalResult]] = []

    async def __call__(self, result: TerminalResult, ctx: HookContext) -> None:
        """Record one end."""
        self.seen.append((ctx.run_id, result))

    def of(self, run_id: str) -> list[TerminalResult]:
        """The ends recorded for one run."""
        return [result for rid, result in self.seen if rid == run_id]


@dataclass
class Kit:
    """Runtime, supervisor, recording model, counted tools, recorded events and RunEnd hooks."""

    rt: Runtime
    rec: Recorder
    model: RecordingModel
    counter: Counter
    sup: Supervisor
    ends: Ends = field(default_factory=Ends)

    async def run(
        self, prompt: str = "help", prompter: Prompter | None = None
    ) -> tuple[RunState, list[JournalRecord]]:
        """Start one turn, wait for its task, and return its state and journal."""
        live = await self.sup.start_turn(prompt, requested_by="U0REQ", prompter=prompter)
        state = await self.sup.wait(live)
        return state, list(await self.rt.store.load(live.run_id))

    def advisories(self, run_id: str | None = None, source: str | None = None) -> list[str]:
        """The texts of the advisory events (of one run, of one source)."""
        return [
            e.text
            for e in self.rec.events
            if isinstance(e, AdvisoryEvent)
            and (run_id is None or e.run_id == run_id)
            and (source is None or e.source == source)
        ]

    def tool_outputs_seen(self) -> list[str]:
        """Every tool output the model was sent, in every conversation."""
        return [
            item.output
            for conversation in self.model.calls
            for message in conversation
            if isinstance(message, ToolResultsMessage)
            for item in message.results
        ]

    def seen_by_model(self) -> str:
        """Everything the model was ever sent, as one text."""
        parts: list[str] = []
        for conversation in self.model.calls:
            for message in conversation:
                if isinstance(message, SystemMessage | UserMessage):
                    parts.append(message.text)
                elif isinstance(message, ToolResultsMessage):
                    parts += [item.output for item in message.results]
                else:
                    parts.append(wire.to_json(message.turn))
        return "\n".join(parts)


async def build_kit(
    db: Path,
    model: ModelProvider | Sequence[Mapping[str, Any]],
    *,
    hooks: Hooks | None = None,
    tools: Sequence[Tool] | None = None,
    pii: PiiGuard | None = None,
    sinks: Sequence[EventSink] = (),
    **runtime: Any,
) -> Kit:
    """A kit on a fresh SQLite file; ``pii`` installs the guard as the composition root does."""
    counter, recording, ends = Counter(), RecordingModel(model), Ends()
    hooks = hooks or Hooks()
    hooks.run_end.append(ends)
    rt, rec = await make_runtime(
        db,
        recording,
        counting_tools(counter) if tools is None else tools,
        hooks=hooks,
        **runtime,
    )
    for sink in sinks:
        rt.events.add(sink)
    if pii is not None:
        guard, events = pii, rt.events
        rt.guard_hooks = lambda: pii_hooks(guard, events)
        rt.redact = lambda text: guard.scan_output(text).text
    return Kit(rt, rec, recording, counter, Supervisor(rt), ends)


def results(records: Sequence[JournalRecord]) -> list[ToolResultEntry]:
    """The journaled tool results."""
    return [r.entry for r in records if isinstance(r.entry, ToolResultEntry)]


def user_messages(records: Sequence[JournalRecord]) -> list[str]:
    """The journaled user messages."""
    return [r.entry.text for r in records if isinstance(r.entry, UserMessageEntry)]
