"""Which occurrences of a scheduled prompt a replica starts late, and what one prompt is.

A prompt is the one it was while it keeps its name, or its schedule and text: a rename of an
unchanged prompt, or new words under its name, neither runs an occurrence again nor loses one
missed. An occurrence from before the store first saw the prompt on its schedule is never
started late. Each test runs on SQLite and on PostgreSQL (``KESTREL_TEST_POSTGRES_DSN``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.config.settings import DeadlineSettings, ScheduledPrompt
from bot.events import FanOut
from bot.hooks import Hooks
from bot.kinds import RunStatus
from bot.llm.scripted import ScriptedProvider
from bot.replica.schedule import Scheduler
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from bot.store import Store
from bot.tools.source import ToolSource
from bot.tools.toolset import ToolSet
from storage.postgres import PostgresStore
from storage.sqlite import SqliteStore
from tests.fakes.runtime import reply
from tests.fakes.tcp_proxy import proxied_dsn
from tests.fakes.waiting import until
from tests.storage.conftest import postgres_dsn, postgres_schema

# Far ahead: the jobs a started replica schedules by the real clock never come due in a test.
NINE = datetime(2099, 3, 2, 9, 0, tzinfo=UTC)
NIGHTLY = ScheduledPrompt(name="nightly", cron="0 9 * * *", prompt="check the backups")


@dataclass
class Replicas:
    """One store shared by replicas that start, at a time of the test's choosing, and stop."""

    store: Store

    def scheduler(self, prompts: list[ScheduledPrompt], now: datetime, owner: str) -> Scheduler:
        rt = Runtime(
            store=self.store,
            model=ScriptedProvider.from_replies([reply(text="backups fine")] * 4, name="test"),
            tools=ToolSource(ToolSet([])),
            hooks=Hooks(),
            events=FanOut(),
            owner=owner,
        )
        return Scheduler(
            Supervisor(rt), DeadlineSettings(), prompts, store=self.store, clock=lambda: now
        )

    async def start(self, prompts: list[ScheduledPrompt], now: datetime, owner: str = "r1") -> None:
        """A replica with ``prompts`` starts at ``now`` (catching up what it should) and stops."""
        scheduler = self.scheduler(prompts, now, owner)
        await scheduler.start()
        await scheduler.stop()

    async def runs(self) -> list[str]:
        """The scheduled runs, once each has ended: who requested them."""
        every = await self.store.list_runs()
        records = [r for r in every if r.requested_by.startswith("schedule:")]

        async def ended() -> bool:
            statuses = [(await self.store.get_run(r.id)).status for r in records]
            return all(status is RunStatus.COMPLETED for status in statuses)

        await until(ended)
        return sorted(r.requested_by for r in records)


@pytest.fixture(params=["sqlite", "postgres"])
async def replicas(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Replicas]:
    if request.param == "sqlite":
        store: Store = SqliteStore(tmp_path / "k.db")
        await store.migrate()
        yield Replicas(store)
        await store.close()
        return
    dsn = postgres_dsn()
    async with postgres_schema(dsn) as schema:
        store = PostgresStore(dsn, schema=schema)
        await store.migrate()
        yield Replicas(store)
        await store.close()


async def test_a_prompt_added_after_its_occurrence_does_not_start_it_late(
    replicas: Replicas,
) -> None:
    # Added at 09:02 with a 09:00 cron and five minutes' grace: 09:00 was never its to miss.
    await replicas.start([NIGHTLY], NINE + timedelta(minutes=2))
    await replicas.start([NIGHTLY], NINE + timedelta(minutes=3))  # nor at its next start
    assert await replicas.runs() == []


async def test_a_prompt_seen_before_its_occurrence_starts_it_late_once(replicas: Replicas) -> None:
    await replicas.start([NIGHTLY], NINE - timedelta(minutes=10))
    # 09:00 fell while no replica ran; two start together at 09:02.
    later = NINE + timedelta(minutes=2)
    await asyncio.gather(
        replicas.start([NIGHTLY], later, "r1"), replicas.start([NIGHTLY], later, "r2")
    )
    assert await replicas.runs() == ["schedule:nightly"]


