"""The ``Store`` contract, run against every backend of the ``store`` / ``backend`` fixtures."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from msgspec.structs import replace

from bot import wire
from bot.chat.outbox_keys import owed_card
from bot.domain import (
    AssistantTurn,
    Budgets,
    Decision,
    DecisionKind,
    Fingerprint,
    Grant,
    GrantKind,
    Request,
    RequestKind,
    RequestStatus,
    RunStatus,
    Session,
    StopReason,
    TerminalResult,
    ToolCall,
    ToolOutcome,
    Usage,
    new_id,
)
from bot.errors import SeqConflict, SeqGap, StaleEpoch, StoreError, ThreadBusy, UnknownRun
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
    ToolResultEntry,
    UserMessageEntry,
)
from bot.journal.fold import fold
from bot.journal.writer import RunJournal
from bot.kinds import AuditAction
from bot.records import REPLICA_STOPPING, RunRecord, WorkItem
from bot.store import Store
from bot.store_values import Audited, Counted, Settled
from storage.sqlite import SqliteStore
from storage.sqlite_schema import CREATE_VERSION_TABLE, SCHEMA_VERSION, migration_script
from tests.storage.conftest import Backend, FakeClock

LEASE = 30.0
AT = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
FINGERPRINT = Fingerprint(
    provider="scripted", model="demo", tools_digest="t1", system_prompt_digest="s1"
)


async def new_run(store: Store, owner: str = "w1", session_id: str = "s1") -> tuple[str, int]:
    """A fresh run owned by ``owner``; its id and first epoch."""
    await store.ensure_session(Session(id=session_id, platform="slack", channel="C1", thread="T1"))
    run_id = new_id("run")
    epoch = await store.create_run(
        RunRecord(id=run_id, session_id=session_id, prompt="restart web", requested_by="ann"),
        owner,
        LEASE,
    )
    return run_id, epoch


def a_request(run_id: str, **changes: object) -> Request:
    fields: dict[str, object] = {
        "run_id": run_id,
        "kind": RequestKind.WAIT_APPROVAL,
        "call_id": "call_1",
        "tool": "restart_service",
        "arguments": {"service": "web", "force": True},
        "digest": "d1",
        "prompt": "Restart web?",
        "options": ("approve", "deny"),
        "requested_by": "ann",
        "created_at": AT,
        "deadline": datetime(2030, 1, 2, tzinfo=UTC),
    }
    fields.update(changes)
    return wire.from_plain(fields, Request)


def every_entry(run_id: str) -> list[Entry]:
    """One entry of each journal type, with non-default fields."""
    request = a_request(run_id)
    decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="bob", at=AT)
    call = ToolCall(id="call_1", name="restart_service", arguments='{"service": "web"}')
    return [
        RunStarted(
            run_id=run_id,
            session_id="s1",
            requested_by="ann",
            system_prompt="be brief",
            fingerprint=FINGERPRINT,
            budgets=Budgets(max_iterations=7, deadline_seconds=1.5),
            has_prompter=True,
            at=AT,
        ),
        UserMessageEntry(text="restart web please", by="ann"),
        AssistantTurnEntry(
            iteration=1,
            turn=AssistantTurn(
                text="on it",
                calls=(call,),
                finish_reason="tool_calls",
                usage=Usage(input_tokens=12, output_tokens=3),
            ),
        ),
        ToolDispatched(call_id="call_1", tool="restart_service"),
        ToolDeferred(call_id="call_1", tool="restart_service", request=request),
        AnswerSupplied(decision=decision),
        GrantWritten(
            grant=Grant(
                kind=GrantKind.ONE_SHOT, tool="restart_service", call_id="call_1", digest="d1"
            )
        ),
        ToolResultEntry(
            call_id="call_1",
            tool="restart_service",
            outcome=ToolOutcome.OK,
            output="restarted ✓",
            is_error=False,
        ),
        AdvisoryEntry(text="mcp server flapped"),
        RunSuspended(reason=StopReason.WAITING, request_ids=(request.id,)),
        RunResumed(owner="w2", forced=True),
        RunEnded(
            result=TerminalResult(
                status=RunStatus.COMPLETED,
                stop_reason=StopReason.ANSWERED,
                text="done",
                payload={"restarted": ["web"], "count": 1},
                usage=Usage(input_tokens=40, output_tokens=9),
                outcomes={"ok": 1},
            )
        ),
    ]


def message(text: str) -> UserMessageEntry:
    return UserMessageEntry(text=text, by="ann")


# -- journal ------------------------------------------------------------------------------------


async def test_every_entry_type_round_trips(store: Store) -> None:
    run_id, epoch = await new_run(store)
    entries = every_entry(run_id)
    assert {e.kind for e in entries} == {
        "run_started",
        "user_message",
        "assistant_turn",
        "tool_dispatched",
        "tool_deferred",
        "answer_supplied",
        "grant_written",
        "tool_result",
        "advisory",
        "run_suspended",
        "run_resumed",
        "run_ended",
    }
    for seq, entry in enumerate(entries):
        await store.append(run_id, seq, epoch, entry)

    records = await store.load(run_id)

    assert [(r.run_id, r.seq, r.epoch) for r in records] == [
        (run_id, seq, epoch) for seq in range(len(entries))
    ]
    assert [r.entry for r in records] == entries


async def test_load_of_a_run_without_entries_is_empty(store: Store) -> None:
    run_id, _ = await new_run(store)
    assert await store.load(run_id) == []


async def test_a_journal_reads_back_by_range_and_its_length_is_one_number(store: Store) -> None:
    run_id, epoch = await new_run(store)
    empty = await new_run(store)
    assert await store.journal_length(run_id) == 0
    assert await store.load_range(run_id, 0, 10) == []
    entries = every_entry(run_id)
    for seq, entry in enumerate(entries):
        await store.append(run_id, seq, epoch, entry)
    # Another run's entries are not this one's.
    await store.append(empty[0], 0, empty[1], message("elsewhere"))

    assert await store.journal_length(run_id) == len(entries)
    page = await store.load_range(run_id, 3, 7)
    assert [r.seq for r in page] == [3, 4, 5, 6]
    assert [r.entry for r in page] == entries[3:7]
    assert [r.seq for r in await store.load_range(run_id, -5, 2)] == [0, 1]
    assert [r.seq for r in await store.load_range(run_id, 10, 99)] == [10, 11]
    assert await store.load_range(run_id, 12, 99) == []
    for read in (
        store.journal_length("run_missing"),
        store.load_range("run_missing", 0, 5),
        store.journal_tally("run_missing", 0, 5),
    ):
        with pytest.raises(UnknownRun):
            await read


async def test_a_journal_tally_adds_up_in_the_database(store: Store) -> None:
    run_id, epoch = await new_run(store)
    turn = AssistantTurnEntry(
        iteration=4, turn=AssistantTurn(usage=Usage(input_tokens=100, output_tokens=7))
    )
    failed = ToolResultEntry(call_id="c2", tool="t", outcome=ToolOutcome.ERROR, output="x")
    entries = [*every_entry(run_id)[:-1], turn, failed, message("more")]
    for seq, entry in enumerate(entries):
        await store.append(run_id, seq, epoch, entry)
    length = len(entries)

    whole = await store.journal_tally(run_id, 0, length)
    assert whole.stop == length
    assert whole.kinds["assistant_turn"] == 2 and whole.kinds["user_message"] == 2
    assert sum(whole.kinds.values()) == length
    assert whole.outcomes == {"ok": 1, "error": 1}
    assert (whole.input_tokens, whole.output_tokens) == (112, 10)
    assert whole.iterations == 5
    assert whole.started_seq == 0
    assert whole.last_turn_seq == 11 and whole.last_text_seq == 2  # the last turn has no text
    # Tallies of adjacent ranges add up to the whole.
    split = await store.journal_tally(run_id, 0, 5) + await store.journal_tally(run_id, 5, length)
    assert split == whole
    later = await store.journal_tally(run_id, 5, length)
    assert later.started_seq is None and later.last_text_seq is None
    assert (await store.journal_tally(run_id, length, length + 9)).kinds == {}
    # The same seqs, read from the journal's ends alone.
    marks = await store.journal_landmarks(run_id, length)
    assert (marks.started_seq, marks.last_turn_seq, marks.last_text_seq) == (0, 11, 2)
    assert (await store.journal_landmarks(run_id, 11)).last_turn_seq == 2
    assert (await store.journal_landmarks(run_id, 0)).started_seq is None


async def test_a_tally_finds_the_forced_resume_that_changed_the_runs_fingerprint(
    store: Store,
) -> None:
    # A run page names the model a forced resume went on with: the seq of the last such
    # resume, added up and read from the journal's end alike; a later resume that changed
    # nothing does not hide it, and a forced one that changed nothing is none.
    run_id, epoch = await new_run(store)
    changed = replace(FINGERPRINT, model="gpt-new")
    entries = [
        *every_entry(run_id)[:2],
        RunResumed(owner="w2", forced=True),
        RunResumed(owner="w2", forced=True, fingerprint=changed),
        message("more"),
        RunResumed(owner="w3"),
    ]
    for seq, entry in enumerate(entries):
        await store.append(run_id, seq, epoch, entry)

    assert (await store.journal_tally(run_id, 0, len(entries))).changed_seq == 3
    assert (await store.journal_landmarks(run_id, len(entries))).changed_seq == 3
    assert (await store.journal_landmarks(run_id, 3)).changed_seq is None
    assert (await store.journal_tally(run_id, 0, 3)).changed_seq is None


async def test_identical_record_at_existing_seq_is_a_no_op(store: Store) -> None:
    run_id, epoch = await new_run(store)
    await store.append(run_id, 0, epoch, message("hi"))
    await store.append(run_id, 1, epoch, message("there"))

    await store.append(run_id, 0, epoch, message("hi"))
    await store.append(run_id, 1, epoch, message("there"))

    assert [r.entry for r in await store.load(run_id)] == [message("hi"), message("there")]


async def test_different_record_at_existing_seq_conflicts(store: Store) -> None:
    run_id, epoch = await new_run(store)
    await store.append(run_id, 0, epoch, message("hi"))

    with pytest.raises(SeqConflict):
        await store.append(run_id, 0, epoch, message("bye"))

    assert [r.entry for r in await store.load(run_id)] == [message("hi")]


async def test_an_entry_that_would_not_read_back_is_refused_and_nothing_is_written(
    store: Store,
) -> None:
    run_id, epoch = await new_run(store)
    await store.append(run_id, 0, epoch, message("first"))
    unreadable = UserMessageEntry(text=7, by="ann")  # type: ignore[arg-type]  # a plugin's slip

    with pytest.raises(StoreError, match="a user_message entry would not read back"):
        await store.append(run_id, 1, epoch, unreadable)

    assert [r.entry for r in await store.load(run_id)] == [message("first")]
    await store.append(run_id, 1, epoch, message("second"))
    assert len(await store.load(run_id)) == 2


@pytest.mark.parametrize("seq", [1, 5, -1])
async def test_gap_is_refused(store: Store, seq: int) -> None:
    run_id, epoch = await new_run(store)

    with pytest.raises(SeqGap):
        await store.append(run_id, seq, epoch, message("early"))

    await store.append(run_id, 0, epoch, message("first"))
    with pytest.raises(SeqGap):
        await store.append(run_id, 2, epoch, message("skips 1"))
    assert len(await store.load(run_id)) == 1


async def test_unknown_run_is_reported(store: Store) -> None:
    with pytest.raises(UnknownRun):
        await store.append("run_missing", 0, 1, message("hi"))
    with pytest.raises(UnknownRun):
        await store.load("run_missing")
    with pytest.raises(UnknownRun):
        await store.get_run("run_missing")
    with pytest.raises(UnknownRun):
        await store.current_epoch("run_missing")
    with pytest.raises(UnknownRun):
        await store.claim("run_missing", "w1", LEASE)


async def test_stale_epoch_is_refused_after_a_claim(store: Store) -> None:
    run_id, first = await new_run(store, owner="w1")
    await store.append(run_id, 0, first, message("by w1"))

    second = await store.claim(run_id, "w2", LEASE, force=True)

    assert second == first + 1
    assert await store.current_epoch(run_id) == second
    with pytest.raises(StaleEpoch):
        await store.append(run_id, 1, first, message("late w1"))
    # Fencing wins over whatever stands at the seq: the stale owner learns it lost the run.
    await store.append(run_id, 1, second, message("by w2"))
    with pytest.raises(StaleEpoch):
        await store.append(run_id, 1, first, message("late w1"))
    records = await store.load(run_id)
    assert [(r.epoch, r.entry) for r in records] == [
        (first, message("by w1")),
        (second, message("by w2")),
    ]


async def test_group_commit_lands_every_append_and_fails_only_the_stale_one(store: Store) -> None:
    runs = [await new_run(store) for _ in range(50)]
    stale_run, stale_epoch = await new_run(store)
    assert await store.claim(stale_run, "w2", LEASE, force=True) == stale_epoch + 1
    appends = [
        store.append(run_id, seq, epoch, message(f"{run_id}:{seq}"))
        for seq in range(4)
        for run_id, epoch in runs
    ]
    appends.insert(100, store.append(stale_run, 0, stale_epoch, message("stale")))

    results = await asyncio.gather(*appends, return_exceptions=True)

    failures = [r for r in results if r is not None]
    assert len(results) == 201
    assert len(failures) == 1
    assert isinstance(failures[0], StaleEpoch)
    assert results[100] is failures[0]
    for run_id, epoch in runs:
        records = await store.load(run_id)
        assert [(r.seq, r.epoch, r.entry) for r in records] == [
            (seq, epoch, message(f"{run_id}:{seq}")) for seq in range(4)
        ]
    assert await store.load(stale_run) == []


async def test_mixed_failures_in_one_batch_fail_alone(store: Store) -> None:
    (ok_run, ok_epoch), (dup_run, dup_epoch), (bad_run, bad_epoch) = [
        await new_run(store) for _ in range(3)
    ]
    await store.append(dup_run, 0, dup_epoch, message("kept"))
    await store.append(bad_run, 0, bad_epoch, message("kept"))

    results = await asyncio.gather(
        store.append(ok_run, 0, ok_epoch, message("a")),
        store.append(dup_run, 0, dup_epoch, message("kept")),
        store.append(bad_run, 0, bad_epoch, message("other")),
        store.append(ok_run, 1, ok_epoch, message("b")),
        store.append(bad_run, 3, bad_epoch, message("gap")),
        store.append("run_missing", 0, 1, message("nobody")),
        store.append(dup_run, 1, dup_epoch, message("next")),
        store.append(ok_run, 2, ok_epoch, RunSuspended(reason=StopReason.WAITING)),
        return_exceptions=True,
    )

    assert [type(r) for r in results] == [
        type(None),
        type(None),
        SeqConflict,
        type(None),
        SeqGap,
        UnknownRun,
        type(None),
        type(None),
    ]
    assert [r.entry for r in await store.load(ok_run)] == [
        message("a"),
        message("b"),
        RunSuspended(reason=StopReason.WAITING),
    ]
    assert [r.entry for r in await store.load(dup_run)] == [message("kept"), message("next")]
    assert [r.entry for r in await store.load(bad_run)] == [message("kept")]
    assert (await store.get_run(ok_run)).status is RunStatus.SUSPENDED


async def test_status_follows_the_journal(store: Store) -> None:
    run_id, epoch = await new_run(store)
    entries = every_entry(run_id)
    started, suspended, resumed, ended = entries[0], entries[9], entries[10], entries[11]

    await store.append(run_id, 0, epoch, started)
    run = await store.get_run(run_id)
    assert (run.status, run.stop_reason) == (RunStatus.RUNNING, "")

    await store.append(run_id, 1, epoch, message("not a status change"))
    assert (await store.get_run(run_id)).owner == "w1"
    await store.append(run_id, 2, epoch, suspended)
    run = await store.get_run(run_id)
    assert (run.status, run.stop_reason) == (RunStatus.SUSPENDED, "waiting")
    assert (run.owner, run.lease_expires) == ("", None)  # the suspend gave the lease up

    assert await store.claim(run_id, "w2", LEASE) == epoch + 1
    await store.append(run_id, 3, epoch + 1, resumed)
    run = await store.get_run(run_id)
    assert (run.status, run.stop_reason, run.owner) == (RunStatus.RUNNING, "", "w2")

    await store.append(run_id, 4, epoch + 1, ended)
    run = await store.get_run(run_id)
    assert (run.status, run.stop_reason) == (RunStatus.COMPLETED, "answered")
    assert (run.owner, run.lease_expires) == ("", None)

    # Replaying an old status entry (an identical no-op) must not move the status back.
    await store.append(run_id, 2, epoch + 1, suspended)
    assert (await store.get_run(run_id)).status is RunStatus.COMPLETED


async def test_failed_run_keeps_its_stop_reason(store: Store) -> None:
    run_id, epoch = await new_run(store)
    result = TerminalResult(status=RunStatus.FAILED, stop_reason=StopReason.ITERATION_LIMIT)
    await store.append(run_id, 0, epoch, RunEnded(result=result))

    run = await store.get_run(run_id)

    assert (run.status, run.stop_reason) == (RunStatus.FAILED, "iteration_limit")


async def test_close_never_leaves_an_append_hanging(backend: Backend) -> None:
    store = await backend.open()
    runs = [await new_run(store) for _ in range(20)]
    appends = [
        asyncio.ensure_future(store.append(run_id, seq, epoch, message(str(seq))))
        for seq in range(3)
        for run_id, epoch in runs
    ]
    await asyncio.sleep(0)  # not a wait: one turn of the loop, so every append has started

    await asyncio.wait_for(store.close(), timeout=10)
    results = await asyncio.wait_for(asyncio.gather(*appends, return_exceptions=True), 10)

    assert all(r is None or isinstance(r, StoreError) for r in results)
    with pytest.raises(StoreError):
        await store.append(runs[0][0], 3, runs[0][1], message("after close"))


# -- runs and leases ----------------------------------------------------------------------------


async def test_created_run_reads_back(store: Store, clock: FakeClock) -> None:
    run_id, epoch = await new_run(store, owner="w1")

    run = await store.get_run(run_id)

    assert epoch == 1
    assert (run.id, run.session_id, run.prompt, run.requested_by) == (
        run_id,
        "s1",
        "restart web",
        "ann",
    )
    assert (run.status, run.owner, run.epoch) == (RunStatus.RUNNING, "w1", 1)
    assert run.lease_expires is not None
    assert (run.lease_expires - clock()).total_seconds() == pytest.approx(LEASE)


async def test_create_run_needs_a_known_session_and_a_new_id(store: Store) -> None:
    with pytest.raises(StoreError):
        await store.create_run(RunRecord(id="run_x", session_id="nowhere"), "w1", LEASE)
    run_id, _ = await new_run(store)
    with pytest.raises(StoreError):
        await store.create_run(RunRecord(id=run_id, session_id="s1"), "w1", LEASE)


async def test_create_run_can_ensure_its_session_in_the_same_write(store: Store) -> None:
    session = Session(id="s_new", platform="slack", channel="C9", thread="T9")
    first = RunRecord(id="run_a", session_id="s_new")
    second = RunRecord(id="run_b", session_id="s_new")

    assert await store.create_run(first, "w1", LEASE, session=session) == 1
    assert await store.create_run(second, "w1", LEASE, session=session) == 1  # already there

    assert [r.id for r in await store.list_runs(session_id="s_new")] == ["run_b", "run_a"]
    with pytest.raises(StoreError, match="already exists"):
        await store.create_run(first, "w1", LEASE, session=session)


def _thread_run(run_id: str) -> tuple[RunRecord, list[Entry]]:
    """A thread's new run and its first entry, as a mention creates them."""
    return RunRecord(id=run_id, session_id="s_thread"), [UserMessageEntry(text="look", by="ann")]


