"""``/kestrel status|cancel|resume|runs``: on-call's commands, answered to the person alone."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import discord
from discord import app_commands

from adapters.discord import ids
from adapters.discord.directory import interaction_actor
from adapters.discord.look import note_text, runs_listing, status_text
from adapters.discord.respond import deferred, kestrel_of, say_store_failed
from adapters.discord.target import DiscordTarget
from bot.chat.contract import StoreError
from bot.chat.conversation import run_id_said
from bot.chat.words import thread_of, unseen_run
from bot.domain import Session

if TYPE_CHECKING:
    from adapters.discord.client import KestrelDiscord


def kestrel_commands() -> app_commands.Group:
    group = app_commands.Group(name="kestrel", description="Kestrel's runs", guild_only=True)

    @group.command(name="status", description="Where a run stands (default: this thread's)")
    async def status(interaction: discord.Interaction, run: str | None = None) -> None:
        await _operate(interaction, "status", run)

    @group.command(name="cancel", description="Cancel a run (its requester or on-call)")
    async def cancel(interaction: discord.Interaction, run: str | None = None) -> None:
        await _operate(interaction, "cancel", run)

    @group.command(name="resume", description="Resume a suspended run (its requester or on-call)")
    async def resume(interaction: discord.Interaction, run: str | None = None) -> None:
        await _operate(interaction, "resume", run)

    @group.command(name="runs", description="What waits on people, with links to the threads")
    async def runs(interaction: discord.Interaction) -> None:
        if not await deferred(interaction):
            return  # Discord told them it failed
        try:
            lines = await _pending_lines(interaction)
        except StoreError as exc:
            await say_store_failed(interaction, "/kestrel runs", exc)
            return
        await interaction.followup.send(runs_listing(lines), ephemeral=True)

    return group


async def _pending_lines(interaction: discord.Interaction) -> list[str]:
    """This server's open requests, a line each, with who may answer and the thread's link."""
    client = kestrel_of(interaction)
    listed = []
    for item in await client.chat.pending(user=interaction_actor(interaction, listing=True)):
        place = await client.renderer.place_of(item.request.run_id)
        if place is None or DiscordTarget.of(place.target).guild != str(interaction.guild_id):
            continue  # this server's runs only
        listed.append((item, place))
    unshown = await client.renderer.cards_unshown([item.request.id for item, _ in listed])
    lines = []
    for item, place in listed:
        link = thread_of(place.session.id).url or place.session.id
        who = ", ".join(item.may_answer) or "nobody"
        line = f"• {item.request.kind.value} `{item.request.tool}` — may answer: {who} — {link}"
        why = unshown.get(item.request.id)
        if why:  # nobody in the thread can decide it: the terminal can
            line += f" — **card not shown** ({why}): `kestrel runs pending`"
        lines.append(line)
    return lines


async def _operate(interaction: discord.Interaction, verb: str, run: str | None) -> None:
    if not await deferred(interaction):
        return  # Discord told them it failed: a cancel must not act unseen
    try:
        await _operate_deferred(interaction, verb, run)
    except StoreError as exc:
        await say_store_failed(interaction, f"/kestrel {verb}", exc)


async def _operate_deferred(interaction: discord.Interaction, verb: str, run: str | None) -> None:
    client = kestrel_of(interaction)
    # A run named, even by its marks alone, is the one asked about: never the thread's.
    run_id = (run_id_said(run) or run) if run else await _thread_run(client, interaction)
    if not run_id:
        await interaction.followup.send(
            "Name a run, or use this in a run's thread.", ephemeral=True
        )
        return
    place = await client.renderer.place_of(run_id) if _known(run_id) else None
    actor = interaction_actor(interaction)
    if place is None or DiscordTarget.of(place.target).guild != str(interaction.guild_id):
        # Made up, or another server's or platform's: said as a run one may not see; one
        # that exists is refused and audited, as one named from another channel is.
        if _known(run_id):
            await client.chat.refuse_unseen(verb, run_id, user=actor)
        await interaction.followup.send(unseen_run(run_id), ephemeral=True)
        return
    outcome = await client.talk.operate(verb, run_id, actor)
    text = status_text(outcome.status) if outcome.status is not None else note_text(outcome.note)
    await interaction.followup.send(text, ephemeral=True)
    await client.after(outcome)


async def _thread_run(client: KestrelDiscord, interaction: discord.Interaction) -> str:
    if interaction.guild_id is None or interaction.channel_id is None:
        return ""
    session_id = ids.thread_session_id(interaction.guild_id, interaction.channel_id)
    latest = await client.chat.latest(Session(id=session_id, platform="discord"))
    return latest.record.id if latest else ""


def _known(run_id: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", run_id) is not None
