"""The ``ModelProvider`` protocol and the conversation messages it is given."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec
from msgspec.structs import replace

from bot.domain import AssistantTurn, ToolCall
from bot.nesting import loads

# The conversation's messages are frozen and hold text and frozen values only, so they can
# never be part of a reference cycle: kept out of the collector, which a long run's history
# would otherwise fill (as the domain values, bot.domain).


class SystemMessage(msgspec.Struct, frozen=True, gc=False):
    """The run's instructions."""

    text: str


class UserMessage(msgspec.Struct, frozen=True, gc=False):
    """A human message."""

    text: str


class AssistantMessage(msgspec.Struct, frozen=True, gc=False):
    """A model reply already received (text and/or tool calls)."""

    turn: AssistantTurn


class ToolResultItem(msgspec.Struct, frozen=True, gc=False):
    """The answer to one tool call."""

    call_id: str
    name: str
    output: str


class ToolResultsMessage(msgspec.Struct, frozen=True, gc=False):
    """All results of one tool batch, fed back to the model as one message."""

    results: tuple[ToolResultItem, ...]


Message = SystemMessage | UserMessage | AssistantMessage | ToolResultsMessage


class ToolSpec(msgspec.Struct, frozen=True):
    """What the model is told about one tool."""

    name: str
    description: str
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object"})


def unique_call_ids(turn: AssistantTurn, messages: Sequence[Message]) -> AssistantTurn:
    """``turn`` with every call id unique in the run; returns ``turn`` itself if already so.

    A missing id becomes ``call_<n>``, a repeated one ``<id>_<n>`` (the first free ``n``). A
    call repeated within the turn with its id, name and arguments is the same call: kept once.
    """
    # Results, deferrals and one-shot grants are keyed by call id across the whole run, so a
    # repeat within the turn or of an earlier turn's id would answer or authorise the wrong call.
    taken = {call.id for m in messages if isinstance(m, AssistantMessage) for call in m.turn.calls}
    calls: list[ToolCall] = []
    for i, call in enumerate(turn.calls):
        if call.id and any(_same_call(call, earlier) for earlier in turn.calls[:i]):
            continue
        free = _free_id(call.id, taken)
        taken.add(free)
        calls.append(call if free == call.id else replace(call, id=free))
    if len(calls) == len(turn.calls) and all(
        new is old for new, old in zip(calls, turn.calls, strict=True)
    ):
        return turn
    return replace(turn, calls=tuple(calls))


def _same_call(call: ToolCall, other: ToolCall) -> bool:
    """The model sent one call twice: same id, same tool, same arguments (as JSON values)."""
    if (call.id, call.name) != (other.id, other.name):
        return False
    if call.arguments == other.arguments:
        return True
    try:
        return bool(loads(call.arguments) == loads(other.arguments))
    except ValueError:
        return False


def _free_id(wanted: str, taken: set[str]) -> str:
    if wanted and wanted not in taken:
        return wanted
    stem, n = (wanted, 2) if wanted else ("call", 1)
    while f"{stem}_{n}" in taken:
        n += 1
    return f"{stem}_{n}"


class ModelError(Exception):
    """The model call failed (after the provider's own retries); the message names the cause."""


# Told, while a model call goes on, what keeps it waiting (a retry after a rate limit).
Notice = Callable[[str], None]


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
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        timeout: float,
        *,
        notice: Notice | None = None,
    ) -> AssistantTurn:
        """One model call, retries included, within ``timeout`` seconds; ``ModelError`` otherwise.
        ``notice`` hears each wait before a retry, as one line, while people wait on the call.

        Every call id in the returned turn is non-empty and unique in the run (see
        ``unique_call_ids``): the loop keys results and grants by it.
        """
        ...
