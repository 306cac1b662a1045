"""Every refusal in Discord is audited and changes nothing: a form refused as it opens, a
status refused to someone outside a private thread."""

from __future__ import annotations

from pathlib import Path

from bot.domain import RequestStatus
from tests.adapters.discord.test_hostile_clicks import said
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.discord_world import APPROVER, REQUESTER, discord_world
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


async def test_a_status_refused_outside_a_private_thread_is_audited(tmp_path: Path) -> None:
    # /kestrel status RUN from the channel of a private thread the typist is not in says there
    # is no such run they can see, as cancel and resume do; those were audited, status not.
    async with FakeDiscord() as fake:
        private = fake.add_thread(owner_id=REQUESTER, type=p.PRIVATE_THREAD, name="incident")
        manage_threads = 1 << 34
        everyone = {"id": p.GUILD_ID, "type": 0, "allow": "0", "deny": str(manage_threads)}
        fake.channels[p.CHANNEL_ID]["permission_overwrites"] = [everyone]
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            await world.mention("checkout is failing", channel=private["id"])
            await world.card("approve")
            await world.settled()
            run = (await world.chat.recent(1))[0].id
            option = {"name": "run", "type": 3, "value": run}
            data = p.interaction_command(
                options=[{"name": "status", "type": 1, "options": [option]}],
                guild=p.GUILD_ID,
                channel=p.CHANNEL_ID,
                user_id=STRANGER,
            )
            await world.discord.dispatch("INTERACTION_CREATE", data)
            shown = await world.answered(data)
            assert "restart_service" not in shown, shown
            refused = [
                (a.action, a.actor, a.detail)
                for a in await world.rt.store.list_audit(run)
                if a.action.endswith("_refused")
            ]
            where = f"discord:{p.GUILD_ID}:{p.CHANNEL_ID}"
            assert refused == [
                ("show_refused", STRANGER, f"{STRANGER} may not see run {run} (acted from {where})")
            ], refused
