"""Who a Discord member is and what they see: the actor of a message or a click, with their
roles as groups, acting from where they are; and the lookups that tell whether they see a
channel or a private thread, each bounded so that a click is answered within Discord's 3 s."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import discord

from adapters.discord.transport import NEEDS_A_PERSON_SECONDS
from bot.chat.contract import Actor, Place
from bot.chat.outbox import DeliveryFailed, after_waiting

log = logging.getLogger("kestrel.discord")

# What one person's action may spend asking Discord, all its lookups together (the thread,
# then whether they are in it): a lookup past it is a no, and a click is still answered within
# Discord's 3 s, with time left for the store. Each lookup of a listing gets this long.
LOOKUP_SECONDS = 2.0
# What a lookup that is a no may meet: Discord's errors, a time-out, and a dropped or refused
# connection (discord.py passes those on as aiohttp's or the socket's own).
LOOKUP_FAILED = (discord.DiscordException, aiohttp.ClientError, OSError)
# What says Discord did not answer, not that it refused: a server error, a dropped or refused
# connection, a time-out. What was asked may be asked again later.
UNANSWERED = (discord.DiscordServerError, aiohttp.ClientError, OSError)
# How many of a card's approvers are asked of Discord at once whether they see a private thread.
LOOKUPS_AT_ONCE = 4


def interaction_actor(interaction: discord.Interaction, *, listing: bool = False) -> Actor:
    """Who sent an interaction, acting from its guild, channel and thread; ``listing``: only
    to read what waits (``/kestrel runs``), where no lookup is bounded by the action's time."""
    channel = interaction.channel
    channel_id = str(interaction.channel_id or "")
    parent = getattr(channel, "parent_id", None) if isinstance(channel, discord.Thread) else None
    place = Place(
        "discord",
        str(interaction.guild_id or ""),
        str(parent or channel_id),
        channel_id if parent else "",
    )
    return actor_of(interaction.user, place, interaction.guild, listing=listing)


def actor_of(
    user: discord.User | discord.Member,
    place: Place,
    guild: discord.Guild | None,
    *,
    listing: bool = False,
) -> Actor:
    """A member with their roles in this guild as groups (``role:ID`` or ``group:ID`` in the
    policy), acting from ``place``; from a guild other than the run's, a guest. Their action
    asks Discord for ``LOOKUP_SECONDS`` at most, all its lookups together (a listing: each)."""
    roles = getattr(user, "roles", ())
    groups = frozenset(str(role.id) for role in roles)
    deadline = None if listing else time.monotonic() + LOOKUP_SECONDS
    directory = GuildDirectory(user, guild, deadline)
    return Actor(str(user.id), groups, place, directory=directory)


class GuildDirectory:
    """What the gateway's cache tells of a member: their roles (known with the interaction)
    and which channels they can see; Discord is asked only about a thread the cache lacks (an
    archived one) and whether they are in a private thread, all within ``deadline`` (a click
    is answered within Discord's 3 s however slow it is; None: each within ``LOOKUP_SECONDS``).
    """

    def __init__(
        self,
        user: discord.User | discord.Member,
        guild: discord.Guild | None,
        deadline: float | None = None,
    ) -> None:
        self._user = user
        self._guild = guild
        self._deadline = deadline  # on ``time.monotonic``'s clock

    async def in_group(self, user: str, group: str) -> bool:  # noqa: ARG002
        """Roles come with the member: one not among them is not theirs."""
        return False

    def untold(self) -> str:
        """A lookup Discord did not answer is said in the log; nothing here."""
        return ""

    async def sees(self, user: str, place: Place) -> bool:
        """Whether the member may view the channel of ``place`` (of their own guild), and its
        thread: a private one only as its member or as someone who manages threads."""
        guild, member = self._guild, self._user
        if guild is None or not isinstance(member, discord.Member) or str(member.id) != user:
            return False
        if place.platform != "discord" or place.workspace != str(guild.id):
            return False
        where = await _channel_or_thread(guild, place, self._deadline)
        allowed = _permissions(where, member)
        if allowed is None or not allowed.view_channel:
            return False
        if not isinstance(where, discord.Thread) or not where.is_private():
            return True
        return allowed.manage_threads or await _in_thread(where, member, self._deadline)


T = TypeVar("T")


async def _looked_up(ask: Callable[[], Awaitable[T]], deadline: float | None) -> T:
    """``ask``'s answer within what is left of the action's time (``deadline``; None: within
    ``LOOKUP_SECONDS``). Raises ``TimeoutError`` past it, or when none was left to ask in."""
    left = LOOKUP_SECONDS if deadline is None else min(LOOKUP_SECONDS, deadline - time.monotonic())
    if left <= 0:
        raise TimeoutError(f"not asked: the action's {LOOKUP_SECONDS:.0f} s were spent")
    try:
        return await asyncio.wait_for(ask(), left)
    except TimeoutError:
        raise TimeoutError(f"no answer within {left:.1f} s") from None


