"""The store as small roles, each handed only to the code that uses it; ``Store`` is all of them.

Protocols for the type checker: code on a decision's path imports them under ``TYPE_CHECKING``
(each protocol class costs its creation in every process that imports it).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from bot.domain import Decision, Request, RequestStatus, Session
from bot.journal.entries import Entry
from bot.journal.log import JournalLog
from bot.kinds import AuditAction
from bot.records import OutboxMessage, Replica, RunRecord, WorkItem
from bot.store_values import Audited, AuditRecord, Counted, Settled


class Admin(Protocol):
    """The store's life: its schema and its connections (the composition root)."""

    async def migrate(self) -> int:
        """Bring the schema to the current version; return that version."""
        ...

    async def schema_version(self) -> int:
        """The schema version applied now (a read: readiness asks it at every probe)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class RunRows(Protocol):
    """Sessions and runs as rows: what listings and history read."""

    async def ensure_session(self, session: Session) -> None:
        """Create the session if it does not exist."""
        ...

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
        """Insert a run owned by ``owner`` and return its first epoch; ``session``, if given,
        is ensured and ``entries`` are its journal from seq 0, in the same transaction.
        ``alone`` (with both): refused with ``ThreadBusy``, writing nothing, while another run
        of the session is running or suspended, whichever replica created it."""
        ...

    async def get_run(self, run_id: str) -> RunRecord:
        """The run's row; raises ``UnknownRun``."""
        ...

    async def list_runs(self, limit: int = 50, session_id: str | None = None) -> list[RunRecord]:
        """The newest runs first."""
        ...

    async def get_session(self, session_id: str) -> Session | None:
        """A session by id, or None."""
        ...

    async def count_runs_by_status(self) -> dict[str, int]:
        """How many runs stand at each status, by the status's value (statuses no run has
        are left out): what a metrics scrape reads, without listing the runs."""
        ...


class SessionPlaces(Protocol):
    """Where a platform's sessions live: what a chat adapter reads back after a gap."""

    async def sessions_on(self, platform: str, limit: int) -> list[Session]:
        """The platform's newest ``limit`` sessions, newest first."""
        ...


class Leases(Protocol):
    """Who drives a run: leases with epochs, and the runs whose owner died."""

    async def claim(
        self, run_id: str, owner: str, lease_seconds: float, *, force: bool = False
    ) -> int | None:
        """Take the lease and return a new epoch; None while another owner's lease lives."""
        ...

    async def renew(self, run_id: str, owner: str, epoch: int, lease_seconds: float) -> bool:
        """Extend a lease still held at ``epoch``; False when it was taken."""
        ...

    async def release(self, run_id: str, owner: str, epoch: int) -> None:
        """Give the lease up if still held at ``epoch``."""
        ...

    async def orphaned_runs(self, limit: int = 100) -> list[str]:
        """Ids of runs whose owner died: marked running with a lease expired or released, or
        suspended with a lease a decider took to resume them and let expire."""
        ...


class Requests(Protocol):
    """Open requests and the decisions that close them; exactly one decider wins."""

    async def open_request(self, request: Request) -> None:
        """Record a request as open (idempotent for the same id)."""
        ...

    async def get_request(self, request_id: str) -> tuple[Request, RequestStatus, Decision | None]:
        """A request, its status and its decision if any; raises ``KeyError`` if unknown."""
        ...

    async def list_requests(
        self,
        *,
        run_id: str | None = None,
        status: RequestStatus | None = RequestStatus.OPEN,
        unfinished_runs: bool = False,
    ) -> list[tuple[Request, RequestStatus, Decision | None]]:
        """Requests filtered by run and status, oldest first; ``unfinished_runs``: only those
        of runs that did not end, in the same read."""
        ...

    async def decide(
        self, decision: Decision, status: RequestStatus, audit: Audited | None = None
    ) -> bool:
        """Close an open request with ``decision``; True only for the one caller that won.
        ``audit`` is recorded in the same transaction, by the winner only."""
        ...

    async def decide_and_claim(
        self,
        decision: Decision,
        status: RequestStatus,
        audit: Audited,
        owner: str,
        lease_seconds: float,
    ) -> Settled:
        """``decide``; and when that closed its run's last open request and the run's lease is
        free, take the lease for ``owner`` in the same transaction (the decider resumes it).
        A lease ``owner`` holds is never free, lapsed or not: its task may drive the run yet."""
        ...

    async def add_approval(
        self, request_id: str, by: str, audit: Audited | None = None
    ) -> Counted | None:
        """Record one distinct approver of an open request (``audit``ed the first time only);
        how many it has now and whether ``by`` was new, or None if it is closed (a decision
        came first: nothing recorded)."""
        ...

    async def approvers(self, request_id: str) -> list[str]:
        """Everyone who approved a request that needs several approvals, first approver
        first (empty for one nobody approved so, or an unknown one)."""
        ...


class OnceMarks(Protocol):
    """Keys claimed for good, so a deadline, reminder or cron prompt fires once."""

    async def mark_once(self, key: str) -> bool:
        """Claim ``key`` for good; True only for the first caller (deadlines, reminders, cron)."""
        ...

    async def marked(self, key: str) -> bool:
        """Whether ``key`` was claimed (a cancel asked of the replica that drives a run)."""
        ...

    async def remind_once(self, request: Request, actor: str) -> bool:
        """Claim ``request``'s reminder, owe it to its run's thread (a placeholder in the
        outbox that a renderer of the thread's platform fills in) and audit it as ``actor``'s,
        in one commit; True only for the first caller, across processes and replicas."""
        ...

    async def first_marked(self, keys: Sequence[str], at: datetime) -> dict[str, datetime]:
        """Mark each of ``keys`` as made at ``at`` unless it was marked before, in one commit;
        when each was first marked (the first caller's ``at``, read alike by every caller:
        when the scheduled prompts were first seen)."""
        ...


