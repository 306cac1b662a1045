"""Mentions, and replies to an open question, said while no replica was connected: Discord
sends a fresh session nothing of them, so Kestrel reads them back from history after an
IDENTIFY (never after a RESUME)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from bot.domain import RequestStatus
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import Call, FakeDiscord
from tests.fakes.discord_world import APPROVER, REQUESTER, SRE_ROLE, DiscordWorld, discord_world
from tests.fakes.slack_world import question_script, restart_script
from tests.fakes.waiting import until

HISTORY = r"/channels/\d+/messages"


def missed(
    text: str,
    *,
    author: str = REQUESTER,
    minutes_ago: float = 0.0,
    roles: tuple[str, ...] = (),
    channel: str = p.CHANNEL_ID,
) -> dict[str, Any]:
    """``@kestrel text`` from ``author`` (a member with ``roles``) in ``channel``, sent
    ``minutes_ago`` (its id says when)."""
    content = f"<@{p.BOT_ID}> {text}"
    data = p.message_create(channel=channel, author_id=author, content=content, roles=roles)
    return said_ago(data, minutes_ago)


def missed_reply(
    text: str, *, thread: str, author: str = REQUESTER, minutes_ago: float = 0.0
) -> dict[str, Any]:
    """A plain ``text`` in ``thread`` from ``author`` (no mention), sent ``minutes_ago``."""
    data = p.message_create(channel=thread, author_id=author, content=text, mentions=[])
    return said_ago(data, minutes_ago)


def said_ago(data: dict[str, Any], minutes_ago: float) -> dict[str, Any]:
    """``data`` as sent ``minutes_ago`` (its id says when)."""
    if minutes_ago:
        ms = int((time.time() - minutes_ago * 60) * 1000)
        data["id"] = str(((ms - p.DISCORD_EPOCH_MS) << 22) | 1)
        data["timestamp"] = p.timestamp_of(data["id"])
    return data


def two_questions_script() -> list[Any]:
    """The model: asks for a region, then for a service, then echoes the last answer."""
    return [
        {
            "text": "I need one detail.",
            "calls": [{"name": "ask_human_input", "arguments": {"question": "Which region?"}}],
        },
        {
            "text": "And one more.",
            "calls": [{"name": "ask_human_input", "arguments": {"question": "Which service?"}}],
        },
        {"one_of": [{"match": "(?P<answer>.+)", "text": "Thanks, looking at {answer}."}]},
    ]


async def statuses(world: DiscordWorld) -> list[RequestStatus]:
    """The statuses of the newest run's requests, oldest first."""
    run = (await world.chat.recent(1))[0]
    return [view.status for view in await world.chat.requests_of(run.id)]


async def statuses_are(world: DiscordWorld, expected: list[RequestStatus]) -> bool:
    """Whether the newest run's requests are ``expected`` (a condition for ``until``)."""
    return await statuses(world) == expected


def posts_with(fake: FakeDiscord, thread: str, text: str) -> list[Call]:
    """Kestrel's posts in ``thread`` that say ``text``."""
    calls = fake.calls_to("POST", rf"/channels/{thread}/messages")
    return [c for c in calls if text in str((c.json or {}).get("content", ""))]


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


async def test_a_reply_made_while_down_answers_the_open_question_once(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, question_script(), fake=fake) as first:
            thread = await first.thread_of(await first.mention("look at the latency"))
            await first.card("answer")
            await first.settled()
        said = fake.post(missed_reply("eu-west", thread=thread))
        async with discord_world(tmp_path, question_script(), fake=fake) as second:
            await second.answer_posted(thread, "looking at eu-west")
            await second.quiet(said)
            assert await statuses(second) == [RequestStatus.ANSWERED]
        async with discord_world(tmp_path, question_script(), fake=fake) as third:
            await fake.wait_for(f"GET /channels/{thread}/messages", count=2)
            await third.settled()
        assert len(posts_with(fake, thread, "looking at eu-west")) == 1


