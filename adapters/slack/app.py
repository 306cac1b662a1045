"""The Slack adapter put together: bolt's ``AsyncApp``, its listeners, the outbox worker and
the progress refresher, served over HTTP (``/slack/events``) or Socket Mode."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.web.async_client import AsyncWebClient

from adapters.reconnect import Reconnecting
from adapters.slack import ids
from adapters.slack.gate import GatedSocketMode, SlackGate, on_bolt_error
from adapters.slack.identity import Identities
from adapters.slack.listeners import BotIdentity, SlackListeners
from adapters.slack.look import SlackLook
from adapters.slack.progress import Progress
from adapters.slack.settings import SlackSettings
from adapters.slack.transport import SlackTransport
from adapters.unreachable import unreachable, why
from bot.chat.contract import ConfigError, Outbox
from bot.chat.lifecycle import PlatformLife
from bot.chat.links import RunLink
from bot.chat.service import ChatService
from bot.oneline import one_line
from bot.user_agent import USER_AGENT

# What Slack answers for an app-level token it will never accept: a mistake to mend.
REFUSED_TOKEN = frozenset(
    {
        "invalid_auth",
        "not_authed",
        "not_allowed_token_type",
        "account_inactive",
        "token_revoked",
        "token_expired",
        # Created without ``connections:write``: no socket until a token that has it.
        "missing_scope",
    }
)
# What a refusal of the app-level token adds: how to mend it, where it is not the token itself.
REFUSED_HINT = {
    "missing_scope": " (an app-level token needs the connections:write scope: Basic Information"
    " → App-Level Tokens)",
}

log = logging.getLogger("kestrel.slack")

EVENTS_PATH = "/slack/events"
SLACK_API = "https://slack.com/api/"
STOP_SECONDS = 5.0
# How long the socket Slack handed out may take to open: well under a second where it can (the
# socket client would try one that cannot every 10 s for ever, and hold serve's start with it).
OPEN_SECONDS = 10.0
# Slack's word that who is in a user group or a channel changed: what Kestrel kept of it goes.
MEMBERSHIP_EVENTS = (
    "subteam_members_changed",
    "subteam_updated",
    "member_joined_channel",
    "member_left_channel",
)


class SlackAdapter:
    """Kestrel in Slack: ``start`` checks the token and wires everything; then serve it with
    ``web_app`` (HTTP mode) or ``connect`` (Socket Mode); ``stop`` ends both."""

    def __init__(
        self,
        chat: ChatService,
        outbox: Outbox,
        owner: str,
        settings: SlackSettings,
        *,
        refresh_seconds: float = 90.0,
        rate_limit_retries: int = 2,
        link: RunLink | None = None,
        claim_seconds: float = 60.0,
    ) -> None:
        self.settings = settings
        self._chat = chat
        client = _web_client(settings, rate_limit_retries)
        self.client = client
        # A client that waits out no rate limit: serve's start asks for its socket with it.
        self._unwaiting = _web_client(settings, 0)
        self.life = PlatformLife(
            chat,
            outbox,
            # That client too: the outbox puts a limited message off by its Retry-After and
            # goes on with the others (another channel's card).
            SlackTransport(self._unwaiting),
            owner,
            SlackLook(link),
            lambda deliveries: Progress(client, deliveries, refresh_seconds=refresh_seconds),
            name="slack",
            claim_seconds=claim_seconds,
        )
        self.deliveries = self.life.deliveries
        self.progress = self.life.progress
        self.renderer = self.life.renderer
        self.app: AsyncApp | None = None
        self.listeners: SlackListeners | None = None
        self._identities: Identities | None = None
        self._socket: GatedSocketMode | None = None
        self._reconnecting = Reconnecting("slack", "slack: Socket Mode", log)

    async def start(self) -> BotIdentity:
        """Check the token (``auth.test``), register the listeners, start delivering, and
        show the cards of requests that were opened while no process could post them."""
        me = await self._whoami()
        identities = self._identities = Identities(self.client, me.team, org=me.org)
        listeners = SlackListeners(
            self._chat, self.client, me, identities, self.progress, self.renderer, self._modal_key
        )
        self.listeners = listeners
        self.app = _bolt_app(self.settings, self.client, listeners)
        await self.life.start()
        return me

    @property
    def _modal_key(self) -> bytes:
        # Forms carry their origin sealed with a key only this app knows (its secrets).
        secret = self.settings.signing_secret or self.settings.bot_token
        return hashlib.sha256(b"kestrel-modal\0" + secret.encode()).digest()

    def web_app(self) -> web.Application:
        """The HTTP endpoint: ``POST /slack/events`` (events, interactivity, the command),
        behind ``SlackGate``: only signed, well-formed bodies of at most 1 MiB reach bolt."""
        assert self.app is not None, "start() first"
        application = web.Application()
        gate = SlackGate(self.app, self.settings.signing_secret)
        application.router.add_post(EVENTS_PATH, gate.handle)
        return application

    async def connect(self) -> None:
        """Socket Mode: connect out with the app-level token (no public URL needed). A token
        Slack refuses fails here (exit 2); Slack failing (an error of its own, a 5xx, no
        answer) is tried again in the background, with backoff, while the replica serves its
        port and ``/readyz`` says Slack is not connected."""
        assert self.app is not None, "start() first"
        # Asked once, not waiting out a rate limit (Slack's Retry-After for this Tier 1 method,
        # twice, held the port shut past a startup probe): the background tries wait it out.
        problem = await self._socket_once(self._unwaiting)
        if problem:
            self._reconnecting.start(self._socket_once, problem)

    @property
    def gave_up(self) -> str:
        """Why Socket Mode is no longer tried ("" while connected or trying): the token
        refused."""
        return self._reconnecting.gave_up

    async def _open_socket_url(self, client: AsyncWebClient | None = None) -> tuple[str, str]:
        """Ask Slack for a socket with the app-level token (through ``client``, else the
        adapter's): its URL, or ("", what failed). One Slack refuses is a mistake to mend, said
        in one line (``ConfigError``, exit 2), where the socket client asked again every 10 s
        forever, while nothing listened."""
        asking = client or self.client
        try:
            reply = await asking.apps_connections_open(app_token=self.settings.app_token)
        except SlackApiError as exc:
            error = exc.response.get("error")
            if error in REFUSED_TOKEN:
                said = f"slack: apps.connections.open refused SLACK_APP_TOKEN: {error}"
                said += REFUSED_HINT.get(error, "")
                raise ConfigError(said) from exc
            return "", f"apps.connections.open said {error or f'HTTP {exc.response.status_code}'}"
        except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return "", f"apps.connections.open failed: {why(exc)}"
        url = reply.get("url")
        if not isinstance(url, str) or not url:
            return "", "apps.connections.open gave no URL"
        return url, ""

    async def _socket_once(self, client: AsyncWebClient | None = None) -> str:
        """One more try of Socket Mode: "" once connected, else what failed."""
        url, problem = await self._open_socket_url(client)
        return await self._socket_to(url) if url else problem

    async def _socket_to(self, url: str) -> str:
        """Open the websocket Slack handed out: "" once open (the socket client keeps it, and
        reconnects), else why not (a firewall or a proxy that lets the Web API through and not
        the socket's host): the next try asks Slack for a new one."""
        assert self.app is not None, "start() first"
        self._socket = GatedSocketMode(self.app, self.settings.app_token)
        client = self._socket.client
        client.wss_uri = url  # asked for once already: not asked for again
        # Each later socket (Slack replaces one after hours; one drops) is asked for as this
        # one was, so that a token refused then ends the tries as it does at start.
        again = functools.partial(self._socket_url_again, client)
        client.issue_new_wss_url = again  # type: ignore[method-assign]
        opening = self._socket.connect_async()  # type: ignore[no-untyped-call]
        try:
            await asyncio.wait_for(opening, OPEN_SECONDS)
        except TimeoutError:
            socket, self._socket = self._socket, None
            await socket.close_async()  # type: ignore[no-untyped-call]
            host = urlsplit(url).hostname  # never the URL: its query is a ticket to the socket
            return f"the socket at {host} did not open within {OPEN_SECONDS:.0f} s"
        return ""

    async def _socket_url_again(self, client: SocketModeClient) -> str:
        """A new socket's URL as the socket client connects again. A token Slack refuses now
        is one error line naming it and the client's last try, where it asked every 10 s for
        ever, two errors a time, and ``/readyz`` said it was reconnecting; anything else fails
        for the client to try again."""
        try:
            url, problem = await self._open_socket_url()
        except ConfigError as exc:
            client.closed = True  # its loops end: nothing lets it connect again
            client.auto_reconnect_enabled = client.default_auto_reconnect_enabled = False
            await client.disconnect()  # type: ignore[no-untyped-call]
            self._reconnecting.refused(exc)
            raise
        if not url:
            raise ConnectionError(f"slack: {problem}")
        return url

    async def connected(self) -> bool:
        """HTTP mode: auth.test passed at ``start``; Socket Mode: the websocket is open now
        (the client reconnects by itself; until it has, this says no)."""
        if not self.settings.socket_mode:
            return self.app is not None
        if self._socket is None:
            return False
        connected: bool = await self._socket.client.is_connected()
        return connected

    async def stop(self) -> None:
        """Disconnect, stop delivering and refreshing (the outbox keeps what is undelivered)."""
        await self._reconnecting.stop()
        if self._socket is not None:
            await self._socket.close_async()  # type: ignore[no-untyped-call]
        if self.listeners is not None:
            await self.listeners.idle(timeout=STOP_SECONDS)
        if self._identities is not None:
            await self._identities.close()
        await self.life.stop(STOP_SECONDS)

    async def _whoami(self) -> BotIdentity:
        try:
            reply = await self.client.auth_test()
        except SlackApiError as exc:
            error = exc.response.get("error") or exc
            raise ConfigError(f"slack: auth.test refused SLACK_BOT_TOKEN: {error}") from exc
        except (OSError, aiohttp.ClientError, ValueError) as exc:
            where, moved = self.settings.api_url or SLACK_API, bool(self.settings.api_url)
            said = unreachable("slack", where, exc, variable="SLACK_API_URL", moved=moved)
            raise ConfigError(said) from exc
        if reply.get("is_enterprise_install"):
            # An org-wide token acts for many workspaces (clicks may name none, methods need a
            # team_id): Kestrel serves the one workspace its token is installed in.
            raise ConfigError(
                "slack: SLACK_BOT_TOKEN is an organisation-wide (Enterprise Grid) installation's;"
                " Kestrel serves one workspace: install the app to that workspace (the"
                " manifest's org_deploy_enabled: false) and use that installation's bot token"
            )
        org = str(reply.get("enterprise_id") or "")
        return BotIdentity(str(reply["team_id"]), str(reply["user_id"]), org)


class KestrelAgent(dict[str, str]):
    """Request headers whose User-Agent starts with Kestrel's whoever sets it: bolt makes a
    client per request that shares this dict and sets the User-Agent again, without it."""

    def __setitem__(self, key: str, value: str) -> None:
        if key.lower() == "user-agent" and not value.startswith(USER_AGENT):
            value = f"{USER_AGENT} {value}"
        super().__setitem__(key, value)


def _web_client(settings: SlackSettings, rate_limit_retries: int) -> AsyncWebClient:
    """A Web API client that retries a rate-limited call ``rate_limit_retries`` times, after
    the wait Slack asks for, and nothing else: slack-sdk's default retry of a broken
    connection would send a post that may have landed a second time (the outbox retries it
    after looking it up)."""
    client = AsyncWebClient(
        token=settings.bot_token,
        base_url=settings.api_url or SLACK_API,
        user_agent_prefix=USER_AGENT,
    )
    client.headers = KestrelAgent(client.headers)
    client.retry_handlers = (
        [AsyncRateLimitErrorRetryHandler(max_retry_count=rate_limit_retries)]
        if rate_limit_retries
        else []
    )
    return client


def _bolt_app(settings: SlackSettings, client: AsyncWebClient, on: SlackListeners) -> AsyncApp:
    app = AsyncApp(
        # The token, not our client: given a client, bolt still reads SLACK_BOT_TOKEN from the
        # environment and warns at every start that it is unused. With a token it authorizes as
        # it did with our client's: one workspace, auth.test once, on the first request.
        token=client.token,
        signing_secret=settings.signing_secret or None,
        # Socket Mode requests come over our own authenticated connection: nothing to sign.
        request_verification_enabled=not settings.socket_mode,
        # Listeners hand their work to tasks: respond as soon as they return.
        process_before_response=True,
        # A request no listener takes goes to ``on_bolt_error``: one line, not a code sample.
        raise_error_for_unhandled_request=True,
        # Bolt's (and its Socket Mode client's) tracebacks are one line each.
        logger=one_line("kestrel.slack.bolt"),
    )
    _calls_as(app.client, client)
    app.event("app_mention")(on.on_app_mention)
    app.event("message")(on.on_message)
    app.event("app_home_opened")(on.on_home_opened)
    app.event("app_uninstalled")(on.on_uninstalled)
    app.event("tokens_revoked")(on.on_uninstalled)
    for changed in MEMBERSHIP_EVENTS:
        app.event(changed)(on.on_members_changed)
    app.action(ids.ACTION_PATTERN)(on.on_action)
    app.view(ids.DENY_MODAL)(on.on_deny_submitted)
    app.view(ids.ANSWER_MODAL)(on.on_answer_submitted)
    app.command("/kestrel")(on.on_command)
    app.error(on_bolt_error)
    return app


def _calls_as(bolt: AsyncWebClient, ours: AsyncWebClient) -> None:
    """Bolt's client calls Slack where and as ``ours`` does: the base URL (``SLACK_API_URL``),
    the headers (our User-Agent) and the retries. Bolt copies them into the client it makes for
    each request (its auth.test among them) and opens Socket Mode connections with its own."""
    bolt.base_url = ours.base_url
    bolt.headers = ours.headers
    bolt.retry_handlers = ours.retry_handlers
