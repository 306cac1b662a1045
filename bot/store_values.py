"""The values the store's roles take and return beside the domain's: an audit written with its
change, what a decision settled, an approval counted, an audited fact read back. Apart from
``bot.store``, whose roles are protocols for the type checker alone: a process that decides
(``kestrel runs approve``) builds these and none of those."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

import msgspec

from bot.kinds import AuditAction


class Audited(msgspec.Struct, frozen=True):
    """An audit record written with the change it describes (same run, same request)."""

    actor: str
    action: AuditAction
    detail: str = ""


class Settled(msgspec.Struct, frozen=True):
    """What ``decide_and_claim`` did: whether this decision closed the request, and the new
    epoch when it also took the run's lease (it closed the run's last open request)."""

    won: bool
    epoch: int | None = None


class Counted(msgspec.Struct, frozen=True):
    """What ``add_approval`` did: how many distinct people approved the request now, and
    whether this approver was new (False: they had approved it already and counted once)."""

    count: int
    new: bool


class AuditRecord(Protocol):
    """One audited fact: who did what to which request or run, when."""

    @property
    def at(self) -> datetime:
        """When."""
        ...

    @property
    def actor(self) -> str:
        """Who (a user id, ``deadline``, or a process)."""
        ...

    @property
    def action(self) -> str:
        """What: request, approve, deny, answer, expire, remind, resume, cancel, taken_over…"""
        ...

    @property
    def run_id(self) -> str:
        """The run concerned."""
        ...

    @property
    def request_id(self) -> str:
        """The request concerned, if any."""
        ...

    @property
    def detail(self) -> str:
        """The digest of the call, or other detail."""
        ...