async def _channel_or_thread(guild: discord.Guild, place: Place, deadline: float | None) -> Any:
    """The thread of ``place`` (its channel when it names none), from the cache, else from
    Discord (archived threads leave the cache) by ``deadline``; None when neither can tell."""
    ident = place.thread or place.channel
    if not ident.isdigit():
        return None
    found = guild.get_channel_or_thread(int(ident))
    if found is not None or not place.thread:
        return found
    try:
        return await _looked_up(functools.partial(guild.fetch_channel, int(ident)), deadline)
    except LOOKUP_FAILED as exc:
        log.warning("discord: thread %s could not be looked up: %s: taken as no", ident, exc)
        return None


def _permissions(where: Any, member: discord.Member) -> discord.Permissions | None:
    """The member's permissions in ``where``; None for nowhere, or a thread whose channel the
    cache lacks (discord.py cannot tell then)."""
    if where is None:
        return None
    try:
        permissions: discord.Permissions = where.permissions_for(member)
    except discord.ClientException:
        return None
    return permissions


async def _in_thread(
    thread: discord.Thread, member: discord.Member, deadline: float | None
) -> bool:
    """Whether ``member`` is in ``thread`` (Discord says so by ``deadline``; the gateway does
    not tell Kestrel who is in a thread without the privileged members intent)."""
    try:
        await _looked_up(functools.partial(thread.fetch_member, member.id), deadline)
    except discord.NotFound:
        return False
    except LOOKUP_FAILED as exc:
        log.warning(
            "discord: members of thread %s could not be asked: %s: taken as no", thread.id, exc
        )
        return False
    return True


def not_looked_up(thread: str, exc: Exception) -> DeliveryFailed:
    """A thread Discord did not say anything of, to be asked again: when it says (a refusal of
    access waits on a person, as a post's would; a rate limit on its end), else soon."""
    what = f"discord: thread {thread} could not be looked up: {exc or type(exc).__name__}"
    if isinstance(exc, discord.Forbidden):
        return DeliveryFailed(what, NEEDS_A_PERSON_SECONDS)
    if isinstance(exc, discord.RateLimited):
        return DeliveryFailed(what, after_waiting(exc.retry_after))
    return DeliveryFailed(what)


async def seeing_private(
    guild: discord.Guild, thread: discord.Thread, users: list[str]
) -> frozenset[str]:
    """Which of ``users`` see private ``thread``, asked of Discord ``LOOKUPS_AT_ONCE`` at a
    time (one by one, a card with many approvers waited a round trip or two for each). Once
    Discord rate-limits a lookup, the users not yet asked are not asked: they are a no."""
    gate = asyncio.Semaphore(LOOKUPS_AT_ONCE)
    limited = asyncio.Event()

    async def sees(user: str) -> bool:
        async with gate:
            if limited.is_set():
                return False
            try:
                return await _sees_private(guild, thread, user)
            except discord.RateLimited as exc:
                limited.set()
                log.warning("discord: members of thread %s could not be asked: %s", thread.id, exc)
                return False

    seen = await asyncio.gather(*(sees(user) for user in users))
    return frozenset(user for user, yes in zip(users, seen, strict=True) if yes)


async def _sees_private(guild: discord.Guild, thread: discord.Thread, user: str) -> bool:
    """Whether ``user`` sees private ``thread``: as its member, or as someone who manages
    threads in its channel; a lookup that fails or takes too long is a no (no ping). Raises
    ``discord.RateLimited`` under a limit longer than the client sleeps out."""
    if not user.isdigit():
        return False
    try:
        await asyncio.wait_for(thread.fetch_member(int(user)), LOOKUP_SECONDS)
        return True
    except discord.NotFound:
        pass
    except discord.RateLimited:
        raise
    except LOOKUP_FAILED as exc:
        log.warning("discord: members of thread %s could not be asked: %s", thread.id, exc)
        return False
    member = guild.get_member(int(user))
    if member is None:
        try:
            member = await asyncio.wait_for(guild.fetch_member(int(user)), LOOKUP_SECONDS)
        except discord.RateLimited:
            raise
        except LOOKUP_FAILED:
            return False  # not in the server, or not answered: not one who sees the thread
    allowed = _permissions(thread, member)
    return allowed is not None and allowed.view_channel and allowed.manage_threads
