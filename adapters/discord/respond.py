"""The first response to a Discord interaction, within Discord's 3 s, and what a button, form or
``/kestrel`` asks of the client it came to."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, cast

import discord

from adapters.discord.look import note_text
from bot.chat.contract import StoreError
from bot.chat.conversation import store_note
from bot.chat.words import STORE_DOWN

if TYPE_CHECKING:
    from adapters.discord.client import KestrelDiscord

log = logging.getLogger("kestrel.discord")

UNKNOWN_INTERACTION = 10062


def kestrel_of(interaction: discord.Interaction) -> KestrelDiscord:
    """The Kestrel client ``interaction`` came to (it registered every button and command)."""
    return cast("KestrelDiscord", interaction.client)


async def deferred(interaction: discord.Interaction) -> bool:
    """Defer ``interaction``; False when it expired first (answered after Discord's 3 s)."""
    return await in_time(interaction, interaction.response.defer(ephemeral=True, thinking=True))


async def in_time(interaction: discord.Interaction, responding: Awaitable[object]) -> bool:
    """Give ``interaction`` its first response; False, said in a line, when it expired first
    (answered after Discord's 3 s, which told the person it failed)."""
    try:
        await responding
    except discord.NotFound as exc:
        if exc.code != UNKNOWN_INTERACTION:
            raise
        log.warning(
            "discord: interaction %s expired before Kestrel answered it (over 3 s): ignored",
            interaction.id,
        )
        return False
    return True


async def say_store_failed(
    interaction: discord.Interaction, what: str, exc: StoreError, down: str = STORE_DOWN
) -> None:
    """Answer an interaction the store failed under (``down``: what to say of a store that
    did not answer): deferred, without a follow-up the person sees "thinking…" for ever; not
    yet, without a response Discord says "This interaction failed"."""
    log.error("discord: %s: the store failed: %s", what, exc)
    text = note_text(store_note(exc, down))
    if interaction.response.is_done():
        await interaction.followup.send(text, ephemeral=True)
    else:
        await in_time(interaction, interaction.response.send_message(text, ephemeral=True))
