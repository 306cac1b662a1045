"""On-call in Slack: thread commands, the slash command, the App Home, question buttons,
feedback, and progress where the workspace refuses Slack's AI-app surfaces."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from adapters.slack import ids
from storage.sqlite import SqliteStore
from tests.fakes.openai_server import Canned
from tests.fakes.slack_api import Call, FakeSlackApi
from tests.fakes.slack_client import app_mention, event_callback, slash_command
from tests.fakes.slack_world import (
    APPROVER,
    ONCALL,
    REQUESTER,
    SlackWorld,
    drain_script,
    restart_script,
    slack_world,
)
from tests.fakes.waiting import until


def confirm_script() -> list[Any]:
    """The model asks a yes/no question, then says what it heard."""
    return [
        {
            "text": "Before I go on:",
            "calls": [{"name": "ask_human_confirm", "arguments": {"question": "Drain node-3?"}}],
        },
        {"one_of": [{"match": "(?P<answer>yes|no)", "text": "You said {answer}."}]},
    ]


async def _in_thread(world: SlackWorld, text: str = "checkout is failing") -> str:
    mention = await world.mention(text)
    await world.card()
    await world.settled()
    return str(mention["ts"])


async def test_status_cancel_and_resume_in_the_thread(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        thread = await _in_thread(world)
        await world.mention("status", user=ONCALL, thread_ts=thread)
        status = await world.ephemeral_to(ONCALL)
        shown = json.dumps(status.args)
        assert "suspended" in shown and "restart_service" in shown and "iterations" in shown
        # Resuming a run that waits on people does nothing, and says so.
        await world.mention("resume", user=ONCALL, thread_ts=thread)
        note = await world.ephemeral_to(ONCALL, nth=2)
        assert "still waits on people" in note.args["text"]
        # Someone who neither asked nor is on call may not cancel.
        await world.mention("cancel", user="U0STRANGER", thread_ts=thread)
        note = await world.ephemeral_to("U0STRANGER")
        assert "may not cancel" in note.args["text"]
        run_id = (await world.chat.recent(1))[0].id
        assert (await world.chat.status(run_id)).record.status.value == "suspended"
        # The requester may; the card then shows the request closed.
        await world.mention("cancel", user=REQUESTER, thread_ts=thread)
        note = await world.ephemeral_to(REQUESTER)
        assert note.args["text"] == "cancelled"
        await world.answer_posted()
        assert world.executions == []
        await world.mention("cancel", user=REQUESTER, thread_ts=thread)
        again = await world.ephemeral_to(REQUESTER, nth=2)
        assert again.args["text"] == f"run {run_id} already ended (cancelled): nothing to cancel"


async def test_help_is_answered_with_the_help_not_a_run(tmp_path: Path) -> None:
    """``@Kestrel help`` asks how to use Kestrel: it got a run of the model instead (tokens
    spent, an answer that knows nothing of ``status``/``cancel``/``resume``), in a channel and
    in the thread of a finished run alike. Both now get the help, only its author sees it."""
    async with slack_world(tmp_path, [{"text": "All good."}]) as world:
        mention = await world.mention("help")
        note = await world.ephemeral_to(REQUESTER)
        assert note.args["text"].startswith("Mention me with what you need")
        await world.settled()
        assert await world.chat.recent(5) == [] and world.model.count == 0

        await world.mention("is checkout healthy?", thread_ts=str(mention["ts"]))
        await world.answer_posted()
        await world.mention("Help?", thread_ts=str(mention["ts"]))
        again = await world.ephemeral_to(REQUESTER, nth=2)
        assert again.args["text"] == note.args["text"]
        await world.settled()
        assert len(await world.chat.recent(5)) == 1 and world.model.count == 1


async def test_a_resume_in_the_thread_of_a_run_asked_to_cancel_says_it_ends_cancelled(
    tmp_path: Path,
) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        thread = await _in_thread(world)
        run_id = (await world.chat.recent(1))[0].id
        # Asked to cancel, as a cancel whose end the store failed at the run's suspend leaves
        # it: audited and marked, the run still suspended on its card.
        with sqlite3.connect(tmp_path / "kestrel.db") as conn:
            conn.execute(
                "INSERT INTO audit (at, actor, action, run_id) VALUES (?, ?, 'cancel', ?)",
                ("2026-01-01T00:00:00+00:00", REQUESTER, run_id),
            )
            conn.execute(
                "INSERT INTO once_keys VALUES (?, '2026-01-01T00:00:00+00:00')",
                (f"cancel:{run_id}",),
            )

        await world.mention("resume", user=ONCALL, thread_ts=thread)

        note = await world.ephemeral_to(ONCALL)
        assert note.args["text"] == (
            f"Run {run_id} was asked to cancel by {REQUESTER}: it ends cancelled, not resumed."
        )
        await until(lambda: world.chat.ended(run_id))
        assert (await world.chat.status(run_id)).record.status.value == "cancelled"
        assert world.executions == []


async def test_cancel_and_resume_of_a_completed_run_say_it_ended(tmp_path: Path) -> None:
    async with slack_world(tmp_path, [{"text": "Checkout is fine."}]) as world:
        mention = await world.mention("how is checkout?")
        await world.answer_posted()
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id
        await world.mention("cancel", user=REQUESTER, thread_ts=mention["ts"])
        note = await world.ephemeral_to(REQUESTER)
        assert note.args["text"] == f"run {run_id} already ended (completed): nothing to cancel"
        await world.sender.command(slash_command(ONCALL, f"resume {run_id}"))
        replies = await world.api.wait_for("response_url")
        said = replies[0].args["text"]
        assert said == f"run {run_id} already ended (completed): nothing to resume", said


@pytest.mark.parametrize("said", ["cancel!", "`cancel`", ", Cancel.", "*cancel*", "cancel\u200b"])
async def test_a_thread_command_said_with_punctuation_is_the_command(
    tmp_path: Path, said: str
) -> None:
    """``@Kestrel cancel!`` while the run asks a question cancels the run: it is not the
    answer to the question, and the run does not go on with "cancel!"."""
    async with slack_world(tmp_path, confirm_script()) as world:
        mention = await world.mention("drain the node")
        await world.card(ids.CHOOSE)
        await world.settled()
        await world.mention(said, user=REQUESTER, thread_ts=str(mention["ts"]))
        note = await world.ephemeral_to(REQUESTER)
        await world.settled()
        assert note.args["text"] == "cancelled"
        run = (await world.chat.recent(1))[0]
        assert run.status.value == "cancelled"
        (request,) = await world.chat.requests_of(run.id)
        assert request.status.value == "cancelled"


async def test_a_new_mention_while_a_run_waits_is_not_a_second_run(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        thread = await _in_thread(world)
        await world.mention("also look at payments", thread_ts=thread)
        note = await world.ephemeral_to(REQUESTER)
        assert "still going" in note.args["text"]
        assert len(await world.chat.recent(10)) == 1
        # The approver who writes "approve" was told the run was "suspended" and to wait for
        # it: it waits on them, and on a click of its card. The note says so.
        await world.mention("approve", user=APPROVER, thread_ts=thread)
        told = (await world.ephemeral_to(APPROVER)).args["text"]
        assert "it waits on an approval of `restart_service`" in told, told
        assert "buttons of its card" in told and "suspended" not in told
        assert world.executions == []


async def test_a_mention_in_the_thread_of_a_run_stopped_where_it_ran_says_to_resume(
    tmp_path: Path,
) -> None:
    """The replica stopped while the model was asked: the run is suspended where it ran,
    waiting on nobody. A mention in its thread was told to "wait for it", which waits for
    ever; it is now told what the thread's status says: mention me with `resume`."""
    async with FakeSlackApi() as api:
        async with slack_world(tmp_path, [{"text": "Checkout is fine."}] * 2, api=api) as first:
            first.model.add_canned(Canned(status=None, delay=30))  # the model is slow
            mention = await first.mention("how is checkout?")
            await until(lambda: first.model.count == 1, timeout=10)
        thread = str(mention["ts"])
        async with slack_world(tmp_path, [{"text": "Checkout is fine."}] * 2, api=api) as second:
            await second.mention("and payments?", thread_ts=thread)
            told = (await second.ephemeral_to(REQUESTER)).args["text"]
            assert "Mention me with `resume` to go on." in told, told
            assert "Wait for it" not in told
            await second.mention("resume", thread_ts=thread)
            await second.answer_posted()


