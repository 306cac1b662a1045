"""The ``Prompter`` protocol (someone present who can be asked) and the deferring prompter."""

from __future__ import annotations

from typing import Protocol

from bot.domain import Decision, Request


class Prompter(Protocol):
    """A live chat channel or the console; scheduled and headless runs have none."""

    @property
    def present(self) -> bool:
        """Whether someone can be asked right now."""
        ...

    async def ask(self, request: Request) -> Decision | None:
        """Answer now, or return None to defer (the run then suspends on the request)."""
        ...


class DeferringPrompter:
    """Someone can be asked, but not now: every question becomes a request and the run suspends.

    Chat threads and ``kestrel run --defer`` use it: people answer later, from anywhere.
    """

    @property
    def present(self) -> bool:
        """People will see the request (in the thread, or in ``kestrel runs pending``)."""
        return True

    async def ask(self, request: Request) -> Decision | None:  # noqa: ARG002
        """Always defer; adapters render the request from the event that opened it."""
        return None
