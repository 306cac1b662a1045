"""What ``kestrel serve`` puts in front of the runs: the chat platforms, and one HTTP listener
for ``/healthz``, the run pages, ``/metrics`` and Slack's endpoint (unless in Socket Mode)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Final, NamedTuple

from aiohttp import web

from bot.chat.service import ChatService
from bot.config.settings import ConfigError, WebSettings
from bot.config.sources import environment
from bot.logs import set_replica
from bot.oneline import one_line
from bot.replica.health import Health

if TYPE_CHECKING:
    from adapters.discord.app import DiscordAdapter
    from adapters.discord.settings import DiscordSettings
    from adapters.slack.app import SlackAdapter
    from adapters.slack.settings import SlackSettings
    from adapters.web.auth import WebConfig
    from bot.chat.links import RunLink
    from bot.replica.metrics import Metrics
    from bot.run.supervisor import Supervisor

DEFAULT_PORT = 3000
# What aiohttp says of a request it cannot parse (a URL or header over 8 KiB, bytes that are not
# HTTP) or of a handler that raised: each is one line here, never a traceback.
HTTP_LOG: Final = "kestrel.http"
METRICS_OFF: Final = (
    "The metrics are off: set KESTREL_WEB_TOKEN (operators), or web.metrics_public: true"
    " (a scraper without the token)."
)
METRICS_UNAUTHORIZED: Final = (
    "Authorization required: a scraper sends Authorization: Bearer $KESTREL_WEB_TOKEN (a"
    " browser asks for it: any user name, the token as the password), or set"
    " web.metrics_public: true to serve /metrics without it."
)


def _unbound(exc: OSError) -> str:
    """Why the listener could not bind, once (asyncio's text repeats the address), and what
    to do when the port is taken."""
    import errno
    import os

    if exc.errno is None or exc.errno <= 0:  # a name that does not resolve (EAI_*): its own
        return (exc.strerror or str(exc)).lower()
    said = os.strerror(exc.errno).lower()
    if exc.errno == errno.EADDRINUSE:
        return f"{said} (another kestrel serve? --port chooses another)"
    return said


class FrontSettings(NamedTuple):
    """What the front reads from the environment: the pages' guard and each platform named
    (None when not named)."""

    web: WebConfig
    slack: SlackSettings | None = None
    discord: DiscordSettings | None = None

    @property
    def platforms(self) -> tuple[str, ...]:
        """The platforms named, in the order they start."""
        named = (("slack", self.slack), ("discord", self.discord))
        return tuple(name for name, settings in named if settings is not None)


def front_settings(platforms: Sequence[str], web_settings: WebSettings) -> FrontSettings:
    """The front's settings, checked before anything is built: a missing or malformed token is
    a ``ConfigError`` naming it, said first and alone (not after the runtime's notices)."""
    from adapters.web import WebConfig

    environ = environment()
    web_config = WebConfig.from_settings(web_settings, environ)
    slack = discord = None
    if "slack" in platforms:
        from adapters.slack.settings import SlackSettings

        slack = SlackSettings.from_env(environ)
    if "discord" in platforms:
        from adapters.discord.settings import DiscordSettings

        discord = DiscordSettings.from_env(environ)
    return FrontSettings(web_config, slack, discord)


class ChatFront:
    """Starts the named platforms' adapters and the listener; stops both."""

    def __init__(
        self, supervisor: Supervisor, settings: FrontSettings, *, host: str, port: int | None
    ) -> None:
        self._supervisor = supervisor
        self._chat = ChatService(supervisor)
        self._settings = settings
        self._platforms = settings.platforms
        self._host = host
        self._port = DEFAULT_PORT if port is None else port
        self._slack: SlackAdapter | None = None
        self._discord: DiscordAdapter | None = None
        self._runner: web.AppRunner | None = None
        self._lines: list[str] = []
        rt = supervisor.rt
        self.health = Health(rt.store, rt.owner, alive_within=rt.lease_seconds)
        set_replica(rt.owner)

    async def start(self) -> None:
        """Connect every platform (a token refused fails here, naming it), then listen (port
        0: any free port, said in ``describe``)."""
        from adapters.web import add_web_routes

        config = self._settings.web
        links = config.links()
        application = web.Application()
        if self._settings.slack is not None:
            application = await self._start_slack(self._settings.slack, links)
            assert self._slack is not None
            slack = self._slack
            self.health.platform("slack", slack.connected, lambda: slack.gave_up)
        if self._settings.discord is not None:
            await self._start_discord(self._settings.discord, links, application)
            assert self._discord is not None
            discord = self._discord
            self.health.platform("discord", discord.connected, lambda: discord.gave_up)
        await self.health.start(await self._supervisor.rt.store.schema_version())
        add_web_routes(application, self._chat, config)
        application.router.add_get("/metrics", self._metrics_route(config))
        application.router.add_get("/healthz", self._alive)
        application.router.add_get("/readyz", self._ready_route(config))
        await self._listen(application)
        if not config.enabled:
            self._lines.append("http: the run pages are off (set KESTREL_WEB_TOKEN)")

    @property
    def chat(self) -> ChatService:
        """The chat service the platforms drive (its ``inbound`` for the work taker)."""
        return self._chat

    def describe(self) -> list[str]:
        """One line per platform and listener, for the operator."""
        return list(self._lines)

    def drain(self) -> None:
        """From now on ``/readyz`` says this replica is stopping: traffic goes elsewhere (and
        Discord's events, which every connected replica gets, are left to the others)."""
        self.health.stopping = True
        if self._discord is not None:
            self._discord.drain()

    async def stop(self) -> None:
        """Stop listening and disconnect the platforms."""
        await self.health.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._slack is not None:
            await self._slack.stop()
        if self._discord is not None:
            await self._discord.stop()

    async def _listen(self, application: web.Application) -> None:
        from adapters.web import SecureRunner

        self._runner = SecureRunner(application, access_log=None, logger=one_line(HTTP_LOG))
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        try:
            await site.start()
        except OSError as exc:  # in use, no such address, not permitted
            await self.stop()
            where = f"{self._host}:{self._port}"
            # Its own address is this replica's to mend, whatever the socket said (a name that
            # does not resolve too): no cause, so serve exits 2, not 75 to be started again.
            raise ConfigError(f"cannot listen on {where}: {_unbound(exc)}") from None
        port = self._runner.addresses[0][1] if self._runner.addresses else self._port
        self._lines.append(
            f"http: listening on {self._host}:{port} (/healthz, /readyz, /runs, /pending, /metrics)"
        )

    def _metrics_route(
        self, config: WebConfig
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        from adapters.web.auth import bearer_ok, challenge, elsewhere, from_elsewhere, refusal
        from bot.replica.health import ReadinessGauges
        from bot.replica.metrics import CONTENT_TYPE, Metrics

        rt = self._supervisor.rt
        chat = self._chat
        metrics: Metrics = Metrics(
            rt.store, duplicates=lambda: chat.duplicates_dropped, platforms=self._platforms
        )
        chat.subscribe(metrics)
        metrics.registry.register(ReadinessGauges(self.health))
        health = self.health

        async def scrape(request: web.Request) -> web.StreamResponse:
            if not config.metrics_public and not config.token:
                return refusal(403, METRICS_OFF)  # no token anyone could send: say what to set
            if not config.metrics_public and from_elsewhere(request):
                return elsewhere(request)  # another site's request: a login counts for nothing
            if not config.metrics_public and not bearer_ok(request, config):
                # As the pages ask: a browser that opens /metrics first asks its person too.
                said = refusal(401, METRICS_UNAUTHORIZED)
                return challenge(said, config)
            # kestrel_ready says what /readyz would say now: checked while the store is read.
            body = await metrics.render(alongside=health.check())
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

        return scrape

    async def _start_slack(self, settings: SlackSettings, links: RunLink | None) -> web.Application:
        from adapters.slack.app import EVENTS_PATH, SlackAdapter

        rt = self._supervisor.rt
        # A dead replica's claims on messages run out as its leases on runs do.
        adapter = SlackAdapter(
            self._chat, rt.store, rt.owner, settings, link=links, claim_seconds=rt.lease_seconds
        )
        me = await adapter.start()
        self._slack = adapter
        if settings.socket_mode:
            # Back at once while Slack fails (its token refused is a ConfigError): the port
            # opens, /healthz answers and /readyz says Slack is not connected until it is.
            await adapter.connect()
            self._lines.append(f"slack: workspace {me.team} as <@{me.user}>, socket mode")
            return web.Application()
        self._lines.append(f"slack: workspace {me.team} as <@{me.user}>, HTTP at {EVENTS_PATH}")
        return adapter.web_app()

    async def _start_discord(
        self, settings: DiscordSettings, links: RunLink | None, application: web.Application
    ) -> None:
        from adapters.discord.app import DiscordAdapter

        rt = self._supervisor.rt
        adapter = DiscordAdapter(
            self._chat, rt.store, rt.owner, settings, link=links, claim_seconds=rt.lease_seconds
        )
        me = await adapter.start()
        self._discord = adapter
        endpoint = adapter.add_routes(application)
        via = f", interactions also at {endpoint}" if endpoint else ""
        said = "logged in as" if adapter.connecting else "connected as"
        self._lines.append(f"discord: {said} {me.name} ({me.id}){via}")

    async def _alive(self, _request: web.Request) -> web.Response:
        """Liveness: the event loop answers within its deadline (nothing else restarts us)."""
        ok, said = self.health.alive()
        return web.json_response({"ok": ok, "loop": said}, status=200 if ok else 503)

    def _ready_route(
        self, config: WebConfig
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """Readiness: 200 while store, platforms and registration hold; else 503 naming which
        check failed, and what exactly is wrong only to an operator (the web token)."""
        from adapters.web.auth import bearer_ok

        health = self.health

        async def ready(request: web.Request) -> web.StreamResponse:
            readiness = await health.check()
            body = readiness.body(detailed=bearer_ok(request, config))
            return web.json_response(body, status=200 if readiness.ready else 503)

        return ready
