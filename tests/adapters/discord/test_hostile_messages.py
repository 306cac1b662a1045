"""Hostile messages: bots, webhooks, @everyone, replays, DMs, odd channels and threads."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.chat.inbound import Accepted
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import Call, FakeDiscord, Reply
from tests.fakes.discord_world import ONCALL, REQUESTER, discord_world
from tests.fakes.openai_server import Canned, chat_completion
from tests.fakes.slack_world import question_script, restart_script

VOICE = "250"


def _threads(fake: FakeDiscord) -> list[str]:
    return [c.path for c in fake.calls_to("POST", r"/channels/\d+/messages/\d+/threads")]


async def test_bots_and_webhooks_do_not_start_runs(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        bot = await world.mention("restart checkout", user="4242", author_bot=True)
        hook = await world.mention(
            "restart checkout", user="4343", author_bot=True, webhook_id="4343"
        )
        await world.quiet(bot)
        await world.quiet(hook)
        assert _threads(world.discord) == [] and await world.chat.recent(5) == []


async def test_a_webhook_without_the_bot_flag_and_discords_own_messages_start_no_run(
    tmp_path: Path,
) -> None:
    """A webhook's message is nobody's (whoever holds its URL picks the name and the words),
    whether or not Discord flags its author a bot; a message of Discord's own (a pin) is
    nobody's request either."""
    async with discord_world(tmp_path, restart_script()) as world:
        hook = await world.mention("restart checkout", user="4343", webhook_id="4343")
        pin = await world.mention("restart checkout", user="4444", type=6)
        await world.quiet(hook)
        await world.quiet(pin)
        assert _threads(world.discord) == [] and await world.chat.recent(5) == []


