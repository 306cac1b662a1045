"""Hostile delivery: deleted and archived messages, REST errors, the gateway dropping."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.discord.progress import DiscordProgress
from adapters.discord.target import DiscordTarget
from bot.chat.inbound import Accepted, TryLater
from bot.chat.threads import RunPlace
from bot.domain import RunStatus, Session
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.discord_world import APPROVER, ONCALL, REQUESTER, DiscordWorld, discord_world
from tests.fakes.slack_world import restart_script
from tests.fakes.waiting import until


def _cards(fake: FakeDiscord, thread: str) -> list[dict[str, Any]]:
    return [m for m in fake.bot_messages(thread) if "Approval" in json.dumps(m.get("embeds"))]


async def test_a_deleted_card_is_posted_again_when_it_changes(tmp_path: Path) -> None:
    # Someone deletes the card; the decision's edit gets 404 (10008 Unknown Message). The
    # outbox has MessageGone for this ("post it again"), but the transport never raises it:
    # the edit is retried with backoff forever and the thread never shows the decision.
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        card = await world.card("approve")
        await world.settled()
        shown = world.discord.message(thread, card["id"])
        assert shown is not None
        world.discord.messages[thread].remove(shown)
        click = await world.click(card, "approve", user=APPROVER)
        assert "Recorded" in await world.answered(click)
        await world.answer_posted(thread, "healthy again")
        for _ in range(3):
            await world.later(60)  # past each of the outbox's backoffs
        assert [c["embeds"][0]["fields"][-1]["name"] for c in _cards(world.discord, thread)] == [
            "Outcome"
        ], "the decided card never appears again"


async def test_a_card_edit_in_an_archived_thread_lands(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        fake.reject_archived_sends = True  # 50083 for posts (as for a thread not reopened)
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            mention = await world.mention("checkout is failing")
            thread = await world.thread_of(mention)
            card = await world.card("approve")
            await world.settled()
            fake.archive(thread)
            click = await world.click(card, "approve", user=APPROVER)
            assert "Recorded" in await world.answered(click)
            await world.answer_posted(thread, "healthy again")
            await world.settled()
            edited = fake.message(thread, card["id"])
            assert edited is not None and edited["components"] == []


async def test_a_card_edit_survives_a_500_and_a_429(tmp_path: Path) -> None:
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        card = await world.card("approve")
        await world.settled()
        path = rf"/channels/{thread}/messages/{card['id']}"
        fake.fail("PATCH", path, status=500, times=1)
        fake.fail("PATCH", path, status=429, retry_after=0.2, times=1)
        click = await world.click(card, "approve", user=APPROVER)
        await world.answer_posted(thread, "healthy again")
        await world.settled()
        for _ in range(3):
            edited = fake.message(thread, card["id"])
            if edited is not None and edited["components"] == []:
                break
            await world.later(60)  # past the backoff (or the 429's retry_after)
        assert edited is not None and edited["components"] == []
        assert "Recorded" in await world.answered(click)
        assert len(_cards(fake, thread)) == 1


async def test_the_gateway_dropping_mid_run_loses_nothing_and_reposts_nothing(
    tmp_path: Path,
) -> None:
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        card = await world.card("approve")
        await world.settled()
        posts = len(fake.calls_to("POST", rf"/channels/{thread}/messages"))
        await fake.reconnect_gateway()
        await fake.wait_for_gateway(connections=2)
        await fake.invalidate_session(resumable=False)
        await fake.wait_until(lambda: len(fake.identifies) >= 2, 10)
        await fake.wait_for_gateway(connections=3)
        await world.settled()
        assert len(fake.calls_to("POST", rf"/channels/{thread}/messages")) == posts
        click = await world.click(card, "approve", user=APPROVER)
        assert "Recorded" in await world.answered(click)
        await world.answer_posted(thread, "healthy again")
        assert world.executions == ["checkout"]


class _BrokenHttp:
    """REST whose connection breaks (not an HTTPException): a network blip."""

    def __init__(self) -> None:
        self.calls = 0

    async def request(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        raise aiohttp.ClientOSError(104, "Connection reset by peer")


async def test_typing_keeps_going_after_a_network_blip() -> None:
    http = _BrokenHttp()
    progress = DiscordProgress(http, deliveries=None, refresh_seconds=0.01)  # type: ignore[arg-type]
    session = Session(id="discord:100:5", platform="discord", channel="5", thread="5")
    progress.follow("run_1", RunPlace(session, DiscordTarget(guild="100", channel="5"), "1001"))
    task = asyncio.create_task(progress.keep_alive())
    await until(lambda: http.calls >= 3 or task.done(), timeout=10)
    alive = not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert alive, f"the typing loop died after {http.calls} failed call(s): {task!r}"


@pytest.mark.parametrize("global_", [False, True])
async def test_a_thread_rate_limited_for_minutes_holds_back_no_other_thread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, global_: bool
) -> None:
    # discord.py sleeps out a 429's retry_after inside the request: one thread limited for
    # ten minutes held the outbox's round, so every other thread's card waited ten minutes.
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        slow = "777000000000000001"  # the mention's id: the thread started from it
        fake.fail(
            "POST", rf"/channels/{slow}/messages", retry_after=600, times=None, global_=global_
        )
        await world.mention("checkout is failing", id=slow)
        await fake.wait_for(lambda c: c.path == f"/channels/{slow}/messages" and c.status == 429)
        other = await world.thread_of(await world.mention("checkout is failing"))
        card = await world.card("approve")
        assert str(card["channel_id"]) == other
        await world.settled()
        limited = fake.calls_to("POST", rf"/channels/{slow}/messages")
        assert len(limited) == 1  # asked once, then put off: not retried in a loop
        fake.clear_faults()
        await world.later(631)  # past the retry_after and its jitter: the card lands, once
        assert len(_cards(fake, slow)) == 1
        assert len(_cards(fake, other)) == 1
        assert "Traceback" not in caplog.text


async def test_messages_for_a_deleted_thread_are_given_up_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A thread deleted while its run waits is gone for good (10003 Unknown Channel): its
    # card's edit and its answer were retried hourly for ever, an error line each time.
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        thread = await world.thread_of(await world.mention("checkout is failing"))
        card = await world.card("approve")
        await world.settled()
        del fake.channels[thread]  # a moderator deletes the thread
        click = await world.click(card, "approve", user=APPROVER)
        assert "Recorded" in await world.answered(click)
        await until(lambda: world.executions == ["checkout"], timeout=10)
        await until(_ended(world), timeout=10)  # its answer is owed to the deleted thread
        await world.settled()
        tried = len(fake.calls_to("*", rf"/channels/{thread}/messages.*"))
        for _ in range(3):
            await world.later(3600)
        assert len(fake.calls_to("*", rf"/channels/{thread}/messages.*")) == tried
        given_up = [r for r in caplog.records if "given up" in r.getMessage()]
        assert any("discord:answer:" in r.getMessage() for r in given_up)
        assert any("discord:card:" in r.getMessage() for r in given_up)
        assert "Traceback" not in caplog.text


def _ended(world: DiscordWorld) -> Callable[[], Awaitable[bool]]:
    """A check that the world's one run has completed."""

    async def check() -> bool:
        (run,) = await world.rt.store.list_runs()
        return run.status is RunStatus.COMPLETED

    return check


