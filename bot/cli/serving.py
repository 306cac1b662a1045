"""What ``kestrel serve`` puts in front of the runs: the chat platforms and the HTTP listener."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from aiohttp import web

from bot.chat import ChatService
from bot.config import ConfigError, environment

if TYPE_CHECKING:
    from adapters.discord.app import DiscordAdapter
    from adapters.slack.app import SlackAdapter
    from bot.supervisor import Supervisor


class ChatFront:
    """Starts the named platforms' adapters and serves ``/healthz`` (and Slack's HTTP endpoint
    when Slack is not in Socket Mode) on one listener."""

    def __init__(
        self, supervisor: Supervisor, platforms: Sequence[str], *, host: str, port: int | None
    ) -> None:
        self._supervisor = supervisor
        self._chat = ChatService(supervisor)
        self._platforms = tuple(dict.fromkeys(platforms))
        self._host = host
        self._port = port
        self._slack: SlackAdapter | None = None
        self._discord: DiscordAdapter | None = None
        self._runner: web.AppRunner | None = None
        self._lines: list[str] = []

    async def start(self) -> None:
        """Connect every platform (a bad token fails here, naming it), then listen: on
        ``port``, or on 3000 when a platform is served and no port was given."""
        application = web.Application()
        if "slack" in self._platforms:
            application = await self._start_slack()
        if "discord" in self._platforms:
            await self._start_discord()
        port = self._port if self._port is not None else 3000 if self._platforms else None
        if port is None:
            return
        application.router.add_get("/healthz", _healthy)
        self._runner = web.AppRunner(application, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, port)
        try:
            await site.start()
        except OSError as exc:  # in use, no such address, not permitted
            await self.stop()
            raise ConfigError(
                f"cannot listen on {self._host}:{port}: {exc.strerror or exc}"
            ) from exc
        self._lines.append(f"http: listening on {self._host}:{port} (/healthz)")

    def describe(self) -> list[str]:
        """One line per platform and listener, for the operator."""
        return list(self._lines)

    async def stop(self) -> None:
        """Stop listening and disconnect the platforms."""
        if self._runner is not None:
            await self._runner.cleanup()
        if self._slack is not None:
            await self._slack.stop()
        if self._discord is not None:
            await self._discord.stop()

    async def _start_slack(self) -> web.Application:
        from adapters.slack.app import EVENTS_PATH, SlackAdapter
        from adapters.slack.settings import SlackSettings

        settings = SlackSettings.from_env(environment())
        rt = self._supervisor.rt
        adapter = SlackAdapter(self._chat, rt.store, rt.owner, settings)
        me = await adapter.start()
        self._slack = adapter
        if settings.socket_mode:
            await adapter.connect()
            self._lines.append(f"slack: workspace {me.team} as <@{me.user}>, socket mode")
            return web.Application()
        self._lines.append(f"slack: workspace {me.team} as <@{me.user}>, HTTP at {EVENTS_PATH}")
        return adapter.web_app()

    async def _start_discord(self) -> None:
        from adapters.discord.app import DiscordAdapter
        from adapters.discord.settings import DiscordSettings

        settings = DiscordSettings.from_env(environment())
        rt = self._supervisor.rt
        adapter = DiscordAdapter(self._chat, rt.store, rt.owner, settings)
        me = await adapter.start()
        self._discord = adapter
        self._lines.append(f"discord: connected as {me.name} ({me.id})")


async def _healthy(_request: web.Request) -> web.Response:
    return web.json_response({"ok": True})