class WorkQueue(Protocol):
    """Inbound turns and resumes for any replica to take."""

    async def enqueue_work(self, kind: str, payload: dict[str, Any]) -> int:
        """Add inbound work for any replica and wake the waiting ones; return its id."""
        ...

    async def accept_delivery(self, key: str, payload: dict[str, Any], owner: str) -> int | None:
        """Mark inbound chat delivery ``key`` seen and queue ``payload`` as ``inbound`` work
        already taken by ``owner``, in one commit; the item's id, or None for a delivery marked
        before (a repeat: nothing is queued). Others retake the item only once ``owner`` died."""
        ...

    async def take_once(
        self,
        key: str,
        kind: str,
        payload: dict[str, Any],
        owner: str,
        *,
        also: Sequence[str] = (),
    ) -> int | None:
        """Mark ``key`` (and every key of ``also``) for good and queue ``payload`` as ``kind``
        work already taken by ``owner``, in one commit (a scheduled prompt's occurrence and the
        run it starts); the item's id, or None when any of the keys was marked before (then
        none is marked). Others retake the item only once ``owner`` died."""
        ...

    async def take_work(
        self, owner: str, limit: int = 10, retake_after: float = 60.0
    ) -> list[WorkItem]:
        """Take up to ``limit`` untaken items (or items taken longer ago than ``retake_after``
        seconds and never finished: their taker died); each item goes to one taker at a time."""
        ...

    async def finish_work(self, work_id: int) -> None:
        """Mark an item done so nobody takes it again."""
        ...

    async def wait_for_work(self, timeout: float) -> None:
        """Return when work may have been enqueued (a notification) or after ``timeout``."""
        ...


class ReplicaRegistry(Protocol):
    """Which replicas are alive and which runs they hold."""

    async def heartbeat(self, owner: str, info: str = "") -> None:
        """Record that replica ``owner`` is alive (first call registers it); ``info``
        ``REPLICA_STOPPING`` marks it stopping, for good."""
        ...

    async def forget_replica(self, owner: str) -> None:
        """Unregister replica ``owner``: it stopped cleanly, its leases given up."""
        ...

    async def list_replicas(self, alive_within: float = 60.0) -> list[Replica]:
        """Replicas seen within ``alive_within`` seconds, with the runs they hold leases on."""
        ...


class Outbox(Protocol):
    """Chat messages to show, delivered by any replica at most once each."""

    def now(self) -> datetime:
        """The store's clock: what a message's ``retry_at`` is compared with."""
        ...

    async def put_message(
        self, key: str, platform: str, target: dict[str, Any], body: dict[str, Any]
    ) -> int:
        """Set what message ``key`` should show: insert it, or replace its body when different
        (version + 1, due at once); return its version. An identical body changes nothing.
        ``platform`` and ``target`` are the message's from its first put on (the empty
        target of an answer a run's end left owed takes the first one put)."""
        ...

    async def claim_messages(
        self,
        owner: str,
        lease_seconds: float,
        limit: int = 20,
        platform: str | None = None,
        key: str | None = None,
    ) -> list[OutboxMessage]:
        """Claim due messages (version > delivered_version, next_attempt_at <= now, not
        claimed or claim expired) for ``owner``, oldest first, each by one claimer at a time;
        each claim adds one to ``attempts``. ``key``: just that message."""
        ...

    async def message_delivered(self, key: str, owner: str, version: int, ref: str) -> None:
        """Record that the platform shows ``version`` as ``ref``: releases the claim (if
        ``owner`` still holds it), resets attempts and error. delivered_version only ever
        grows (max). A claimer that lost its claim still records ``ref`` where none is
        recorded yet (its post did land), and never touches another owner's claim."""
        ...

    async def message_failed(self, key: str, owner: str, retry_at: datetime, error: str) -> None:
        """Release ``owner``'s claim; the message is due again at ``retry_at`` (keeps
        ``attempts``). Nothing changes when ``owner`` no longer holds the claim."""
        ...

    async def get_message(self, key: str) -> OutboxMessage | None:
        """One message, or None."""
        ...

    async def get_messages(self, keys: Sequence[str]) -> list[OutboxMessage]:
        """The messages of ``keys`` that exist (any order), read at once."""
        ...

    async def outbox_backlog(self, platform: str | None = None) -> int:
        """How many messages wait for delivery (version > delivered_version)."""
        ...

    async def held_refs(self, platform: str, refs: Sequence[str]) -> set[str]:
        """Which of ``refs`` (the platform's message ids) some message of ``platform`` is
        recorded as (``ref``), read at once."""
        ...


class AuditLog(Protocol):
    """Who requested, decided, answered, expired and resumed what."""

    async def audit(
        self,
        actor: str,
        action: AuditAction,
        run_id: str = "",
        request_id: str = "",
        detail: str = "",
    ) -> None:
        """Record one audited fact."""
        ...

    async def list_audit(
        self, run_id: str | None = None, limit: int = 200, action: str | None = None
    ) -> list[AuditRecord]:
        """The newest ``limit`` audited facts (of one run, of one action, if given), oldest
        first."""
        ...


class Store(
    Admin,
    RunRows,
    SessionPlaces,
    Leases,
    JournalLog,
    Requests,
    OnceMarks,
    WorkQueue,
    ReplicaRegistry,
    Outbox,
    AuditLog,
    Protocol,
):
    """Every role at once: what one backend class implements and the composition root holds.

    Code below the composition root is handed only the roles it uses.
    """