async def test_a_renamed_prompt_does_not_run_an_occurrence_again(replicas: Replicas) -> None:
    before = replicas.scheduler([NIGHTLY], NINE - timedelta(minutes=10), "r1")
    await before.start()
    assert await before.fire_prompt("nightly", NINE) is not None  # 09:00 runs on time
    await before.stop()
    renamed = ScheduledPrompt(name="backups", cron="0  9 * * *", prompt=NIGHTLY.prompt)
    await replicas.start([renamed], NINE + timedelta(minutes=2))
    assert await replicas.runs() == ["schedule:nightly"]


async def test_a_renamed_prompt_still_starts_the_occurrence_it_missed(replicas: Replicas) -> None:
    await replicas.start([NIGHTLY], NINE - timedelta(minutes=10))
    renamed = ScheduledPrompt(name="backups", cron=NIGHTLY.cron, prompt=NIGHTLY.prompt)
    await replicas.start([renamed], NINE + timedelta(minutes=2))
    assert await replicas.runs() == ["schedule:backups"]


async def test_new_words_under_the_same_name_do_not_run_an_occurrence_again(
    replicas: Replicas,
) -> None:
    before = replicas.scheduler([NIGHTLY], NINE - timedelta(minutes=10), "r1")
    await before.start()
    assert await before.fire_prompt("nightly", NINE) is not None
    await before.stop()
    reworded = ScheduledPrompt(name="nightly", cron=NIGHTLY.cron, prompt="check every backup")
    await replicas.start([reworded], NINE + timedelta(minutes=2))
    assert await replicas.runs() == ["schedule:nightly"]


async def test_a_prompt_renamed_and_reworded_is_a_new_one(replicas: Replicas) -> None:
    await replicas.start([NIGHTLY], NINE - timedelta(minutes=10))
    other = ScheduledPrompt(name="backups", cron=NIGHTLY.cron, prompt="check every backup")
    await replicas.start([other], NINE + timedelta(minutes=2))
    assert await replicas.runs() == []


async def test_a_schedule_moved_onto_an_occurrence_just_past_does_not_start_it_late(
    replicas: Replicas,
) -> None:
    # Known at 08:00 on a 08:00 cron; moved to 09:00 at 09:02: 09:00 was never its to miss.
    early = ScheduledPrompt(name="nightly", cron="0 8 * * *", prompt=NIGHTLY.prompt)
    await replicas.start([early], NINE - timedelta(minutes=50))
    await replicas.start([NIGHTLY], NINE + timedelta(minutes=2))
    assert await replicas.runs() == []


async def test_replicas_of_a_rolling_rename_start_an_occurrence_once(replicas: Replicas) -> None:
    # During a rolling update the old replica knows the prompt by its old name, the new one by
    # the new: both fire 09:00.
    renamed = ScheduledPrompt(name="backups", cron=NIGHTLY.cron, prompt=NIGHTLY.prompt)
    old = replicas.scheduler([NIGHTLY], NINE, "old")
    new = replicas.scheduler([renamed], NINE, "new")
    fired = await asyncio.gather(old.fire_prompt("nightly", NINE), new.fire_prompt("backups", NINE))
    assert sum(live is not None for live in fired) == 1
    assert len(await replicas.runs()) == 1


async def test_a_start_asks_the_store_alike_for_one_prompt_and_for_hundreds() -> None:
    # Each prompt's first sighting was two transactions of its own, one after another, before
    # the replica took any work: 500 prompts held a start for seconds on a nearby PostgreSQL,
    # and for as many round trips again as a distant one is away.
    dsn = postgres_dsn()
    async with postgres_schema(dsn) as schema, proxied_dsn(dsn) as (through, proxy):
        store = PostgresStore(through, schema=schema)
        await store.migrate()
        replicas = Replicas(store)
        await replicas.start([NIGHTLY], NINE + timedelta(hours=1))  # statements prepared
        sent = proxy.sent
        await replicas.start([NIGHTLY], NINE + timedelta(hours=2))
        one = proxy.sent - sent
        many = [
            ScheduledPrompt(name=f"check-{n}", cron=f"{n % 60} 8 * * *", prompt=f"check {n}")
            for n in range(300)
        ]
        sent = proxy.sent
        await replicas.start(many, NINE + timedelta(hours=3))
        hundreds = proxy.sent - sent
        await store.close()
        assert hundreds <= one + 10, (one, hundreds)
