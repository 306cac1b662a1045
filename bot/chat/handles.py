"""What the chat service hands out for a run: a handle while it runs, a result once it stops.

Adapters hold these, never the supervisor's ``LiveRun`` or the journal's ``RunState`` (both
satisfy them), so the run's internals can change without an adapter noticing.
"""

from __future__ import annotations

from typing import Protocol

from bot.domain import Request, RunStatus, TerminalResult


class RunHandle(Protocol):
    """A run this process drives: its id, and why its task failed (empty if it did not)."""

    @property
    def run_id(self) -> str:
        """The run's id."""
        ...

    @property
    def error(self) -> str:
        """Why the run's task failed before the run could stop cleanly; empty if it did not."""
        ...

    @property
    def cancelled_by(self) -> str:
        """Who asked the cancel the run's task ends it for, when known as the handle was given
        (a resume that found the run asked to cancel); empty otherwise."""
        ...


class RunResult(Protocol):
    """Where a run stands once it suspended or ended."""

    @property
    def run_id(self) -> str:
        """The run's id."""
        ...

    @property
    def status(self) -> RunStatus:
        """Running, suspended or one of the terminal statuses."""
        ...

    @property
    def result(self) -> TerminalResult | None:
        """The terminal result; None while the run has not ended."""
        ...

    @property
    def open_requests(self) -> list[Request]:
        """The requests a suspended run waits on."""
        ...