THREAD = Session(id="s_thread", platform="slack", channel="C1", thread="T1")


async def test_a_run_created_alone_waits_for_its_thread_s_unfinished_run(store: Store) -> None:
    first, entries = _thread_run("run_a")
    await store.create_run(first, "w1", LEASE, session=THREAD, entries=entries, alone=True)
    second, entries = _thread_run("run_b")
    with pytest.raises(ThreadBusy):
        await store.create_run(second, "w1", LEASE, session=THREAD, entries=entries, alone=True)
    assert [r.id for r in await store.list_runs(session_id="s_thread")] == ["run_a"]
    with pytest.raises(UnknownRun):
        await store.get_run("run_b")
    # Once the first ended, the thread takes a new run.
    result = TerminalResult(status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED)
    await store.append("run_a", 1, 1, RunEnded(result=result))
    await store.create_run(second, "w1", LEASE, session=THREAD, entries=entries, alone=True)


async def test_runs_created_alone_at_once_by_two_stores_are_one(backend: Backend) -> None:
    stores = [await backend.open(), await backend.open()]

    async def create(store: Store, run_id: str) -> bool:
        run, entries = _thread_run(run_id)
        try:
            await store.create_run(run, "w1", LEASE, session=THREAD, entries=entries, alone=True)
        except ThreadBusy:
            return False
        return True

    for attempt in range(5):
        ids = [f"run_{attempt}_{n}" for n in range(2)]
        created = await asyncio.gather(*(create(s, i) for s, i in zip(stores, ids, strict=True)))
        assert sorted(created) == [False, True]
        winner = ids[created.index(True)]
        result = TerminalResult(status=RunStatus.CANCELLED, stop_reason=StopReason.CANCELLED)
        await stores[0].append(winner, 1, 1, RunEnded(result=result))


