"""Typed events: what happened in a run, for adapters to render and logs to record.

Each event is a small frozen msgspec struct, made in C (as frozen dataclasses, the sixteen
cost every process that drives a run some 4 ms to define); ``Event`` is their union, so a
sink that matches on the type and ends with ``assert_never`` is told by mypy when it forgets
a case. ``to_json`` is the one place an event becomes JSON (logs, OpenTelemetry).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar, ParamSpec, Protocol

import msgspec

from bot import wire
from bot.domain import (
    DecisionKind,
    Request,
    RequestKind,
    StopReason,
    TerminalResult,
    ToolOutcome,
)

log = logging.getLogger("kestrel.events")

_P = ParamSpec("_P")


class RunStartedEvent(msgspec.Struct, frozen=True):
    """A turn started a run."""

    kind: ClassVar[str] = "run_started"
    run_id: str
    requested_by: str


class RunResumedEvent(msgspec.Struct, frozen=True):
    """A suspended or orphaned run goes on in this process (``orphaned``: it was left
    running by an owner that died, and this process adopted it)."""

    kind: ClassVar[str] = "run_resumed"
    run_id: str
    orphaned: bool = False


class ModelTurnEvent(msgspec.Struct, frozen=True):
    """The model answered: its text (without the calls it wrote as text), how many tool calls
    it asked for, how long the call took (seconds) and the tokens it spent."""

    kind: ClassVar[str] = "model_turn"
    run_id: str
    text: str
    calls: int
    seconds: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0


class ToolStartedEvent(msgspec.Struct, frozen=True):
    """A call passed every check and its tool runs now."""

    kind: ClassVar[str] = "tool_started"
    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]


class ToolExitEvent(msgspec.Struct, frozen=True):
    """A call left executeTool through one of its exits, ``seconds`` after it entered, with
    the ``output`` the model reads (as journaled: redacted where the PII guard redacts)."""

    kind: ClassVar[str] = "tool_exit"
    run_id: str
    call_id: str
    tool: str
    outcome: ToolOutcome
    seconds: float = 0.0
    output: str = ""


class AdvisoryEvent(msgspec.Struct, frozen=True):
    """Something the operator should know that the model is not told (``source``: who says)."""

    kind: ClassVar[str] = "advisory"
    run_id: str
    text: str
    source: str = ""


class RequestOpenedEvent(msgspec.Struct, frozen=True):
    """The run waits on a request: an approval, a question or an uncertain effect."""

    kind: ClassVar[str] = "request_opened"
    run_id: str
    request: Request


class AnswerSuppliedEvent(msgspec.Struct, frozen=True):
    """A decision reached the run through ``Decisions`` and was journaled; the request's
    kind, and how long (seconds) it stood open until decided, when known."""

    kind: ClassVar[str] = "answer_supplied"
    run_id: str
    request_id: str
    decision: DecisionKind
    request_kind: RequestKind | None = None
    waited: float = 0.0


class RequestDecidedEvent(msgspec.Struct, frozen=True):
    """A decision on a request was written and is durable (one approval of several, too):
    every platform's card of it shows it from this one event."""

    kind: ClassVar[str] = "request_decided"
    run_id: str
    request_id: str
    decision: DecisionKind


class RequestReminderEvent(msgspec.Struct, frozen=True):
    """A request's deadline is near and nobody has answered."""

    kind: ClassVar[str] = "request_reminder"
    run_id: str
    request: Request


class RequestExpiredEvent(msgspec.Struct, frozen=True):
    """A request's deadline passed: it is closed as expired."""

    kind: ClassVar[str] = "request_expired"
    run_id: str
    request_id: str


class RunSuspendedEvent(msgspec.Struct, frozen=True):
    """The run's task ended with the run waiting (on requests, or to go on elsewhere)."""

    kind: ClassVar[str] = "run_suspended"
    run_id: str
    reason: StopReason
    request_ids: tuple[str, ...]  # the requests open as it suspended, whatever stopped it
    # The effects started with no result as it suspended: commands the stop killed, whose
    # outcome on-call is asked to settle when the run goes on.
    uncertain: tuple[str, ...] = ()


class RunEndedEvent(msgspec.Struct, frozen=True):
    """The run's terminal result was journaled."""

    kind: ClassVar[str] = "run_ended"
    run_id: str
    result: TerminalResult


