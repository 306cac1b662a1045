"""The Discord adapter's life: log in (a bad token fails here, naming it), connect to the
gateway REST hands out, deliver the outbox, keep typing indicators alive, and stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

import aiohttp
import discord
import yarl
from aiohttp import web
from discord.gateway import DiscordWebSocket

from adapters.discord.client import KestrelDiscord
from adapters.discord.interactions import INTERACTIONS_PATH, InteractionEndpoint, public_key
from adapters.discord.settings import DEFAULT_API, DiscordSettings
from adapters.unreachable import unreachable, why
from bot.chat.contract import ConfigError, Outbox
from bot.chat.links import RunLink
from bot.chat.service import ChatService

log = logging.getLogger("kestrel.discord")

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
        self._stopping = False
        # Why the gateway connection ended for good ("" while discord.py keeps it or tries).
        self.gave_up = ""

    async def start(self) -> discord.ClientUser:
        """Log in, connect and wait until the gateway says READY; then serve, beginning with
        the mentions said while no session was connected."""
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
        connecting = asyncio.create_task(client.connect(reconnect=True), name="discord-gateway")
        ready = asyncio.create_task(client.wait_until_ready())
        done, _ = await asyncio.wait(
            [connecting, ready], timeout=READY_SECONDS, return_when=asyncio.FIRST_COMPLETED
        )
        if ready not in done:
            ready.cancel()
            await self._fail_connect(connecting)
        assert client.user is not None
        self._connecting = connecting
        connecting.add_done_callback(self._ended)
        await client.life.start()
        client.serve()
        return client.user

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
        if isinstance(error, discord.ConnectionClosed) and error.code == 4004:
            reason = error.reason or "Authentication failed"
            self.gave_up = f"DISCORD_TOKEN was refused (close code 4004: {reason})"
        elif error is not None:
            self.gave_up = f"{type(error).__name__}: {error}"
        else:
            self.gave_up = "the gateway connection closed"
        log.error(
            "discord: the gateway connection ended and is not tried again: %s; this replica"
            " serves Discord no more until it is restarted (with a new token, if refused)",
            self.gave_up,
        )

    async def stop(self) -> None:
        """Finish what is being handled, rendered and delivered, then close the connection."""
        self._stopping = True
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

    async def _fail_connect(self, connecting: asyncio.Task[None]) -> None:
        if not connecting.done():
            connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await connecting
            await self.client.close()
            # Discord not answering, which a later start may get past (exit 75), no mistake.
            silent = TimeoutError(f"no READY in {READY_SECONDS:.0f} s")
            said = f"discord: the gateway did not say READY in {READY_SECONDS:.0f} s"
            raise ConfigError(said) from silent
        await self.client.close()
        # None: the gateway closed the connection cleanly before READY.
        error = connecting.exception() or ConnectionError("closed before READY")
        if isinstance(error, AttributeError) and error.__context__ is not None:
            # discord.py's first connection, refused (a 503 of the gateway, a reset), tries
            # to resume the session it never had ('NoneType' object has no attribute
            # 'sequence'): what went wrong is the refusal.
            error = error.__context__
        if isinstance(error, discord.PrivilegedIntentsRequired):
            raise ConfigError(
                "discord: the Message Content intent is not enabled for this application:"
                " enable it in the Developer Portal (Bot → Privileged Gateway Intents), or set"
                " DISCORD_MESSAGE_CONTENT=false (thread replies then cannot answer questions;"
                " the Answer button still can)"
            ) from error
        # Chained: a refusal that says Discord did not answer (a 5xx, a reset) exits 75.
        raise ConfigError(f"discord: the gateway connection failed: {why(error)}") from error


def _limited(exc: discord.RateLimited) -> ConfigError:
    """A 429 at start longer than the client sleeps out (an HTTPException it is not)."""
    return ConfigError(
        f"discord: rate limited for {exc.retry_after:.0f}s while logging in: start again after"
    )
