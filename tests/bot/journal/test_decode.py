"""A stored entry is read back by its kind's model: the same entry, and the union's errors."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

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
    assert decode_entry(entry.model_dump_json()) == entry


def test_an_entry_whose_kind_is_not_first_reads_back_the_same() -> None:
    entry = ENTRIES[1]
    fields = entry.model_dump(mode="json")
    reordered = json.dumps({**{k: v for k, v in fields.items() if k != "kind"}, "kind": entry.kind})
    assert decode_entry(reordered) == entry


@pytest.mark.parametrize(
    "body",
    ['{"kind":"no_such_kind"}', '{"kind":"run_suspended","reason":"bogus"}', "[1]", "{"],
)
def test_a_body_that_is_no_entry_is_refused(body: str) -> None:
    with pytest.raises(ValidationError):
        decode_entry(body)
