"""``RunContext``: what every step of one run shares, assembled once by the supervisor."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from bot.domain import Request, RequestMaker, unstamped
from bot.events import FanOut
from bot.hooks import HookContext, Hooks
from bot.journal.writer import RunJournal
from bot.kinds import Provenance
from bot.people.audit import Redact, unchanged
from bot.prompter import Prompter
from bot.run.interrupt import Interrupt


class RunContext:
    """The run's journal, hooks, events, prompter and requests, for the loop and executeTool.

    A plain class: a dataclass's generated methods cost a fresh process 0.8 ms to build.
    """

    def __init__(
        self,
        journal: RunJournal,
        hooks: Hooks,
        events: FanOut,
        open_request: Callable[[Request], Awaitable[None]],
        interrupt: Interrupt,
        stamp: Callable[[Request], Request] = unstamped,
        prompter: Prompter | None = None,
        workdir: Path | None = None,
        provenance: Provenance = Provenance.ASK,
        redact: Redact = unchanged,
        look_for_cancel: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.journal = journal
        self.hooks = hooks
        self.events = events
        self.open_request = open_request
        # The run's own, from its signals: a fresh one here would never hear a stop request.
        self.interrupt = interrupt
        self.stamp = stamp
        self.prompter = prompter
        self.workdir = workdir
        self.provenance = provenance
        # The PII guard as a function of text, for what the log says of a tool's failure.
        self.redact = redact
        # Before an effect: reads whether another process asked the run's cancel, and stops
        # the run if so; whether the run was asked to cancel, here or there (None: nobody else
        # can ask, a run no supervisor drives).
        self.look_for_cancel = look_for_cancel
        self.run_id = journal.run_id  # the journal's, kept here: read on every step
        requested_by = self.requested_by
        self.hook_ctx = HookContext(run_id=self.run_id, requested_by=requested_by)
        # Makes this run's requests: the gate's approvals, a tool's deferral, a question.
        self.request = RequestMaker(self.run_id, requested_by, stamp)

    @property
    def requested_by(self) -> str:
        """Who started the run."""
        started = self.journal.state.started
        return started.requested_by if started else ""
