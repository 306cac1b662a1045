"""Messages said while no session of Kestrel was connected, read back after a fresh IDENTIFY.

Discord replays missed events only to a session that RESUMEs; a new session (after a restart, a
deploy or a crash) gets nothing of what was said while none was connected. So once a fresh
session is ready, Kestrel reads the recent history of the places where it has sessions: the
channels its threads were started in, and those threads that are active. A mention of it from
within the window is handed to the client's ``on_message``, the very path a live mention takes
(so the place, the policy, the PII guard and the store's once-mark of each message all apply: a
mention another replica, or this one before the gap, took is dropped). An older one is not run
(its request may be stale by now): its author is told once that it was missed.

In a thread whose run waits on a question, a plain reply from within the window is handed on
too (it may be the answer; the client lets it answer only a question asked before it was said).
An older reply is left: it is addressed to nobody, so telling its author would be noise, and
the question still waits, its card and reminders still ask for it. Other threads' chatter is
not read at all, nor is a message of no person's (a webhook's, or Discord's own). Each author
is looked up as a member once a read back. A message edited since it was said is left: live,
an edit acts on nothing (a mention edited into a message while connected was never one), and
what it said when it was said is not known.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

import discord

from adapters.discord.look import note_text
from bot.chat.service import ChatService
from bot.domain import Request, Session

log = logging.getLogger("kestrel.discord")

# The newest sessions whose places are read: bounds the reads of a server with years of runs.
SESSIONS_READ = 500
# Messages read per place at most: one page of Discord's history.
MESSAGES_READ = 100
# A mention older than the window but within this long is told it was missed; older ones are
# left alone (nobody waits on an answer to last week's question).
TOLD_WITHIN = timedelta(hours=24)


def delivery_key(message_id: int) -> str:
    """The key that marks a Discord message taken, by any replica, for good."""
    return f"discord:{message_id}"


# What a person posts: a message or a reply. Every other type is Discord's own (a pin, a join,
# a thread's starter), and a webhook's message is nobody's, whatever name it shows.
PEOPLES_TYPES = frozenset({discord.MessageType.default, discord.MessageType.reply})


async def member_now(guild: discord.Guild, user: int) -> discord.Member | None:
    """``user`` as a member of ``guild`` now, with their roles, asked of Discord (a message
    read back or fetched again gives its author as a user alone); None when Discord says they
    are none (they left). Any other failure (a long rate limit, an outage) is raised."""
    try:
        return await guild.fetch_member(user)
    except discord.NotFound:
        return None


def said_by_a_person(message: discord.Message) -> bool:
    """Whether ``message`` is a person's: not a bot's, not a webhook's, not Discord's own."""
    return not message.author.bot and message.webhook_id is None and message.type in PEOPLES_TYPES


def missed_note(age: timedelta) -> str:
    """What the author of a mention too old to act on is told, once."""
    minutes = int(age.total_seconds() // 60)
    ago = f"{minutes} minutes" if minutes < 120 else f"{minutes // 60} hours"
    return (
        f"I was not connected when you mentioned me here ({ago} ago), so I did not act on it."
        " Mention me again if it still stands."
    )


class CatchUp:
    """One read back, after a fresh gateway session: mentions in the window, and replies in
    the window in threads that wait on a question, are handled as live ones; older mentions
    are told once that they were missed."""

    def __init__(
        self,
        client: discord.Client,
        chat: ChatService,
        window: timedelta,
        handle: Callable[[discord.Message], Awaitable[None]],
        stopping: Callable[[], bool],
        question: Callable[[Session], Awaitable[Request | None]],
    ) -> None:
        self._client = client
        self._chat = chat
        self._window = window
        self._handle = handle
        self._stopping = stopping
        self._question = question
        # Each author's member, looked up once a read back (None: Discord did not say): the
        # same person's mentions and replies, taken before or not, ask nothing more.
        self._members: dict[tuple[int, int], discord.Member | None] = {}

    async def run(self) -> int:
        """Read every place back; how many messages were handed on (taken or not)."""
        now = discord.utils.utcnow()
        since = now - max(self._window, TOLD_WITHIN)
        handed = 0
        sessions = await self._chat.sessions_on("discord", SESSIONS_READ)
        for place, waits in await self._places(sessions):
            if self._stopping():
                return handed  # the live replicas read back too
            replies_since = now - self._window if waits else None
            found = await self._missed(place, since, replies_since)
            told = _told(found, now - self._window)
            for message in found:
                if self._stopping():
                    return handed
                age = now - message.created_at
                if message.created_at >= now - self._window:
                    handed += await self._hand_on(message, age)
                else:
                    await self._tell_missed(message, age, say=message.id in told)
        return handed

    async def _places(self, sessions: Iterable[Session]) -> list[tuple[Any, bool]]:
        """The channels and active threads of these sessions whose history Kestrel may read,
        each once, with whether a thread's run waits on a question (its replies may answer it)."""
        channels: dict[int, Any] = {}
        threads: dict[int, tuple[Any, Session]] = {}
        for session in sessions:
            guild = self._client.get_guild(_int(session.workspace))
            if guild is None:
                continue
            channel = guild.get_channel(_int(session.channel))
            if isinstance(channel, discord.TextChannel) and _readable(channel):
                channels[channel.id] = channel
            thread = guild.get_thread(_int(session.thread))  # active threads only
            if thread is not None and _readable(thread):
                threads.setdefault(thread.id, (thread, session))
        places = [(channel, False) for channel in channels.values()]
        for thread, session in threads.values():
            places.append((thread, await self._question(session) is not None))
        return places

    async def _missed(
        self, place: Any, since: datetime, replies_since: datetime | None
    ) -> list[discord.Message]:
        """The unedited mentions of Kestrel by people in the newest page of ``place`` since
        ``since``, and their plain replies since ``replies_since`` (None: none), oldest first."""
        me = self._client.user
        found: list[discord.Message] = []
        try:
            async for message in place.history(limit=MESSAGES_READ):  # newest first
                if message.created_at < since:
                    break
                if me is None or not said_by_a_person(message) or message.edited_at is not None:
                    continue  # an edit acts on nothing live, and what it replaced is unknown
                if _mentions_me(message, me.id) or _replies(message, replies_since):
                    found.append(message)
        except (discord.HTTPException, discord.RateLimited) as exc:
            log.warning("discord: cannot read back %s for missed messages: %s", place.id, exc)
        return found[::-1]

    async def _hand_on(self, message: discord.Message, age: timedelta) -> bool:
        """Hand a message from the window on as a live one; whether it was. One whose author
        Discord does not give as a member now is not: without their roles the policy would
        refuse them wrongly (and one who left may not ask). A mention is told it was missed."""
        member = await self._as_member(message)
        if member is not None:
            await self._handle(member)
            return True
        me = self._client.user
        if me is not None and _mentions_me(message, me.id):
            await self._tell_missed(message, age)
        return False

    async def _as_member(self, message: discord.Message) -> discord.Message | None:
        """The message with its author as a member of its server (their roles count in the
        policy, as a live mention's do): history gives only the user. None when Discord does
        not say who they are there now."""
        guild = message.guild
        if guild is None or isinstance(message.author, discord.Member):
            return message
        key = (guild.id, message.author.id)
        if key not in self._members:
            self._members[key] = await self._fetch_member(guild, message)
        member = self._members[key]
        if member is None:
            return None
        message.author = member
        return message

    async def _fetch_member(
        self, guild: discord.Guild, message: discord.Message
    ) -> discord.Member | None:
        """The author of ``message`` as a member of ``guild``, asked of Discord; None when it
        does not say (the author left, or a long rate limit)."""
        try:
            return await member_now(guild, message.author.id)
        except (discord.HTTPException, discord.RateLimited) as exc:
            log.warning("discord: the author of message %s as a member: %s", message.id, exc)
            return None

    async def _tell_missed(
        self, message: discord.Message, age: timedelta, *, say: bool = True
    ) -> None:
        """Mark the mention missed and, if ``say``, tell its author once; nothing for one taken
        before."""
        if not await self._chat.pass_over(delivery_key(message.id)):
            return
        log.info("discord: message %s was missed while disconnected: too old to act on", message.id)
        if not say:
            return  # its author is told of a newer one
        try:
            await message.reply(note_text(missed_note(age)), mention_author=False)
        except (discord.HTTPException, discord.RateLimited) as exc:
            log.warning("discord: cannot say that message %s was missed: %s", message.id, exc)


