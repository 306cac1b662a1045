"""Discord's HTTP interactions endpoint (``POST /discord/interactions``): any replica behind a
load balancer answers clicks, forms and ``/kestrel``.

Discord signs each request with the application's Ed25519 key; the signature over the
timestamp and the raw body is checked before a byte is parsed. A PING is answered PONG. Any
other interaction goes to the same buttons, forms and commands as one from the gateway: they
answer through discord.py's webhook adapter, which here hands their first response (a defer, a
message, a modal) back as the HTTP answer instead of POSTing it to Discord's callback route;
their follow-ups go to Discord's webhook as usual. A handler that has not answered within
``ANSWER_SECONDS`` is answered with a defer, and its own first response is then dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from discord.webhook.async_ import AsyncWebhookAdapter, async_context

if TYPE_CHECKING:
    from adapters.discord.client import KestrelDiscord

log = logging.getLogger("kestrel.discord")

INTERACTIONS_PATH: Final = "/discord/interactions"
# Discord waits 3 s for the answer; what a handler has not said by then is a defer.
ANSWER_SECONDS: Final = 2.5
# A signed request older (or newer) than this is a replay, not Discord.
SKEW_SECONDS: Final = 300
MAX_BODY: Final = 256 * 1024
PING, COMMAND, COMPONENT, AUTOCOMPLETE, MODAL_SUBMIT = 1, 2, 3, 4, 5
PONG, DEFERRED_MESSAGE, DEFERRED_UPDATE = 1, 5, 6
EPHEMERAL: Final = 64


def public_key(hex_key: str) -> Ed25519PublicKey:
    """The application's public key from its 64 hex digits (``ValueError`` otherwise)."""
    raw = bytes.fromhex(hex_key)
    if len(raw) != 32:
        raise ValueError("an Ed25519 public key is 32 bytes")
    return Ed25519PublicKey.from_public_bytes(raw)


def signed(key: Ed25519PublicKey, headers: Any, body: bytes, now: float) -> bool:
    """Whether ``body`` carries Discord's signature, made within ``SKEW_SECONDS`` of ``now``."""
    timestamp = str(headers.get("X-Signature-Timestamp", ""))
    signature = str(headers.get("X-Signature-Ed25519", ""))
    if not timestamp.isdigit() or abs(now - int(timestamp)) > SKEW_SECONDS:
        return False
    try:
        key.verify(bytes.fromhex(signature), timestamp.encode() + body)
    except (ValueError, InvalidSignature):
        return False
    return True


def deferred(data: dict[str, Any]) -> dict[str, Any]:
    """The answer that only acknowledges ``data`` (a follow-up says the rest)."""
    if data.get("type") in (COMPONENT, MODAL_SUBMIT):
        return {"type": DEFERRED_UPDATE}
    return {"type": DEFERRED_MESSAGE, "data": {"flags": EPHEMERAL}}


class InteractionEndpoint:
    """Verifies, takes and answers interactions Discord posts to this replica."""

    def __init__(self, client: KestrelDiscord, key: Ed25519PublicKey) -> None:
        self._client = client
        self._key = key

    def add_to(self, application: web.Application) -> None:
        """Serve ``POST /discord/interactions`` on ``application``."""
        application.router.add_post(INTERACTIONS_PATH, self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        """One interaction: 401 unless signed, 400 unless one, else its first response."""
        if (request.content_length or 0) > MAX_BODY:
            return web.Response(status=413, text="The body is too large for an interaction.")
        body = await request.content.read(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            return web.Response(status=413, text="The body is too large for an interaction.")
        if not signed(self._key, request.headers, body, time.time()):
            return web.Response(status=401, text="Invalid request signature.")
        data = _interaction(body)
        if data is None:
            return web.Response(status=400, text="The body is not a Discord interaction.")
        if data["type"] == PING:
            return web.json_response({"type": PONG})
        sent = asyncio.Event()
        response = web.json_response(await self.answer(data, sent))
        # Written out before the handler goes on: its follow-ups need Discord to have it.
        try:
            await response.prepare(request)
            await response.write_eof()
        finally:
            sent.set()
        return response

    async def answer(self, data: dict[str, Any], sent: asyncio.Event) -> dict[str, Any]:
        """Take ``data`` (unless a replica took it already) and run its handler; its first
        response, or a defer if it gives none in time. The handler goes on once ``sent``."""
        if not await self._client.first_take(data):
            return deferred(data)  # taken by another replica: acknowledged, nothing more
        first: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        adapter = FirstResponse(int(data["id"]), first, sent)
        # The handlers' tasks are created now and copy this context: they answer through it.
        reset = async_context.set(adapter)
        try:
            self._client.dispatch_interaction(data)
        except (KeyError, TypeError, ValueError) as exc:  # signed, yet not what it says it is
            log.warning("discord: interaction %s is malformed: %r", data["id"], exc)
            return deferred(data)
        finally:
            async_context.reset(reset)
        try:
            return await asyncio.wait_for(asyncio.shield(first), ANSWER_SECONDS)
        except TimeoutError:
            log.warning("discord: interaction %s not answered in time: deferred", data["id"])
            fallback = deferred(data)
            if not first.done():
                first.set_result(fallback)
            return fallback


class FirstResponse(AsyncWebhookAdapter):
    """discord.py's webhook adapter, except that the first response to one interaction is
    handed to the waiting HTTP request instead of POSTed to Discord."""

    def __init__(
        self, interaction_id: int, first: asyncio.Future[dict[str, Any]], sent: asyncio.Event
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._interaction_id = interaction_id
        self._first = first
        self._sent = sent

    def create_interaction_response(
        self, interaction_id: int, token: str, *, params: Any, **kwargs: Any
    ) -> Any:
        """The answer discord.py would read back from Discord's callback route."""
        if interaction_id != self._interaction_id:
            return super().create_interaction_response(
                interaction_id, token, params=params, **kwargs
            )
        payload = dict(params.payload or {})
        if not self._first.done():
            self._first.set_result(payload)
        return _callback_answer(interaction_id, payload, self._sent)


async def _callback_answer(
    interaction_id: int, payload: dict[str, Any], sent: asyncio.Event
) -> dict[str, Any]:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(sent.wait(), ANSWER_SECONDS * 2)
    kind = int(payload.get("type", 0))
    flags = int((payload.get("data") or {}).get("flags") or 0)
    return {
        "interaction": {
            "id": str(interaction_id),
            "response_message_loading": kind == DEFERRED_MESSAGE,
            "response_message_ephemeral": bool(flags & EPHEMERAL),
        },
        "resource": {"type": kind},
    }


def _interaction(body: bytes) -> dict[str, Any] | None:
    """The interaction ``body`` holds, if it has what every interaction has."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("type"), int):
        return None
    if data["type"] != PING and not (
        str(data.get("id", "")).isdigit() and isinstance(data.get("token"), str)
    ):
        return None
    if data["type"] not in (PING, COMMAND, COMPONENT, AUTOCOMPLETE, MODAL_SUBMIT):
        return None
    return data
