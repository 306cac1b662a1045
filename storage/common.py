"""What the SQLite and PostgreSQL stores share: rows to and from the domain, projections, error
kinds."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from enum import Enum
from typing import Any, Final

import msgspec

from bot import wire
from bot.chat.outbox_keys import answer_key, card_key, owed_answer, owed_card
from bot.domain import Decision, Request, RequestStatus, RunStatus
from bot.errors import (
    SeqConflict,
    SeqGap,
    StaleEpoch,
    StoreError,
    UnknownRun,
    UnreadableJournal,
    UnreadableRow,
)
from bot.journal.decode import decode_entry
from bot.journal.entries import (
    Entry,
    RunResumed,
    status_after,
)
from bot.journal.log import JournalRecord, JournalTally
from bot.kinds import AuditAction
from bot.people.audit import request_detail
from bot.records import WORK_KINDS, OutboxMessage, Replica, RunRecord, WorkItem
from storage import sql
from storage.sql import Step

# Reads a stored timestamp (ISO text in SQLite, a datetime in PostgreSQL) as an aware datetime.
Timestamp = Callable[[Any], datetime]


class Violation(Enum):
    """Which constraint refused a write, as both drivers report it."""

    FOREIGN_KEY = "foreign key"
    OTHER = "other"


# Turns a constraint violation into the error its caller reports.
Refusal = Callable[[Violation], StoreError]


class AuditEntry(msgspec.Struct, frozen=True):
    """One audited fact as stored."""

    at: datetime
    actor: str
    action: str
    run_id: str
    request_id: str
    detail: str


class Projection(msgspec.Struct, frozen=True):
    """How an entry moves its run's row, written in the transaction that appends it."""

    status: RunStatus
    stop_reason: str
    # A suspended or ended run has no task driving it: its lease is given up with the entry
    # that says so, saving the owner a write of its own.
    releases: bool


def projection(entry: Entry) -> Projection | None:
    """How an entry moves the run's status, stop reason and lease, if it moves them."""
    status = status_after(entry)
    if status is None:
        return None
    releases = status is not RunStatus.RUNNING
    if entry.kind == "run_suspended":
        return Projection(status, entry.reason.value, releases)
    if entry.kind == "run_ended":
        return Projection(status, entry.result.stop_reason.value, releases)
    return Projection(status, "", releases)


def tally_from_rows(rows: Sequence[Sequence[Any]], stop: int) -> JournalTally:
    """``sql.JOURNAL_TALLY``'s rows (one per kind and tool outcome) as one tally."""
    kinds: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    tokens = [0, 0]
    iterations = 0
    started: list[int] = []
    turns: list[int] = []
    texts: list[int] = []
    changes: list[int] = []
    for kind, outcome, count, inputs, outputs, iteration, first, turn, text, changed in rows:
        kinds[kind] = kinds.get(kind, 0) + int(count)
        if outcome is not None:
            outcomes[str(outcome)] = outcomes.get(str(outcome), 0) + int(count)
        tokens[0] += int(inputs or 0)
        tokens[1] += int(outputs or 0)
        if iteration is not None:
            iterations = max(iterations, int(iteration) + 1)
        started.extend(int(seq) for seq in (first,) if seq is not None)
        turns.extend(int(seq) for seq in (turn,) if seq is not None)
        texts.extend(int(seq) for seq in (text,) if seq is not None)
        changes.extend(int(seq) for seq in (changed,) if seq is not None)
    return JournalTally(
        stop=stop,
        kinds=kinds,
        outcomes=outcomes,
        input_tokens=tokens[0],
        output_tokens=tokens[1],
        iterations=iterations,
        started_seq=min(started, default=None),
        last_turn_seq=max(turns, default=None),
        last_text_seq=max(texts, default=None),
        changed_seq=max(changes, default=None),
    )


def entry_body(entry: Entry) -> str:
    """The entry as stored: JSON text that reads back as the same kind of entry.

    Structs are not checked as they are built, and a plugin's code (a tool, a hook) is not
    type-checked with Kestrel's: a value of the wrong type is refused here, before the journal
    holds an entry that no process could read."""
    try:
        return wire.checked_json(entry)  # its own kind only: the union's decoder is larger
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise StoreError(f"a {entry.kind} entry would not read back: {exc}") from exc


def record(run_id: str, seq: int, epoch: int, body: str) -> JournalRecord:
    """A stored journal row as a record; an unreadable body is an ``UnreadableJournal``."""
    try:
        entry = decode_entry(body)
    except wire.Unreadable as exc:
        raise UnreadableJournal(
            f"run {run_id!r}: journal entry at seq {seq} is unreadable: {exc}"
        ) from exc
    return JournalRecord(run_id=run_id, seq=seq, epoch=epoch, entry=entry)


