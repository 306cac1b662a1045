"""The outbox's way into Discord: post and edit the bot's messages in a thread, over the REST
API with the bot token (never an interaction token, which lasts 15 minutes).

Discord has no message metadata to search by, so each post carries a nonce made from its
outbox key with ``enforce_nonce``: a post sent again after an unknown outcome returns the
message the first one created instead of creating a second. A thread that auto-archived is
unarchived before the post is sent again.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import discord
from discord.http import Route

from bot.outbox import DeliveryFailed, MessageGone

log = logging.getLogger("kestrel.discord")

THREAD_ARCHIVED = 50083
UNKNOWN_MESSAGE = 10008
# Refusals a retry in seconds cannot lift (missing access or permission, a locked thread, a
# body Discord will not take): retried hourly, never dropped, and logged as errors.
NEEDS_A_PERSON = frozenset({50001, 50013, 50035, 50083, 10003})
NEEDS_A_PERSON_SECONDS = 3600.0


class DiscordTransport:
    """Shows outbox messages in Discord threads (``target``: channel, guild)."""

    platform = "discord"

    def __init__(self, http: discord.http.HTTPClient) -> None:
        self._http = http

    async def post(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str:
        """Post into the thread, once per key; return the message id."""
        channel = target["channel"]
        payload = {**body, "nonce": nonce(key), "enforce_nonce": True}
        route = Route("POST", "/channels/{channel_id}/messages", channel_id=channel)
        message = await self._send(route, payload, channel)
        return str(message["id"])

    async def update(self, ref: str, target: dict[str, Any], body: dict[str, Any]) -> None:
        """Edit message ``ref`` in place."""
        channel = target["channel"]
        route = Route(
            "PATCH",
            "/channels/{channel_id}/messages/{message_id}",
            channel_id=channel,
            message_id=ref,
        )
        await self._send(route, body, channel)

    async def find(self, key: str, target: dict[str, Any]) -> str | None:
        """Nothing to search: a post repeated with the same nonce returns the first message."""
        return None

    async def unarchive(self, channel: str) -> None:
        """Open an archived thread again so that it can be written to."""
        route = Route("PATCH", "/channels/{channel_id}", channel_id=channel)
        await self._http.request(route, json={"archived": False})

    async def _send(self, route: Route, payload: dict[str, Any], channel: str) -> Any:
        try:
            try:
                return await self._http.request(route, json=payload)
            except discord.HTTPException as exc:
                if exc.code != THREAD_ARCHIVED:
                    raise
                log.info("discord: thread %s was archived; opening it again", channel)
                await self.unarchive(channel)
                return await self._http.request(route, json=payload)
        except discord.HTTPException as exc:
            raise _failed(exc, channel) from exc


def nonce(key: str) -> str:
    """A nonce of Discord's 25 characters, stable for one outbox key."""
    return hashlib.sha256(key.encode()).hexdigest()[:25]


def _failed(exc: discord.HTTPException, channel: str) -> DeliveryFailed:
    what = f"discord: {exc.status} (code {exc.code}) {exc.text or exc}"
    if exc.status == 404 and exc.code == UNKNOWN_MESSAGE:
        return MessageGone(what)
    if exc.code in NEEDS_A_PERSON:
        log.error("discord: thread %s refuses Kestrel's messages: %s", channel, what)
        return DeliveryFailed(what, NEEDS_A_PERSON_SECONDS)
    return DeliveryFailed(what, 30.0 if exc.status == 429 else None)
