"""A run's place, against the real ``kestrel serve slack discord``: a decision or a read about a
run counts only from where the run lives (platform, workspace or guild, channel, thread) and
only for someone the policy names for runs of that place; lookups that hang cost nothing."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adapters.slack import ids
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.discord_world import button_id
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.serving import free_port, serve_env, start_serve, wait_healthy
from tests.fakes.slack_api import Call, FakeSlackApi
from tests.fakes.slack_client import SlackSender, app_mention, block_actions, slash_command
from tests.fakes.slack_world import (
    APPROVER,
    REQUESTER,
    SECRET,
    button_value,
    posted_ts,
    restart_script,
    write_config,
)

PRIVATE = "C0PRIV"  # the run's channel: only REQUESTER and APPROVER are in it
OPS = "C0OPS"  # on-call is "whoever acts on runs of #ops", and approves there
MEMBER_OF_OPS = "U0OPSMEMBER"
STRANGER = "U0STRANGER"
HANGING_GROUP = "S0HANG"
D_REQUESTER, D_APPROVER = "1001", "1002"
POLICY = {
    "requesters": ["*"],
    "approvers": {"*": [APPROVER, D_APPROVER, f"group:{HANGING_GROUP}", f"channel:{OPS}"]},
    "oncall": [f"channel:{OPS}"],
}


def _db(tmp: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{tmp / 'kestrel.db'}?mode=ro", uri=True)


def _requests(tmp: Path) -> dict[str, str]:
    with _db(tmp) as db:
        return dict(db.execute("SELECT id, status FROM requests").fetchall())


def _audit(tmp: Path, action: str) -> list[tuple[str, str, str]]:
    with _db(tmp) as db:
        rows = db.execute(
            "SELECT actor, request_id, detail FROM audit WHERE action = ?", (action,)
        ).fetchall()
    return [(str(a), str(r), str(d)) for a, r, d in rows]


def _executions(tmp: Path) -> list[str]:
    path = tmp / "executions.txt"
    return path.read_text().splitlines() if path.exists() else []


class Slack:
    """The test's side of Slack: signed deliveries, and what the fake Web API was asked."""

    def __init__(self, api: FakeSlackApi, port: int) -> None:
        self.api = api
        self.sender = SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, api=api)
        self._told: dict[str, int] = {}

    async def told(self, user: str) -> str:
        """The next ephemeral message to ``user``."""
        nth = self._told[user] = self._told.get(user, 0) + 1

        def to_user(call: Call) -> bool:
            return call.method == "chat.postEphemeral" and call.args.get("user") == user

        calls = await self.api.wait_for(to_user, timeout=15, count=nth)
        return json.dumps(calls[nth - 1].args)

    async def click(self, card: Call, action: str, user: str, **where: Any) -> None:
        """Click ``action`` on ``card`` as ``user``, from where the card is unless told."""
        payload = block_actions(
            user,
            action,
            where.pop("value", None) or button_value(card, action),
            channel=where.pop("channel", PRIVATE),
            message_ts=where.pop("message_ts", posted_ts(self.api, card)),
            thread_ts=where.pop("thread_ts", card.args["thread_ts"]),
            **where,
        )
        assert (await self.sender.action(payload)).status == 200

    async def command(self, user: str, text: str, channel: str) -> str:
        """``/kestrel TEXT`` as ``user`` in ``channel``; what it answered."""
        url = self.api.new_response_url()
        form = slash_command(user, text, channel=channel, response_url=url)
        assert (await self.sender.command(form)).status == 200
        replies = await self.api.wait_for(
            lambda c: c.method == "response_url" and url.endswith(c.path), timeout=15
        )
        return json.dumps(replies[-1].args)


async def test_decisions_and_reads_count_only_from_the_runs_place(tmp_path: Path) -> None:
    script = restart_script()
    async with FakeOpenAI(script) as model, FakeSlackApi() as api, FakeDiscord() as discord:
        api.channel_members = {PRIVATE: [REQUESTER, APPROVER], OPS: [MEMBER_OF_OPS, STRANGER]}
        api.usergroups[HANGING_GROUP] = [STRANGER]
        api.delay("usergroups.users.list", 30.0)
        config = write_config(tmp_path, model.base_url, extra_policy=POLICY)
        port = free_port()
        env = serve_env(config, api.url, DISCORD_TOKEN="t0k3n", DISCORD_API_URL=discord.api_url)
        process = start_serve(tmp_path, port, env, "slack", "discord")
        try:
            await wait_healthy(port, process)
            slack = Slack(api, port)
            slack_card = await _slack_place(slack, tmp_path)
            await _discord_place(discord, slack, slack_card, tmp_path)
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=30)
        assert process.returncode == 0, err
        assert "Traceback" not in err


