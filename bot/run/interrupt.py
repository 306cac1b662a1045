"""Stopping a run now (shutdown, Ctrl-C, SIGTERM): its model call, prompt or tool, never a write.

The run's task marks the waits that may be cut short with ``Interrupt.guard``; a request
cancels the task while it is inside one (a command's process group is killed as on a timeout)
and makes every later guard refuse, so the run suspends at its next step. A request that spares
tools lets one already running finish (a replica's graceful shutdown); a later full request
cuts it too. Journal appends are never guarded, so an interruption cannot leave a half-written
journal, and a cut that arrives just as a guarded wait ends is taken inside the guard, never
at the await that follows it.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

from bot.kinds import StopReason


class Interrupted(Exception):
    """The run was told to stop now: it suspends, and whatever was cut short is redone later."""


class Interrupt:
    """A stop request for one run, delivered by cancelling its task inside a guarded wait."""

    def __init__(self) -> None:
        self.requested = False
        # What the run suspends as: a replica that stops hands its runs back to the others.
        self.reason = StopReason.INTERRUPTED
        self._task: asyncio.Task[object] | None = None
        self._in_tool = False
        # The tool whose wait the tool guard holds (set as it enters): what a cut would kill.
        self.tool = ""
        self._cut = False
        # Whether every stop asked so far spares a tool under way (a graceful shutdown, a cancel).
        self._spares = True
        # Made once: a run enters one or two guards per iteration.
        self._guards = (
            _Guard(self, False, False),
            _Guard(self, True, False),
            _Guard(self, True, True),
        )

    def request(self, *, spare_tools: bool = False, hand_back: bool = False) -> None:
        """Cut the current guarded wait short (unless it is a tool being spared); every later
        guard raises ``Interrupted``, so nothing new starts. ``hand_back``: the run suspends
        ``handed_back``, for any replica to go on with, unless a person's stop came first."""
        if not hand_back:
            # A person's pause wins over a stopping replica's, whichever came first: the run
            # waits for that person's resume, not for another replica's sweep.
            self.reason = StopReason.INTERRUPTED
        elif not self.requested:
            self.reason = StopReason.HANDED_BACK
        self.requested = True
        self._spares = self._spares and spare_tools
        if self._task is None or self._cut or (spare_tools and self._in_tool):
            return
        self._cut = True
        self._task.cancel()

    def tool_under_way(self) -> str:
        """The tool a request now would cut short ("" if the run waits on none)."""
        return self.tool if self._task is not None and self._in_tool else ""

    def refuse(self, under_way: bool = False) -> None:
        """Raise ``Interrupted`` once a stop was requested: nothing new starts after it. A call
        ``under_way`` (its dispatch journaled) is let start by a stop that spares tools."""
        if self.requested and not (under_way and self._spares):
            raise Interrupted("the run was interrupted")

    def guard(self, *, tool: bool = False, under_way: bool = False) -> _Guard:
        """A wait that a stop request may cut short (raising ``Interrupted`` instead); a tool's
        ``under_way`` is entered as ``refuse`` lets it."""
        return self._guards[tool + (tool and under_way)]


class _Guard:
    """A guarded wait (a plain class, reused: it runs twice per iteration of every run; one
    task enters it at a time, the run's)."""

    __slots__ = ("_interrupt", "_tool", "_under_way")

    def __init__(self, interrupt: Interrupt, tool: bool, under_way: bool) -> None:
        self._interrupt = interrupt
        self._tool = tool
        self._under_way = under_way

    async def __aenter__(self) -> None:
        interrupt = self._interrupt
        interrupt.refuse(self._under_way)
        interrupt._task = asyncio.current_task()
        interrupt._in_tool = self._tool
        interrupt._cut = False

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        interrupt = self._interrupt
        task, cut = interrupt._task, interrupt._cut
        interrupt._task, interrupt._cut = None, False
        if not cut or task is None:
            return
        if exc_type is not asyncio.CancelledError:
            # The wait ended before the cancellation reached it: take it here, not later.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0)
        task.uncancel()
        raise Interrupted("the run was interrupted") from None
