"""A stored entry is read back by its kind's model: the same entry, and the union's errors."""

from __future__ import annotations

import json

import pytest

from bot import wire
from bot.domain import (
    AssistantTurn,
    Fingerprint,
    Request,
    RequestKind,
    RunStatus,
    StopReason,
    TerminalResult,
    ToolCall,
)
from bot.journal.decode import decode_entry
from bot.journal.entries import (
    AssistantTurnEntry,
    Entry,
    RunEnded,
    RunStarted,
    RunSuspended,
    ToolDeferred,
)

CALL = ToolCall(id="c1", name="restart_service", arguments='{"service": "checkout"}')
PRINT = Fingerprint(provider="scripted", model="m", tools_digest="t", system_prompt_digest="p")
REQUEST = Request(
    run_id="r1", kind=RequestKind.WAIT_APPROVAL, call_id="c1", tool=CALL.name, arguments={"a": 1}
)
ENTRIES: list[Entry] = [
    RunStarted(run_id="r1", session_id="s1", requested_by="bob", fingerprint=PRINT),
    AssistantTurnEntry(turn=AssistantTurn(text="on it", calls=(CALL,)), iteration=0),
    ToolDeferred(call_id="c1", tool=CALL.name, request=REQUEST),
    RunSuspended(reason=StopReason.WAITING, request_ids=(REQUEST.id,)),
    RunEnded(result=TerminalResult(status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED)),
]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry.kind)
def test_an_entry_reads_back_as_it_was_written(entry: Entry) -> None:
    assert decode_entry(wire.to_json(entry)) == entry


def test_an_entry_whose_kind_is_not_first_reads_back_the_same() -> None:
    entry = ENTRIES[1]
    fields = wire.to_plain(entry)
    reordered = json.dumps({**{k: v for k, v in fields.items() if k != "kind"}, "kind": entry.kind})
    assert decode_entry(reordered) == entry


@pytest.mark.parametrize(
    "body",
    [
        '{"kind":"no_such_kind"}',
        '{"kind":"run_suspended","reason":"bogus"}',
        "[1]",
        "{",
        '{"kind":"run_ended","result":{"status":"completed","stop_reason":"answered","payload":'
        + '{"x":'
        + "[" * 100_000
        + "]" * 100_000
        + "}}}",
    ],
    ids=["unknown kind", "bad value", "no object", "not JSON", "nested past any limit"],
)
def test_a_body_that_is_no_entry_is_refused(body: str) -> None:
    with pytest.raises(wire.Unreadable):
        decode_entry(body)


def test_a_kind_from_a_newer_version_is_named_as_such() -> None:
    with pytest.raises(wire.Unreadable) as refused:
        decode_entry('{"kind":"tool_progress","call_id":"c1"}')

    assert str(refused.value) == (
        "its kind 'tool_progress' is not one this Kestrel knows (a newer version wrote it?)"
    )


# Bodies as the pydantic models of 2026-12-04 stored them: journals written before the domain
# became msgspec structs must read back, whole.
PYDANTIC_ERA = [
    '{"kind":"run_started","run_id":"run_1","session_id":"s1","requested_by":"","system_prompt":"","fingerprint":{"provider":"p","model":"m","tools_digest":"t","system_prompt_digest":"d"},"budgets":{"max_iterations":20,"max_tool_calls":50,"max_tokens":200000,"deadline_seconds":0.0,"no_progress_repeats":3},"has_prompter":false,"history":[["user","hi"]],"at":"2026-12-01T09:30:15.123456Z"}',
    '{"kind":"tool_deferred","call_id":"c1","tool":"deploy","request":{"id":"req_1","run_id":"run_1","kind":"wait_approval","call_id":"c1","tool":"deploy","arguments":{"env":"prod","n":[1,2.5]},"digest":"","prompt":"","options":[],"requested_by":"","approvals_needed":1,"origins":[],"steps":[{"tool":"x","arguments":{"a":1},"why":"","digest":"","gated":true,"call_id":"","origins":[]}],"off_plan":"","created_at":"2026-12-01T09:30:15.123456Z","deadline":"2026-12-01T09:30:15.123456Z"}}',
    '{"kind":"tool_result","call_id":"c1","tool":"deploy","outcome":"unknown_tool","output":"oké","is_error":false,"seconds":0.25}',
    '{"kind":"answer_supplied","decision":{"request_id":"req_1","kind":"approve","text":"","by":"alice","at":"2026-12-01T09:30:15.123456Z"}}',
    '{"kind":"run_ended","result":{"status":"completed","stop_reason":"answered","text":"t","payload":{"a":null},"error":"","usage":{"input_tokens":3,"output_tokens":0},"outcomes":{}},"text_is_last_turn":false}',
]


@pytest.mark.parametrize("body", PYDANTIC_ERA, ids=lambda body: json.loads(body)["kind"])
def test_a_body_stored_by_the_pydantic_models_reads_back_whole(body: str) -> None:
    entry = decode_entry(body)
    assert entry.kind == json.loads(body)["kind"]
    assert json.loads(wire.to_json(entry)) == json.loads(body)
