"""Hostile authorization and races: forged payloads, self-approval, guests, two-person rule,
concurrent decisions, and the slash command on other people's runs."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapters.slack import ids
from bot.domain import RequestStatus, RunStatus
from tests.fakes.slack_api import FakeSlackApi
from tests.fakes.slack_client import app_mention, block_actions, slash_command, view_submission
from tests.fakes.slack_world import (
    APPROVER,
    ONCALL,
    REQUESTER,
    SlackWorld,
    button_value,
    posted_ts,
    question_script,
    restart_script,
    slack_world,
)
from tests.fakes.waiting import until

SRE = "U0SRE1"


async def _run_id(world: SlackWorld) -> str:
    runs = await world.chat.recent(1)
    assert runs
    return runs[0].id


async def _audit(world: SlackWorld, action: str) -> list[Any]:
    return [r for r in await world.rt.store.list_audit(await _run_id(world)) if r.action == action]


def _click_payload(world: SlackWorld, card: Any, action_id: str, user: str, **kw: Any) -> Any:
    return block_actions(
        user,
        action_id,
        kw.pop("value", None) or button_value(card, action_id),
        channel=card.args["channel"],
        message_ts=posted_ts(world.api, card),
        thread_ts=card.args.get("thread_ts"),
        **kw,
    )


async def _deny_modal_metadata(world: SlackWorld, card: Any) -> str:
    await world.click(card, ids.DENY, user=APPROVER)
    opened = await world.api.wait_for("views.open")
    return str(opened[0].args["view"]["private_metadata"])


# --- races --------------------------------------------------------------------------------


async def test_hostile_two_approvers_at_once_make_one_decision(tmp_path: Path) -> None:
    async with FakeSlackApi() as api:
        api.usergroups["S0SRE"] = [SRE]
        async with slack_world(tmp_path, restart_script(), api=api) as world:
            await world.mention("checkout is failing")
            card = await world.card()
            await world.settled()
            a = _click_payload(world, card, ids.APPROVE_ONCE, APPROVER)
            b = _click_payload(world, card, ids.APPROVE_RUN, SRE)
            await asyncio.gather(world.sender.action(a), world.sender.action(b))
            await world.answer_posted()
            await world.settled()
            assert world.executions == ["checkout"]
            decided = await _audit(world, "approve") + await _audit(world, "approve_always")
            assert len(decided) == 1
            notes = [c for c in api.calls_to("chat.postEphemeral") if "already" in c.args["text"]]
            assert len(notes) == 1


async def test_hostile_double_submission_of_the_deny_modal(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        metadata = await _deny_modal_metadata(world, card)
        values = {ids.REASON_BLOCK: {ids.REASON_ACTION: "peak hours"}}
        sub = view_submission(APPROVER, ids.DENY_MODAL, metadata, values)
        first, second = await asyncio.gather(world.sender.action(sub), world.sender.action(sub))
        errors = [r for r in (first, second) if r.json and r.json.get("response_action")]
        assert len(errors) == 1, (first.text, second.text)
        await world.answer_posted()
        await world.settled()
        assert len(await _audit(world, "deny")) == 1
        assert world.executions == []


# --- the modals -------------------------------------------------------------------------------


async def test_hostile_answer_modal_cannot_decide_an_approval(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        request_id = button_value(card, ids.APPROVE_ONCE)
        for user in (APPROVER, REQUESTER):
            values = {ids.ANSWER_BLOCK: {ids.ANSWER_ACTION: "approve"}}
            sub = view_submission(user, ids.ANSWER_MODAL, request_id, values)
            response = await world.sender.action(sub)
            assert response.json and response.json["response_action"] == "errors"
        views = await world.chat.requests_of(await _run_id(world))
        assert [v.status for v in views] == [RequestStatus.OPEN]
        assert world.executions == []


async def test_hostile_deny_modal_on_a_question_is_refused(tmp_path: Path) -> None:
    async with slack_world(tmp_path, question_script()) as world:
        await world.mention("look at the latency")
        card = await world.card(ids.ANSWER)
        request_id = button_value(card, ids.ANSWER)
        values = {ids.REASON_BLOCK: {ids.REASON_ACTION: "no"}}
        for user in (REQUESTER, "U0STRANGER"):
            sub = view_submission(user, ids.DENY_MODAL, request_id, values)
            response = await world.sender.action(sub)
            assert response.json and response.json["response_action"] == "errors"
        views = await world.chat.requests_of(await _run_id(world))
        assert [v.status for v in views] == [RequestStatus.OPEN]


async def test_hostile_guest_cannot_deny_through_a_forged_modal(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        request_id = button_value(card, ids.APPROVE_ONCE)
        values = {ids.REASON_BLOCK: {ids.REASON_ACTION: "nope"}}
        sub = view_submission("U0GUEST", ids.DENY_MODAL, request_id, values, user_team="T0OTHER")
        response = await world.sender.action(sub)
        assert response.json and response.json["response_action"] == "errors"
        views = await world.chat.requests_of(await _run_id(world))
        assert [v.status for v in views] == [RequestStatus.OPEN]


# --- the two-person rule ---------------------------------------------------------------------


def _two_approver_catalog(tmp: Path) -> None:
    record = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"
    catalog = {
        "tools": [
            {
                "name": "restart_service",
                "description": "Restart a service",
                "command": [sys.executable, "-c", record, str(tmp / "executions.txt"), "{service}"],
                "parameters": {
                    "type": "object",
                    "properties": {"service": {"type": "string", "pattern": "^[a-z]+$"}},
                    "required": ["service"],
                    "additionalProperties": False,
                },
                "confirm": True,
                "idempotent": False,
                "approvals": 2,
                "timeout": 10,
            }
        ]
    }
    (tmp / "two.yaml").write_text(yaml.safe_dump(catalog))


async def test_hostile_two_approver_tool_needs_two_people(tmp_path: Path) -> None:
    _two_approver_catalog(tmp_path)
    async with FakeSlackApi() as api:
        api.usergroups["S0SRE"] = [SRE]
        config = {"tools": ["two.yaml"]}
        async with slack_world(tmp_path, restart_script(), api=api, extra_config=config) as world:
            await world.mention("checkout is failing")
            card = await world.card()
            await world.settled()
            # "Approve for this run" may not stand in for two approvals.
            run_button = ids.APPROVE_RUN in json.dumps(card.args["blocks"])
            payload = _click_payload(
                world, card, ids.APPROVE_RUN, APPROVER, value=button_value(card, ids.APPROVE_ONCE)
            )
            await world.sender.action(payload)
            await world.ephemeral_to(APPROVER)
            # The same approver twice counts once; the requester never counts.
            await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
            await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
            await world.click(card, ids.APPROVE_ONCE, user=REQUESTER)
            await world.settled()
            assert world.executions == []
            views = await world.chat.requests_of(await _run_id(world))
            assert views[0].status is RequestStatus.OPEN
            await world.click(card, ids.APPROVE_ONCE, user=SRE)
            await world.answer_posted()
            assert world.executions == ["checkout"]
            assert not run_button, "a two-approver card offers 'Approve for this run'"


# --- guests ----------------------------------------------------------------------------------


async def test_hostile_guest_whose_workspace_cannot_be_looked_up_is_not_a_member(
    tmp_path: Path,
) -> None:
    """An event that says nothing of the poster's workspace (no ``user_team``, no ``team``),
    and users.info refuses (rate limited, or user_not_found for an external user): the
    poster must not become a member."""
    async with FakeSlackApi() as api:
        api.users["U0GUEST"] = {"team_id": "T0OTHER"}
        api.refuse("users.info", "ratelimited")
        async with slack_world(tmp_path, restart_script(), api=api) as world:
            event = app_mention("U0GUEST", f"<@{api.bot_user}> restart checkout")
            del event["team"]
            await world.sender.event(event)
            await world.settled()
            assert await world.chat.recent(5) == [], "a guest of unknown workspace started a run"


# --- the slash command --------------------------------------------------------------------------


async def test_hostile_slash_cancel_of_someone_elses_run_is_refused(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        await world.card()
        await world.settled()
        run_id = await _run_id(world)
        await world.sender.command(slash_command("U0STRANGER", f"cancel {run_id}"))
        note = await world.api.wait_for("response_url")
        assert "may not cancel" in note[0].args["text"]
        assert (await world.chat.status(run_id)).record.status is RunStatus.SUSPENDED
        await world.sender.command(slash_command(APPROVER, f"resume {run_id}"))
        note = await world.api.wait_for("response_url", count=2)
        assert "may not resume" in note[1].args["text"]


async def test_hostile_slash_status_of_an_unknown_run_says_so(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        for text in ("status run_doesnotexist", "cancel run_0000", "status <!channel>"):
            await world.sender.command(slash_command(ONCALL, text))
        await world.settled()
        notes = [c for c in world.api.calls_to("chat.postEphemeral")]
        replies = [c for c in world.api.calls if c.method == "response_url"]
        assert len(notes) + len(replies) == 3, (
            f"3 commands, {len(notes) + len(replies)} replies: an unknown run id gets silence"
        )


async def test_hostile_slash_command_answer_reaches_a_dm(tmp_path: Path) -> None:
    """In a DM with the bot (or a channel it is not in) chat.postEphemeral fails
    (channel_not_found / not_in_channel); the command's response_url always works."""
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        await world.card()
        await world.settled()
        run_id = await _run_id(world)
        world.api.refuse("chat.postEphemeral", "channel_not_found")
        await world.sender.command(slash_command(REQUESTER, f"status {run_id}", channel="D0DM"))
        await world.settled()

        def answered() -> list[Any]:
            return [c for c in world.api.calls if c.method == "response_url"]

        # Fails (after the wait) when the command's answer was lost: nothing reached the user.
        assert await until(answered, timeout=5)