def _told(found: list[discord.Message], window_start: datetime) -> set[int]:
    """The mentions too old to act on whose authors are told so: each author's newest of them
    in the place, so that someone who asked five times while Kestrel was away gets one note,
    not five."""
    old = (message for message in found if message.created_at < window_start)
    newest = {message.author.id: message.id for message in old}  # oldest first: newest wins
    return set(newest.values())


def _readable(place: discord.TextChannel | discord.Thread) -> bool:
    """Whether Kestrel may read ``place``'s history (else Discord answers 403, or nothing): its
    member is cached with the guild; not knowing it, try."""
    me = place.guild.me
    if me is None:
        return True
    try:
        allowed = place.permissions_for(me)
    except discord.ClientException:  # a thread whose channel is not cached
        return True
    return allowed.view_channel and allowed.read_message_history


def _mentions_me(message: discord.Message, me: int) -> bool:
    """Whether Kestrel's user is mentioned in ``message`` (@everyone is none)."""
    return any(user.id == me for user in message.mentions)


def _replies(message: discord.Message, since: datetime | None) -> bool:
    """Whether ``message`` is a plain reply said since ``since`` (None: no reply counts)."""
    return since is not None and message.created_at >= since


def _int(value: str) -> int:
    """A Discord id read from the store; 0 (found nowhere) for anything else."""
    return int(value) if value.isdigit() else 0
