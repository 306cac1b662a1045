"""What stands between ``/slack/events`` and bolt: the size, the signature, then the shape.

In order, and each refusal is one status, one line of text and one warning in the log:

- no ``X-Slack-Request-Timestamp`` / ``X-Slack-Signature``, or a timestamp more than five
  minutes off: 401, the body unread;
- a body over 1 MiB (declared, or found while reading at most 1 MiB + 1 byte): 413;
- a signature that is not the signing secret's HMAC of ``v0:TIMESTAMP:BODY``: 401;
- a signed body that is not UTF-8, not JSON or a form, nested too deep, or not shaped the way
  Slack shapes it (``adapters.slack.shape``): 400.

Only a signed, well-formed body reaches bolt; whatever still fails inside bolt is one line in
the log (``on_bolt_error``), never a traceback. Socket Mode's envelopes come over Kestrel's own
authenticated connection, unsigned: ``GatedSocketMode`` checks their shape the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from collections.abc import Callable
from typing import Any, Final

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.error import BoltUnhandledRequestError
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse

from adapters.slack.shape import MAX_DEPTH, Unreadable, problem, read_body
from bot.nesting import deeper_than

log = logging.getLogger("kestrel.slack")

MAX_BODY: Final = 1024 * 1024
MAX_AGE_SECONDS: Final = 5 * 60
_TIMESTAMP: Final = re.compile(r"[0-9]{1,12}")


class Refused(Exception):
    """A request turned away: the status to answer and the cause, in a few words."""

    def __init__(self, status: int, cause: str) -> None:
        super().__init__(cause)
        self.status = status
        self.cause = cause


class SlackGate:
    """The ``POST /slack/events`` handler: checks a request, then hands it to bolt."""

    def __init__(
        self, app: AsyncApp, signing_secret: str, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._app = app
        self._secret = signing_secret.encode()
        self._clock = clock

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Bolt's answer to a signed, well-formed request; a one-line refusal to any other."""
        try:
            admitted = await self._admit(request)
        except Refused as refused:
            log.warning(
                "slack: refused a request from %s: %s (%d)",
                request.remote,
                refused.cause,
                refused.status,
            )
            return web.Response(status=refused.status, text=refused.cause + "\n")
        return await to_aiohttp_response(await self._app.async_dispatch(admitted))

    async def _admit(self, request: web.Request) -> AsyncBoltRequest:
        timestamp, signature = self._signature_headers(request)
        raw = await _read(request)
        if not self._signed(raw, timestamp, signature):
            raise Refused(401, "the signature does not match")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Refused(400, "the body is not UTF-8") from None
        content_type = request.headers.get("Content-Type", "").split(";")[0]
        try:
            found = problem(read_body(text, content_type))
        except Unreadable as exc:
            raise Refused(400, str(exc)) from None
        if found:
            raise Refused(400, found)
        return _bolt_request(text, request)

    def _signature_headers(self, request: web.Request) -> tuple[str, str]:
        timestamp = request.headers.get("X-Slack-Request-Timestamp", "")
        signature = request.headers.get("X-Slack-Signature", "")
        if not (timestamp and signature):
            raise Refused(401, "no Slack signature")
        if not _TIMESTAMP.fullmatch(timestamp):
            raise Refused(401, "the signature's timestamp is not a number")
        if abs(self._clock() - int(timestamp)) > MAX_AGE_SECONDS:
            raise Refused(401, "the signature's timestamp is more than five minutes off")
        return timestamp, signature

    def _signed(self, body: bytes, timestamp: str, signature: str) -> bool:
        # Slack's v0 scheme (slack_sdk's SignatureVerifier), over the body's bytes: the SDK's
        # decodes them first and raises on bytes that are not UTF-8, and on a non-ASCII header.
        message = b"v0:" + timestamp.encode() + b":" + body
        expected = "v0=" + hmac.new(self._secret, message, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace"))


async def _read(request: web.Request) -> bytes:
    """The body, at most ``MAX_BODY`` bytes: a bigger one is refused without reading it all."""
    declared = request.content_length
    if declared is not None and declared > MAX_BODY:
        raise Refused(413, f"the body is over {MAX_BODY} bytes")
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(MAX_BODY + 1 - size):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY:
            raise Refused(413, f"the body is over {MAX_BODY} bytes")
    return b"".join(chunks)


def _bolt_request(text: str, request: web.Request) -> AsyncBoltRequest:
    # Bolt reads the ids it routes on while it builds the request: a field the shape check
    # does not know that bolt cannot read still ends here, not in a traceback.
    try:
        return AsyncBoltRequest(
            body=text,
            query=request.query_string,
            headers=dict(request.headers),
        )
    except Exception as exc:
        raise Refused(400, f"bolt cannot read the body ({type(exc).__name__})") from None


class GatedSocketMode(AsyncSocketModeHandler):
    """Socket Mode, where a malformed envelope is acknowledged (Slack would send it again) and
    refused in one line instead of reaching bolt."""

    async def handle(  # type: ignore[override]
        self, client: SocketModeClient, req: SocketModeRequest
    ) -> None:
        """Bolt's handling of a well-formed envelope; an acknowledgement alone for another."""
        found = _envelope_problem(req)
        if found is None:
            await super().handle(client, req)
            return
        log.warning("slack: refused a Socket Mode %s envelope: %s", _short(req.type), found)
        await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))


def _envelope_problem(req: SocketModeRequest) -> str | None:
    if req.type not in ("events_api", "interactive", "slash_commands"):
        return None
    if deeper_than(req.payload, MAX_DEPTH):
        return f"the payload nests more than {MAX_DEPTH} levels"
    return problem(req.payload)


async def on_bolt_error(error: Exception, body: Any) -> None:
    """Bolt's error handler: a request no listener takes (answered 404), or what fails inside
    bolt, is one line (bolt's own are a traceback, or a code sample of a listener to add)."""
    if isinstance(error, BoltUnhandledRequestError):
        log.warning("slack: no listener takes this %s request (404)", _what(body))
        return
    log.error(
        "slack: a %s request failed in bolt: %s: %s", _what(body), type(error).__name__, error
    )


def _what(body: Any) -> str:
    """The request's type, with its event's type or its action's id: ``event_callback
    (reaction_added)``. Socket Mode's bodies are not gated: nothing is assumed of them."""
    if not isinstance(body, dict):
        return "?"
    event, actions = body.get("event"), body.get("actions")
    detail = None
    if isinstance(event, dict):
        detail = event.get("type")
    elif isinstance(actions, list) and actions and isinstance(actions[0], dict):
        detail = actions[0].get("action_id")
    what = _short(body.get("type") or body.get("command"))
    return f"{what} ({_short(detail)})" if detail else what


def _short(value: object) -> str:
    return " ".join(str(value).split())[:80]
