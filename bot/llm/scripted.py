"""The scripted model: replies read from a YAML script, picked by the conversation's position.

A position holds one reply, or (``one_of``) alternatives of which the first whose expectation
the latest input meets is played: enough for a script to follow every path a run can take.
"""

# No ``from __future__ import annotations``: msgspec would evaluate the script structs'
# annotation text when it first converts one (half a millisecond of a fresh process).

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import msgspec

from bot import wire
from bot.domain import AssistantTurn, ToolCall, Usage
from bot.llm.base import (
    AssistantMessage,
    Message,
    ModelError,
    Notice,
    SystemMessage,
    ToolResultsMessage,
    ToolSpec,
    UserMessage,
)
from bot.text import flattened, not_utf8

PROVIDER = "scripted"
EXHAUSTED = "(the script has no more replies)"
_PREVIEW = 200


class ScriptError(ValueError):
    """A script that cannot be read or does not validate; the message names the source and cause."""


class ScriptMismatch(ModelError):
    """The conversation left the script: no reply at this position expects its latest input."""


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the script format: immutable, built by keyword, no unknown fields when read.

    msgspec structs, not pydantic models: a bench or a test gives its replies in code, and
    their process should not import pydantic (some 8 MiB) only to check them.
    """


class ScriptCall(_Strict, frozen=True, kw_only=True):
    """One tool call a reply makes."""

    name: Annotated[str, msgspec.Meta(min_length=1)]
    arguments: dict[str, Any] | str = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        # YAML reads an unquoted 2024-01-01 as a date, which no model could send.
        if isinstance(self.arguments, dict):
            try:
                json.dumps(self.arguments, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"arguments must be JSON ({exc}): quote a date or a time to send it as text"
                ) from None

    def arguments_text(self) -> str:
        """The arguments as a model sends them: a mapping JSON-dumped, a string as written."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


class ScriptUsage(_Strict, frozen=True, kw_only=True):
    """Tokens a reply claims to have cost."""

    input_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0
    output_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0


class Reply(_Strict, frozen=True, kw_only=True):
    """One scripted model reply; ``expect`` (a substring) and ``match`` (a regex) guard it."""

    text: str | None = None
    calls: tuple[ScriptCall, ...] = ()
    finish_reason: str | None = None
    usage: ScriptUsage | None = None
    expect: str | None = None
    match: str | None = None

    def __post_init__(self) -> None:
        if self.match is None:
            return
        try:
            re.compile(self.match)
        except re.error as exc:
            # msgspec places the error at the reply, not the field: the message names it.
            raise ValueError(f"match: not a valid regular expression: {exc}") from None

    @property
    def guarded(self) -> bool:
        """Whether the reply depends on the latest input."""
        return self.expect is not None or self.match is not None

    def accepts(self, latest: str) -> dict[str, str] | None:
        """The ``match`` groups (empty without one) when ``latest`` meets the guards; else None."""
        if self.expect is not None and self.expect not in latest:
            return None
        if self.match is None:
            return {}
        found = re.search(self.match, latest)
        if found is None:
            return None
        return {name: value or "" for name, value in found.groupdict().items()}

    def expectation(self) -> str:
        """The guards as a script author wrote them, for a mismatch message."""
        guards = [repr(self.expect)] if self.expect is not None else []
        guards += [f"/{self.match}/"] if self.match is not None else []
        return " and ".join(guards) or "anything"


class Choice(_Strict, frozen=True, kw_only=True):
    """Alternative replies at one position: the first whose guards the latest input meets."""

    one_of: Annotated[tuple[Reply, ...], msgspec.Meta(min_length=1)]

    def pick(self, latest: str) -> tuple[Reply, dict[str, str]] | None:
        """The first alternative accepting ``latest``, with its match groups."""
        for reply in self.one_of:
            groups = reply.accepts(latest)
            if groups is not None:
                return reply, groups
        return None

    def expectation(self) -> str:
        """Every alternative's guards, for a mismatch message."""
        return " or ".join(reply.expectation() for reply in self.one_of)


Step = Reply | Choice


# ``dict``: a place for the cached call offsets (a struct has no ``__dict__`` otherwise).
class Script(_Strict, frozen=True, kw_only=True, dict=True):
    """A named list of positions (replies or choices), played in conversation order."""

    name: str
    replies: tuple[Step, ...] = ()

    @functools.cached_property
    def _call_offsets(self) -> tuple[int, ...]:
        offsets, total = [], 0
        for step in self.replies:
            offsets.append(total)
            # Every alternative of a position numbers from the same offset: ids stay unique
            # on whichever path the run takes.
            options = step.one_of if isinstance(step, Choice) else (step,)
            total += max(len(reply.calls) for reply in options)
        return tuple(offsets)

    def calls_before(self, index: int) -> int:
        """How many call ids the positions before ``index`` use (ids number across the script)."""
        return self._call_offsets[index]


