"""The ``Prompter`` protocol: someone present who can be asked."""

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
