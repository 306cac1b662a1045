"""The outbox's way into Slack: post, edit and find the bot's messages in a thread.

Each message the bot posts carries its outbox key in Slack's message metadata, so a post
whose outcome is unknown can be found in the thread instead of being posted a second time.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.mrkdwn import escape
from adapters.slack.target import SlackTarget
from bot.chat.outbox import DeliveryFailed, MessageGone, Undeliverable, after_waiting

log = logging.getLogger("kestrel.slack")
T = TypeVar("T")

EVENT_TYPE = "kestrel_message"
# Refusals that only a person can lift (invite the bot, unarchive the channel): retried
# hourly rather than every few seconds, never dropped.
NEEDS_A_PERSON = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "restricted_action",
        "team_access_not_granted",
        # The app was uninstalled or its token revoked: nothing lands until it is reinstalled.
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "token_expired",
        "missing_scope",
    }
)
NEEDS_A_PERSON_SECONDS = 3600.0
# Refusals of the body itself: the same body is refused every time, so it is shown once as
# its words alone (no blocks) rather than retried for ever, and given up if those are refused.
BODY_REFUSED = frozenset(
    {"invalid_blocks", "invalid_blocks_format", "msg_too_long", "invalid_attachments"}
)
PLAIN_TEXT_LIMIT = 3000
# The most of a refused question card's text its options take (the rest: its words).
OPTIONS_LIMIT = 1500


class SlackTransport:
    """Shows outbox messages in Slack threads (``target``: a stored ``SlackTarget``)."""

    platform = "slack"

    def __init__(self, client: AsyncWebClient) -> None:
        self._client = client

    async def post(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str:
        """Post into the thread, marked with ``key``; return the message's ts."""
        where = SlackTarget.from_json(target)
        metadata = {"event_type": EVENT_TYPE, "event_payload": {"key": key}}

        async def send(shown: dict[str, Any]) -> str:
            reply = await self._client.chat_postMessage(
                channel=where.channel,
                thread_ts=where.thread_ts or None,
                text=shown.get("text", ""),
                blocks=shown.get("blocks") or None,
                metadata=metadata,
                unfurl_links=False,
                unfurl_media=False,
            )
            return str(reply["ts"])

        return await _sent(send, key, body)

    async def update(self, ref: str, target: dict[str, Any], body: dict[str, Any]) -> None:
        """Edit message ``ref`` in place."""
        channel = SlackTarget.from_json(target).channel

        async def send(shown: dict[str, Any]) -> None:
            await self._client.chat_update(
                channel=channel,
                ts=ref,
                text=shown.get("text", ""),
                blocks=shown.get("blocks") or [],
            )

        await _sent(send, ref, body)

    async def find(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str | None:  # noqa: ARG002
        """The ts of the bot's message marked ``key`` in the thread, if it landed."""
        where = SlackTarget.from_json(target)
        thread = where.thread_ts
        if not thread:
            return None
        cursor = None
        try:
            while True:
                reply = await self._client.conversations_replies(
                    channel=where.channel,
                    ts=thread,
                    include_all_metadata=True,
                    limit=200,
                    cursor=cursor,
                )
                for message in reply.get("messages") or []:
                    if _key_of(message) == key:
                        return str(message["ts"])
                cursor = (reply.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    return None
        except SlackApiError as exc:
            raise _failed(exc) from exc


def _key_of(message: dict[str, Any]) -> str:
    metadata = message.get("metadata") or {}
    if metadata.get("event_type") != EVENT_TYPE:
        return ""
    return str((metadata.get("event_payload") or {}).get("key", ""))


async def _sent(
    send: Callable[[dict[str, Any]], Awaitable[T]], what: str, body: dict[str, Any]
) -> T:
    """``send(body)``; a body Slack refuses as such is sent once more, as its words alone. Any
    other refusal, or a second one, is a ``DeliveryFailed``."""
    try:
        return await send(body)
    except SlackApiError as exc:
        plain = _plain_instead(exc, what, body)
    try:
        return await send(plain)
    except SlackApiError as exc:
        raise _failed(exc) from exc


def _plain_instead(exc: SlackApiError, what: str, body: dict[str, Any]) -> dict[str, Any]:
    """The body to send instead of one Slack refused: its words alone when Slack refused the
    body itself and it had blocks; otherwise the refusal, raised as ``DeliveryFailed``."""
    error = str(exc.response.get("error") or "")
    if error not in BODY_REFUSED or not body.get("blocks"):
        raise _failed(exc) from exc
    note = _buttons_lost(body, error)
    if note:
        # A card without its buttons decides nothing in the thread: on-call must hear of it.
        log.error("slack: %s refused (%s); shown without its buttons", what, error)
    else:
        log.warning("slack: %s refused (%s); showing its text alone", what, error)
    return {"text": _words(body, note)}


def _buttons_lost(body: dict[str, Any], error: str) -> str:
    """What to say in place of the buttons of a card shown as its words alone; empty if it had
    none. Each button's value is the id of the request it decides."""
    actions = [block for block in body.get("blocks") or [] if block.get("type") == "actions"]
    if not actions:
        return ""
    elements = [element for block in actions for element in block.get("elements") or []]
    # An option's value is REQUEST:N (ids.choice_value): the request is what comes before.
    values = [
        str(e["value"]).partition(":")[0] for e in elements if isinstance(e.get("value"), str)
    ]
    requests = ", ".join(f"`{value}`" for value in dict.fromkeys(values))
    which = f"request {requests}" if requests else "it"
    note = (
        f"_Slack refused this card ({error}), so its buttons cannot be shown: on-call can decide"
        f" {which} from the terminal (`kestrel runs pending` lists it; `/kestrel runs` shows what"
        " waits)._"
    )
    options = _options(elements)
    # The options are the model's words, in plain text on the buttons: escaped for mrkdwn here.
    if not options:
        return note
    listed = " · ".join(escape(option) for option in options)
    if len(listed) > OPTIONS_LIMIT:  # a cut entity (&l…) shows as text, and opens no tag
        listed = listed[: OPTIONS_LIMIT - 1] + "…"
    return f"Options: {listed}\n\n{note}"


def _options(elements: list[dict[str, Any]]) -> list[str]:
    """A question's options: its choice buttons' words, or its menu's."""
    shown: list[str] = []
    for element in elements:
        if element.get("type") == "static_select":
            shown += [
                str((o.get("text") or {}).get("text", "")) for o in element.get("options") or []
            ]
        elif ":" in str(element.get("value", "")):
            shown.append(str((element.get("text") or {}).get("text", "")))
    return shown


def _words(body: dict[str, Any], note: str = "") -> str:
    """What a message's blocks say, as plain mrkdwn text within Slack's limits, ending in
    ``note``."""
    parts: list[str] = []
    for block in body.get("blocks") or []:
        text = block.get("text")
        if isinstance(text, dict):
            text = text.get("text")
        if isinstance(text, str) and text.strip():
            parts.append(text.strip())
        for item in [*(block.get("fields") or []), *(block.get("elements") or [])]:
            if isinstance(item, dict) and isinstance(item.get("text"), str):
                parts.append(item["text"])
    words = "\n\n".join(parts) or str(body.get("text") or "")
    room = PLAIN_TEXT_LIMIT - (len(note) + 2 if note else 0)
    if len(words) > room:
        words = words[: room - 1] + "…"
    words = words or "(a message Slack would not show)"
    return f"{words}\n\n{note}" if note else words


def _failed(exc: SlackApiError) -> DeliveryFailed:
    response = exc.response
    error = str(response.get("error") or "unknown error")
    if error == "message_not_found":
        return MessageGone(f"slack: {error}")
    if error in NEEDS_A_PERSON:
        return DeliveryFailed(f"slack: {error}", NEEDS_A_PERSON_SECONDS)
    if error in BODY_REFUSED:  # words alone, or a second refusal: sending again changes nothing
        return Undeliverable(f"slack: {error}: Slack refuses this message as written")
    retry_after = None
    if response.status_code == 429:
        headers = {k.lower(): v for k, v in response.headers.items()}
        # Jittered: what one limit put off together is not all tried again at one instant.
        retry_after = after_waiting(float(headers.get("retry-after", 30)))
    return DeliveryFailed(f"slack: {error}", retry_after)
