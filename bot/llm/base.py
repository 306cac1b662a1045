"""The ``ModelProvider`` protocol and the conversation messages it is given."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bot.domain import AssistantTurn


@dataclass(frozen=True)
class SystemMessage:
    """The run's instructions."""

    text: str


@dataclass(frozen=True)
class UserMessage:
    """A human message."""

    text: str


@dataclass(frozen=True)
class AssistantMessage:
    """A model reply already received (text and/or tool calls)."""

    turn: AssistantTurn


@dataclass(frozen=True)
class ToolResultItem:
    """The answer to one tool call."""

    call_id: str
    name: str
    output: str


@dataclass(frozen=True)
class ToolResultsMessage:
    """All results of one tool batch, fed back to the model as one message."""

    results: tuple[ToolResultItem, ...]


Message = SystemMessage | UserMessage | AssistantMessage | ToolResultsMessage


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about one tool."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})


class ModelError(Exception):
    """The model call failed (after the provider's own retries); the message names the cause."""


class ModelProvider(Protocol):
    """Anything that turns a conversation and a tool list into one assistant turn."""

    @property
    def provider(self) -> str:
        """The provider's kind, e.g. ``openai`` or ``scripted``."""
        ...

    @property
    def model(self) -> str:
        """The model's name."""
        ...

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], timeout: float
    ) -> AssistantTurn:
        """One model call; raises ``ModelError`` on failure or timeout."""
        ...
