"""The scripted model: replies read from a YAML script, picked by the conversation's position."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from operator import countOf
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bot.domain import AssistantTurn, ToolCall, Usage
from bot.llm.base import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolResultsMessage,
    ToolSpec,
    UserMessage,
)

PROVIDER = "scripted"
EXHAUSTED = "(the script has no more replies)"
DEMO_SCRIPT = Path(__file__).resolve().parent.parent / "demo" / "demo.yaml"
_PREVIEW = 200


class ScriptError(ValueError):
    """A script that cannot be read or does not validate; the message names the source and cause."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ScriptCall(_Strict):
    """One tool call a reply makes."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)

    def arguments_text(self) -> str:
        """The arguments as a model sends them: a mapping JSON-dumped, a string as written."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


class ScriptUsage(_Strict):
    """Tokens a reply claims to have cost."""

    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)


class Reply(_Strict):
    """One scripted model reply."""

    text: str | None = None
    calls: tuple[ScriptCall, ...] = ()
    finish_reason: str | None = None
    usage: ScriptUsage | None = None
    expect: str | None = None


class Script(_Strict):
    """A named list of replies, played in conversation order."""

    name: str
    replies: tuple[Reply, ...] = ()

    @functools.cached_property
    def _call_offsets(self) -> tuple[int, ...]:
        offsets, total = [], 0
        for reply in self.replies:
            offsets.append(total)
            total += len(reply.calls)
        return tuple(offsets)

    def calls_before(self, index: int) -> int:
        """How many calls the replies before ``index`` make (call ids number across the script)."""
        return self._call_offsets[index]


