"""A card's button pressed from where its run does not live, the card itself in hand: a thread
of another channel of the server, a direct message. Discord names the place in the
interaction; the click decides nothing, says where the run is, and is audited from there."""

from __future__ import annotations

from pathlib import Path

from bot.domain import RequestStatus
from tests.adapters.discord.test_hostile_clicks import said
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.discord_world import APPROVER, DiscordWorld, button_id, discord_world
from tests.fakes.slack_world import restart_script

OTHER = "210"  # another text channel of the server
GUILDS = {
    p.GUILD_ID: {"channels": {p.CHANNEL_ID: "ops", OTHER: "dev"}, "roles": {p.ROLE_ID: "sre"}}
}


async def _refused(world: DiscordWorld) -> list[str]:
    run_id = (await world.chat.recent(1))[0].id
    [view] = await world.chat.requests_of(run_id)
    assert view.status is RequestStatus.OPEN and world.executions == []
    audit = await world.rt.store.list_audit(run_id)
    return [a.detail for a in audit if a.action == "approve_refused"]


async def test_the_card_clicked_from_a_thread_of_another_channel_decides_nothing(
    tmp_path: Path,
) -> None:
    async with FakeDiscord(guilds=GUILDS) as fake:
        elsewhere = fake.add_thread(OTHER, name="dev chatter")
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            await world.thread_of(await world.mention("checkout is failing"))
            card = await world.card("approve")
            click = p.interaction_button(
                custom_id=button_id(card, "approve"),
                channel=elsewhere,
                user_id=APPROVER,
                message=card,
            )
            await world.discord.dispatch("INTERACTION_CREATE", click)
            told = await said(world, click)
            assert "is in another channel" in told, told
            [detail] = await _refused(world)
            assert detail.endswith(f"(acted from discord:{p.GUILD_ID}:{OTHER}:{elsewhere['id']})")


async def test_the_card_clicked_from_a_direct_message_decides_nothing(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        await world.thread_of(await world.mention("checkout is failing"))
        card = await world.card("approve")
        dm = p.dm_channel("900", recipient=p.user(APPROVER))
        click = p.interaction_button(
            custom_id=button_id(card, "approve"),
            guild=None,
            channel=dm,
            user_id=APPROVER,
            message=card,
        )
        await world.discord.dispatch("INTERACTION_CREATE", click)
        told = await said(world, click)
        assert "is in another server" in told, told
        [detail] = await _refused(world)
        assert detail.endswith("(acted from discord:900)"), detail
