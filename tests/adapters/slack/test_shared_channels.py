"""A Slack Connect channel that another workspace shared with ours: its events name that
workspace in ``team_id`` and ours in ``authorizations``; clicks on Kestrel's cards name ours in
``team.id`` and the clicker's own in ``user.team_id``. A run there lives in our workspace, so
the approver's click from its thread counts. And Enterprise Grid: a person's team may be the
org's id, which users.info resolves to the workspaces they are in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.slack import ids
from adapters.slack.app import SlackAdapter
from adapters.slack.settings import SlackSettings
from bot.chat.contract import ConfigError
from tests.fakes.slack_api import FakeSlackApi
from tests.fakes.slack_client import app_mention, block_actions, slash_command
from tests.fakes.slack_world import (
    APPROVER,
    REQUESTER,
    button_value,
    posted_ts,
    restart_script,
    slack_world,
)

OURS, THEIRS, ORG = "T0001", "T0THEIRS", "E0001"
SHARED = "C0SHARED"  # begun in THEIRS, shared with OURS


async def test_a_run_in_a_channel_another_workspace_shared_is_decided_from_its_thread(
    tmp_path: Path,
) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        mention = app_mention(REQUESTER, "checkout is failing", channel=SHARED, team=OURS)
        ours = {"team_id": OURS, "user_id": world.api.bot_user, "is_bot": True}
        sent = await world.sender.event(
            mention, team=THEIRS, authorizations=[ours], is_ext_shared_channel=True
        )
        assert sent.status == 200
        card = await world.card()
        assert card.args["channel"] == SHARED

        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        await world.answer_posted()
        assert world.executions == ["checkout"]
        run = (await world.chat.recent(1))[0]
        assert run.session_id.startswith(f"slack:{OURS}:{SHARED}:")


async def test_a_guest_cancels_their_run_with_the_slash_command_from_its_channel(
    tmp_path: Path,
) -> None:
    # A slash command's team_id is the workspace of the person who typed it (where they were
    # in Slack), not the one Kestrel is installed in: a guest's command from the run's own
    # channel was taken to come from their workspace's channel, not the run's, and refused.
    guest, theirs_user = "U0GUEST", {"team_id": THEIRS}
    policy = {"requesters": [REQUESTER, guest]}
    async with slack_world(tmp_path, restart_script(), extra_policy=policy) as world:
        world.api.users[guest] = theirs_user
        mention = app_mention(guest, "checkout is failing", channel=SHARED, user_team=THEIRS)
        ours = {"team_id": OURS, "user_id": world.api.bot_user, "is_bot": True}
        await world.sender.event(
            mention, team=THEIRS, authorizations=[ours], is_ext_shared_channel=True
        )
        await world.card()
        run = (await world.chat.recent(1))[0]

        typed = slash_command(guest, f"cancel {run.id}", channel=SHARED, team=THEIRS)
        assert (await world.sender.command(typed)).status == 200
        [answer] = await world.api.wait_for("response_url")
        assert answer.args.get("text") == "cancelled", answer.args
        assert (await world.chat.status(run.id)).record.status.value == "cancelled"


async def test_a_guest_is_told_apart_by_slack_not_by_the_commands_team(tmp_path: Path) -> None:
    # Which workspace a slash command's team_id names for a guest of a shared channel is not
    # something Slack documents; users.info is. Taking that team_id for the typist's own made a
    # guest whose command named our workspace one of ours: on-call for the channel's runs
    # (``channel:ID``, which never names a guest) let them cancel a run of ours.
    guest = "U0GUEST"
    policy = {"oncall": [f"channel:{SHARED}"]}
    async with slack_world(tmp_path, restart_script(), extra_policy=policy) as world:
        world.api.users[guest] = {"team_id": THEIRS}
        mention = app_mention(REQUESTER, "checkout is failing", channel=SHARED, team=OURS)
        ours = {"team_id": OURS, "user_id": world.api.bot_user, "is_bot": True}
        await world.sender.event(
            mention, team=THEIRS, authorizations=[ours], is_ext_shared_channel=True
        )
        await world.card()
        run = (await world.chat.recent(1))[0]

        typed = slash_command(guest, f"cancel {run.id}", channel=SHARED, team=OURS)
        await world.sender.command(typed)
        [answer] = await world.api.wait_for("response_url")
        assert "may not cancel" in json.dumps(answer.args), answer.args
        assert (await world.chat.status(run.id)).record.status.value != "cancelled"


async def test_a_guest_named_by_their_id_approves_from_the_shared_channels_thread(
    tmp_path: Path,
) -> None:
    # A click on Kestrel's card in a Slack Connect channel names, in ``team.id``, the workspace
    # of the app's installation that posted the card, and the clicker's own in
    # ``user.team_id`` (bolt authorizes the click by ``team.id``): the run's place holds, and
    # the guest is a guest, named only by their own id.
    guest, other = "U0GUEST", "U0GUEST2"
    policy = {"approvers": {"*": ["*", guest]}}
    async with slack_world(tmp_path, restart_script(), extra_policy=policy) as world:
        world.api.users[guest] = world.api.users[other] = {"team_id": THEIRS}
        mention = app_mention(REQUESTER, "checkout is failing", channel=SHARED, team=OURS)
        ours = {"team_id": OURS, "user_id": world.api.bot_user, "is_bot": True}
        await world.sender.event(
            mention, team=THEIRS, authorizations=[ours], is_ext_shared_channel=True
        )
        card = await world.card()
        await world.click(card, ids.APPROVE_ONCE, user=other, user_team=THEIRS)
        note = await world.ephemeral_to(other)
        assert "may not approve" in note.args["text"], note.args  # "*" is ours only
        await world.click(card, ids.APPROVE_ONCE, user=guest, user_team=THEIRS)
        await world.answer_posted()
        assert world.executions == ["checkout"]


async def test_a_grid_member_whose_click_names_the_org_is_one_of_ours(tmp_path: Path) -> None:
    # On Enterprise Grid a click's ``user.team_id`` (an event's ``user_team``) may be the
    # org's id (E…), which says no workspace: taken for another workspace's, every member of
    # ours was a guest, whom ``*``, groups and ``channel:`` never name. Slack's users.info
    # says which workspaces of the org they are in; one of another workspace stays a guest.
    member, elsewhere = "W0SRE", "W0ELSEWHERE"
    async with FakeSlackApi() as api:
        api.enterprise = ORG
        api.usergroups["S0SRE"] = [member, elsewhere]
        api.users[member] = {"team_id": ORG, "enterprise_user": {"teams": ["T0002", OURS]}}
        api.users[elsewhere] = {"team_id": "T0002", "enterprise_user": {"teams": ["T0002"]}}
        async with slack_world(tmp_path, restart_script(), api=api) as world:
            await world.mention("checkout is failing")
            card = await world.card()
            await world.settled()
            for user in (elsewhere, member):
                payload = block_actions(
                    user,
                    ids.APPROVE_ONCE,
                    button_value(card, ids.APPROVE_ONCE),
                    channel=card.args["channel"],
                    message_ts=posted_ts(api, card),
                    thread_ts=card.args.get("thread_ts"),
                    user_team=ORG,
                )
                payload["team"]["enterprise_id"] = ORG
                payload["enterprise"] = {"id": ORG, "name": "Org"}
                assert (await world.sender.action(payload)).status == 200
                if user == elsewhere:
                    note = await world.ephemeral_to(elsewhere)
                    assert f"{elsewhere} may not approve" in note.args["text"], note.args
            await world.answer_posted()
            assert world.executions == ["checkout"]


async def test_a_grid_member_slack_did_not_place_is_told_so(tmp_path: Path) -> None:
    # Named by the org's id, a member is placed by users.info alone: when Slack does not
    # answer it, they count as a guest for that click, and must not read "only ... may" as if
    # they were no approver: the refusal says what Slack did not say, and to try again.
    member = "W0SRE"
    async with FakeSlackApi() as api:
        api.enterprise = ORG
        api.usergroups["S0SRE"] = [member]
        api.users[member] = {"team_id": ORG, "enterprise_user": {"teams": [OURS]}}
        async with slack_world(tmp_path, restart_script(), api=api) as world:
            await world.mention("checkout is failing")
            card = await world.card()
            await world.settled()
            api.fail("users.info", error="internal_error", status=500, times=1)
            for attempt in (1, 2):
                payload = block_actions(
                    member,
                    ids.APPROVE_ONCE,
                    button_value(card, ids.APPROVE_ONCE),
                    channel=card.args["channel"],
                    message_ts=posted_ts(api, card),
                    thread_ts=card.args.get("thread_ts"),
                    user_team=ORG,
                )
                assert (await world.sender.action(payload)).status == 200
                if attempt == 1:
                    note = await world.ephemeral_to(member)
                    assert note.args["text"].endswith(
                        f"; Slack did not say which workspace {member} is of, which counts as"
                        " no here: try again in a moment"
                    ), note.args["text"]
            await world.answer_posted()
            assert world.executions == ["checkout"]


async def test_an_org_wide_installations_token_is_refused_at_start(tmp_path: Path) -> None:
    # An org-wide token acts for many workspaces: clicks may name none (``team`` null) and
    # user group lookups need a team_id. Kestrel serves one workspace, and says so at start.
    async with FakeSlackApi() as api, slack_world(tmp_path, restart_script(), api=api) as world:
        org_wide = {"ok": True, "team_id": ORG, "user_id": "UBOT", "is_enterprise_install": True}
        api.set_handler("auth.test", lambda call: org_wide)
        settings = SlackSettings(bot_token="xoxb-org", signing_secret="s", api_url=api.url)
        adapter = SlackAdapter(world.chat, world.rt.store, "org-owner", settings)
        with pytest.raises(ConfigError, match="organisation-wide"):
            await adapter.start()


async def test_a_mention_slack_names_another_installation_for_is_a_run_of_ours(
    tmp_path: Path,
) -> None:
    # Where the app is installed in both workspaces of a shared channel (an org's workspaces
    # each installing it), Slack names one installation in ``authorizations``, either one. A
    # mention named for the other's was a run of that workspace: its card, posted by Kestrel
    # in the channel, named ours on every click, and every click was refused as "in another
    # workspace", so nobody could decide it; and the mention named once for each was two runs.
    async with slack_world(tmp_path, restart_script()) as world:
        mention = app_mention(REQUESTER, "checkout is failing", channel=SHARED, team=OURS)
        theirs = {"team_id": THEIRS, "user_id": "U0THEIRBOT", "is_bot": True}
        ours = {"team_id": OURS, "user_id": world.api.bot_user, "is_bot": True}
        for authorizations in ([theirs], [ours]):
            sent = await world.sender.event(
                mention, team=THEIRS, authorizations=authorizations, is_ext_shared_channel=True
            )
            assert sent.status == 200
        card = await world.card()
        await world.settled()
        [run] = await world.chat.recent(5)
        assert run.session_id.startswith(f"slack:{OURS}:{SHARED}:"), run.session_id

        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        await world.answer_posted()
        assert world.executions == ["checkout"]
