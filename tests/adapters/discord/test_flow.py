"""Kestrel in Discord end to end: the real discord.py client against a local stand-in for
Discord's REST API and gateway, the real runtime and openai client, a fake model.

The tests rely on discord.py's internals as of 2.7 (the gateway's default URL, DynamicItem
dispatch, the interaction callback's ``with_response``): pyproject pins ``discord.py>=2.7,<2.8``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from adapters.discord.transport import DiscordTransport
from bot.domain import RequestStatus
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.discord_world import (
    APPROVER,
    ONCALL,
    REQUESTER,
    SRE_ROLE,
    DiscordWorld,
    button_id,
    discord_world,
)
from tests.fakes.openai_server import Canned
from tests.fakes.slack_world import (
    INJECTED_LOG,
    drain_script,
    injection_script,
    plan_script,
    question_script,
    reload_with_another_argv,
    require_approvals,
    restart_script,
)
from tests.fakes.waiting import until

PG_DSN = os.environ.get("KESTREL_TEST_POSTGRES_DSN", "")


async def test_mention_thread_card_approve_result(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing, can you look?")
        thread = await world.thread_of(mention)
        card = await world.card("approve")
        assert card["channel_id"] == thread
        shown = json.dumps(card)
        assert "restart_service" in shown and "checkout" in shown and "OOM-killed" in shown
        assert world.executions == []
        click = await world.click(card, "approve", user=APPROVER)
        assert "Recorded" in await world.answered(click)
        await world.answer_posted(thread, "healthy again")
        assert world.executions == ["checkout"]
        await world.settled()
        edited = world.discord.message(thread, card["id"])
        assert edited is not None and edited["components"] == []
        assert f"<@{APPROVER}>" in json.dumps(edited["embeds"])
        typing = world.discord.calls_to("POST", rf"/channels/{thread}/typing")
        assert typing, "no typing indicator while the run worked"


async def test_refused_clicks_change_nothing(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        card = await world.card("approve")
        own = await world.click(card, "approve", user=REQUESTER)
        assert "someone else" in await world.answered(own)
        stranger = await world.click(card, "approve", user="1999")
        assert "may not approve" in await world.answered(stranger)
        # Roles count in the run's guild only: the approvers' role id from another guild
        # does not make its holder an approver.
        guest = await world.click(card, "approve", user="1500", roles=[SRE_ROLE], guild="777")
        assert "is in another server" in await world.answered(guest)
        run_id = (await world.chat.recent(1))[0].id
        assert [v.status for v in await world.chat.requests_of(run_id)] == [RequestStatus.OPEN]
        # A member of the approvers' role approves; a second click is refused.
        first = await world.click(card, "approve", user="1500", roles=[SRE_ROLE])
        assert "Recorded" in await world.answered(first)
        await world.answer_posted(thread, "healthy again")
        second = await world.click(card, "approve", user=APPROVER)
        assert "already" in await world.answered(second)
        assert world.executions == ["checkout"]


async def test_a_card_two_people_approved_names_both(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        require_approvals(world.rt, tmp_path, 2)
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        card = await world.card("approve")
        first = await world.click(card, "approve", user=APPROVER)
        assert await world.answered(first) == "approval 1 of 2 recorded"
        again = await world.click(card, "approve", user=APPROVER)
        assert await world.answered(again) == (
            "You already approved this; it needs 1 more approval (from someone else)."
        )
        assert world.executions == []
        last = await world.click(card, "approve", user="1500", roles=[SRE_ROLE])
        assert "Recorded" in await world.answered(last)
        await world.answer_posted(thread, "healthy again")
        assert world.executions == ["checkout"]
        await world.settled()
        edited = world.discord.message(thread, card["id"])
        assert edited is not None
        assert f"Approved by <@{APPROVER}> and <@1500>" in json.dumps(edited["embeds"])


async def test_deny_with_a_reason_from_the_modal(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        card = await world.card("approve")
        await world.fill_form(card, "deny", "peak hours", user=APPROVER, channel=thread)
        await world.answer_posted(thread, "denied")
        assert world.executions == []
        run_id = (await world.chat.recent(1))[0].id
        view = (await world.chat.requests_of(run_id))[0]
        assert view.decision is not None and view.decision.text == "peak hours"


async def test_a_question_answered_through_its_modal(tmp_path: Path) -> None:
    async with discord_world(tmp_path, question_script()) as world:
        mention = await world.mention("look at the latency")
        thread = await world.thread_of(mention)
        card = await world.card("answer")
        await world.fill_form(card, "answer", "eu-west", user=REQUESTER, channel=thread)
        await world.answer_posted(thread, "looking at eu-west")


async def test_a_question_answered_by_a_reply_in_the_thread(tmp_path: Path) -> None:
    async with discord_world(tmp_path, question_script()) as world:
        mention = await world.mention("look at the latency")
        thread = await world.thread_of(mention)
        await world.card("answer")
        # Someone who may not answer is told so in the thread, and nothing is decided.
        await world.reply("us-east", user="1999", thread=thread)
        told = await world.discord.wait_for(
            lambda c: (
                c.path == f"/channels/{thread}/messages"
                and "1999 may not answer this question" in json.dumps(c.json)
            ),
            timeout=10,
        )
        assert len(told) == 1
        run_id = (await world.chat.recent(1))[0].id
        assert [v.status for v in await world.chat.requests_of(run_id)] == [RequestStatus.OPEN]
        await world.reply("us-east", user=REQUESTER, thread=thread)
        await world.answer_posted(thread, "looking at us-east")


async def test_restart_between_card_and_click(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake) as first:
            mention = await first.mention("checkout is failing")
            thread = await first.thread_of(mention)
            card = await first.card("approve")
            await first.settled()
        posts = len(fake.calls_to("POST", rf"/channels/{thread}/messages"))
        async with discord_world(tmp_path, restart_script(), fake=fake) as second:
            await second.settled()
            assert len(fake.calls_to("POST", rf"/channels/{thread}/messages")) == posts
            click = await second.click(card, "approve", user=APPROVER)
            assert "Recorded" in await second.answered(click)
            await second.answer_posted(thread, "healthy again")
            assert second.executions == ["checkout"]
            await second.settled()
            edited = fake.message(thread, card["id"])
            assert edited is not None and edited["components"] == []


async def test_a_rate_limited_card_is_posted_once(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        fake.fail("POST", r"/channels/\d+/messages", status=429, retry_after=0.3, times=1)
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            mention = await world.mention("checkout is failing")
            thread = await world.thread_of(mention)
            card = await world.card("approve")
            await world.settled()
            cards = [m for m in fake.bot_messages(thread) if "kestrel:approve:" in json.dumps(m)]
            assert len(cards) == 1
            await world.click(card, "approve", user=APPROVER)
            await world.answer_posted(thread, "healthy again")
            assert world.executions == ["checkout"]


async def test_a_click_on_a_cancelled_runs_card_is_refused(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        card = await world.card("approve")
        await world.settled()
        await world.mention("cancel", user=ONCALL, channel=thread)
        await world.answer_posted(thread, "cancelled")
        click = await world.click(card, "approve", user=APPROVER)
        assert "cancelled" in await world.answered(click)
        assert world.executions == []


async def test_the_kestrel_command_in_a_thread(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        await world.card("approve")
        await world.settled()
        status = p.interaction_command(
            options=[{"name": "status", "type": 1, "options": []}],
            guild=p.GUILD_ID,
            channel=thread,
            user_id=ONCALL,
        )
        await world.discord.dispatch("INTERACTION_CREATE", status)
        shown = await world.answered(status)
        assert "suspended" in shown and "restart_service" in shown
        cancel = p.interaction_command(
            options=[{"name": "cancel", "type": 1, "options": []}],
            guild=p.GUILD_ID,
            channel=thread,
            user_id="1999",
        )
        await world.discord.dispatch("INTERACTION_CREATE", cancel)
        assert "may not cancel" in await world.answered(cancel)
        runs = p.interaction_command(
            options=[{"name": "runs", "type": 1, "options": []}],
            guild=p.GUILD_ID,
            channel=p.CHANNEL_ID,
            user_id=ONCALL,
        )
        await world.discord.dispatch("INTERACTION_CREATE", runs)
        listed = await world.answered(runs)
        assert "restart_service" in listed and f"/channels/{p.GUILD_ID}/{thread}" in listed


async def test_a_run_resumed_after_its_thread_archived_opens_it_again(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        fake.reject_archived_sends = True  # as for an edit: nothing lands in an archived thread
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            mention = await world.mention("checkout is failing")
            thread = await world.thread_of(mention)
            card = await world.card("approve")
            await world.settled()
            fake.archive(thread)  # a day without activity
            await world.click(card, "approve", user=APPROVER)
            await world.answer_posted(thread, "healthy again")
            reopened = fake.calls_to("PATCH", rf"/channels/{thread}")
            assert reopened and reopened[0].json == {"archived": False}
            assert world.executions == ["checkout"]


async def test_an_effect_cut_by_a_restart_is_settled_from_its_card(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, drain_script(30), fake=fake) as first:
            mention = await first.mention("drain node-3")
            thread = await first.thread_of(mention)
            await until(lambda: first.executions, timeout=10)  # the drain started: stop
        async with discord_world(tmp_path, drain_script(0), fake=fake) as second:
            await second.mention("resume", user=ONCALL, channel=thread)
            card = await second.card("effect")
            assert "drain_node" in json.dumps(card) and "node-3" in json.dumps(card)
            done = button_id(card, "effect:done")
            click = p.interaction_button(
                channel=thread, user_id="1999", custom_id=done, message=card
            )
            await second.discord.dispatch("INTERACTION_CREATE", click)
            assert "on-call" in await second.answered(click)
            click = p.interaction_button(
                channel=thread, user_id=ONCALL, custom_id=done, message=card
            )
            await second.discord.dispatch("INTERACTION_CREATE", click)
            await second.answer_posted(thread, "drained")
            assert second.executions == ["node-3"]


async def test_a_card_whose_answer_was_lost_is_not_posted_again(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        lost: list[Any] = []

        async def lands_then_fails(call: Any) -> tuple[int, Any]:
            # Discord stores the message, then the answer is lost (a 500 from a proxy); the
            # post is sent again, by discord.py or the outbox, with the same nonce.
            channel = call.path.split("/")[2]
            fake.set_handler("POST", pattern, None)
            await fake._r_create_message(call, channel)
            lost.append(call)
            return 500, {"message": "upstream timed out", "code": 0}

        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            mention = await world.mention("checkout is failing")
            thread = await world.thread_of(mention)
            pattern = rf"/channels/{thread}/messages"
            fake.set_handler("POST", pattern, lands_then_fails)
            card = await world.card("approve", timeout=20)
            await world.settled()
            cards = [m for m in fake.bot_messages(thread) if "kestrel:approve:" in json.dumps(m)]
            assert lost and len(cards) == 1
            await world.click(card, "approve", user=APPROVER)
            await world.answer_posted(thread, "healthy again")
            assert world.executions == ["checkout"]


async def test_a_post_of_unknown_outcome_is_found_by_what_it_shows(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        card = await world.card("approve")
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id
        request_id = (await world.chat.requests_of(run_id))[0].request.id
        stored = await world.rt.store.get_message(f"discord:card:{request_id}")
        assert stored is not None
        transport = DiscordTransport(world.adapter.client.http)
        assert await transport.find(stored.key, stored.target, stored.body) == card["id"]
        other = {**stored.body, "content": "something else"}
        assert await transport.find("discord:test:other", {"channel": thread}, other) is None
        # A card is also the message whose buttons name its request, whatever it shows.
        assert await transport.find(stored.key, {"channel": thread}, other) == card["id"]
        another = "discord:card:req_another"
        assert await transport.find(another, {"channel": thread}, other) is None


async def test_an_effect_following_a_log_waits_on_a_card_naming_the_log(tmp_path: Path) -> None:
    (tmp_path / "log.txt").write_text(INJECTED_LOG)
    async with discord_world(tmp_path, injection_script()) as world:
        mention = await world.mention("the api is slow, can you look?")
        thread = await world.thread_of(mention)
        card = await world.card("approve")
        [embed] = card["embeds"]
        [origins] = [f["value"] for f in embed["fields"] if f["name"] == "Taken from tool output"]
        assert "`node` = `node-666` came from `read_log` output, line 2" in origins
        assert "**⚠ its output holds instruction-like text**" in origins
        assert world.executions == []  # drain_node is ungated, and still waits
        click = await world.click(card, "approve", user=APPROVER)
        assert "Recorded" in await world.answered(click)
        await world.answer_posted(thread, "Drained node-666")
        assert world.executions == ["node-666"]


async def test_a_plan_card_approved_once_runs_both_restarts(tmp_path: Path) -> None:
    async with discord_world(tmp_path, plan_script()) as world:
        mention = await world.mention("checkout and payments are failing")
        thread = await world.thread_of(mention)
        card = await world.card("step_by_step")
        shown = json.dumps(card)
        assert "Plan approval needed" in shown and "Both are OOM-killed" in shown
        assert "1. restart_service" in shown and "2. restart_service" in shown
        assert "Approve plan" in shown and "approve_run" not in shown
        assert world.executions == []

        click = await world.click(card, "approve", user=APPROVER)

        assert "Recorded" in await world.answered(click)
        await world.answer_posted(thread, "Restarted checkout and payments")
        assert world.executions == ["checkout", "payments"]
        await world.settled()
        edited = world.discord.message(thread, card["id"])
        assert edited is not None and edited["components"] == []


async def test_a_plan_taken_step_by_step_posts_a_card_per_call(tmp_path: Path) -> None:
    async with discord_world(tmp_path, plan_script()) as world:
        await world.mention("checkout and payments are failing")
        card = await world.card("step_by_step")

        click = await world.click(card, "step_by_step", user=APPROVER)

        assert "Recorded" in await world.answered(click)
        await world.card("approve_run")  # a call's own card, with its per-call buttons
        run_id = (await world.chat.recent(1))[0].id
        views = await world.chat.requests_of(run_id)
        opened = [v.request.kind.value for v in views if v.status is RequestStatus.OPEN]
        assert opened == ["wait_approval", "wait_approval"]
        assert world.executions == []


async def test_a_plan_click_from_another_guild_decides_nothing(tmp_path: Path) -> None:
    async with discord_world(tmp_path, plan_script()) as world:
        await world.mention("checkout and payments are failing")
        card = await world.card("step_by_step")
        for kind in ("approve", "step_by_step"):
            guest = await world.click(card, kind, user=APPROVER, guild="777")
            assert "is in another server" in await world.answered(guest)
        run_id = (await world.chat.recent(1))[0].id
        assert [v.status for v in await world.chat.requests_of(run_id)] == [RequestStatus.OPEN]
        assert world.executions == []


async def test_an_approval_the_run_cannot_go_on_with_says_why(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        await world.thread_of(mention)
        card = await world.card("approve")
        reload_with_another_argv(world.rt, tmp_path)  # while the card waits
        click = await world.click(card, "approve", user=APPROVER)
        told = await world.answered(click)
        assert "tool set changed since the run started; resume with --force" in told
        assert world.executions == []


async def test_a_run_handed_back_with_a_card_open_says_it_waits_on_people(
    tmp_path: Path,
) -> None:
    restart = {"name": "restart_service", "arguments": {"service": "checkout"}}
    drain = {"name": "drain_node", "arguments": {"node": "node-3", "seconds": 30}}
    script = [{"text": "Both.", "calls": [restart, drain]}, {"text": "Done."}]
    async with discord_world(tmp_path, script) as world:
        thread = await world.thread_of(await world.mention("checkout and node-3"))
        await world.card()
        await until(lambda: "node-3" in world.executions)
        await world.supervisor.shutdown(hand_back=True)  # the drain is cut, the card stays
        await world.settled()

        (status,) = [
            m for m in world.discord.bot_messages(thread) if m["content"].startswith("Working…")
        ]
        assert status["content"].endswith("Waiting on people.")


async def test_a_run_handed_back_says_so_in_its_status(tmp_path: Path) -> None:
    script = [
        {"text": "Reading the log.", "calls": [{"name": "read_log", "arguments": {}}]},
        {"text": "Nothing in the log."},
    ]
    async with discord_world(tmp_path, script) as world:
        # The second model call is slow: the replica stops (SIGTERM) while the run waits on it.
        world.model.add_canned(Canned(status=None), Canned(status=None, delay=60))
        thread = await world.thread_of(await world.mention("anything in the log?"))
        await until(lambda: world.model.count >= 2)
        await world.supervisor.shutdown(hand_back=True)
        await world.settled()

        (status,) = [
            m for m in world.discord.bot_messages(thread) if m["content"].startswith("Working…")
        ]
        # SQLite: one replica, no other to go on with it (it said "another goes on with it").
        assert status["content"].endswith(
            "Paused: Kestrel is stopping; it goes on when Kestrel is started again."
        )
        assert "Waiting on people" not in status["content"]


@pytest.mark.skipif(not PG_DSN, reason="set KESTREL_TEST_POSTGRES_DSN")
async def test_a_run_handed_back_on_a_shared_store_says_another_replica_goes_on(
    tmp_path: Path,
) -> None:
    script = [
        {"text": "Reading the log.", "calls": [{"name": "read_log", "arguments": {}}]},
        {"text": "Nothing in the log."},
    ]
    schema = f"handed_{uuid.uuid4().hex[:12]}"
    try:
        async with discord_world(tmp_path, script, database=f"{PG_DSN}?schema={schema}") as world:
            world.model.add_canned(Canned(status=None), Canned(status=None, delay=60))
            thread = await world.thread_of(await world.mention("anything in the log?"))
            await until(lambda: world.model.count >= 2)
            await world.supervisor.shutdown(hand_back=True)
            await world.settled()
            said = "Paused: the replica running it is stopping; another replica goes on with it."

            def status() -> str:
                (shown,) = [
                    m["content"]
                    for m in world.discord.bot_messages(thread)
                    if m["content"].startswith("Working…")
                ]
                return str(shown)

            # PostgreSQL's writes take longer than settled() waits for: the status's edit.
            await until(lambda: status().endswith(said), timeout=10)
    finally:
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        finally:
            await conn.close()


async def test_a_run_whose_command_the_stop_killed_says_its_outcome_is_uncertain(
    tmp_path: Path,
) -> None:
    drain = {"name": "drain_node", "arguments": {"node": "node-3", "seconds": 30}}
    script = [{"text": "Draining.", "calls": [drain]}, {"text": "Drained."}]
    async with discord_world(tmp_path, script) as world:
        thread = await world.thread_of(await world.mention("drain node-3"))
        await until(lambda: "node-3" in world.executions)
        # The stop's grace runs out with the command under way: it is killed.
        await world.supervisor.shutdown(tool_grace=0.1, hand_back=True)
        await world.settled()

        (status,) = [
            m for m in world.discord.bot_messages(thread) if m["content"].startswith("Working…")
        ]
        # It said only "another goes on with it": nothing of the command cut halfway.
        assert status["content"].endswith(
            "Paused: Kestrel is stopping; it goes on when Kestrel is started again. The stop"
            " killed `drain_node` under way: whether it took effect is uncertain, and on-call"
            " will be asked to settle it."
        ), status["content"]


def told_alone(world: DiscordWorld, interaction: Mapping[str, Any]) -> list[str]:
    """Everything the clicker alone was told: the response, then each follow-up."""
    token = str(interaction["token"])
    told = []
    for call in world.discord.calls:
        if token not in call.path or call.method != "POST":
            continue
        body = call.json or {}
        told.append(str((body.get("data") or body).get("content") or ""))
    return [text for text in told if text]


async def test_arguments_a_card_cut_are_shown_whole_to_the_clicker(tmp_path: Path) -> None:
    service = "checkout" + "x" * 400  # longer than a card shows of one value
    script = restart_script()
    script[0]["calls"][0]["arguments"]["service"] = service
    async with discord_world(tmp_path, script) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        assert service not in json.dumps(card)

        click = await world.click(card, "arguments", user=APPROVER)
        await until(lambda: told_alone(world, click))
        assert service in "".join(told_alone(world, click))

        guest = await world.click(card, "arguments", user=APPROVER, guild="777")
        await until(lambda: told_alone(world, guest))
        assert told_alone(world, guest) == ["That request is not one of this thread's."]
        assert world.executions == []  # shown, nothing decided
        assert len(await world.chat.pending()) == 1


async def test_a_run_in_a_forum_post_is_decided_in_the_post_not_from_the_forum(
    tmp_path: Path,
) -> None:
    # A forum's posts are its threads: a run asked for in one lives there, its card and form
    # count from the post, and a click sent from the forum itself is from outside the thread.
    forum = "250"
    async with FakeDiscord() as fake:
        fake.channels[forum] = {**p.text_channel(forum, name="incidents"), "type": 15}
        fake.guilds[p.GUILD_ID]["channel_ids"].append(forum)
        post = fake.add_thread(forum, name="checkout is down", owner_id=REQUESTER)["id"]
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            await world.mention("checkout is failing", channel=post)
            card = await world.card("approve")
            assert card["channel_id"] == post
            outside = p.interaction_button(
                custom_id=button_id(card, "approve"), channel=forum, user_id=APPROVER, message=card
            )
            await world.discord.dispatch("INTERACTION_CREATE", outside)
            assert "in a thread of this channel" in await world.answered(outside)
            await world.fill_form(card, "deny", "peak hours", user=APPROVER, channel=post)
            await world.answer_posted(post, "denied")
            assert world.executions == []