async def test_a_reply_handled_live_is_not_handled_again_after_a_restart(
    tmp_path: Path,
) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, question_script(), fake=fake) as first:
            thread = await first.thread_of(await first.mention("look at the latency"))
            await first.card("answer")
            said = await first.reply("us-east", user="1999", thread=thread)
            await first.answer_posted(thread, "1999 may not answer this question")
            await first.settled()
        async with discord_world(tmp_path, question_script(), fake=fake) as second:
            await second.quiet(said)

            # The mention that started the run is read back too: both are dropped.
            assert second.chat.duplicates_dropped == 2
            assert len(posts_with(fake, thread, "1999 may not answer this question")) == 1
            assert await statuses(second) == [RequestStatus.OPEN]


async def test_a_reply_said_before_a_newer_question_does_not_answer_it(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, two_questions_script(), fake=fake) as first:
            thread = await first.thread_of(await first.mention("look at the latency"))
            await first.card("answer")
            await first.reply("eu-west", user=REQUESTER, thread=thread)
            asked = [RequestStatus.ANSWERED, RequestStatus.OPEN]
            await until(lambda: statuses_are(first, asked), timeout=10)
            await first.settled()
        # Said a minute ago: before the question the run waits on now was asked.
        said = fake.post(missed_reply("checkout", thread=thread, minutes_ago=1))
        mention = fake.post(missed("billing", channel=thread, minutes_ago=1))
        async with discord_world(tmp_path, two_questions_script(), fake=fake) as second:
            await second.quiet(said)
            await second.answer_posted(thread, "A run is still going in this thread")
            await second.quiet(mention)
            assert await statuses(second) == asked
            assert posts_with(fake, thread, "looking at checkout") == []
            assert posts_with(fake, thread, "looking at billing") == []
            await second.reply("payments", user=REQUESTER, thread=thread)
            await second.answer_posted(thread, "looking at payments")


async def test_chatter_in_a_thread_with_no_open_question_is_not_read_back(
    tmp_path: Path,
) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake) as first:
            thread = await first.thread_of(await first.mention("checkout is failing"))
            card = await first.card("approve")
            await first.click(card, "approve", user=APPROVER)
            await first.answer_posted(thread, "healthy again")
            await first.settled()
        chatter = fake.post(missed_reply("thanks, that fixed it", thread=thread))
        # Said after the chatter in the same thread: handled after it, were it read back.
        status = fake.post(missed("status", channel=thread))
        async with discord_world(tmp_path, restart_script(), fake=fake) as second:
            await second.quiet(status)

            assert second.handled[int(chatter["id"])] == 0


async def test_a_mention_edited_into_a_message_live_is_not_read_back(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake) as first:
            await first.mention("checkout is failing")
            await first.card("approve")
            await first.settled()
            # Said without a mention while connected (ignored), then edited to mention Kestrel:
            # live, an edit acts on nothing.
            recent = p.message_create(content="payments is failing", mentions=[])
            old = said_ago(p.message_create(content="billing is failing", mentions=[]), 20)
            for plain in (old, recent):
                await fake.dispatch("MESSAGE_CREATE", plain)
                await first.quiet(plain)
                edited = {**missed(plain["content"]), "id": plain["id"]}
                edited |= {"timestamp": plain["timestamp"], "edited_timestamp": p.iso()}
                await fake.dispatch("MESSAGE_UPDATE", edited)
            await first.settled()
        said = fake.post(missed("search is failing"))
        async with discord_world(tmp_path, restart_script(), fake=fake) as second:
            await until(lambda: cards_in(fake, said["id"]), timeout=10)
            await second.settled()

            assert second.handled[int(recent["id"])] == 0
            assert thread_starts(fake, recent) == []
            told = fake.calls_to("POST", rf"/channels/{p.CHANNEL_ID}/messages")
            assert not [c for c in told if "not connected" in str((c.json or {}).get("content"))]
            assert [r.prompt for r in await second.chat.recent(5)] == [
                "search is failing",
                "checkout is failing",
            ]