async def test_a_session_reads_back_by_id(store: Store) -> None:
    session = Session(id="s_slack", platform="slack", channel="C9", thread="171.5")
    await store.ensure_session(session)
    await store.ensure_session(replace(session, thread="other"))  # first one stays

    assert await store.get_session("s_slack") == session
    run_id, _ = await new_run(store, session_id="s_slack")
    assert await store.get_session((await store.get_run(run_id)).session_id) == session
    assert await store.get_session("nowhere") is None


async def test_a_platforms_sessions_read_back_newest_first(store: Store, clock: FakeClock) -> None:
    older = Session(id="d1", platform="discord", workspace="100", channel="200", thread="201")
    slack = Session(id="s1", platform="slack", channel="C1", thread="1.5")
    newer = Session(id="d2", platform="discord", workspace="100", channel="210", thread="211")
    for session in (older, slack, newer):
        await store.ensure_session(session)
        clock.advance(1)

    assert await store.sessions_on("discord", 10) == [newer, older]
    assert await store.sessions_on("discord", 1) == [newer]
    assert await store.sessions_on("console", 10) == []


async def test_list_runs_newest_first(store: Store) -> None:
    await store.ensure_session(Session(id="s1"))
    await store.ensure_session(Session(id="s1"))  # idempotent
    await store.ensure_session(Session(id="s2"))
    for i, session_id in enumerate(["s1", "s2", "s1", "s1"]):
        created = datetime(2030, 1, 1, 0, i, tzinfo=UTC)
        record = RunRecord(id=f"run_{i}", session_id=session_id, created_at=created)
        await store.create_run(record, "w1", LEASE)

    assert [r.id for r in await store.list_runs()] == ["run_3", "run_2", "run_1", "run_0"]
    assert [r.id for r in await store.list_runs(limit=2)] == ["run_3", "run_2"]
    assert [r.id for r in await store.list_runs(session_id="s1")] == ["run_3", "run_2", "run_0"]
    assert await store.list_runs(session_id="s9") == []


async def test_runs_are_counted_by_status(store: Store) -> None:
    assert await store.count_runs_by_status() == {}
    ended = {
        status: RunEnded(result=TerminalResult(status=status, stop_reason=StopReason.ANSWERED))
        for status in (RunStatus.COMPLETED, RunStatus.FAILED)
    }
    suspended = RunSuspended(reason=StopReason.WAITING)
    for entry in (ended[RunStatus.COMPLETED], ended[RunStatus.COMPLETED], ended[RunStatus.FAILED]):
        run_id, epoch = await new_run(store)
        await store.append(run_id, 0, epoch, entry)
    run_id, epoch = await new_run(store)
    await store.append(run_id, 0, epoch, suspended)
    await new_run(store)  # still running

    assert await store.count_runs_by_status() == {
        "completed": 2,
        "failed": 1,
        "suspended": 1,
        "running": 1,
    }


async def test_claim_waits_for_a_live_lease_of_another_owner(
    store: Store, clock: FakeClock
) -> None:
    run_id, first = await new_run(store, owner="w1")

    assert await store.claim(run_id, "w2", LEASE) is None
    clock.advance(LEASE - 1)
    assert await store.claim(run_id, "w2", LEASE) is None
    assert await store.current_epoch(run_id) == first

    clock.advance(2)
    second = await store.claim(run_id, "w2", LEASE)

    assert second == first + 1
    run = await store.get_run(run_id)
    assert (run.owner, run.epoch) == ("w2", second)
    assert await store.claim(run_id, "w1", LEASE) is None


async def test_force_claim_and_same_owner_reclaim(store: Store) -> None:
    run_id, first = await new_run(store, owner="w1")

    forced = await store.claim(run_id, "w2", LEASE, force=True)
    again = await store.claim(run_id, "w2", LEASE)

    assert (forced, again) == (first + 1, first + 2)
    assert await store.current_epoch(run_id) == first + 2


async def test_renew_and_release_are_fenced_by_epoch(store: Store, clock: FakeClock) -> None:
    run_id, first = await new_run(store, owner="w1")
    clock.advance(LEASE - 1)
    assert await store.renew(run_id, "w1", first, LEASE) is True
    clock.advance(LEASE - 1)
    assert await store.claim(run_id, "w2", LEASE) is None  # the renewal kept it alive

    second = await store.claim(run_id, "w2", LEASE, force=True)
    assert second is not None
    assert await store.renew(run_id, "w1", first, LEASE) is False
    await store.release(run_id, "w1", first)  # stale: changes nothing
    run = await store.get_run(run_id)
    assert (run.owner, run.epoch) == ("w2", second)

    await store.release(run_id, "w2", second)
    run = await store.get_run(run_id)
    assert (run.owner, run.lease_expires, run.epoch) == ("", None, second)
    assert await store.claim(run_id, "w1", LEASE) == second + 1


async def test_takeover_mid_stream_leaves_no_gap_or_duplicate(backend: Backend) -> None:
    first_store, second_store = await backend.open(), await backend.open()
    run_id, first = await new_run(first_store, owner="w1")
    taken = asyncio.Event()

    async def first_writer() -> int:
        seq = 0
        while True:
            try:
                await first_store.append(run_id, seq, first, message(f"w1:{seq}"))
            except StaleEpoch:
                return seq
            seq += 1
            if seq == 5:
                taken.set()

    async def second_writer() -> int:
        await taken.wait()
        second = await second_store.claim(run_id, "w2", LEASE, force=True)
        assert second == first + 1
        start = len(await second_store.load(run_id))
        for seq in range(start, start + 10):
            await second_store.append(run_id, seq, second, message(f"w2:{seq}"))
        return start

    refused_at, taken_at = await asyncio.wait_for(
        asyncio.gather(first_writer(), second_writer()), timeout=30
    )

    records = await first_store.load(run_id)
    assert refused_at == taken_at
    assert [r.seq for r in records] == list(range(taken_at + 10))
    assert [r.entry for r in records] == [
        message(f"w1:{s}") if s < taken_at else message(f"w2:{s}") for s in range(taken_at + 10)
    ]
    assert [r.epoch for r in records] == [first] * taken_at + [first + 1] * 10


async def test_two_instances_race_on_one_seq_only_the_owner_wins(backend: Backend) -> None:
    first_store, second_store = await backend.open(), await backend.open()
    run_id, first = await new_run(first_store, owner="w1")
    second = await second_store.claim(run_id, "w2", LEASE, force=True)
    assert second is not None

    for seq in range(10):
        results = await asyncio.gather(
            first_store.append(run_id, seq, first, message(f"w1:{seq}")),
            second_store.append(run_id, seq, second, message(f"w2:{seq}")),
            return_exceptions=True,
        )
        assert results[1] is None
        assert isinstance(results[0], StaleEpoch)

    records = await first_store.load(run_id)
    assert [(r.seq, r.epoch) for r in records] == [(s, second) for s in range(10)]


# -- requests -----------------------------------------------------------------------------------


async def test_request_opens_once_and_reads_back(store: Store) -> None:
    run_id, _ = await new_run(store)
    request = a_request(run_id)

    await store.open_request(request)
    await store.open_request(request)

    assert await store.get_request(request.id) == (request, RequestStatus.OPEN, None)
    assert await store.list_requests() == [(request, RequestStatus.OPEN, None)]
    with pytest.raises(KeyError):
        await store.get_request("req_missing")


async def test_request_of_unknown_run_is_refused(store: Store) -> None:
    with pytest.raises(UnknownRun):
        await store.open_request(a_request("run_missing"))