async def _slack_place(slack: Slack, tmp: Path) -> Call:
    api = slack.api
    # A requester allowed as "*" never waits on the hanging group API.
    started = time.monotonic()
    mention = app_mention(REQUESTER, "checkout is failing", channel=PRIVATE)
    assert (await slack.sender.event(mention)).status == 200
    card = (
        await api.wait_for(lambda c: c.ok is True and ids.APPROVE_ONCE in json.dumps(c.args), 15)
    )[0]
    assert time.monotonic() - started < 10
    assert not [c for c in api.calls if c.method == "usergroups.users.list"]
    (request_id,) = _requests(tmp)
    run_id = _run_ids(tmp)[0]

    # A click from another channel, another workspace, or on another message: refused.
    await slack.click(card, ids.APPROVE_ONCE, APPROVER, channel=OPS)
    assert "another channel" in await slack.told(APPROVER)
    await slack.click(card, ids.APPROVE_ONCE, APPROVER, team="T0OTHER")
    assert "another workspace" in await slack.told(APPROVER)
    await slack.click(card, ids.APPROVE_ONCE, APPROVER, message_ts=str(mention["ts"]))
    assert "not on that request" in await slack.told(APPROVER)
    # channel:C0OPS names people acting on runs OF #ops: in the run's own thread, a member of
    # #ops approves nothing of a #priv run, and may not cancel it from #ops or from #priv;
    # from #ops, where they may not see it, they learn nothing of it (as from status).
    await slack.click(card, ids.APPROVE_ONCE, MEMBER_OF_OPS)
    assert "may not approve" in await slack.told(MEMBER_OF_OPS)
    told = await slack.command(MEMBER_OF_OPS, f"cancel {run_id}", OPS)
    assert f"There is no run {run_id} that you can see." in told
    assert "may not cancel" in await slack.command(MEMBER_OF_OPS, f"cancel {run_id}", PRIVATE)
    # The hanging group lookup is a no for the check at hand, within its 2 s.
    started = time.monotonic()
    await slack.click(card, ids.APPROVE_ONCE, STRANGER)
    assert "may not approve" in await slack.told(STRANGER)
    assert time.monotonic() - started < 10
    # The "Full arguments" modal and feedback from another channel: refused.
    await slack.click(card, ids.SHOW_ARGUMENTS, APPROVER, channel=OPS, value=request_id)
    assert "not one of this thread" in await slack.told(APPROVER)
    assert not [c for c in api.calls if c.method == "views.open"]
    # Deny's form asked for from another channel: refused before it opens, audited as a deny.
    await slack.click(card, ids.DENY, APPROVER, channel=OPS, value=request_id)
    assert "another channel" in await slack.told(APPROVER)
    assert not [c for c in api.calls if c.method == "views.open"]
    feedback = ids.feedback_value(run_id, positive=False)
    await slack.click(card, ids.FEEDBACK, APPROVER, channel=OPS, value=feedback)
    assert "another channel" in await slack.told(APPROVER)
    # The requester resuming from another channel: refused, audited once.
    assert "another channel" in await slack.command(REQUESTER, f"resume {run_id}", OPS)

    # Reads: only someone in the run's channel (or on-call) sees it.
    told = await slack.command(STRANGER, f"status {run_id}", OPS)
    assert "that you can see" in told and "checkout is failing" not in told
    assert "checkout is failing" in await slack.command(APPROVER, f"status {run_id}", OPS)
    assert "restart_service" not in await slack.command(STRANGER, "runs", OPS)
    assert "restart_service" in await slack.command(APPROVER, "runs", OPS)

    assert _requests(tmp) == {request_id: "open"}
    assert _executions(tmp) == []
    refused = _audit(tmp, "approve_refused")
    assert len(refused) == 5 and {r[1] for r in refused} == {request_id}
    assert any("acted from slack:T0001:C0OPS" in r[2] for r in refused)
    assert len(_audit(tmp, "cancel_refused")) == 2
    # Full arguments from another channel, and a stranger's status of the run from its channel.
    assert [r[1] for r in _audit(tmp, "show_refused")] == [request_id, ""]
    assert len(_audit(tmp, "feedback_refused")) == 1
    assert len(_audit(tmp, "resume_refused")) == 1
    assert [r[1] for r in _audit(tmp, "deny_refused")] == [request_id]
    return card


