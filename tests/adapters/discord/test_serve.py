"""``kestrel serve discord`` (and ``serve slack discord``) as a user runs it: a real process
against a local stand-in for Discord's REST API and gateway."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

import bot
from adapters.slack import ids as slack_ids
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import Call, FakeDiscord
from tests.fakes.discord_world import APPROVER, ONCALL, REQUESTER
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.serving import free_port, run_serve, serve_env, start_serve, wait_healthy
from tests.fakes.slack_api import FakeSlackApi
from tests.fakes.slack_client import SlackSender, app_mention
from tests.fakes.slack_world import (
    SECRET,
    disguised_links_script,
    masked_links,
    restart_script,
    write_config,
)
from tests.fakes.waiting import until

POLICY = {"approvers": {"*": [APPROVER]}, "oncall": [ONCALL]}


def _view_run(message: dict[str, Any]) -> str:
    """The URL of a message's "View run" link button."""
    (url,) = (
        c["url"]
        for row in message.get("components") or []
        for c in row["components"]
        if c.get("label") == "View run"
    )
    return str(url)


def _posted_in(channel: str, text: str) -> Callable[[Call], bool]:
    """A message posted in ``channel`` whose body holds ``text``."""
    return lambda call: (
        call.path == f"/channels/{channel}/messages" and text in json.dumps(call.json)
    )


async def test_serve_discord_runs_a_mention_to_its_answer(tmp_path: Path) -> None:
    # Approvers: a person, a role, and principals that ping nobody (anyone; a Slack user).
    approvers = [APPROVER, f"role:{p.ROLE_ID}", "*", "U0SLACK"]
    policy = {**POLICY, "approvers": {"*": approvers}}
    async with FakeOpenAI(restart_script()) as model, FakeDiscord() as fake:
        port = free_port()
        pages = {"web": {"public_url": f"http://127.0.0.1:{port}"}}
        config = write_config(tmp_path, model.base_url, extra_policy=policy, extra_config=pages)
        env = serve_env(
            config,
            "http://127.0.0.1:9/api/",
            DISCORD_TOKEN="t0k3n",
            DISCORD_API_URL=fake.api_url,
            KESTREL_WEB_SECRET="s" * 32,
        )
        process = start_serve(tmp_path, port, env, "discord")
        try:
            await wait_healthy(port, process)
            mention = p.message_create(
                author_id=REQUESTER, content=f"<@{p.BOT_ID}> checkout is failing"
            )
            await fake.dispatch("MESSAGE_CREATE", mention)
            thread = str(mention["id"])

            def card_posted(call) -> bool:  # type: ignore[no-untyped-def]
                return (
                    call.path == f"/channels/{thread}/messages"
                    and "kestrel:approve:" in json.dumps(call.json)
                    and call.status == 200
                )

            posted = (await fake.wait_for(card_posted, timeout=20))[0]
            card = dict(posted.response or {})
            # Exactly the approving person and role are notified, by Kestrel's own line.
            assert (posted.json or {})["allowed_mentions"] == {
                "parse": [],
                "users": [APPROVER],
                "roles": [p.ROLE_ID],
            }
            assert [m["id"] for m in card["mentions"]] == [APPROVER]
            assert card["mention_roles"] == [p.ROLE_ID] and not card["mention_everyone"]
            async with aiohttp.ClientSession() as browser, browser.get(_view_run(card)) as page:
                assert page.status == 200  # the signed link opens the run's page
                assert "restart_service" in await page.text()
            custom_id = next(
                c["custom_id"]
                for row in card["components"]
                for c in row["components"]
                if c["custom_id"].startswith("kestrel:approve:")
            )
            click = p.interaction_button(
                channel=thread, user_id=APPROVER, custom_id=custom_id, message=card
            )
            await fake.dispatch("INTERACTION_CREATE", click)
            (answer,) = await fake.wait_for(
                lambda c: (
                    c.path == f"/channels/{thread}/messages"
                    and "healthy again" in json.dumps(c.json)
                ),
                timeout=20,
            )
            assert (tmp_path / "executions.txt").read_text() == "checkout\n"
            assert _view_run(answer.json or {}).startswith(f"http://127.0.0.1:{port}/runs/")
            assert (answer.json or {})["allowed_mentions"] == {"parse": []}
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=30)
        assert process.returncode == 0, err
        assert "discord: connected as" in err
        assert "Traceback" not in err
        assert "t0k3n" not in err


