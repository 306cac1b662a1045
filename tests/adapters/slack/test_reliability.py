"""Slack's realities: retried and doubled deliveries, bad signatures, rate limits, restarts,
guests from other workspaces, stale cards, and Socket Mode."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from adapters.slack import ids
from adapters.slack.app import SlackAdapter
from adapters.slack.settings import SlackSettings
from bot.domain import RunStatus
from tests.fakes.slack_api import FakeSlackApi, events_api_envelope
from tests.fakes.slack_client import app_mention, event_callback, message
from tests.fakes.slack_world import (
    APPROVER,
    CHANNEL,
    ONCALL,
    REQUESTER,
    SlackWorld,
    posted_ts,
    restart_script,
    slack_world,
    updates_of,
)
from tests.fakes.waiting import until

SLOW = "C0SLOW"  # a channel Slack rate-limits


async def _runs(world: SlackWorld) -> int:
    return len(await world.chat.recent(100))


async def test_a_retried_event_starts_one_run(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        event = app_mention(REQUESTER, "checkout is failing")
        first = await world.sender.event(event, event_id="Ev1")
        await world.card()
        retried = await world.sender.event(event, event_id="Ev1", retry_num=1)
        assert (first.status, retried.status) == (200, 200)
        again = await world.sender.event(event, event_id="Ev1", retry_num=2)
        assert again.status == 200
        await world.settled()
        assert await _runs(world) == 1
        assert world.model.count == 1
        assert world.chat.duplicates_dropped == 2


async def test_a_mention_delivered_as_app_mention_and_message_is_one_turn(
    tmp_path: Path,
) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        mention = app_mention(REQUESTER, "checkout is failing")
        twin = message(REQUESTER, mention["text"], ts=mention["ts"])
        # The message copy may arrive first: either way one run.
        await world.sender.event(twin)
        await world.sender.event(mention)
        await world.card()
        await world.settled()
        assert await _runs(world) == 1
        cards = [
            c for c in world.api.calls_to("chat.postMessage") if ids.APPROVE_ONCE in str(c.args)
        ]
        assert len(cards) == 1


async def test_a_bad_signature_gets_401_and_changes_nothing(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        body = event_callback(app_mention(REQUESTER, f"<@{world.api.bot_user}> restart it"))
        response = await world.sender.bad_signature(body)
        assert response.status == 401
        stale = await world.sender.stale(json.dumps(body).encode())
        assert stale.status == 401
        await world.settled()
        assert await _runs(world) == 0
        assert world.api.calls_to("chat.postMessage") == []


async def test_a_rate_limited_card_is_posted_once_when_slack_lets_it(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        # Two 429s in a row: the outbox puts the card off by Retry-After each time.
        world.api.fail("chat.postMessage", status=429, retry_after=1, times=2)
        await world.mention("checkout is failing")
        card = await world.card(timeout=15)
        posted = [c for c in world.api.calls_to("chat.postMessage") if c.ok]
        assert len(posted) == 1
        assert len(world.api.calls_to("chat.postMessage")) == 3
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        await world.answer_posted()
        assert world.executions == ["checkout"]


async def test_a_rate_limited_channel_holds_back_no_other_channel(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        # Slack limits one channel for ten minutes: only its card waits that long.
        world.api.fail("chat.postMessage", retry_after=600, times=None, channel=SLOW)
        await world.mention("checkout is failing", channel=SLOW)
        await world.api.wait_for(lambda c: c.args.get("channel") == SLOW and c.status == 429)
        await world.mention("checkout is failing")
        card = await world.card()
        assert card.args["channel"] == CHANNEL
        limited = [c for c in world.api.calls_to("chat.postMessage") if c.args["channel"] == SLOW]
        assert len(limited) == 1  # asked once, then put off: not retried in a loop


async def test_cards_rate_limited_together_are_retried_spread_never_sooner(
    tmp_path: Path,
) -> None:
    # Cards one Retry-After put off (in this replica, or in several) were all due at the same
    # instant, and met the limit again together.
    async with slack_world(tmp_path, restart_script()) as world:
        world.api.fail("chat.postMessage", retry_after=600, times=None)
        for _ in range(3):
            await world.mention("checkout is failing")
        store = world.rt.store

        async def put_off() -> list[Any]:
            requests = await store.list_requests()
            rows = [await store.get_message(f"slack:card:{r.id}") for r, _, _ in requests]
            limited = [m for m in rows if m is not None and "ratelimited" in m.error]
            return limited if len(limited) == 3 else []

        rows = await until(put_off, timeout=20)
        waits = [(m.next_attempt_at - m.updated_at).total_seconds() for m in rows]
        assert min(waits) >= 599.9, waits  # never sooner than Slack said
        assert max(waits) <= 600 + 30, waits  # a small, bounded spread
        assert max(waits) - min(waits) > 0.01, waits


async def test_a_post_that_landed_unrecorded_is_found_not_posted_again(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        original = world.api._post_message  # the fake's own handler: store the message

        def lands_then_fails(call):  # type: ignore[no-untyped-def]
            original(call)
            world.api.set_handler("chat.postMessage", None)
            return {"ok": False, "error": "internal_error"}  # as if the answer was lost

        world.api.set_handler("chat.postMessage", lands_then_fails)
        await world.mention("checkout is failing")
        await world.api.wait_for("conversations.replies", timeout=15)
        await world.settled()
        cards = [
            m
            for m in world.api.thread(
                CHANNEL, world.api.calls_to("chat.postMessage")[0].args["thread_ts"]
            )
            if ids.APPROVE_ONCE in json.dumps(m.get("blocks") or [])
        ]
        assert len(cards) == 1


async def test_restart_between_card_and_click(tmp_path: Path) -> None:
    async with FakeSlackApi() as api:
        async with slack_world(tmp_path, restart_script(), api=api) as first:
            await first.mention("checkout is failing")
            card = await first.card()
            await first.settled()
        posts_before = len(api.calls_to("chat.postMessage"))
        async with slack_world(tmp_path, restart_script(), api=api) as second:
            await second.settled()
            assert len(api.calls_to("chat.postMessage")) == posts_before  # nothing re-posted
            await second.click(card, ids.APPROVE_ONCE, user=APPROVER)
            await second.answer_posted()
            assert second.executions == ["checkout"]
            ts = posted_ts(api, card)
            assert updates_of(api, ts), "the old card was not updated in place"
            answers = [c for c in api.calls_to("chat.postMessage") if ids.FEEDBACK in str(c.args)]
            assert len(answers) == 1


async def test_a_guest_from_another_workspace_may_not_start_or_decide(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        guest = app_mention("U0GUEST", "restart checkout", user_team="T0OTHER")
        await world.sender.event(guest)
        note = await world.ephemeral_to("U0GUEST")
        assert "may not start" in note.args["text"]
        assert await _runs(world) == 0
        await world.mention("checkout is failing")
        card = await world.card()
        # An approver's id from another workspace is a different person: refused.
        await world.click(card, ids.APPROVE_ONCE, user="U0GUEST", user_team="T0OTHER")
        note = await world.ephemeral_to("U0GUEST", nth=2)
        assert "may not approve" in note.args["text"]
        assert world.executions == []


async def test_a_guest_named_by_policy_may_start(tmp_path: Path) -> None:
    policy = {"requesters": ["U0GUEST"]}
    async with slack_world(tmp_path, restart_script(), extra_policy=policy) as world:
        await world.sender.event(app_mention("U0GUEST", "checkout is failing", user_team="T0OTHER"))
        await world.card()
        assert await _runs(world) == 1


async def test_a_click_on_a_cancelled_runs_card_is_refused(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        await world.mention("cancel", user=ONCALL, thread_ts=mention["ts"])
        note = await world.ephemeral_to(ONCALL)
        assert "cancelled" in note.args["text"]
        run_id = (await world.chat.recent(1))[0].id
        assert (await world.chat.status(run_id)).record.status is RunStatus.CANCELLED
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        note = await world.ephemeral_to(APPROVER)
        assert "cancelled" in note.args["text"]
        assert world.executions == []


async def test_socket_mode_takes_a_retried_envelope_once(tmp_path: Path) -> None:
    async with (
        FakeSlackApi() as api,
        slack_world(tmp_path, restart_script(), api=api) as world,
        socket_mode(world, api, "xapp-1") as adapter,
    ):
        await api.wait_for_socket()
        body = event_callback(app_mention(REQUESTER, "checkout is failing"), event_id="EvS1")
        first = await api.socket_send(events_api_envelope(body))
        await api.wait_for_ack(first)
        await world.card()
        retry = await api.socket_send(
            events_api_envelope(body, retry_attempt=1, retry_reason="timeout")
        )
        await api.wait_for_ack(retry)
        assert adapter.listeners is not None
        await adapter.listeners.idle()
        assert await _runs(world) == 1


@asynccontextmanager
async def socket_mode(
    world: SlackWorld, api: FakeSlackApi, app_token: str
) -> AsyncIterator[SlackAdapter]:
    """A Slack adapter of ``world`` connected in Socket Mode to ``api`` with ``app_token``,
    stopped at the end."""
    settings = SlackSettings(
        bot_token="xoxb-test", signing_secret="", app_token=app_token, api_url=api.url
    )
    adapter = SlackAdapter(world.chat, world.rt.store, "socket-owner", settings)
    await adapter.start()
    await adapter.connect()
    try:
        yield adapter
    finally:
        await adapter.stop()


@pytest.mark.parametrize("lost", ["dropped", "refresh_requested"])
async def test_socket_mode_whose_token_is_refused_at_reconnect_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, lost: str
) -> None:
    # The app-level token revoked while connected: at the next socket (Slack's refresh, or one
    # dropped) the socket client asked again every 10 s for ever, two errors a time, neither
    # naming SLACK_APP_TOKEN, and /readyz said it was reconnecting.
    async with (
        FakeSlackApi() as api,
        slack_world(tmp_path, restart_script(), api=api) as world,
        socket_mode(world, api, "xapp-1-revoked") as adapter,
    ):
        await api.wait_for_socket()
        api.refuse("apps.connections.open", "invalid_auth")
        if lost == "dropped":
            await api.close_sockets()
        else:
            await api.socket_disconnect(lost)
        await until(lambda: adapter.gave_up, timeout=20)
        assert adapter.gave_up == "apps.connections.open refused SLACK_APP_TOKEN: invalid_auth"
        assert not await adapter.connected()
        await until(lambda: not api.open_sockets, timeout=20)  # this replica hangs up
    said = [r.getMessage() for r in caplog.records if r.name == "kestrel.slack"]
    assert said == [
        "slack: apps.connections.open refused SLACK_APP_TOKEN: invalid_auth; this replica"
        " serves Slack no more until it is restarted"
    ]
    assert api.count("apps.connections.open") == 2  # the first socket's, and the refused one
    assert "xapp-1-revoked" not in caplog.text


async def test_a_guests_mention_in_a_shared_channel_is_a_run_of_our_workspace(
    tmp_path: Path,
) -> None:
    """In a Slack Connect channel, an event said by a guest may come with the guest's own
    workspace as its ``team_id`` (the installation is in ``authorizations``): the run it
    starts still lives in the thread as our people see it, so our approver's click on its
    card counts, and a mention of ours in the thread is about that same run."""
    policy = {"requesters": ["U0GUEST"]}
    home = [{"team_id": "T0001", "user_id": "UBOT", "is_bot": True}]
    async with slack_world(tmp_path, restart_script(), extra_policy=policy) as world:
        guest = app_mention("U0GUEST", "checkout is failing", user_team="T0OTHER")
        guest["team"] = "T0OTHER"
        await world.sender.event(
            guest, team="T0OTHER", authorizations=home, is_ext_shared_channel=True
        )
        card = await world.card()
        await world.settled()
        await world.mention("status", user=ONCALL, thread_ts=guest["ts"])
        status = await world.ephemeral_to(ONCALL)
        assert "suspended" in json.dumps(status.args)
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        await world.answer_posted()
        assert world.executions == ["checkout"]
