"""The ``ModelProvider`` protocol and the conversation messages it is given."""

from __future__ import annotations

import json
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
    Linear in the calls: a looping model can send thousands in one reply.
    """
    # Results, deferrals and one-shot grants are keyed by call id across the whole run, so a
    # repeat within the turn or of an earlier turn's id would answer or authorise the wrong call.
    taken = {call.id for m in messages if isinstance(m, AssistantMessage) for call in m.turn.calls}
    seen = _SentCalls()
    numbered: dict[str, int] = {}
    calls: list[ToolCall] = []
    for call in turn.calls:
        if call.id and seen.again(call):
            continue
        free = _free_id(call.id, taken, numbered)
        taken.add(free)
        calls.append(call if free == call.id else replace(call, id=free))
    if len(calls) == len(turn.calls) and all(
        new is old for new, old in zip(calls, turn.calls, strict=True)
    ):
        return turn
    return replace(turn, calls=tuple(calls))


class _SentCalls:
    """The calls of one reply so far, to know one sent again: same id, same tool, same
    arguments (as JSON values, whatever the order of their keys)."""

    def __init__(self) -> None:
        # The first call's raw arguments per (id, name); their JSON values' canonical texts
        # are made only once a second call has that id and name (most replies have none).
        self._first: dict[tuple[str, str], str] = {}
        self._values: dict[tuple[str, str], set[str]] = {}

    def again(self, call: ToolCall) -> bool:
        """Whether ``call`` was sent before in this reply (it is remembered if not)."""
        pair = (call.id, call.name)
        first = self._first.get(pair)
        if first is None:
            self._first[pair] = call.arguments
            return False
        values = self._values.get(pair)
        if values is None:
            values = self._values[pair] = {_canonical(first)}
        value = _canonical(call.arguments)
        if value in values:
            return True
        values.add(value)
        return False


def _canonical(arguments: str) -> str:
    """The arguments' JSON value as one text (keys sorted); text that is no JSON (or nested
    past the decoder) stands for itself, marked so no JSON value's text can equal it."""
    try:
        return json.dumps(loads(arguments), sort_keys=True)
    except (ValueError, RecursionError):
        return "\0" + arguments


def _free_id(wanted: str, taken: set[str], numbered: dict[str, int]) -> str:
    """``wanted`` if free, else ``<wanted>_<n>`` (``call_<n>`` without one), the first free
    ``n`` after the last this reply gave the stem (``taken`` only grows, so none below is)."""
    if wanted and wanted not in taken:
        return wanted
    stem = wanted or "call"
    n = numbered.get(stem, 2 if wanted else 1)
    while f"{stem}_{n}" in taken:
        n += 1
    numbered[stem] = n + 1
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
