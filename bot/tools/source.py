"""``ToolSource``: the current tool set, replaced whole, and the advisories about its changes."""

from __future__ import annotations

from bot.tools.toolset import ToolSet


class ToolSource:
    """Holds the current immutable tool set, replaced whole, and the advisories about changes."""

    def __init__(self, tools: ToolSet) -> None:
        self._tools = tools
        self._advisories: list[str] = []

    def current(self) -> ToolSet:
        """The whole set as it is now; a caller keeps its snapshot for a model call and batch."""
        return self._tools

    def replace(self, tools: ToolSet, advisory: str = "") -> None:
        """Swap the whole set; the advisory reaches the loop with the next model call."""
        self._tools = tools
        if advisory:
            self._advisories.append(advisory)

    def drain(self) -> list[str]:
        """Take the queued advisories."""
        drained, self._advisories = self._advisories, []
        return drained
