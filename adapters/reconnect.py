"""Connecting again, in the background, to a chat platform that failed as serve started: a
backoff that doubles from ``FIRST_RETRY_SECONDS`` to ``MAX_RETRY_SECONDS``, jittered so that
replicas that lost the platform together do not come back together, and one log line per
problem rather than one per try. Meanwhile the port serves and ``/readyz`` says the platform
is not connected."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Final

from bot.chat.contract import ConfigError

FIRST_RETRY_SECONDS: Final = 0.5
MAX_RETRY_SECONDS: Final = 30.0

# One try: "" once connected, else what failed; a ``ConfigError`` when the platform refuses
# for good (the token), which ends the retries.
Attempt = Callable[[], Awaitable[str]]


class Reconnecting:
    """The background retries of one platform's connection, and why they gave up, if so."""

    def __init__(self, platform: str, what: str, log: logging.Logger) -> None:
        self._platform = platform  # "slack", as its errors and /readyz name it
        self._what = what  # what connects, in the log: "slack: Socket Mode"
        self._log = log
        self._task: asyncio.Task[None] | None = None
        self.gave_up = ""  # why the retries ended without connecting ("" while trying)

    @property
    def trying(self) -> bool:
        """Whether the retries are under way."""
        return self._task is not None and not self._task.done()

    def start(
        self, attempt: Attempt, problem: str, on_refused: Callable[[], None] = lambda: None
    ) -> None:
        """Say ``problem`` (the first try's), then try ``attempt`` again until it connects;
        ``on_refused`` runs when the platform refuses for good."""
        self._log.warning(
            "%s cannot connect yet: %s; trying again, with backoff up to %.0f s (/readyz says"
            " %s is not connected until it is)",
            self._what,
            problem,
            MAX_RETRY_SECONDS,
            self._platform,
        )
        retrying = self._keep_trying(attempt, problem, on_refused)
        self._task = asyncio.create_task(retrying, name=f"{self._platform}-reconnect")

    async def stop(self) -> None:
        """Stop the retries, if under way."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def refused(self, exc: ConfigError) -> None:
        """The platform refused for good (its token), as it started or later: said once, and
        ``gave_up`` says why."""
        self.gave_up = str(exc).removeprefix(f"{self._platform}: ")
        self._log.error(
            "%s; this replica serves %s no more until it is restarted",
            exc,
            self._platform.capitalize(),
        )

    async def _keep_trying(
        self, attempt: Attempt, problem: str, on_refused: Callable[[], None]
    ) -> None:
        delay, tries = FIRST_RETRY_SECONDS, 1
        while True:
            await asyncio.sleep(delay * (1 + random.random() / 4))
            delay, tries = min(delay * 2, MAX_RETRY_SECONDS), tries + 1
            try:
                now = await attempt()
            except ConfigError as exc:
                on_refused()
                self.refused(exc)
                return
            if not now:
                self._log.warning(
                    "%s connected after %d tries (%s before)", self._what, tries, problem
                )
                return
            if now != problem:
                self._log.warning("%s still cannot connect: %s; trying again", self._what, now)
                problem = now
