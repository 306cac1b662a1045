"""Mentions said while no replica was connected: Discord sends a fresh session nothing of
them, so Kestrel reads them back from history after an IDENTIFY (never after a RESUME)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import Call, FakeDiscord
from tests.fakes.discord_world import REQUESTER, SRE_ROLE, discord_world
from tests.fakes.slack_world import restart_script
from tests.fakes.waiting import until

HISTORY = r"/channels/\d+/messages"


def missed(
    text: str, *, author: str = REQUESTER, minutes_ago: float = 0.0, roles: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``@kestrel text`` from ``author`` (a member with ``roles``), sent ``minutes_ago`` (its
    id says when)."""
    content = f"<@{p.BOT_ID}> {text}"
    data = p.message_create(author_id=author, content=content, roles=roles)
    if minutes_ago:
        ms = int((time.time() - minutes_ago * 60) * 1000)
        data["id"] = str(((ms - p.DISCORD_EPOCH_MS) << 22) | 1)
        data["timestamp"] = p.timestamp_of(data["id"])
    return data


def thread_starts(fake: FakeDiscord, message: dict[str, Any]) -> list[Call]:
    """Every thread Kestrel started (or tried to) from ``message``."""
    return fake.calls_to(
        "POST", rf"/channels/{message['channel_id']}/messages/{message['id']}/threads"
    )


def cards_in(fake: FakeDiscord, thread: str) -> list[dict[str, Any]]:
    """The approval cards Kestrel posted in ``thread``."""
    return [m for m in fake.bot_messages(thread) if "kestrel:approve:" in str(m)]


async def test_a_mention_made_while_down_is_answered_once_after_connecting(
    tmp_path: Path,
) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake) as first:
            before = await first.mention("checkout is failing")
            await first.card("approve")
            await first.settled()
        said = fake.post(missed("payments is failing"))
        async with discord_world(tmp_path, restart_script(), fake=fake) as second:
            await second.thread_of(said)
            await until(lambda: cards_in(fake, said["id"]), timeout=10)
            await second.quiet(before)
            await second.settled()

            assert len(thread_starts(fake, said)) == 1
            assert len(cards_in(fake, said["id"])) == 1
            # The mention answered before the restart is read back too, and dropped.
            assert len(thread_starts(fake, before)) == 1
            assert len(cards_in(fake, before["id"])) == 1
            assert second.chat.duplicates_dropped == 1
            assert [r.prompt for r in await second.chat.recent(5)] == [
                "payments is failing",
                "checkout is failing",
            ]


async def test_two_replicas_reading_back_at_once_start_one_run(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake) as first:
            await first.mention("checkout is failing")
            await first.card("approve")
            await first.settled()
        said = fake.post(missed("payments is failing"))
        # Both replicas' reads of history are answered together, after both connected.
        fake.delay("GET", HISTORY, 0.5)
        worlds = [discord_world(tmp_path, restart_script(), fake=fake) for _ in range(2)]
        async with contextlib.AsyncExitStack() as stack:
            both = await asyncio.gather(*(stack.enter_async_context(w) for w in worlds))
            await until(lambda: cards_in(fake, said["id"]), timeout=10)
            await until(lambda: sum(w.chat.duplicates_dropped for w in both) == 3, timeout=10)
            for world in both:
                await world.settled()

            assert len(thread_starts(fake, said)) == 1
            assert len(cards_in(fake, said["id"])) == 1
            runs = await both[0].chat.recent(5)
            assert [r.prompt for r in runs].count("payments is failing") == 1


async def test_a_mention_older_than_the_window_is_not_run_but_told_once(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake) as first:
            await first.mention("checkout is failing")
            await first.card("approve")
            await first.settled()
        said = fake.post(missed("payments is failing", minutes_ago=20))
        reply = rf"/channels/{p.CHANNEL_ID}/messages"

        def told(call: Call) -> bool:
            if call.method != "POST" or call.path != reply:
                return False
            reference = (call.json or {}).get("message_reference") or {}
            return str(reference.get("message_id")) == str(said["id"])

        async with discord_world(tmp_path, restart_script(), fake=fake) as second:
            calls = await fake.wait_for(told, timeout=10)
            await second.settled()
            assert (calls[0].json or {})["content"] == (
                "I was not connected when you mentioned me here (20 minutes ago), so I did not"
                " act on it. Mention me again if it still stands."
            )
            assert thread_starts(fake, said) == []
            assert len(await second.chat.recent(5)) == 1
        async with discord_world(tmp_path, restart_script(), fake=fake) as third:
            await fake.wait_for(f"GET {HISTORY}", count=3)
            await third.settled()
        assert len([c for c in fake.calls if told(c)]) == 1


async def test_a_resumed_session_reads_nothing_back_and_a_new_one_does(tmp_path: Path) -> None:
    async with (
        FakeDiscord() as fake,
        discord_world(tmp_path, restart_script(), fake=fake) as world,
    ):
        await world.mention("checkout is failing")
        await world.card("approve")
        await world.settled()
        reads = len(fake.calls_to("GET", HISTORY))
        await fake.reconnect_gateway()
        await fake.wait_for_gateway(connections=2)
        assert len(fake.resumes) == 1
        said = fake.post(missed("payments is failing"))
        await fake.invalidate_session(resumable=False)
        # discord.py waits 5 s before it IDENTIFYs again.
        await fake.wait_until(lambda: len(fake.identifies) == 2, 15)
        await fake.wait_for_gateway(connections=3)
        await world.thread_of(said)
        await until(lambda: cards_in(fake, said["id"]), timeout=10)

        # One read after the new IDENTIFY (of the channel and the first run's thread);
        # none after the RESUME.
        assert len(fake.calls_to("GET", HISTORY)) == reads + 2


async def test_a_read_back_mention_is_checked_as_a_live_one_roles_included(
    tmp_path: Path,
) -> None:
    sre = {"requesters": [f"group:{SRE_ROLE}"]}
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake, extra_policy=sre) as first:
            await first.mention("checkout is failing", roles=[SRE_ROLE])
            await first.card("approve")
            await first.settled()
        member = fake.post(missed("payments is failing", author="1500", roles=(SRE_ROLE,)))
        stranger = fake.post(missed("drop the database", author="1600"))
        async with discord_world(tmp_path, restart_script(), fake=fake, extra_policy=sre) as second:
            await until(lambda: cards_in(fake, member["id"]), timeout=10)
            await second.quiet(stranger)

            assert [r.prompt for r in await second.chat.recent(5)] == [
                "payments is failing",
                "checkout is failing",
            ]
            assert not cards_in(fake, stranger["id"])
