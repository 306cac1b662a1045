"""``fold`` on hand-made journals: no store, no loop, just records in and a ``RunState`` out."""

from __future__ import annotations

from typing import get_args

import pytest
from msgspec.structs import replace

from bot import wire
from bot.domain import (
    AssistantTurn,
    Decision,
    DecisionKind,
    Fingerprint,
    Grant,
    GrantKind,
    ProcessStamp,
    Request,
    RequestKind,
    RunStatus,
    StopReason,
    TerminalResult,
    ToolCall,
    ToolOutcome,
    Usage,
)
from bot.journal.entries import (
    AdvisoryEntry,
    AnswerSupplied,
    AssistantTurnEntry,
    Entry,
    GrantWritten,
    RunEnded,
    RunResumed,
    RunStarted,
    RunSuspended,
    ToolDeferred,
    ToolDispatched,
    ToolProcess,
    ToolResultEntry,
    UserMessageEntry,
)
from bot.journal.fold import RunState, apply, call_signature, fold
from bot.journal.log import JournalRecord
from bot.llm.base import (
    AssistantMessage,
    SystemMessage,
    ToolResultItem,
    ToolResultsMessage,
    UserMessage,
)

RUN = "run_1"
FINGERPRINT = Fingerprint(
    provider="scripted", model="m", tools_digest="t", system_prompt_digest="s"
)
STAMP = ProcessStamp(host="h1", host_key="k1", pgid=4242, start_ticks=99)


def records(*entries: Entry, run_id: str = RUN, epoch: int = 1) -> list[JournalRecord]:
    """Entries as the store would load them: consecutive seqs from 0."""
    return [
        JournalRecord(run_id=run_id, seq=seq, epoch=epoch, entry=entry)
        for seq, entry in enumerate(entries)
    ]


def folded(*entries: Entry) -> RunState:
    return fold(records(*entries), RUN)


def started(**changes: object) -> RunStarted:
    fields: dict[str, object] = {"run_id": RUN, "session_id": "ses_1", "fingerprint": FINGERPRINT}
    return wire.from_plain(fields | changes, RunStarted)


def turn(iteration: int, *calls: ToolCall, text: str | None = None, **usage: int) -> Entry:
    reply = AssistantTurn(text=text, calls=calls, usage=Usage(**usage))
    return AssistantTurnEntry(iteration=iteration, turn=reply)


def call(call_id: str, name: str = "restart", arguments: str = '{"svc": "web"}') -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def result(
    call_id: str, output: str = "ok", outcome: ToolOutcome = ToolOutcome.OK, tool: str = "restart"
) -> Entry:
    return ToolResultEntry(call_id=call_id, tool=tool, outcome=outcome, output=output)


def request(
    call_id: str, request_id: str = "", kind: RequestKind = RequestKind.WAIT_APPROVAL
) -> Request:
    made = Request(run_id=RUN, kind=kind, call_id=call_id, tool="restart")
    return replace(made, id=request_id) if request_id else made


def deferred(call_id: str, request_id: str = "") -> Entry:
    return ToolDeferred(call_id=call_id, tool="restart", request=request(call_id, request_id))


def dispatched(call_id: str) -> Entry:
    return ToolDispatched(call_id=call_id, tool="restart")


def ended(status: RunStatus = RunStatus.COMPLETED, text: str = "", **changes: object) -> RunEnded:
    reason = StopReason.ANSWERED if status is RunStatus.COMPLETED else StopReason.CANCELLED
    fields: dict[str, object] = {"status": status, "stop_reason": reason, "text": text}
    return RunEnded(result=wire.from_plain(fields | changes, TerminalResult))


def approve(request_id: str, by: str = "ann") -> Entry:
    return AnswerSupplied(
        decision=Decision(request_id=request_id, kind=DecisionKind.APPROVE, by=by)
    )


# -- identity and position ----------------------------------------------------------------------


