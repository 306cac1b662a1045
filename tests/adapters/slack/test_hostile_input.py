"""Hostile input: odd messages, mrkdwn injection, huge and strange texts, secrets in logs."""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from adapters.slack import ids
from bot.domain import RequestStatus
from tests.fakes.slack_client import app_mention, message, slash_command, view_submission
from tests.fakes.slack_world import (
    APPROVER,
    CHANNEL,
    ONCALL,
    REQUESTER,
    SECRET,
    SlackWorld,
    question_script,
    restart_script,
    slack_world,
)


async def _question_open(world: SlackWorld) -> str:
    mention = await world.mention("look at the latency")
    await world.card(ids.ANSWER)
    await world.settled()
    return str(mention["ts"])


async def _open_requests(world: SlackWorld) -> list[RequestStatus]:
    run_id = (await world.chat.recent(1))[0].id
    return [v.status for v in await world.chat.requests_of(run_id)]


async def test_hostile_a_reply_also_sent_to_the_channel_answers_the_question(
    tmp_path: Path,
) -> None:
    """ "Also send to #channel" makes the reply a ``thread_broadcast`` message: still the
    requester's next reply in the thread, so it answers."""
    async with slack_world(tmp_path, question_script()) as world:
        thread = await _question_open(world)
        event = message(REQUESTER, "us-east", thread_ts=thread, subtype="thread_broadcast")
        await world.sender.event(event)
        await world.settled()
        assert await _open_requests(world) == [RequestStatus.ANSWERED], (
            "a thread_broadcast reply from the requester was silently ignored"
        )


async def test_hostile_bots_edits_and_userless_messages_never_answer(tmp_path: Path) -> None:
    async with slack_world(tmp_path, question_script()) as world:
        thread = await _question_open(world)
        bot = world.api.bot_user
        odd: list[dict[str, Any]] = [
            message(bot, "us-east", thread_ts=thread),  # the bot itself, without bot_id
            message("U0OTHERBOT", "us-east", thread_ts=thread, bot_id="B0OTHER"),
            message(REQUESTER, "us-east", thread_ts=thread, subtype="message_changed"),
            message(REQUESTER, "us-east", thread_ts=thread, subtype="message_deleted"),
            {
                "type": "message",
                "text": "us-east",
                "channel": CHANNEL,
                "thread_ts": thread,
                "ts": "1700000999.000100",
            },
            {"type": "message", "channel": CHANNEL, "thread_ts": thread, "user": REQUESTER},
            {"type": "app_mention", "text": f"<@{bot}> cancel", "channel": CHANNEL},
            {
                "type": "app_mention",
                "user": REQUESTER,
                "text": f"<@{bot}> cancel",
                "channel": "not a channel",
                "ts": "x.y",
                "thread_ts": thread,
            },
            # an edit that adds a mention of the bot: Slack sends it as message_changed
            {
                "type": "message",
                "subtype": "message_changed",
                "channel": CHANNEL,
                "message": {"user": REQUESTER, "text": f"<@{bot}> cancel", "ts": thread},
                "ts": "1700000999.000200",
            },
            # ... and as an app_mention of the old message, marked edited: an edit acts on
            # nothing (what a message said when it was said stands, as in Discord)
            {
                "type": "app_mention",
                "user": REQUESTER,
                "text": f"<@{bot}> cancel",
                "channel": CHANNEL,
                "ts": "1700000999.000300",
                "thread_ts": thread,
                "edited": {"user": REQUESTER, "ts": "1700001999.000000"},
            },
        ]
        for event in odd:
            response = await world.sender.event(event)
            assert response.status == 200
        await world.settled()
        assert await _open_requests(world) == [RequestStatus.OPEN]
        assert (await world.chat.recent(1))[0].status.value == "suspended"


INJECTION = (
    "<!channel> <!here|here> <!everyone> <@U0VICTIM> <!subteam^S0SRE> <https://evil.example|click>"
)
# Links the model writes stay links in its markdown answer (as ``[click](url)`` would): only
# the tokens that notify people are checked.
RAW_TOKENS = re.compile(r"<!channel|<!here|<!everyone|<@U0VICTIM|<!subteam\^S0SRE")


