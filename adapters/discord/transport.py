"""The outbox's way into Discord: post and edit the bot's messages in a thread, over the REST
API with the bot token (never an interaction token, which lasts 15 minutes).

Discord has no message metadata to search by, so each post carries a nonce made from its
outbox key and body, with ``enforce_nonce``: a post sent again within minutes of an unknown
outcome returns the message the first one created instead of creating a second; later, the
thread's latest messages are searched for the bot's message showing the same body. A card is
also the message whose buttons name its request, whatever it shows: decided meanwhile, it is
edited closed, not posted beside its open self, whose buttons would still ask. Two messages
may show the same (two answers of the same words, two decided cards of one tool): a message the
outbox already records as another one's is never taken for it, or it would be edited into this
one, and lost from the thread. A thread that auto-archived is unarchived before the post is sent
again.

A body Discord refuses as such (50035 Invalid Form Body: a card over one of its limits) is
refused the same way every time: it is sent once more as its words alone (a card's, with what
its buttons would have decided and how to decide it without them), and given up if that is
refused too, never retried hourly.

Discord adds whoever a message in a private thread notifies to that thread. So a message
notifying people (a card, a reminder) into a private thread notifies only those who see it
already (its members, and those who manage threads) and names the others, unnotified: an
approver who is not in the thread is told of nothing they could then read whole. A role is
never pinged there (its members cannot be told apart without the privileged members intent):
the message names it, says that those of it in the thread may answer there, and says first
when that leaves nobody notified, so that the thread's members bring an approver in. When
Discord does not say whether a thread is private (an archived thread, left out of the gateway's
cache, looked up while Discord is slow or limits Kestrel), such a message is tried again later
rather than sent notifying people blind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import discord
from discord.http import Route

from adapters.discord import ids
from adapters.discord.target import DiscordTarget
from bot.chat.outbox import DeliveryFailed, MessageGone, Undeliverable, after_waiting
from bot.chat.outbox_keys import card_request

log = logging.getLogger("kestrel.discord")
T = TypeVar("T")

THREAD_ARCHIVED = 50083
UNKNOWN_MESSAGE = 10008
UNKNOWN_CHANNEL = 10003  # the thread (or its channel) was deleted: it never comes back
# Refusals a retry in seconds cannot lift (missing access or permission, a locked thread):
# retried hourly, never dropped, and logged as errors.
NEEDS_A_PERSON = frozenset({50001, 50013, 50083})
NEEDS_A_PERSON_SECONDS = 3600.0
# The body itself refused (Invalid Form Body): no retry and no person makes it acceptable.
BODY_REFUSED = 50035
REFUSED_AS = "50035 Invalid Form Body"  # as a card shown as its words says (the same each time)
CONTENT_LIMIT = 2000
# The most of a refused question card's words its options take (the rest: its other words).
OPTIONS_LIMIT = 800
# The components whose custom id names the request they decide (``req``).
_DECIDING = tuple(
    re.compile(template)
    for template in (
        ids.APPROVE,
        ids.APPROVE_RUN,
        ids.DENY,
        ids.STEP_BY_STEP,
        ids.ANSWER,
        ids.CHOOSE,
        ids.EFFECT,
    )
)


# Which of some message ids (platform, ids) the outbox records as a message's already: those
# are not the message a post of unknown outcome made (``Outbox.held_refs``).
Held = Callable[[str, list[str]], Awaitable[set[str]]]
# Which of some users already see a thread (guild, thread, users); None when it is not a
# private thread, which shows to everyone who sees its channel. It raises DeliveryFailed when
# Discord does not say what the thread is: the message waits rather than notify blind.
Seeing = Callable[[str, str, list[str]], Awaitable[frozenset[str] | None]]
# What a message into a private thread says of those it may not notify: users who do not see
# the thread, and roles (a role is never pinged there: Discord would add its members, none of
# whom Kestrel can tell apart without the privileged members intent). One line; when it leaves
# nobody notified, it says so first, so the thread's members know to bring an approver in.
NOT_PINGED = (
    "Not notified, as they are not in this private thread (a ping would add them to it): {who}."
)
ROLES_NOT_PINGED = (
    "Roles are not pinged in a private thread (Discord would add all their members to it):"
    " {roles}; those of them already in this thread may answer here."
)
NOBODY_PINGED = "Nobody was notified."
HOW_ELSE = (
    " A member of the thread adds whom it names by mentioning them here; on-call can also"
    " decide from the terminal (`kestrel runs pending`)."
)
# That line, where it is in a message's content (cut short, too, at the content's limit).
_NOT_PINGED_LINE = re.compile(
    r"\n?(?:"
    + "|".join(
        re.escape(start) for start in (NOBODY_PINGED, NOT_PINGED[:16], ROLES_NOT_PINGED[:28])
    )
    + r")[^\n]*"
)


class BodyRefused(Undeliverable):
    """Discord refused the body itself (50035): the same body is refused every time."""


class DiscordTransport:
    """Shows outbox messages in Discord threads (``target``: a stored ``DiscordTarget``)."""

    platform = "discord"

    def __init__(
        self,
        http: discord.http.HTTPClient,
        seeing: Seeing | None = None,
        held: Held | None = None,
    ) -> None:
        self._http = http
        self._seeing = seeing
        self._held = held

    async def post(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str:
        """Post into the thread, once per key; return the message id."""
        channel = DiscordTarget.from_json(target).channel
        body = await self._for_thread(target, body)
        route = Route("POST", "/channels/{channel_id}/messages", channel_id=channel)

        async def send(shown: dict[str, Any]) -> Any:
            # The nonce is of what the message says, not of whom it could notify: sent again
            # after someone joined the thread, it is the same message.
            payload = {**shown, "nonce": nonce(key, _unnoted(shown)), "enforce_nonce": True}
            return await self._send(route, payload, channel)

        message = await _sent(send, key, body)
        return str(message["id"])

    async def update(self, ref: str, target: dict[str, Any], body: dict[str, Any]) -> None:
        """Edit message ``ref`` in place."""
        channel = DiscordTarget.from_json(target).channel
        body = await self._for_thread(target, body)
        route = Route(
            "PATCH",
            "/channels/{channel_id}/messages/{message_id}",
            channel_id=channel,
            message_id=ref,
        )

        async def send(shown: dict[str, Any]) -> Any:
            return await self._send(route, shown, channel)

        await _sent(send, ref, body)

    async def find(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str | None:
        """A post whose outcome is unknown, among the thread's latest messages: a bot's message
        showing ``body`` (Discord returns no nonce there; within minutes the nonce dedupes),
        whomever it names as not notified (who sees a private thread may have changed since),
        or for a card, whose buttons name its request (an earlier version of it), that the
        outbox records as no other message's."""
        channel = DiscordTarget.from_json(target).channel
        route = Route("GET", "/channels/{channel_id}/messages", channel_id=channel)
        try:
            messages = await self._http.request(route, params={"limit": 50})
        except discord.HTTPException as exc:
            raise _failed(exc, channel) from exc
        except discord.RateLimited as exc:
            raise _limited(exc) from exc
        instead = words_instead(body, REFUSED_AS)  # what a post refused as a body showed
        # The outbox's keys carry the platform first (``discord:card:REQ``).
        request = card_request(key.removeprefix(f"{self.platform}:"))
        found = [
            str(message["id"])
            for message in messages
            if (message.get("author") or {}).get("bot")
            and (
                _shows(message, body)
                or (instead and _shows(message, instead))
                or (request is not None and _requests(message) == {request})
            )
        ]
        if found and self._held is not None:
            taken = await self._held(self.platform, found)
            found = [ref for ref in found if ref not in taken]
        return found[0] if found else None

    async def _for_thread(self, target: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """``body`` as it may be shown in the thread: in a private one, notifying only those
        who see it already, and naming the others (roles too: a role's members are not asked
        one by one) unnotified."""
        allowed = body.get("allowed_mentions") or {}
        users = [str(u) for u in allowed.get("users") or []]
        roles = [str(r) for r in allowed.get("roles") or []]
        if self._seeing is None or not (users or roles):
            return body
        where = DiscordTarget.from_json(target)
        seeing = await self._seeing(where.guild, where.channel, users)
        if seeing is None:
            return body
        kept = [user for user in users if user in seeing]
        left = [f"<@{u}>" for u in users if u not in seeing]
        if not (left or roles):
            return body
        note = _not_pinged(left, [f"<@&{r}>" for r in roles], nobody=not kept)
        content = str(body.get("content") or "")
        content = f"{content}\n{note}" if content else note
        if len(content) > CONTENT_LIMIT:
            content = content[: CONTENT_LIMIT - 1] + "…"
        return {
            **body,
            "content": content,
            "allowed_mentions": {**allowed, "users": kept, "roles": []},
        }

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


def _not_pinged(users: list[str], roles: list[str], *, nobody: bool) -> str:
    """The line naming whom a message into a private thread did not notify, and how they may
    still answer (``nobody``: it notifies no one)."""
    parts = [NOBODY_PINGED] if nobody else []
    if users:
        parts.append(NOT_PINGED.format(who=", ".join(users)))
    if roles:
        parts.append(ROLES_NOT_PINGED.format(roles=", ".join(roles)))
    return " ".join(parts) + HOW_ELSE


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
    if exc.code == BODY_REFUSED:
        return BodyRefused(what)
    if exc.code in NEEDS_A_PERSON:
        log.error("discord: thread %s refuses Kestrel's messages: %s", channel, what)
        return DeliveryFailed(what, NEEDS_A_PERSON_SECONDS)
    return DeliveryFailed(what, after_waiting(30.0) if exc.status == 429 else None)


async def _sent(
    send: Callable[[dict[str, Any]], Awaitable[T]], what: str, body: dict[str, Any]
) -> T:
    """``send(body)``; a body Discord refuses as such is sent once more, as its words alone. A
    second refusal, or one of words alone, is given up (``BodyRefused``)."""
    try:
        return await send(body)
    except BodyRefused as exc:
        instead = words_instead(body, REFUSED_AS)
        if instead is None:
            raise
        if _deciding(body):
            # A card without its buttons decides nothing in the thread: on-call must hear of it.
            log.error("discord: %s refused (%s); shown without its buttons", what, exc)
        else:
            log.warning("discord: %s refused (%s); showing its words alone", what, exc)
    return await send(instead)


def words_instead(body: dict[str, Any], refusal: str) -> dict[str, Any] | None:
    """What to show instead of a body Discord refused (``refusal``: how it said so): its words
    alone, and for a card, how to decide it without its buttons; None when it had nothing
    but words (sending them again would be refused again)."""
    if not body.get("embeds") and not body.get("components"):
        return None
    note = _buttons_lost(body, refusal)
    parts = [str(body.get("content") or "").strip()]
    for embed in body.get("embeds") or []:
        parts.append(f"**{embed.get('title', '')}**" if embed.get("title") else "")
        parts.append(str(embed.get("description") or ""))
        parts += [
            f"**{f.get('name', '')}**\n{f.get('value', '')}" for f in embed.get("fields") or []
        ]
    words = "\n\n".join(part.strip() for part in parts if part.strip())
    room = CONTENT_LIMIT - (len(note) + 2 if note else 0)
    if len(words) > room:
        words = words[: room - 5] + "…"
        if words.count("```") % 2:  # a code block cut open: closed, so the note is not code
            words += "\n```"
    words = words or "(a message Discord would not show)"
    return {
        "content": f"{words}\n\n{note}" if note else words,
        "embeds": [],
        "components": [],
        # Those a card notified are notified of its words: they decide it.
        "allowed_mentions": body.get("allowed_mentions") or {"parse": []},
    }


def _deciding(body: dict[str, Any]) -> list[re.Match[str]]:
    """The components of ``body`` that decide a request (their custom ids matched)."""
    found = []
    for row in body.get("components") or []:
        for component in row.get("components") or []:
            custom_id = str(component.get("custom_id") or "")
            match = next((m for t in _DECIDING if (m := t.fullmatch(custom_id))), None)
            if match is not None:
                found.append(match)
    return found


def _requests(body: dict[str, Any]) -> set[str]:
    """The requests the components of ``body`` decide (none: not a card open to decide)."""
    return {match["req"] for match in _deciding(body)}


def _buttons_lost(body: dict[str, Any], refusal: str) -> str:
    """What to say in place of the buttons of a card shown as its words alone; empty if it had
    none that decide. Each one's custom id names the request it decides."""
    deciding = _deciding(body)
    if not deciding:
        return ""
    requests = ", ".join(f"`{r}`" for r in dict.fromkeys(m["req"] for m in deciding))
    why = f" ({refusal})" if refusal else ""
    note = (
        f"_Discord refused this card{why}, so its buttons cannot be shown: on-call can decide"
        f" request {requests} from the terminal (`kestrel runs pending` lists it; `/kestrel"
        " runs` shows what waits)._"
    )
    options = _options(body)
    if not options:
        return note
    listed = " · ".join(options)
    if len(listed) > OPTIONS_LIMIT:
        listed = listed[: OPTIONS_LIMIT - 1] + "…"
    return f"Options: {listed}\n\n{note}"


def _options(body: dict[str, Any]) -> list[str]:
    """A question's options as inline code (no markdown, no mention): its choice buttons'
    labels, or its menus' items."""

    def code(text: Any) -> str:
        return "`" + (str(text).replace("`", "\u02cb").replace("\n", " ") or " ") + "`"

    shown: list[str] = []
    for row in body.get("components") or []:
        for component in row.get("components") or []:
            if not str(component.get("custom_id") or "").startswith("kestrel:choose:"):
                continue
            if component.get("type") == 3:
                shown += [code(o.get("label", "")) for o in component.get("options") or []]
            else:
                shown.append(code(component.get("label", "")))
    return shown


def _limited(exc: discord.RateLimited) -> DeliveryFailed:
    """A 429 longer than the client sleeps out: put off by Discord's own retry_after (and a
    little more, so that what it put off together is not all tried again at one instant)."""
    wait = after_waiting(exc.retry_after)
    return DeliveryFailed(f"discord: rate limited for {exc.retry_after:.0f}s", wait)


def _unnoted(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without what ``_for_thread`` changed: the line naming who was not notified,
    and whom it notifies."""
    content = _NOT_PINGED_LINE.sub("", str(body.get("content") or ""))
    shown = {k: v for k, v in body.items() if k != "allowed_mentions"}
    return {**shown, "content": content}


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
        _unnoted(message)["content"] == _unnoted(body)["content"]
        and titles(message.get("embeds")) == titles(body.get("embeds"))
        and ids(message.get("components")) == ids(body.get("components"))
    )
