"""/metrics: the figures a scrape shows match what the test's runs did."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot import __version__
from bot.chat.service import ChatService
from bot.domain import AssistantTurn, DecisionKind, Session, ToolCall, utcnow
from bot.errors import StoreError
from bot.events import RunTakenOverEvent
from bot.journal.entries import AssistantTurnEntry, RunStarted, UserMessageEntry
from bot.journal.fold import RunState
from bot.journal.writer import RunJournal
from bot.people.policy import Actor, Policy, PolicyRules
from bot.prompter import DeferringPrompter
from bot.records import RunRecord
from bot.replica.metrics import CONTENT_TYPE, Metrics
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from storage.sqlite import SqliteStore
from tests.fakes.runtime import Counter, call, counting_tools, make_runtime, reply

POLICY = PolicyRules(requesters=["U0REQ"], approvers={"deploy": ["U0BOSS"]})
USAGE = {"input_tokens": 100, "output_tokens": 7}
AHEAD = timedelta(minutes=5)  # the scrape's clock runs this far ahead of the runs'

Labels = tuple[tuple[str, str], ...]


@dataclass
class World:
    rt: Runtime
    supervisor: Supervisor
    chat: ChatService
    metrics: Metrics
    counter: Counter


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    counter = Counter()
    # Each run gets the reply at its conversation's position: an ok call, a failing one and
    # a deploy that waits for approval; then the answer.
    replies = [
        reply(
            call("echo", text="a"), call("boom", text="b"), call("deploy", text="v2"), usage=USAGE
        ),
        reply(text="done", usage=USAGE),
    ]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, counting_tools(counter))
    rt.policy = Policy(POLICY)
    supervisor = Supervisor(rt)
    chat = ChatService(supervisor)
    metrics = Metrics(
        rt.store, duplicates=lambda: chat.duplicates_dropped, clock=lambda: utcnow() + AHEAD
    )
    chat.subscribe(metrics)
    yield World(rt, supervisor, chat, metrics, counter)
    await rt.store.close()


async def scrape(metrics: Metrics) -> dict[tuple[str, Labels], float]:
    """Every sample of a render, parsed by prometheus_client's own parser."""
    text = (await metrics.render()).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def suspended_run(world: World, prompt: str) -> tuple[str, str]:
    live = await world.chat.submit_turn(prompt, user=Actor("U0REQ"), prompter=DeferringPrompter())
    state = await world.chat.wait(live)
    (request,) = state.open_requests
    return live.run_id, request.id


async def orphan(rt: Runtime) -> None:
    """A run whose owner died mid-batch: marked running, its lease run out, its echo call
    journaled and never answered."""
    await rt.store.ensure_session(Session(id="ses_orphan"))
    record = RunRecord(id="run_orphan", session_id="ses_orphan", requested_by="U0REQ")
    epoch = await rt.store.create_run(record, "dead", 0.0)
    journal = RunJournal(rt.store, RunState("run_orphan"), epoch)
    echo = ToolCall(id="call_1", name="echo", arguments='{"text": "c"}')
    for entry in (
        RunStarted(run_id="run_orphan", session_id="ses_orphan", fingerprint=rt.fingerprint()),
        UserMessageEntry(text="hello"),
        AssistantTurnEntry(iteration=0, turn=AssistantTurn(calls=(echo,))),
    ):
        await journal.append(entry)


async def test_a_scrape_matches_the_runs_the_test_made(world: World) -> None:
    chat = world.chat
    run_a, request_a = await suspended_run(world, "ship v2")
    await suspended_run(world, "ship v3")  # left waiting
    decided = await chat.decide(run_a, request_a, DecisionKind.APPROVE, user=Actor("U0BOSS"))
    assert decided.resumed is not None
    await chat.wait(decided.resumed)
    await orphan(world.rt)
    (adopted,) = [world.supervisor.live[r] for r in await world.supervisor.adopt_orphans()]
    await chat.wait(adopted)
    assert world.counter.calls == {"echo": 3, "boom": 2, "deploy": 1}
    await world.rt.store.put_message("slack:card", "slack", {"channel": "C1"}, {"text": "hi"})
    held = {"what": "mention"}
    assert await chat.accept_delivery("Ev1", "slack", held)
    assert await chat.accept_delivery("Ev1", "slack", held) is None

    figures = await scrape(world.metrics)

    assert figures[("kestrel_iterations_total", ())] == 4
    exits = {
        labels[0][1]: value
        for (name, labels), value in figures.items()
        if name == "kestrel_tool_calls_total"
    }
    assert exits == {
        "ok": 4,  # echo in each run, and run A's deploy once approved
        "error": 2,
        "deferred": 2,
        "timeout": 0,
        "gate_denied": 0,
        "hook_denied": 0,
        "invalid_arguments": 0,
        "unknown_tool": 0,
        "taken_over": 0,
    }
    assert figures[("kestrel_tool_call_seconds_count", (("exit", "ok"),))] == 4
    assert figures[("kestrel_model_call_seconds_count", ())] == 4
    assert figures[("kestrel_model_tokens_total", (("kind", "input"),))] == 400
    assert figures[("kestrel_model_tokens_total", (("kind", "output"),))] == 28
    runs = {
        labels[0][1]: value for (name, labels), value in figures.items() if name == "kestrel_runs"
    }
    assert runs == {"completed": 2, "suspended": 1, "running": 0, "failed": 0, "cancelled": 0}
    approval = (("kind", "wait_approval"),)
    assert figures[("kestrel_open_requests", approval)] == 1
    assert figures[("kestrel_open_requests", (("kind", "wait_user"),))] == 0
    oldest = figures[("kestrel_open_request_oldest_seconds", approval)]
    assert AHEAD.total_seconds() <= oldest < AHEAD.total_seconds() + 60
    decision = (("decision", "approve"), ("kind", "wait_approval"))
    assert figures[("kestrel_request_decision_seconds_count", decision)] == 1
    assert 0 <= figures[("kestrel_request_decision_seconds_sum", decision)] < 60
    assert figures[("kestrel_orphan_adoptions_total", ())] == 1  # not run A's resume
    assert figures[("kestrel_lease_takeovers_total", ())] == 0
    assert figures[("kestrel_outbox_backlog", (("platform", "slack"),))] == 1
    assert figures[("kestrel_outbox_backlog", (("platform", "discord"),))] == 0
    assert figures[("kestrel_chat_duplicates_dropped_total", ())] == 1
    assert figures[("kestrel_store_up", ())] == 1
    # Bounded labels: never a run's or a request's id.
    values = {value for _, labels in figures for _, value in labels}
    assert not any(value.startswith(("run_", "req_")) for value in values)
    assert CONTENT_TYPE.startswith("text/plain")
    # No _created series; the build and the process are described.
    assert not any(name.endswith("_created") for name, _ in figures)
    assert figures[("kestrel_build_info", (("version", __version__),))] == 1
    assert figures[("process_resident_memory_bytes", ())] > 0


