"""Prompters that need no terminal: the deferring one of chat and ``run --defer``."""

from __future__ import annotations

from bot.domain import Decision, Request


class DeferringPrompter:
    """Someone can be asked, but not now: every question becomes a request and the run suspends."""

    @property
    def present(self) -> bool:
        """People will see the request (in the thread, or in ``kestrel runs pending``)."""
        return True

    async def ask(self, request: Request) -> Decision | None:
        """Always defer; adapters render the request from the ``request_opened`` event."""
        return None
