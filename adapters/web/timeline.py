"""What the run pages show, as plain data: a run's header and timeline, the run list, the open
requests. Pure functions of what ``ChatService`` returns; no server, no templates.

``build_run_page`` walks the journal once, in order, and turns it into typed items the
template iterates: each model turn with its calls (a call carries its exact arguments and,
once the journal has it, its output and the exit it took through executeTool), each request
with who may answer it and every audited decision on it, suspends and resumes, advisories, and
the terminal result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from bot.chat.contract import EVERYONE, AuditRecord, Entry, JournalRecord, RunRecord
from bot.chat.service import PendingRequest, RequestView, RunView
from bot.chat.words import Thread, thread_of
from bot.domain import (
    TERMINAL_STATUSES,
    Budgets,
    Decision,
    Grant,
    Request,
    RequestStatus,
    RunStatus,
    TerminalResult,
    Usage,
)
from bot.text import instruction_like, invisibles_named

# An output longer than this (characters or lines) is collapsed under a <details>.
# A page stays small whatever the run did: each output or argument block is cut at
# SHOWN_CHARS, and only the last SHOWN_ITEMS entries of the timeline are shown.
SHOWN_CHARS = 65_536
SHOWN_ITEMS = 400
LONG_OUTPUT_CHARS = 600
LONG_OUTPUT_LINES = 12
# JSON this short shows on one line.
SHORT_JSON_CHARS = 72

STATUSES: tuple[str, ...] = tuple(status.value for status in RunStatus)


# --- the timeline's items ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One audited fact (who did what, when, and the detail: a digest or a refusal)."""

    at: datetime
    actor: str
    action: str
    request_id: str
    detail: str

    @classmethod
    def of(cls, record: AuditRecord) -> AuditRow:
        """A copy of the store's record."""
        return cls(record.at, record.actor, record.action, record.request_id, record.detail)


@dataclass(slots=True)
class Call:
    """One tool call of a model turn, with its outcome once the journal has one."""

    seq: int  # the turn's
    call_id: str
    tool: str
    arguments: str  # pretty JSON (or the raw text if it is not JSON)
    outcome: str | None = None  # a ToolOutcome value once answered
    output: str | None = None
    is_error: bool = False
    result_seq: int | None = None
    duration: float | None = None  # seconds, when the journal records it
    dispatched: bool = False  # a non-idempotent effect was started
    process: str = ""  # where its processes ran
    request_id: str = ""  # the latest request it was deferred on
    later: bool = False  # the page ends before its result could come: a newer page may have it

    @property
    def state(self) -> str:
        """The exit it took, or where it stands without one."""
        if self.outcome is not None:
            return self.outcome
        if self.request_id:
            return "deferred"
        if self.later:
            return "on a newer page"
        return "dispatched" if self.dispatched else "no result"

    @property
    def instruction_like(self) -> bool:
        """Whether its output holds instruction-like text (``bot.text.instruction_like``)."""
        return self.output is not None and instruction_like(self.output)

    @property
    def long(self) -> bool:
        """Whether its output is collapsed."""
        output = self.output or ""
        return len(output) > LONG_OUTPUT_CHARS or output.count("\n") >= LONG_OUTPUT_LINES

    @property
    def long_arguments(self) -> bool:
        """Whether its arguments are collapsed."""
        arguments = self.arguments
        return len(arguments) > LONG_OUTPUT_CHARS or arguments.count("\n") >= LONG_OUTPUT_LINES

    @property
    def output_lines(self) -> int:
        """Lines of output."""
        output = self.output or ""
        return output.count("\n") + (0 if output.endswith("\n") or not output else 1)


@dataclass(frozen=True, slots=True)
class Started:
    """The run started: with what model and budgets, for whom."""

    kind: ClassVar[str] = "started"
    seq: int
    at: datetime
    provider: str
    model: str
    requested_by: str
    budgets: Budgets
    has_prompter: bool
    history: int


@dataclass(frozen=True, slots=True)
class UserText:
    """A human message entering the conversation (after hooks and the PII guard)."""

    kind: ClassVar[str] = "user"
    seq: int
    text: str
    by: str


@dataclass(frozen=True, slots=True)
class Turn:
    """A model reply: its text and its calls."""

    kind: ClassVar[str] = "turn"
    seq: int
    iteration: int
    text: str
    finish_reason: str
    usage: Usage
    calls: list[Call]


@dataclass(frozen=True, slots=True)
class Orphan:
    """A result whose call is not in the turn before it (it should not happen; shown anyway)."""

    kind: ClassVar[str] = "orphan"
    seq: int
    call: Call


