"""What ``/healthz`` and ``/readyz`` answer, and the gauges that say the same on ``/metrics``.

Liveness is the event loop's alone: a ticker that finds the loop answering late says so, and a
store or platform outage never restarts the process. Readiness is everything a replica needs to
take traffic: the store reachable at the schema version it was started with, every configured
platform connected now, and this replica's registration (its heartbeat) current.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Final, NamedTuple, Protocol

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
# Why a platform's client stopped trying to connect ("" while it is connected or trying).
GaveUp = Callable[[], str]

log = logging.getLogger("kestrel.health")

# What ``/readyz`` says of a failed check to anyone: a fixed phrase per check. The store's own
# error may name a host, a file or parts of a DSN: the log says it once, and an operator's
# request (the web token) gets it.
STORE_UNREACHABLE: Final = "unreachable"
SCHEMA_CHANGED: Final = "schema version is not this replica's"
NOT_REGISTERED: Final = "registration is not current"
NOT_CONNECTED: Final = "not connected (reconnecting)"
GAVE_UP: Final = "not connected (no longer trying)"
STOPPING: Final = "stopping: live runs are being handed back"


class Problem(NamedTuple):
    """A failed check: its fixed phrase, and what exactly is wrong (for the log, operators)."""

    said: str
    detail: str


class HealthStore(Admin, ReplicaRegistry, Protocol):
    """The roles readiness reads: the schema version and the live replicas."""


@dataclass(frozen=True)
class Readiness:
    """Ready, or the problems by what has them (``store``, ``replica``, a platform): in
    detail, and as ``said`` to anyone."""

    problems: dict[str, str] = field(default_factory=dict)
    connected: dict[str, bool] = field(default_factory=dict)
    said: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        """Whether nothing is wrong."""
        return not self.problems

    def body(self, *, detailed: bool = False) -> dict[str, object]:
        """The JSON ``/readyz`` answers: each problem's fixed phrase, or (``detailed``, for an
        operator) what exactly is wrong."""
        problems = self.problems if detailed else self.said
        return {"ready": self.ready, "problems": problems, "platforms": self.connected}


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
        self._platforms: dict[str, tuple[Connected, GaveUp]] = {}
        self._expected: int | None = None
        self.watch = LoopWatch()
        starting = "not checked yet"
        self.latest = Readiness(problems={"starting": starting}, said={"starting": starting})
        self.stopping = False

    def platform(self, name: str, connected: Connected, gave_up: GaveUp = lambda: "") -> None:
        """Readiness needs ``name`` connected (``connected()`` says whether it is now;
        ``gave_up()`` why its client no longer tries, if it does not)."""
        self._platforms[name] = (connected, gave_up)

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
        """Every check at once, each within ``CHECK_SECONDS`` (so all of them too: one after
        another, a slow store's two reads outlasted a probe's timeout); kept as ``latest`` for
        the gauges, and what changed logged (``_tell``)."""
        found: dict[str, Problem] = {}
        if self.stopping:
            found["shutdown"] = Problem(STOPPING, STOPPING)
        names = list(self._platforms)
        store, replica, *platforms = await asyncio.gather(
            _bounded(self._store_problem(), STORE_UNREACHABLE),
            _bounded(self._replica_problem(), NOT_REGISTERED),
            *(_bounded(_connected_problem(*self._platforms[n]), NOT_CONNECTED) for n in names),
        )
        if store:
            found["store"] = store
        elif replica:  # read from the store too: a store that fails is said once, as the store
            found["replica"] = replica
        connected: dict[str, bool] = {}
        for name, said in zip(names, platforms, strict=True):
            connected[name] = not said
            if said:
                found[name] = said
        self._tell(found)
        self.latest = Readiness(
            problems={name: problem.detail for name, problem in found.items()},
            connected=connected,
            said={name: problem.said for name, problem in found.items()},
        )
        return self.latest

    def _tell(self, found: dict[str, Problem]) -> None:
        """Log what ``/readyz`` withholds of a problem when it appears or its kind changes, and
        its end: not at each probe, as a store's error reads differently from one try to the
        next through an outage (a reset, a lost connection, a refusal)."""
        before = self.latest
        for name, problem in found.items():
            if problem.detail != problem.said and before.said.get(name) != problem.said:
                log.warning("not ready: %s: %s", name, problem.detail)
        ended = [
            name
            for name, detail in before.problems.items()
            if name not in found and detail != before.said[name]
        ]
        if ended:
            still = f"still not ready: {', '.join(found)}" if found else "ready"
            log.warning("%s: fine again (%s)", ", ".join(ended), still)

    async def _store_problem(self) -> Problem | None:
        try:
            version = await self._store.schema_version()
        except StoreError as exc:
            return Problem(STORE_UNREACHABLE, f"unreachable: {exc}")
        if self._expected is not None and version != self._expected:
            detail = f"schema version {version}, this replica runs version {self._expected}"
            return Problem(SCHEMA_CHANGED, detail)
        return None

    async def _replica_problem(self) -> Problem | None:
        try:
            replicas = await self._store.list_replicas(alive_within=self._alive_within)
        except StoreError as exc:
            return Problem(NOT_REGISTERED, f"cannot read the registrations: {exc}")
        if not any(replica.owner == self._owner for replica in replicas):
            seconds = f"{self._alive_within:g}"
            detail = f"{self._owner} has sent no heartbeat in the last {seconds} s (not registered)"
            return Problem(NOT_REGISTERED, detail)
        return None


async def _connected_problem(connected: Connected, gave_up: GaveUp) -> Problem | None:
    if await connected():
        return None
    if gave_up():  # why: said once, as an error, by the platform as its client gave up
        return Problem(GAVE_UP, GAVE_UP)
    return Problem(NOT_CONNECTED, NOT_CONNECTED)


async def _bounded(problem: Awaitable[Problem | None], said: str) -> Problem | None:
    """``problem``'s answer, or a problem of its own (said as ``said``) when it takes over
    ``CHECK_SECONDS``."""
    try:
        return await asyncio.wait_for(problem, CHECK_SECONDS)
    except TimeoutError:
        return Problem(said, f"no answer within {CHECK_SECONDS:g} s")


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
