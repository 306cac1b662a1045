"""Stopping a run now (shutdown, Ctrl-C, SIGTERM): its model call, prompt or tool, never a write.

The run's task marks the waits that may be cut short with ``Interrupt.guard``; a request cuts
the current one at once (a command's process group is killed as on a timeout) and makes every
later guard refuse, so the run suspends at its next step. A request that spares tools lets one
already running finish (a replica's graceful shutdown); a later full request cuts it too.
Journal appends are never guarded, so an interruption cannot leave a half-written journal.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Interrupted(Exception):
    """The run was told to stop now: it suspends, and whatever was cut short is redone later."""


class Interrupt:
    """A stop request for one run, delivered through the timeout scope of the wait under way."""

    def __init__(self) -> None:
        self.requested = False
        self._scope: asyncio.Timeout | None = None
        self._scope_is_tool = False

    def request(self, *, spare_tools: bool = False) -> None:
        """Cut the current guarded wait short (unless it is a tool being spared); every
        later guard raises ``Interrupted``, so nothing new starts."""
        self.requested = True
        scope = self._scope
        if scope is None or scope.expired() or (spare_tools and self._scope_is_tool):
            return
        scope.reschedule(asyncio.get_running_loop().time())

    @asynccontextmanager
    async def guard(self, *, tool: bool = False) -> AsyncIterator[None]:
        """A wait that a stop request may cut short (raising ``Interrupted`` instead)."""
        if self.requested:
            raise Interrupted("the run was interrupted")
        try:
            async with asyncio.timeout(None) as scope:
                self._scope, self._scope_is_tool = scope, tool
                try:
                    yield
                finally:
                    self._scope = None
        except TimeoutError:
            if self.requested:
                raise Interrupted("the run was interrupted") from None
            raise
