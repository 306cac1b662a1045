"""A run's place in Slack, against the real bolt app: reads and decisions that try to reach a
run from somewhere else than where it lives."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes.slack_client import slash_command
from tests.fakes.slack_world import CHANNEL, REQUESTER, SlackWorld, restart_script, slack_world

STRANGER = "U0STRANGER"  # in the workspace, not a member of the run's channel


async def _command(world: SlackWorld, user: str, text: str, channel: str) -> str:
    """``/kestrel TEXT`` as ``user`` in ``channel``; what it answered."""
    url = world.api.new_response_url()
    form = slash_command(user, text, channel=channel, response_url=url)
    assert (await world.sender.command(form)).status == 200
    replies = await world.api.wait_for(
        lambda c: c.method == "response_url" and url.endswith(c.path), timeout=10
    )
    return json.dumps(replies[-1].args)


async def test_channel_oncall_reads_a_run_only_from_its_channel(tmp_path: Path) -> None:
    # oncall: channel:C0001 names whoever acts on a #C0001 run from its thread (docs/slack.md),
    # not anyone anywhere in the workspace.
    policy = {"oncall": [f"channel:{CHANNEL}"]}
    async with slack_world(tmp_path, restart_script(), extra_policy=policy) as world:
        world.api.channel_members[CHANNEL] = [REQUESTER]
        world.api.channel_members["C0OTHER"] = [STRANGER]
        await world.mention("checkout is failing")
        await world.card()
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id
        told = await _command(world, STRANGER, f"status {run_id}", "C0OTHER")
        assert "that you can see" in told and "checkout is failing" not in told
        assert "restart_service" not in await _command(world, STRANGER, "runs", "C0OTHER")
        # From the run's channel, the same person is on-call for it and sees it.
        assert "checkout is failing" in await _command(world, STRANGER, f"status {run_id}", CHANNEL)


async def test_a_member_reads_a_run_from_its_channel_while_slack_limits_lookups(
    tmp_path: Path,
) -> None:
    # A Slack thread shows to everyone in its channel: from the run's channel, /kestrel status
    # and runs need not ask Slack who is in it, which a busy workspace finds rate limited.
    async with slack_world(tmp_path, restart_script()) as world:
        world.api.fail("conversations.members", times=None)
        await world.mention("checkout is failing")
        await world.card()
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id
        told = await _command(world, REQUESTER, f"status {run_id}", CHANNEL)
        assert "checkout is failing" in told
        assert "restart_service" in await _command(world, REQUESTER, "runs", CHANNEL)
        # From another channel the lookup still decides, and a failed one is a no.
        told = await _command(world, REQUESTER, f"status {run_id}", "C0OTHER")
        assert "checkout is failing" not in told