async def test_a_mention_rate_limited_for_minutes_is_left_to_be_taken_up_again(
    tmp_path: Path,
) -> None:
    # The client raises on a 429 longer than it sleeps out (so that no other thread waits):
    # a held mention whose channel cannot be fetched then is not done with, unanswered, but
    # left in the store for a work taker to take up again once the limit has passed.
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        store, owner = world.rt.store, world.rt.owner
        message = "777000000000000009"
        delivery = {"what": "mention", "channel": p.CHANNEL_ID, "message": message}
        accepted = await world.chat.accept_delivery(f"discord:{message}", "discord", delivery)
        assert accepted is not None
        fake.fail("GET", rf"/channels/{p.CHANNEL_ID}", retry_after=600, times=None)

        with pytest.raises(TryLater, match="rate limited for 600s"):
            await world.chat.inbound.settle(accepted)

        (left,) = await store.take_work(owner, retake_after=0)
        assert left.id == accepted.work_id


async def test_a_reply_rate_limited_after_a_mention_acted_is_put_off_not_acted_again(
    tmp_path: Path,
) -> None:
    # "@kestrel cancel" cancels the run; the note saying so then meets a 429 of minutes. The
    # mention acted: taking it up again would cancel (or answer, or resume) a second time and
    # say something else. The note waits in the outbox instead, and the mention is done.
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        await world.card("approve")
        await world.settled()
        fake.fail("POST", rf"/channels/{thread}/messages", retry_after=600, times=None)
        cancel = await world.mention("cancel", user=ONCALL, channel=thread)
        await world.quiet(cancel)

        assert await world.rt.store.take_work(world.rt.owner, retake_after=0) == []
        fake.clear_faults()
        await world.later(631)  # past the retry_after and its jitter
        notes = [m for m in fake.bot_messages(thread) if m.get("content") == "cancelled"]
        assert len(notes) == 1, fake.bot_messages(thread)


