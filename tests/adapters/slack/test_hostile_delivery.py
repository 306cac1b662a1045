"""Hostile delivery: Slack answering 500s, dropping connections, losing messages, and
refusing streaming midway. Each failing test here is one finding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from adapters.slack import ids
from bot.domain import DecisionKind
from bot.people.policy import Actor
from tests.fakes.slack_api import FakeSlackApi
from tests.fakes.slack_client import block_actions, slash_command
from tests.fakes.slack_world import (
    APPROVER,
    CHANNEL,
    ONCALL,
    button_value,
    posted_ts,
    restart_script,
    slack_world,
)
from tests.fakes.waiting import until


def _cards_in_thread(api: FakeSlackApi, thread_ts: str) -> list[dict[str, Any]]:
    return [
        m
        for m in api.thread(CHANNEL, thread_ts)
        if m.get("bot_id") and ids.APPROVE_ONCE in json.dumps(m.get("blocks") or [])
    ]


class DroppingApi(FakeSlackApi):
    """Takes the first chat.postMessage, stores it, then cuts the connection before answering
    (as a load balancer timing out, or a reset after Slack has processed the request)."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        response = await super()._handle_api(request)
        if method == "chat.postMessage" and self.dropped == 0:
            self.dropped += 1
            assert request.transport is not None
            request.transport.close()  # the message landed; the answer never arrives
        return response


async def test_hostile_connection_cut_after_post_lands_does_not_post_twice(tmp_path: Path) -> None:
    api = DroppingApi()
    async with api, slack_world(tmp_path, restart_script(), api=api) as world:
        mention = await world.mention("checkout is failing")
        await world.card(timeout=15)
        for _ in range(3):  # let the outbox retry, past its backoffs, and settle
            await world.later(60)
        assert api.dropped == 1
        cards = _cards_in_thread(api, mention["ts"])
        assert len(cards) == 1, f"the approval card was posted {len(cards)} times"