async def test_the_backlog_is_shown_only_for_the_platforms_served(world: World) -> None:
    served = Metrics(world.rt.store, platforms=["discord"])
    backlog = [labels for name, labels in await scrape(served) if name == "kestrel_outbox_backlog"]
    assert backlog == [(("platform", "discord"),)]
    assert not [
        name for name, _ in await scrape(Metrics(world.rt.store, platforms=[])) if "backlog" in name
    ]


async def test_takeovers_are_counted_and_a_failing_store_leaves_the_counters(
    world: World,
) -> None:
    world.metrics.emit(RunTakenOverEvent("run_x", "claimed by replica-b"))
    await world.rt.store.close()

    figures = await scrape(world.metrics)

    assert figures[("kestrel_lease_takeovers_total", ())] == 1
    assert figures[("kestrel_store_up", ())] == 0
    assert not any(name == "kestrel_runs" for name, _ in figures)


class _Flaky:
    """The world's store for a scrape, away while ``down``."""

    def __init__(self, rt: Runtime) -> None:
        self._store = rt.store
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise StoreError("PostgreSQL kestrel@db/kestrel: count_runs_by_status failed: gone")

    async def schema_version(self) -> int:
        self._check()
        return await self._store.schema_version()

    async def count_runs_by_status(self) -> dict[str, int]:
        self._check()
        return await self._store.count_runs_by_status()

    async def list_requests(self, **filters: Any) -> list[Any]:
        self._check()
        return list(await self._store.list_requests(**filters))

    async def outbox_backlog(self, platform: str) -> int:
        self._check()
        return await self._store.outbox_backlog(platform)


async def test_a_store_outage_is_said_once_per_outage(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kestrel.metrics")
    store = _Flaky(world.rt)
    metrics = Metrics(store)  # type: ignore[arg-type]
    store.down = True
    for _ in range(3):  # a scraper asks every few seconds for the whole outage
        assert (await scrape(metrics))[("kestrel_store_up", ())] == 0
    store.down = False
    assert (await scrape(metrics))[("kestrel_store_up", ())] == 1
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "kestrel.metrics"]
    assert [level for level, _ in said] == ["WARNING", "INFO"], said
    assert "gone" in said[0][1] and "read again" in said[1][1]


async def test_a_sqlite_journal_moved_under_the_replica_is_no_store_up(tmp_path: Path) -> None:
    # /readyz said "store: unreachable" (every commit goes to a file no restart reads) while
    # the scrape, reading the file still open, said kestrel_store_up 1 with its old figures.
    path = tmp_path / "kestrel.db"
    store = SqliteStore(path)
    await store.migrate()
    try:
        metrics = Metrics(store)
        assert (await scrape(metrics))[("kestrel_store_up", ())] == 1
        path.rename(tmp_path / "moved.db")
        figures = await scrape(metrics)
        assert figures[("kestrel_store_up", ())] == 0
        assert not any(name == "kestrel_runs" for name, _ in figures)
        (tmp_path / "moved.db").rename(path)
        assert (await scrape(metrics))[("kestrel_store_up", ())] == 1
    finally:
        await store.close()


async def test_a_request_a_cut_short_cancel_left_open_is_not_counted_open(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing waits on it and no listing offers it: counted, it aged in the oldest-request
    # gauge for ever, an alert on it with nothing anyone could act on.
    run_id, _request_id = await suspended_run(world, "ship v2")

    async def killed(_run_id: str, _by: str) -> None:
        raise SystemExit  # the process dies after the run's end, before closing its requests

    monkeypatch.setattr(world.supervisor.decisions, "close_requests", killed)
    with pytest.raises(SystemExit):
        await world.chat.cancel(run_id, user=Actor("U0REQ"))
    monkeypatch.undo()
    assert await world.rt.store.list_requests()  # left open on its cancelled run

    figures = await scrape(world.metrics)

    approval = (("kind", "wait_approval"),)
    assert figures[("kestrel_open_requests", approval)] == 0
    assert figures[("kestrel_open_request_oldest_seconds", approval)] == 0