def test_an_empty_journal_folds_to_a_fresh_running_state() -> None:
    state = fold([], "run_x")

    assert (state.run_id, state.started, state.next_seq) == ("run_x", None, 0)
    assert (state.status, state.result, state.iteration, state.tool_calls) == (
        RunStatus.RUNNING,
        None,
        0,
        0,
    )
    assert state.messages == [] and state.batch == [] and not state.open_batch
    assert state.outcomes() == {}


def test_the_run_id_and_next_seq_come_from_the_records() -> None:
    state = fold(records(UserMessageEntry(text="hi"), AdvisoryEntry(text="a"), run_id="run_r"))

    assert state.run_id == "run_r"
    assert state.next_seq == 2


def test_next_seq_follows_the_last_record_even_after_a_gap() -> None:
    gapped = [
        JournalRecord(run_id=RUN, seq=0, epoch=1, entry=UserMessageEntry(text="a")),
        JournalRecord(run_id=RUN, seq=7, epoch=2, entry=UserMessageEntry(text="b")),
    ]

    assert fold(gapped).next_seq == 8


# -- messages -----------------------------------------------------------------------------------


def test_run_started_opens_the_conversation_with_prompt_and_history() -> None:
    entry = started(system_prompt="be brief", history=(("user", "earlier"), ("assistant", "ok")))

    state = folded(entry, UserMessageEntry(text="restart web", by="ann"))

    assert state.started == entry
    assert state.messages == [
        SystemMessage("be brief"),
        UserMessage("earlier"),
        AssistantMessage(AssistantTurn(text="ok")),
        UserMessage("restart web"),
    ]


def test_no_system_message_without_a_system_prompt() -> None:
    state = folded(started(), UserMessageEntry(text="hi"))

    assert state.messages == [UserMessage("hi")]


def test_a_batch_becomes_one_results_message_once_every_call_is_answered() -> None:
    a, b = call("c1"), call("c2", name="status", arguments="{}")
    reply = AssistantTurn(text="on it", calls=(a, b))
    entries: list[Entry] = [
        started(),
        UserMessageEntry(text="restart web"),
        AssistantTurnEntry(iteration=0, turn=reply),
        result("c2", "up", tool="status"),
    ]

    half = folded(*entries)
    whole = folded(*entries, result("c1", "restarted"))

    assert half.open_batch and half.messages[-1] == AssistantMessage(reply)
    assert not whole.open_batch
    assert whole.messages[-1] == ToolResultsMessage(
        (ToolResultItem("c1", "restart", "restarted"), ToolResultItem("c2", "status", "up"))
    )
    assert len(whole.messages) == 3


def test_a_second_result_for_a_call_is_ignored() -> None:
    state = folded(turn(0, call("c1")), result("c1", "first"), result("c1", "second"))

    assert state.batch[0].result is not None and state.batch[0].result.output == "first"
    assert state.tool_calls == 1
    assert state.outcomes() == {"ok": 1}
    assert sum(isinstance(m, ToolResultsMessage) for m in state.messages) == 1


def test_entries_for_calls_outside_the_batch_change_nothing() -> None:
    state = folded(
        turn(0, call("c1")),
        dispatched("zz"),
        ToolProcess(call_id="zz", process=STAMP),
        deferred("zz"),
        result("zz"),
    )

    (only,) = state.batch
    assert (only.result, only.deferred, only.dispatched, only.process) == (None, None, False, None)
    assert (state.tool_calls, state.outcomes()) == (0, {})


# -- iteration, usage, signatures ---------------------------------------------------------------


def test_iteration_usage_and_the_batch_follow_the_latest_turn() -> None:
    state = folded(
        turn(0, call("c1"), input_tokens=10, output_tokens=2),
        result("c1"),
        turn(1, call("c2"), call("c3"), input_tokens=5, output_tokens=1),
    )

    assert state.iteration == 2
    assert state.usage == Usage(input_tokens=15, output_tokens=3)
    assert [c.call.id for c in state.batch] == ["c2", "c3"]
    assert state.open_batch and state.tool_calls == 1