def load_script(path: str | Path) -> Script:
    """Read and validate a YAML script; the model name is the file's stem."""
    source = Path(path)
    try:
        raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScriptError(f"{source}: cannot read the script: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ScriptError(f"{source}: not valid YAML: {_one_line(str(exc))}") from exc
    return parse_script(raw, name=source.stem, source=str(source))


def parse_script(raw: object, *, name: str, source: str) -> Script:
    """Validate already-parsed replies into a ``Script``; errors name ``source``."""
    if not isinstance(raw, list):
        kind = "nothing" if raw is None else type(raw).__name__
        raise ScriptError(f"{source}: a script is a list of replies, got {kind}")
    try:
        return Script.model_validate({"name": name, "replies": raw})
    except ValidationError as exc:
        raise ScriptError(f"{source}: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    """Pydantic's errors as one line, reply numbers counted from 1, union branches merged."""
    by_place: dict[str, list[str]] = {}
    for error in exc.errors():
        by_place.setdefault(_place(error["loc"]), []).append(error["msg"])
    return "; ".join(
        f"{place}: {' or '.join(msgs)}" if place else " or ".join(msgs)
        for place, msgs in by_place.items()
    )


def _place(loc: tuple[int | str, ...]) -> str:
    """``("replies", 2, "calls", 0, "name")`` as ``reply 3: calls.0.name``."""
    parts = list(loc)
    reply = ""
    if len(parts) >= 2 and parts[0] == "replies" and isinstance(parts[1], int):
        reply = f"reply {parts[1] + 1}"
        parts = parts[2:]
    # Union branches add their type name to the location; it only confuses a script author.
    path = ".".join(str(p) for p in parts if p not in ("str", "dict[str,any]"))
    return ": ".join(p for p in (reply, path) if p)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def reply_turn(
    script: Script, index: int, *, latest_input: str, prompt_chars: int
) -> AssistantTurn:
    """The turn for the reply at ``index``, checked against the latest input it answers."""
    if index >= len(script.replies):
        return _text_turn(EXHAUSTED, prompt_chars)
    reply = script.replies[index]
    if reply.expect is not None and reply.expect not in latest_input:
        preview = _one_line(latest_input)[:_PREVIEW]
        return _text_turn(
            f"(script mismatch at reply {index + 1}: expected {reply.expect!r} "
            f"in the latest input, got {preview!r})",
            prompt_chars,
        )
    first = 1 + script.calls_before(index)
    calls = tuple(
        ToolCall(id=f"call_{first + k}", name=c.name, arguments=c.arguments_text())
        for k, c in enumerate(reply.calls)
    )
    output_chars = len(reply.text or "") + sum(len(c.name) + len(c.arguments) for c in calls)
    return AssistantTurn(
        text=reply.text,
        calls=calls,
        finish_reason=reply.finish_reason or ("tool_calls" if calls else "stop"),
        usage=_usage(reply.usage) if reply.usage else _estimate(prompt_chars, output_chars),
    )


def _text_turn(text: str, prompt_chars: int) -> AssistantTurn:
    return AssistantTurn(text=text, usage=_estimate(prompt_chars, len(text)))


def _usage(usage: ScriptUsage) -> Usage:
    return Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)


def _estimate(input_chars: int, output_chars: int) -> Usage:
    """About four characters a token, as budgets need a plausible number, not an exact one."""
    return Usage(
        input_tokens=max(1, math.ceil(input_chars / 4)),
        output_tokens=max(1, math.ceil(output_chars / 4)),
    )


def latest_input(messages: Sequence[Message]) -> str:
    """The newest user text or tool results, which a reply's ``expect`` is checked against."""
    for message in reversed(messages):
        if isinstance(message, ToolResultsMessage):
            return "\n".join(r.output for r in message.results)
        if isinstance(message, UserMessage):
            return message.text
    return ""


def prompt_chars(messages: Sequence[Message]) -> int:
    """The conversation's size in characters, for usage estimates."""
    total = 0
    for message in messages:
        if isinstance(message, SystemMessage | UserMessage):
            total += len(message.text)
        elif isinstance(message, AssistantMessage):
            turn = message.turn
            total += len(turn.text or "") + sum(len(c.arguments) for c in turn.calls)
        else:
            total += sum(len(r.output) for r in message.results)
    return total


class ScriptedProvider:
    """A ``ModelProvider`` playing a script, deterministic from the conversation it is given."""

    def __init__(self, script: Script) -> None:
        self._script = script
        # Turns that depend on nothing but their position, built once (they are immutable).
        self._fixed: dict[int, AssistantTurn] = {}

    @classmethod
    def from_replies(
        cls, replies: Sequence[Reply | Mapping[str, Any]], name: str = "inline"
    ) -> ScriptedProvider:
        """A provider over replies given in code (mappings in the YAML format, or ``Reply``)."""
        return cls(parse_script(list(replies), name=name, source=f"<{name}>"))

    @property
    def provider(self) -> str:
        """Always ``scripted``."""
        return PROVIDER

    @property
    def model(self) -> str:
        """The script's name."""
        return self._script.name

    @property
    def script(self) -> Script:
        """The script being played."""
        return self._script

    # The protocol fixes ``timeout``; a script answers at once, so it has nothing to bound.
    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        timeout: float,
    ) -> AssistantTurn:
        """The reply at the conversation's position: one per assistant message already in it."""
        # Counting the conversation, not an in-memory cursor, lets a run resumed in a new
        # process get exactly the reply it would have got before the crash.
        index = countOf(map(type, messages), AssistantMessage)
        replies = self._script.replies
        reply = replies[index] if index < len(replies) else None
        if reply is not None and reply.usage is not None and reply.expect is None:
            return self._fixed_turn(index)
        # Otherwise the turn depends on the conversation: its size (O(n)) or its latest input.
        expects = reply is not None and reply.expect is not None
        return reply_turn(
            self._script,
            index,
            latest_input=latest_input(messages) if expects else "",
            prompt_chars=prompt_chars(messages),
        )

    def _fixed_turn(self, index: int) -> AssistantTurn:
        """The turn of a reply that states its usage and expects nothing: built once."""
        turn = self._fixed.get(index)
        if turn is None:
            turn = self._fixed[index] = reply_turn(
                self._script, index, latest_input="", prompt_chars=0
            )
        return turn
