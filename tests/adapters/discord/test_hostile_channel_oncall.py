"""``oncall: ["channel:ID"]`` names people acting on the runs of that channel: in Slack, a
thread shows to its whole channel, so whoever acts from the channel sees the thread. A Discord
private thread shows to fewer people than its channel: someone of the channel who is not in it
neither reads its run nor cancels or resumes it from the channel, channel on-call or not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.discord_world import REQUESTER, DiscordWorld, discord_world
from tests.fakes.slack_world import restart_script

STRANGER = "1999"  # of the channel, not of its private thread
MANAGE_THREADS = 1 << 34


async def _command(world: DiscordWorld, verb: str, run: str, channel: str) -> str:
    option: dict[str, Any] = {"name": "run", "type": 3, "value": run}
    data = p.interaction_command(
        options=[{"name": verb, "type": 1, "options": [option]}],
        guild=p.GUILD_ID,
        channel=channel,
        user_id=STRANGER,
    )
    await world.discord.dispatch("INTERACTION_CREATE", data)
    return await world.answered(data)


async def test_channel_oncall_outside_a_private_thread_neither_reads_nor_cancels_its_run(
    tmp_path: Path,
) -> None:
    async with FakeDiscord() as fake:
        private = fake.add_thread(owner_id=REQUESTER, type=p.PRIVATE_THREAD, name="incident")
        everyone = {"id": p.GUILD_ID, "type": 0, "allow": "0", "deny": str(MANAGE_THREADS)}
        fake.channels[p.CHANNEL_ID]["permission_overwrites"] = [everyone]
        policy = {"oncall": [f"channel:{p.CHANNEL_ID}"]}
        async with discord_world(
            tmp_path, restart_script(), fake=fake, extra_policy=policy
        ) as world:
            await world.mention("checkout is failing", channel=private["id"])
            await world.card("approve")
            await world.settled()
            run = (await world.chat.recent(1))[0].id
            unseen = f"There is no run {run} that you can see."
            for verb in ("status", "cancel", "resume"):
                said = await _command(world, verb, run, p.CHANNEL_ID)
                assert said == unseen, (verb, said)
            assert (await world.chat.status(run)).record.status.value == "suspended"
            assert world.executions == []
            # From inside the thread, channel on-call is on-call for the run.
            said = await _command(world, "cancel", run, private["id"])
            assert said == "cancelled", said