async def test_a_replica_that_begins_to_stop_reads_no_more_places_back(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake) as first:
            # Said over a day ago: nothing in the channel to read back.
            mention = missed("checkout is failing", minutes_ago=25 * 60)
            await fake.dispatch("MESSAGE_CREATE", mention)
            await first.thread_of(mention)
            await first.card("approve")
            await first.settled()
        # Two places to read back: the channel and the run's thread.
        fake.delay("GET", HISTORY, 0.5)
        async with discord_world(tmp_path, restart_script(), fake=fake) as second:
            await fake.wait_for(f"GET {HISTORY}")
            client = second.adapter.client
            client.drain()
            await client.handled(10)

            # The live replicas read back too: the rest is theirs.
            assert len(fake.calls_to("GET", HISTORY)) == 1


async def test_a_read_back_mention_whose_author_cannot_be_looked_up_is_told_not_refused(
    tmp_path: Path,
) -> None:
    sre = {"requesters": [f"group:{SRE_ROLE}"]}
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake, extra_policy=sre) as first:
            await first.mention("checkout is failing", roles=[SRE_ROLE])
            await first.card("approve")
            await first.settled()
        member = fake.post(
            missed("payments is failing", author="1500", roles=(SRE_ROLE,), minutes_ago=3)
        )
        # Discord will not say who the author is now (their roles): a long rate limit.
        fake.fail("GET", r"/guilds/\d+/members/\d+", retry_after=120, times=None)
        async with discord_world(tmp_path, restart_script(), fake=fake, extra_policy=sre) as second:
            replies = await fake.wait_for(
                lambda c: (
                    c.method == "POST"
                    and c.path == f"/channels/{p.CHANNEL_ID}/messages"
                    and "not connected" in str((c.json or {}).get("content"))
                ),
                timeout=10,
            )
            await second.settled()

            assert (replies[0].json or {})["content"] == (
                "I was not connected when you mentioned me here (3 minutes ago), so I did not"
                " act on it. Mention me again if it still stands."
            )
            assert str((replies[0].json or {})["message_reference"]["message_id"]) == member["id"]
            assert thread_starts(fake, member) == []
            assert len(await second.chat.recent(5)) == 1


async def test_a_channel_kestrel_may_not_view_is_not_read_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake) as first:
            thread = await first.thread_of(await first.mention("checkout is failing"))
            await first.card("approve")
            await first.settled()
        # Kestrel's member is denied View Channel there since (so its threads too): Discord
        # would answer each read of their history 403.
        view_channel = 1 << 10
        denied = {"id": p.BOT_ID, "type": 1, "allow": "0", "deny": str(view_channel)}
        fake.channels[p.CHANNEL_ID]["permission_overwrites"] = [denied]
        caplog.set_level("INFO", logger="kestrel.discord")
        async with discord_world(tmp_path, restart_script(), fake=fake) as second:
            await until(lambda: "read back after connecting" in caplog.text, timeout=10)
            await second.settled()

            assert fake.calls_to("GET", rf"/channels/({p.CHANNEL_ID}|{thread})/messages") == []
            assert "cannot read back" not in caplog.text