async def test_two_mentions_at_once_in_a_thread_start_one_run(tmp_path: Path) -> None:
    # Two people mention Kestrel in the same thread at the same instant: the thread gets one
    # run, as it would had they come a second apart, and the other is told why not.
    async with slack_world(tmp_path, restart_script()) as world:
        mention = world.api.bot_user
        first = app_mention(REQUESTER, f"<@{mention}> checkout is failing", thread_ts="1.0")
        second = app_mention(APPROVER, f"<@{mention}> payments too", thread_ts="1.0")
        sent = await asyncio.gather(world.sender.event(first), world.sender.event(second))
        assert [response.status for response in sent] == [200, 200]
        await world.card()
        await world.settled()
        assert len(await world.chat.recent(10)) == 1
        told = [c for c in world.api.calls_to("chat.postEphemeral") if "still going" in str(c.args)]
        assert len(told) == 1


async def test_the_slash_command_lists_what_waits_with_links(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        thread = await _in_thread(world)
        response = await world.sender.command(slash_command(ONCALL, "runs"))
        assert response.status == 200
        body = json.dumps((await world.api.wait_for("response_url"))[0].args)
        assert "restart_service" in body
        assert f"/client/T0001/C0001/thread/C0001-{thread}" in body  # as every surface links
        usage = await world.sender.command(slash_command(ONCALL, "frobnicate"))
        assert "Usage" in usage.text


async def test_the_app_home_shows_what_waits_on_that_person(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        await _in_thread(world)
        world.api.channel_members["C0001"] = [REQUESTER, APPROVER, "U0STRANGER"]
        opened = {"type": "app_home_opened", "user": APPROVER, "channel": "D0001", "tab": "home"}
        await world.sender.event(opened)
        published = await world.api.wait_for("views.publish")
        view = json.dumps(published[0].args["view"])
        assert "restart_service" in view
        stranger = {**opened, "user": "U0STRANGER"}
        await world.sender.event(stranger)
        published = await world.api.wait_for("views.publish", count=2)
        assert "restart_service" not in json.dumps(published[1].args["view"])


async def test_a_confirm_question_is_answered_with_a_button(tmp_path: Path) -> None:
    async with slack_world(tmp_path, confirm_script()) as world:
        await world.mention("drain the node")
        card = await world.card(ids.CHOOSE)
        buttons = [
            element["action_id"]
            for block in card.args["blocks"]
            for element in block.get("elements") or []
            if ids.canonical_action(str(element.get("action_id", ""))) == ids.CHOOSE
        ]
        assert len(buttons) == 2
        await world.click(card, buttons[0], user="U0STRANGER")
        note = await world.ephemeral_to("U0STRANGER")
        assert "may not answer" in note.args["text"]
        await world.click(card, buttons[0], user=REQUESTER, channel="C0OTHER")
        note = await world.ephemeral_to(REQUESTER)
        assert "another channel" in note.args["text"]  # said as for any button of the card
        await world.click(card, buttons[0], user=REQUESTER)
        answer = await world.answer_posted()
        assert "You said yes." in json.dumps(answer.args)
        run_id = (await world.chat.recent(1))[0].id
        actions = [row.action for row in await world.rt.store.list_audit(run_id)]
        assert "answer_refused" in actions and "show_refused" not in actions


async def test_feedback_on_the_answer_is_recorded(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        await _in_thread(world)
        card = await world.card()
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        answer = await world.answer_posted()
        run_id = (await world.chat.recent(1))[0].id
        await world.click(
            answer, ids.FEEDBACK, user=REQUESTER, value=ids.feedback_value(run_id, positive=False)
        )
        await world.ephemeral_to(REQUESTER)
        audit = await world.rt.store.list_audit(run_id)
        assert any(r.action == "feedback_negative" and r.actor == REQUESTER for r in audit)


async def _status_messages_of_an_approved_restart(world: SlackWorld) -> tuple[str, list[Call]]:
    """Start the restart in a thread, approve it, wait for the answer: the thread, and the
    messages posted there that show the restart's step (not its card)."""
    thread = await _in_thread(world)
    card = await world.card()
    await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
    await world.answer_posted()
    await world.settled()
    statuses = [
        c
        for c in world.api.calls_to("chat.postMessage")
        if "restart_service" in json.dumps(c.args) and ids.APPROVE_ONCE not in str(c.args)
    ]
    return thread, statuses


async def test_progress_falls_back_to_one_message_edited_in_place(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        world.api.refuse("assistant.threads.setStatus", "not_allowed")
        world.api.refuse("chat.startStream", "not_allowed")
        thread, statuses = await _status_messages_of_an_approved_restart(world)
        assert len(statuses) == 1, "one status message, not one per step"
        assert statuses[0].args["thread_ts"] == thread
        # Its last version shows the step done: edited in place, or (when the outbox caught up
        # only once the step was over) posted as it stood then.
        edits = [c for c in world.api.calls_to("chat.update") if "done" in json.dumps(c.args)]
        assert edits or "done" in json.dumps(statuses[0].args), "the status never showed done"


async def test_a_stream_started_without_a_ts_falls_back_to_the_status_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A Web API (a proxy, a fake, an older Slack) that answers chat.startStream with a bare
    # {"ok": true}: nothing to append the next steps to, so the run's steps go to the one
    # status message, as where streams are refused, and no rendering fails.
    async with slack_world(tmp_path, restart_script()) as world:
        world.api.set_handler("chat.startStream", lambda call: {"ok": True})
        _thread, statuses = await _status_messages_of_an_approved_restart(world)
    assert len(statuses) == 1, "the steps are shown in one status message"
    assert "rendering" not in caplog.text and "Traceback" not in caplog.text


async def test_a_command_that_exits_non_zero_shows_failed_not_done(tmp_path: Path) -> None:
    """``read_log`` of a log that is not there exits 1 with Python's error on stderr: the
    thread's task list showed it done, beside a green tick, while it did nothing. It now
    shows failed; the model still reads the output and its exit status, as any answer."""
    script = [
        {"text": "Reading the log.", "calls": [{"name": "read_log", "arguments": {}}]},
        {"text": "The log is missing."},
    ]
    async with slack_world(tmp_path, script) as world:
        await world.mention("what does the log say?")
        await world.answer_posted()
        await world.settled()
        chunks = [
            chunk
            for call in world.api.calls
            if call.method in ("chat.startStream", "chat.appendStream")
            for chunk in call.args.get("chunks") or []
        ]
        assert [chunk["status"] for chunk in chunks] == ["in_progress", "error"], chunks
        said = world.model.requests[-1]["messages"][-1]["content"]
        assert said.endswith("[exit status 1]") and "FileNotFoundError" in said


async def test_messages_in_threads_without_a_question_are_ignored(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        thread = await _in_thread(world)
        before = len(world.api.calls)
        await world.reply("is it fixed yet?", user=REQUESTER, thread_ts=thread)
        bot_echo = event_callback(
            {"type": "message", "subtype": "bot_message", "text": "x", "channel": "C0001"}
        )
        await world.sender.event_body(bot_echo)
        await world.settled()
        later = [c.method for c in world.api.calls[before:]]
        assert "chat.postEphemeral" not in later and "chat.postMessage" not in later


async def test_a_long_tool_stays_visible(tmp_path: Path) -> None:
    async with slack_world(tmp_path, drain_script(1.5), refresh_seconds=0.2) as world:
        await world.mention("drain node-3")
        await world.answer_posted()

        def still_running(call: Any) -> bool:
            return "still running" in json.dumps(call.args)

        assert any(still_running(c) for c in world.api.calls_to("chat.appendStream"))
        statuses = world.api.calls_to("assistant.threads.setStatus")
        assert len(statuses) >= 4  # the mention, the tool, and refreshes while it ran


async def test_a_cancel_while_a_command_runs_says_the_command_finishes_first(
    tmp_path: Path,
) -> None:
    """``@Kestrel cancel`` while ``drain_node`` runs: the run ends once the command is done,
    and its author was told "cancelling at the next loop boundary", which says nothing of the
    command running on. The note now says the run ends once the step under way is done."""
    async with slack_world(tmp_path, drain_script(1)) as world:
        mention = await world.mention("drain node-3")
        await until(lambda: world.executions, timeout=10)  # the drain started
        await world.mention("cancel", thread_ts=str(mention["ts"]))
        note = (await world.ephemeral_to(REQUESTER)).args["text"]
        assert note == "cancelling: the run ends once the step under way is done"
        ended = await world.answer_posted()
        assert "Run cancelled" in ended.args["text"]
        assert world.executions == ["node-3"]


async def test_an_effect_cut_by_a_restart_is_settled_from_its_card(tmp_path: Path) -> None:
    async with FakeSlackApi() as api:
        async with slack_world(tmp_path, drain_script(30), api=api) as first:
            mention = await first.mention("drain node-3")
            await until(lambda: first.executions, timeout=10)  # the drain started: stop
        thread = str(mention["ts"])
        async with slack_world(tmp_path, drain_script(0), api=api) as second:
            await second.mention("resume", user=ONCALL, thread_ts=thread)
            card = await second.card(ids.EFFECT_DONE)
            shown = json.dumps(card.args["blocks"])
            assert "drain_node" in shown and "node-3" in shown
            await second.click(card, ids.EFFECT_DONE, user="U0STRANGER")
            note = await second.ephemeral_to("U0STRANGER")
            assert "on-call" in note.args["text"]
            await second.click(card, ids.EFFECT_DONE, user=ONCALL)
            answer = await second.answer_posted()
            assert "drained" in json.dumps(answer.args)
            assert second.executions == ["node-3"]  # started once, never run again


def resume_or_cancel_script() -> list[Any]:
    """The model asks to pick "resume" or "cancel" (of a migration), then says what it heard."""
    question = "The migration is paused halfway. Resume it, or cancel and roll it back?"
    select = {"question": question, "options": ["resume", "cancel"]}
    return [
        {"text": "Before I go on:", "calls": [{"name": "ask_human_select", "arguments": select}]},
        {"one_of": [{"match": "(?P<answer>resume|cancel)", "text": "You chose {answer}."}]},
    ]


@pytest.mark.parametrize("said", ["cancel", "Resume!"])
async def test_a_thread_command_that_is_one_of_the_questions_options_answers_it(
    tmp_path: Path, said: str
) -> None:
    """A question whose options are spelled as thread commands ("resume", "cancel") is
    answered by that word: the run is neither cancelled nor told it has nothing to resume."""
    async with slack_world(tmp_path, resume_or_cancel_script()) as world:
        mention = await world.mention("migrate the orders table")
        await world.card(ids.CHOOSE)
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id

        await world.mention(said, user=REQUESTER, thread_ts=str(mention["ts"]))
        word = said.strip("!").lower()
        # Its author is told how to act on the run itself, had they meant that.
        note = await world.ephemeral_to(REQUESTER)
        assert f"`/kestrel {word} {run_id}`" in note.args["text"]

        async def ended() -> Any:
            view = await world.chat.status(run_id)
            return view if view.state.result is not None else None

        view = await until(ended, timeout=10)
        assert view.record.status.value == "completed"
        assert view.state.result.text == f"You chose {word}."
        (request,) = await world.chat.requests_of(run_id)
        assert request.status.value == "answered"
        assert request.decision is not None and request.decision.text == word


async def test_cancel_when_the_question_offering_cancel_has_expired_cancels_the_run(
    tmp_path: Path,
) -> None:
    """On-call says ``@Kestrel cancel`` in a thread whose question offers "cancel" but can no
    longer be answered (its deadline passed): they mean the run, and it is cancelled, rather
    than refused as an answer with nothing said of how to cancel."""
    async with slack_world(tmp_path, resume_or_cancel_script()) as world:
        mention = await world.mention("migrate the orders table")
        await world.card(ids.CHOOSE)
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id
        await world.later(2 * 3600)  # past deadlines.wait_user, before anything expired it

        await world.mention("cancel", user=ONCALL, thread_ts=str(mention["ts"]))
        note = await world.ephemeral_to(ONCALL)
        await world.settled()

        assert note.args["text"] == "cancelled"
        view = await world.chat.status(run_id)
        assert view.record.status.value == "cancelled"
        (request,) = await world.chat.requests_of(run_id)
        assert request.decision is None or request.decision.text != "cancel"


async def test_the_slash_command_reads_the_cards_shown_in_one_query(tmp_path: Path) -> None:
    # Whether each listed request's card was shown was read from the outbox one request at a
    # time: a page of fifty waiting requests, fifty reads before on-call saw anything.
    async with slack_world(tmp_path, restart_script()) as world:
        for n in range(3):
            await world.mention(f"checkout {n} is failing")
        await until(lambda: _waiting(world, 3))
        await world.settled()
        store = world.rt.store
        assert isinstance(store, SqliteStore)
        await store.list_runs()  # both connections open: every read is traced
        statements: list[str] = []
        store._writer()._conn.set_trace_callback(statements.append)
        store._reader()._conn.set_trace_callback(statements.append)
        await world.sender.command(slash_command(ONCALL, "runs"))
        body = json.dumps((await world.api.wait_for("response_url"))[0].args)
        assert body.count("restart_service") == 3, body
        # The outbox worker's own claims go on meanwhile: only the reads of messages count.
        reads = [s for s in statements if s.startswith("SELECT key, platform")]
        assert len(reads) == 1, reads


async def _waiting(world: Any, count: int) -> bool:
    return len(await world.rt.store.list_requests()) == count