def test_identical_calls_with_identical_results_share_a_signature() -> None:
    state = folded(
        turn(0, call("c1")),
        result("c1", "same"),
        turn(1, call("c2")),
        result("c2", "same"),
        turn(2, call("c3")),
        result("c3", "different"),
    )

    same = call_signature("restart", '{"svc": "web"}', "same")
    assert state.signatures[same] == 2
    assert sum(state.signatures.values()) == 3
    assert state.most_repeated == 2


def test_last_text_keeps_the_latest_turn_that_had_text() -> None:
    state = folded(turn(0, call("c1"), text="thinking"), result("c1"), turn(1, call("c2")))

    assert state.last_text == "thinking"


# -- deferrals, dispatches, processes -----------------------------------------------------------


def test_a_deferred_call_is_an_open_request_until_its_result() -> None:
    open_ = folded(turn(0, call("c1"), call("c2")), deferred("c1", "req_1"), result("c2"))

    assert [r.id for r in open_.open_requests] == ["req_1"]
    assert open_.open_batch

    closed = folded(
        turn(0, call("c1"), call("c2")),
        deferred("c1", "req_1"),
        result("c2"),
        approve("req_1"),
        result("c1", "restarted"),
    )
    assert closed.open_requests == []
    assert not closed.open_batch
    assert closed.batch[0].deferred is not None  # the request stays on record for the call


def test_a_dispatch_marks_the_call_in_flight_and_clears_its_process() -> None:
    state = folded(
        turn(0, call("c1")),
        dispatched("c1"),
        ToolProcess(call_id="c1", process=STAMP),
    )
    (c1,) = state.batch
    assert (c1.dispatched, c1.process, c1.result) == (True, STAMP, None)

    again = folded(
        turn(0, call("c1")),
        dispatched("c1"),
        ToolProcess(call_id="c1", process=STAMP),
        dispatched("c1"),
    )
    assert (again.batch[0].dispatched, again.batch[0].process) == (True, None)


def test_a_dispatch_after_the_calls_deferral_puts_it_in_flight_again() -> None:
    state = folded(
        turn(0, call("c1")),
        deferred("c1", "req_1"),
        approve("req_1"),
        dispatched("c1"),
        ToolProcess(call_id="c1", process=STAMP),
    )

    (c1,) = state.batch
    assert c1.dispatched and c1.process == STAMP
    assert c1.deferred is not None and c1.deferred.id == "req_1"
    assert [r.id for r in state.open_requests] == ["req_1"]  # still no result


def test_a_later_deferral_settles_an_effect_in_flight() -> None:
    state = folded(
        turn(0, call("c1")),
        deferred("c1", "req_1"),
        dispatched("c1"),
        ToolProcess(call_id="c1", process=STAMP),
        ToolDeferred(
            call_id="c1", tool="restart", request=request("c1", "req_2", RequestKind.WAIT_EFFECT)
        ),
    )

    (c1,) = state.batch
    assert (c1.dispatched, c1.process) == (False, None)
    assert c1.deferred is not None
    assert (c1.deferred.id, c1.deferred.kind) == ("req_2", RequestKind.WAIT_EFFECT)
    assert [r.id for r in state.open_requests] == ["req_2"]


def test_a_process_without_a_dispatch_is_still_recorded() -> None:
    state = folded(turn(0, call("c1")), ToolProcess(call_id="c1", process=STAMP))

    assert (state.batch[0].dispatched, state.batch[0].process) == (False, STAMP)


# -- outcome counting ---------------------------------------------------------------------------


def test_a_call_deferred_twice_counts_once() -> None:
    state = folded(turn(0, call("c1")), deferred("c1", "req_1"), deferred("c1", "req_2"))

    assert state.outcomes() == {"deferred": 1}