class RunTakenOverEvent(msgspec.Struct, frozen=True):
    """Another owner claimed the run: this process stopped driving it."""

    kind: ClassVar[str] = "run_taken_over"
    run_id: str
    detail: str


class JournalFailedEvent(msgspec.Struct, frozen=True):
    """The journal could not be written: the task stopped; the run resumes from what is durable."""

    kind: ClassVar[str] = "journal_failed"
    run_id: str
    error: str


class PanicEvent(msgspec.Struct, frozen=True):
    """An internal error escaped the run; the run ended failed."""

    kind: ClassVar[str] = "panic"
    run_id: str
    traceback: str


Event = (
    RunStartedEvent
    | RunResumedEvent
    | ModelTurnEvent
    | ToolStartedEvent
    | ToolExitEvent
    | AdvisoryEvent
    | RequestOpenedEvent
    | AnswerSuppliedEvent
    | RequestDecidedEvent
    | RequestReminderEvent
    | RequestExpiredEvent
    | RunSuspendedEvent
    | RunEndedEvent
    | RunTakenOverEvent
    | JournalFailedEvent
    | PanicEvent
)


def to_json(event: Event) -> dict[str, Any]:
    """The event as a JSON-ready dict, ``kind`` first."""
    data: dict[str, Any] = {"kind": event.kind}
    for name in event.__struct_fields__:
        value = getattr(event, name)
        data[name] = wire.to_plain(value) if isinstance(value, msgspec.Struct) else value
    return data


class EventSink(Protocol):
    """Receives events; must not block the run's task."""

    def emit(self, event: Event) -> None:
        """Deliver one event."""
        ...


class LogSink:
    """An event sink that writes each event to the ``kestrel.events`` logger."""

    def emit(self, event: Event) -> None:
        """Log the event at debug level, as JSON-ready data; a run's course (started, waiting,
        suspended, ended) also at info, which the chart and the unit log at: an operator saw
        no run in the log otherwise; a run the model failed as a warning, which the operator
        must hear of (a key refused, a quota used up)."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s", to_json(event))
        if isinstance(event, RunEndedEvent) and event.result.stop_reason is StopReason.MODEL_ERROR:
            result = event.result
            log.warning(
                "run %s %s (%s): %s", event.run_id, result.status, result.stop_reason, result.error
            )
        elif log.isEnabledFor(logging.INFO) and (said := _course(event)):
            log.info("%s", said)


def _course(event: Event) -> str:
    """What ``event`` says of the run's course, in one line naming the run; "" for the rest
    (a model turn, a tool's start and exit: debug alone, they come many to a run)."""
    match event:
        case RunStartedEvent(run_id=run_id, requested_by=who):
            return f"run {run_id} started, requested by {who}"
        case RunResumedEvent(run_id=run_id, orphaned=orphaned):
            how = "adopted (its replica stopped renewing its lease)" if orphaned else "resumed"
            return f"run {run_id} {how}"
        case RequestOpenedEvent(run_id=run_id, request=request):
            return f"run {run_id} waits: {request.kind} {request.id} for {request.tool}"
        case RunSuspendedEvent(run_id=run_id, reason=reason, request_ids=ids):
            waiting = f", waiting on {', '.join(ids)}" if ids else ""
            return f"run {run_id} suspended ({reason}){waiting}"
        case RunEndedEvent(run_id=run_id, result=result):
            return f"run {run_id} {result.status} ({result.stop_reason})"
    return ""


class FanOut:
    """Delivers each event to several sinks; a failing sink cannot stop the others or the run."""

    def __init__(self, *sinks: EventSink) -> None:
        self._sinks = list(sinks)

    def add(self, sink: EventSink) -> None:
        """Subscribe one more sink."""
        self._sinks.append(sink)

    def announce(self, kind: Callable[_P, Event], /, *args: _P.args, **kwargs: _P.kwargs) -> None:
        """Build an event of ``kind`` and deliver it, only if some sink listens: the loop says
        a few things every iteration, and a run with nobody listening need not build them."""
        if self._sinks:
            self.emit(kind(*args, **kwargs))

    def emit(self, event: Event) -> None:
        """Deliver to every sink, logging (not raising) a sink's failure."""
        for sink in self._sinks:
            try:
                sink.emit(event)
            except Exception:
                log.exception("event sink %r failed on %s", sink, event.kind)