async def test_serve_slack_and_discord_in_one_process(tmp_path: Path) -> None:
    script = [{"text": "All good."}]
    async with FakeOpenAI(script) as model, FakeDiscord() as fake, FakeSlackApi() as api:
        config = write_config(tmp_path, model.base_url, extra_policy=POLICY)
        port = free_port()
        env = serve_env(config, api.url, DISCORD_TOKEN="t0k3n", DISCORD_API_URL=fake.api_url)
        process = start_serve(tmp_path, port, env, "slack", "discord")
        try:
            await wait_healthy(port, process)
            mention = p.message_create(author_id=REQUESTER, content=f"<@{p.BOT_ID}> how is it?")
            await fake.dispatch("MESSAGE_CREATE", mention)
            sender = SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, api=api)
            assert (await sender.event(app_mention(REQUESTER, "how is it?"))).status == 200
            thread = str(mention["id"])
            await fake.wait_for(
                lambda c: (
                    c.path == f"/channels/{thread}/messages" and "All good." in json.dumps(c.json)
                ),
                timeout=20,
            )
            await api.wait_for(lambda c: slack_ids.FEEDBACK in json.dumps(c.args), timeout=20)
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=30)
        assert process.returncode == 0, err
    # Every outbound call says it is Kestrel, at its version (Discord's own prefix first).
    ours = f"{bot.DISTRIBUTION}/{bot.__version__}"
    agents = {
        "model": {h["user-agent"] for h in model.headers},
        "slack": {c.headers.get("user-agent", "") for c in api.calls},
        "discord": {c.headers.get("user-agent", "") for c in fake.calls if c.route != "unknown"},
    }
    assert all(len(seen) >= 1 for seen in agents.values()), agents
    assert {a.split(" ")[0] for a in agents["model"] | agents["slack"]} == {ours}, agents
    assert all(a.startswith("DiscordBot (") and ours in a for a in agents["discord"]), agents


def test_serve_discord_without_a_token_says_which_variable(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    env = serve_env(config, "http://127.0.0.1:9/api/")
    done = run_serve(tmp_path, env, "discord", "--port", str(free_port()))
    assert done.returncode == 2
    assert "DISCORD_TOKEN is not set" in done.stderr


async def test_serve_discord_shows_the_target_of_every_link_the_model_hides(
    tmp_path: Path,
) -> None:
    async with FakeOpenAI(disguised_links_script()) as model, FakeDiscord() as fake:
        config = write_config(tmp_path, model.base_url, extra_policy=POLICY)
        port = free_port()
        env = serve_env(
            config,
            "http://127.0.0.1:9/api/",
            DISCORD_TOKEN="t0k3n",
            DISCORD_API_URL=fake.api_url,
            DISCORD_PING_APPROVERS="false",
        )
        process = start_serve(tmp_path, port, env, "discord")
        try:
            await wait_healthy(port, process)
            threads = []
            for ask in ("approve the restart", "ask me", "tell me"):
                mention = p.message_create(author_id=REQUESTER, content=f"<@{p.BOT_ID}> {ask}")
                await fake.dispatch("MESSAGE_CREATE", mention)
                threads.append(str(mention["id"]))
            posted = [
                (await fake.wait_for(_posted_in(t, s), timeout=20))[0]
                for t, s in zip(
                    threads, ("kestrel:approve:", "kestrel:answer:", "evil"), strict=True
                )
            ]
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=30)
        assert process.returncode == 0, err
    card, question, answer = (json.dumps(call.json, ensure_ascii=False) for call in posted)
    assert "**Why:**\\n> Pay at https://bank.example (https://evil.example); see docs" in card
    assert "Pay at https://bank.example (https://evil.example)" in question
    assert "the bank (https://evil.example/b)" in answer
    assert "<https://bank.example> (https://evil.example/x)" in answer
    assert [c.path for c in fake.calls if masked_links(json.dumps(c.json))] == []
    # DISCORD_PING_APPROVERS=false: the approval card and the question notify nobody.
    assert [(c.json or {})["allowed_mentions"] for c in posted] == [{"parse": []}] * 3


