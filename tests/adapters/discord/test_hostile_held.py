"""A message held in the store and taken up again (by another replica, or after a rate limit):
its author is judged as they are now in the run's server, as a live message's author is."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path

import discord
import pytest

from bot.chat.inbound import Accepted, TryLater
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import Call, Reply
from tests.fakes.discord_world import REQUESTER, DiscordWorld, discord_world
from tests.fakes.slack_world import question_script, restart_script
from tests.fakes.waiting import until

ANSWERING_ROLE = p.ROLE_ID  # a role the server has
MEMBER_OF_ROLE = "1009"


async def _held_then_taken_up(world: DiscordWorld, post: Awaitable[object]) -> None:
    """Post while this replica stops (the message is held for another), then take it up as
    another replica would: the message is fetched again from Discord."""
    world.adapter.client.drain()
    await post
    await until(lambda: world.rt.store.take_work(world.rt.owner, retake_after=0))
    world.adapter.client.draining = False  # another replica, as far as the rest goes
    (held,) = await world.rt.store.take_work(world.rt.owner, retake_after=0)
    await world.chat.inbound.settle(Accepted(held.id, held.payload))


async def test_a_held_reply_counts_the_roles_its_author_has(tmp_path: Path) -> None:
    # Fetched again, a message carries its author as a user, without their roles: a member
    # of the answering role was told they may not answer.
    policy = {"answerers": [f"role:{ANSWERING_ROLE}"]}
    async with discord_world(tmp_path, question_script(), extra_policy=policy) as world:
        mention = await world.mention("drain a node")
        thread = await world.thread_of(mention)
        await world.card("answer")
        await world.settled()
        world.discord.members[(p.GUILD_ID, MEMBER_OF_ROLE)] = {"roles": [ANSWERING_ROLE]}
        reply = p.message_create(
            channel=thread,
            author_id=MEMBER_OF_ROLE,
            content="us-east",
            mentions=[],
            roles=[ANSWERING_ROLE],
        )
        await _held_then_taken_up(world, world.discord.dispatch("MESSAGE_CREATE", reply))
        assert await world.chat.pending() == []
        await world.answer_posted(thread, "us-east")


async def test_a_held_mention_whose_author_left_the_server_starts_nothing(
    tmp_path: Path,
) -> None:
    # Someone who left the server asks nothing of its runs any more (a mention read back after
    # a gap is not acted on then either); held, theirs started a run all the same.
    async with discord_world(tmp_path, restart_script()) as world:

        async def post_and_leave() -> None:
            await world.mention("checkout is failing", user=REQUESTER)
            del world.discord.members[(p.GUILD_ID, REQUESTER)]  # known once it posted

        await _held_then_taken_up(world, post_and_leave())
        await world.settled()
        assert await world.chat.recent(5) == []


async def test_a_held_mention_whose_author_discord_will_not_give_yet_waits(
    tmp_path: Path,
) -> None:
    # Under a long rate limit on the member lookup, the mention is neither dropped nor acted
    # on without its author's roles: it is left to be taken up again.
    async with discord_world(tmp_path, restart_script()) as world:
        world.adapter.client.drain()
        await world.mention("checkout is failing", user=REQUESTER)
        await until(lambda: world.rt.store.take_work(world.rt.owner, retake_after=0))
        world.adapter.client.draining = False
        members = rf"/guilds/{p.GUILD_ID}/members/{REQUESTER}"
        world.discord.fail("GET", members, retry_after=600, times=None)
        (held,) = await world.rt.store.take_work(world.rt.owner, retake_after=0)
        with pytest.raises(TryLater):
            await world.chat.inbound.settle(Accepted(held.id, held.payload))
        assert await world.chat.recent(5) == []
        world.discord.clear_faults()
        (again,) = await world.rt.store.take_work(world.rt.owner, retake_after=0)
        await world.chat.inbound.settle(Accepted(again.id, again.payload))
        await world.card("approve")


async def _dropped(call: Call) -> Reply:
    raise asyncio.CancelledError  # the connection closes with no answer


@pytest.mark.parametrize(
    ("lookup", "fault"),
    [
        ("channel", "503"),
        ("message", "503"),
        ("member", "503"),
        ("message", "dropped"),
    ],
)
async def test_a_held_mention_discord_does_not_answer_for_waits_to_be_taken_up_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, lookup: str, fault: str
) -> None:
    # Fetched again under a server error or a dropped connection (not a "not found", not a
    # rate limit), the mention was dropped, with a traceback: the run it asked for never ran.
    # (A 503: discord.py tries a 500 again itself, five times, before it gives up.)
    async with discord_world(tmp_path, restart_script()) as world:
        world.adapter.client.drain()
        mention = await world.mention("checkout is failing", user=REQUESTER)
        await until(lambda: world.rt.store.take_work(world.rt.owner, retake_after=0))
        world.adapter.client.draining = False
        path = {
            "channel": rf"/channels/{p.CHANNEL_ID}",
            "message": rf"/channels/{p.CHANNEL_ID}/messages/{mention['id']}",
            "member": rf"/guilds/{p.GUILD_ID}/members/{REQUESTER}",
        }[lookup]
        if fault == "dropped":
            world.discord.set_handler("GET", path, _dropped)
        else:
            world.discord.fail("GET", path, status=503)
        (held,) = await world.rt.store.take_work(world.rt.owner, retake_after=0)
        with pytest.raises(TryLater):
            await world.chat.inbound.settle(Accepted(held.id, held.payload))
        assert await world.chat.recent(5) == []
        assert "Traceback" not in caplog.text
        # Held still, and not taken again before its take is a lease old: it does not loop.
        assert await world.rt.store.take_work(world.rt.owner, retake_after=60) == []
        world.discord.set_handler("GET", path, None)
        (again,) = await world.rt.store.take_work(world.rt.owner, retake_after=0)
        await world.chat.inbound.settle(Accepted(again.id, again.payload))
        await world.card("approve")


async def test_a_held_mention_discord_refuses_to_give_again_is_dropped_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Refused (Kestrel lost access to the channel), asking again every lease would be refused
    # too: the mention is let go, said in one line rather than a traceback.
    async with discord_world(tmp_path, restart_script()) as world:
        world.adapter.client.drain()
        mention = await world.mention("checkout is failing", user=REQUESTER)
        await until(lambda: world.rt.store.take_work(world.rt.owner, retake_after=0))
        world.adapter.client.draining = False
        path = rf"/channels/{p.CHANNEL_ID}/messages/{mention['id']}"
        world.discord.fail("GET", path, status=403, code=50001, message="Missing Access")
        (held,) = await world.rt.store.take_work(world.rt.owner, retake_after=0)
        await world.chat.inbound.settle(Accepted(held.id, held.payload))
        assert await world.rt.store.take_work(world.rt.owner, retake_after=0) == []
        assert await world.chat.recent(5) == []
        assert "could not be fetched again" in caplog.text
        assert "Traceback" not in caplog.text


async def _thread_started_then_died(world: DiscordWorld) -> dict[str, object]:
    """A mention held, its thread started by a replica that died before it started the run."""
    world.adapter.client.drain()
    mention = await world.mention("checkout is failing", user=REQUESTER)
    await until(lambda: world.rt.store.take_work(world.rt.owner, retake_after=0))
    world.adapter.client.draining = False
    channel = await world.adapter.client.fetch_channel(int(p.CHANNEL_ID))
    assert isinstance(channel, discord.TextChannel)
    message = await channel.fetch_message(int(mention["id"]))
    await message.create_thread(name="checkout is failing")
    return mention


@pytest.mark.parametrize("fault", ["503", "dropped"])
async def test_a_held_mention_whose_thread_discord_does_not_show_yet_starts_no_second(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    # Taken up again, a mention whose thread a dead replica started looks that thread up.
    # Under a server error that was read as "no thread": a second one was asked for, Discord
    # refused it (a message has one thread), and the person was told threads cannot be
    # started here. Under a dropped connection, the mention was dropped with a traceback.
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await _thread_started_then_died(world)
        thread = rf"/channels/{mention['id']}"
        if fault == "dropped":
            world.discord.set_handler("GET", thread, _dropped)
        else:
            world.discord.fail("GET", thread, status=503)
        (held,) = await world.rt.store.take_work(world.rt.owner, retake_after=0)
        with pytest.raises(TryLater):
            await world.chat.inbound.settle(Accepted(held.id, held.payload))
        assert world.discord.bot_messages(p.CHANNEL_ID) == []
        assert "Traceback" not in caplog.text
        world.discord.set_handler("GET", thread, None)
        (again,) = await world.rt.store.take_work(world.rt.owner, retake_after=0)
        await world.chat.inbound.settle(Accepted(again.id, again.payload))
        await world.card("approve")
        await world.settled()
        starts = rf"/channels/{p.CHANNEL_ID}/messages/{mention['id']}/threads"
        assert len(world.discord.calls_to("POST", starts)) == 1  # the dead replica's
        assert world.discord.bot_messages(p.CHANNEL_ID) == []
        assert len(world.discord.bot_messages(str(mention["id"]))) == 1  # the one card


async def test_a_held_mention_whose_thread_discord_refuses_to_show_is_dropped_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Refused, the thread is there (else "not found"): a second would be refused too.
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await _thread_started_then_died(world)
        thread = rf"/channels/{mention['id']}"
        world.discord.fail("GET", thread, status=403, code=50001, message="Missing Access")
        (held,) = await world.rt.store.take_work(world.rt.owner, retake_after=0)
        await world.chat.inbound.settle(Accepted(held.id, held.payload))
        starts = rf"/channels/{p.CHANNEL_ID}/messages/{mention['id']}/threads"
        assert len(world.discord.calls_to("POST", starts)) == 1
        assert world.discord.bot_messages(p.CHANNEL_ID) == []
        assert "Missing Access: dropped" in caplog.text
        assert "Traceback" not in caplog.text
