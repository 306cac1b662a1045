"""The model of a command that calls none (``kestrel runs cancel``): built without a key."""

from __future__ import annotations

from collections.abc import Sequence

from bot.domain import AssistantTurn
from bot.llm.base import Message, ModelError, Notice, ToolSpec


class UncalledModel:
    """Named as configured, so that nothing the command writes differs; never asked."""

    def __init__(self, provider: str, model: str) -> None:
        self._provider = provider
        self._model = model

    @property
    def provider(self) -> str:
        """The configured provider's kind."""
        return self._provider

    @property
    def model(self) -> str:
        """The configured model's name."""
        return self._model

    async def complete(
        self,
        messages: Sequence[Message],  # noqa: ARG002
        tools: Sequence[ToolSpec],  # noqa: ARG002
        timeout: float,  # noqa: ARG002
        *,
        notice: Notice | None = None,  # noqa: ARG002
    ) -> AssistantTurn:
        """Refuse: this command was built to call no model."""
        raise ModelError("this command calls no model")