async def test_an_author_of_several_missed_mentions_is_told_once(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake) as first:
            await first.mention("checkout is failing")
            await first.card("approve")
            await first.settled()
        # Down for an hour: one person asks three times, another once, a third twice (the
        # last time within the window: acted on; the first told it was missed).
        asked = [fake.post(missed(f"status {n}", minutes_ago=n)) for n in (50, 40, 30)]
        other = fake.post(missed("payments?", author="1500", minutes_ago=35))
        first_ask = fake.post(missed("search is failing", author="1600", minutes_ago=45))
        again = fake.post(missed("search is failing", author="1600", minutes_ago=2))

        def notes() -> list[Call]:
            calls = fake.calls_to("POST", rf"/channels/{p.CHANNEL_ID}/messages")
            return [c for c in calls if "not connected" in str((c.json or {}).get("content"))]

        def to(call: Call) -> str:
            return str(((call.json or {}).get("message_reference") or {}).get("message_id"))

        async with discord_world(tmp_path, restart_script(), fake=fake) as second:
            await until(lambda: cards_in(fake, again["id"]), timeout=10)
            await second.quiet(again)

            expected = [asked[-1]["id"], other["id"], first_ask["id"]]
            assert sorted(to(c) for c in notes()) == sorted(expected)
            newest = next(c for c in notes() if to(c) == asked[-1]["id"])
            assert "(30 minutes ago)" in str((newest.json or {})["content"])
        async with discord_world(tmp_path, restart_script(), fake=fake) as third:
            await third.quiet(again)
        assert len(notes()) == 3


async def test_each_author_is_looked_up_once_a_read_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """History gives authors without their roles, so a read back asks Discord for each
    author's member: once per author, however many of their messages it finds (one taken
    before the restart among them), not once per message at every restart."""
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake) as first:
            await first.mention("checkout is failing")
            await first.card("approve")
            await first.settled()
        asked = [fake.post(missed("status", minutes_ago=n)) for n in (3, 2, 1)]
        other = fake.post(missed("status", author="1500", minutes_ago=2))
        caplog.set_level("INFO", logger="kestrel.discord")
        async with discord_world(tmp_path, restart_script(), fake=fake) as second:
            await until(lambda: "read back after connecting" in caplog.text, timeout=10)
            await second.settled()

            lookups = fake.calls_to("GET", r"/guilds/\d+/members/\d+")
            looked_up = sorted(call.path.rsplit("/", 1)[-1] for call in lookups)
            assert looked_up == sorted([REQUESTER, "1500"])
            # Each was still handled as a live one: told there is no run outside a thread.
            for message in [*asked, other]:
                replies = fake.calls_to("POST", rf"/channels/{p.CHANNEL_ID}/messages")
                to = [c for c in replies if _replies_to(c, message)]
                assert len(to) == 1, message["id"]


@pytest.mark.parametrize(
    "made",
    [
        pytest.param({"webhook_id": "1700"}, id="a webhook's"),
        pytest.param({"type": 6}, id="Discord's own (a pin)"),
    ],
)
async def test_a_message_of_no_person_is_not_read_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, made: dict[str, Any]
) -> None:
    """A webhook's message (anyone holding its URL picks the name it shows) and Discord's own
    messages mention Kestrel on behalf of nobody: read back, they start no run and get no
    reply, and their "author" is not looked up."""
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake) as first:
            await first.mention("checkout is failing")
            await first.card("approve")
            await first.settled()
        data = p.message_create(author_id="1700", content=f"<@{p.BOT_ID}> restart payments", **made)
        posted = fake.post(said_ago(data, 1))
        caplog.set_level("INFO", logger="kestrel.discord")
        async with discord_world(tmp_path, restart_script(), fake=fake) as second:
            await until(lambda: "read back after connecting" in caplog.text, timeout=10)
            await second.settled()

            assert thread_starts(fake, posted) == []
            replies = fake.calls_to("POST", rf"/channels/{p.CHANNEL_ID}/messages")
            assert [c for c in replies if _replies_to(c, posted)] == []
            assert fake.calls_to("GET", r"/guilds/\d+/members/1700") == []
            assert len(await second.chat.recent(5)) == 1


def _replies_to(call: Call, message: dict[str, Any]) -> bool:
    """Whether ``call`` posted a reply to ``message``."""
    reference = (call.json or {}).get("message_reference") or {}
    return str(reference.get("message_id")) == str(message["id"])
