"""``RunContext``: what every step of one run shares, assembled once by the supervisor."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bot.domain import Request, RequestMaker, unstamped
from bot.events import FanOut
from bot.hooks import HookContext, Hooks
from bot.journal.writer import RunJournal
from bot.kinds import Provenance
from bot.prompter import Prompter
from bot.run.interrupt import Interrupt


@dataclass
class RunContext:
    """The run's journal, hooks, events, prompter and requests, for the loop and executeTool."""

    journal: RunJournal
    hooks: Hooks
    events: FanOut
    open_request: Callable[[Request], Awaitable[None]]
    # The run's own, from its signals: a fresh one here would never hear a stop request.
    interrupt: Interrupt
    stamp: Callable[[Request], Request] = unstamped
    prompter: Prompter | None = None
    workdir: Path | None = None
    provenance: Provenance = Provenance.ASK
    run_id: str = field(init=False)  # the journal's, kept here: read on every step
    hook_ctx: HookContext = field(init=False)
    # Makes this run's requests: the gate's approvals, a tool's deferral, a question.
    request: RequestMaker = field(init=False)

    def __post_init__(self) -> None:
        self.run_id = self.journal.run_id
        self.hook_ctx = HookContext(run_id=self.run_id, requested_by=self.requested_by)
        self.request = RequestMaker(self.run_id, self.requested_by, self.stamp)

    @property
    def requested_by(self) -> str:
        """Who started the run."""
        started = self.journal.state.started
        return started.requested_by if started else ""