async def test_list_requests_filters_by_run_and_status(store: Store) -> None:
    run_a, _ = await new_run(store)
    run_b, _ = await new_run(store)
    older = a_request(run_a, created_at=datetime(2030, 1, 1, 1, tzinfo=UTC))
    newer = a_request(run_a, created_at=datetime(2030, 1, 1, 2, tzinfo=UTC))
    other = a_request(run_b, kind=RequestKind.WAIT_USER)
    for request in (newer, other, older):
        await store.open_request(request)
    decision = Decision(request_id=newer.id, kind=DecisionKind.DENY, by="bob", at=AT)
    assert await store.decide(decision, RequestStatus.ANSWERED)

    def ids(rows: list[tuple[Request, RequestStatus, Decision | None]]) -> list[str]:
        return [row[0].id for row in rows]

    assert ids(await store.list_requests(run_id=run_a)) == [older.id]
    assert ids(await store.list_requests(run_id=run_a, status=None)) == [older.id, newer.id]
    assert ids(await store.list_requests(status=RequestStatus.ANSWERED)) == [newer.id]
    assert ids(await store.list_requests(run_id=run_b)) == [other.id]
    assert await store.list_requests(run_id=run_b, status=RequestStatus.EXPIRED) == []


async def test_decide_has_exactly_one_winner(store: Store) -> None:
    run_id, _ = await new_run(store)
    request = a_request(run_id)
    await store.open_request(request)
    decisions = [
        Decision(request_id=request.id, kind=DecisionKind.APPROVE, by=f"user{i}", at=AT)
        for i in range(20)
    ]

    won = await asyncio.gather(*(store.decide(d, RequestStatus.ANSWERED) for d in decisions))

    assert won.count(True) == 1
    winner = decisions[won.index(True)]
    assert await store.get_request(request.id) == (request, RequestStatus.ANSWERED, winner)
    assert await store.list_requests() == []


async def test_decide_has_exactly_one_winner_across_instances(backend: Backend) -> None:
    first_store, second_store = await backend.open(), await backend.open()
    run_id, _ = await new_run(first_store)
    requests = [a_request(run_id, call_id=f"call_{i}") for i in range(5)]
    for request in requests:
        await first_store.open_request(request)

    for request in requests:
        attempts = [
            (first_store if i % 2 else second_store).decide(
                Decision(request_id=request.id, kind=DecisionKind.APPROVE, by=f"user{i}"),
                RequestStatus.ANSWERED,
            )
            for i in range(20)
        ]
        won = await asyncio.gather(*attempts)
        assert won.count(True) == 1
        _, status, decision = await second_store.get_request(request.id)
        assert status is RequestStatus.ANSWERED
        assert decision is not None
        assert decision.by == f"user{won.index(True)}"


async def test_decide_on_a_closed_or_unknown_request(store: Store) -> None:
    run_id, _ = await new_run(store)
    request = a_request(run_id)
    await store.open_request(request)
    expired = Decision(request_id=request.id, kind=DecisionKind.EXPIRED, by="deadline", at=AT)
    late = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="bob", at=AT)

    assert await store.decide(expired, RequestStatus.EXPIRED) is True
    assert await store.decide(late, RequestStatus.ANSWERED) is False
    assert await store.get_request(request.id) == (request, RequestStatus.EXPIRED, expired)
    with pytest.raises(KeyError):
        await store.decide(
            Decision(request_id="req_missing", kind=DecisionKind.DENY), RequestStatus.ANSWERED
        )
    with pytest.raises(ValueError):
        await store.decide(late, RequestStatus.OPEN)


async def test_approvals_count_distinct_approvers(store: Store) -> None:
    run_id, _ = await new_run(store)
    request = a_request(run_id, approvals_needed=2)
    await store.open_request(request)

    assert await store.add_approval(request.id, "bob") == Counted(1, new=True)
    assert await store.add_approval(request.id, "bob") == Counted(1, new=False)
    assert await store.add_approval(request.id, "eve") == Counted(2, new=True)
    with pytest.raises(KeyError):
        await store.add_approval("req_missing", "bob")


async def test_approvers_are_listed_in_the_order_they_approved(
    store: Store, clock: FakeClock
) -> None:
    run_id, _ = await new_run(store)
    request = a_request(run_id, approvals_needed=3)
    await store.open_request(request)
    assert await store.approvers(request.id) == []

    for approver in ("zed", "amy", "zed", "bob"):
        await store.add_approval(request.id, approver)
        clock.advance(1)

    assert await store.approvers(request.id) == ["zed", "amy", "bob"]
    assert await store.approvers("req_missing") == []


async def test_concurrent_approvals_each_count_once(backend: Backend) -> None:
    first_store, second_store = await backend.open(), await backend.open()
    run_id, _ = await new_run(first_store)
    request = a_request(run_id, approvals_needed=3)
    await first_store.open_request(request)

    counts = await asyncio.gather(
        *(
            (first_store if i % 2 else second_store).add_approval(request.id, f"user{i % 10}")
            for i in range(20)
        )
    )

    assert all(counted is not None for counted in counts)  # None: not counted
    assert {c.count for c in counts if c} <= set(range(1, 11))
    assert max(c.count for c in counts if c) == 10
    assert sum(c.new for c in counts if c) == 10  # each approver new once, and only once
    assert await first_store.add_approval(request.id, "user0") == Counted(10, new=False)


async def test_a_closed_request_takes_no_more_approvals(store: Store) -> None:
    run_id, _ = await new_run(store)
    request = a_request(run_id, approvals_needed=2)
    await store.open_request(request)
    assert await store.add_approval(request.id, "bob") == Counted(1, new=True)
    denied = Decision(request_id=request.id, kind=DecisionKind.DENY, by="eve", at=AT)
    assert await store.decide(denied, RequestStatus.ANSWERED)

    assert await store.add_approval(request.id, "ann") is None  # counted nowhere: it says so
    assert await store.add_approval(request.id, "bob") is None


async def test_an_ended_runs_request_takes_no_more_approvals(store: Store) -> None:
    # A cancel ends its run before it closes the run's requests: an approval between the two
    # is counted nowhere and audited nowhere, as an answer there closes nothing.
    run_id, epoch = await new_run(store)
    request = a_request(run_id, approvals_needed=2)
    await store.open_request(request)
    assert await store.add_approval(request.id, "bob") == Counted(1, new=True)
    result = TerminalResult(status=RunStatus.CANCELLED, stop_reason=StopReason.CANCELLED)
    await store.append(run_id, 0, epoch, RunEnded(result=result))

    audited = Audited("ann", AuditAction.APPROVE_PARTIAL, "d")
    assert await store.add_approval(request.id, "ann", audited) is None
    assert await store.add_approval(request.id, "bob") is None
    approved = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="ann", at=AT)
    assert not await store.decide(approved, RequestStatus.ANSWERED)
    assert (await store.get_request(request.id))[1] is RequestStatus.OPEN
    assert [f.action for f in await store.list_audit(run_id=run_id)] == []


async def test_a_decision_is_audited_by_its_winner_only(store: Store) -> None:
    run_id, _ = await new_run(store)
    request = a_request(run_id)
    await store.open_request(request)
    first = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="bob", at=AT)
    second = Decision(request_id=request.id, kind=DecisionKind.DENY, by="eve", at=AT)

    assert await store.decide(
        first, RequestStatus.ANSWERED, Audited("bob", AuditAction.APPROVE, "d1")
    )
    assert not await store.decide(second, RequestStatus.ANSWERED, Audited("eve", AuditAction.DENY))

    facts = await store.list_audit(run_id=run_id)
    assert [(f.actor, f.action, f.run_id, f.request_id, f.detail) for f in facts] == [
        ("bob", "approve", run_id, request.id, "d1")
    ]


async def test_byte_identical_decisions_are_audited_once(backend: Backend) -> None:
    # The same person's same click, delivered twice in one microsecond (a retry, two replicas):
    # the texts cannot tell winner from loser, the audit must still hold one record.
    first_store, second_store = await backend.open(), await backend.open()
    run_id, _ = await new_run(first_store)
    request = a_request(run_id)
    await first_store.open_request(request)
    decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="bob", at=AT)
    audit = Audited("bob", AuditAction.APPROVE, request.digest)

    won = await asyncio.gather(
        *(
            (first_store if i % 2 else second_store).decide_and_claim(
                decision, RequestStatus.ANSWERED, audit, f"w{i}", LEASE
            )
            for i in range(6)
        )
    )

    assert [s.won for s in won].count(True) == 1
    facts = await second_store.list_audit(run_id=run_id)
    assert [(f.actor, f.action, f.request_id) for f in facts] == [("bob", "approve", request.id)]


async def test_closing_the_last_open_request_takes_the_free_lease(store: Store) -> None:
    run_id, epoch = await new_run(store)
    first, last = a_request(run_id, call_id="call_1"), a_request(run_id, call_id="call_2")
    for seq, entry in enumerate(
        [
            *every_entry(run_id)[:2],
            ToolDeferred(call_id="call_1", tool="restart_service", request=first),
            ToolDeferred(call_id="call_2", tool="restart_service", request=last),
            RunSuspended(reason=StopReason.WAITING, request_ids=(first.id, last.id)),
        ]
    ):
        await store.append(run_id, seq, epoch, entry)
    audit = Audited("bob", AuditAction.APPROVE)

    def approval(request: Request) -> Decision:
        return Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="bob", at=AT)

    one_left = await store.decide_and_claim(
        approval(first), RequestStatus.ANSWERED, audit, "w2", LEASE
    )
    settled = await store.decide_and_claim(
        approval(last), RequestStatus.ANSWERED, audit, "w2", LEASE
    )
    late = replace(approval(last), by="eve")
    again = await store.decide_and_claim(late, RequestStatus.ANSWERED, audit, "w3", LEASE)

    assert one_left == Settled(True, None)
    assert settled == Settled(True, epoch + 1)
    assert again == Settled(False)
    record = await store.get_run(run_id)
    assert (record.owner, record.epoch) == ("w2", epoch + 1)
    actions = [f.action for f in await store.list_audit(run_id=run_id)]
    assert actions == ["request", "request", "approve", "approve"]


