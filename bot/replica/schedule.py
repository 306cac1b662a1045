"""Deadlines, reminders and scheduled prompts on APScheduler 3.

The store is the truth: deadlines live on the requests, and every firing goes through a
conditional write (``decide``, ``mark_once``, or ``take_once`` for a scheduled prompt), so a
restart rebuilds the jobs from the store and two processes sharing it never fire the same
thing twice.

A scheduled prompt is the one it was while it keeps its name, or its schedule and text
(``PromptIdentity``): an occurrence is claimed under both, so neither a rename of an unchanged
prompt nor new words under its name runs an occurrence again, and replicas of a rolling update
that know it by either start it once. An occurrence missed while no replica ran is started
late only if it fell after the store first saw the prompt on its schedule (by either identity):
a prompt added at 09:02 with a 09:00 cron, or moved onto 09:00 then, starts at its next
occurrence, not at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger as Trigger
from apscheduler.triggers.date import DateTrigger

from bot import wire
from bot.config.cron import cron_fields, parse_cron
from bot.config.deadlines import DeadlineSettings
from bot.config.settings import ScheduledPrompt
from bot.digest import sha256
from bot.domain import Request, Session, new_id
from bot.errors import StoreError
from bot.events import Event, RequestOpenedEvent, RequestReminderEvent
from bot.replica.work import until_created
from bot.run.supervisor import LiveRun, Supervisor
from bot.store import AuditLog, OnceMarks, Requests, WorkQueue

log = logging.getLogger("kestrel.schedule")


class SchedulerStore(Requests, OnceMarks, WorkQueue, AuditLog, Protocol):
    """The roles the scheduler uses: open requests, once-marks, the work a scheduled prompt
    starts, and the audit."""


class Scheduler:
    """Expires requests at their deadline, reminds on-call before it, starts scheduled prompts."""

    def __init__(
        self,
        supervisor: Supervisor,
        deadlines: DeadlineSettings,
        prompts: list[ScheduledPrompt],
        *,
        store: SchedulerStore,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.store = store
        self.deadlines = deadlines
        self.prompts = {p.name: (p, parse_cron(p.cron)) for p in prompts}
        self.clock = clock or supervisor.rt.clock  # the runtime's, unless told otherwise
        self._aps: AsyncIOScheduler | None = None

    async def start(self) -> None:
        """Sweep what fell due while no process ran and start the scheduled prompts it missed
        (within their grace), then schedule jobs from the store."""
        self._aps = AsyncIOScheduler(timezone="UTC")
        self._aps.start()
        await self.sweep()
        for request, _status, _decision in await self.store.list_requests():
            self._schedule_request(request)
        now = self.clock()
        await self._catch_up(now)
        for name in self.prompts:
            self._schedule_prompt(name, now)
        # Other replicas open requests this one hears nothing of: sweep the store regularly.
        every = max(self.supervisor.rt.lease_seconds / 2, 1.0)
        self._aps.add_job(
            _job(self.supervisor.adopt_orphans), "interval", seconds=every, id="adopt"
        )
        self._aps.add_job(_job(self.sweep), "interval", seconds=every, id="sweep")
        self.supervisor.rt.events.add(self)

    async def stop(self) -> None:
        """Drop every job (nothing is lost: the store keeps the deadlines)."""
        if self._aps is not None:
            self._aps.shutdown(wait=False)
            self._aps = None

    def emit(self, event: Event) -> None:
        """Event sink: a newly opened request gets its deadline and reminder jobs."""
        if isinstance(event, RequestOpenedEvent) and self._aps is not None:
            self._schedule_request(event.request)

    async def sweep(self, now: datetime | None = None) -> tuple[list[str], list[str]]:
        """Expire every request past its deadline and remind those close to it, as of ``now``."""
        now = now or self.clock()
        expired, near = [], []
        for request, _status, _decision in await self.store.list_requests():
            if request.deadline is None:
                continue
            if request.deadline <= now:
                if await self.supervisor.expire(request):
                    expired.append(request.id)
            elif request.deadline - self._remind_before() <= now:
                near.append(request)
        return expired, await self._remind_waiting(near)

    async def _remind_waiting(self, near: list[Request]) -> list[str]:
        """Remind those of ``near`` whose run still waits on them: not one a cancel cut short
        left open on its ended run, whose thread would be told that it still waits (its
        deadline still closes it, and its card with it). Read only when one is near."""
        if not near:
            return []
        waiting = {r.id for r, _, _ in await self.store.list_requests(unfinished_runs=True)}
        return [r.id for r in near if r.id in waiting and await self._remind(r)]

    async def fire_prompt(self, name: str, at: datetime) -> LiveRun | None:
        """Start the scheduled prompt for the occurrence ``at``, once across all processes.

        The occurrence is claimed with the run's ``start`` work, taken by this replica, in one
        commit: a replica that dies before the run exists leaves the work to another, where a
        bare mark would have left the occurrence claimed and its run never started."""
        prompt, _trigger = self.prompts[name]
        keys = PromptIdentity.of(prompt).occurrence(at)
        start = scheduled_start(name, prompt.prompt)
        owner = self.supervisor.rt.owner
        work_id = await self.store.take_once(keys[0], "start", start, owner, also=keys[1:])
        if work_id is None:
            return None
        live = await self.supervisor.start_turn(
            prompt.prompt,
            session=wire.from_plain(start["session"], Session),
            requested_by=start["requested_by"],
            run_id=start["run_id"],
        )
        if not await until_created(self.supervisor, live):
            # The store refused the run: the item, left taken, is taken up again (work.py).
            log.warning("scheduled prompt %s: run %s left to be started again", name, live.run_id)
            return live
        await self.store.finish_work(work_id)
        log.info("scheduled prompt %s started run %s", name, live.run_id)
        return live

    async def _catch_up(self, now: datetime) -> None:
        """Start each prompt's latest occurrence that fell within its grace before ``now``
        (while no replica ran) and after the store first saw the prompt, unless a replica
        took it then or takes it now. When the prompts were first seen is asked of the store
        once, whatever their number; a store failure is said, and the replica starts without
        what it would have started late."""
        identities = {name: PromptIdentity.of(prompt) for name, (prompt, _) in self.prompts.items()}
        keys = [key for identity in identities.values() for key in identity.seen()]
        try:
            marked = await self.store.first_marked(keys, now)
        except StoreError as exc:
            log.warning(
                "scheduled prompts: occurrences that fell while no replica ran may not have"
                " been started late: %s",
                exc,
            )
            return
        for name, identity in identities.items():
            await self._start_missed(name, now, min(marked[key] for key in identity.seen()))

    async def _start_missed(self, name: str, now: datetime, seen: datetime) -> None:
        """Start the latest occurrence of prompt ``name`` in its grace before ``now`` and not
        before ``seen`` (when the store first saw it); a store failure is said."""
        prompt, trigger = self.prompts[name]
        since = max(now - timedelta(seconds=prompt.grace_seconds), seen)
        missed = latest_before(trigger, now, since)
        if missed is None:
            return
        try:
            live = await self.fire_prompt(name, missed)
        except StoreError as exc:
            log.warning(
                "scheduled prompt %s: its %s occurrence fell while no replica ran and was not"
                " started late: %s",
                name,
                missed.isoformat(),
                exc,
            )
            return
        if live is not None:
            log.warning(
                "scheduled prompt %s: its %s occurrence fell while no replica ran; started late",
                name,
                missed.isoformat(),
            )

    async def _remind(self, request: Request) -> bool:
        # Claimed, owed to the thread and audited in one commit: the thread's renderer, here or
        # in any replica, shows it (this one may serve no platform of the thread's, or die now).
        if not await self.store.remind_once(request, "deadline"):
            return False
        self.supervisor.rt.events.emit(RequestReminderEvent(request.run_id, request))
        return True

    def _remind_before(self) -> timedelta:
        return timedelta(seconds=self.deadlines.remind_before)

    def _schedule_request(self, request: Request) -> None:
        if request.deadline is None or self._aps is None:
            return
        for when in (request.deadline - self._remind_before(), request.deadline):
            self._aps.add_job(
                _job(self.sweep),
                DateTrigger(run_date=max(when, self.clock())),
                id=f"{request.id}:{when.isoformat()}",
                replace_existing=True,
                misfire_grace_time=None,
            )

    def _schedule_prompt(self, name: str, after: datetime) -> None:
        if self._aps is None:
            return
        _prompt, trigger = self.prompts[name]
        at = trigger.get_next_fire_time(None, after)
        if at is None:
            return
        self._aps.add_job(
            _job(self._occurrence),
            DateTrigger(run_date=at),
            args=(name, at),
            id=f"cron:{name}",
            replace_existing=True,
            misfire_grace_time=None,
        )

    async def _occurrence(self, name: str, at: datetime) -> None:
        self._schedule_prompt(name, at + timedelta(seconds=1))
        await self.fire_prompt(name, at)


@dataclass(frozen=True)
class PromptIdentity:
    """What makes a scheduled prompt the one it was: its name, or its schedule and text (its
    cron's fields, however spaced, and its prompt exactly, as a digest)."""

    name: str
    cron: str  # its fields, one space apart
    digest: str  # of the cron and the prompt's text

    @classmethod
    def of(cls, prompt: ScheduledPrompt) -> PromptIdentity:
        """``prompt``'s identity."""
        cron = cron_fields(prompt.cron)
        digest = sha256(f"{cron}\n{prompt.prompt}".encode()).hexdigest()[:32]
        return cls(prompt.name, cron, digest)

    def occurrence(self, at: datetime) -> tuple[str, str]:
        """The once-keys of the occurrence ``at``: by name (as before identities had two
        keys), and by schedule and text."""
        return f"cron:{self.name}:{at.isoformat()}", f"cron-text:{self.digest}:{at.isoformat()}"

    def seen(self) -> tuple[str, str]:
        """The once-keys that hold when the store first saw the prompt on its schedule: by
        name and schedule, and by schedule and text (a schedule moved onto an occurrence just
        past never had it to miss)."""
        return f"cron-seen:name:{self.cron}:{self.name}", f"cron-seen:text:{self.digest}"


def latest_before(trigger: Trigger, now: datetime, since: datetime) -> datetime | None:
    """The latest fire time of ``trigger`` in ``[since, now)``, or None: searched by halving
    (a cron fires on whole seconds), not by stepping through every occurrence, which for a
    six-field cron and a long grace held the start for minutes."""

    def fires_before_now(after: datetime) -> datetime | None:
        at = trigger.get_next_fire_time(None, after)
        return at if at is not None and at < now else None

    first = fires_before_now(since)
    if first is None:
        return None
    # The latest is at or after ``first``: the last second ``s`` with a fire in [s, now).
    latest, high = first, now
    while high - latest > timedelta(seconds=1):
        middle = latest + (high - latest) / 2
        found = fires_before_now(middle)
        if found is None:
            high = middle
        else:
            latest = found
    return latest


def scheduled_start(name: str, prompt: str) -> dict[str, Any]:
    """The ``start`` work of one occurrence of scheduled prompt ``name``: its run and session
    named up front, so whichever replica takes the work starts that one run."""
    session = Session(id=new_id("ses"))
    return {
        "run_id": new_id("run"),
        "session": wire.to_plain(session),
        "prompt": prompt,
        "requested_by": f"schedule:{name}",
        "scheduled": True,
    }


def _job(work: Callable[..., Awaitable[object]]) -> Callable[..., Awaitable[None]]:
    """``work`` as a scheduler job: a job under way when the scheduler shuts down is cancelled,
    which APScheduler would log with a traceback; it is said in one debug line instead. A
    store failure is one warning until the job works again (APScheduler said it at each run)."""

    name = getattr(work, "__name__", work)
    failing = False

    @functools.wraps(work)
    async def job(*args: object) -> None:
        nonlocal failing
        try:
            await work(*args)
        except asyncio.CancelledError:
            log.debug("scheduler: %s stopped at shutdown", name)
            return
        except StoreError as exc:
            # The store is away: said once (not at each sweep, every few seconds), and the
            # job runs again at its next time.
            if not failing:
                log.warning("scheduler: %s failed, trying again at its next time: %s", name, exc)
            failing = True
            return
        if failing:
            # At the failure's level: a blip (a connection ended) shows no other line.
            log.warning("scheduler: %s works again", name)
        failing = False

    return job
