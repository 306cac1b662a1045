"""Typed events: every kind serialises to JSON in the one place, with its facts."""

from __future__ import annotations

import json
import logging
import typing
from typing import Any

import pytest

from bot.domain import (
    DecisionKind,
    Request,
    RequestKind,
    RunStatus,
    StopReason,
    TerminalResult,
    ToolOutcome,
)
from bot.events import (
    Event,
    LogSink,
    ModelTurnEvent,
    RequestOpenedEvent,
    RunEndedEvent,
    RunResumedEvent,
    RunSuspendedEvent,
    to_json,
)

REQUEST = Request(run_id="run_1", kind=RequestKind.WAIT_APPROVAL, call_id="c1", tool="deploy")
VALUES: dict[Any, Any] = {
    str: "text",
    int: 2,
    float: 0.5,
    bool: True,
    RequestKind | None: RequestKind.WAIT_USER,
    dict[str, Any]: {"unit": "checkout"},
    ToolOutcome: ToolOutcome.TIMEOUT,
    Request: REQUEST,
    DecisionKind: DecisionKind.APPROVE,
    StopReason: StopReason.WAITING,
    tuple[str, ...]: ("req_1",),
    TerminalResult: TerminalResult(status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED),
}


def example(kind: type[Any]) -> Any:
    hints = typing.get_type_hints(kind)
    return kind(**{f: VALUES[hints[f]] for f in kind.__struct_fields__})


def test_every_event_kind_serialises_with_its_kind_first() -> None:
    kinds = typing.get_args(Event)
    assert len({kind.kind for kind in kinds}) == len(kinds)
    for kind in kinds:
        data = to_json(example(kind))
        assert next(iter(data)) == "kind" and data["kind"] == kind.kind
        assert data["run_id"] == "text"
        json.dumps(data)


def test_models_inside_events_become_plain_json() -> None:
    data = to_json(RequestOpenedEvent("run_1", REQUEST))
    assert data["request"]["tool"] == "deploy"
    assert data["request"]["kind"] == "wait_approval"
    assert to_json(ModelTurnEvent("run_1", "hi", 0)) == {
        "kind": "model_turn",
        "run_id": "run_1",
        "text": "hi",
        "calls": 0,
        "seconds": 0.0,
        "input_tokens": 0,
        "output_tokens": 0,
    }


def test_a_run_the_model_failed_is_a_warning_and_other_ends_are_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A model that refuses the key (401), a quota used up, a model name it does not know:
    # every run failed, the people in the thread were told, and at serve's default level
    # (warning) the operator's log said nothing of it.
    error = "model call failed: 401 from http://model/v1: Incorrect API key provided"
    failed = TerminalResult(
        status=RunStatus.FAILED, stop_reason=StopReason.MODEL_ERROR, error=error
    )
    answered = TerminalResult(status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED)
    caplog.set_level(logging.WARNING, logger="kestrel.events")
    LogSink().emit(RunEndedEvent("run_1", answered))
    LogSink().emit(RunEndedEvent("run_2", failed))
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == f"run run_2 failed (model_error): {error}"


def test_a_run_s_course_is_one_info_line_each_naming_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What on-call reads at the chart's level (info): which run waits on what, and why it
    # stopped; the model's turns and the tools' exits stay at debug (many to a run).
    caplog.set_level(logging.INFO, logger="kestrel.events")
    sink = LogSink()
    sink.emit(RunResumedEvent("run_1", orphaned=True))
    sink.emit(ModelTurnEvent("run_1", "thinking", calls=1))
    sink.emit(RequestOpenedEvent("run_1", REQUEST))
    sink.emit(RunSuspendedEvent("run_1", StopReason.WAITING, (REQUEST.id,)))
    sink.emit(RunSuspendedEvent("run_1", StopReason.HANDED_BACK, ()))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "run run_1 adopted (its replica stopped renewing its lease)"),
        (logging.INFO, f"run run_1 waits: wait_approval {REQUEST.id} for deploy"),
        (logging.INFO, f"run run_1 suspended (waiting), waiting on {REQUEST.id}"),
        (logging.INFO, "run run_1 suspended (handed_back)"),
    ]
