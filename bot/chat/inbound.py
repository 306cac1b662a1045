"""Chat deliveries taken durably before they are acknowledged, then handled exactly once.

A platform acknowledges a delivery (Slack's 200) only once the store holds it: its once-mark
and a work item standing for it commit together (``accept``), so a crash at any instant after
the acknowledgement leaves the delivery to be handled, and a retried delivery is either a
repeat (the mark stands: dropped) or new (nothing committed: accepted). The replica that
accepted it handles it at once (``settle``); if that replica dies first, any replica's work
taker takes the item up once the acceptor's take is older than a lease, and its platform's
handler handles it again. A delivery that starts a run carries the run's id from its
acceptance on, so the run is started once however often the delivery is handled.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from bot.domain import new_id
from bot.errors import StoreError, UnknownRun
from bot.store import OnceMarks, RunRows, WorkQueue

if TYPE_CHECKING:
    from bot.run.supervisor import Supervisor

log = logging.getLogger("kestrel.inbound")

Delivery = dict[str, Any]
# A platform's handling of one delivery it accepted (by this replica or a dead one).
Handler = Callable[[Delivery], Awaitable[None]]


class TryLater(Exception):
    """The platform asked to wait (a rate limit longer than a handler sleeps out): the delivery
    is left unfinished, and a work taker takes it up again once its take is older than a lease.
    """


class InboundStore(WorkQueue, RunRows, OnceMarks, Protocol):
    """The roles inbound deliveries use: the work queue that holds them, whether the run a
    delivery starts exists, and the marks of deliveries passed over."""


class Accepted(msgspec.Struct, frozen=True):
    """A delivery the store holds: its work item, and what the platform's handler reads."""

    work_id: int
    delivery: Delivery

    @property
    def run_id(self) -> str:
        """The id of the run this delivery starts, if it starts one."""
        return str(self.delivery.get("run_id") or "")

    @property
    def answers(self) -> str | None:
        """The question the message may answer, as its thread waited on it when the message
        came ("" for none; None when it was not held so, by an earlier release)."""
        answers = self.delivery.get("answers")
        return None if answers is None else str(answers)


class Inbound:
    """Accepts chat deliveries into the store and hands each to its platform's handler."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor
        self._store: InboundStore = supervisor.rt.store
        self._handlers: dict[str, Handler] = {}

    def handle(self, platform: str, handler: Handler) -> None:
        """Have ``handler`` handle ``platform``'s deliveries (its adapter, at start)."""
        self._handlers[platform] = handler

    def handles(self, platform: str) -> bool:
        """Whether this process handles ``platform``'s deliveries."""
        return platform in self._handlers

    async def accept(self, key: str, platform: str, delivery: Delivery) -> Accepted | None:
        """Hold ``delivery`` (``key`` names it on its platform) for this replica to handle;
        None for a delivery held before (a retry, the twin of a mention): drop it."""
        held = {**delivery, "platform": platform, "run_id": new_id("run")}
        work_id = await self._store.accept_delivery(f"inbound:{key}", held, self._owner)
        return None if work_id is None else Accepted(work_id, held)

    async def pass_over(self, key: str) -> bool:
        """Mark delivery ``key`` as seen without handling it (one found too late to act on);
        True only when nobody accepted or passed it over before."""
        return await self._store.mark_once(f"inbound:{key}")

    async def settle(self, accepted: Accepted) -> None:
        """Handle an accepted delivery, then mark its work done (once a run it started
        exists). A store failure, or a platform that asks to wait (``TryLater``), leaves the
        work to be taken up again; any other failure is the platform's (logged), and the
        delivery is done with."""
        handler = self._handlers.get(str(accepted.delivery.get("platform", "")))
        if handler is None:
            log.info("inbound work %s is another platform's: left to it", accepted.work_id)
            return
        if not await self._started(accepted.run_id):
            try:
                await handler(accepted.delivery)
            except (StoreError, TryLater):
                raise
            except Exception:
                log.exception("handling inbound delivery %s failed", accepted.work_id)
            await self._created(accepted.run_id)
        await self._store.finish_work(accepted.work_id)

    @property
    def _owner(self) -> str:
        return self._supervisor.rt.owner

    async def _started(self, run_id: str) -> bool:
        """Whether the run the delivery starts exists: an earlier handling started it."""
        if not run_id:
            return False
        try:
            await self._store.get_run(run_id)
        except UnknownRun:
            return False
        return True

    async def _created(self, run_id: str) -> None:
        """Wait until the run this process just started exists (or its task ended)."""
        live = self._supervisor.live.get(run_id) if run_id else None
        if live is not None:
            await self._supervisor.begun(live)
