"""A scheduled prompt whose replica is SIGKILLed right after it claimed the occurrence: another
replica starts the run, once. Real processes, one SQLite file or one PostgreSQL schema."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.config.deadlines import DeadlineSettings
from bot.config.settings import ScheduledPrompt
from bot.replica.schedule import Scheduler
from bot.replica.work import WorkTaker
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from storage.postgres import PostgresStore
from tests.crash.database import STORES, crash_database
from tests.fakes.runtime import make_runtime, reply
from tests.fakes.waiting import until

PROMPTS = [ScheduledPrompt(name="nightly", cron="0 3 * * *", prompt="check the backups")]
AT = datetime(2026, 1, 2, 3, 0, tzinfo=UTC)
# Whichever store call claims an occurrence for good, the process dies once it is durable.
CLAIMS = ("mark_once", "take_once")
# The database the replicas share, as ``crash_database`` gives it: ``db`` and ``schema``.
Database = dict[str, str]


async def replica(db: Database, owner: str) -> tuple[Runtime, Scheduler]:
    """A replica's runtime and scheduler on ``db``, its leases short as in the crash tests."""
    store = None
    if db["db"].startswith("postgresql://"):
        store = PostgresStore(db["db"], schema=db["schema"])
    path = Path(db["db"])
    replies = [reply(text="backups fine")]
    rt, _ = await make_runtime(path, replies, owner=owner, lease_seconds=0.3, store=store)
    await rt.store.migrate()
    return rt, Scheduler(Supervisor(rt), DeadlineSettings(), PROMPTS, store=rt.store)


def dying_after_claim(claim: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def claimed(*args: Any, **kwargs: Any) -> Any:
        won = await claim(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
        return won

    return claimed


async def fire_and_die(db: Database) -> None:
    rt, scheduler = await replica(db, "replica-a")
    for name in CLAIMS:
        if hasattr(rt.store, name):
            setattr(rt.store, name, dying_after_claim(getattr(rt.store, name)))
    await scheduler.fire_prompt("nightly", AT)


def crashed_replica(db: Database) -> int:
    """Fire the occurrence in a forked process killed after its claim; its exit status."""
    pid = os.fork()
    if pid == 0:
        try:
            asyncio.run(fire_and_die(db))
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


async def scheduled_runs(rt: Runtime) -> list[str]:
    return [r.id for r in await rt.store.list_runs() if r.requested_by == "schedule:nightly"]


async def survivor_starts_it(db: Database) -> list[str]:
    rt, scheduler = await replica(db, "replica-b")
    assert await scheduler.fire_prompt("nightly", AT) is None  # the dead replica claimed it
    taker = WorkTaker(scheduler.supervisor, rt.store, poll=0.05)
    taking = asyncio.create_task(taker.run())
    try:
        started: list[str] = await until(lambda: scheduled_runs(rt), timeout=10)
        for live in list(scheduler.supervisor.live.values()):
            await scheduler.supervisor.wait(live)
    finally:
        taker.stop()
        await taking
    # Nothing is left that any replica could take up and start a second time.
    assert await rt.store.take_work("probe", retake_after=0) == []
    await rt.store.close()
    return started


@pytest.mark.parametrize("store_name", STORES)
def test_a_scheduled_prompt_claimed_by_a_replica_that_died_is_started_once(
    tmp_path: Path, store_name: str
) -> None:
    with crash_database(tmp_path, store_name) as db:
        assert crashed_replica(db) == -signal.SIGKILL

        started = asyncio.run(survivor_starts_it(db))

    assert len(started) == 1, started