async def test_a_sigterm_while_discord_does_not_answer_the_login_stops_at_once(
    tmp_path: Path,
) -> None:
    # Nothing served yet, but the stop waited on the login for its whole deadline (grace +
    # 15 s), then ended as overdue: an error line and exit 143, for a rollout's routine stop.
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", extra_policy=POLICY)
    async with FakeDiscord() as fake:
        fake.delay("GET", "/users/@me", 600)
        env = serve_env(
            config, "http://127.0.0.1:9/api/", DISCORD_TOKEN="t0k3n", DISCORD_API_URL=fake.api_url
        )
        process = start_serve(tmp_path, free_port(), env, "discord")
        try:
            await fake.wait_for("GET /users/@me", timeout=20)
            process.send_signal(signal.SIGTERM)
            _, err = await asyncio.to_thread(process.communicate, timeout=10)
        finally:
            if process.poll() is None:
                process.kill()
                await asyncio.to_thread(process.communicate, timeout=10)
    assert process.returncode == 0, err
    assert err.splitlines()[-1].endswith(
        "WARNING kestrel.serve: stopped on SIGTERM while the chat platforms connected:"
        " nothing was served"
    ), err
    assert "Traceback" not in err and "Unclosed" not in err, err


async def test_a_gateway_that_refuses_the_token_for_good_is_said_not_reconnecting(
    tmp_path: Path,
) -> None:
    # The token reset in the Developer Portal: the gateway closes with 4004 and discord.py
    # stops trying. Nothing was logged, and /readyz said "not connected (reconnecting)" for
    # ever: on-call waited on a replica that would never serve Discord again.
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", extra_policy=POLICY)
    async with FakeDiscord() as fake:
        port = free_port()
        env = serve_env(
            config, "http://127.0.0.1:9/api/", DISCORD_TOKEN="t0k3n", DISCORD_API_URL=fake.api_url
        )
        process = start_serve(tmp_path, port, env, "discord")
        try:
            await wait_healthy(port, process)
            await until(lambda: _readyz(port, {"discord": True}), timeout=20)
            await fake.close_gateway(4004, "Authentication failed")
            await until(lambda: _readyz(port, {"discord": False}), timeout=20)
            body = await _readyz_body(port)
            assert body["problems"] == {"discord": "not connected (no longer trying)"}, body
        finally:
            process.send_signal(signal.SIGTERM)
            _, err = await asyncio.to_thread(process.communicate, timeout=30)
    assert process.returncode == 0, err
    said = logged(err, "4004")
    assert len(said) == 1 and " ERROR kestrel.discord: " in said[0], err
    assert "DISCORD_TOKEN" in said[0] and "t0k3n" not in err, err


def logged(err: str, text: str) -> list[str]:
    """The log lines whose message, past its timestamp, says ``text`` (a timestamp's
    milliseconds said "503" once in a thousand lines)."""
    return [line for line in err.splitlines() if text in line.partition(" ")[2]]


async def _readyz_body(port: int) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/readyz") as response,
    ):
        body: dict[str, Any] = await response.json()
        return body


async def _readyz(port: int, platforms: dict[str, bool]) -> bool:
    return bool((await _readyz_body(port))["platforms"] == platforms)


async def test_serve_discord_serves_its_port_while_the_gateway_refuses_at_start(
    tmp_path: Path,
) -> None:
    # A gateway answering 503 to the first connection: serve exited 75 to be started again,
    # its port never open (a restart loop, as Slack's Socket Mode was stuck). Now the port
    # serves, /readyz says discord is not connected, and the gateway is tried again.
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", extra_policy=POLICY)
    async with FakeDiscord() as fake:
        fake.gateway_refused = True
        port = free_port()
        env = serve_env(
            config, "http://127.0.0.1:9/api/", DISCORD_TOKEN="t0k3n", DISCORD_API_URL=fake.api_url
        )
        process = start_serve(tmp_path, port, env, "discord")
        try:
            await wait_healthy(port, process)
            body = await _readyz_body(port)
            assert body["problems"] == {"discord": "not connected (reconnecting)"}, body
            await until(lambda: fake.gateway_refusals >= 3, timeout=20)
            fake.gateway_refused = False
            await until(lambda: _readyz(port, {"discord": True}), timeout=20)
            assert (await _readyz_body(port))["ready"] is True
        finally:
            process.send_signal(signal.SIGTERM)
            _, err = await asyncio.to_thread(process.communicate, timeout=30)
    assert process.returncode == 0, err
    # The problem said once, however many tries; and once when it ends.
    said = logged(err, "503")
    assert len(said) == 2, err
    assert "the gateway cannot connect yet" in said[0], err
    assert "discord: the gateway connected after" in said[1], err
    assert "NoneType" not in err and "Traceback" not in err and "t0k3n" not in err, err