def load_script(path: str | Path) -> Script:
    """Read and validate a YAML script; the model name is the file's stem."""
    from bot.yamldoc import NotYaml, safe_load  # here: a script given as replies needs no parser

    source = Path(path)
    try:
        raw = safe_load(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScriptError(f"{source}: cannot read the script: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:  # as kestrel.yaml's: one line, not a traceback
        raise ScriptError(f"{source}: {not_utf8(exc)}") from exc
    except NotYaml as exc:
        raise ScriptError(exc.located(source)) from exc
    except RecursionError as exc:
        raise ScriptError(f"{source}: nested too deeply to be a script") from exc
    return parse_script(raw, name=source.stem, source=str(source))


def parse_script(raw: object, *, name: str, source: str) -> Script:
    """Validate already-parsed replies into a ``Script``; errors name ``source``."""
    if not isinstance(raw, list):
        kind = "nothing" if raw is None else type(raw).__name__
        raise ScriptError(f"{source}: a script is a list of replies, got {kind}")
    steps = []
    for number, position in enumerate(raw, start=1):
        try:
            steps.append(msgspec.convert(position, _step_kind(position)))
        except msgspec.ValidationError as exc:
            raise ScriptError(f"{source}: reply {number}: {_describe(exc)}") from None
    return Script(name=name, replies=tuple(steps))


def _step_kind(raw: object) -> type[Step]:
    """Which struct a position converts to: a mapping with ``one_of`` is a choice.

    Dispatched here, as msgspec takes a union of structs only when they carry a tag.
    """
    if isinstance(raw, Choice) or (isinstance(raw, Mapping) and "one_of" in raw):
        return Choice
    return Reply


def _describe(exc: msgspec.ValidationError) -> str:
    """msgspec's ``cause - at `$.calls[0]``` as ``calls.0: cause``."""
    place, cause = wire.problem(exc)
    return f"{place}: {cause}" if place else cause


def reply_turn(
    script: Script, index: int, *, latest_input: str, prompt_chars: int
) -> AssistantTurn:
    """The turn for the position ``index``, chosen by the latest input it answers.

    Raises ``ScriptMismatch`` when no reply there expects that input: the run then fails with
    a model error naming the script and the position, instead of completing with a made-up text.
    """
    if index >= len(script.replies):
        return _text_turn(EXHAUSTED, prompt_chars)
    step = script.replies[index]
    picked = step.pick(latest_input) if isinstance(step, Choice) else _single(step, latest_input)
    if picked is None:
        preview = flattened(latest_input)[:_PREVIEW]
        raise ScriptMismatch(
            f"script {script.name!r} left its path at reply {index + 1}: expected "
            f"{step.expectation()} in the latest input, got {preview!r}"
        )
    reply, groups = picked
    first = 1 + script.calls_before(index)
    calls = tuple(
        ToolCall(id=f"call_{first + k}", name=c.name, arguments=c.arguments_text())
        for k, c in enumerate(reply.calls)
    )
    text = _fill(reply.text, groups)
    output_chars = len(text or "") + sum(len(c.name) + len(c.arguments) for c in calls)
    return AssistantTurn(
        text=text,
        calls=calls,
        finish_reason=reply.finish_reason or ("tool_calls" if calls else "stop"),
        usage=_usage(reply.usage) if reply.usage else _estimate(prompt_chars, output_chars),
    )


def _single(reply: Reply, latest: str) -> tuple[Reply, dict[str, str]] | None:
    groups = reply.accepts(latest)
    return None if groups is None else (reply, groups)


def _fill(text: str | None, groups: Mapping[str, str]) -> str | None:
    """``text`` with each ``{group}`` of the reply's ``match`` replaced by what it matched."""
    if text is None:
        return None
    for name, value in groups.items():
        text = text.replace(f"{{{name}}}", value.strip())
    return text


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


def position(messages: Sequence[Message]) -> int:
    """The assistant turns since the run's own user message: the index of the next reply.

    Earlier turns of a chat session come first as history; a run's script starts after them.
    """
    count = 0
    for message in reversed(messages):
        if isinstance(message, UserMessage):
            break
        count += isinstance(message, AssistantMessage)
    return count


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
        cls, replies: Sequence[Reply | Choice | Mapping[str, Any]], name: str = "inline"
    ) -> "ScriptedProvider":
        """A provider over replies given in code (mappings in the YAML format, or structs)."""
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
        tools: Sequence[ToolSpec],  # noqa: ARG002
        timeout: float,  # noqa: ARG002
        *,
        notice: Notice | None = None,  # noqa: ARG002 - a script never waits
    ) -> AssistantTurn:
        """The reply at the conversation's position: one per assistant message of this run."""
        # Counting the conversation, not an in-memory cursor, lets a run resumed in a new
        # process get exactly the reply it would have got before the crash.
        index = position(messages)
        replies = self._script.replies
        step = replies[index] if index < len(replies) else None
        if isinstance(step, Reply) and step.usage is not None and not step.guarded:
            return self._fixed_turn(index)
        # Otherwise the turn depends on the conversation: its size (O(n)) or its latest input.
        guarded = isinstance(step, Choice) or (step is not None and step.guarded)
        return reply_turn(
            self._script,
            index,
            latest_input=latest_input(messages) if guarded else "",
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
