"""Two replicas on one PostgreSQL store behind one Slack app: a click taken by one replica
resumes a run the other started; the card and the answer land once."""

from __future__ import annotations

import contextlib
import json
from datetime import timedelta
from pathlib import Path

import pytest

from adapters.slack import ids
from bot.cli import compose
from bot.config.settings import load_settings
from bot.replica.schedule import Scheduler
from bot.run.supervisor import Supervisor
from tests.fakes.slack_api import Call, FakeSlackApi
from tests.fakes.slack_client import slash_command
from tests.fakes.slack_world import APPROVER, ONCALL, posted_ts, restart_script, slack_world
from tests.fakes.tcp_proxy import proxied_dsn
from tests.storage.conftest import postgres_dsn, postgres_schema


async def test_a_click_on_one_replica_resumes_a_run_the_other_started(tmp_path: Path) -> None:
    dsn = postgres_dsn()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with postgres_schema(dsn) as schema, FakeSlackApi() as api:
        database = f"{dsn}?schema={schema}"
        async with (
            slack_world(tmp_path / "a", restart_script(), api=api, database=database) as a,
            slack_world(tmp_path / "b", restart_script(), api=api, database=database) as b,
        ):
            await a.mention("checkout is failing")
            card = await a.card()
            await a.settled()
            # Slack delivers the click to the other replica's endpoint.
            await b.click(card, ids.APPROVE_ONCE, user=APPROVER)
            await b.answer_posted()
            for world in (a, b):
                await world.settled()
            assert a.executions + b.executions == ["checkout"]
            answers = [c for c in api.calls_to("chat.postMessage") if ids.FEEDBACK in str(c.args)]
            cards = [c for c in api.calls_to("chat.postMessage") if ids.APPROVE_ONCE in str(c.args)]
            assert (len(answers), len(cards)) == (1, 1)
            ts = posted_ts(api, card)
            updates = [c for c in api.calls_to("chat.update") if c.args.get("ts") == ts]
            assert updates and APPROVER in json.dumps(updates[-1].args["blocks"])
            run_id = (await b.chat.recent(1))[0].id
            assert (await b.chat.status(run_id)).record.status.value == "completed"


async def test_a_click_the_store_could_not_take_is_said_to_the_clicker(tmp_path: Path) -> None:
    """Slack never sends a click again: one acknowledged while the store was away must not
    vanish without a word, or the approver believes the call approved."""
    dsn = postgres_dsn()
    async with postgres_schema(dsn) as schema, proxied_dsn(dsn) as (proxied, proxy):
        database = f"{proxied}?schema={schema}"
        async with slack_world(tmp_path, restart_script(), database=database) as world:
            await world.mention("checkout is failing")
            card = await world.card()
            await world.settled()
            proxy.cut()
            for button in (ids.APPROVE_ONCE, ids.DENY):  # a decision; a form to open
                await world.click(card, button, user=APPROVER)
            notes = await world.api.wait_for("chat.postEphemeral", count=2)
            assert [note.args["text"] for note in notes] == [
                "Kestrel's store did not answer: that click may not have counted."
                " Click again in a moment."
            ] * 2
            assert not world.api.calls_to("views.open")
            proxy.restore()
            await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
            await world.answer_posted()
            await world.settled()
            assert world.executions == ["checkout"]


async def test_a_slash_command_the_store_could_not_serve_is_answered(tmp_path: Path) -> None:
    """``/kestrel cancel RUN`` in an incident, while the store is away: the person is told the
    cancel may not have counted and to ask it again, not left with no answer at all."""
    dsn = postgres_dsn()
    async with postgres_schema(dsn) as schema, proxied_dsn(dsn) as (proxied, proxy):
        database = f"{proxied}?schema={schema}"
        async with slack_world(tmp_path, restart_script(), database=database) as world:
            await world.mention("checkout is failing")
            await world.card()
            await world.settled()
            run_id = (await world.chat.recent(1))[0].id
            proxy.cut()
            for text in (f"cancel {run_id}", "runs"):
                await world.sender.command(slash_command(ONCALL, text))
            answers = await world.api.wait_for("response_url", count=2)
            # The cancel is said not to have counted: the run may go on, and must be cancelled
            # again (a "try again" alone read as if it would be retried for them).
            assert [a.args["text"] for a in answers] == [
                f"Kestrel's store did not answer: the cancel of run {run_id} may not have"
                " counted, and the run may go on. Cancel it again in a moment.",
                "Kestrel's store did not answer: try again in a moment.",
            ]


def _is_reminder(call: Call) -> bool:
    return call.method == "chat.postMessage" and "Reminder:" in json.dumps(call.args)


@pytest.mark.parametrize("first", ["bare", "slack"])
@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_a_reminder_reaches_the_thread_once_whichever_replica_claims_it(
    tmp_path: Path, store: str, first: str
) -> None:
    # A replica that serves no platform of the thread's (`kestrel serve` alone, or `serve
    # discord`) swept first: it claimed the reminder and rendered it nowhere, and the Slack
    # replica's sweep found it claimed. On-call was never reminded.
    async with contextlib.AsyncExitStack() as stack:
        database = ""
        if store == "postgres":
            dsn = postgres_dsn()
            database = f"{dsn}?schema={await stack.enter_async_context(postgres_schema(dsn))}"
        world = await stack.enter_async_context(
            slack_world(tmp_path, restart_script(), database=database)
        )
        await world.mention("checkout is failing")
        await world.card()
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id
        (view,) = await world.chat.requests_of(run_id)
        assert view.request.deadline is not None
        soon = view.request.deadline - timedelta(seconds=60)
        settings = load_settings(str(tmp_path / "kestrel.yaml"))
        here = Scheduler(Supervisor(world.rt), settings.deadlines, [], store=world.rt.store)
        async with compose.runtime(settings, clock=world.clock) as bare:
            elsewhere = Scheduler(Supervisor(bare), settings.deadlines, [], store=bare.store)
            sweeps = [elsewhere, here] if first == "bare" else [here, elsewhere]
            claimed = [(await scheduler.sweep(soon))[1] for scheduler in sweeps]
        assert claimed == [[view.request.id], []]
        await world.settled()
        (reminder,) = await world.api.wait_for(_is_reminder)
        assert reminder.args["thread_ts"] == (await world.card()).args["thread_ts"]
        assert "restart_service" in reminder.args["text"]
        await world.later(1)
        assert len([c for c in world.api.calls if _is_reminder(c)]) == 1
        audited = await world.rt.store.list_audit(run_id=run_id, action="remind")
        assert [(a.actor, a.request_id) for a in audited] == [("deadline", view.request.id)]
