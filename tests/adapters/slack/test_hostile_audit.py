"""Every refusal in Slack is audited, with where it came from, and changes nothing: a form
refused as it opens, and a click on something that is not the request's card."""

from __future__ import annotations

from pathlib import Path

from adapters.slack import ids
from bot.domain import RequestStatus
from tests.adapters.slack.test_hostile_authority import _said
from tests.fakes.slack_client import block_actions
from tests.fakes.slack_world import (
    APPROVER,
    CHANNEL,
    REQUESTER,
    SlackWorld,
    button_value,
    question_script,
    restart_script,
    slack_world,
)

STRANGER = "U0STRANGER"


async def _refusals(world: SlackWorld) -> list[tuple[str, str, str]]:
    run_id = (await world.chat.recent(1))[0].id
    audit = await world.rt.store.list_audit(run_id, limit=100)
    return [(str(r.action), r.actor, r.detail) for r in audit if str(r.action).endswith("_refused")]


async def _statuses(world: SlackWorld) -> list[RequestStatus]:
    run_id = (await world.chat.recent(1))[0].id
    return [view.status for view in await world.chat.requests_of(run_id)]


async def test_a_deny_form_refused_as_it_opens_is_audited(tmp_path: Path) -> None:
    # Deny opens a form only for someone who may deny: anyone else is refused at the click.
    # That refusal was said, but never audited, so a member probing who may deny a production
    # restart left no trace, though every other refusal of a decision does.
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        await world.click(card, ids.DENY, user=STRANGER)
        note = await world.ephemeral_to(STRANGER)
        assert note.args["text"].startswith(f"{STRANGER} may not deny restart_service"), note.args
        assert world.api.calls_to("views.open") == []
        [(action, actor, detail)] = await _refusals(world)
        assert (action, actor) == ("deny_refused", STRANGER)
        assert detail.startswith(f"{STRANGER} may not deny restart_service"), detail
        assert await _statuses(world) == [RequestStatus.OPEN]


async def test_an_answer_form_refused_as_it_opens_is_audited(tmp_path: Path) -> None:
    async with slack_world(tmp_path, question_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card(ids.ANSWER)
        await world.settled()
        await world.click(card, ids.ANSWER, user=APPROVER)
        note = await world.ephemeral_to(APPROVER)
        assert "may not answer this question" in note.args["text"], note.args
        [(action, actor, _detail)] = await _refusals(world)
        assert (action, actor) == ("answer_refused", APPROVER)
        assert await _statuses(world) == [RequestStatus.OPEN]


async def test_a_click_off_the_requests_card_is_audited_with_where_it_came_from(
    tmp_path: Path,
) -> None:
    # A click on a message that is not the request's card is refused before its place is
    # weighed; its audit said only "not on that request's card", not from which channel and
    # thread: an auditor could not tell a stale card in the run's thread from a click elsewhere.
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        payload = block_actions(
            APPROVER,
            ids.APPROVE_ONCE,
            button_value(card, ids.APPROVE_ONCE),
            channel="C0OTHER",
            message_ts="1700000000.000777",
            thread_ts="1700000000.000700",
        )
        assert (await world.sender.action(payload)).status == 200
        note = await world.ephemeral_to(APPROVER)
        assert note.args["text"] == "this button is not on that request's card", note.args
        [(action, actor, detail)] = await _refusals(world)
        assert (action, actor) == ("approve_refused", APPROVER)
        assert detail == (
            "this button is not on that request's card"
            " (acted from slack:T0001:C0OTHER:1700000000.000700)"
        ), detail
        assert await _statuses(world) == [RequestStatus.OPEN]
        assert world.executions == []


async def test_a_status_refused_from_elsewhere_is_audited_as_a_cancel_is(tmp_path: Path) -> None:
    # /kestrel cancel and resume RUN typed elsewhere by someone who may not see the run were
    # audited (cancel_refused, resume_refused); /kestrel status RUN, refused the same way, was
    # not: a stranger trying run ids from another channel left no trace of reading.
    async with slack_world(tmp_path, restart_script()) as world:
        world.api.channel_members[CHANNEL] = [REQUESTER]
        await world.mention("checkout is failing")
        await world.card()
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id
        said = await _said(world, STRANGER, f"status {run_id}", "C0OTHER", "T0001")
        assert said == f"There is no run {run_id} that you can see.", said
        assert await _refusals(world) == [
            (
                "show_refused",
                STRANGER,
                f"{STRANGER} may not see run {run_id} (acted from slack:T0001:C0OTHER)",
            )
        ]
        said = await _said(world, REQUESTER, f"status {run_id}", "C0OTHER", "T0001")
        assert said == f"Run {run_id}: suspended", said
        assert len(await _refusals(world)) == 1


async def test_a_refused_start_is_audited_with_where_it_was_asked(tmp_path: Path) -> None:
    # A refused start belongs to no run: its audit row, without the place, said who was
    # refused but not in which channel and thread they asked.
    policy = {"requesters": [REQUESTER]}
    async with slack_world(tmp_path, restart_script(), extra_policy=policy) as world:
        mention = await world.mention("restart checkout", user=STRANGER)
        note = await world.ephemeral_to(STRANGER)
        assert note.args["text"].startswith(f"{STRANGER} may not start runs"), note.args
        await world.settled()
        assert await world.chat.recent(1) == []
        rows = await world.rt.store.list_audit(action="start_refused")
        assert [(r.actor, r.detail) for r in rows] == [
            (
                STRANGER,
                f"{STRANGER} may not start runs: only {REQUESTER} may (policy.requesters)"
                f" (acted from slack:T0001:{CHANNEL}:{mention['ts']})",
            )
        ]
