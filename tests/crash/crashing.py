"""The real stores, killed on cue: right after the N-th durable append (or decision, claim or
audit) of a given kind, the process sends itself SIGKILL, as a crash would. Mixed into each
backend; used by the crash tests' harness (``child.py``) and by the real command line
(``cli_crashing.py``)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from bot.domain import Decision, RequestStatus, Session
from bot.journal.entries import Entry
from bot.records import RunRecord
from bot.store_values import Audited, Counted, Settled
from storage.postgres import PostgresStore
from storage.sql_store import SqlStore
from storage.sqlite import SqliteStore


class CrashingStore(SqlStore):
    """The real store, killed right after a chosen append is durable (mixed into a backend)."""

    _kind, _left = "", 0

    def crash_after(self, kind: str, nth: int) -> None:
        """Die right after the ``nth`` durable append (or decision) of ``kind``."""
        self._kind, self._left = kind, nth

    def submit(self, run_id: str, seq: int, epoch: int, entry: Entry) -> asyncio.Future[None]:
        # A backend's own submit: this class is only ever mixed in before one (below).
        done = super().submit(run_id, seq, epoch, entry)  # type: ignore[safe-super]
        if self._due(entry):
            done.add_done_callback(lambda _: os.kill(os.getpid(), signal.SIGKILL))
        return done

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
        """A run's first entries are appended with its row: killed once that commit is durable."""
        epoch = await super().create_run(run, owner, lease_seconds, session, entries, alone=alone)
        if any([self._due(entry) for entry in entries]):
            os.kill(os.getpid(), signal.SIGKILL)
        return epoch

    async def decide_and_claim(
        self,
        decision: Decision,
        status: RequestStatus,
        audit: Audited,
        owner: str,
        lease_seconds: float,
    ) -> Settled:
        """Crash kind ``decided``: killed once the decision (and the lease it took) is durable."""
        settled = await super().decide_and_claim(decision, status, audit, owner, lease_seconds)
        self._write_done("decided")
        return settled

    async def add_approval(
        self, request_id: str, by: str, audit: Audited | None = None
    ) -> Counted | None:
        """Crash kind ``approved_partial``: killed once one approval of a request that needs
        several is durable (the request still open, whether or not it was the last needed)."""
        counted = await super().add_approval(request_id, by, audit)
        self._write_done("approved_partial")
        return counted

    async def decide(
        self, decision: Decision, status: RequestStatus, audit: Audited | None = None
    ) -> bool:
        """Crash kind ``closed``: killed once a request closed without the lease (a cancel's
        closing of the run's requests) is durable."""
        won = await super().decide(decision, status, audit)
        self._write_done("closed")
        return won

    async def claim(
        self, run_id: str, owner: str, lease_seconds: float, *, force: bool = False
    ) -> int | None:
        """Crash kind ``claimed``: killed once a lease taken to resume the run is durable."""
        epoch = await super().claim(run_id, owner, lease_seconds, force=force)
        self._write_done("claimed")
        return epoch

    async def audit(
        self, actor: str, action: str, run_id: str = "", request_id: str = "", detail: str = ""
    ) -> None:
        """Crash kind ``audited``: killed once an audit record written on its own is durable
        (an inline decision's, before the call it allows runs)."""
        await super().audit(actor, action, run_id, request_id, detail)
        self._write_done("audited")

    def _write_done(self, kind: str) -> None:
        """Die if this was the ``nth`` durable write of ``kind`` asked for."""
        if self._kind == kind:
            self._left -= 1
            if self._left == 0:
                os.kill(os.getpid(), signal.SIGKILL)

    def _due(self, entry: Entry) -> bool:
        if entry.kind != self._kind:
            return False
        self._left -= 1
        return self._left == 0


class CrashingSqlite(CrashingStore, SqliteStore):
    """The SQLite store, killed on cue."""


class CrashingPostgres(CrashingStore, PostgresStore):
    """The PostgreSQL store, killed on cue: each append is a commit of its own there."""


def crashing_store(db: str, schema: str) -> CrashingStore:
    """The store at ``db``: a PostgreSQL DSN (in ``schema``), else a SQLite file."""
    if db.startswith("postgresql://"):
        return CrashingPostgres(db, schema=schema)
    return CrashingSqlite(Path(db))
