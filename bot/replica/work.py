"""Work distribution: inbound turns and resumes go through the store, so any replica can
accept an event and any can run it; each item is taken by one replica at a time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from bot import wire
from bot.chat.inbound import Accepted, Inbound, TryLater
from bot.domain import Session
from bot.errors import ResumeRefused, StoreError, UnknownRun, UnreadableJournal
from bot.people.policy import Actor
from bot.prompter import DeferringPrompter
from bot.records import WorkItem
from bot.run.supervisor import LiveRun, Supervisor
from bot.store import ReplicaRegistry, RunRows, WorkQueue

log = logging.getLogger("kestrel.work")


class TakerStore(WorkQueue, ReplicaRegistry, RunRows, Protocol):
    """The roles a work taker uses: the queue, its heartbeat, and whether a run exists."""


class WorkTaker:
    """Submits work to the store and runs the work this replica takes."""

    def __init__(
        self,
        supervisor: Supervisor,
        store: TakerStore,
        *,
        poll: float = 1.0,
        batch: int = 10,
        inbound: Inbound | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.store = store
        # The chat deliveries a replica that died accepted: handled by their platform here.
        self.inbound = inbound
        self.poll = poll
        self.batch = batch
        self._stopping = asyncio.Event()

    async def submit_resume(self, run_id: str) -> None:
        """Queue a resume (after the last answer a run waited for)."""
        await self.store.enqueue_work("resume", {"run_id": run_id})

    async def run(self) -> None:
        """Take and run work until ``stop``; heartbeat while at it."""
        rt = self.supervisor.rt
        unreachable = False
        while not self._stopping.is_set():
            try:
                await self.store.heartbeat(rt.owner)
                items = await self.store.take_work(
                    rt.owner, self.batch, retake_after=rt.lease_seconds
                )
                for item in items:
                    await self._handle(item)
            except StoreError as exc:
                if self._stopping.is_set():
                    # What was under way when the replica stopped: it tries nothing again,
                    # and the stop says itself whether the store answered.
                    return
                # The store is away (restarted, unreachable): keep looking, or this replica
                # would never heartbeat nor take work again once it is back.
                if not unreachable:
                    log.warning("work: the store failed, trying again every poll: %s", exc)
                unreachable = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.poll)
                continue
            if unreachable:
                # At the failure's level: a blip (a connection ended) shows no other line.
                log.warning("work: the store answers again")
                unreachable = False
            if not items:
                with contextlib.suppress(StoreError):
                    await self.store.wait_for_work(self.poll)

    def stop(self) -> None:
        """Stop taking work (live runs are the supervisor's to suspend)."""
        self._stopping.set()

    async def _handle(self, item: WorkItem) -> None:
        if item.kind == "inbound":
            await self._inbound(item)
            return
        try:
            if item.kind != "start":
                await self._resume(str(item.payload["run_id"]))
            elif not await self._start(item.payload):
                log.warning("start work %s left to be taken up again: the store failed", item.id)
                return
        except (KeyError, ValueError) as exc:
            log.warning("dropping malformed work item %s: %s", item.id, exc)
        if self.supervisor.stopping:
            # A stopping process takes up no run: a resume it took gave the run back (released,
            # suspended) and nothing else would take it up. Left taken, the item is taken again
            # by a live replica once it is older than a lease.
            log.info("work %s left to another replica: this one is stopping", item.id)
            return
        await self.store.finish_work(item.id)

    async def _inbound(self, item: WorkItem) -> None:
        platform = str(item.payload.get("platform", ""))
        if self.inbound is None or not self.inbound.handles(platform):
            # Left taken: once it is older than a lease, a replica serving that platform may
            # take it up.
            log.info("inbound work %s is for %s, not served here", item.id, platform or "?")
            return
        try:
            await self.inbound.settle(Accepted(item.id, item.payload))
        except (StoreError, TryLater) as exc:
            log.warning("inbound work %s left to be taken up again: %s", item.id, exc)

    async def _start(self, payload: dict[str, Any]) -> bool:
        """Start the run ``payload`` names; whether the item is done (``until_created``)."""
        run_id = str(payload["run_id"])
        if await self._exists(run_id):
            return True  # a replica that died after creating it left it to orphan adoption
        session = wire.from_plain(payload["session"], Session)
        requester = Actor(str(payload.get("requested_by", "")))
        # A scheduled prompt is the operator's, from the configuration: it starts here as it
        # would have on the replica that claimed it, whoever policy.requesters names.
        scheduled = payload.get("scheduled") is True
        if not scheduled and not await self.supervisor.rt.policy.may_start(
            requester, session.place
        ):
            log.warning("%s may not start runs (policy.requesters): dropped", requester.user)
            return True
        live = await self.supervisor.start_turn(
            str(payload["prompt"]),
            session=session,
            requested_by=requester.user,
            prompter=DeferringPrompter() if payload.get("prompter") else None,
            run_id=run_id,
        )
        return await until_created(self.supervisor, live)

    async def _resume(self, run_id: str) -> None:
        try:
            await self.supervisor.resume(run_id)
        except ResumeRefused as exc:
            log.info("resume of %s left to its owner: %s", run_id, exc)
        except UnknownRun:
            log.warning("resume of unknown run %s dropped", run_id)
        except UnreadableJournal as exc:
            # Taken up again, it would fail alike and hold up the items after it.
            log.error("resume of %s dropped until its journal is repaired: %s", run_id, exc)

    async def _exists(self, run_id: str) -> bool:
        try:
            await self.store.get_run(run_id)
        except UnknownRun:
            return False
        return True


async def until_created(supervisor: Supervisor, live: LiveRun) -> bool:
    """Wait until the run's record exists (or its task ended): whether the work item that
    starts it is done. It is not when the store refused the run's creation (it is away): left
    taken, the item is taken again once older than a lease, and the run started then."""
    return await supervisor.begun(live) or not live.error
