"""A platform's life in a process, the same on every platform: the outbox's deliveries, the
thread renderer and the progress keep-alive are built together, started in one order (subscribe,
deliver, keep alive, show the cards opened while no process could post them) and stopped in
one order (finish rendering, let the delivery under way finish, then cancel)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from bot.chat.outbox import Deliveries, Transport
from bot.chat.service import ChatService
from bot.chat.threads import LiveProgress, Look, ThreadRenderer
from bot.store import Outbox

STOP_SECONDS = 5.0


class KeptAlive(LiveProgress, Protocol):
    """A platform's progress that must be refreshed while runs work (typing, streams)."""

    async def keep_alive(self) -> None:
        """Refresh what the platform shows until cancelled."""
        ...


P = TypeVar("P", bound=KeptAlive)


class PlatformLife(Generic[P]):
    """Deliveries, renderer and progress of one platform, started and stopped as one."""

    def __init__(
        self,
        chat: ChatService,
        outbox: Outbox,
        transport: Transport,
        owner: str,
        look: Look,
        progress: Callable[[Deliveries], P],
        *,
        name: str,
        claim_seconds: float = 60.0,
    ) -> None:
        self._chat = chat
        self._name = name
        self.deliveries = Deliveries(outbox, transport, owner, claim_seconds=claim_seconds)
        self.progress: P = progress(self.deliveries)
        self.renderer = ThreadRenderer(chat, self.deliveries, look, self.progress)
        self._delivering: asyncio.Task[None] | None = None
        self._keeping: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Render the chat's events, deliver the outbox, keep progress alive, show open cards."""
        self._chat.subscribe(self.renderer)
        self._delivering = asyncio.create_task(self.deliveries.run(), name=f"{self._name}-outbox")
        self._keeping = asyncio.create_task(
            self.progress.keep_alive(), name=f"{self._name}-progress"
        )
        await self.renderer.show_open_cards()

    async def stop(self, timeout: float = STOP_SECONDS) -> None:
        """Finish rendering, stop delivering and refreshing (the outbox keeps what is left)."""
        await self.renderer.close(timeout)
        # A delivery under way finishes and records what the platform shows, so that no card
        # is left claimed by a process that is gone.
        self.deliveries.stop()
        tasks: list[asyncio.Task[Any]] = [t for t in (self._delivering, self._keeping) if t]
        if self._keeping is not None:
            self._keeping.cancel()
        if self._delivering is not None:
            await asyncio.wait([self._delivering], timeout=timeout)
            self._delivering.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
