"""What a Discord thread shows while its run works: the typing indicator (it lasts about ten
seconds, so it is sent again while the run is live) and one status message, edited in place,
naming the tool being called."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import aiohttp
import discord
from discord.http import Route

from adapters.discord.look import working
from adapters.discord.target import DiscordTarget
from bot.chat.outbox import Deliveries
from bot.chat.outbox_keys import status_key
from bot.chat.threads import RunPlace, StepStatus

log = logging.getLogger("kestrel.discord")


@dataclass
class _Live:
    place: RunPlace
    steps: list[str] = field(default_factory=list)


class DiscordProgress:
    """Typing while a run is live, and its status message."""

    def __init__(
        self, http: discord.http.HTTPClient, deliveries: Deliveries, *, refresh_seconds: float = 8.0
    ) -> None:
        self._http = http
        self._deliveries = deliveries
        self._refresh_seconds = refresh_seconds
        self._live: dict[str, _Live] = {}

    def follow(self, run_id: str, place: RunPlace) -> None:
        """Start tracking a live run (idempotent)."""
        self._live.setdefault(run_id, _Live(place))

    async def working(self, place: RunPlace, status: str = "") -> None:  # noqa: ARG002
        """Show at once that Kestrel works: the thread's typing indicator."""
        route = Route(
            "POST",
            "/channels/{channel_id}/typing",
            channel_id=DiscordTarget.of(place.target).channel,
        )
        try:
            await self._http.request(route)
        except (discord.HTTPException, discord.RateLimited, aiohttp.ClientError, OSError) as exc:
            log.info(
                "discord: typing refused in %s: %s", DiscordTarget.of(place.target).channel, exc
            )

    async def step(self, run_id: str, call_id: str, title: str, status: StepStatus) -> None:  # noqa: ARG002
        """A tool call started or finished: the status message says so."""
        live = self._live.get(run_id)
        if live is None:
            return
        marks = {"in_progress": "calling", "complete": "done:", "error": "failed:"}
        live.steps.append(f"{marks[status]} `{title}`")
        await self._show(run_id, live)
        if status == "in_progress":
            await self.working(live.place)

    async def stop(self, run_id: str, note: str = "") -> None:
        """The run suspended or ended here: the status message says so last."""
        live = self._live.pop(run_id, None)
        if live is not None and live.steps:
            live.steps.append(note or "finished")
            await self._show(run_id, live)

    async def keep_alive(self) -> None:
        """Send the typing indicator again for every live run until cancelled."""
        while True:
            await asyncio.sleep(self._refresh_seconds)
            for live in list(self._live.values()):
                try:
                    await self.working(live.place)
                except Exception:
                    log.exception("discord: refreshing typing failed")

    async def _show(self, run_id: str, live: _Live) -> None:
        await self._deliveries.put(status_key(run_id), live.place.target, working(live.steps))