async def test_closing_the_last_request_leaves_a_held_lease_alone(store: Store) -> None:
    run_id, epoch = await new_run(store, owner="w1")  # w1 holds a live lease
    request = a_request(run_id)
    await store.open_request(request)
    decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="bob", at=AT)

    settled = await store.decide_and_claim(
        decision, RequestStatus.ANSWERED, Audited("bob", AuditAction.APPROVE), "w1", LEASE
    )

    assert settled == Settled(True, None)
    assert await store.current_epoch(run_id) == epoch
    with pytest.raises(KeyError):
        await store.decide_and_claim(
            replace(decision, request_id="req_missing"),
            RequestStatus.ANSWERED,
            Audited("bob", AuditAction.APPROVE),
            "w1",
            LEASE,
        )


@pytest.mark.parametrize(("decider", "taken"), [("w1", False), ("w2", True)])
async def test_closing_the_last_request_takes_a_lapsed_lease_only_from_another(
    store: Store, clock: FakeClock, decider: str, taken: bool
) -> None:
    run_id, epoch = await new_run(store, owner="w1")
    request = a_request(run_id)
    await store.open_request(request)
    clock.advance(LEASE + 1)  # w1's renewal is late: its task may still drive the run
    decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="bob", at=AT)

    settled = await store.decide_and_claim(
        decision, RequestStatus.ANSWERED, Audited("bob", AuditAction.APPROVE), decider, LEASE
    )

    # Another's lapsed lease is an owner gone; ours is our own task, never fenced by our click.
    assert settled == Settled(True, epoch + 1 if taken else None)
    record = await store.get_run(run_id)
    assert (record.owner, record.epoch) == (decider if taken else "w1", epoch + taken)


async def test_a_deferred_call_opens_its_request_with_the_entry(store: Store) -> None:
    run_id, epoch = await new_run(store)
    for seq, entry in enumerate(every_entry(run_id)[:3]):
        await store.append(run_id, seq, epoch, entry)
    request = a_request(run_id)
    deferred = ToolDeferred(call_id="call_1", tool="restart_service", request=request)
    await store.claim(run_id, "w2", LEASE, force=True)

    with pytest.raises(StaleEpoch):
        await store.append(run_id, 3, epoch, deferred)
    with pytest.raises(KeyError):
        await store.get_request(request.id)
    await store.append(run_id, 3, epoch + 1, deferred)

    assert await store.get_request(request.id) == (request, RequestStatus.OPEN, None)
    facts = await store.list_audit(run_id=run_id)
    assert [(f.actor, f.action, f.request_id, f.detail) for f in facts] == [
        (
            "ann",
            "request",
            request.id,
            'wait_approval restart_service {"force": true, "service": "web"} (digest d1)',
        )
    ]


async def test_a_resume_is_audited_as_the_person_who_resumed_the_run(store: Store) -> None:
    run_id, epoch = await new_run(store)
    entries = every_entry(run_id)[:3]
    entries += [RunResumed(owner="w1"), RunResumed(owner="w2", by="dave", taken_over_from="w1")]
    for seq, entry in enumerate(entries):
        await store.append(run_id, seq, epoch, entry)

    facts = await store.list_audit(run_id=run_id)

    assert [(f.actor, f.action, f.detail) for f in facts] == [
        ("w1", "resume", ""),  # the process, on its own (adoption)
        ("dave", "resume", "on w2, taken over from w1"),
    ]


async def test_a_run_is_created_with_its_first_entries(store: Store) -> None:
    session = Session(id="s9", platform="cli", channel="", thread="")
    run_id = new_id("run")
    record = RunRecord(id=run_id, session_id="s9", prompt="hi", requested_by="ann")
    refusal = TerminalResult(
        status=RunStatus.FAILED, stop_reason=StopReason.POLICY, error="refused"
    )
    entries = [*every_entry(run_id)[:2], RunEnded(result=refusal)]

    epoch = await store.create_run(record, "w1", LEASE, session=session, entries=entries)

    assert epoch == 1
    assert [(r.seq, r.epoch, r.entry) for r in await store.load(run_id)] == [
        (seq, 1, entry) for seq, entry in enumerate(entries)
    ]
    created = await store.get_run(run_id)
    assert (created.status, created.stop_reason, created.owner) == (
        RunStatus.FAILED,
        "policy",
        "",
    )


# -- work queue ---------------------------------------------------------------------------------

PAYLOAD = {
    "run_id": "run_1",
    "prompt": "restart web ✓",
    "session": {"id": "s1", "platform": "slack", "thread": None},
    "tags": ["a", 2, 3.5, True],
}


async def take_all(store: Store, owner: str, limit: int = 3) -> list[int]:
    """Take batches until none is left; the ids taken, in order."""
    taken: list[int] = []
    while items := await store.take_work(owner, limit=limit):
        taken += [item.id for item in items]
    return taken


async def test_work_round_trips_and_is_taken_once(store: Store, clock: FakeClock) -> None:
    work_id = await store.enqueue_work("start", PAYLOAD)

    taken = await store.take_work("w1")

    assert taken == [WorkItem(id=work_id, kind="start", payload=PAYLOAD, created_at=clock.now)]
    assert await store.take_work("w2") == []
    await store.finish_work(work_id)
    await store.finish_work(work_id)  # finishing twice changes nothing
    assert await store.take_work("w2") == []


async def test_work_is_taken_oldest_first_up_to_the_limit(store: Store) -> None:
    ids = [await store.enqueue_work("resume", {"run_id": f"run_{i}"}) for i in range(5)]

    first = await store.take_work("w1", limit=2)
    rest = await store.take_work("w2", limit=10)

    assert ids == sorted(ids)
    assert [item.id for item in first] == ids[:2]
    assert [item.id for item in rest] == ids[2:]
    assert [item.payload["run_id"] for item in rest] == ["run_2", "run_3", "run_4"]
    assert await store.take_work("w1", limit=0) == []


async def test_concurrent_takers_split_the_work(backend: Backend) -> None:
    first_store, second_store = await backend.open(), await backend.open()
    ids = [await first_store.enqueue_work("start", {"n": n}) for n in range(50)]

    takes = await asyncio.gather(
        take_all(first_store, "w1a"),
        take_all(second_store, "w2a"),
        take_all(first_store, "w1b"),
        take_all(second_store, "w2b"),
    )

    taken = [work_id for take in takes for work_id in take]
    assert sorted(taken) == ids  # each item once: disjoint, and together all of them
    assert all(take == sorted(take) for take in takes)


async def test_abandoned_work_is_retaken_after_retake_after(
    backend: Backend, clock: FakeClock
) -> None:
    first_store, second_store = await backend.open(), await backend.open()
    work_id = await first_store.enqueue_work("resume", {"run_id": "run_1"})
    assert [item.id for item in await first_store.take_work("w1", retake_after=30)] == [work_id]

    clock.advance(29)
    assert await second_store.take_work("w2", retake_after=30) == []
    clock.advance(1)
    assert await second_store.take_work("w2", retake_after=30) == []  # not more than 30 s yet
    clock.advance(1)
    retaken = await second_store.take_work("w2", retake_after=30)

    assert [(item.id, item.payload) for item in retaken] == [(work_id, {"run_id": "run_1"})]
    assert await first_store.take_work("w1", retake_after=30) == []  # w2 holds it now


async def test_finished_work_is_never_retaken(store: Store, clock: FakeClock) -> None:
    done_id = await store.enqueue_work("start", {"n": 1})
    open_id = await store.enqueue_work("start", {"n": 2})
    assert len(await store.take_work("w1")) == 2
    await store.finish_work(done_id)

    clock.advance(3600)

    assert [item.id for item in await store.take_work("w2", retake_after=60)] == [open_id]
    clock.advance(3600)
    await store.finish_work(open_id)
    assert await store.take_work("w3", retake_after=60) == []


async def test_work_of_an_unknown_kind_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="kind"):
        await store.enqueue_work("reboot", {})
    assert await store.take_work("w1") == []


async def test_wait_for_work_wakes_on_an_enqueue_by_the_same_instance(store: Store) -> None:
    # A first wait may return at once: work enqueued before a listener existed went unheard.
    await store.wait_for_work(0)
    await store.enqueue_work("start", {"n": 1})

    started = time.monotonic()
    await asyncio.wait_for(store.wait_for_work(30), 5)

    # Well under SQLite's 0.2 s poll: the enqueue itself woke the waiter.
    assert time.monotonic() - started < 0.1


async def test_a_waiting_replica_takes_work_enqueued_by_another(backend: Backend) -> None:
    producer, consumer = await backend.open(), await backend.open()
    await consumer.wait_for_work(0)  # a first wait may return at once (see above)
    waiting = asyncio.Event()
    wakeups = 0

    async def consume() -> list[WorkItem]:
        nonlocal wakeups
        while not (items := await consumer.take_work("w2")):
            waiting.set()  # and straight into the wait: this task yields only inside it
            await consumer.wait_for_work(30)
            wakeups += 1
        return items

    task = asyncio.create_task(consume())
    await asyncio.wait_for(waiting.wait(), 10)
    # A deliberate gap, longer than SQLite's 0.2 s poll: a consumer that spun instead of
    # waiting would wake many times in it.
    await asyncio.sleep(0.3)
    assert not task.done()
    work_id = await producer.enqueue_work("start", {"n": 1})
    enqueued = time.monotonic()
    items = await asyncio.wait_for(task, 10)

    assert [item.id for item in items] == [work_id]
    # A notification (or SQLite's short poll) woke it, not the 30 s timeout...
    assert time.monotonic() - enqueued < 2
    # ...and it waited in between instead of spinning.
    assert wakeups <= 5