def whole(run_id: str, records: list[JournalRecord]) -> list[JournalRecord]:
    """``records``, a run's whole journal read in order, once its seqs run 0, 1, 2… with none
    missing (a row deleted, a partial copy): read past, a lost dispatch record would let its
    effect run again. Distinct and ascending, they do when the last is one less than their
    count; only then is each looked at, for the message."""
    if not records or records[-1].seq == len(records) - 1:
        return records
    missing = next(n for n, each in enumerate(records) if each.seq != n)
    raise UnreadableJournal(f"run {run_id!r}: journal entry at seq {missing} is missing")


def diagnose(
    run_id: str, seq: int, epoch: int, body: str, row: Sequence[Any] | None
) -> StoreError | None:
    """Why an append did not land, from (epoch, body at seq, next seq): None if identical."""
    if row is None:
        return UnknownRun(f"unknown run {run_id!r}")
    current, stored, next_seq = row
    if stored == body:
        return None
    # Fencing first: a stale owner learns it lost the run, whatever now stands at its seq.
    if current != epoch:
        return StaleEpoch(f"run {run_id!r}: epoch {epoch} is stale, the run is at epoch {current}")
    if stored is not None:
        return SeqConflict(f"run {run_id!r}: a different record stands at seq {seq}")
    return SeqGap(f"run {run_id!r}: seq {seq} would leave a gap; next is {next_seq}")


def new_run_row(
    run: RunRecord, owner: str, lease_expires: datetime, stamp: Callable[[datetime], Any]
) -> tuple[Any, ...]:
    """The values of a new run's row at epoch 1: ``RUN_COLUMNS`` without the epoch."""
    return (
        run.id,
        run.session_id,
        run.prompt,
        run.requested_by,
        run.status.value,
        run.stop_reason,
        owner,
        stamp(lease_expires),
        stamp(run.created_at),
        stamp(run.updated_at),
    )


_RUN_TEXT_COLUMNS: Final = (
    "id",
    "session_id",
    "prompt",
    "requested_by",
    "status",
    "stop_reason",
    "owner",
    "epoch",
)


def run_from_row(row: Sequence[Any], timestamp: Timestamp) -> RunRecord:
    """A run from a row of ``RUN_COLUMNS``; an unreadable one is an ``UnreadableRow`` naming
    it."""
    try:
        stamps = {
            "lease_expires": None if row[8] is None else timestamp(row[8]),
            "created_at": timestamp(row[9]),
            "updated_at": timestamp(row[10]),
        }
        # Converted, not built: the conversion checks each column's type, as a row of another
        # writer (or a hand edit) may hold anything.
        return wire.from_plain(
            dict(zip(_RUN_TEXT_COLUMNS, row[:8], strict=True)) | stamps, RunRecord
        )
    except (TypeError, ValueError) as exc:
        raise UnreadableRow(f"run {row[0]}: unreadable: {exc}") from exc


def request_from_row(row: Sequence[Any]) -> tuple[Request, RequestStatus, Decision | None]:
    """A request, its status and its decision from an (id, body, status, decision) row; an
    unreadable one is an ``UnreadableRow`` naming it."""
    request_id, body, status, decision = row
    try:
        return (
            wire.from_json(body, Request),
            RequestStatus(status),
            None if decision is None else wire.from_json(decision, Decision),
        )
    except ValueError as exc:
        raise UnreadableRow(f"request {request_id}: unreadable: {exc}") from exc


def work_payload(kind: str, payload: dict[str, Any]) -> str:
    """The payload as JSON text, once ``kind`` is one a ``WorkItem`` can carry."""
    # Checked before the insert: an item nobody can decode would fail every later take.
    if kind not in WORK_KINDS:
        raise ValueError(f"work kind must be one of {sorted(WORK_KINDS)}, got {kind!r}")
    return json.dumps(payload, allow_nan=False)


def work_from_row(row: Sequence[Any], timestamp: Timestamp) -> WorkItem:
    """A work item from an (id, kind, payload JSON text, created_at) row."""
    work_id, kind, payload, created_at = row
    try:
        fields = {"id": work_id, "kind": kind, "payload": json.loads(payload)}
        # Converted, as a run's row is: a kind no taker knows is named here, not taken.
        return wire.from_plain(fields | {"created_at": timestamp(created_at)}, WorkItem)
    except ValueError as exc:
        raise StoreError(f"work item {work_id}: unreadable: {exc}") from exc


