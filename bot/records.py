"""The rows the store keeps beside the journal: runs, work, replicas, outbox."""

# No ``from __future__ import annotations``: msgspec would evaluate every field's annotation
# text when it first decodes these (13 ms of a fresh resume).

from datetime import datetime
from typing import Any, Final, Literal, get_args

import msgspec

from bot.domain import DomainModel, RunStatus, utcnow


class RunRecord(DomainModel, frozen=True, kw_only=True):
    """A run's row: identity and the projection of its journal that listings need."""

    id: str
    session_id: str
    prompt: str = ""
    requested_by: str = ""
    status: RunStatus = RunStatus.RUNNING
    stop_reason: str = ""
    owner: str = ""
    epoch: int = 0
    lease_expires: datetime | None = None
    created_at: datetime = msgspec.field(default_factory=utcnow)
    updated_at: datetime = msgspec.field(default_factory=utcnow)


WorkKind = Literal["start", "resume", "inbound"]
WORK_KINDS: Final = frozenset(get_args(WorkKind))


class WorkItem(DomainModel, frozen=True, kw_only=True):
    """Inbound work any replica may take: ``start`` a turn, ``resume`` a run, or handle a chat
    delivery (``inbound``) accepted before it was acknowledged."""

    id: int
    kind: WorkKind
    payload: dict[str, Any] = {}
    created_at: datetime = msgspec.field(default_factory=utcnow)


# A replica's ``info`` once it began to stop: it hands its runs back, and a lease it took
# meanwhile is left to expire, so it drives none of them any more.
REPLICA_STOPPING: Final = "stopping"


class Replica(DomainModel, frozen=True, kw_only=True):
    """A live Kestrel process sharing the store, and the runs it holds leases on."""

    owner: str
    info: str = ""
    started_at: datetime
    last_seen: datetime
    runs: tuple[tuple[str, datetime | None], ...] = ()

    @property
    def stopping(self) -> bool:
        """Whether it began to stop (``REPLICA_STOPPING``): the leases it holds run out."""
        return self.info == REPLICA_STOPPING


class OutboxMessage(DomainModel, frozen=True, kw_only=True):
    """A chat message as the store wants it shown: where, what, and what the platform shows now."""

    key: str  # stable identity, e.g. "slack:card:req_abc"
    platform: str  # "slack", "discord"
    target: dict[str, Any] = {}  # where it goes (channel, thread), platform-specific
    body: dict[str, Any] = {}  # what it should show now, platform-specific
    version: int = 1  # bumped each time the body changes
    delivered_version: int = 0  # the version the platform shows; 0: never delivered
    ref: str = ""  # the platform's id of the posted message ("" until posted)
    attempts: int = 0  # claims since the last delivery (a claim counts as an attempt)
    next_attempt_at: datetime
    error: str = ""  # the last failure, if any
    created_at: datetime
    updated_at: datetime

    @property
    def due(self) -> bool:
        """Whether the platform does not show the current version yet."""
        return self.version > self.delivered_version
