"""A run in a private thread: Discord shows that thread only to its members and to those who
manage threads, so ``/kestrel runs`` and ``/kestrel status`` show its run to no one else, from
its channel or from anywhere else in the server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.discord_world import ONCALL, REQUESTER, DiscordWorld, discord_world
from tests.fakes.slack_world import restart_script

MANAGE_THREADS = 1 << 34
MEMBER = "1004"  # in the private thread
STRANGER = "1999"  # in #ops, not in the private thread


async def _command(
    world: DiscordWorld, verb: str, *, channel: str | dict[str, Any], user: str, run: str = ""
) -> str:
    options: list[dict[str, Any]] = [{"name": "run", "type": 3, "value": run}] if run else []
    data = p.interaction_command(
        options=[{"name": verb, "type": 1, "options": options}], channel=channel, user_id=user
    )
    await world.discord.dispatch("INTERACTION_CREATE", data)
    return await world.answered(data)


def _guild_with_a_private_thread(fake: FakeDiscord) -> tuple[dict[str, Any], dict[str, Any]]:
    """#ops, where nobody manages threads, with a private thread of its own and a public one."""
    deny = {"id": p.GUILD_ID, "type": 0, "allow": "0", "deny": str(MANAGE_THREADS)}
    fake.channels[p.CHANNEL_ID]["permission_overwrites"] = [deny]
    private = fake.add_thread(type=p.PRIVATE_THREAD, owner_id=REQUESTER, name="incident")
    fake.thread_members[private["id"]] = {REQUESTER, MEMBER, p.BOT_ID}
    public = fake.add_thread(name="chatter")
    return private, public


async def test_a_private_threads_run_is_read_only_by_those_who_see_the_thread(
    tmp_path: Path,
) -> None:
    async with FakeDiscord() as fake:
        private, public = _guild_with_a_private_thread(fake)
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            await world.mention("checkout is failing", channel=private["id"])
            await world.card("approve")
            await world.settled()
            run = (await world.chat.recent(1))[0].id

            # Someone of #ops who is not in the thread: from #ops, or from another thread of
            # it, the run is neither listed nor shown.
            for where in (p.CHANNEL_ID, public):
                listed = await _command(world, "runs", channel=where, user=STRANGER)
                assert "restart_service" not in listed and private["id"] not in listed, listed
                shown = await _command(world, "status", channel=where, user=STRANGER, run=run)
                assert "that you can see" in shown and "restart_service" not in shown, shown

            # Archived, the thread leaves the gateway's cache: Discord is asked what it is.
            await fake.dispatch("THREAD_UPDATE", fake.archive(private["id"]))
            listed = await _command(world, "runs", channel=p.CHANNEL_ID, user=STRANGER)
            assert "restart_service" not in listed, listed

            # A member of the thread, and on-call, read it from #ops.
            for reader in (MEMBER, ONCALL):
                listed = await _command(world, "runs", channel=p.CHANNEL_ID, user=reader)
                assert "restart_service" in listed, listed
                shown = await _command(world, "status", channel=p.CHANNEL_ID, user=reader, run=run)
                assert "restart_service" in shown, shown