@dataclass(frozen=True, slots=True)
class RequestItem:
    """A call deferred on a request: who may answer, by when, and what was decided."""

    kind: ClassVar[str] = "request"
    seq: int
    request: Request
    status: str
    decision: Decision | None
    may_answer: tuple[str, ...]
    reason: str
    decisions: tuple[AuditRow, ...]
    approvers: tuple[str, ...] = ()  # of one several approved, first approver first
    phrase: str = ""  # who may answer, in the words of ``kestrel runs pending``

    @property
    def deciders(self) -> str:
        """Who decided it: everyone who approved it, or the one who decided."""
        if self.approvers:
            return ", ".join(self.approvers)
        return self.decision.by if self.decision is not None else ""


@dataclass(frozen=True, slots=True)
class AnswerItem:
    """The run took a decision from ``Decisions``."""

    kind: ClassVar[str] = "answer"
    seq: int
    decision: Decision


@dataclass(frozen=True, slots=True)
class GrantItem:
    """A grant to run a gated call (one call, or the tool for the rest of the run)."""

    kind: ClassVar[str] = "grant"
    seq: int
    grant: Grant


@dataclass(frozen=True, slots=True)
class Suspended:
    """The run's task ended; it waits for requests or a resume."""

    kind: ClassVar[str] = "suspended"
    seq: int
    reason: str
    request_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Resumed:
    """A task picked the run up again (perhaps taking it over from a dead replica)."""

    kind: ClassVar[str] = "resumed"
    seq: int
    owner: str
    forced: bool
    taken_over_from: str
    model: str = ""  # a forced resume's: the model the run went on with


@dataclass(frozen=True, slots=True)
class Advisory:
    """Something the operator should know, kept out of the model's context."""

    kind: ClassVar[str] = "advisory"
    seq: int
    text: str


@dataclass(frozen=True, slots=True)
class Ended:
    """The terminal result: its text and its structured payload apart."""

    kind: ClassVar[str] = "ended"
    seq: int
    result: TerminalResult
    payload: str | None  # pretty JSON


Item = (
    Started
    | UserText
    | Turn
    | Orphan
    | RequestItem
    | AnswerItem
    | GrantItem
    | Suspended
    | Resumed
    | Advisory
    | Ended
)


@dataclass(frozen=True, slots=True)
class Budget:
    """One budget: how much was used of how much (a limit of 0: none)."""

    name: str
    used: int | float
    limit: int | float

    @property
    def percent(self) -> int:
        """Used as a share of the limit, 0 to 100 (0 without a limit)."""
        if not self.limit:
            return 0
        return max(0, min(100, round(100 * self.used / self.limit)))


@dataclass(frozen=True, slots=True)
class RunPage:
    """Everything ``/runs/{id}`` shows."""

    record: RunRecord
    thread: Thread
    provider: str
    model: str
    stop_reason: str
    budgets: tuple[Budget, ...]
    deadline_seconds: float
    items: list[Item]
    requests: tuple[RequestView, ...]
    audit: tuple[AuditRow, ...]
    result: TerminalResult | None
    payload: str | None
    next_seq: int
    version: str
    calls: int = 0
    outcomes: Mapping[str, int] = field(default_factory=dict)
    hidden_items: int = 0  # the earliest entries left out (see SHOWN_ITEMS)
    first_seq: int = 0  # the first entry shown: earlier ones are on older pages
    stop: int = 0  # after the last entry shown

    @property
    def newest(self) -> bool:
        """Whether the page shows the journal's newest entries."""
        return self.stop >= self.next_seq

    @property
    def polls(self) -> bool:
        """Whether the page updates itself: the newest page of a live run."""
        return self.live and self.newest

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.record.id

    @property
    def live(self) -> bool:
        """Whether the run may still change (running or suspended)."""
        return self.record.status not in TERMINAL_STATUSES

    @property
    def open_requests(self) -> list[RequestView]:
        """The requests still open."""
        return [view for view in self.requests if view.status is RequestStatus.OPEN]


def pretty_json(value: Any) -> str:
    """Indented JSON, non-ASCII kept as is."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def shown(text: str) -> str:
    """``text`` as a page shows it: cut after SHOWN_CHARS characters, saying so."""
    if len(text) <= SHOWN_CHARS:
        return text
    more = len(text) - SHOWN_CHARS
    return f"{text[:SHOWN_CHARS]}\n… {more:,} more characters (kestrel runs show has them all)"


def pretty_arguments(arguments: str) -> str:
    """A call's arguments as the model sent them: JSON on one line when it is short, else
    indented; the raw text when it is not JSON."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    # The one-line form is the C encoder's, and most arguments are short: indenting them all
    # (the pure-Python encoder) would cost a long run's page tens of milliseconds.
    flat = json.dumps(value, ensure_ascii=False)
    return flat if len(flat) <= SHORT_JSON_CHARS else pretty_json(value)


