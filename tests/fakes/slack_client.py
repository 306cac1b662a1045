"""Play Slack towards an app's HTTP endpoint: signed requests and realistic payloads.

``SlackSender(url, signing_secret)`` posts to ``url`` (e.g. ``http://127.0.0.1:P/slack/events``)
the way Slack does: ``X-Slack-Request-Timestamp`` + ``X-Slack-Signature`` (v0 HMAC over
``v0:<ts>:<body>``), JSON bodies for the Events API, ``payload=<json>`` forms for interactivity,
plain forms for slash commands. The payload builders below produce the shapes slack-bolt's own
tests use (``tests/scenario_tests_async`` in slackapi/bolt-python); they are plain dicts, so they
also feed Socket Mode envelopes (``tests.fakes.slack_api.events_api_envelope(event_callback(..))``).

Given ``api=FakeSlackApi``, the sender also (a) stores the user messages of ``message`` and
``app_mention`` events in the fake (so ``conversations.replies`` sees them, as in real Slack) and
(b) replaces the placeholder :data:`PLACEHOLDER_RESPONSE_URL` in actions and commands with a
fresh ``api.new_response_url()``, whose posts the fake records.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import aiohttp
from slack_sdk.signature import SignatureVerifier

from tests.fakes.slack_api import next_ts, observe_ts

if TYPE_CHECKING:
    from tests.fakes.slack_api import FakeSlackApi

BOT_USER = "UBOT"
APP_ID = "A0001"
VERIFICATION_TOKEN = "verification_token"
#: The ``response_url`` builders use unless given one; a sender with ``api=`` swaps it.
PLACEHOLDER_RESPONSE_URL = "https://hooks.slack.com/actions/T0001/0/placeholder"

FORM = "application/x-www-form-urlencoded"


@dataclass(frozen=True)
class Response:
    """What the app answered."""

    status: int
    text: str
    json: Any | None  # the parsed body when it is JSON, else None
    elapsed: float  # seconds from sending to the full answer
    headers: Mapping[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- payloads


def event_callback(
    event: Mapping[str, Any],
    *,
    event_id: str | None = None,
    team: str = "T0001",
    bot_user: str = BOT_USER,
    app_id: str = APP_ID,
    authorizations: Sequence[Mapping[str, Any]] | None = None,
    event_time: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The Events API ``event_callback`` body wrapping ``event`` (``extra`` is merged in, e.g.
    ``is_ext_shared_channel=True``)."""
    return {
        "token": VERIFICATION_TOKEN,
        "team_id": team,
        "api_app_id": app_id,
        "event": dict(event),
        "type": "event_callback",
        "event_id": event_id or f"Ev{uuid.uuid4().hex[:10].upper()}",
        "event_time": event_time if event_time is not None else int(time.time()),
        "authorizations": [dict(a) for a in authorizations]
        if authorizations is not None
        else [
            {
                "enterprise_id": None,
                "team_id": team,
                "user_id": bot_user,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
        "event_context": f"4-{event.get('type', 'event')}-{team}-{event.get('channel', '')}",
        **extra,
    }


def app_mention(
    user: str,
    text: str,
    channel: str = "C0001",
    ts: str | None = None,
    thread_ts: str | None = None,
    team: str = "T0001",
    *,
    bot_user: str = BOT_USER,
    user_team: str | None = None,
) -> dict[str, Any]:
    """An ``app_mention`` event; ``text`` gets a leading ``<@UBOT> `` unless it mentions the bot."""
    ts = _ts(ts)
    mention = f"<@{bot_user}>"
    event: dict[str, Any] = {
        "client_msg_id": str(uuid.uuid4()),
        "type": "app_mention",
        "text": text if mention in text else f"{mention} {text}",
        "user": user,
        "ts": ts,
        "team": team,
        "channel": channel,
        "event_ts": ts,
    }
    if user_team is not None:
        event["user_team"] = user_team
    if thread_ts is not None:
        event["thread_ts"] = thread_ts
    return event


def message(
    user: str,
    text: str,
    channel: str = "C0001",
    ts: str | None = None,
    thread_ts: str | None = None,
    team: str = "T0001",
    bot_id: str | None = None,
    subtype: str | None = None,
) -> dict[str, Any]:
    """A ``message`` event (``channel_type`` "im" for D... channels); with ``bot_id`` a bot's."""
    ts = _ts(ts)
    event: dict[str, Any] = {
        "type": "message",
        "text": text,
        "user": user,
        "ts": ts,
        "team": team,
        "channel": channel,
        "event_ts": ts,
        "channel_type": "im" if channel.startswith("D") else "channel",
    }
    if bot_id is None:
        event["client_msg_id"] = str(uuid.uuid4())
    else:
        event["bot_id"] = bot_id
    if subtype is not None:
        event["subtype"] = subtype
    if thread_ts is not None:
        event["thread_ts"] = thread_ts
    return event


def block_actions(
    user: str,
    action_id: str,
    value: str,
    *,
    channel: str,
    message_ts: str,
    thread_ts: str | None = None,
    team: str = "T0001",
    user_team: str | None = None,
    trigger_id: str = "trig.1",
    block_id: str = "b",
    response_url: str = PLACEHOLDER_RESPONSE_URL,
    message: Mapping[str, Any] | None = None,
    bot_user: str = BOT_USER,
    app_id: str = APP_ID,
) -> dict[str, Any]:
    """A ``block_actions`` payload for a button click on the (bot's) message ``message_ts``.

    ``user_team`` is the clicking user's team (a Slack Connect guest); defaults to ``team``.
    ``message`` overrides the clicked message's fields.
    """
    container: dict[str, Any] = {
        "type": "message",
        "message_ts": message_ts,
        "channel_id": channel,
        "is_ephemeral": False,
    }
    clicked: dict[str, Any] = {
        "type": "message",
        "ts": message_ts,
        "user": bot_user,
        "bot_id": "B0001",
        "app_id": app_id,
        "team": team,
        "text": "",
        "blocks": [],
    }
    if thread_ts is not None:
        container["thread_ts"] = thread_ts
        clicked["thread_ts"] = thread_ts
    clicked.update(message or {})
    return {
        "type": "block_actions",
        "user": {
            "id": user,
            "username": user.lower(),
            "name": user.lower(),
            "team_id": user_team or team,
        },
        "api_app_id": app_id,
        "token": VERIFICATION_TOKEN,
        "container": container,
        "trigger_id": trigger_id,
        "team": {"id": team, "domain": "test"},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel, "name": channel.lower()},
        "message": clicked,
        "state": {"values": {}},
        "response_url": response_url,
        "actions": [
            {
                "action_id": action_id,
                "block_id": block_id,
                "text": {"type": "plain_text", "text": "Button", "emoji": True},
                "value": value,
                "type": "button",
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }


def view_submission(
    user: str,
    callback_id: str,
    private_metadata: str,
    values: Mapping[str, Mapping[str, Any]],
    team: str = "T0001",
    *,
    user_team: str | None = None,
    view_id: str = "V0001",
    trigger_id: str = "trig.1",
    app_id: str = APP_ID,
) -> dict[str, Any]:
    """A ``view_submission`` payload; ``values`` is ``view.state.values`` ({block_id: {action_id:
    state}}), where a plain string state means a ``plain_text_input`` with that value."""
    state = {
        block: {
            action: {"type": "plain_text_input", "value": v} if isinstance(v, str) else dict(v)
            for action, v in actions.items()
        }
        for block, actions in values.items()
    }
    return {
        "type": "view_submission",
        "team": {"id": team, "domain": "test"},
        "user": {
            "id": user,
            "username": user.lower(),
            "name": user.lower(),
            "team_id": user_team or team,
        },
        "api_app_id": app_id,
        "token": VERIFICATION_TOKEN,
        "trigger_id": trigger_id,
        "view": {
            "id": view_id,
            "team_id": team,
            "type": "modal",
            "blocks": [],
            "private_metadata": private_metadata,
            "callback_id": callback_id,
            "state": {"values": state},
            "hash": f"{int(time.time())}.fake",
            "title": {"type": "plain_text", "text": "Kestrel"},
            "clear_on_close": False,
            "notify_on_close": False,
            "close": None,
            "submit": {"type": "plain_text", "text": "Submit"},
            "previous_view_id": None,
            "root_view_id": view_id,
            "app_id": app_id,
            "external_id": "",
            "app_installed_team_id": team,
            "bot_id": "B0001",
        },
        "response_urls": [],
        "is_enterprise_install": False,
        "enterprise": None,
    }


def slash_command(
    user: str,
    text: str,
    channel: str = "C0001",
    team: str = "T0001",
    *,
    command: str = "/kestrel",
    response_url: str = PLACEHOLDER_RESPONSE_URL,
    trigger_id: str = "trig.1",
    app_id: str = APP_ID,
) -> dict[str, str]:
    """A slash command's form fields (send with :meth:`SlackSender.command`)."""
    return {
        "token": VERIFICATION_TOKEN,
        "team_id": team,
        "team_domain": "test",
        "channel_id": channel,
        "channel_name": channel.lower(),
        "user_id": user,
        "user_name": user.lower(),
        "command": command,
        "text": text,
        "api_app_id": app_id,
        "is_enterprise_install": "false",
        "response_url": response_url,
        "trigger_id": trigger_id,
    }


def _ts(ts: str | None) -> str:
    if ts is None:
        return next_ts()
    observe_ts(ts)
    return ts


# --------------------------------------------------------------------------- sender


class SlackSender:
    """Sends correctly signed requests to a Slack app's HTTP endpoint (see module docstring)."""

    def __init__(
        self,
        url: str,
        signing_secret: str,
        *,
        api: FakeSlackApi | None = None,
        bot_user: str = BOT_USER,
        app_id: str = APP_ID,
        timeout: float = 10.0,
    ) -> None:
        self.url = url
        self.signing_secret = signing_secret
        self.api = api
        self.bot_user = bot_user
        self.app_id = app_id
        self.timeout = timeout
        self._verifier = SignatureVerifier(signing_secret)

    def sign(self, body: bytes, timestamp: str | None = None) -> dict[str, str]:
        """The two signature headers for ``body`` (now, unless ``timestamp`` is given)."""
        ts = timestamp or str(int(time.time()))
        try:
            signature = self._verifier.generate_signature(timestamp=ts, body=body)
        except UnicodeDecodeError:  # the SDK signs text only; Slack's scheme is over bytes
            message = b"v0:" + ts.encode() + b":" + body
            digest = hmac.new(self.signing_secret.encode(), message, hashlib.sha256).hexdigest()
            signature = f"v0={digest}"
        assert signature is not None
        return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": signature}

    async def event(
        self,
        event: Mapping[str, Any],
        *,
        event_id: str | None = None,
        team: str = "T0001",
        retry_num: int | None = None,
        retry_reason: str = "http_timeout",
        authorizations: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> Response:
        """POST an ``event_callback`` wrapping ``event`` (see :func:`event_callback`); with
        ``retry_num`` adds ``X-Slack-Retry-Num``/``X-Slack-Retry-Reason`` as Slack's retries do."""
        body = event_callback(
            event,
            event_id=event_id,
            team=team,
            bot_user=self.bot_user,
            app_id=self.app_id,
            authorizations=authorizations,
            **extra,
        )
        if self.api is not None and event.get("type") in ("message", "app_mention"):
            self._store(event)
        headers = {"Content-Type": "application/json"}
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = retry_reason
        return await self.raw(json.dumps(body).encode(), headers)

    async def event_body(
        self, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> Response:
        """POST an Events API body exactly as given (e.g. a prebuilt :func:`event_callback`)."""
        return await self.raw(
            json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
        )

    async def url_verification(self, challenge: str = "challenge-1") -> Response:
        """Slack's ``url_verification`` handshake."""
        body = {"token": VERIFICATION_TOKEN, "challenge": challenge, "type": "url_verification"}
        return await self.event_body(body)

    async def action(self, payload: Mapping[str, Any]) -> Response:
        """POST an interactivity payload as the form ``payload=<json>``."""
        payload = self._with_response_url(payload)
        body = urlencode({"payload": json.dumps(payload)}).encode()
        return await self.raw(body, {"Content-Type": FORM})

    async def command(self, form: Mapping[str, str]) -> Response:
        """POST a slash command's form (see :func:`slash_command`)."""
        body = urlencode(dict(self._with_response_url(form))).encode()
        return await self.raw(body, {"Content-Type": FORM})

    async def raw(
        self,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        sign: bool = True,
        timestamp: str | None = None,
    ) -> Response:
        """POST ``body`` with ``headers``; signed (at ``timestamp``, default now) unless ``sign`` is
        False. Headers given win over the signature headers."""
        all_headers = {**(self.sign(body, timestamp) if sign else {}), **(headers or {})}
        started = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(self.url, data=body, headers=all_headers) as response,
        ):
            text = await response.text()
            elapsed = time.monotonic() - started
            try:
                parsed: Any | None = json.loads(text) if text else None
            except ValueError:
                parsed = None
            return Response(
                status=response.status,
                text=text,
                json=parsed,
                elapsed=elapsed,
                headers={k: v for k, v in response.headers.items()},
            )

    async def bad_signature(
        self, body: bytes | Mapping[str, Any] | None = None, *, timestamp: str | None = None
    ) -> Response:
        """POST ``body`` (default: an app_mention event_callback; a mapping is sent as JSON)
        signed with the wrong secret; an app verifying requests answers 401."""
        if body is None:
            body = event_callback(app_mention("U0001", "hello"), bot_user=self.bot_user)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        ts = timestamp or str(int(time.time()))
        wrong = SignatureVerifier(self.signing_secret + "-wrong").generate_signature(
            timestamp=ts, body=data
        )
        assert wrong is not None
        headers = {
            "Content-Type": "application/json",
            "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": wrong,
        }
        return await self.raw(data, headers, sign=False)

    async def stale(self, body: bytes | None = None, *, age: int = 600) -> Response:
        """POST a correctly signed body whose timestamp is ``age`` seconds old (Bolt: 401)."""
        if body is None:
            body = json.dumps(event_callback(app_mention("U0001", "hello"))).encode()
        timestamp = str(int(time.time()) - age)
        return await self.raw(body, {"Content-Type": "application/json"}, timestamp=timestamp)

    def _store(self, event: Mapping[str, Any]) -> None:
        assert self.api is not None
        extra = {k: event[k] for k in ("bot_id", "subtype") if k in event}
        self.api.add_message(
            str(event.get("channel", "")),
            user=str(event.get("user", "")),
            text=str(event.get("text", "")),
            ts=str(event["ts"]) if "ts" in event else None,
            thread_ts=event.get("thread_ts"),
            team=event.get("team"),
            **extra,
        )

    def _with_response_url(self, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        if self.api is None or payload.get("response_url") != PLACEHOLDER_RESPONSE_URL:
            return payload
        return {**payload, "response_url": self.api.new_response_url()}
