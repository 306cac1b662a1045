"""The outbox's way into Discord: post and edit the bot's messages in a thread, over the REST
API with the bot token (never an interaction token, which lasts 15 minutes).

Discord has no message metadata to search by, so each post carries a nonce made from its
outbox key and body, with ``enforce_nonce``: a post sent again within minutes of an unknown
outcome returns the message the first one created instead of creating a second; later, the
thread's latest messages are searched for the bot's message showing the same body. A thread
that auto-archived is unarchived before the post is sent again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import discord
from discord.http import Route

from adapters.discord.target import DiscordTarget
from bot.chat.outbox import DeliveryFailed, MessageGone, Undeliverable

log = logging.getLogger("kestrel.discord")

THREAD_ARCHIVED = 50083
UNKNOWN_MESSAGE = 10008
UNKNOWN_CHANNEL = 10003  # the thread (or its channel) was deleted: it never comes back
# Refusals a retry in seconds cannot lift (missing access or permission, a locked thread, a
# body Discord will not take): retried hourly, never dropped, and logged as errors.
NEEDS_A_PERSON = frozenset({50001, 50013, 50035, 50083})
NEEDS_A_PERSON_SECONDS = 3600.0


class DiscordTransport:
    """Shows outbox messages in Discord threads (``target``: a stored ``DiscordTarget``)."""

    platform = "discord"

    def __init__(self, http: discord.http.HTTPClient) -> None:
        self._http = http

    async def post(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str:
        """Post into the thread, once per key; return the message id."""
        channel = DiscordTarget.from_json(target).channel
        payload = {**body, "nonce": nonce(key, body), "enforce_nonce": True}
        route = Route("POST", "/channels/{channel_id}/messages", channel_id=channel)
        message = await self._send(route, payload, channel)
        return str(message["id"])

    async def update(self, ref: str, target: dict[str, Any], body: dict[str, Any]) -> None:
        """Edit message ``ref`` in place."""
        channel = DiscordTarget.from_json(target).channel
        route = Route(
            "PATCH",
            "/channels/{channel_id}/messages/{message_id}",
            channel_id=channel,
            message_id=ref,
        )
        await self._send(route, body, channel)

    async def find(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str | None:  # noqa: ARG002
        """A post whose outcome is unknown, among the thread's latest messages: a bot's message
        showing ``body`` (Discord returns no nonce there; within minutes the nonce dedupes)."""
        channel = DiscordTarget.from_json(target).channel
        route = Route("GET", "/channels/{channel_id}/messages", channel_id=channel)
        try:
            messages = await self._http.request(route, params={"limit": 50})
        except discord.HTTPException as exc:
            raise _failed(exc, channel) from exc
        except discord.RateLimited as exc:
            raise _limited(exc) from exc
        for message in messages:
            if (message.get("author") or {}).get("bot") and _shows(message, body):
                return str(message["id"])
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
        except discord.RateLimited as exc:
            raise _limited(exc) from exc


def nonce(key: str, body: dict[str, Any]) -> str:
    """A nonce of Discord's 25 characters, the same for one message showing one body (a
    message posted again with another body, after it was deleted, is a new one)."""
    shown = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{key}\n{shown}".encode()).hexdigest()[:25]


def _failed(exc: discord.HTTPException, channel: str) -> DeliveryFailed:
    what = f"discord: {exc.status} (code {exc.code}) {exc.text or exc}"
    if exc.status == 404 and exc.code == UNKNOWN_MESSAGE:
        return MessageGone(what)
    if exc.status == 404 and exc.code == UNKNOWN_CHANNEL:
        return Undeliverable(f"thread {channel} was deleted ({what})")
    if exc.code in NEEDS_A_PERSON:
        log.error("discord: thread %s refuses Kestrel's messages: %s", channel, what)
        return DeliveryFailed(what, NEEDS_A_PERSON_SECONDS)
    return DeliveryFailed(what, 30.0 if exc.status == 429 else None)


def _limited(exc: discord.RateLimited) -> DeliveryFailed:
    """A 429 longer than the client sleeps out: put off by Discord's own retry_after."""
    return DeliveryFailed(f"discord: rate limited for {exc.retry_after:.0f}s", exc.retry_after)


def _shows(message: dict[str, Any], body: dict[str, Any]) -> bool:
    """Whether a posted message shows what ``body`` asked for (its text, embed titles and
    component ids: what Discord keeps as sent)."""

    def ids(rows: Any) -> list[str]:
        return [
            str(c.get("custom_id") or c.get("url"))
            for r in rows or []
            for c in r.get("components") or []
        ]

    def titles(embeds: Any) -> list[str]:
        return [str(e.get("title", "")) for e in embeds or []]

    return (
        message.get("content", "") == body.get("content", "")
        and titles(message.get("embeds")) == titles(body.get("embeds"))
        and ids(message.get("components")) == ids(body.get("components"))
    )
