"""Kestrel in Slack end to end: the real bolt AsyncApp over HTTP with signed requests, the real
runtime and openai client, a fake Slack Web API and a fake model."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from adapters.slack import ids
from bot.chat.service import ChatService
from bot.cli import compose
from bot.config.settings import load_settings
from bot.domain import DecisionKind, RequestStatus, RunStatus
from bot.people.policy import Actor
from bot.run.supervisor import LiveRun, Supervisor
from tests.fakes.openai_server import Canned
from tests.fakes.slack_api import Call, FakeSlackApi
from tests.fakes.slack_client import view_submission
from tests.fakes.slack_world import (
    APPROVER,
    INJECTED_LOG,
    ONCALL,
    REQUESTER,
    SlackWorld,
    injection_script,
    plan_script,
    posted_ts,
    question_script,
    reload_with_another_argv,
    require_approvals,
    restart_script,
    slack_world,
    updates_of,
)
from tests.fakes.waiting import until


async def _wait_status(world, run_id: str, status: RunStatus) -> None:  # type: ignore[no-untyped-def]
    async def reached() -> bool:
        return (await world.chat.status(run_id)).record.status is status

    await until(reached, timeout=10)


async def _run_id(world) -> str:  # type: ignore[no-untyped-def]
    runs = await world.chat.recent(1)
    assert runs, "no run started"
    return str(runs[0].id)


async def test_mention_progress_card_approve_result(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing, can you look?")
        await world.api.wait_for("assistant.threads.setStatus")
        card = await world.card()
        thread = mention["ts"]
        assert card.args["thread_ts"] == thread
        text = json.dumps(card.args["blocks"])
        assert "restart_service" in text and "checkout" in text
        assert "OOM-killed" in text  # why the model asked
        assert world.executions == []

        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        answer = await world.answer_posted()
        assert answer.args["thread_ts"] == thread
        assert "healthy again" in json.dumps(answer.args)
        assert world.executions == ["checkout"]

        card_ts = posted_ts(world.api, card)
        closed = updates_of(world.api, card_ts)
        assert closed, "the card was not updated after the decision"
        last = json.dumps(closed[-1].args["blocks"])
        assert APPROVER in last and ids.APPROVE_ONCE not in last  # buttons gone
        run_id = await _run_id(world)
        await _wait_status(world, run_id, RunStatus.COMPLETED)
        # Progress showed the tool by name (a stream task update or the status line).
        progress = [
            c
            for c in world.api.calls
            if c.method in ("chat.startStream", "chat.appendStream", "assistant.threads.setStatus")
        ]
        assert any("restart_service" in json.dumps(c.args) for c in progress)
        audit = await world.rt.store.list_audit(run_id)
        assert any(r.action == "approve" and r.actor == APPROVER for r in audit)


async def test_deny_with_a_reason_from_the_modal(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        await world.click(card, ids.DENY, user=APPROVER)
        opened = await world.api.wait_for("views.open")
        modal = opened[0].args["view"]
        assert modal["callback_id"] == ids.DENY_MODAL
        submission = view_submission(
            APPROVER,
            ids.DENY_MODAL,
            modal["private_metadata"],
            {ids.REASON_BLOCK: {ids.REASON_ACTION: {"type": "plain_text_input", "value": "peak"}}},
        )
        response = await world.sender.action(submission)
        assert response.status == 200
        answer = await world.answer_posted()
        assert "denied" in json.dumps(answer.args)
        assert world.executions == []
        run_id = await _run_id(world)
        views = await world.chat.requests_of(run_id)
        assert views[0].status is RequestStatus.ANSWERED
        assert views[0].decision is not None and views[0].decision.text == "peak"


async def test_refused_clicks_change_nothing(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        # The requester may not approve their own run; a stranger may not approve at all.
        await world.click(card, ids.APPROVE_ONCE, user=REQUESTER)
        note = await world.ephemeral_to(REQUESTER)
        assert "someone else" in note.args["text"]
        await world.click(card, ids.APPROVE_ONCE, user="U0STRANGER")
        note = await world.ephemeral_to("U0STRANGER")
        assert "may not approve" in note.args["text"]
        # A forged value naming another request, or no request at all: refused.
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER, value="req_forged")
        note = await world.ephemeral_to(APPROVER)
        assert "no longer exists" in note.args["text"]
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER, value="<@U0APPROVER>:x")
        note = await world.ephemeral_to(APPROVER, nth=2)
        assert "not one of mine" in note.args["text"]
        run_id = await _run_id(world)
        views = await world.chat.requests_of(run_id)
        assert [v.status for v in views] == [RequestStatus.OPEN]
        assert world.executions == []
        # Then a real approval, and a second click on the same card.
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        await world.answer_posted()
        await world.click(card, ids.APPROVE_ONCE, user=ONCALL)
        note = await world.ephemeral_to(ONCALL)
        assert "already" in note.args["text"]
        assert world.executions == ["checkout"]


async def test_a_question_answered_by_a_thread_reply(tmp_path: Path) -> None:
    async with slack_world(tmp_path, question_script()) as world:
        mention = await world.mention("look at the latency")
        await world.api.wait_for(
            lambda c: c.method == "chat.postMessage" and "Which region?" in json.dumps(c.args)
        )
        # The bot's own message and a stranger's reply are not answers.
        await world.reply("eu-west", user="U0STRANGER", thread_ts=mention["ts"])
        note = await world.ephemeral_to("U0STRANGER")
        assert "may not answer" in note.args["text"]
        await world.reply("us-east", user=REQUESTER, thread_ts=mention["ts"])
        answer = await world.answer_posted()
        assert "looking at us-east" in json.dumps(answer.args)


async def test_a_question_answered_through_its_modal(tmp_path: Path) -> None:
    async with slack_world(tmp_path, question_script()) as world:
        await world.mention("look at the latency")
        card = await world.card(ids.ANSWER)
        await world.click(card, ids.ANSWER, user=REQUESTER)
        opened = await world.api.wait_for("views.open")
        modal = opened[0].args["view"]
        assert modal["callback_id"] == ids.ANSWER_MODAL
        values = {
            ids.ANSWER_BLOCK: {ids.ANSWER_ACTION: {"type": "plain_text_input", "value": "ap-south"}}
        }
        # Someone who may not answer sees the refusal in the modal, and nothing is decided.
        refused = await world.sender.action(
            view_submission("U0STRANGER", ids.ANSWER_MODAL, modal["private_metadata"], values)
        )
        assert refused.json is not None and refused.json["response_action"] == "errors"
        response = await world.sender.action(
            view_submission(REQUESTER, ids.ANSWER_MODAL, modal["private_metadata"], values)
        )
        assert response.status == 200
        answer = await world.answer_posted()
        assert "looking at ap-south" in json.dumps(answer.args)


async def test_a_member_of_an_approver_group_approves(tmp_path: Path) -> None:
    async with FakeSlackApi() as api:
        api.usergroups["S0SRE"] = ["U0SRE1"]
        async with slack_world(tmp_path, restart_script(), api=api) as world:
            await world.mention("checkout is failing")
            card = await world.card()
            await world.click(card, ids.APPROVE_ONCE, user="U0SRE1")
            await world.answer_posted()
            assert world.executions == ["checkout"]
            # Memberships are cached briefly: one lookup served every click and mention.
            assert len(api.calls_to("usergroups.users.list")) == 1


async def test_a_card_two_people_approved_names_both(tmp_path: Path) -> None:
    async with FakeSlackApi() as api:
        api.usergroups["S0SRE"] = ["U0SRE1"]
        async with slack_world(tmp_path, restart_script(), api=api) as world:
            require_approvals(world.rt, tmp_path, 2)
            await world.mention("checkout is failing")
            card = await world.card()
            await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
            first = await world.ephemeral_to(APPROVER)
            assert first.args["text"] == "approval 1 of 2 recorded"
            # A second click of the same person counts nothing, and says so.
            await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
            again = await world.ephemeral_to(APPROVER, nth=2)
            assert again.args["text"] == (
                "You already approved this; it needs 1 more approval (from someone else)."
            )
            assert world.executions == []
            await world.click(card, ids.APPROVE_ONCE, user="U0SRE1")
            await world.answer_posted()
            assert world.executions == ["checkout"]
            await world.settled()
            last = json.dumps(updates_of(world.api, posted_ts(world.api, card))[-1].args)
            assert f"Approved by <@{APPROVER}> and <@U0SRE1>" in last, last


async def test_full_arguments_open_in_a_modal(tmp_path: Path) -> None:
    script = restart_script()
    long_name = "checkout" + "x" * 5000
    script[0]["calls"][0]["arguments"]["service"] = long_name
    async with slack_world(tmp_path, script) as world:
        await world.mention("checkout is failing")
        card = await world.card(ids.SHOW_ARGUMENTS)
        assert long_name not in json.dumps(card.args)  # cut on the card
        await world.click(card, ids.SHOW_ARGUMENTS, user="U0ANYONE")
        shown = await modal_text(world)
        assert shown.count("x") >= 5000


async def test_an_approval_the_run_cannot_go_on_with_says_why(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        reload_with_another_argv(world.rt, tmp_path)  # while the card waits
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        note = await world.ephemeral_to(APPROVER)
        assert "tool set changed since the run started; resume with --force" in note.args["text"]
        assert world.executions == []
        # Decided, not yet journaled (the run did not go on): the thread waits on no one.
        view = await world.chat.status((await world.chat.recent(1))[0].id)
        assert view.record.status is RunStatus.SUSPENDED and view.open_requests == []


async def test_a_second_mention_in_the_thread_continues_the_conversation(tmp_path: Path) -> None:
    script = [{"text": "Checkout is fine."}, {"text": "Payments are fine too."}]
    async with slack_world(tmp_path, script) as world:
        mention = await world.mention("how is checkout?")
        await world.answer_posted()
        await world.settled()
        await world.mention("and payments?", thread_ts=mention["ts"])
        await world.api.wait_for(lambda c: "Payments are fine" in json.dumps(c.args))
        last = world.model.requests[-1]["messages"]
        said = json.dumps(last)
        assert "how is checkout?" in said and "Checkout is fine." in said


async def test_try_again_after_a_failed_run_still_knows_what_was_asked(tmp_path: Path) -> None:
    """The model's server failed the first turn (a 500): "try again" in the thread reached the
    model alone, the request it was to try again left out of the history (only turns with an
    answer text were kept). The failed turn is now in the history, answered by how it ended,
    and the roles alternate as some chat templates require."""
    # The script plays by the conversation's position: the second turn's is its second.
    script = [{"text": "Checkout is fine."}] * 2
    async with slack_world(tmp_path, script) as world:
        world.model.add_canned(Canned(status=500))
        mention = await world.mention("how is checkout?")
        failed = await world.answer_posted()
        assert "Run failed: model error" in json.dumps(failed.args)
        await world.settled()
        await world.mention("try again", thread_ts=mention["ts"])
        await world.api.wait_for(lambda c: "Checkout is fine" in json.dumps(c.args))
        said = [(m["role"], m["content"]) for m in world.model.requests[-1]["messages"][1:]]
        assert said == [
            ("user", "how is checkout?"),
            ("assistant", "(no answer: the run failed, model error)"),
            ("user", "try again"),
        ]


async def test_a_click_after_the_deadline_is_refused(tmp_path: Path) -> None:
    deadlines = {"deadlines": {"per_tool": {"restart_service": 0.5}}}
    async with slack_world(tmp_path, restart_script(), extra_config=deadlines) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        run_id = (await world.chat.recent(1))[0].id
        request = (await world.chat.requests_of(run_id))[0].request
        assert request.deadline is not None
        # No scheduler here, so nothing closes it: the click comes after the deadline.
        world.clock.advance(60)
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        note = await world.ephemeral_to(APPROVER)
        assert "expired" in note.args["text"]
        assert world.executions == []


async def test_a_card_whose_message_id_was_not_recorded_still_takes_its_click(
    tmp_path: Path,
) -> None:
    # The replica that posted the card died before recording which message it is: the click on
    # it counts (from the run's thread; the place is checked as ever), and one from elsewhere
    # does not.
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        with sqlite3.connect(tmp_path / "kestrel.db", timeout=10) as db:
            db.execute("UPDATE outbox SET ref = '', delivered_version = 0 WHERE key LIKE '%card:%'")
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER, channel="C0OTHER")
        note = await world.ephemeral_to(APPROVER)
        assert "another channel" in note.args["text"]
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        await world.answer_posted()
        assert world.executions == ["checkout"]


async def test_an_effect_following_a_log_waits_on_a_card_naming_the_log(tmp_path: Path) -> None:
    (tmp_path / "log.txt").write_text(INJECTED_LOG)
    async with slack_world(tmp_path, injection_script()) as world:
        await world.mention("the api is slow, can you look?")
        card = await world.card()
        blocks = card.args["blocks"]
        origins = next(b["text"]["text"] for b in blocks if "Taken from tool output" in str(b))
        assert "`node` = `node-666` came from `read_log` output, line 2" in origins
        assert "instruction-like" in origins
        assert world.executions == []  # drain_node is ungated, and still waits

        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        answer = await world.answer_posted()
        assert "Drained node-666" in json.dumps(answer.args)
        assert world.executions == ["node-666"]


async def test_a_plan_card_approved_once_runs_both_restarts(tmp_path: Path) -> None:
    async with slack_world(tmp_path, plan_script()) as world:
        await world.mention("checkout and payments are failing")
        card = await world.card(ids.APPROVE_PLAN)
        text = json.dumps(card.args["blocks"])
        assert "Plan approval needed" in text and "Both are OOM-killed" in text
        assert "checkout" in text and "payments" in text
        assert ids.STEP_BY_STEP in text and ids.DENY in text
        assert ids.APPROVE_ONCE not in text  # one card for the plan, none per call
        assert world.executions == []

        await world.click(card, ids.APPROVE_PLAN, user=APPROVER)

        answer = await world.answer_posted()
        assert "Restarted checkout and payments" in json.dumps(answer.args)
        assert world.executions == ["checkout", "payments"]
        closed = updates_of(world.api, posted_ts(world.api, card))
        assert closed and ids.APPROVE_PLAN not in json.dumps(closed[-1].args["blocks"])
        run_id = await _run_id(world)
        requests = await world.rt.store.list_requests(run_id=run_id, status=None)
        assert len(requests) == 1


async def test_a_plan_step_cut_on_its_card_opens_whole(tmp_path: Path) -> None:
    script = plan_script()
    long_name = "payments" + "x" * 900 + "all"
    script[0]["calls"][1]["arguments"]["service"] = long_name
    async with slack_world(tmp_path, script) as world:
        await world.mention("checkout and payments are failing")
        card = await world.card(ids.SHOW_ARGUMENTS)
        assert long_name not in json.dumps(card.args)  # the step is cut on the card
        await world.click(card, ids.SHOW_ARGUMENTS, user="U0ANYONE")
        shown = await modal_text(world)
        assert long_name in shown and '"checkout"' in shown
        assert world.executions == []


async def test_a_plan_click_from_another_channel_decides_nothing(tmp_path: Path) -> None:
    async with slack_world(tmp_path, plan_script()) as world:
        await world.mention("checkout and payments are failing")
        card = await world.card(ids.APPROVE_PLAN)
        for action in (ids.APPROVE_PLAN, ids.STEP_BY_STEP):
            await world.click(card, action, user=APPROVER, channel="C0OTHER")
            note = await world.ephemeral_to(APPROVER)
            assert "another channel" in note.args["text"]
        run_id = await _run_id(world)
        requests = await world.rt.store.list_requests(run_id=run_id, status=None)
        assert [status for _request, status, _decision in requests] == [RequestStatus.OPEN]
        assert world.executions == []


def two_restarts_script() -> list[Any]:
    """The model restarts checkout, then payments (each gated), then reports."""

    def restart(service: str) -> list[dict[str, Any]]:
        return [{"name": "restart_service", "arguments": {"service": service}}]

    return [
        {"text": "Checkout first.", "calls": restart("checkout")},
        {"text": "Now payments.", "calls": restart("payments")},
        {"text": "Restarted both."},
    ]


async def test_a_card_the_terminal_s_run_opened_is_shown_in_the_thread(tmp_path: Path) -> None:
    # `kestrel runs approve` at the terminal goes on with a Slack thread's run in its own
    # process, which has no Slack: the next card it opens must still reach the thread, and the
    # card it decided must stop offering its buttons.
    async with slack_world(tmp_path, two_restarts_script()) as world:
        await world.mention("checkout and payments are failing")
        first = await world.card()
        await world.settled()
        async with approved_at_the_terminal(world, tmp_path) as (supervisor, resumed):
            await supervisor.wait(resumed)
        assert world.executions == ["checkout"]

        def payments_card(call: Call) -> bool:
            shown = json.dumps(call.args.get("blocks") or [])
            return call.method == "chat.postMessage" and "payments" in shown and ids.DENY in shown

        async def shown() -> bool:
            await world.later(5)  # the outbox's next poll
            return any(payments_card(call) for call in world.api.calls)

        await until(shown, timeout=10)
        edits = updates_of(world.api, posted_ts(world.api, first))
        assert edits and ids.APPROVE_ONCE not in json.dumps(edits[-1].args.get("blocks"))


async def test_a_card_decided_at_the_terminal_says_so_while_the_run_goes_on(
    tmp_path: Path,
) -> None:
    # Approved with `kestrel runs approve`, the run goes on at the terminal with a long drain:
    # meanwhile the thread's card must show the approval, not offer its buttons for minutes.
    restart = {"name": "restart_service", "arguments": {"service": "checkout"}}
    drain = {"name": "drain_node", "arguments": {"node": "node-3", "seconds": 30}}
    script = [
        {"text": "Restart first.", "calls": [restart]},
        {"text": "Now drain.", "calls": [drain]},
        {"text": "Done."},
    ]
    async with slack_world(tmp_path, script) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        async with approved_at_the_terminal(world, tmp_path):
            await until(lambda: "node-3" in world.executions, timeout=20)
            ts = posted_ts(world.api, card)

            async def shows_the_approval() -> bool:
                await world.later(5)  # the outbox's next poll
                edits = updates_of(world.api, ts)
                return bool(edits) and ids.APPROVE_ONCE not in json.dumps(edits[-1].args)

            await until(shows_the_approval, timeout=10)
            assert APPROVER in json.dumps(updates_of(world.api, ts)[-1].args)


@contextlib.asynccontextmanager
async def approved_at_the_terminal(
    world: SlackWorld, folder: Path
) -> AsyncIterator[tuple[Supervisor, LiveRun]]:
    """The thread's one open request approved as `kestrel runs approve` does, in a runtime of
    its own with no Slack: its supervisor and the run it resumed (shut down on leaving)."""
    run_id = await _run_id(world)
    (waiting,) = await world.chat.pending()
    settings = load_settings(str(folder / "kestrel.yaml"))
    async with compose.runtime(settings, clock=world.clock) as terminal:
        supervisor = Supervisor(terminal)
        decided = await ChatService(supervisor).decide(
            run_id, waiting.request.id, DecisionKind.APPROVE, user=Actor(APPROVER)
        )
        assert decided.accepted and decided.resumed is not None
        try:
            yield supervisor, decided.resumed
        finally:
            await supervisor.shutdown()


async def modal_text(world: SlackWorld) -> str:
    """The text of the first modal opened (its sections, joined)."""
    opened = await world.api.wait_for("views.open")
    blocks = opened[0].args["view"]["blocks"]
    return "".join(block["text"]["text"] for block in blocks if block.get("type") == "section")