def _injection_script() -> list[Any]:
    return [
        {
            "text": f"I need one detail. {INJECTION}",
            "calls": [
                {"name": "ask_human_input", "arguments": {"question": f"Which region? {INJECTION}"}}
            ],
        },
        {"one_of": [{"match": "(?P<answer>.+)", "text": "Looking at {answer}. " + INJECTION}]},
    ]


def _public_calls(world: SlackWorld) -> list[Any]:
    public = (
        "chat.postMessage",
        "chat.update",
        "chat.startStream",
        "chat.appendStream",
        "chat.stopStream",
        "assistant.threads.setStatus",
    )
    return [c for c in world.api.calls if c.method in public]


async def test_hostile_a_mention_in_a_direct_message_starts_nothing(tmp_path: Path) -> None:
    async with slack_world(tmp_path, question_script()) as world:
        await world.mention("look at the latency", channel="D0DIRECT")
        await world.mention("look at the latency")  # the same, in a channel: one run
        await world.card(ids.ANSWER)
        await world.settled()
        (run,) = await world.chat.recent(10)
        assert ":D0DIRECT:" not in run.session_id
        assert all(c.args.get("channel") != "D0DIRECT" for c in world.api.calls)


async def test_hostile_mrkdwn_injection_pings_no_one(tmp_path: Path) -> None:
    async with slack_world(tmp_path, _injection_script()) as world:
        thread = await _question_open(world)
        await world.reply(f"us-east {INJECTION}", user=REQUESTER, thread_ts=thread)
        await world.answer_posted()
        await world.settled()
        leaks = []
        for call in _public_calls(world):
            args = json.dumps(call.args, ensure_ascii=False)
            leaks += [(call.method, m.group(0)) for m in RAW_TOKENS.finditer(args)]
        assert not leaks, f"raw Slack tokens reached the thread: {leaks}"


async def test_hostile_mrkdwn_injection_in_ephemeral_notes(tmp_path: Path) -> None:
    """A user's own words echoed back in a note are escaped too (``/kestrel status <!channel>``
    or a mention while a run works)."""
    async with slack_world(tmp_path, question_script()) as world:
        await _question_open(world)
        await world.sender.command(slash_command(REQUESTER, "status <!channel>"))
        await world.settled()
        replies = ("chat.postEphemeral", "response_url")
        notes = [json.dumps(c.args) for c in world.api.calls if c.method in replies]
        assert notes
        assert not [n for n in notes if "<!channel>" in n], notes


async def test_hostile_huge_and_strange_texts(tmp_path: Path) -> None:
    async with slack_world(tmp_path, question_script()) as world:
        strange = "\u202e\u0000\u200b" + "é" * 20 + "\U0001f525" * 10 + "```" + "x" * 60_000
        event = app_mention(REQUESTER, strange)
        assert (await world.sender.event(event)).status == 200
        await world.card(ids.ANSWER)
        await world.settled()
        await world.reply("y" * 100_000 + "\u0000<!channel>", user=REQUESTER, thread_ts=event["ts"])
        answer = await world.answer_posted()
        await world.settled()
        assert answer.ok
        assert not [c for c in world.api.calls if c.ok is False and c.method.startswith("chat.")]
        assert await world.rt.store.outbox_backlog("slack") == 0


async def test_hostile_secrets_never_reach_logs_or_the_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with slack_world(tmp_path, question_script()) as world:
        world.api.fail("chat.postMessage", status=500, error="internal_error", times=1)
        world.api.refuse("chat.startStream", "not_allowed")
        thread = await _question_open(world)
        await world.reply("us-east", user=REQUESTER, thread_ts=thread)
        await world.answer_posted()
        await world.settled()
        said = json.dumps(world.model.requests)
    logged = caplog.text
    assert "chat.postMessage" in logged  # the SDK's own DEBUG lines were captured
    for secret in ("xoxb-test", SECRET, "sk-test"):
        assert secret not in logged, f"{secret} appears in the logs"
        assert secret not in said, f"{secret} reached the model"


