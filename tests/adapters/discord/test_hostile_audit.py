"""Every refusal in Discord is audited and changes nothing: a form refused as it opens."""

from __future__ import annotations

from pathlib import Path

from bot.domain import RequestStatus
from tests.adapters.discord.test_hostile_clicks import said
from tests.fakes.discord_world import APPROVER, discord_world
from tests.fakes.slack_world import question_script, restart_script

STRANGER = "1500"


async def test_a_deny_form_refused_as_it_opens_is_audited(tmp_path: Path) -> None:
    # Deny opens a form only for someone who may deny; anyone else was refused at the click,
    # unaudited, unlike every other refusal of a decision.
    async with discord_world(tmp_path, restart_script()) as world:
        await world.thread_of(await world.mention("checkout is failing"))
        card = await world.card("approve")
        click = await world.click(card, "deny", user=STRANGER)
        told = await said(world, click)
        assert told.startswith(f"{STRANGER} may not deny restart_service"), told
        assert world.discord.modals == []
        run_id = (await world.chat.recent(1))[0].id
        refused = [
            (a.action, a.actor, a.detail)
            for a in await world.rt.store.list_audit(run_id)
            if a.action.endswith("_refused")
        ]
        assert refused == [("deny_refused", STRANGER, told)], refused
        [view] = await world.chat.requests_of(run_id)
        assert view.status is RequestStatus.OPEN


async def test_an_answer_form_refused_as_it_opens_is_audited(tmp_path: Path) -> None:
    async with discord_world(tmp_path, question_script()) as world:
        await world.thread_of(await world.mention("checkout is failing"))
        card = await world.card("answer")
        click = await world.click(card, "answer", user=APPROVER)
        assert "may not answer this question" in await said(world, click)
        run_id = (await world.chat.recent(1))[0].id
        actions = [(a.action, a.actor) for a in await world.rt.store.list_audit(run_id)]
        assert ("answer_refused", APPROVER) in actions, actions
        [view] = await world.chat.requests_of(run_id)
        assert view.status is RequestStatus.OPEN