async def test_wait_for_work_times_out_when_nothing_comes(store: Store) -> None:
    await store.wait_for_work(0)
    started = time.monotonic()

    await asyncio.wait_for(store.wait_for_work(0.05), 5)

    assert time.monotonic() - started >= 0.04


async def test_close_wakes_the_waiters(backend: Backend) -> None:
    store = await backend.open()
    await store.wait_for_work(0)
    waiting = asyncio.Event()

    async def wait() -> None:
        waiting.set()  # and straight into the wait: this task yields only inside it
        await store.wait_for_work(30)

    waiter = asyncio.create_task(wait())
    await asyncio.wait_for(waiting.wait(), 10)
    assert not waiter.done()

    await store.close()

    await asyncio.wait_for(waiter, 5)


# -- replicas -----------------------------------------------------------------------------------


async def test_replicas_are_listed_with_their_runs_while_alive(
    store: Store, clock: FakeClock
) -> None:
    started = clock.now
    await store.heartbeat("w1", info="host-a pid 1")
    runs = sorted([await new_run(store, owner="w1"), await new_run(store, owner="w1")])
    released, released_epoch = await new_run(store, owner="w1")
    await store.release(released, "w1", released_epoch)
    clock.advance(10)
    await store.heartbeat("w2")
    await store.heartbeat("w1", info="host-a pid 1 draining")

    w1, w2 = await store.list_replicas(alive_within=60)

    lease = started + timedelta(seconds=LEASE)
    assert (w1.owner, w1.info, w1.started_at, w1.last_seen) == (
        "w1",
        "host-a pid 1 draining",
        started,
        clock.now,
    )
    assert w1.runs == tuple((run_id, lease) for run_id, _ in runs)
    assert (w2.owner, w2.info, w2.started_at, w2.runs) == ("w2", "", clock.now, ())

    taken = await store.claim(runs[0][0], "w2", LEASE, force=True)
    assert taken is not None
    w1, w2 = await store.list_replicas(alive_within=60)
    assert [run_id for run_id, _ in w1.runs] == [runs[1][0]]
    assert w2.runs == ((runs[0][0], clock.now + timedelta(seconds=LEASE)),)


async def test_a_silent_replica_is_not_listed(store: Store, clock: FakeClock) -> None:
    await store.heartbeat("w1")
    await store.heartbeat("w2")
    run_id, _ = await new_run(store, owner="w1")
    clock.advance(50)
    await store.heartbeat("w2")
    assert [r.owner for r in await store.list_replicas(alive_within=60)] == ["w1", "w2"]

    clock.advance(11)

    assert [r.owner for r in await store.list_replicas(alive_within=60)] == ["w2"]
    await store.heartbeat("w1")  # back again: listed, and still starting when it first did
    w1, _ = await store.list_replicas(alive_within=60)
    assert w1.started_at == clock.now - timedelta(seconds=61)
    assert [r for r, _ in w1.runs] == [run_id]


async def test_a_replica_marked_stopping_stays_so_until_forgotten(
    store: Store, clock: FakeClock
) -> None:
    await store.heartbeat("w1")
    await store.heartbeat("w1", info=REPLICA_STOPPING)
    clock.advance(1)
    await store.heartbeat("w1")  # taken as it began to stop, landed after the mark

    (w1,) = await store.list_replicas(alive_within=60)

    assert w1.stopping and w1.last_seen == clock.now
    await store.forget_replica("w1")
    await store.heartbeat("w1")
    (w1,) = await store.list_replicas(alive_within=60)
    assert not w1.stopping


async def test_a_replica_that_stopped_cleanly_is_forgotten_at_once(
    store: Store, clock: FakeClock
) -> None:
    await store.heartbeat("w1")
    await store.heartbeat("w2")
    clock.advance(1)

    await store.forget_replica("w1")
    await store.forget_replica("w9")  # never registered: nothing to forget, no error

    assert [r.owner for r in await store.list_replicas(alive_within=60)] == ["w2"]
    await store.heartbeat("w1")  # started again: registered anew, from now
    w1, _ = await store.list_replicas(alive_within=60)
    assert w1.started_at == clock.now


# -- audit --------------------------------------------------------------------------------------


async def test_audit_lists_oldest_first(store: Store, clock: FakeClock) -> None:
    run_id, _ = await new_run(store)
    await store.audit("bob", AuditAction.APPROVE, run_id=run_id, request_id="req_1", detail="once")
    clock.advance(1)
    await store.audit("ann", AuditAction.CANCEL)
    clock.advance(1)
    await store.audit("bob", AuditAction.RESUME, run_id=run_id)

    facts = await store.list_audit()
    assert [(f.actor, f.action, f.run_id, f.request_id, f.detail) for f in facts] == [
        ("bob", "approve", run_id, "req_1", "once"),
        ("ann", "cancel", "", "", ""),
        ("bob", "resume", run_id, "", ""),
    ]
    assert facts[0].at == datetime(2030, 1, 1, tzinfo=UTC)
    assert [f.action for f in await store.list_audit(run_id=run_id)] == ["approve", "resume"]
    assert [f.action for f in await store.list_audit(limit=2)] == ["cancel", "resume"]


async def test_audit_lists_one_action_newest_first_kept(store: Store) -> None:
    run_id, _ = await new_run(store)
    await store.audit("ann", AuditAction.CANCEL, run_id=run_id, detail="asked")
    await store.audit("bob", AuditAction.CANCEL, run_id=run_id, detail="asked again")
    await store.audit("bob", AuditAction.RESUME, run_id=run_id)
    await store.audit("cy", AuditAction.CANCEL, detail="of no run")

    newest = await store.list_audit(run_id=run_id, action=AuditAction.CANCEL, limit=1)
    every = await store.list_audit(run_id=run_id, action=AuditAction.CANCEL)

    assert [(f.actor, f.detail) for f in newest] == [("bob", "asked again")]
    assert [f.actor for f in every] == ["ann", "bob"]


# -- lifecycle ----------------------------------------------------------------------------------


async def test_reopened_store_keeps_everything(backend: Backend) -> None:
    store = await backend.open()
    run_id, epoch = await new_run(store)
    entries = every_entry(run_id)
    for seq, entry in enumerate(entries):
        await store.append(run_id, seq, epoch, entry)
    request = a_request(run_id)
    await store.open_request(request)
    await store.audit("bob", AuditAction.APPROVE, run_id=run_id)
    run_before = await store.get_run(run_id)
    await store.close()

    reopened = await backend.open()

    assert [r.entry for r in await reopened.load(run_id)] == entries
    assert await reopened.get_run(run_id) == run_before
    assert await reopened.get_request(request.id) == (request, RequestStatus.OPEN, None)
    # The journal's deferred call and resume audited themselves as they were appended.
    assert [f.action for f in await reopened.list_audit()] == ["request", "resume", "approve"]
    await reopened.append(run_id, len(entries), epoch, message("after reopen"))


async def test_migrate_is_idempotent(backend: Backend) -> None:
    store = await backend.open()
    run_id, _ = await new_run(store)

    version = await store.migrate()
    again = await store.migrate()
    other = await (await backend.open()).migrate()

    assert version >= 1
    assert version == again == other
    assert (await store.get_run(run_id)).id == run_id


# -- SQLite files -------------------------------------------------------------------------------


async def test_sqlite_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    store = SqliteStore(path)
    version = await store.migrate()
    await store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO schema_version VALUES (?, 'future')", (version + 1,))
    conn.close()

    newer = SqliteStore(path)
    with pytest.raises(StoreError, match="newer") as caught:
        await newer.migrate()
    await newer.close()

    assert str(path) in str(caught.value)
    assert f"schema version {version + 1}" in str(caught.value)


