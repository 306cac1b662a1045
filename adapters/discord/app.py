"""The Discord adapter's life: log in (a bad token fails here, naming it), connect to the
gateway REST hands out, deliver the outbox, keep typing indicators alive, and stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Final

import aiohttp
import discord
import yarl
from aiohttp import web
from discord.gateway import DiscordWebSocket

from adapters.discord.client import KestrelDiscord
from adapters.discord.interactions import INTERACTIONS_PATH, InteractionEndpoint, public_key
from adapters.discord.settings import DEFAULT_API, DiscordSettings
from adapters.reconnect import Reconnecting
from adapters.unreachable import unreachable, why
from bot.chat.contract import ConfigError, Outbox
from bot.chat.links import RunLink
from bot.chat.service import ChatService

log = logging.getLogger("kestrel.discord")
# discord.py's line as it tries a connection again: before the first READY a doomed try (it
# resumes a session it never had), said once per try, where this adapter says each problem once.
_RETRYING: Final = "Attempting a reconnect in"

READY_SECONDS = 30.0
# How long the REST calls of the start (the login, the gateway's URL) may take: discord.py's
# HTTP client has no bound of its own, and an API that took the connection and said nothing
# held the start forever, without a line at any level (Slack's client gives up at 30 s too).
LOGIN_SECONDS = 30.0
STOP_SECONDS = 5.0


class DiscordAdapter:
    """Kestrel in Discord: ``start`` connects and serves; ``stop`` disconnects."""

    def __init__(
        self,
        chat: ChatService,
        outbox: Outbox,
        owner: str,
        settings: DiscordSettings,
        *,
        guild_ready_timeout: float = 2.0,
        link: RunLink | None = None,
        claim_seconds: float = 60.0,
    ) -> None:
        self.settings = settings
        self._chat = chat
        # Every REST call (interaction callbacks included) and the gateway URL come from here.
        discord.http.Route.BASE = settings.api_url
        self.client = KestrelDiscord(
            chat,
            outbox,
            owner,
            message_content=settings.message_content,
            guild_ready_timeout=guild_ready_timeout,
            link=link,
            pings=settings.ping_approvers,
            claim_seconds=claim_seconds,
            catch_up=timedelta(minutes=settings.catch_up_minutes),
        )
        self._connecting: asyncio.Task[None] | None = None
        self._reconnecting = Reconnecting("discord", "discord: the gateway", log)
        self._stopping = False
        # Why the gateway connection ended for good once served ("" while discord.py keeps it).
        self._ended_why = ""

    async def start(self) -> discord.ClientUser:
        """Log in (a token refused or an API out of reach fails here), connect and wait until
        the gateway says READY, then serve; Discord failing to connect (a 5xx, a reset, no
        READY in 30 s) is tried again in the background (``connecting``) while serve goes on."""
        client = self.client
        try:
            async with asyncio.timeout(LOGIN_SECONDS):
                await client.login(self.settings.token)
                await self._use_gateway_rest_names()
        except discord.LoginFailure as exc:
            await client.close()
            raise ConfigError(f"discord: DISCORD_TOKEN was refused: {exc}") from exc
        except discord.RateLimited as exc:
            await client.close()
            raise _limited(exc) from exc
        except (discord.HTTPException, OSError, aiohttp.ClientError, ValueError) as exc:
            await client.close()
            url = self.settings.api_url
            moved = url != DEFAULT_API
            raise ConfigError(
                unreachable("discord", url, exc, variable="DISCORD_API_URL", moved=moved)
            ) from exc
        logging.getLogger("discord.client").addFilter(self._before_ready)
        try:
            problem = await self._connect_once()
        except ConfigError:
            self._show_reconnect_lines()
            raise
        if problem:
            # Discord failing, no mistake: the port opens meanwhile (/healthz answers, /readyz
            # says discord is not connected), where serve exited 75 to be started again.
            self._reconnecting.start(self._connect_once, problem, self._show_reconnect_lines)
        assert client.user is not None  # the login read it
        return client.user

    def _before_ready(self, record: logging.LogRecord) -> bool:
        """Drop discord.py's reconnect line until a connection says READY (its retries then
        are real; before, ``Reconnecting`` says what fails, once)."""
        return not str(record.msg).startswith(_RETRYING)

    def _show_reconnect_lines(self) -> None:
        """Let discord.py's reconnect lines through again: a connection said READY (its
        retries are real from now on), or none is tried any more."""
        logging.getLogger("discord.client").removeFilter(self._before_ready)

    @property
    def connecting(self) -> bool:
        """Whether the gateway is still being tried for the first time (after a failure)."""
        return self._reconnecting.trying

    @property
    def gave_up(self) -> str:
        """Why the gateway connection ended for good ("" while discord.py keeps it or tries)."""
        return self._ended_why or self._reconnecting.gave_up

    async def _connect_once(self) -> str:
        """Connect and wait until the gateway says READY, then serve, beginning with the
        mentions said while no session was connected: "" then; else what failed, when Discord
        failed (``ConfigError`` for a mistake to mend: an intent not enabled, the token)."""
        client = self.client
        connecting = asyncio.create_task(client.connect(reconnect=True), name="discord-gateway")
        ready = asyncio.create_task(client.wait_until_ready())
        done, _ = await asyncio.wait(
            [connecting, ready], timeout=READY_SECONDS, return_when=asyncio.FIRST_COMPLETED
        )
        if ready not in done:
            ready.cancel()
            return await self._failed_connect(connecting)
        self._connecting = connecting
        self._show_reconnect_lines()
        connecting.add_done_callback(self._ended)
        await client.life.start()
        client.serve()
        return ""

    def add_routes(self, application: web.Application) -> str:
        """Take interactions over HTTP too when the application's public key is set; where
        (empty without the key)."""
        if not self.settings.public_key:
            return ""
        key = public_key(self.settings.public_key)
        InteractionEndpoint(self.client, key).add_to(application)
        return INTERACTIONS_PATH

    async def connected(self) -> bool:
        """Whether the gateway connection is open now (discord.py reconnects by itself; until
        it has, this says no)."""
        client = self.client
        ws = client.ws
        return client.is_ready() and not client.is_closed() and ws is not None and ws.open

    def drain(self) -> None:
        """Take no new event from now on: the other replicas' sessions get each one too."""
        self.client.drain()

    def _ended(self, connecting: asyncio.Task[None]) -> None:
        """The gateway's task ended while serving: discord.py stopped trying (a close code it
        takes as fatal: 4004, the token refused; 4010-4014). Said once, as an error, and kept
        for ``/readyz``; readiness said "reconnecting" for ever, and the log nothing."""
        if self._stopping or connecting.cancelled():
            return
        error = connecting.exception()
        if refused := _token_refused(error):
            self._ended_why = refused
        elif error is not None:
            self._ended_why = f"{type(error).__name__}: {error}"
        else:
            self._ended_why = "the gateway connection closed"
        log.error(
            "discord: the gateway connection ended and is not tried again: %s; this replica"
            " serves Discord no more until it is restarted (with a new token, if refused)",
            self.gave_up,
        )

    async def stop(self) -> None:
        """Finish what is being handled, rendered and delivered, then close the connection."""
        self._stopping = True
        self._show_reconnect_lines()
        await self._reconnecting.stop()
        client = self.client
        client.drain()
        # A message or a click cut by the closing connection would be taken and never shown.
        await client.handled(STOP_SECONDS)
        await client.life.stop(STOP_SECONDS)
        await client.close()
        if self._connecting is not None:
            self._connecting.cancel()
            await asyncio.gather(self._connecting, return_exceptions=True)

    async def _use_gateway_rest_names(self) -> None:
        # A single-shard client connects where discord.py was told, not where REST says:
        # ask REST (GET /gateway/bot), so that a proxy or a stand-in serves the gateway too.
        try:
            _shards, url, _limits = await self.client.http.get_bot_gateway()
        except discord.GatewayNotFound as exc:
            await self.client.close()
            raise ConfigError(f"discord: {self.settings.api_url} gave no gateway URL") from exc
        except discord.RateLimited as exc:
            await self.client.close()
            raise _limited(exc) from exc
        DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(url)

    async def _failed_connect(self, connecting: asyncio.Task[None]) -> str:
        """What failed before READY, when Discord failed (a 5xx, a reset, no READY in time):
        tried again. A mistake to mend (an intent not enabled, the token refused) closes the
        client and is a ``ConfigError`` (exit 2 at start)."""
        if not connecting.done():
            connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await connecting
            return f"the gateway did not say READY in {READY_SECONDS:.0f} s"
        # None: the gateway closed the connection cleanly before READY.
        error = connecting.exception() or ConnectionError("closed before READY")
        if isinstance(error, AttributeError) and error.__context__ is not None:
            # discord.py's first connection, refused (a 503 of the gateway, a reset), tries
            # to resume the session it never had ('NoneType' object has no attribute
            # 'sequence'): what went wrong is the refusal.
            error = error.__context__
        if isinstance(error, discord.PrivilegedIntentsRequired):
            await self.client.close()
            raise ConfigError(
                "discord: the Message Content intent is not enabled for this application:"
                " enable it in the Developer Portal (Bot → Privileged Gateway Intents), or set"
                " DISCORD_MESSAGE_CONTENT=false (thread replies then cannot answer questions;"
                " the Answer button still can)"
            ) from error
        if refused := _token_refused(error):
            await self.client.close()
            raise ConfigError(f"discord: {refused}") from error
        return f"the gateway connection failed: {why(error)}"


def _token_refused(error: BaseException | None) -> str:
    """What the gateway's close code 4004 (the token refused) says, "" for any other end."""
    if not isinstance(error, discord.ConnectionClosed) or error.code != 4004:
        return ""
    return f"DISCORD_TOKEN was refused (close code 4004: {error.reason or 'Authentication failed'})"


def _limited(exc: discord.RateLimited) -> ConfigError:
    """A 429 at start longer than the client sleeps out (an HTTPException it is not)."""
    return ConfigError(
        f"discord: rate limited for {exc.retry_after:.0f}s while logging in: start again after"
    )