def _confirm_script() -> list[Any]:
    return [
        {
            "text": "Before I go on:",
            "calls": [{"name": "ask_human_confirm", "arguments": {"question": "Drain node-3?"}}],
        },
        {"one_of": [{"match": "(?P<answer>yes|no)", "text": "You said {answer}."}]},
    ]


async def test_hostile_no_python_repr_in_notes(tmp_path: Path) -> None:
    """A reply that is none of the options gets a note in words, not Python reprs
    (``'maybe\\nlater' is not one of the options: answer 'yes' or 'no'``)."""
    async with slack_world(tmp_path, _confirm_script()) as world:
        mention = await world.mention("drain the node")
        await world.card(ids.CHOOSE)
        await world.settled()
        await world.reply("maybe\nlater it's fine", user=REQUESTER, thread_ts=mention["ts"])
        note = await world.ephemeral_to(REQUESTER)
        text = note.args["text"]
        assert "\\n" not in text and "'yes'" not in text and '"maybe' not in text, text


@pytest.mark.parametrize("text", ["", "  \n "])
async def test_hostile_a_reply_without_text_answers_nothing(tmp_path: Path, text: str) -> None:
    """A screenshot posted alone in the thread (``file_share``, no text) or a blank reply is
    not the answer: the question stays open for the words that follow, and its author is told."""
    async with slack_world(tmp_path, question_script()) as world:
        thread = await _question_open(world)
        event = message(REQUESTER, text, thread_ts=thread, subtype="file_share")
        event["files"] = [{"id": "F0SHOT", "name": "latency.png"}]
        await world.sender.event(event)
        note = await world.ephemeral_to(REQUESTER)
        await world.settled()
        assert await _open_requests(world) == [RequestStatus.OPEN]
        assert note.args["text"] == (
            "an answer needs words: a reply with no text (a file alone) answers nothing"
        )
        await world.reply("us-east", user=REQUESTER, thread_ts=thread)
        await world.answer_posted()
        await world.settled()
        assert await _open_requests(world) == [RequestStatus.ANSWERED]


async def test_hostile_an_empty_option_is_still_an_option(tmp_path: Path) -> None:
    """A reply needs words, but an option the model made empty is one of the question's
    options: clicking it answers."""
    ask = {"question": "Which region?", "options": ["", "us-east"]}
    script = [
        {"text": "One detail.", "calls": [{"name": "ask_human_select", "arguments": ask}]},
        {"text": "Noted."},
    ]
    async with slack_world(tmp_path, script) as world:
        await world.mention("look at the latency")
        card = await world.card(ids.CHOOSE)
        await world.settled()
        request_id = (await world.chat.requests_of((await world.chat.recent(1))[0].id))[0]
        value = ids.choice_value(request_id.request.id, 0)
        await world.click(card, f"{ids.CHOOSE}:0", user=REQUESTER, value=value)
        await world.answer_posted()
        await world.settled()
        assert await _open_requests(world) == [RequestStatus.ANSWERED]


async def test_hostile_a_thread_whose_run_cannot_be_read_says_so(tmp_path: Path) -> None:
    """A run's journal cut short on disk (a bad copy, a hand edit): messages in its thread are
    taken (Slack is not answered 500 for each, nor is a mention taken up again for ever), a
    reply answers nothing, and a mention is told which entry cannot be read."""
    async with slack_world(tmp_path, question_script()) as world:
        thread = await _question_open(world)
        run_id = (await world.chat.recent(1))[0].id
        with sqlite3.connect(tmp_path / "kestrel.db") as conn:
            cut = "UPDATE journal SET body = substr(body, 1, 20) WHERE run_id = ? AND seq = 1"
            conn.execute(cut, (run_id,))
        await world.reply("us-east", user=REQUESTER, thread_ts=thread)
        await world.mention("status", thread_ts=thread)
        note = await world.ephemeral_to(REQUESTER)
        await world.settled()
        unreadable = f"run '{run_id}': journal entry at seq 1 is unreadable"
        assert note.args["text"] == f"{unreadable}: Input data was truncated"
        # Nothing was left to be taken up again (and fail again, for ever).
        assert await world.rt.store.take_work("test", retake_after=0) == []