async def test_sqlite_upgrades_an_older_schema_in_place(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.executescript(CREATE_VERSION_TABLE + migration_script(1))
        conn.execute("INSERT INTO sessions VALUES ('s1', 'console', '', '', '2030')")
    conn.close()

    store = SqliteStore(path)
    version = await store.migrate()
    run_id, _ = await new_run(store)
    await store.close()

    assert version == SCHEMA_VERSION > 1
    with sqlite3.connect(path) as conn:
        applied = [row[0] for row in conn.execute("SELECT version FROM schema_version")]
        sessions = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    conn.close()
    assert applied == list(range(1, SCHEMA_VERSION + 1))
    assert sessions == 1
    assert run_id


async def test_sqlite_refuses_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are my notes, not a database\n" * 200)

    store = SqliteStore(path)
    with pytest.raises(StoreError) as caught:
        await store.migrate()
    await store.close()

    assert str(path) in str(caught.value)
    assert "not a database" in str(caught.value)
    assert "\n" not in str(caught.value)


async def test_sqlite_refuses_a_read_only_file(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    store = SqliteStore(path)
    await store.migrate()
    await store.close()
    os.chmod(path, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)

    reopened = SqliteStore(path)
    with pytest.raises(StoreError, match="read-only") as caught:
        await reopened.migrate()
    await reopened.close()

    assert str(path) in str(caught.value)


async def test_sqlite_reports_a_lock_held_past_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    store = SqliteStore(path, busy_timeout=0.2)
    await store.migrate()
    run_id, epoch = await new_run(store)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreError, match="locked") as caught:
            await store.audit("bob", AuditAction.APPROVE)
        with pytest.raises(StoreError, match="locked"):
            await asyncio.wait_for(store.append(run_id, 0, epoch, message("hi")), 10)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()

    assert str(path) in str(caught.value)
    await store.append(run_id, 0, epoch, message("hi"))  # the store recovers once it is free
    await store.close()


async def test_sqlite_appends_wait_out_a_held_lock_in_order(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    store = SqliteStore(path)
    await store.migrate()
    run_id, epoch = await new_run(store)
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    asyncio.get_running_loop().call_later(0.3, blocker.execute, "COMMIT")

    first = [store.submit(run_id, seq, epoch, message(f"m{seq}")) for seq in range(3)]
    # Let the first batch reach the writer's thread and wait on the lock there. That hand-off
    # shows through no store API; if it had not happened yet, m3 would join the first batch
    # and the test would still pass, covering less: the sleep can cost coverage, not a flake.
    await asyncio.sleep(0.1)
    later = store.submit(run_id, 3, epoch, message("m3"))  # queued behind it
    await asyncio.wait_for(asyncio.gather(*first, later), 10)
    blocker.close()

    assert [r.entry for r in await store.load(run_id)] == [message(f"m{i}") for i in range(4)]
    await store.close()


async def test_sqlite_needs_migrate_before_use(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "k.db")
    with pytest.raises(StoreError, match="migrate"):
        await store.get_run("run_1")
    await store.close()


async def test_mark_once_has_one_first_caller(store: Store) -> None:
    results = await asyncio.gather(
        *(store.mark_once("cron:nightly:2026-01-01T03:00") for _ in range(10))
    )
    assert sum(results) == 1
    assert await store.mark_once("cron:nightly:2026-01-02T03:00")


async def test_a_mark_is_read_as_made_by_another_store(backend: Backend) -> None:
    asking, driving = await backend.open(), await backend.open()  # two processes
    assert not await driving.marked("cancel:run_x")

    assert await asking.mark_once("cancel:run_x")

    assert await driving.marked("cancel:run_x")
    assert not await driving.marked("cancel:run_y")


async def test_orphaned_runs_are_running_runs_without_a_live_lease(
    store: Store, clock: FakeClock
) -> None:
    await store.ensure_session(Session(id="ses_o"))
    await store.create_run(RunRecord(id="run_live", session_id="ses_o"), "a", 30)
    await store.create_run(RunRecord(id="run_dead", session_id="ses_o"), "b", 5)
    assert await store.orphaned_runs() == []
    clock.advance(10)
    assert await store.orphaned_runs() == ["run_dead"]
    epoch = await store.claim("run_dead", "c", 30)
    assert epoch is not None
    assert await store.orphaned_runs() == []


async def test_a_running_run_whose_resume_was_refused_is_no_orphan(
    store: Store, clock: FakeClock
) -> None:
    run_id, epoch = await new_run(store, owner="w1")
    for seq, entry in enumerate(every_entry(run_id)[:3]):
        await store.append(run_id, seq, epoch, entry)
    clock.advance(LEASE + 1)  # w1 died mid-run
    assert await store.orphaned_runs() == [run_id]
    taken = await store.claim(run_id, "w2", 30)
    assert taken is not None

    # w2's resume was refused (it takes --force): the run waits for a person.
    await store.release(run_id, "w2", taken)

    assert await store.orphaned_runs() == []


async def test_a_suspended_run_whose_decider_died_is_an_orphan(
    store: Store, clock: FakeClock
) -> None:
    run_id, epoch = await new_run(store, owner="w1")
    request = a_request(run_id)
    entries = [
        *every_entry(run_id)[:3],
        ToolDeferred(call_id="call_1", tool="restart_service", request=request),
        RunSuspended(reason=StopReason.WAITING, request_ids=(request.id,)),
    ]
    for seq, entry in enumerate(entries):
        await store.append(run_id, seq, epoch, entry)
    assert await store.orphaned_runs() == []  # suspended and released: it waits for people
    decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="bob", at=AT)
    settled = await store.decide_and_claim(
        decision, RequestStatus.ANSWERED, Audited("bob", AuditAction.APPROVE), "w2", 5
    )
    assert settled.epoch is not None
    assert await store.orphaned_runs() == []  # w2 is about to resume it

    clock.advance(10)  # ... and died before it could

    assert await store.orphaned_runs() == [run_id]


async def test_a_run_answered_while_it_ran_then_suspended_is_an_orphan(store: Store) -> None:
    run_id, epoch = await new_run(store, owner="w1")
    request = a_request(run_id)
    entries = [
        *every_entry(run_id)[:3],
        ToolDeferred(call_id="call_1", tool="restart_service", request=request),
    ]
    for seq, entry in enumerate(entries):
        await store.append(run_id, seq, epoch, entry)
    decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="bob", at=AT)
    settled = await store.decide_and_claim(
        decision, RequestStatus.ANSWERED, Audited("bob", AuditAction.APPROVE), "w2", 5
    )
    assert settled.won and settled.epoch is None  # w1 still ran it: w1 goes on with it
    suspended = RunSuspended(reason=StopReason.WAITING, request_ids=(request.id,))
    await store.append(run_id, len(entries), epoch, suspended)

    # Released and answered: w1 resumes it at once, unless it died as it suspended.
    assert await store.orphaned_runs() == [run_id]


async def test_a_run_whose_decider_gave_its_resume_up_is_no_orphan(store: Store) -> None:
    run_id, epoch = await new_run(store, owner="w1")
    request = a_request(run_id)
    entries = [
        *every_entry(run_id)[:3],
        ToolDeferred(call_id="call_1", tool="restart_service", request=request),
        RunSuspended(reason=StopReason.WAITING, request_ids=(request.id,)),
    ]
    for seq, entry in enumerate(entries):
        await store.append(run_id, seq, epoch, entry)
    decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="bob", at=AT)
    settled = await store.decide_and_claim(
        decision, RequestStatus.ANSWERED, Audited("bob", AuditAction.APPROVE), "w2", 5
    )
    assert settled.epoch is not None
    # w2's resume was refused (the model changed: it takes --force) and gave the lease back:
    # the run waits for someone to resume it, and no sweep tries again and again.
    await store.release(run_id, "w2", settled.epoch)

    assert await store.orphaned_runs() == []


async def test_a_run_stopped_on_a_signal_is_no_orphan(store: Store) -> None:
    run_id, epoch = await new_run(store, owner="w1")
    entries = [
        *every_entry(run_id)[:3],
        RunSuspended(reason=StopReason.INTERRUPTED),
    ]
    for seq, entry in enumerate(entries):
        await store.append(run_id, seq, epoch, entry)

    assert await store.orphaned_runs() == []  # handed back as work, or resumed by whoever


async def test_a_run_handed_back_is_an_orphan_until_claimed(store: Store) -> None:
    run_id, epoch = await new_run(store, owner="w1")
    entries = [*every_entry(run_id)[:3], RunSuspended(reason=StopReason.HANDED_BACK)]
    for seq, entry in enumerate(entries):
        await store.append(run_id, seq, epoch, entry)

    # Its stopping replica may have died before it queued the resume: a sweep takes it.
    assert await store.orphaned_runs() == [run_id]
    taken = await store.claim(run_id, "w2", 30)
    assert taken is not None
    assert await store.orphaned_runs() == []
    # w2's resume was refused (it takes --force): the run waits for a person.
    await store.release(run_id, "w2", taken)
    assert await store.orphaned_runs() == []


async def test_a_run_handed_back_is_claimed_by_one_of_its_racing_takers(
    backend: Backend,
) -> None:
    # Its resume's work item and every replica's sweep find it at once: one lease taker.
    stores = [await backend.open() for _ in range(3)]
    for attempt in range(5):
        run_id, epoch = await new_run(stores[0], owner="w0")
        entries = [*every_entry(run_id)[:3], RunSuspended(reason=StopReason.HANDED_BACK)]
        for seq, entry in enumerate(entries):
            await stores[0].append(run_id, seq, epoch, entry)
        assert await stores[1].orphaned_runs() == [run_id], attempt

        taken = await asyncio.gather(
            *(store.claim(run_id, f"w{i + 1}", LEASE) for i, store in enumerate(stores))
        )

        assert [t for t in taken if t is not None] == [epoch + 1], attempt
        assert await stores[2].orphaned_runs() == [], attempt


async def test_a_run_handed_back_with_a_question_open_is_no_orphan(store: Store) -> None:
    run_id, epoch = await new_run(store, owner="w1")
    request = a_request(run_id)
    entries = [
        *every_entry(run_id)[:3],
        ToolDeferred(call_id="call_1", tool="restart_service", request=request),
        RunSuspended(reason=StopReason.HANDED_BACK, request_ids=(request.id,)),
    ]
    for seq, entry in enumerate(entries):
        await store.append(run_id, seq, epoch, entry)

    assert await store.orphaned_runs() == []  # the answer's decider resumes it


async def test_deciders_racing_on_one_run_leave_exactly_one_lease_taker(
    backend: Backend,
) -> None:
    first_store, second_store = await backend.open(), await backend.open()
    for attempt in range(5):
        run_id, epoch = await new_run(first_store, owner="w0")
        requests = [a_request(run_id, call_id=f"call_{i}") for i in range(2)]
        entries = [
            *every_entry(run_id)[:3],
            *(ToolDeferred(call_id=r.call_id, tool=r.tool, request=r) for r in requests),
            RunSuspended(reason=StopReason.WAITING, request_ids=tuple(r.id for r in requests)),
        ]
        for seq, entry in enumerate(entries):
            await first_store.append(run_id, seq, epoch, entry)

        settled = await asyncio.gather(
            *(
                store.decide_and_claim(
                    Decision(request_id=r.id, kind=DecisionKind.APPROVE, by=f"u{i}"),
                    RequestStatus.ANSWERED,
                    Audited(f"u{i}", AuditAction.APPROVE),
                    f"w{i + 1}",
                    LEASE,
                )
                for i, (store, r) in enumerate(
                    zip((first_store, second_store), requests, strict=True)
                )
            )
        )

        assert all(s.won for s in settled), attempt
        assert [s.epoch for s in settled if s.epoch is not None] == [epoch + 1], attempt