def test_an_answered_deferral_counts_by_the_exit_that_answered_it() -> None:
    state = folded(
        turn(0, call("c1"), call("c2"), call("c3")),
        deferred("c1", "req_1"),
        deferred("c1", "req_1b"),
        deferred("c2", "req_2"),
        result("c1", "denied", ToolOutcome.GATE_DENIED),
        result("c3", "bad", ToolOutcome.INVALID_ARGUMENTS),
    )

    assert state.outcomes() == {"deferred": 1, "gate_denied": 1, "invalid_arguments": 1}
    assert state.outcome_counts["deferred"] == 1


def test_outcomes_leave_out_kinds_that_dropped_to_zero() -> None:
    state = folded(turn(0, call("c1")), deferred("c1"), result("c1"))

    assert state.outcomes() == {"ok": 1}
    assert state.outcome_counts["deferred"] == 0


# -- answers, grants, advisories ----------------------------------------------------------------


def test_answers_are_kept_by_request_and_the_last_one_wins() -> None:
    deny = Decision(request_id="req_1", kind=DecisionKind.DENY, text="not now", by="bob")
    later = Decision(request_id="req_1", kind=DecisionKind.APPROVE, by="ann")
    other = Decision(request_id="req_2", kind=DecisionKind.ANSWER, text="blue")

    state = folded(
        AnswerSupplied(decision=deny),
        AnswerSupplied(decision=other),
        AnswerSupplied(decision=later),
    )

    assert state.answers == {"req_1": later, "req_2": other}


def test_grants_accumulate_in_journal_order() -> None:
    one = Grant(kind=GrantKind.ONE_SHOT, tool="restart", call_id="c1", digest="d1", by="ann")
    standing = Grant(kind=GrantKind.STANDING, tool="status", by="bob")

    state = folded(GrantWritten(grant=one), GrantWritten(grant=standing))

    assert state.grants == [one, standing]


def test_advisories_stay_out_of_the_conversation() -> None:
    state = folded(UserMessageEntry(text="hi"), AdvisoryEntry(text="disk almost full"))

    assert state.advisories == ["disk almost full"]
    assert state.messages == [UserMessage("hi")]


# -- status -------------------------------------------------------------------------------------


def test_status_moves_through_suspend_resume_and_end() -> None:
    entries: list[Entry] = [
        started(),
        turn(0, call("c1")),
        deferred("c1", "req_1"),
        RunSuspended(reason=StopReason.WAITING, request_ids=("req_1",)),
    ]
    assert folded(*entries).status is RunStatus.SUSPENDED

    entries += [RunResumed(owner="w2"), approve("req_1"), result("c1")]
    resumed = folded(*entries)
    assert resumed.status is RunStatus.RUNNING
    assert resumed.takeovers == []

    entries += [RunResumed(owner="w3", forced=True, taken_over_from="w2")]
    assert folded(*entries).takeovers == ["w2"]

    entries += [turn(1, text="restarted"), ended(text="restarted")]
    done = folded(*entries)
    assert done.status is RunStatus.COMPLETED
    assert done.result is not None and done.result.text == "restarted"


def test_a_forced_resume_s_fingerprint_is_the_one_later_resumes_compare_with() -> None:
    accepted = replace(FINGERPRINT, system_prompt_digest="after-an-upgrade")
    entries: list[Entry] = [started(), RunSuspended(reason=StopReason.WAITING)]
    assert folded(*entries).fingerprint == FINGERPRINT
    entries += [RunResumed(owner="w2", forced=True, fingerprint=accepted)]
    assert folded(*entries).fingerprint == accepted
    entries += [RunSuspended(reason=StopReason.WAITING), RunResumed(owner="w3")]
    assert folded(*entries).fingerprint == accepted  # a plain resume accepts nothing


def test_a_run_can_end_failed_or_cancelled_while_suspended() -> None:
    suspended = RunSuspended(reason=StopReason.WAITING)
    for status in (RunStatus.FAILED, RunStatus.CANCELLED):
        state = folded(started(), suspended, ended(status, error="gave up"))
        assert state.status is status
        assert state.result is not None and state.result.error == "gave up"