async def test_hostile_500_on_post_is_retried_once_landed(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        world.api.fail("chat.postMessage", status=500, error="internal_error", times=2)
        mention = await world.mention("checkout is failing")
        card = await world.card(timeout=15)
        await world.settled()
        assert len(_cards_in_thread(world.api, mention["ts"])) == 1
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        await world.answer_posted()
        assert world.executions == ["checkout"]


async def test_hostile_deleted_card_is_shown_again_after_the_decision(tmp_path: Path) -> None:
    """Someone deletes the card (or an admin's retention policy does): chat.update then answers
    message_not_found forever. The decision must still reach the thread, not be retried every
    5 minutes forever."""
    async with slack_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        ts = posted_ts(world.api, card)
        world.api.messages[CHANNEL] = [m for m in world.api.messages[CHANNEL] if m["ts"] != ts]
        click = block_actions(
            APPROVER,
            ids.APPROVE_ONCE,
            button_value(card, ids.APPROVE_ONCE),
            channel=CHANNEL,
            message_ts=ts,
            thread_ts=mention["ts"],
        )
        assert (await world.sender.action(click)).status == 200
        await world.answer_posted()
        for _ in range(3):
            await world.later(60)  # past the outbox's backoffs
        failed_updates = [
            c for c in world.api.calls_to("chat.update") if c.args.get("ts") == ts and not c.ok
        ]
        assert failed_updates, "the card's update was never attempted"
        shown = [
            m
            for m in world.api.thread(CHANNEL, mention["ts"])
            if m.get("bot_id")
            and APPROVER in json.dumps(m.get("blocks") or [])
            and "restart_service" in json.dumps(m.get("blocks") or [])
        ]
        backlog = await world.rt.store.outbox_backlog("slack")
        assert shown or backlog == 0, (
            "the card's decision is nowhere in the thread and its outbox entry is retried"
            " forever (message_not_found is permanent)"
        )


def _three_steps() -> list[Any]:
    calls = [
        {"name": "drain_node", "arguments": {"node": f"node-{i}", "seconds": 0}} for i in (1, 2, 3)
    ]
    return [
        {"text": "Draining node-1.", "calls": [calls[0]]},
        {"text": "Draining node-2.", "calls": [calls[1]]},
        {"text": "Draining node-3.", "calls": [calls[2]]},
        {"text": "All drained."},
    ]


async def test_hostile_streaming_refused_midway_is_not_a_message_per_step(tmp_path: Path) -> None:
    async with slack_world(tmp_path, _three_steps()) as world:
        # The stream starts; after that the workspace refuses every append.
        world.api.refuse("chat.appendStream", "not_allowed")
        await world.mention("drain nodes 1 to 3")
        await world.answer_posted()
        await world.settled()
        streams = [m for m in world.api.messages[CHANNEL] if "streaming" in m]
        fallbacks = [
            c
            for c in world.api.calls_to("chat.postMessage")
            if "drain_node" in json.dumps(c.args) and ids.FEEDBACK not in json.dumps(c.args)
        ]
        left_open = [m for m in streams if m["streaming"]]
        assert len(streams) + len(fallbacks) <= 2, (
            f"{len(streams)} stream messages and {len(fallbacks)} status messages for 3 steps"
        )
        assert not left_open, f"{len(left_open)} stream(s) never stopped"


async def test_hostile_one_rate_limited_append_abandons_the_stream(tmp_path: Path) -> None:
    async with slack_world(tmp_path, _three_steps()) as world:
        # One transient 429 (and the SDK's own retry of it) on appending.
        world.api.fail("chat.appendStream", status=429, retry_after=0, times=2)
        await world.mention("drain nodes 1 to 3")
        await world.answer_posted()
        await world.settled()
        streams = [m for m in world.api.messages[CHANNEL] if "streaming" in m]
        left_open = [m for m in streams if m["streaming"]]
        assert len(streams) == 1, f"{len(streams)} stream messages after one transient 429"
        assert not left_open, "a stream was abandoned still streaming"


def _refusing_blocks(original: Any) -> Any:
    """A handler that refuses any message carrying blocks, as Slack does a body it finds
    invalid (``invalid_blocks``), and takes one of text alone."""

    def handler(call: Any) -> dict[str, Any]:
        if call.args.get("blocks"):
            return {"ok": False, "error": "invalid_blocks"}
        return dict(original(call))

    return handler


async def test_hostile_blocks_slack_refuses_are_shown_as_their_text_once(tmp_path: Path) -> None:
    # A body Slack refuses (invalid_blocks, msg_too_long) is refused the same way every time:
    # it was retried every five minutes for ever, and the thread never saw the answer.
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        world.api.set_handler("chat.postMessage", _refusing_blocks(world.api._post_message))
        world.api.set_handler("chat.update", _refusing_blocks(world.api._update))
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        await world.api.wait_for(
            lambda c: (
                c.method == "chat.postMessage"
                and c.ok is True
                and "healthy again" in c.args["text"]
            )
        )
        ts = posted_ts(world.api, card)
        await world.api.wait_for(
            lambda c: c.method == "chat.update" and c.ok is True and c.args["ts"] == ts
        )
        for _ in range(3):
            await world.later(300)
        answers = [
            c
            for c in world.api.calls_to("chat.postMessage")
            if "healthy again" in c.args.get("text", "")
        ]
        assert [c.ok for c in answers] == [False, True]  # refused once, then its text alone
        assert world.executions == ["checkout"]


async def test_hostile_an_uninstalled_app_is_tried_again_hourly_not_every_few_minutes(
    tmp_path: Path,
) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        world.api.fail("chat.postMessage", error="account_inactive", status=200, times=None)
        world.api.fail("chat.update", error="account_inactive", status=200, times=None)
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        await world.api.wait_for(lambda c: c.method == "chat.postMessage" and c.ok is False)
        await world.settled()
        tried = len(world.api.calls_to("chat.postMessage")) + len(world.api.calls_to("chat.update"))
        for _ in range(6):
            await world.later(300)  # half an hour: a token that was revoked stays revoked
        again = len(world.api.calls_to("chat.postMessage")) + len(world.api.calls_to("chat.update"))
        assert again == tried
        world.api.clear_faults()
        await world.later(3600)  # reinstalled: what waited is shown
        await world.answer_posted()


async def test_hostile_a_card_whose_blocks_are_refused_says_how_to_decide_it(
    tmp_path: Path,
) -> None:
    # Shown as its words alone, an approval card loses its buttons: nothing in the thread
    # could decide it, and the run waited for a click that could not come.
    async with slack_world(tmp_path, restart_script()) as world:
        world.api.set_handler("chat.postMessage", _refusing_blocks(world.api._post_message))
        await world.mention("checkout is failing")
        [shown] = await world.api.wait_for(
            lambda c: (
                c.method == "chat.postMessage"
                and c.ok is True
                and "Approval needed" in c.args["text"]
            )
        )
        [(request, _, _)] = await world.rt.store.list_requests()
        text = shown.args["text"]
        assert f"its buttons cannot be shown: on-call can decide request `{request.id}`" in text
        assert "`kestrel runs pending`" in text and "`/kestrel runs`" in text


async def test_hostile_a_card_slack_keeps_refusing_is_said_once_where_on_call_looks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Slack failed every post of the card (an outage of minutes): it was retried every five
    # minutes, one warning each, and nothing said which request waited, or how to decide it.
    async with slack_world(tmp_path, restart_script()) as world:
        world.api.fail("chat.postMessage", error="fatal_error", status=200, times=None)
        await world.mention("checkout is failing")
        await world.api.wait_for(lambda c: c.method == "chat.postMessage" and c.ok is False)
        for _ in range(6):
            await world.later(300)
        [(request, _, _)] = await world.rt.store.list_requests()
        said = [r for r in caplog.records if "has not reached its thread" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]
        assert f"request {request.id}" in said[0].getMessage()
        assert said[0].levelname == "ERROR"
        # Whoever lists what waits learns its card is not in the thread, and why.
        await world.sender.command(slash_command(ONCALL, "runs"))
        listed = json.dumps((await world.api.wait_for("response_url"))[0].args)
        assert "card not shown" in listed and "fatal_error" in listed, listed
        world.api.clear_faults()
        await world.later(300)
        await world.card()


async def test_hostile_a_message_refused_even_as_text_is_given_up_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Slack refused the answer as a body (msg_too_long), then its words alone too: the same
    # words were sent every five minutes for ever, a warning each time.
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        original = world.api._post_message

        def refusing_the_answer(call: Any) -> dict[str, Any]:
            if "healthy again" in json.dumps(call.args):
                return {"ok": False, "error": "msg_too_long"}
            return dict(original(call))

        world.api.set_handler("chat.postMessage", refusing_the_answer)
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        await world.api.wait_for(
            lambda c: c.method == "chat.postMessage" and "healthy again" in json.dumps(c.args)
        )
        await world.settled()

        def answers() -> int:
            posts = world.api.calls_to("chat.postMessage")
            return len([c for c in posts if "healthy again" in json.dumps(c.args)])

        tried = answers()
        for _ in range(3):
            await world.later(300)
        assert answers() == tried == 2  # as it was, then its words alone; no more
        assert any("given up" in r.getMessage() for r in caplog.records)


async def test_hostile_a_card_never_shown_and_decided_at_the_terminal_is_not_said_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The card never reached its thread and was said once; on-call approved it at the
    # terminal, as the line told them. After a restart its closed card, still refused, was said
    # again: "nobody there can decide it; `kestrel runs approve` decides it", of a request
    # decided long before.
    async with FakeSlackApi() as api:
        api.fail("chat.postMessage", error="fatal_error", status=200, times=None)
        async with slack_world(tmp_path, restart_script(), api=api) as world:
            await world.mention("checkout is failing")
            # The run suspends in its own task: the clock moves only once the card is owed.
            [(request, _, _)] = await until(world.rt.store.list_requests)
            for _ in range(4):
                await world.later(300)
            decided = await world.chat.decide(
                request.run_id, request.id, DecisionKind.APPROVE, user=Actor(APPROVER)
            )
            assert decided.accepted, decided.message
            await until(lambda: world.chat.ended(request.run_id))
            for _ in range(4):
                await world.later(300)
        async with slack_world(tmp_path, restart_script(), api=api) as world:
            for _ in range(4):
                await world.later(3600)
            assert world.executions == ["checkout"]
        said = [r for r in caplog.records if "has not reached its thread" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]


async def test_hostile_a_card_never_shown_is_said_once_across_restarts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Each process kept its own memory of what it had said: every restart of serve (and every
    # replica that took the card up in turn) said the same card again.
    async with FakeSlackApi() as api:
        api.fail("chat.postMessage", error="fatal_error", status=200, times=None)
        async with slack_world(tmp_path, restart_script(), api=api) as world:
            await world.mention("checkout is failing")
            await world.api.wait_for(lambda c: c.method == "chat.postMessage" and c.ok is False)
            for _ in range(6):
                await world.later(300)
        async with slack_world(tmp_path, restart_script(), api=api) as world:
            for _ in range(5):
                await world.later(600)  # its deadline (an hour) not yet passed
            [(request, _, _)] = await world.rt.store.list_requests()
            shown = await world.rt.store.get_message(f"slack:card:{request.id}")
            assert shown is not None and shown.attempts > 3 and not shown.ref, shown
        said = [r for r in caplog.records if "has not reached its thread" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]
