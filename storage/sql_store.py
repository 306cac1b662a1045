"""SqlStore: the ``Store`` methods both backends share, written once over a few primitives.

A backend supplies its ``Dialect`` (``storage.sql``), its statement for taking work, and the
primitives: ``_read``, ``_write`` (one statement, its own transaction), ``_transaction``
(several statements, one transaction) and how its driver's errors read. It keeps what truly
differs: connecting and migrating, the journal's write path (``submit``), and wake-ups
(``enqueue_work``, ``wait_for_work``).
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar

from bot import wire
from bot.chat.outbox_keys import card_key, owed_card, owed_reminder, reminder_key
from bot.domain import Decision, Request, RequestStatus, Session
from bot.errors import StoreError, ThreadBusy, UnknownRun
from bot.journal.entries import Entry
from bot.journal.log import JournalRecord, JournalTally
from bot.kinds import AuditAction
from bot.records import REPLICA_STOPPING, OutboxMessage, Replica, RunRecord, WorkItem
from bot.store_values import Audited, AuditRecord, Counted, Settled
from storage import sql
from storage.common import (
    AuditEntry,
    Refusal,
    Violation,
    beside_entry,
    entry_body,
    new_run_row,
    outbox_from_row,
    outbox_json,
    projection,
    record,
    replicas_from_rows,
    request_from_row,
    request_row,
    run_from_row,
    tally_from_rows,
    whole,
    work_from_row,
    work_payload,
)
from storage.sql import Dialect, Step

_Conn = TypeVar("_Conn")
_S = TypeVar("_S", bound="SqlStore")

Row = Sequence[Any]
Params = Sequence[Any]


class _Repeat(StoreError):
    """Work whose once-key (a chat delivery's, a scheduled occurrence's) was marked before."""


class SqlStore(ABC):
    """Sessions, runs, leases, journal reads, requests, work, replicas, outbox and audit, in SQL."""

    _dialect: ClassVar[Dialect]
    # Marks ``sql.UNTAKEN_WORK`` taken by $1 at $2, returning ``sql.TAKEN_WORK``: each backend
    # writes its own, as each keeps two takers off one item in its own way.
    _take_work: ClassVar[str]
    # What the driver raises when a constraint refuses a write, and for any other failure.
    _refusals: ClassVar[tuple[type[Exception], ...]]
    _failures: ClassVar[tuple[type[Exception], ...]]

    def __init__(self, clock: Callable[[], datetime], label: str) -> None:
        self._clock = clock
        # The database as messages name it: "SQLite database PATH", "PostgreSQL USER@HOST/DB".
        self._label = label
        # Set when work may have been enqueued (and by close): wakes ``wait_for_work`` callers.
        self._work_added = asyncio.Event()
        self._closed = False
        # Whole-journal reads so far: what a run costs (``load`` is the expensive read).
        self.loads = 0

    async def close(self) -> None:
        """Write what is queued, then close every connection."""
        if self._closed:
            return
        self._closed = True
        self._work_added.set()  # waiters return, and their next call reports the closed store
        await self._shut_down()

    # -- what each backend does its own way -------------------------------------------------

    @abstractmethod
    async def migrate(self) -> int:
        """Open the connections if needed and bring the schema to the current version."""

    async def schema_version(self) -> int:
        """The schema version applied now (a read: readiness asks it at every probe)."""
        rows = await self._read("read", "SELECT COALESCE(MAX(version), 0) FROM schema_version", ())
        return int(rows[0][0])

    @abstractmethod
    async def _shut_down(self) -> None:
        """Write what is queued and close every connection (once, on ``close``)."""

    @abstractmethod
    def submit(self, run_id: str, seq: int, epoch: int, entry: Entry) -> asyncio.Future[None]:
        """Queue an append now (written after the run's earlier ones); settles after commit."""

    @abstractmethod
    async def enqueue_work(self, kind: str, payload: dict[str, Any]) -> int:
        """Add inbound work and wake the replicas waiting for it; its id."""

    @abstractmethod
    async def wait_for_work(self, timeout: float) -> None:
        """Return when work may have been enqueued, or after ``timeout``."""

    # -- primitives --------------------------------------------------------------------------

    @abstractmethod
    async def _read(self, action: str, statement: str, params: Params) -> list[Row]:
        """The rows of one query (a statement of ``storage.sql``'s notation)."""

    @abstractmethod
    async def _write(
        self, action: str, statement: str, params: Params, refused: Refusal | None = None
    ) -> list[Row]:
        """One statement in its own committed transaction; the rows it returned."""

    @abstractmethod
    async def _transaction(
        self, action: str, steps: Sequence[Step], refused: Refusal | None = None
    ) -> list[list[Row]]:
        """Several statements in one committed transaction; the rows each one returned."""

    @abstractmethod
    def _failure(self, action: str, exc: Exception) -> StoreError:
        """A driver error as a one-line ``StoreError`` naming the database and the cause."""

    @abstractmethod
    def _violation(self, exc: Exception) -> Violation:
        """Which constraint a refusal of the driver's broke."""

    # -- sessions and runs -------------------------------------------------------------------

    async def ensure_session(self, session: Session) -> None:
        """Create the session if it does not exist."""
        await self._write("ensure_session", sql.ENSURE_SESSION, self._session_row(session))

    async def get_session(self, session_id: str) -> Session | None:
        """A session by id, or None."""
        rows = await self._read("get_session", sql.GET_SESSION, (session_id,))
        if not rows:
            return None
        return _session(rows[0])

    async def sessions_on(self, platform: str, limit: int) -> list[Session]:
        """The platform's newest ``limit`` sessions, newest first."""
        rows = await self._read("sessions_on", sql.SESSIONS_ON, (platform, limit))
        return [_session(row) for row in rows]

    async def create_run(
        self,
        run: RunRecord,
        owner: str,
        lease_seconds: float,
        session: Session | None = None,
        entries: Sequence[Entry] = (),
        *,
        alone: bool = False,
    ) -> int:
        """Insert a run owned by ``owner`` at epoch 1 (and ``session``, if new) with its first
        journal ``entries``, in one transaction; the epoch. ``alone``: only while no other run
        of the session is unfinished (``ThreadBusy`` otherwise, nothing written)."""
        if alone and (session is None or not entries):
            raise ValueError("create_run(alone=True) needs the session and the first entries")

        def refused(violation: Violation) -> StoreError:
            if violation is Violation.FOREIGN_KEY and alone:
                # The session was ensured here: the run itself was not inserted.
                return ThreadBusy(f"a run of session {run.session_id!r} is still unfinished")
            if violation is Violation.FOREIGN_KEY:
                return StoreError(f"unknown session {run.session_id!r}: call ensure_session first")
            return StoreError(f"run {run.id!r} already exists")

        lease_expires = self._clock() + timedelta(seconds=lease_seconds)
        steps: list[Step] = []
        if session is not None:
            steps.append((sql.ENSURE_SESSION, self._session_row(session)))
        row = new_run_row(run, owner, lease_expires, self._stamp)
        if alone:
            if self._dialect.row_locks:
                steps.append((sql.LOCK_SESSION, (run.session_id,)))
            steps.append((sql.CREATE_RUN_ALONE, row))
        else:
            steps.append((sql.CREATE_RUN, row))
        for seq, entry in enumerate(entries):
            steps.extend(self._entry_steps(run.id, seq, 1, entry))
        await self._transaction("create_run", steps, refused)
        return 1

    async def get_run(self, run_id: str) -> RunRecord:
        """The run's row; raises ``UnknownRun``."""
        rows = await self._read("get_run", sql.GET_RUN, (run_id,))
        if not rows:
            raise UnknownRun(f"unknown run {run_id!r}")
        return run_from_row(rows[0], self._dialect.moment)

    async def list_runs(self, limit: int = 50, session_id: str | None = None) -> list[RunRecord]:
        """The newest runs first, optionally of one session."""
        clause, params = sql.where(session_id=session_id)
        statement = sql.list_runs(clause, len(params) + 1)
        rows = await self._read("list_runs", statement, (*params, limit))
        return [run_from_row(row, self._dialect.moment) for row in rows]

    async def count_runs_by_status(self) -> dict[str, int]:
        """How many runs stand at each status (statuses no run has are left out)."""
        rows = await self._read("count_runs_by_status", sql.COUNT_RUNS_BY_STATUS, ())
        return {str(status): int(count) for status, count in rows}

    async def orphaned_runs(self, limit: int = 100) -> list[str]:
        """Runs marked running whose owner's lease expired or was given up: nobody drives them."""
        rows = await self._read("orphaned_runs", sql.ORPHANED_RUNS, (self._now(), limit))
        return [str(row[0]) for row in rows]

    # -- leases ------------------------------------------------------------------------------

    async def claim(
        self, run_id: str, owner: str, lease_seconds: float, *, force: bool = False
    ) -> int | None:
        """Take the lease (free, expired, already ours, or forced) and return the new epoch."""
        params = (owner, self._lease_until(lease_seconds), self._now(), run_id, force)
        rows = await self._write("claim", sql.CLAIM, params)
        if rows:
            return int(rows[0][0])
        await self.current_epoch(run_id)  # unknown runs raise UnknownRun, not None
        return None

    async def renew(self, run_id: str, owner: str, epoch: int, lease_seconds: float) -> bool:
        """Extend a lease still held at ``epoch``; False when it was taken."""
        params = (self._lease_until(lease_seconds), self._now(), run_id, owner, epoch)
        return bool(await self._write("renew", sql.RENEW, params))

    async def release(self, run_id: str, owner: str, epoch: int) -> None:
        """Give the lease up if still held at ``epoch``."""
        await self._write("release", sql.RELEASE, (self._now(), run_id, owner, epoch))

    async def current_epoch(self, run_id: str) -> int:
        """The run's epoch as the database has it now."""
        rows = await self._read("current_epoch", sql.CURRENT_EPOCH, (run_id,))
        if not rows:
            raise UnknownRun(f"unknown run {run_id!r}")
        return int(rows[0][0])

    # -- journal -----------------------------------------------------------------------------

    async def append(self, run_id: str, seq: int, epoch: int, entry: Entry) -> None:
        """Append at ``seq`` fenced by ``epoch``; returns once the row is durable."""
        await self.submit(run_id, seq, epoch, entry)

    async def load(self, run_id: str) -> list[JournalRecord]:
        """The run's whole journal, in order; raises ``UnknownRun``, and ``UnreadableJournal``
        for an entry that does not read back or is missing."""
        self.loads += 1
        rows = await self._read("load", sql.LOAD, (run_id,))
        if not rows:
            await self.current_epoch(run_id)  # unknown runs raise UnknownRun
        return whole(
            run_id, [record(run_id, int(seq), int(epoch), body) for seq, epoch, body in rows]
        )

    async def load_range(self, run_id: str, start: int, stop: int) -> list[JournalRecord]:
        """The run's entries with ``start <= seq < stop``, in order; raises ``UnknownRun``."""
        rows = await self._read("load", sql.LOAD_RANGE, (run_id, max(0, start), stop))
        if not rows:
            await self.current_epoch(run_id)  # unknown runs raise UnknownRun
        return [record(run_id, int(seq), int(epoch), body) for seq, epoch, body in rows]

    async def journal_length(self, run_id: str) -> int:
        """How many entries the run's journal holds; raises ``UnknownRun``."""
        rows = await self._read("load", sql.JOURNAL_LENGTH, (run_id,))
        if not rows:
            raise UnknownRun(f"unknown run {run_id!r}")
        return int(rows[0][0])

    async def journal_tally(self, run_id: str, start: int, stop: int) -> JournalTally:
        """What a run page's header adds up over ``start <= seq < stop``, in SQL."""
        rows = await self._read("load", sql.JOURNAL_TALLY, (run_id, max(0, start), stop))
        if not rows:
            await self.current_epoch(run_id)  # unknown runs raise UnknownRun
        return tally_from_rows(rows, stop)

    async def journal_landmarks(self, run_id: str, stop: int) -> JournalTally:
        """The seqs of the first start, the last assistant turn, the last with text and the
        last forced resume with a new fingerprint before ``stop``, with no sums; read from the
        ends of the journal."""
        rows = await self._read("load", sql.JOURNAL_LANDMARKS, (run_id, stop))
        started, turn, text, changed = rows[0]
        return JournalTally(
            started_seq=_seq(started),
            last_turn_seq=_seq(turn),
            last_text_seq=_seq(text),
            changed_seq=_seq(changed),
        )

    # -- requests ----------------------------------------------------------------------------

    async def open_request(self, request: Request) -> None:
        """Record a request as open; a second call with the same id changes nothing."""

        def refused(violation: Violation) -> StoreError:  # noqa: ARG001
            return UnknownRun(f"unknown run {request.run_id!r} for request {request.id!r}")

        params = request_row(request, self._stamp)
        await self._write("open_request", sql.OPEN_REQUEST, params, refused)

    async def get_request(self, request_id: str) -> tuple[Request, RequestStatus, Decision | None]:
        """A request, its status and its decision; raises ``KeyError`` if unknown."""
        rows = await self._read("get_request", sql.GET_REQUEST, (request_id,))
        if not rows:
            raise KeyError(request_id)
        return request_from_row(rows[0])

    async def list_requests(
        self,
        *,
        run_id: str | None = None,
        status: RequestStatus | None = RequestStatus.OPEN,
        unfinished_runs: bool = False,
    ) -> list[tuple[Request, RequestStatus, Decision | None]]:
        """Requests filtered by run and status, oldest first; ``unfinished_runs``: only those
        of runs that did not end (one read, not one per run)."""
        clause, params = sql.where(run_id=run_id, status=None if status is None else status.value)
        if unfinished_runs:
            clause = sql.of_unfinished_runs(clause)
        action = "list_requests" if run_id is None else "list_run_requests"
        rows = await self._read(action, sql.list_requests(clause), params)
        return [request_from_row(row) for row in rows]

    async def decide(
        self, decision: Decision, status: RequestStatus, audit: Audited | None = None
    ) -> bool:
        """Close an open request; True only for the one caller whose update changed it (who
        alone records ``audit``, in the same transaction)."""
        try:
            rows = await self._transaction("decide", self._decide_steps(decision, status, audit))
        except StoreError:
            if await self._recorded(decision):
                return True
            raise
        if rows[0]:  # the DECIDE step's
            return True
        await self.get_request(decision.request_id)  # unknown ids raise KeyError, not False
        return False

    async def decide_and_claim(
        self,
        decision: Decision,
        status: RequestStatus,
        audit: Audited,
        owner: str,
        lease_seconds: float,
    ) -> Settled:
        """``decide``, and take the run's free lease if that closed its last open request."""
        steps = self._decide_steps(decision, status, audit)
        until = self._clock() + timedelta(seconds=lease_seconds)
        params = (owner, self._stamp(until), self._now(), decision.request_id)
        steps.append((sql.CLAIM_SETTLED, (*params, wire.to_json(decision))))
        locks = 0
        if self._dialect.row_locks:
            steps.insert(0, (sql.LOCK_RUN_OF_REQUEST, (decision.request_id,)))
            locks = 1
        try:
            rows = await self._transaction("decide", steps)
        except StoreError:
            if await self._recorded(decision):
                return await self._settled_by(decision, owner, until)
            raise
        decided, claimed = rows[locks], rows[-1]  # the DECIDE step's and the CLAIM_SETTLED's
        if not decided:
            await self.get_request(decision.request_id)  # unknown ids raise KeyError
            return Settled(False)
        return Settled(True, int(claimed[0][0]) if claimed else None)

    async def _recorded(self, decision: Decision) -> bool:
        """Whether ``decision`` is the one its request holds, after its transaction failed:
        one whose COMMIT landed while its answer was lost (the connection dropped) stands, and
        only that transaction can have written it (its time and decider with it). False when
        the store cannot say."""
        try:
            _, _, recorded = await self.get_request(decision.request_id)
        except (StoreError, KeyError):
            return False
        return recorded == decision

    async def _settled_by(self, decision: Decision, owner: str, until: datetime) -> Settled:
        """What a ``decide_and_claim`` found recorded did: its claim landed with it when the
        run's lease is ``owner``'s until the very moment that claim set (a lease ``owner`` held
        before, its task driving the run, was not taken again)."""
        request, _, _ = await self.get_request(decision.request_id)
        run = await self.get_run(request.run_id)
        claimed = run.owner == owner and run.lease_expires == until
        return Settled(True, run.epoch if claimed else None)

    def _decide_steps(
        self, decision: Decision, status: RequestStatus, audit: Audited | None
    ) -> list[Step]:
        if status is RequestStatus.OPEN:
            raise ValueError("decide() needs a closing status, not 'open'")
        text = wire.to_json(decision)
        # An answer is refused on a run that ended; a cancel's or a deadline's close is not.
        statement = sql.ANSWER if status is RequestStatus.ANSWERED else sql.DECIDE
        steps: list[Step] = [(statement, (status.value, text, decision.request_id))]
        if audit is not None:
            params = (self._now(), audit.actor, str(audit.action), audit.detail)
            steps.append((sql.AUDIT_DECISION, (*params, decision.request_id, text)))
        owed = outbox_json(owed_card(decision.request_id))
        key = card_key(decision.request_id)
        steps.append((sql.OWE_CARD_AGAIN, (decision.request_id, text, owed, key, self._now())))
        return steps

    async def add_approval(
        self, request_id: str, by: str, audit: Audited | None = None
    ) -> Counted | None:
        """Record ``by`` as an approver of an open request (and ``audit`` it, the first time
        only); the number of distinct approvers and whether ``by`` was new, or None if the
        request is closed (nothing recorded)."""
        steps: list[Step] = []
        if audit is not None:
            params = (self._now(), audit.actor, str(audit.action), audit.detail, request_id)
            steps.append((sql.AUDIT_APPROVAL, params))
        steps += [
            (sql.INSERT_APPROVAL, (request_id, by, self._now())),
            (sql.COUNT_APPROVALS, (request_id,)),
        ]
        if self._dialect.row_locks:
            # The run's row first, as a decision takes it (``decide_and_claim``): a cancel
            # ending the run is seen, and no two transactions take the two in turn.
            steps[:0] = [
                (sql.LOCK_RUN_OF_REQUEST, (request_id,)),
                (sql.LOCK_REQUEST, (request_id,)),
            ]
        rows = await self._transaction("add_approval", steps)
        count, known, still_open = rows[-1][0]
        if not known:
            raise KeyError(request_id)
        return Counted(int(count), new=bool(rows[-2])) if still_open else None

    async def approvers(self, request_id: str) -> list[str]:
        """Who approved a request that needs several approvals, in the order they did."""
        rows = await self._read("approvers", sql.LIST_APPROVERS, (request_id,))
        return [str(approver) for (approver,) in rows]

    async def mark_once(self, key: str) -> bool:
        """Claim ``key``; True only for the first caller ever, across processes and replicas."""
        return bool(await self._write("mark_once", sql.MARK_ONCE, (key, self._now())))

    async def marked(self, key: str) -> bool:
        """Whether ``key`` was claimed."""
        return bool(await self._read("marked", sql.MARKED, (key,)))

    async def remind_once(self, request: Request, actor: str) -> bool:
        """Claim ``request``'s reminder, owe it to its run's thread and audit it, in one
        transaction; True only for the first caller. Owed, not left to the reminding process
        to render: one with no renderer of the thread's platform, or one that died after the
        claim, would have claimed the reminder and shown it nowhere."""
        key = reminder_key(request.id)

        def repeat(violation: Violation) -> StoreError:  # noqa: ARG001
            return _Repeat(key)

        now = self._now()
        owed = outbox_json(owed_reminder(request.id))
        audited = (now, actor, AuditAction.REMIND.value, request.run_id, request.id, "")
        steps: list[Step] = [
            (sql.MARK_DELIVERY, (key, now)),
            (sql.OWE_MESSAGE, (request.run_id, key, owed, now)),
            (sql.AUDIT, audited),
        ]
        try:
            await self._transaction("remind_once", steps, repeat)
        except _Repeat:
            return False
        return True

    async def first_marked(self, keys: Sequence[str], at: datetime) -> dict[str, datetime]:
        """Mark each of ``keys`` at ``at`` unless it is marked, in one transaction whatever
        their number; when each was first marked."""
        if not keys:
            return {}
        listed = json.dumps(list(keys))
        steps: list[Step] = [
            (sql.MARK_ALL_ONCE, (listed, self._stamp(at))),
            (sql.MARKED_AT, (listed,)),
        ]
        rows = await self._transaction("first_marked", steps)
        return {str(key): self._dialect.moment(moment) for key, moment in rows[1]}

    # -- work and replicas -------------------------------------------------------------------

    async def accept_delivery(self, key: str, payload: dict[str, Any], owner: str) -> int | None:
        """Mark ``key`` and queue ``payload`` as inbound work taken by ``owner``, in one
        transaction; the item's id, or None when ``key`` was marked before (nothing queued)."""
        return await self.take_once(key, "inbound", payload, owner)

    async def take_once(
        self,
        key: str,
        kind: str,
        payload: dict[str, Any],
        owner: str,
        *,
        also: Sequence[str] = (),
    ) -> int | None:
        """Mark ``key`` and ``also`` and queue ``payload`` as ``kind`` work taken by ``owner``,
        in one transaction; the item's id, or None when any key was marked before (nothing
        marked, nothing queued)."""

        def repeat(violation: Violation) -> StoreError:  # noqa: ARG001
            return _Repeat(key)

        now = self._now()
        steps: list[Step] = [(sql.MARK_DELIVERY, (mark, now)) for mark in (key, *also)]
        steps.append((sql.ENQUEUE_TAKEN_WORK, (kind, work_payload(kind, payload), now, owner)))
        try:
            rows = await self._transaction("accept_delivery", steps, repeat)
        except _Repeat:
            return None
        return int(rows[-1][0][0])

    async def take_work(
        self, owner: str, limit: int = 10, retake_after: float = 60.0
    ) -> list[WorkItem]:
        """Take up to ``limit`` untaken or abandoned items, oldest first, for ``owner``."""
        if limit <= 0:
            return []
        now = self._clock()
        abandoned_before = self._stamp(now - timedelta(seconds=retake_after))
        params = (owner, self._stamp(now), abandoned_before, limit)
        rows = await self._write("take_work", self._take_work, params)
        items = [work_from_row(row, self._dialect.moment) for row in rows]
        return sorted(items, key=lambda item: item.id)  # RETURNING order is unspecified

    async def finish_work(self, work_id: int) -> None:
        """Mark an item done so nobody takes it again; finishing it twice changes nothing."""
        await self._write("finish_work", sql.FINISH_WORK, (self._now(), work_id))

    async def heartbeat(self, owner: str, info: str = "") -> None:
        """Register replica ``owner``, or refresh its info and last-seen time (one marked
        ``REPLICA_STOPPING`` stays so)."""
        params = (owner, info, self._now(), REPLICA_STOPPING)
        await self._write("heartbeat", sql.HEARTBEAT, params)

    async def forget_replica(self, owner: str) -> None:
        """Unregister replica ``owner`` (it stopped cleanly); a later heartbeat registers it."""
        await self._write("forget_replica", sql.FORGET_REPLICA, (owner,))

    async def list_replicas(self, alive_within: float = 60.0) -> list[Replica]:
        """Replicas seen within ``alive_within`` seconds, with the runs they own."""
        since = self._stamp(self._clock() - timedelta(seconds=alive_within))
        rows = await self._read("list_replicas", sql.LIST_REPLICAS, (since,))
        return replicas_from_rows(rows, self._dialect.moment)

    # -- outbox ------------------------------------------------------------------------------

    async def put_message(
        self, key: str, platform: str, target: dict[str, Any], body: dict[str, Any]
    ) -> int:
        """Insert message ``key``, or give it a different body as its next version (due at
        once); its version. An identical body changes nothing."""
        params = (key, platform, outbox_json(target), outbox_json(body), self._now())
        rows = await self._write("put_message", sql.PUT_MESSAGE, params)
        if not rows:  # the body it shows already: nothing changed
            rows = await self._read("put_message", sql.MESSAGE_VERSION, (key,))
        return int(rows[0][0])

    async def claim_messages(
        self,
        owner: str,
        lease_seconds: float,
        limit: int = 20,
        platform: str | None = None,
        key: str | None = None,
    ) -> list[OutboxMessage]:
        """Claim up to ``limit`` due messages for ``owner`` for ``lease_seconds``, oldest
        first (of one platform, or just message ``key``, if given); one claimer each."""
        if limit <= 0:
            return []
        filters, values = sql.equal(5, platform=platform, key=key)
        statement = sql.claim_messages(filters, 4, self._dialect.row_locks)
        now = self._clock()
        until = now + timedelta(seconds=lease_seconds)
        params = (owner, self._stamp(now), self._stamp(until), limit, *values)
        rows = await self._write("claim_messages", statement, params)
        moment = self._dialect.moment
        claimed = [(outbox_from_row(row[1:], moment), row[0]) for row in rows]
        # RETURNING order is unspecified: oldest first, insertion order among equal times.
        claimed.sort(key=lambda pair: (pair[0].created_at, pair[1]))
        return [message for message, _ in claimed]

    async def message_delivered(self, key: str, owner: str, version: int, ref: str) -> None:
        """Record that the platform shows ``version`` of message ``key`` as ``ref``; release
        ``owner``'s claim if it still holds it (never another owner's)."""
        params = (key, owner, version, ref, self._now())
        await self._write("message_delivered", sql.MESSAGE_DELIVERED, params)

    async def message_failed(self, key: str, owner: str, retry_at: datetime, error: str) -> None:
        """Release ``owner``'s claim on message ``key``, due again at ``retry_at``."""
        params = (key, owner, self._stamp(retry_at), error, self._now())
        await self._write("message_failed", sql.MESSAGE_FAILED, params)

    async def get_message(self, key: str) -> OutboxMessage | None:
        """Message ``key``, or None."""
        rows = await self._read("get_message", sql.GET_MESSAGE, (key,))
        return outbox_from_row(rows[0], self._dialect.moment) if rows else None

    async def get_messages(self, keys: Sequence[str]) -> list[OutboxMessage]:
        """The messages of ``keys`` that exist, in one query."""
        if not keys:
            return []
        rows = await self._read("get_messages", sql.GET_MESSAGES, (json.dumps(list(keys)),))
        return [outbox_from_row(row, self._dialect.moment) for row in rows]

    async def held_refs(self, platform: str, refs: Sequence[str]) -> set[str]:
        """Which of ``refs`` a message of ``platform`` is recorded as, in one query."""
        if not refs:
            return set()
        params = (platform, json.dumps(list(refs)))
        return {str(row[0]) for row in await self._read("held_refs", sql.HELD_REFS, params)}

    async def outbox_backlog(self, platform: str | None = None) -> int:
        """How many messages (of one platform, if given) the platform does not show yet."""
        filters, params = sql.equal(platform=platform)
        rows = await self._read("outbox_backlog", sql.outbox_backlog(filters), params)
        return int(rows[0][0])

    # -- audit -------------------------------------------------------------------------------

    def now(self) -> datetime:
        """The store's clock (injected: the runtime's), for times compared with the store's."""
        return self._clock()

    async def audit(
        self, actor: str, action: str, run_id: str = "", request_id: str = "", detail: str = ""
    ) -> None:
        """Record one audited fact (an ``AuditAction``; any text is stored as given)."""
        params = (self._now(), actor, str(action), run_id, request_id, detail)
        await self._write("audit", sql.AUDIT, params)

    async def list_audit(
        self, run_id: str | None = None, limit: int = 200, action: str | None = None
    ) -> list[AuditRecord]:
        """The newest ``limit`` audited facts (of one run, of one action, if given), oldest
        first."""
        clause, params = sql.where(run_id=run_id, action=action)
        statement = sql.list_audit(clause, len(params) + 1)
        rows = await self._read("list_audit", statement, (*params, limit))
        moment = self._dialect.moment
        entries = [
            AuditEntry(moment(at), actor, action, rid, req, detail)
            for at, actor, action, rid, req, detail in rows
        ]
        return list[AuditRecord](entries)

    # -- errors ------------------------------------------------------------------------------

    def _errors(self, action: str, refused: Refusal | None = None) -> _Errors:
        """Turn driver errors into ``_failure``s, and refusals into what ``refused`` makes of
        them (an error the caller reports, such as an unknown session)."""
        return _Errors(self, action, refused)

    def _closed_error(self) -> StoreError:
        return StoreError(f"{self._label}: the store is closed")

    def _opened(self, connection: _Conn | None) -> _Conn:
        """``connection``, once ``migrate`` opened it and until ``close``."""
        if self._closed:
            raise self._closed_error()
        if connection is None:
            raise StoreError(f"{self._label}: not open; await migrate() first")
        return connection

    # -- helpers -----------------------------------------------------------------------------

    def _entry_steps(self, run_id: str, seq: int, epoch: int, entry: Entry) -> list[Step]:
        """An unconditional append (a new run's, which nobody else can hold yet) with what the
        entry moves: its run's status and the rows written beside it."""
        at = self._now()
        body = entry_body(entry)
        steps: list[Step] = [(sql.INSERT_ENTRY, (run_id, seq, epoch, entry.kind, body, at))]
        moved = projection(entry)
        if moved is not None:
            params = (moved.status.value, moved.stop_reason, at, run_id, moved.releases)
            steps.append((sql.PROJECT_STATUS, params))
        steps.extend(beside_entry(run_id, entry, lambda: at, self._stamp))
        return steps

    def _session_row(self, session: Session) -> tuple[Any, ...]:
        return (
            session.id,
            session.platform,
            session.workspace,
            session.channel,
            session.thread,
            self._now(),
        )

    def _stamp(self, moment: datetime) -> Any:
        """``moment`` as this database stores a timestamp."""
        return self._dialect.stamp(moment)

    def _now(self) -> Any:
        return self._stamp(self._clock())

    def _lease_until(self, lease_seconds: float) -> Any:
        return self._stamp(self._clock() + timedelta(seconds=lease_seconds))


async def migrated(store: _S) -> _S:
    """``store`` with its schema brought up to date; closed again if that fails."""
    try:
        await store.migrate()
    except BaseException:
        await store.close()
        raise
    return store


def _seq(value: Any) -> int | None:
    """A seq read from a row, None where there was none."""
    return None if value is None else int(value)


def _session(row: Row) -> Session:
    """A ``sessions`` row (id, platform, workspace, channel, thread) as a session."""
    sid, platform, workspace, channel, thread = row
    return Session(id=sid, platform=platform, workspace=workspace, channel=channel, thread=thread)


class _Errors:
    """``SqlStore._errors``' block. A class, not ``contextlib.contextmanager``: every statement
    runs in one, and a generator's block cost 6,000 instructions more (its StopIteration)."""

    __slots__ = ("_action", "_refused", "_store")

    def __init__(self, store: SqlStore, action: str, refused: Refusal | None) -> None:
        self._store, self._action, self._refused = store, action, refused

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, _tb: object) -> None:
        if exc is None:
            return
        store = self._store
        if isinstance(exc, store._refusals):
            if self._refused is not None:
                raise self._refused(store._violation(exc)) from exc
            raise store._failure(self._action, exc) from exc
        if isinstance(exc, store._failures):
            raise store._failure(self._action, exc) from exc