async def _discord_place(discord: FakeDiscord, slack: Slack, slack_card: Call, tmp: Path) -> None:
    mention = p.message_create(author_id=D_REQUESTER, content=f"<@{p.BOT_ID}> checkout is failing")
    await discord.dispatch("MESSAGE_CREATE", mention)
    thread = str(mention["id"])
    card = await _discord_card(discord, thread)
    slack_request = next(r for r, s in _requests(tmp).items() if s == "open")
    discord_request = next(r for r, s in _requests(tmp).items() if r != slack_request)

    # A Discord click from another guild, and one naming the Slack run's request: refused.
    guest = await _discord_click(discord, card, button_id(card, "approve"), guild="777")
    assert "another server" in await _discord_told(discord, guest)
    # Deny's form asked for from another guild: refused before it opens, and audited.
    deny = await _discord_click(discord, card, button_id(card, "deny"), guild="777")
    answered = await discord.wait_for(
        lambda c: str(deny["token"]) in c.path and c.path.endswith("/callback"), timeout=15
    )
    assert "another server" in json.dumps(answered[-1].json)
    assert [r[1] for r in _audit(tmp, "deny_refused")] == [slack_request, discord_request]
    crossed = f"kestrel:approve:{slack_request}"
    forged = json.loads(json.dumps(card).replace(button_id(card, "approve"), crossed))
    other = await _discord_click(discord, forged, crossed)
    assert "not one of a Discord run" in await _discord_told(discord, other)
    # A Slack click naming the Discord run's request, on the Slack card: refused.
    await slack.click(slack_card, ids.APPROVE_ONCE, APPROVER, value=discord_request)
    assert "not on that request" in await slack.told(APPROVER)
    assert set(_requests(tmp).values()) == {"open"}
    assert _executions(tmp) == []

    # Discord's /kestrel runs lists Discord's runs only.
    runs = p.interaction_command(
        options=[{"name": "runs", "type": 1}], channel=thread, user_id=D_APPROVER
    )
    await discord.dispatch("INTERACTION_CREATE", runs)
    listed = await _discord_told(discord, runs)
    assert listed.count("restart_service") == 1 and thread in listed

    # From the right place, the right people decide; each command runs once.
    approved = await _discord_click(discord, card, button_id(card, "approve"))
    assert "Recorded" in await _discord_told(discord, approved)
    await slack.click(slack_card, ids.APPROVE_ONCE, APPROVER)
    await slack.api.wait_for(lambda c: ids.FEEDBACK in json.dumps(c.args), timeout=20)
    await discord.wait_for(
        lambda c: c.path == f"/channels/{thread}/messages" and "healthy" in json.dumps(c.json),
        timeout=20,
    )
    assert sorted(_executions(tmp)) == ["checkout", "checkout"]


async def _discord_card(discord: FakeDiscord, thread: str) -> dict[str, Any]:
    def posted(call: Any) -> bool:
        return (
            call.path == f"/channels/{thread}/messages"
            and "kestrel:approve:" in json.dumps(call.json)
            and call.status == 200
        )

    return dict((await discord.wait_for(posted, timeout=20))[0].response or {})


async def _discord_click(
    discord: FakeDiscord, card: Mapping[str, Any], custom_id: str, guild: str = p.GUILD_ID
) -> dict[str, Any]:
    click = p.interaction_button(
        guild=guild,
        channel=str(card["channel_id"]),
        user_id=D_APPROVER,
        custom_id=custom_id,
        message=card,
    )
    await discord.dispatch("INTERACTION_CREATE", click)
    return click


async def _discord_told(discord: FakeDiscord, interaction: Mapping[str, Any]) -> str:
    token = str(interaction["token"])

    def told(call: Any) -> bool:
        ours = token in call.path and call.method in ("POST", "PATCH")
        return ours and "content" in (call.json or {}) and "callback" not in call.path

    calls = await discord.wait_for(told, timeout=15)
    return str((calls[-1].json or {}).get("content", ""))


def _run_ids(tmp: Path) -> list[str]:
    with _db(tmp) as db:
        return [str(r[0]) for r in db.execute("SELECT id FROM runs ORDER BY created_at")]