def two_questions_script() -> list[Any]:
    """The model asks for a region, then for a node, then says what it heard."""

    def ask(question: str) -> list[dict[str, Any]]:
        return [{"name": "ask_human_input", "arguments": {"question": question}}]

    return [
        {"text": "First:", "calls": ask("Which region?")},
        {"one_of": [{"match": "(?P<region>.+)", "text": "Then:", "calls": ask("Which node?")}]},
        {"one_of": [{"match": "(?P<node>.+)", "text": "Draining {node}."}]},
    ]


@pytest.mark.parametrize("mentioned", [False, True], ids=["reply", "mention"])
async def test_a_reply_taken_up_late_answers_the_question_it_replied_to_or_none(
    tmp_path: Path, mentioned: bool
) -> None:
    # A stopping replica holds a reply to the first question (plain, or mentioning Kestrel)
    # for another replica's work taker. Before that takes it up, someone else answers that
    # question and the run asks the next one: the late reply must not answer a later question.
    async with discord_world(tmp_path, two_questions_script()) as world:
        mention = await world.mention("drain a node")
        thread = await world.thread_of(mention)
        await world.card("answer")
        await world.settled()
        world.adapter.client.drain()
        if mentioned:
            await world.mention("eu-west", user=ONCALL, channel=thread)
        else:
            await world.reply("eu-west", user=ONCALL, thread=thread)
        await until(lambda: world.rt.store.take_work(world.rt.owner, retake_after=0))
        world.adapter.client.draining = False  # another replica, as far as the rest goes
        await world.reply("us-east", user=REQUESTER, thread=thread)
        run_id = (await world.chat.recent(1))[0].id

        async def second_question() -> list[Any]:
            return [r for r in await world.chat.pending() if "node" in r.request.prompt]

        (node,) = await until(second_question)
        (held,) = await world.rt.store.take_work(world.rt.owner, retake_after=0)
        await world.chat.inbound.settle(Accepted(held.id, held.payload))

        assert [r.request.id for r in await world.chat.pending()] == [node.request.id]
        told = await world.discord.wait_for(
            lambda c: c.path == f"/channels/{thread}/messages" and "already" in json.dumps(c.json),
            timeout=10,
        )
        assert "answer by" in json.dumps(told[-1].json)
        await world.reply("node-3", user=REQUESTER, thread=thread)
        await world.answer_posted(thread, "Draining node-3")
        assert run_id == (await world.chat.recent(1))[0].id