# --- forged payloads -----------------------------------------------------------------------------


async def test_hostile_forged_payloads_change_nothing_and_say_nothing_odd(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        base = _click_payload(world, card, ids.APPROVE_ONCE, APPROVER)
        weird: list[dict[str, Any]] = []
        for value in ("", "req:1", "a" * 5000, "req_\u202e", "../../etc", None, 12, ["x"]):
            payload = json.loads(json.dumps(base))
            payload["actions"][0]["value"] = value
            weird.append(payload)
        no_user = json.loads(json.dumps(base))
        del no_user["user"]
        weird.append(no_user)
        other_action = json.loads(json.dumps(base))
        other_action["actions"][0]["action_id"] = "kestrel_approve_once_extra"
        weird.append(other_action)
        select = json.loads(json.dumps(base))
        select["actions"][0].pop("value")
        select["actions"][0]["selected_option"] = "not-a-dict"
        weird.append(select)
        for payload in weird:
            response = await world.sender.action(payload)
            assert response.status in (200, 400, 404), response.text
            assert "Traceback" not in response.text
        await world.settled()
        views = await world.chat.requests_of(await _run_id(world))
        assert [v.status for v in views] == [RequestStatus.OPEN]
        assert world.executions == []
        for call in world.api.calls_to("chat.postEphemeral"):
            text = call.args.get("text", "")
            assert "Traceback" not in text and "Error(" not in text, text


async def test_hostile_a_run_id_pasted_with_its_marks_is_the_run(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        await world.card()
        await world.settled()
        run_id = await _run_id(world)
        await world.sender.command(slash_command(ONCALL, f"status `{run_id}`:"))
        (answer,) = await world.api.wait_for("response_url")
        assert "suspended" in json.dumps(answer.args), answer.args


async def test_hostile_an_uninstall_or_a_revoked_token_is_taken_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Slack's app_uninstalled and tokens_revoked got 404 ("no listener takes this"), which
    # Slack delivers again and counts towards turning the app's events off, and the log said
    # nothing of what had happened: every card after it failed with account_inactive.
    async with slack_world(tmp_path, restart_script()) as world:
        bot = world.api.bot_user
        revoked = {"type": "tokens_revoked", "tokens": {"oauth": ["U0SOMEONE"], "bot": []}}
        assert (await world.sender.event(revoked)).status == 200
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
        for event in (
            {"type": "tokens_revoked", "tokens": {"bot": [bot]}},
            {"type": "app_uninstalled"},
        ):
            response = await world.sender.event(event)
            assert response.status == 200, response.text
        said = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(said) == 2, said
        assert all("T0001" in line and "`kestrel runs pending`" in line for line in said), said
        assert "token was revoked" in said[0] and "uninstalled" in said[1], said
        assert not [r for r in caplog.records if "no listener" in r.getMessage()]


async def test_hostile_another_workspaces_uninstall_is_not_said_as_ours(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The app installed in two workspaces of an Enterprise Grid org (one bot user across the
    # org), Kestrel serving T0001: removed from T0OTHER, Slack delivered the events for
    # T0OTHER through T0001's installation (the one left), and Kestrel said at error level that
    # it was uninstalled, and its token revoked, in T0001 itself.
    caplog.set_level(logging.INFO, logger="kestrel.slack")
    async with slack_world(tmp_path, restart_script()) as world:
        bot = world.api.bot_user
        ours = [{"enterprise_id": "E0001", "team_id": "T0001", "user_id": bot, "is_bot": True}]
        for event in (
            {"type": "tokens_revoked", "tokens": {"bot": [bot]}},
            {"type": "app_uninstalled"},
        ):
            sent = await world.sender.event(
                event, team="T0OTHER", authorizations=ours, enterprise_id="E0001"
            )
            assert sent.status == 200, sent.text
        loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert not loud, loud
        noted = [r.getMessage() for r in caplog.records if "T0OTHER" in r.getMessage()]
        assert len(noted) == 2, noted
        # Its own workspace's, with no installation left to name: said, naming it; and the
        # org's own, which may be Kestrel's too, is said rather than passed over.
        sent = await world.sender.event({"type": "app_uninstalled"}, authorizations=[])
        assert sent.status == 200, sent.text
        sent = await world.sender.event(
            {"type": "app_uninstalled"}, team="E0001", authorizations=[], enterprise_id="E0001"
        )
        assert sent.status == 200, sent.text
        said = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(said) == 2 and "T0001" in said[0] and "E0001" in said[1], said