def test_the_final_answer_is_restored_from_the_last_turn() -> None:
    answer = 'all good\n```json\n{"restarted": ["web"]}\n```'
    full = TerminalResult(status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED, text=answer)
    entry = RunEnded.of(full, answer)
    assert entry.text_is_last_turn and entry.result.text == ""  # the journal holds it once

    state = folded(turn(0, call("c1"), text="checking"), result("c1"), turn(1, text=answer), entry)

    assert state.result is not None
    assert state.result.text == answer
    assert state.result.payload == {"restarted": ["web"]}


def test_a_restored_answer_comes_from_the_last_turn_with_text() -> None:
    entry = RunEnded(
        result=TerminalResult(status=RunStatus.FAILED, stop_reason=StopReason.TOOL_CALL_LIMIT),
        text_is_last_turn=True,
    )

    state = folded(turn(0, call("c1"), text="almost"), result("c1"), turn(1, call("c2")), entry)

    assert state.result is not None
    assert (state.result.text, state.result.payload) == ("almost", None)  # no payload unless done


def test_an_end_with_its_own_text_keeps_it() -> None:
    state = folded(turn(0, text="model said this"), ended(text="something else"))

    assert state.result is not None and state.result.text == "something else"


# -- apply and unknown entries ------------------------------------------------------------------


def test_apply_one_by_one_matches_fold() -> None:
    entries: list[Entry] = [
        started(system_prompt="sys"),
        UserMessageEntry(text="go"),
        turn(0, call("c1"), call("c2"), text="two calls", input_tokens=3),
        dispatched("c1"),
        ToolProcess(call_id="c1", process=STAMP),
        result("c1"),
        deferred("c2", "req_2"),
        RunSuspended(reason=StopReason.WAITING, request_ids=("req_2",)),
        RunResumed(owner="w2", taken_over_from="w1"),
        approve("req_2"),
        GrantWritten(grant=Grant(kind=GrantKind.STANDING, tool="restart")),
        result("c2"),
        AdvisoryEntry(text="note"),
        turn(1, text="done"),
        RunEnded.of(
            TerminalResult(
                status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED, text="done"
            ),
            "done",
        ),
    ]
    stepwise = RunState(run_id=RUN)
    for entry in entries:
        apply(stepwise, entry)

    whole = folded(*entries)

    whole.next_seq = 0  # only fold knows record positions
    assert stepwise == whole


class _Unknown:
    kind = "tool_exploded"


class _NoKind:
    pass


@pytest.mark.parametrize("entry", [_Unknown(), _NoKind(), "run_ended", None])
def test_an_entry_the_fold_does_not_know_is_an_error(entry: object) -> None:
    state = folded(turn(0, call("c1")))
    before = (list(state.messages), state.iteration, state.status)

    with pytest.raises(TypeError, match=type(entry).__qualname__):
        apply(state, entry)  # type: ignore[arg-type]

    assert (state.messages, state.iteration, state.status) == before


def test_fold_stops_at_an_unknown_entry() -> None:
    good = records(UserMessageEntry(text="hi"))
    bad = JournalRecord(run_id=RUN, seq=1, epoch=1, entry=_Unknown())  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="_Unknown"):
        fold([*good, bad])


def test_every_entry_kind_has_a_case() -> None:
    # Belt and braces beside mypy's assert_never: one entry of each kind folds without error.
    samples: list[Entry] = [
        started(),
        UserMessageEntry(text="u"),
        turn(0, call("c1")),
        dispatched("c1"),
        ToolProcess(call_id="c1", process=STAMP),
        deferred("c1"),
        result("c1"),
        GrantWritten(grant=Grant(kind=GrantKind.STANDING, tool="t")),
        approve("r"),
        RunSuspended(reason=StopReason.WAITING),
        RunResumed(),
        AdvisoryEntry(text="a"),
        ended(),
    ]
    declared = {cls.kind for cls in get_args(Entry)}

    assert {e.kind for e in samples} == declared
    folded(*samples)
