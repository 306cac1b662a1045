"""Two ``kestrel serve discord`` replicas on one PostgreSQL store, both connected to one fake
Discord that sends every event to every session (as Discord does to unsharded sessions), and
both serving the HTTP interactions endpoint behind the test's "load balancer"."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import Call, FakeDiscord
from tests.fakes.discord_http import InteractionPoster
from tests.fakes.discord_world import APPROVER, ONCALL, REQUESTER
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.serving import free_port, serve_env, start_serve, wait_healthy
from tests.fakes.slack_world import restart_script, write_config
from tests.storage.conftest import postgres_dsn, postgres_schema

POLICY = {"approvers": {"*": [APPROVER]}, "oncall": [ONCALL]}
HEALTHY = "healthy again"
TOKEN = "replicas-web-token"
# The events both sessions got that one replica took and the other dropped: two mentions and
# the click over the gateway, and the click repeated over HTTP at the other replica.
DROPPED = 4


def posts(thread: str, text: str, call: Call) -> bool:
    """Whether ``call`` posted a message containing ``text`` in ``thread``."""
    path = f"/channels/{thread}/messages"
    return (
        call.method == "POST"
        and call.path == path
        and call.status == 200
        and (text in json.dumps(call.json))
    )


def posted(fake: FakeDiscord, thread: str, text: str) -> list[Call]:
    """The bot's messages posted in ``thread`` that contain ``text``."""
    return [c for c in fake.calls if posts(thread, text, c)]


def button(card: dict[str, Any], kind: str) -> str:
    """The custom id of ``card``'s ``kind`` button."""
    return next(
        str(c["custom_id"])
        for row in card["components"]
        for c in row["components"]
        if c["custom_id"].startswith(f"kestrel:{kind}:")
    )


def callbacks(fake: FakeDiscord, interaction_id: str) -> list[Call]:
    """Every callback POST for one interaction (answered or refused)."""
    return fake.calls_to("POST", rf"/interactions/{interaction_id}/[^/]+/callback")


async def mention(fake: FakeDiscord, text: str) -> tuple[str, dict[str, Any]]:
    """A mention sent to every session; its thread and the card posted there (once)."""
    message = p.message_create(author_id=REQUESTER, content=f"<@{p.BOT_ID}> {text}")
    await fake.dispatch("MESSAGE_CREATE", message, every=True)
    thread = str(message["id"])
    found = await fake.wait_for(lambda c: posts(thread, "kestrel:approve:", c), 20)
    return thread, dict(found[0].response or {})


async def dropped(ports: list[int]) -> int:
    """Events the replicas recognised as taken by another and dropped, added up from each
    one's ``kestrel_chat_duplicates_dropped_total``."""
    total = 0
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        for port in ports:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
            line = next(x for x in text.splitlines() if x.startswith("kestrel_chat_dup"))
            total += int(float(line.split()[-1]))
    return total


async def all_dropped(ports: list[int]) -> None:
    """Until both replicas have handled every event they both got (one took, one dropped)."""
    for _ in range(400):
        if await dropped(ports) >= DROPPED:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the replicas dropped {await dropped(ports)} events, not {DROPPED}")


async def stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    _out, err = await asyncio.to_thread(process.communicate, timeout=30)
    return err


async def test_two_connected_replicas_answer_each_event_once(tmp_path: Path) -> None:
    dsn = postgres_dsn()
    async with (
        postgres_schema(dsn) as schema,
        FakeOpenAI(restart_script()) as model,
        FakeDiscord() as fake,
    ):
        config = write_config(
            tmp_path,
            model.base_url,
            extra_policy=POLICY,
            database=f"{dsn}?schema={schema}",
            extra_config={"replica": {"lease_seconds": 2.0}},
        )
        poster = InteractionPoster(fake)
        env = serve_env(
            config,
            "http://127.0.0.1:9/api/",
            DISCORD_TOKEN="t0k3n",
            DISCORD_API_URL=fake.api_url,
            DISCORD_PUBLIC_KEY=poster.public_key,
            KESTREL_WEB_TOKEN=TOKEN,
        )
        ports = [free_port(), free_port()]
        replicas = [start_serve(tmp_path, port, env, "discord") for port in ports]
        urls = [f"http://127.0.0.1:{port}/discord/interactions" for port in ports]
        try:
            for port, replica in zip(ports, replicas, strict=True):
                await wait_healthy(port, replica)
            await fake.wait_for_gateway(connections=2)

            # Over the gateway: both sessions get the mention and the click.
            thread, card = await mention(fake, "checkout is failing")
            click = p.interaction_button(
                channel=thread, user_id=APPROVER, custom_id=button(card, "approve"), message=card
            )
            await fake.dispatch("INTERACTION_CREATE", click, every=True)
            await fake.wait_for(lambda c: posts(thread, HEALTHY, c), 20)
            threads = fake.calls_to("POST", rf"/channels/{p.CHANNEL_ID}/messages/\d+/threads")
            assert len(threads) == 1
            assert [c.status for c in callbacks(fake, str(click["id"]))] == [200]

            # Over HTTP: refused unless signed by the application, PING, a modal, a click.
            other, card = await mention(fake, "checkout is failing again")
            approve = p.interaction_button(
                channel=other, user_id=APPROVER, custom_id=button(card, "approve"), message=card
            )
            body = json.dumps(approve).encode()
            forged = {**poster.headers(body), "X-Signature-Ed25519": "00" * 64}
            assert (await poster.raw(urls[0], body, forged))[0] == 401
            stale = poster.headers(body, timestamp=int(time.time()) - 3600)
            assert (await poster.raw(urls[0], body, stale))[0] == 401
            assert (await poster.raw(urls[0], b"{", poster.headers(b"{")))[0] == 400
            assert await poster.post(urls[1], {"type": 1}) == (200, {"type": 1})
            deny = p.interaction_button(
                channel=other, user_id=APPROVER, custom_id=button(card, "deny"), message=card
            )
            status, answer = await poster.post(urls[1], deny)
            assert status == 200 and answer["type"] == 9  # the reason form, as the answer
            status, answer = await poster.post(urls[0], approve)
            assert (status, answer) == (200, {"type": 5, "data": {"flags": 64}})
            await fake.wait_for(lambda c: posts(other, HEALTHY, c), 20)
            # The same interaction again, at the other replica: acknowledged, nothing done.
            assert (await poster.post(urls[1], approve))[1] == {"type": 6}

            # Both replicas have handled every event (the loser of each dropped it), and the
            # winner said all it says before the answer: a second one would be out by now.
            await all_dropped(ports)
            assert await dropped(ports) == DROPPED
            assert not callbacks(fake, str(approve["id"])) and not callbacks(fake, str(deny["id"]))
            followups = fake.interactions[str(approve["id"])]["followups"]
            assert len(followups) == 1
            for each in (thread, other):
                assert len(posted(fake, each, HEALTHY)) == 1
                assert len(posted(fake, each, "kestrel:approve:")) == 1
            assert (tmp_path / "executions.txt").read_text() == "checkout\ncheckout\n"
        finally:
            errors = [await stop(r) for r in replicas if r.poll() is None]
        for err in errors:
            assert "Traceback" not in err, err
        assert all(r.returncode == 0 for r in replicas)
