"""What ``/healthz`` and ``/readyz`` answer, and the gauges that say the same on ``/metrics``.

Liveness is the event loop's alone: a ticker that finds the loop answering late says so, and a
store or platform outage never restarts the process. Readiness is everything a replica needs to
take traffic: the store reachable at the schema version it was started with, every configured
platform connected now, and this replica's registration (its heartbeat) current.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Final, Protocol

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bot.errors import StoreError
from bot.store import Admin, ReplicaRegistry

# How long one readiness check may take (a hung store is a failed check, not a hung probe).
CHECK_SECONDS: Final = 3.0
# The loop is late when a tick of TICK_SECONDS arrives this much later than due.
TICK_SECONDS: Final = 0.5
LIVENESS_DEADLINE_SECONDS: Final = 10.0

Connected = Callable[[], Awaitable[bool]]


class HealthStore(Admin, ReplicaRegistry, Protocol):
    """The roles readiness reads: the schema version and the live replicas."""


@dataclass(frozen=True)
class Readiness:
    """Ready, or the problems by what has them (``store``, ``replica``, a platform)."""

    problems: dict[str, str] = field(default_factory=dict)
    connected: dict[str, bool] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        """Whether nothing is wrong."""
        return not self.problems

    def body(self) -> dict[str, object]:
        """The JSON ``/readyz`` answers."""
        return {"ready": self.ready, "problems": self.problems, "platforms": self.connected}


class LoopWatch:
    """Ticks on the event loop; ``late`` is how far behind the latest tick is."""

    def __init__(self, tick: float = TICK_SECONDS) -> None:
        self._tick = tick
        self._last = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start ticking (on the running loop)."""
        self._last = time.monotonic()
        self._task = asyncio.create_task(self._run(), name="kestrel-loop-watch")

    async def stop(self) -> None:
        """Stop ticking."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def late(self) -> float:
        """Seconds past due of the next tick (0 when on time)."""
        return max(0.0, time.monotonic() - self._last - self._tick)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            self._last = time.monotonic()


class Health:
    """Checks a replica's readiness; ``platform`` adds a platform to the checks."""

    def __init__(self, store: HealthStore, owner: str, *, alive_within: float) -> None:
        self._store = store
        self._owner = owner
        self._alive_within = alive_within
        self._platforms: dict[str, Connected] = {}
        self._expected: int | None = None
        self.watch = LoopWatch()
        self.latest = Readiness(problems={"starting": "not checked yet"})
        self.stopping = False

    def platform(self, name: str, connected: Connected) -> None:
        """Readiness needs ``name`` connected (``connected()`` says whether it is now)."""
        self._platforms[name] = connected

    async def start(self, expected_schema: int) -> None:
        """Remember the schema version this replica was started with, and watch the loop."""
        self._expected = expected_schema
        self.watch.start()

    async def stop(self) -> None:
        """Stop watching the loop."""
        await self.watch.stop()

    def alive(self) -> tuple[bool, str]:
        """Liveness: whether the event loop answers within the deadline, and how late it is."""
        late = self.watch.late()
        if late > LIVENESS_DEADLINE_SECONDS:
            return False, f"the event loop answered {late:.1f} s late"
        return True, f"the event loop answers ({late:.3f} s late)"

    async def check(self) -> Readiness:
        """Every check, each within ``CHECK_SECONDS``; kept as ``latest`` for the gauges."""
        problems: dict[str, str] = {}
        if self.stopping:
            problems["shutdown"] = "stopping: live runs are being handed back"
        store = await _bounded(self._store_problem())
        if store:
            problems["store"] = store
        else:
            replica = await _bounded(self._replica_problem())
            if replica:
                problems["replica"] = replica
        connected: dict[str, bool] = {}
        for name, is_connected in self._platforms.items():
            said = await _bounded(_connected_problem(is_connected))
            connected[name] = not said
            if said:
                problems[name] = said
        self.latest = Readiness(problems=problems, connected=connected)
        return self.latest

    async def _store_problem(self) -> str | None:
        try:
            version = await self._store.schema_version()
        except StoreError as exc:
            return f"unreachable: {exc}"
        if self._expected is not None and version != self._expected:
            return f"schema version {version}, this replica runs version {self._expected}"
        return None

    async def _replica_problem(self) -> str | None:
        try:
            replicas = await self._store.list_replicas(alive_within=self._alive_within)
        except StoreError as exc:
            return f"cannot read the registrations: {exc}"
        if not any(replica.owner == self._owner for replica in replicas):
            seconds = f"{self._alive_within:g}"
            return f"{self._owner} has not heartbeat in the last {seconds} s (not registered)"
        return None


async def _connected_problem(connected: Connected) -> str | None:
    if await connected():
        return None
    return "not connected (reconnecting)"


async def _bounded(problem: Awaitable[str | None]) -> str | None:
    """``problem``'s answer, or a problem of its own when it takes over ``CHECK_SECONDS``."""
    try:
        return await asyncio.wait_for(problem, CHECK_SECONDS)
    except TimeoutError:
        return f"no answer within {CHECK_SECONDS:g} s"


class ReadinessGauges(Collector):
    """``kestrel_ready`` and ``kestrel_platform_connected{platform}`` as the last check said."""

    def __init__(self, health: Health) -> None:
        self._health = health

    def describe(self) -> Iterator[Metric]:
        """No description ahead of a scrape: the registry collects at each one."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        """The gauges from the latest readiness check."""
        latest = self._health.latest
        ready = GaugeMetricFamily(
            "kestrel_ready", "1 while /readyz answers 200 (this replica takes traffic)."
        )
        ready.add_metric([], 1.0 if latest.ready else 0.0)
        yield ready
        platforms = GaugeMetricFamily(
            "kestrel_platform_connected",
            "1 while the platform's connection is up (Slack HTTP mode: auth.test passed).",
            labels=["platform"],
        )
        for name, up in latest.connected.items():
            platforms.add_metric([name], 1.0 if up else 0.0)
        yield platforms