def build_run_page(
    view: RunView,
    journal: Sequence[JournalRecord],
    audit: Sequence[AuditRecord],
    requests: Sequence[RequestView],
    *,
    length: int | None = None,
) -> RunPage:
    """A run's page from its record and state, a page of its journal (``length`` entries in
    the whole journal; None: ``journal`` is all of it), its audit and its requests."""
    record, state = view.record, view.state
    audit_rows = tuple(AuditRow.of(row) for row in audit)
    walk = TimelineWalk(requests, audit_rows, state.last_text)
    items = [*walk.feed(journal), *walk.close()]
    hidden = max(0, len(items) - SHOWN_ITEMS)
    items = items[hidden:]
    stop = journal[-1].seq + 1 if journal else 0
    whole = stop if length is None else length
    if stop < whole:
        _results_later(items, {call.call.id for call in state.batch if call.result is None})
    first_seq = items[0].seq if items else (journal[0].seq if journal else stop)
    started = state.started
    # What the run goes on with: a forced resume's model and provider, else the start's.
    fingerprint = state.fingerprint
    budgets = tuple(Budget(name, used, limit) for name, (used, limit) in view.budgets_used.items())
    result = state.result
    stop_reason = result.stop_reason.value if result else record.stop_reason
    payload = pretty_json(result.payload) if result and result.payload is not None else None
    return RunPage(
        record=record,
        thread=thread_of(record.session_id),
        provider=fingerprint.provider if fingerprint else "",
        model=fingerprint.model if fingerprint else "",
        stop_reason=stop_reason,
        budgets=budgets,
        deadline_seconds=started.budgets.deadline_seconds if started else 0,
        items=items,
        requests=tuple(requests),
        audit=audit_rows,
        result=result,
        payload=payload,
        next_seq=whole,
        version=page_version(record, whole, audit[-1] if audit else None),
        calls=state.tool_calls,
        outcomes=state.outcomes(),
        hidden_items=hidden,
        first_seq=first_seq,
        stop=stop,
    )


def _results_later(items: Sequence[Item], unanswered: Collection[str]) -> None:
    """On a page older than the newest, the calls of its last turn still without a result:
    results follow their turn, so theirs are on a newer page (an effect is not lost), unless
    the run has none for them at all (``unanswered``: its last batch's, a run that ended with
    an effect's outcome unknown)."""
    turn = next((item for item in reversed(items) if isinstance(item, Turn)), None)
    for call in turn.calls if turn is not None else ():
        answered = call.call_id not in unanswered
        call.later = answered and call.outcome is None and not call.request_id