async def test_a_suspended_run_whose_canceller_died_is_no_orphan(
    store: Store, clock: FakeClock
) -> None:
    run_id, epoch = await new_run(store, owner="w1")
    request = a_request(run_id)
    entries = [
        *every_entry(run_id)[:3],
        ToolDeferred(call_id="call_1", tool="restart_service", request=request),
        RunSuspended(reason=StopReason.WAITING, request_ids=(request.id,)),
    ]
    for seq, entry in enumerate(entries):
        await store.append(run_id, seq, epoch, entry)
    # A canceller takes the lease and dies before closing the requests, then after closing them.
    assert await store.claim(run_id, "w2", 5) is not None
    clock.advance(10)
    assert await store.orphaned_runs() == []
    cancel = Decision(request_id=request.id, kind=DecisionKind.DENY, by="ann", at=AT)
    assert await store.decide(cancel, RequestStatus.CANCELLED)

    assert await store.orphaned_runs() == []


async def test_a_flush_tells_what_landed_before_an_entry_that_failed(store: Store) -> None:
    # A store may commit a flush's entries one by one (PostgreSQL): the ones that landed
    # before a failing one are durable, and whoever waits to say so (a card) is told.
    run_id, epoch = await new_run(store)
    first, second, third = every_entry(run_id)[:3]
    for seq, entry in enumerate((first, second, third)):
        await store.append(run_id, seq, epoch, entry)
    # A journal a step behind: its next entry is already there, the one after clashes.
    journal = RunJournal(store, fold((await store.load(run_id))[:1], run_id), epoch)
    told: list[str] = []

    journal.append_soon(second, then=lambda: told.append("landed"))
    journal.append_soon(first, then=lambda: told.append("clashed"))
    with pytest.raises(SeqConflict):
        await journal.flush()

    assert told == ["landed"]


async def test_a_delivery_is_accepted_once_with_its_work(
    backend: Backend, clock: FakeClock
) -> None:
    first_store, second_store = await backend.open(), await backend.open()
    delivery = {"platform": "slack", "event": {"ts": "171.5"}}

    work_id = await first_store.accept_delivery("inbound:slack:T1:C1:171.5", delivery, "w1")
    repeats = await asyncio.gather(
        first_store.accept_delivery("inbound:slack:T1:C1:171.5", delivery, "w1"),
        second_store.accept_delivery("inbound:slack:T1:C1:171.5", delivery, "w2"),
    )

    assert work_id is not None and list(repeats) == [None, None]
    assert not await second_store.mark_once("inbound:slack:T1:C1:171.5")
    # Taken by its acceptor: another replica retakes it only once the acceptor is long gone.
    assert await second_store.take_work("w2", retake_after=30) == []
    clock.advance(31)
    retaken = await second_store.take_work("w2", retake_after=30)
    assert [(item.id, item.kind, item.payload) for item in retaken] == [
        (work_id, "inbound", delivery)
    ]


async def test_an_occurrence_is_claimed_once_with_its_start(
    backend: Backend, clock: FakeClock
) -> None:
    first_store, second_store = await backend.open(), await backend.open()
    start = {"run_id": "run_1", "prompt": "check the backups"}

    claims = await asyncio.gather(
        first_store.take_once("cron:nightly:2026-01-02T03:00", "start", start, "w1"),
        second_store.take_once("cron:nightly:2026-01-02T03:00", "start", start, "w2"),
    )

    (work_id,) = [claim for claim in claims if claim is not None]
    assert claims.count(None) == 1
    # The claimer's: another replica takes the start only once the claimer is long gone.
    assert await second_store.take_work("w3", retake_after=30) == []
    clock.advance(31)
    retaken = await second_store.take_work("w3", retake_after=30)
    assert [(item.id, item.kind, item.payload) for item in retaken] == [(work_id, "start", start)]


async def test_an_occurrence_claimed_under_one_of_its_keys_is_not_claimed_under_another(
    backend: Backend,
) -> None:
    # A renamed prompt (new name, same schedule and text) shares its occurrence's second key.
    first_store, second_store = await backend.open(), await backend.open()
    start = {"run_id": "run_1", "prompt": "check the backups"}
    at = "2026-01-02T03:00"

    claims = await asyncio.gather(
        first_store.take_once(f"cron:old:{at}", "start", start, "w1", also=(f"cron-text:D:{at}",)),
        second_store.take_once(f"cron:new:{at}", "start", start, "w2", also=(f"cron-text:D:{at}",)),
    )

    assert claims.count(None) == 1, claims
    # The refused claim marked nothing: its own name's key is still free.
    assert await second_store.take_work("w3") == []
    assert not await first_store.marked(f"cron:{'new' if claims[1] is None else 'old'}:{at}")


async def test_a_key_is_first_marked_once_and_every_caller_reads_that_time(
    backend: Backend,
) -> None:
    first_store, second_store = await backend.open(), await backend.open()
    early = datetime(2026, 1, 2, 9, 2, 0, 123456, tzinfo=UTC)
    later = early + timedelta(minutes=5)

    nightly, other = "cron-seen:name:nightly", "cron-seen:name:other"

    seen = await asyncio.gather(
        first_store.first_marked([nightly], early),
        second_store.first_marked([nightly], early + timedelta(seconds=1)),
    )

    assert seen[0] == seen[1] and seen[0][nightly] in (early, early + timedelta(seconds=1)), seen
    both = await second_store.first_marked([nightly, other], later)
    assert both == {nightly: seen[0][nightly], other: later}
    assert await first_store.marked(nightly) and await first_store.marked(other)
    assert await first_store.first_marked([], later) == {}


async def test_stores_marking_keys_in_opposite_orders_both_finish(backend: Backend) -> None:
    # Replicas of a rolling update that reordered the schedules mark when they first saw the
    # prompts, each in its own order, at the same moment: neither may wait on the other.
    first_store, second_store = await backend.open(), await backend.open()
    at = datetime(2026, 1, 2, 9, 2, tzinfo=UTC)
    for round_ in range(5):
        keys = [f"cron-seen:text:{round_}:{n:04}" for n in range(400)]
        seen = await asyncio.gather(
            first_store.first_marked(keys, at), second_store.first_marked(keys[::-1], at)
        )
        assert seen[0] == seen[1] == dict.fromkeys(keys, at)


# -- what a run's end owes ----------------------------------------------------------------------


async def test_a_chat_run_ends_with_its_answer_owed_to_its_platform(store: Store) -> None:
    run_id, epoch = await new_run(store)
    await store.ensure_session(Session(id="s2", platform="console"))
    console_run = new_id("run")
    await store.create_run(RunRecord(id=console_run, session_id="s2"), "w1", LEASE)
    result = TerminalResult(status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED)

    await store.append(run_id, 0, epoch, RunEnded(result=result))
    await store.append(console_run, 0, 1, RunEnded(result=result))

    owed = await store.claim_messages("w1", LEASE)
    assert [(m.key, m.platform, m.target, m.body) for m in owed] == [
        (f"slack:answer:{run_id}", "slack", {}, {"owed": "answer", "run_id": run_id})
    ]
    # The renderer's first put gives the owed message its target and body.
    target = {"channel": "C1", "thread_ts": "T1"}
    assert await store.put_message(owed[0].key, "slack", target, {"text": "Done."}) == 2
    shown = await store.get_message(owed[0].key)
    assert shown is not None and (shown.target, shown.body) == (target, {"text": "Done."})


async def test_a_decision_owes_again_only_the_card_in_the_outbox(store: Store) -> None:
    # A card is owed again where the outbox holds it: a chat run's (owed with its request),
    # and a console run's only if a renderer put it there; a losing decision owes nothing.
    chat_run, epoch = await new_run(store)
    await store.ensure_session(Session(id="s2", platform="console"))
    console_run = new_id("run")
    await store.create_run(RunRecord(id=console_run, session_id="s2"), "w1", LEASE)
    requests = {run_id: a_request(run_id) for run_id in (chat_run, console_run)}
    for run_id, epoch_ in ((chat_run, epoch), (console_run, 1)):
        request = requests[run_id]
        await store.append(run_id, 0, epoch_, ToolDeferred(call_id="c", tool="t", request=request))
    chat_card, console_card = (
        f"{p}:card:{requests[r].id}" for p, r in (("slack", chat_run), ("console", console_run))
    )
    assert await store.get_message(console_card) is None

    for request in requests.values():
        won = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="bob", at=AT)
        assert await store.decide(won, RequestStatus.ANSWERED)
    assert await store.get_message(console_card) is None
    assert (await message_version(store, chat_card)) == 2

    late = a_request(console_run, call_id="call_2")
    await store.open_request(late)
    late_card = f"console:card:{late.id}"
    await store.put_message(late_card, "console", {}, {"text": "Restart web?"})
    lost = Decision(request_id=late.id, kind=DecisionKind.DENY, by="eve", at=AT)
    won = Decision(request_id=late.id, kind=DecisionKind.APPROVE, by="bob", at=AT)
    assert await store.decide(won, RequestStatus.ANSWERED)
    assert not await store.decide(lost, RequestStatus.ANSWERED)
    shown = await store.get_message(late_card)
    assert shown is not None and (shown.version, shown.body) == (2, owed_card(late.id))


async def message_version(store: Store, key: str) -> int:
    """The version of message ``key``, which must be in the outbox."""
    found = await store.get_message(key)
    assert found is not None
    return found.version


async def test_the_schema_version_read_is_the_one_migrate_reached(store: Store) -> None:
    # Readiness compares it with the version a replica started with (bot/replica/health.py).
    assert await store.schema_version() == await store.migrate() > 0