async def test_hostile_a_click_on_a_run_whose_journal_cannot_be_read_names_it(
    tmp_path: Path,
) -> None:
    """A click on the card of a run whose journal was cut short on disk is told which entry
    cannot be read (on-call repairs it), not that the store did not answer and to click
    again, which would meet the same entry for ever."""
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id
        with sqlite3.connect(tmp_path / "kestrel.db") as conn:
            cut = "UPDATE journal SET body = substr(body, 1, 20) WHERE run_id = ? AND seq = 1"
            conn.execute(cut, (run_id,))
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        note = await world.ephemeral_to(APPROVER)
        unreadable = f"run '{run_id}': journal entry at seq 1 is unreadable"
        # The click counted: the run waits for the entry's repair, not for another click.
        said = f"recorded; not resumed here: {unreadable}: Input data was truncated"
        assert note.args["text"] == said


@pytest.mark.parametrize("verb", ["status", "cancel", "resume"])
async def test_hostile_a_slash_command_on_a_run_whose_journal_cannot_be_read_names_it(
    tmp_path: Path, verb: str
) -> None:
    """``/kestrel status|cancel|resume RUN`` on a run whose journal was cut short on disk is
    told which entry cannot be read (as Discord's are), not that the store did not answer."""
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        await world.card()
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id
        with sqlite3.connect(tmp_path / "kestrel.db") as conn:
            cut = "UPDATE journal SET body = substr(body, 1, 20) WHERE run_id = ? AND seq = 1"
            conn.execute(cut, (run_id,))
        await world.sender.command(slash_command(ONCALL, f"{verb} {run_id}"))
        replies = await world.api.wait_for("response_url")
        unreadable = f"run '{run_id}': journal entry at seq 1 is unreadable"
        assert replies[0].args["text"] == f"{unreadable}: Input data was truncated"


async def test_hostile_chatter_in_the_thread_of_an_ended_run_reads_no_journal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every reply in a thread asks whether the thread's run waits on a question: for a run
    that ended, its journal is not read (a busy thread read it whole for each message), so
    even one that can no longer be read costs, and says, nothing."""
    async with slack_world(tmp_path, [{"text": "Checkout is fine."}]) as world:
        mention = await world.mention("how is checkout?")
        await world.answer_posted()
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id
        with sqlite3.connect(tmp_path / "kestrel.db") as conn:
            cut = "UPDATE journal SET body = substr(body, 1, 20) WHERE run_id = ? AND seq = 1"
            conn.execute(cut, (run_id,))
        caplog.set_level("INFO")
        for said in ("thanks!", "nice"):
            await world.reply(said, user=REQUESTER, thread_ts=str(mention["ts"]))
        await world.settled()
        assert "unreadable" not in caplog.text
        assert world.api.calls_to("chat.postEphemeral") == []


async def test_hostile_a_form_on_a_run_whose_journal_cannot_be_read_names_it(
    tmp_path: Path,
) -> None:
    """The Answer form, submitted on a run whose journal was cut short on disk after it
    opened: the form says the answer counted and which entry cannot be read (the run cannot
    go on until it is repaired), as a click does, instead of Slack's "trouble connecting"."""
    async with slack_world(tmp_path, question_script()) as world:
        await _question_open(world)
        card = await world.card(ids.ANSWER)
        await world.click(card, ids.ANSWER, user=REQUESTER)
        modal = (await world.api.wait_for("views.open"))[0].args["view"]
        run_id = (await world.chat.recent(1))[0].id
        with sqlite3.connect(tmp_path / "kestrel.db") as conn:
            cut = "UPDATE journal SET body = substr(body, 1, 20) WHERE run_id = ? AND seq = 1"
            conn.execute(cut, (run_id,))
        values = {ids.ANSWER_BLOCK: {ids.ANSWER_ACTION: "ap-south"}}
        submitted = view_submission(REQUESTER, ids.ANSWER_MODAL, modal["private_metadata"], values)
        response = await world.sender.action(submitted)
        assert response.status == 200 and response.json is not None
        unreadable = f"run '{run_id}': journal entry at seq 1 is unreadable"
        shown = response.json["errors"][ids.ANSWER_BLOCK]
        assert shown == f"recorded; not resumed here: {unreadable}: Input data was truncated"
