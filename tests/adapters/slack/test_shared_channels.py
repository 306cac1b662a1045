"""A Slack Connect channel that another workspace shared with ours: its events name that
workspace in ``team_id`` and ours in ``authorizations``; clicks on Kestrel's cards name ours.
A run there lives in our workspace, so the approver's click from its thread counts."""

from __future__ import annotations

import json
from pathlib import Path

from adapters.slack import ids
from tests.fakes.slack_client import app_mention, slash_command
from tests.fakes.slack_world import APPROVER, REQUESTER, restart_script, slack_world

OURS, THEIRS = "T0001", "T0THEIRS"
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