def outbox_json(value: dict[str, Any]) -> str:
    """A message's target or body as JSON text in one spelling (keys sorted), so that equal
    bodies are equal text: the store compares stored bodies as text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def outbox_from_row(row: Sequence[Any], timestamp: Timestamp) -> OutboxMessage:
    """A message from a row of the outbox columns that ``storage.sql`` reads."""
    key, platform, target, body, version, delivered, ref, attempts = row[:8]
    due_at, error, created_at, updated_at = row[8:]
    try:
        fields = {
            "key": key,
            "platform": platform,
            "target": json.loads(target),
            "body": json.loads(body),
            "version": version,
            "delivered_version": delivered,
            "ref": ref,
            "attempts": attempts,
            "next_attempt_at": timestamp(due_at),
            "error": error,
            "created_at": timestamp(created_at),
            "updated_at": timestamp(updated_at),
        }
        return wire.from_plain(fields, OutboxMessage)
    except ValueError as exc:
        raise StoreError(f"outbox message {key!r}: unreadable: {exc}") from exc


def replicas_from_rows(rows: Iterable[Sequence[Any]], timestamp: Timestamp) -> list[Replica]:
    """Replicas from ``sql.LIST_REPLICAS`` rows, ordered by owner."""
    found: dict[str, tuple[Sequence[Any], list[tuple[str, datetime | None]]]] = {}
    for row in rows:
        _, runs = found.setdefault(row[0], (row, []))
        if row[4] is not None:
            runs.append((row[4], None if row[5] is None else timestamp(row[5])))
    return [
        Replica(
            owner=owner,
            info=head[1],
            started_at=timestamp(head[2]),
            last_seen=timestamp(head[3]),
            runs=tuple(runs),
        )
        for owner, (head, runs) in sorted(found.items())
    ]


async def wait_for_event(event: asyncio.Event, timeout: float) -> None:
    """Return once ``event`` is set (clearing it for the next wait) or after ``timeout``."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), max(timeout, 0.0))
    event.clear()


# -- what an entry writes beside the journal ------------------------------------------------------


def request_row(request: Request, stamp: Callable[[datetime], Any]) -> tuple[Any, ...]:
    """``OPEN_REQUEST``'s parameters for an open ``request``."""
    deadline = None if request.deadline is None else stamp(request.deadline)
    return (
        request.id,
        request.run_id,
        request.kind.value,
        request.call_id,
        request.tool,
        wire.to_json(request),
        RequestStatus.OPEN.value,
        stamp(request.created_at),
        deadline,
    )


# By ``kind``: every append asks, and a failed ``isinstance`` of a pydantic model is slow.
_WRITE_BESIDE: Final = frozenset({"tool_deferred", "run_resumed", "run_ended"})


def beside_entry(
    run_id: str, entry: Entry, now: Callable[[], Any], stamp: Callable[[datetime], Any]
) -> list[Step]:
    """The rows an entry writes in the transaction that appends it, besides its run's status:
    a deferred call opens its request, audited, and owes its card to the run's thread; a resume
    is audited; an end owes the run's answer to its thread (each owed message is a placeholder
    in the outbox that a renderer of the thread's platform fills in).
    Written with the entry, they exist exactly when it does, and a stale owner (whose append is
    refused) writes none.
    ``now`` (the audit's time, as stored) is asked only when there is something to write."""
    if entry.kind not in _WRITE_BESIDE:
        return []
    at = now()
    if entry.kind == "tool_deferred":
        request = entry.request
        detail = request_detail(request)
        actor = request.requested_by or "run"
        owed = outbox_json(owed_card(request.id))
        return [
            (sql.OPEN_REQUEST, request_row(request, stamp)),
            (sql.AUDIT, (at, actor, AuditAction.REQUEST.value, run_id, request.id, detail)),
            (sql.OWE_MESSAGE, (run_id, card_key(request.id), owed, at)),
        ]
    if entry.kind == "run_ended":
        owed = outbox_json(owed_answer(run_id))
        return [(sql.OWE_MESSAGE, (run_id, answer_key(run_id), owed, at))]
    assert entry.kind == "run_resumed"
    return [
        (
            sql.AUDIT,
            (
                at,
                entry.by or entry.owner,
                AuditAction.RESUME.value,
                run_id,
                "",
                resume_detail(entry),
            ),
        )
    ]


def resume_detail(entry: RunResumed) -> str:
    """What the audit says of a resume besides who asked for it: the process that drives the
    run now, and whether it was forced or taken from another."""
    parts = [f"on {entry.owner}"] if entry.by and entry.owner else []
    parts += ["forced"] if entry.forced else []
    parts += [f"taken over from {entry.taken_over_from}"] if entry.taken_over_from else []
    return ", ".join(parts)