def _refusing_embeds(fake: FakeDiscord) -> Any:
    """A handler that refuses any post carrying an embed with 50035 (Invalid Form Body), as
    Discord does a card over one of its limits, and takes one of content alone."""

    async def handler(call: Any) -> Any:
        if (call.json or {}).get("embeds"):
            errors = {"embeds": {"0": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH"}]}}}
            return 400, {"message": "Invalid Form Body", "code": 50035, "errors": errors}
        return await fake._r_create_message(call, call.path.split("/")[2])

    return handler


async def test_a_card_discord_refuses_is_shown_once_as_words_saying_how_to_decide_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A card Discord refuses as a body (50035) is refused the same way every time: it was
    # retried hourly for ever, and nothing in the thread said a request waited.
    async with FakeDiscord() as fake:
        fake.set_handler("POST", r"/channels/\d+/messages", _refusing_embeds(fake))
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            thread = await world.thread_of(await world.mention("checkout is failing"))
            shown = await world.answer_posted(thread, "buttons cannot be shown")
            await world.settled()
            [(request, _, _)] = await world.rt.store.list_requests()
            text = str((shown.json or {})["content"])
            assert f"request `{request.id}`" in text
            assert "`kestrel runs pending`" in text and "`/kestrel runs`" in text
            assert "restart_service" in text  # what it asks, in words
            assert (shown.json or {}).get("allowed_mentions", {}).get("users") == [APPROVER]

            def cards() -> list[Any]:
                posts = fake.calls_to("POST", rf"/channels/{thread}/messages")
                return [c for c in posts if request.id in json.dumps(c.json)]

            tried = len(cards())
            for _ in range(3):
                await world.later(3600)
            assert len(cards()) == tried == 2  # refused once, then its words alone
            refusals = [r for r in caplog.records if "refused" in r.getMessage()]
            assert len(refusals) == 1, [r.getMessage() for r in refusals]


async def test_cards_rate_limited_together_are_retried_spread_never_sooner(tmp_path: Path) -> None:
    # Several cards (of this replica, or of several) put off by one Retry-After were all due
    # at the same instant, and met the limit again together.
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        fake.fail("POST", r"/channels/\d+/messages", retry_after=600, times=None)
        for _ in range(3):
            await world.mention("checkout is failing")
        store = world.rt.store

        async def put_off() -> list[Any]:
            requests = await store.list_requests()
            rows = [await store.get_message(f"discord:card:{r.id}") for r, _, _ in requests]
            limited = [m for m in rows if m is not None and "rate limited" in m.error]
            return limited if len(limited) == 3 else []

        rows = await until(put_off, timeout=20)
        waits = [(m.next_attempt_at - m.updated_at).total_seconds() for m in rows]
        assert min(waits) >= 599.9, waits  # never sooner than Discord said
        assert max(waits) <= 600 + 30, waits  # a small, bounded spread
        assert max(waits) - min(waits) > 0.01, waits


async def test_a_card_that_never_reaches_its_thread_is_said_once_where_on_call_looks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Kestrel lost access to the thread before its card was shown: the card was retried hourly
    # for ever, and nothing told anyone which request waited, or how to decide it.
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        fake.fail("POST", r"/channels/\d+/messages", status=403, code=50001, times=None)
        await world.mention("checkout is failing")

        async def refused() -> list[Any]:
            requests = await world.rt.store.list_requests()
            rows = [
                await world.rt.store.get_message(f"discord:card:{r.id}") for r, _, _ in requests
            ]
            return [r for r, _, _ in requests if rows and rows[0] and rows[0].error]

        [request] = await until(refused, timeout=20)
        for _ in range(4):
            await world.later(3600)
        said = [r for r in caplog.records if "has not reached its thread" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]
        assert said[0].levelname == "ERROR"
        line = said[0].getMessage()
        assert f"request {request.id}" in line and "50001" in line
        assert "`kestrel runs pending`" in line and "`kestrel runs approve`" in line

        # Whoever lists what waits learns its card is not in the thread, and why.
        data = p.interaction_command(
            options=[{"name": "runs", "type": 1, "options": []}], user_id=ONCALL
        )
        await world.discord.dispatch("INTERACTION_CREATE", data)
        listed = await world.answered(data)
        assert "restart_service" in listed and "card not shown" in listed, listed
        assert "50001" in listed, listed


async def test_a_mention_deleted_before_it_was_taken_up_again_is_let_go_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The replica that held a mention died before handling it, and its author deleted it: the
    # replica that took it up logged a traceback ("handling inbound delivery failed") for a
    # message that asks nothing any more.
    caplog.set_level(logging.INFO, logger="kestrel.discord")
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        message = "777000000000000010"  # never in the channel, as after a delete
        delivery = {"what": "mention", "channel": p.CHANNEL_ID, "message": message}
        accepted = await world.chat.accept_delivery(f"discord:{message}", "discord", delivery)
        assert accepted is not None
        await world.chat.inbound.settle(accepted)
        assert await world.rt.store.take_work(world.rt.owner, retake_after=0) == []
        assert await world.chat.recent(10) == []
        ours = [r for r in caplog.records if r.name.startswith("kestrel")]
        loud = [r for r in ours if r.levelno >= logging.WARNING]
        assert not loud, [r.getMessage() for r in loud]
        assert any(f"message {message} was deleted" in r.getMessage() for r in ours)


def _answer(restarted: str) -> dict[str, Any]:
    """An answer as the renderer shows it: its words, and the run's payload as fields."""
    fields = [{"name": "restarted", "value": restarted, "inline": True}]
    return {
        "content": "Done.",
        "embeds": [{"title": "Result", "color": 0x2ECC71, "fields": fields}],
        "allowed_mentions": {"parse": []},
    }


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "refused"])
async def test_a_post_of_unknown_outcome_never_takes_another_message_for_its_own(
    tmp_path: Path, landed: bool
) -> None:
    # Two answers in one thread that say the same words, with other fields. The first one's
    # post failed (after Discord made it, or before), the second was posted: the first one's
    # lookup took the second for it and edited it into the first, and the second answer was
    # lost from the thread.
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        thread = await world.thread_of(await world.mention("checkout is failing"))
        await world.card("approve")
        await world.settled()
        deliveries = world.adapter.client.deliveries
        where = DiscordTarget(p.GUILD_ID, thread)
        posts = rf"/channels/{thread}/messages"
        failed: list[Any] = []

        async def fails(call: Any) -> tuple[int, Any]:
            if landed and not failed:
                await fake._r_create_message(call, thread)
            failed.append(call)
            return 503, {"message": "upstream unavailable", "code": 0}

        fake.set_handler("POST", posts, fails)
        await deliveries.put("test:first", where, _answer("ledger-7"))
        await until(lambda: failed, timeout=10)
        await world.settled()
        fake.set_handler("POST", posts, None)
        await deliveries.put("test:second", where, _answer("ledger-8"))
        await world.settled()

        def showing(what: str) -> list[dict[str, Any]]:
            return [m for m in fake.bot_messages(thread) if what in json.dumps(m["embeds"])]

        [second] = showing("ledger-8")
        await world.later(60)  # past the backoff: the first is looked up, then posted
        assert [m["id"] for m in showing("ledger-8")] == [second["id"]]
        [first] = showing("ledger-7")
        stored = await world.rt.store.get_message("discord:test:first")
        assert stored is not None and stored.ref == first["id"] and not stored.due


