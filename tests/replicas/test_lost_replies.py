"""A run's end whose commit landed on PostgreSQL while its answer was lost (the connection
dropped after COMMIT): the process that drove the run does not know the end is durable, and
learns it on its next read. A real store behind a TCP proxy that drops that one answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from bot.domain import RunStatus, TerminalResult
from bot.events import Event, RunEndedEvent
from bot.hooks import HookContext, Hooks
from bot.llm.scripted import ScriptedProvider
from bot.prompter import DeferringPrompter
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from bot.tools.source import ToolSource
from bot.tools.toolset import ToolSet
from storage.postgres import PostgresStore
from tests.fakes.runtime import Counter, call, counting_tools, reply
from tests.fakes.tcp_proxy import TcpProxy, proxied_dsn
from tests.fakes.waiting import until
from tests.storage.conftest import postgres_dsn, postgres_schema


@dataclass
class Announced:
    """What a RunEnd hook (an integration) and the event sinks (a thread, metrics) were told."""

    hooked: list[tuple[str, str]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    async def run_end(self, result: TerminalResult, ctx: HookContext) -> None:
        self.hooked.append((ctx.run_id, result.status.value))

    def emit(self, event: Event) -> None:
        if isinstance(event, RunEndedEvent):
            self.events.append(event.run_id)


@dataclass
class Proxied:
    """A runtime whose store is reached through ``proxy``."""

    rt: Runtime
    proxy: TcpProxy
    announced: Announced


@pytest.fixture
async def proxied() -> AsyncIterator[Any]:
    dsn = postgres_dsn()
    async with postgres_schema(dsn) as schema, proxied_dsn(dsn) as (through, proxy):

        async def make(replies: list[dict[str, Any]], lease_seconds: float = 0.5) -> Proxied:
            store = PostgresStore(through, schema=schema)
            await store.migrate()
            announced = Announced()
            rt = Runtime(
                store=store,
                model=ScriptedProvider.from_replies(replies, name="test"),
                tools=ToolSource(ToolSet(counting_tools(Counter()))),
                hooks=Hooks(run_end=[announced.run_end]),
                lease_seconds=lease_seconds,
            )
            rt.events.add(announced)
            made.append(rt)
            return Proxied(rt, proxy, announced)

        made: list[Runtime] = []
        yield make
        for rt in made:
            await rt.store.close()


async def test_an_end_whose_commit_answer_was_lost_is_announced_once(proxied: Any) -> None:
    world: Proxied = await proxied([reply(text="All good.")])
    sup = Supervisor(world.rt)
    world.proxy.lose_commit_reply(b"run_ended")

    live = await sup.start_turn("how is checkout?", requested_by="U0REQ")
    state = await sup.wait(live)

    assert world.proxy.replies_lost == 1  # the end's commit landed; its answer never came
    record = await world.rt.store.get_run(live.run_id)
    assert record.status is RunStatus.COMPLETED
    # The process learned it on its next read: the run's integrations and its thread are told
    # the run ended, once, and whoever waited on it sees how, not a store failure.
    assert world.announced.hooked == [(live.run_id, "completed")]
    assert world.announced.events == [live.run_id]
    assert live.error == ""
    assert state.result is not None and state.result.text == "All good."


async def test_a_cancel_whose_end_commit_answer_was_lost_is_said_done_and_announced(
    proxied: Any,
) -> None:
    world: Proxied = await proxied([reply(call("deploy", text="v2"))])
    sup = Supervisor(world.rt)
    live = await sup.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    assert (await sup.wait(live)).open_requests  # suspended on its card
    world.proxy.lose_commit_reply(b"run_ended")

    said = await sup.cancel(live.run_id, by="U0REQ")

    assert world.proxy.replies_lost == 1
    assert said == "cancelled"  # not a store failure: the end landed, and was read back
    assert (await world.rt.store.get_run(live.run_id)).status is RunStatus.CANCELLED
    assert world.announced.hooked == [(live.run_id, "cancelled")]
    assert world.announced.events == [live.run_id]
    assert await world.rt.store.list_requests(run_id=live.run_id) == []  # its card closed


async def test_an_end_read_back_against_a_store_gone_holds_no_stop(proxied: Any) -> None:
    """The store went as the end's commit landed: the run's task reads it back again and
    again, a third of a lease apart; a stop ends that wait at once, not at the next try."""
    world: Proxied = await proxied([reply(text="All good.")], lease_seconds=30)
    sup = Supervisor(world.rt)
    world.proxy.lose_commit_reply(b"run_ended", then_cut=True)
    live = await sup.start_turn("how is checkout?", requested_by="U0REQ")
    await until(lambda: world.proxy.replies_lost == 1 and world.proxy.refused > 0)

    loop = asyncio.get_running_loop()
    began = loop.time()
    await sup.shutdown(until=began + 8)

    assert loop.time() - began < 2  # not the 10 s to the next read, nor the stop's deadline
    assert live.task is not None and live.task.done()
    world.proxy.restore()
    record = await world.rt.store.get_run(live.run_id)
    assert record.status is RunStatus.COMPLETED  # it landed; this process could not learn it