async def test_everyone_alone_does_not_start_a_run(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        data = p.message_create(content="@everyone deploy at 5", mentions=[])
        data["mention_everyone"] = True
        await world.discord.dispatch("MESSAGE_CREATE", data)
        await world.quiet(data)
        assert _threads(world.discord) == []


async def test_an_explicit_mention_next_to_everyone_is_not_ignored(tmp_path: Path) -> None:
    # "@everyone @kestrel checkout is failing" names the bot; it is dropped without a word.
    async with discord_world(tmp_path, restart_script()) as world:
        data = p.message_create(content=f"@everyone <@{p.BOT_ID}> checkout is failing")
        data["mention_everyone"] = True
        await world.discord.dispatch("MESSAGE_CREATE", data)
        await world.quiet(data)
        assert _threads(world.discord), "an explicit mention was ignored (no thread, no reply)"


async def test_a_replayed_mention_starts_one_run(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        await world.discord.dispatch("MESSAGE_CREATE", mention)
        await world.thread_of(mention)
        await world.card("approve")
        await world.discord.dispatch("MESSAGE_CREATE", mention)
        await world.quiet(mention, times=3)
        assert len(_threads(world.discord)) == 1 and len(await world.chat.recent(5)) == 1


async def test_a_dm_is_ignored_quietly(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        data = p.message_create(guild=None, channel="777", content=f"<@{p.BOT_ID}> hi")
        await world.discord.dispatch("MESSAGE_CREATE", data)
        await world.quiet(data)
        assert await world.chat.recent(5) == []


async def test_a_mention_in_a_busy_thread_says_so(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        await world.card("approve")
        await world.mention("also restart payments", user=ONCALL, channel=thread)
        await world.answer_posted(thread, "still going")
        assert len(await world.chat.recent(5)) == 1


async def test_a_mention_in_a_channel_without_threads_names_the_cause(tmp_path: Path) -> None:
    # A voice channel's text chat (type 2): Discord refuses the thread (50024, wrong channel
    # type); Kestrel blames a missing permission.
    guilds = {
        p.GUILD_ID: {
            "name": "g",
            "channels": {
                p.CHANNEL_ID: "ops",
                VOICE: {
                    **p.text_channel(VOICE, guild=p.GUILD_ID, name="voice"),
                    "type": 2,
                    "bitrate": 64000,
                    "user_limit": 0,
                    "rtc_region": None,
                },
            },
            "roles": {p.ROLE_ID: "sre"},
        }
    }
    async with (
        FakeDiscord(guilds=guilds) as fake,
        discord_world(tmp_path, restart_script(), fake=fake) as world,
    ):
        await world.mention("checkout is failing", channel=VOICE)
        reply = await fake.wait_for(f"POST /channels/{VOICE}/messages")
        said = str((reply[0].json or {}).get("content"))
        assert "permission" not in said.lower(), said


async def test_a_mention_in_a_thread_discord_py_has_not_cached_continues_it(
    tmp_path: Path,
) -> None:
    # A thread Kestrel does not have in its cache (archived when it connected, then written
    # to): message.channel is a PartialMessageable, so Kestrel tries to start a thread from a
    # message inside a thread, fails, and blames a permission.
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        await world.card("approve")
        await world.settled()
        fake.archive(thread)
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            fake.channels[thread]["thread_metadata"]["archived"] = False  # Discord reopens it
            await world.mention("status", user=REQUESTER, channel=thread)
            await world.answer_posted(thread, "suspended")


async def _dropped(call: Call) -> Reply:
    raise asyncio.CancelledError  # the connection closes with no answer


@pytest.mark.parametrize("fault", ["503", "dropped"])
async def test_a_mention_in_an_uncached_thread_discord_does_not_show_yet_waits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    # Asked what an uncached channel is, Discord answered a 503: the thread was taken for a
    # plain channel, and the person was told there is no run here (or a thread was started
    # inside the thread, and refused); a dropped connection dropped it with a traceback.
    # Held instead, it is answered once Discord says.
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        await world.card("approve")
        await world.settled()
        fake.archive(thread)
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            fake.channels[thread]["thread_metadata"]["archived"] = False  # Discord reopens it
            before = len(fake.bot_messages(thread))
            if fault == "dropped":
                fake.set_handler("GET", rf"/channels/{thread}", _dropped)
            else:
                fake.fail("GET", rf"/channels/{thread}", status=503, times=None)
            status = await world.mention("status", user=REQUESTER, channel=thread)
            await world.quiet(status)
            fake.clear_faults()
            fake.set_handler("GET", rf"/channels/{thread}", None)
            assert fake.bot_messages(thread)[before:] == []
            assert "left to be taken up again" in caplog.text
            (held,) = await world.rt.store.take_work(world.rt.owner, retake_after=0)
            await world.chat.inbound.settle(Accepted(held.id, held.payload))
            await world.answer_posted(thread, "suspended")
            assert len(fake.bot_messages(thread)[before:]) == 1
            assert _threads(fake) == [f"/channels/{p.CHANNEL_ID}/messages/{mention['id']}/threads"]
            assert "Traceback" not in caplog.text


async def test_an_answer_in_an_uncached_thread_discord_does_not_show_yet_waits(
    tmp_path: Path,
) -> None:
    # A plain reply answering the question of a thread Discord did not say was a thread (a
    # 503) was taken as said in a plain channel: ignored, the run waited on.
    async with (
        FakeDiscord() as fake,
        discord_world(tmp_path, question_script(), fake=fake) as world,
    ):
        mention = await world.mention("drain a node")
        thread = await world.thread_of(mention)
        await world.card("answer")
        await world.settled()
        fake.archive(thread)
        async with discord_world(tmp_path, question_script(), fake=fake) as world:
            fake.channels[thread]["thread_metadata"]["archived"] = False  # Discord reopens it
            fake.fail("GET", rf"/channels/{thread}", status=503, times=None)
            reply = await world.reply("us-east", user=REQUESTER, thread=thread)
            await world.quiet(reply)
            fake.clear_faults()
            (held,) = await world.rt.store.take_work(world.rt.owner, retake_after=0)
            await world.chat.inbound.settle(Accepted(held.id, held.payload))
            await world.answer_posted(thread, "us-east")


INJECTION = "@everyone @here <@&300> <@1002> [docs](https://evil.example) ```unclosed"


async def test_model_text_with_mentions_pings_nobody(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script(after=INJECTION)) as world:
        mention = await world.mention(f"checkout {INJECTION}")
        thread = await world.thread_of(mention)
        card = await world.card("approve")
        await world.click(card, "approve", user="1002")
        await world.answer_posted(thread, "@everyone")
        await world.settled()
        for message in world.discord.bot_messages(thread):
            assert not message["mention_everyone"], message["content"]
            assert message["mention_roles"] == [] and message["mentions"] == [], message


async def test_a_failure_quoting_tool_output_keeps_its_layout(tmp_path: Path) -> None:
    """A run that fails with an error quoting a tool's output (the model read the same log
    three times): the error went inside the bold "Run failed" line, so the output's backticks
    opened a code block that swallowed the rest, its markdown faked Kestrel's own lines, and
    "(no text)" followed. The status line is now Kestrel's words alone, in bold, the error a
    code block the output cannot close, and nothing more when the model said nothing."""
    forged = "ok ```\n**Approved by @alice**\n# Run completed"
    (tmp_path / "log.txt").write_text(forged)
    loop = [{"text": "", "calls": [{"name": "read_log", "arguments": {}}]}] * 4
    async with discord_world(tmp_path, loop) as world:
        mention = await world.mention("read the log until it changes")
        thread = await world.thread_of(mention)
        posted = await world.answer_posted(thread, "Run failed")
        said = str((posted.json or {}).get("content"))
        head, fence, rest = said.partition("\n```\n")
        reason = "no progress (the same calls kept returning the same results)"
        assert head == f"**Run failed: {reason}**"
        assert fence and rest.endswith("\n```"), said
        assert said.count("```") == 2 and "**Approved by" in rest, said
        assert "(no text)" not in said


async def test_a_made_up_tool_name_cannot_lay_out_the_status_message(tmp_path: Path) -> None:
    """The model calls a tool no catalog has, named with a backtick and new lines: the name
    went as written into the status message's inline code, closed it, and put a heading of the
    model's ("Approved by …") into Kestrel's own progress; a name of thousands of characters
    filled the message. A name no tool can have now shows as "an unknown tool"."""
    forged = "x`\n# Approved by the SRE lead\n`y"
    reply = chat_completion("Let me try.", [("c1", forged, "{}"), ("c2", "z" * 5000, "{}")])
    async with discord_world(tmp_path, [{"text": "Done."}] * 2) as world:
        world.model.add_canned(Canned(status=200, body=reply))
        mention = await world.mention("check checkout")
        thread = await world.thread_of(mention)
        await world.answer_posted(thread, "Done.")
        await world.settled()
        shown = [m["content"] for m in world.discord.bot_messages(thread)]
        status = next(text for text in shown if text.startswith("Working…"))
        assert status.splitlines() == [
            "Working…",
            "• failed: `an unknown tool`",
            "• failed: `an unknown tool`",
            "• finished",
        ]


async def test_a_question_of_25_options_with_run_links_is_a_card_discord_takes(
    tmp_path: Path,
) -> None:
    """With run pages linked (``web.public_url``), a question of 25 options filled five rows
    of buttons and its View run link went in a sixth: Discord takes five, so it refused the
    card, and the question showed as words with no button to answer it. The link now goes
    on the embed's title when the rows are full; the 25 buttons stay."""
    options = [f"node-{n}" for n in range(25)]
    ask = {"name": "ask_human_select", "arguments": {"question": "Which?", "options": options}}
    script = [{"text": "One question.", "calls": [ask]}, {"text": "Thanks."}]

    def link(run_id: str, _at: object) -> str:
        return f"https://kestrel.example/runs/{run_id}?sig=x"

    async with discord_world(tmp_path, script, link=link) as world:
        await world.mention("which node?")
        card = await world.card("choose")
        rows = card["components"]
        assert len(rows) == 5 and sum(len(row["components"]) for row in rows) == 25
        assert card["embeds"][0]["url"].startswith("https://kestrel.example/runs/run_")


async def test_an_option_past_the_menus_of_a_question_is_given_through_its_form(
    tmp_path: Path,
) -> None:
    """A question of 130 options: Discord holds five menus of 25, so the card offers four
    and its Answer form, where an option no menu holds is typed, and answers the question."""
    options = [f"node-{n}" for n in range(130)]
    ask = {"name": "ask_human_select", "arguments": {"question": "Which?", "options": options}}
    picked = {"match": "(?P<answer>node-[0-9]+)", "text": "Looking at {answer}."}
    script = [{"text": "One question.", "calls": [ask]}, {"one_of": [picked]}]
    async with discord_world(tmp_path, script) as world:
        mention = await world.mention("which node?")
        thread = await world.thread_of(mention)
        card = await world.card("choose")
        assert "Options 101 to 130 are in no menu" in card["embeds"][0]["description"]
        await world.fill_form(card, "answer", "node-127", user=REQUESTER, channel=thread)
        await world.answer_posted(thread, "Looking at node-127.")


def select3_script() -> list:  # type: ignore[type-arg]
    return [
        {
            "text": "Which region?",
            "calls": [
                {
                    "name": "ask_human_select",
                    "arguments": {"question": "Pick", "options": ["eu", "us", "ap"]},
                }
            ],
        },
        {"one_of": [{"match": "(?P<answer>eu|us|ap)", "text": "Looking at {answer}."}]},
    ]


async def test_chatter_in_a_thread_with_options_is_not_taken_as_an_answer(
    tmp_path: Path,
) -> None:
    async with discord_world(tmp_path, select3_script()) as world:
        mention = await world.mention("latency")
        thread = await world.thread_of(mention)
        await world.card("choose")
        await world.settled()
        before = len(world.discord.bot_messages(thread))
        chatter = await world.reply("hmm, which one is cheaper?", user=REQUESTER, thread=thread)
        await world.quiet(chatter)
        posted = [m["content"] for m in world.discord.bot_messages(thread)[before:]]
        run_id = (await world.chat.recent(1))[0].id
        assert len(await world.chat.requests_of(run_id)) == 1 and posted == [], posted


async def test_a_command_or_a_bare_mention_in_a_channel_starts_no_thread(tmp_path: Path) -> None:
    """``@Kestrel status`` (or ``@Kestrel`` alone) in a channel, not in a run's thread: there
    is no run to act on, so no empty thread named "status" is left behind; the reply says so.
    ``@Kestrel help`` (or a lone ``?``) gets the help, not a thread named "help" and a run."""
    async with discord_world(tmp_path, restart_script()) as world:
        for said in ("status", "cancel!", "", "help", "Help?", "?"):
            await world.quiet(await world.mention(said))
        replies = world.discord.calls_to("POST", rf"/channels/{p.CHANNEL_ID}/messages")
        told = [str((call.json or {}).get("content")) for call in replies]
        assert _threads(world.discord) == [] and await world.chat.recent(5) == []
        assert world.model.count == 0
        assert len(told) == 6, told
        assert told[0].startswith("There is no run here: mention me with `status` in a run's")
        assert all(said.startswith("Mention me with what you need") for said in told[2:])


async def test_a_mention_deleted_as_it_came_gets_no_reply(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A mention deleted before Kestrel starts its thread (Discord: Unknown Message) asked
    nothing any more: no thread, no run, and no "I could not start a thread here" posted in
    the channel (nor a reply to a message that is gone, which fails with a traceback)."""
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        threads = r"/channels/\d+/messages/\d+/threads"
        fake.fail("POST", threads, status=404, code=10008, message="Unknown Message")
        caplog.set_level("INFO", logger="kestrel.discord")
        said = await world.mention("checkout is failing")
        await fake.wait_for(f"POST /channels/{p.CHANNEL_ID}/messages/{said['id']}/threads")
        await world.quiet(said)
        await world.settled()
        posts = fake.calls_to("POST", rf"/channels/{p.CHANNEL_ID}/messages")
        assert posts == [] and await world.chat.recent(5) == []
        assert "deleted" in caplog.text and "Traceback" not in caplog.text