async def test_a_card_of_unknown_outcome_decided_before_its_retry_is_edited_not_posted_again(
    tmp_path: Path,
) -> None:
    # The open card reached Discord, but its answer was lost; the request was decided before
    # the retry, which sent the closed card: nothing in the thread showed it, so it was posted
    # beside the open one, whose buttons still asked for a decision made already.
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        posts = r"/channels/\d+/messages"
        created: list[dict[str, Any]] = []
        down = [True]  # Discord answers nothing in threads until the decision is made

        async def post(call: Any) -> Any:
            channel = call.path.split("/")[2]
            if not created and '"kestrel:approve:' in json.dumps(call.json or {}):
                created.append((await fake._r_create_message(call, channel))[1])
            if created and down[0]:
                return 503, {"message": "upstream unavailable", "code": 0}
            return await fake._r_create_message(call, channel)

        async def listing(call: Any) -> Any:
            if created and down[0]:
                return 503, {"message": "upstream unavailable", "code": 0}
            return await fake._r_list_messages(call, call.path.split("/")[2])

        fake.set_handler("POST", posts, post)
        fake.set_handler("GET", posts, listing)
        thread = await world.thread_of(await world.mention("checkout is failing"))
        await until(lambda: created, timeout=10)
        [opened] = created
        [(request, _, _)] = await world.rt.store.list_requests()
        click = await world.click(opened, "approve", user=APPROVER)
        assert "Recorded" in await world.answered(click)

        async def closed() -> bool:
            stored = await world.rt.store.get_message(f"discord:card:{request.id}")
            return stored is not None and not stored.body.get("components")

        await until(closed, timeout=10)
        down[0] = False
        for _ in range(3):
            await world.later(60)  # past each of the outbox's backoffs
        cards = _cards(fake, thread)
        assert [c["id"] for c in cards] == [opened["id"]], "the closed card was posted again"
        [card] = cards
        assert card["components"] == [] and "requested" in card["embeds"][0]["title"]
        stored = await world.rt.store.get_message(f"discord:card:{request.id}")
        assert stored is not None and stored.ref == opened["id"] and not stored.due