def page_version(record: RunRecord, length: int, last_audit: AuditRecord | None) -> str:
    """Changes whenever anything a run's page shows may have changed, read from the run's row,
    its journal's length and its latest audited fact (a decision, an expiry, a refusal: what
    moves a request), never from the journal itself (live updates compare it first)."""
    lease = record.lease_expires.isoformat() if record.lease_expires else ""
    parts = [
        record.status.value,
        record.stop_reason,
        record.owner,
        str(record.epoch),
        lease,
        str(length),
        last_audit.at.isoformat() if last_audit else "",
        last_audit.action if last_audit else "",
        last_audit.request_id if last_audit else "",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


class TimelineWalk:
    """Turns journal records, fed in order (one page, or chunk after chunk), into items.

    ``feed`` returns the items that are complete: a model turn's calls take their results
    from the entries after it, so a turn, and what follows it, is held until the next turn
    (or ``close``). Memory stays one batch, however long the journal.
    """

    def __init__(
        self,
        requests: Sequence[RequestView],
        audit: Sequence[AuditRow],
        last_text: str = "",
    ) -> None:
        self._requests = {v.request.id: v for v in requests}
        self._audit: dict[str, list[AuditRow]] = {}
        for row in audit:
            if row.request_id:
                self._audit.setdefault(row.request_id, []).append(row)
        # The text of the last model turn before the first record (a terminal result that
        # repeats it restores it from there).
        self._last_text = last_text
        self._batch: dict[str, Call] = {}
        self._held: list[Item] = []

    def feed(self, records: Iterable[JournalRecord]) -> list[Item]:
        """The items completed by ``records``."""
        ready: list[Item] = []
        for record in records:
            item = self._item(record.seq, record.entry)
            if item is None:
                continue
            if isinstance(item, Turn):
                ready.extend(self._held)
                self._held = []
            self._held.append(item)
        return ready

    def close(self) -> list[Item]:
        """The items still held (the last turn and what follows it)."""
        held, self._held = self._held, []
        return held

    def _item(self, seq: int, entry: Entry) -> Item | None:
        match entry.kind:
            case "tool_result":
                call = self._batch.get(entry.call_id)
                orphan = call is None or call.outcome is not None
                if call is None or call.outcome is not None:
                    call = Call(seq, entry.call_id, entry.tool, "")
                call.outcome = entry.outcome.value
                call.output = shown(entry.output)
                call.is_error = entry.is_error
                call.result_seq = seq
                call.duration = entry.seconds
                return Orphan(seq, call) if orphan else None
            case "assistant_turn":
                turn = entry.turn
                calls = [
                    Call(seq, c.id, c.name, invisibles_named(shown(pretty_arguments(c.arguments))))
                    for c in turn.calls
                ]
                self._batch = {c.call_id: c for c in calls}
                text = turn.text or ""
                if text:
                    self._last_text = text
                return Turn(seq, entry.iteration, text, turn.finish_reason, turn.usage, calls)
            case "tool_dispatched":
                if (call := self._batch.get(entry.call_id)) is not None:
                    call.dispatched = True
                return None
            case "tool_process":
                if (call := self._batch.get(entry.call_id)) is not None:
                    stamp = entry.process
                    call.process = f"{stamp.host} pgid {stamp.pgid}"
                return None
            case "tool_deferred":
                request = entry.request
                if (call := self._batch.get(entry.call_id)) is not None:
                    call.request_id = request.id
                return _request_item(seq, request, self._requests.get(request.id), self._audit)
            case "grant_written":
                return GrantItem(seq, entry.grant)
            case "answer_supplied":
                return AnswerItem(seq, entry.decision)
            case "user_message":
                return UserText(seq, entry.text, entry.by)
            case "advisory":
                return Advisory(seq, entry.text)
            case "run_started":
                fingerprint = entry.fingerprint
                return Started(
                    seq,
                    entry.at,
                    fingerprint.provider,
                    fingerprint.model,
                    entry.requested_by,
                    entry.budgets,
                    entry.has_prompter,
                    len(entry.history),
                )
            case "run_suspended":
                return Suspended(seq, entry.reason.value, entry.request_ids)
            case "run_resumed":
                model = entry.fingerprint.model if entry.fingerprint else ""
                return Resumed(seq, entry.owner, entry.forced, entry.taken_over_from, model)
            case "run_ended":
                result = entry.restored(self._last_text)
                payload = pretty_json(result.payload) if result.payload is not None else None
                return Ended(seq, result, payload)
        return None


def _request_item(
    seq: int,
    request: Request,
    view: RequestView | None,
    audit: Mapping[str, list[AuditRow]],
) -> RequestItem:
    decisions = tuple(audit.get(request.id, ()))
    if view is None:  # the store lost it, or it is being written: the journal's copy
        return RequestItem(seq, request, "unknown", None, (), "", decisions)
    return RequestItem(
        seq,
        view.request,
        view.status.value,
        view.decision,
        view.may_answer,
        view.reason,
        decisions,
        view.approvers,
        view.phrase,
    )


# --- the run list and the open requests ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunRow:
    """One line of ``/runs``."""

    record: RunRecord
    thread: Thread
    open_requests: tuple[PendingRequest, ...]

    @property
    def may_answer(self) -> tuple[str, ...]:
        """Everyone who may answer one of its open requests."""
        return tuple(dict.fromkeys(p for r in self.open_requests for p in r.may_answer))

    @property
    def phrases(self) -> tuple[str, ...]:
        """Who may answer its open requests, in the policy's words, each said once."""
        return tuple(dict.fromkeys(r.phrase for r in self.open_requests if r.phrase))


def may_answer(pending: PendingRequest, principal: str) -> bool:
    """Whether ``principal`` (a user id, or ``group:ID``) is among those who may answer."""
    return principal in pending.may_answer or EVERYONE in pending.may_answer


def run_rows(
    records: Iterable[RunRecord],
    pending: Iterable[PendingRequest],
    *,
    status: str = "",
    answerer: str = "",
) -> list[RunRow]:
    """The runs with their open requests; only those in ``status`` and, with ``answerer``,
    only those with an open request that ``answerer`` may answer."""
    open_by_run: dict[str, list[PendingRequest]] = {}
    for item in pending:
        open_by_run.setdefault(item.request.run_id, []).append(item)
    rows = []
    for record in records:
        if status and record.status.value != status:
            continue
        mine = tuple(open_by_run.get(record.id, ()))
        if answerer and not any(may_answer(p, answerer) for p in mine):
            continue
        rows.append(RunRow(record, thread_of(record.session_id), mine))
    return rows


def oldest_first(pending: Iterable[PendingRequest]) -> list[PendingRequest]:
    """Open requests, oldest first (ties by id, for a stable page)."""
    return sorted(pending, key=lambda p: (p.request.created_at, p.request.id))
