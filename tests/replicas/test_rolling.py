"""A rolling restart loses nothing (smaller runs of ``python -m bench.rolling``): three real
``kestrel serve slack`` (or ``discord``) on PostgreSQL, mentions flowing, half of them approved
with a click (to a random Slack replica; to every connected Discord session), and every 2.5 s
one replica gets SIGTERM and another SIGKILL, both restarted. The approved command takes half a
second: a replica killed during it leaves its outcome uncertain, and on-call decides its card
(``bench.rolling.on_call``) as a person would, which is part of what is tested."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from adapters.slack import ids
from bench.rolling import Fleet, Plan, _drop, run, serve_env, write_config
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_api import Call, FakeSlackApi
from tests.fakes.slack_client import SlackSender, app_mention
from tests.fakes.slack_world import REQUESTER, SECRET

DSN = os.environ.get("KESTREL_TEST_POSTGRES_DSN", "")
pytestmark = pytest.mark.skipif(
    not DSN, reason="set KESTREL_TEST_POSTGRES_DSN to run the rolling restart test"
)


def short_roll(mentions: int, every: float) -> Plan:
    """A roll the suite can afford: two rounds at least, a lease of 2 s, and an approved
    command of half a second, during which a SIGKILL leaves an effect for on-call."""
    return Plan(
        mentions=mentions,
        rate=3.0,
        every=every,
        lease=2.0,
        seed=random.randrange(1000),
        rounds=2,
        command_seconds=0.5,
    )


async def test_a_rolling_restart_answers_every_mention_once(tmp_path: Path) -> None:
    plan = short_roll(mentions=30, every=2.5)
    schema = f"kroll_{uuid.uuid4().hex[:12]}"
    try:
        tally = await run("slack", plan, DSN, tmp_path, schema)
    finally:
        await _drop(DSN, schema)
    report = "\n".join([f"seed {plan.seed}", *tally.lines(plan, "slack"), *tally.problems])
    assert tally.sigkills >= 2 and tally.sigterms >= 2, report
    assert tally.lost_nothing(), report
    assert len(tally.cards) == 15 and len(tally.answers) == 30, report
    # A replica's deliveries, runs and claims are taken up within a lease of its death.
    assert max(tally.feedback_ms) < plan.lease * 1000 + 3000, report


async def test_a_rolling_restart_on_discord_answers_every_mention_once(tmp_path: Path) -> None:
    plan = short_roll(mentions=24, every=2.0)
    schema = f"kroll_{uuid.uuid4().hex[:12]}"
    try:
        tally = await run("discord", plan, DSN, tmp_path, schema)
    finally:
        await _drop(DSN, schema)
    report = "\n".join([f"seed {plan.seed}", *tally.lines(plan, "discord"), *tally.problems])
    assert tally.sigkills >= 2 and tally.sigterms >= 2, report
    assert tally.lost_nothing(), report
    assert len(tally.cards) == 12 and len(tally.answers) == 24, report
    # A mention a dead replica held is taken up within a lease; the thread comes first.
    assert max(tally.feedback_ms) < plan.lease * 1000 + 3000, report


async def test_a_replica_killed_while_posting_an_answer_holds_it_no_longer_than_its_lease(
    tmp_path: Path,
) -> None:
    lease = 2.0
    schema = f"kroll_{uuid.uuid4().hex[:12]}"
    async with FakeOpenAI([{"text": "All good."}]) as model, FakeSlackApi() as api:
        config = write_config(tmp_path, model.base_url, f"{DSN}?schema={schema}", lease)
        env = serve_env(
            config, SLACK_BOT_TOKEN="xoxb-test", SLACK_SIGNING_SECRET=SECRET, SLACK_API_URL=api.url
        )
        fleet = Fleet(tmp_path, env, "slack", 2)
        post = api._handlers["chat.postMessage"]  # the fake's own poster
        hung: list[Call] = []

        async def hang_answers(call: Call) -> Any:
            if not hung and ids.FEEDBACK in json.dumps(call.args.get("blocks")):
                hung.append(call)
                # The first replica's post of the answer never lands and never returns.
                await asyncio.get_running_loop().create_future()
            answer = post(call)
            return await answer if inspect.isawaitable(answer) else answer

        api.set_handler("chat.postMessage", hang_answers)
        try:
            fleet.start(0)
            await fleet.healthy(0)
            sender = SlackSender(f"http://127.0.0.1:{fleet.ports[0]}/slack/events", SECRET, api=api)
            event = app_mention(REQUESTER, f"<@{api.bot_user}> how is it?")
            assert (await sender.event(event)).status == 200
            await api.wait_for(lambda c: ids.FEEDBACK in json.dumps(c.args), timeout=20)
            fleet.start(1)
            await fleet.healthy(1)
            fleet.kill(0)
            killed = time.monotonic()

            def answered() -> list[Call]:
                return [
                    c
                    for c in api.calls_to("chat.postMessage")
                    if c.ok and ids.FEEDBACK in json.dumps(c.args)
                ]

            shown = (await api.wait_for(lambda c: bool(answered()), timeout=30))[0]
            assert len(answered()) == 1
            # Its claim ended with its lease; the survivor's outbox polls every 2 s.
            assert answered()[0].at - killed < lease + 3.0, shown
        finally:
            await fleet.stop()
            await _drop(DSN, schema)
        assert not fleet.tracebacks()
