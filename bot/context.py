"""``RunContext``: what every step of one run shares, assembled once by the supervisor."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.domain import Request, RequestKind
from bot.events import EventSink
from bot.hooks import HookContext, Hooks
from bot.interrupt import Interrupt
from bot.journal.writer import RunJournal
from bot.prompter import Prompter


def _unstamped(request: Request) -> Request:
    return request


@dataclass
class RunContext:
    """The run's journal, hooks, events, prompter and requests, for the loop and executeTool."""

    journal: RunJournal
    hooks: Hooks
    events: EventSink
    open_request: Callable[[Request], Awaitable[None]]
    # The run's own, from its signals: a fresh one here would never hear a stop request.
    interrupt: Interrupt
    stamp: Callable[[Request], Request] = _unstamped
    prompter: Prompter | None = None
    workdir: Path | None = None
    hook_ctx: HookContext = field(init=False)

    def __post_init__(self) -> None:
        self.hook_ctx = HookContext(run_id=self.run_id, requested_by=self.requested_by)

    @property
    def run_id(self) -> str:
        """The run."""
        return self.journal.run_id

    @property
    def requested_by(self) -> str:
        """Who started the run."""
        started = self.journal.state.started
        return started.requested_by if started else ""

    def request(
        self,
        kind: RequestKind,
        call_id: str,
        tool: str,
        arguments: dict[str, Any],
        **details: Any,
    ) -> Request:
        """A new request of this run about one call, with its deadline (prompt, options,
        digest, approvals and id as ``details``)."""
        request = Request(
            run_id=self.run_id,
            kind=kind,
            call_id=call_id,
            tool=tool,
            arguments=arguments,
            requested_by=self.requested_by,
            **details,
        )
        return self.stamp(request)
