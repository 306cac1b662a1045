"""A run's place in Slack, against the real bolt app: reads and decisions that try to reach a
run from somewhere else than where it lives."""

from __future__ import annotations

import json
from pathlib import Path

from adapters.slack import ids
from tests.fakes.slack_api import Call
from tests.fakes.slack_client import block_actions, slash_command
from tests.fakes.slack_world import (
    APPROVER,
    CHANNEL,
    REQUESTER,
    SlackWorld,
    button_value,
    posted_ts,
    restart_script,
    slack_world,
)

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


async def test_a_click_from_elsewhere_says_where_the_run_lives_to_whoever_may_see_it(
    tmp_path: Path,
) -> None:
    # A click on a run's card from another place was told "request … belongs to a run of
    # another channel: act on it from that run's thread (this came from slack:T0001:C0001:9.9)":
    # "another channel" from the very same channel, an address in the store's notation, and
    # nothing saying where that thread is.
    async with slack_world(tmp_path, restart_script()) as world:
        world.api.channel_members[CHANNEL] = [APPROVER]
        mention = await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        link = f"https://app.slack.com/client/T0001/{CHANNEL}/thread/{CHANNEL}-{mention['ts']}"

        async def told(user: str, channel: str, thread_ts: str) -> str:
            payload = block_actions(
                user,
                ids.APPROVE_ONCE,
                button_value(card, ids.APPROVE_ONCE),
                channel=channel,
                message_ts=posted_ts(world.api, card),
                thread_ts=thread_ts,
            )

            def to_user(call: Call) -> bool:
                return call.method == "chat.postEphemeral" and call.args.get("user") == user

            before = len([c for c in world.api.calls if to_user(c)])
            assert (await world.sender.action(payload)).status == 200
            calls = await world.api.wait_for(to_user, count=before + 1)
            return str(calls[-1].args["text"])

        # Another thread of the run's own channel: said so, with the run's thread.
        note = await told(APPROVER, CHANNEL, "9.9")
        assert "another thread of this channel" in note and link in note, note
        # Another channel, by a member of the run's: that thread, named by its link.
        note = await told(APPROVER, "C0OTHER", "8.8")
        assert "another channel" in note and link in note, note
        # Another channel, by someone who is not in the run's: neither its link nor its id.
        note = await told(STRANGER, "C0OTHER", "8.8")
        assert "another channel" in note and "linked only for those" in note, note
        assert CHANNEL not in note and mention["ts"] not in note, note
        for note in [c.args["text"] for c in world.api.calls_to("chat.postEphemeral")]:
            assert "slack:T0001" not in note and "belongs to a run of" not in note, note
        assert world.executions == []


async def test_a_member_whose_lookup_fails_is_not_told_they_cannot_see_the_thread(
    tmp_path: Path,
) -> None:
    # Slack did not say who is in the run's channel (an error, a time-out): the link was kept
    # back, as it should be, but a member of that channel was told the run is "in a thread you
    # cannot see", which is not so, and no reason to stop looking for it.
    async with slack_world(tmp_path, restart_script()) as world:
        world.api.channel_members[CHANNEL] = [APPROVER]
        mention = await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        world.api.fail("conversations.members", error="internal_error", status=200, times=None)
        payload = block_actions(
            APPROVER,
            ids.APPROVE_ONCE,
            button_value(card, ids.APPROVE_ONCE),
            channel="C0OTHER",
            message_ts=posted_ts(world.api, card),
            thread_ts="8.8",
        )
        assert (await world.sender.action(payload)).status == 200
        [call] = await world.api.wait_for("chat.postEphemeral")
        note = str(call.args["text"])
        assert "another channel" in note and "on-call" in note, note
        assert "cannot see" not in note, note
        assert CHANNEL not in note and mention["ts"] not in note, note
        assert len(await world.rt.store.list_audit(action="approve_refused")) == 1
        assert world.executions == []
