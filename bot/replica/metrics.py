"""Prometheus metrics: what runs do (from their events) and where the store stands (at scrape).

``Metrics`` owns its own ``CollectorRegistry`` (never the process-wide one, so that tests and
several runtimes in one process do not collide). It is an event sink: subscribe it
(``ChatService.subscribe`` or ``runtime.events.add``) and it counts what the events of this
process's runs tell. ``render()`` reads the rest from the store, then writes the whole registry
in the Prometheus text format (serve it with ``CONTENT_TYPE``).

From events (this process, since it started):

* ``kestrel_iterations_total``: model turns (one per iteration of the loop);
* ``kestrel_tool_calls_total{exit}``: calls by the exit they took through executeTool
  (``ToolOutcome``: ok, error, timeout, deferred, gate_denied, hook_denied,
  invalid_arguments, unknown_tool, taken_over);
* ``kestrel_tool_call_seconds{exit}`` (histogram): from a call entering executeTool to its exit;
* ``kestrel_model_call_seconds`` (histogram): model calls that answered;
* ``kestrel_model_tokens_total{kind}``: tokens the model spent, ``kind`` input or output;
* ``kestrel_request_decision_seconds{kind,decision}`` (histogram): from a request opening to
  its decision (``decision.at - request.created_at``), counted when the run takes the decision
  in; ``kind`` the request's (wait_approval, wait_user, wait_effect), ``decision`` what was
  decided (approve, deny, answer, expired…);
* ``kestrel_lease_takeovers_total``: runs another owner claimed while this process drove them;
* ``kestrel_orphan_adoptions_total``: runs left running by a dead owner that this process
  adopted.

From the store, at each scrape (every replica reports the same figures: aggregate with
``max``, not ``sum``):

* ``kestrel_runs{status}``: runs at each status (running, suspended, completed, failed,
  cancelled);
* ``kestrel_open_requests{kind}`` and ``kestrel_open_request_oldest_seconds{kind}``: open
  requests and the age of the oldest (0 when none is open), of runs that did not end;
* ``kestrel_outbox_backlog{platform}``: chat messages not yet shown on the platform;
* ``kestrel_store_up``: 1 when the store answered this scrape, 0 when it failed or did not
  answer within ``READ_SECONDS`` (the store's figures are then left out, the event counters
  still shown).

And from this process: ``kestrel_chat_duplicates_dropped_total``, inbound chat deliveries seen
before and dropped; ``kestrel_build_info{version}``; and the standard ``process_*`` series (CPU,
memory, open files, start time). No ``_created`` series; the backlog only for the platforms the
process serves.

Labels are bounded (statuses, kinds, exits, platforms): never a run, request or user id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Protocol, assert_never

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bot import __version__
from bot.domain import RequestKind, RunStatus, ToolOutcome, utcnow
from bot.errors import StoreError
from bot.events import (
    AdvisoryEvent,
    AnswerSuppliedEvent,
    Event,
    JournalFailedEvent,
    ModelTurnEvent,
    PanicEvent,
    RequestDecidedEvent,
    RequestExpiredEvent,
    RequestOpenedEvent,
    RequestReminderEvent,
    RunEndedEvent,
    RunResumedEvent,
    RunStartedEvent,
    RunSuspendedEvent,
    RunTakenOverEvent,
    ToolExitEvent,
    ToolStartedEvent,
)
from bot.store import Outbox, Requests, RunRows

log = logging.getLogger("kestrel.metrics")

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
PLATFORMS: Final = ("slack", "discord")
# How long a scrape waits on the store's figures: a store that does not answer (a network that
# passes nothing) is ``kestrel_store_up 0`` within a scraper's timeout (Prometheus: 10 s),
# rather than a scrape that outlasts it and shows nothing at all.
READ_SECONDS: Final = 3.0

MODEL_BUCKETS: Final = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)
TOOL_BUCKETS: Final = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
# People answer in seconds to days.
DECISION_BUCKETS: Final = (
    5.0,
    15.0,
    60.0,
    300.0,
    900.0,
    1800.0,
    3600.0,
    3 * 3600.0,
    8 * 3600.0,
    86400.0,
    3 * 86400.0,
    7 * 86400.0,
)


class MetricsStore(RunRows, Requests, Outbox, Protocol):
    """The roles a scrape reads: runs by status, open requests, the outbox's backlog, and the
    schema version, whose read says when the store is gone (a SQLite file moved under it)."""

    async def schema_version(self) -> int:
        """The schema version applied now; a ``StoreError`` when the store is unusable."""
        ...


@dataclass
class _Snapshot:
    """The store's figures as one scrape read them."""

    up: bool = False
    runs: dict[str, int] = field(default_factory=dict)
    open_requests: dict[RequestKind, int] = field(default_factory=dict)
    oldest_seconds: dict[RequestKind, float] = field(default_factory=dict)
    backlog: dict[str, int] = field(default_factory=dict)


class Metrics:
    """An event sink counting what runs do, and ``render()`` for a ``/metrics`` scrape."""

    def __init__(
        self,
        store: MetricsStore,
        *,
        duplicates: Callable[[], int] = lambda: 0,
        platforms: Sequence[str] = PLATFORMS,
        version: str = __version__,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._store = store
        self._platforms = tuple(platforms)
        self._clock = clock
        # A ``_created`` series per counter and histogram says when this process made it: noise
        # to a scraper, which has ``process_start_time_seconds``. Process-wide, as the switch is.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        registry = self.registry
        ProcessCollector(registry=registry)  # CPU, memory, open files, start time
        Info("kestrel_build", "The Kestrel version this process runs.", registry=registry).info(
            {"version": version}
        )
        self._iterations = Counter(
            "kestrel_iterations",
            "Times the model answered a run (one per step of a run).",
            registry=registry,
        )
        self._tool_calls = Counter(
            "kestrel_tool_calls",
            "Tool calls, by how each ended: ok, error, timeout, deferred (waiting for a person),"
            " gate_denied (an approver said no), hook_denied, invalid_arguments, unknown_tool,"
            " taken_over.",
            ["exit"],
            registry=registry,
        )
        self._tool_seconds = Histogram(
            "kestrel_tool_call_seconds",
            "How long tool calls took, by how each ended (an approval asked inline included).",
            ["exit"],
            buckets=TOOL_BUCKETS,
            registry=registry,
        )
        self._model_seconds = Histogram(
            "kestrel_model_call_seconds",
            "How long the model took to answer.",
            buckets=MODEL_BUCKETS,
            registry=registry,
        )
        self._model_tokens = Counter(
            "kestrel_model_tokens",
            "Tokens the model read (input) and wrote (output).",
            ["kind"],
            registry=registry,
        )
        self._decision_seconds = Histogram(
            "kestrel_request_decision_seconds",
            "How long people took to decide a request (approval, question, uncertain effect),"
            " by kind and decision.",
            ["kind", "decision"],
            buckets=DECISION_BUCKETS,
            registry=registry,
        )
        self._takeovers = Counter(
            "kestrel_lease_takeovers",
            "Runs another replica took over while this one drove them.",
            registry=registry,
        )
        self._adoptions = Counter(
            "kestrel_orphan_adoptions",
            "Runs this replica adopted after the replica driving them died.",
            registry=registry,
        )
        # Every exit and token kind shows from the start, at 0, so rates need no first event.
        for outcome in ToolOutcome:
            self._tool_calls.labels(outcome.value)
        for kind in ("input", "output"):
            self._model_tokens.labels(kind)
        self._scraped = _ScrapeCollector(duplicates)
        self._store_failing = False
        registry.register(self._scraped)

    # -- the event sink ------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        """Count what an event tells; never blocks (no I/O)."""
        match event:
            case ModelTurnEvent():
                self._iterations.inc()
                self._model_seconds.observe(event.seconds)
                if event.input_tokens:
                    self._model_tokens.labels("input").inc(event.input_tokens)
                if event.output_tokens:
                    self._model_tokens.labels("output").inc(event.output_tokens)
            case ToolExitEvent():
                exit_ = event.outcome.value
                self._tool_calls.labels(exit_).inc()
                self._tool_seconds.labels(exit_).observe(event.seconds)
            case AnswerSuppliedEvent(request_kind=RequestKind() as kind):
                labels = self._decision_seconds.labels(kind.value, event.decision.value)
                labels.observe(event.waited)
            case RunTakenOverEvent():
                self._takeovers.inc()
            case RunResumedEvent(orphaned=True):
                self._adoptions.inc()
            case (
                RunStartedEvent()
                | RunResumedEvent()
                | ToolStartedEvent()
                | AdvisoryEvent()
                | RequestOpenedEvent()
                | AnswerSuppliedEvent()
                | RequestReminderEvent()
                | RequestDecidedEvent()
                | RequestExpiredEvent()
                | RunSuspendedEvent()
                | RunEndedEvent()
                | JournalFailedEvent()
                | PanicEvent()
            ):
                pass  # the store's figures, read at scrape, say where runs and requests stand
            case _:
                assert_never(event)

    # -- a scrape ------------------------------------------------------------------------------

    async def render(self, *, alongside: Awaitable[object] | None = None) -> bytes:
        """The registry in the Prometheus text format, the store's figures read just now (within
        ``READ_SECONDS``); ``alongside`` (a readiness check, whose gauges the registry shows) is
        awaited at the same time, so that a silent store costs one bound, not two."""
        if alongside is None:
            snapshot = await self._read_store()
        else:
            snapshot, _ = await asyncio.gather(self._read_store(), alongside)
        # No await from here on: the collector reads this scrape's snapshot, nobody else's.
        self._scraped.snapshot = snapshot
        return generate_latest(self.registry)

    async def _read_store(self) -> _Snapshot:
        store = self._store
        try:
            async with asyncio.timeout(READ_SECONDS):
                # As readiness reads it: a SQLite file deleted or moved still answers the
                # queries below (its old figures), though nothing written reaches the path.
                await store.schema_version()
                runs = await store.count_runs_by_status()
                # Not one a cut-short cancel left open on its ended run: nothing waits on it.
                requests = await store.list_requests(unfinished_runs=True)
                backlog = {
                    platform: await store.outbox_backlog(platform) for platform in self._platforms
                }
        except (StoreError, TimeoutError) as exc:
            # Once per outage (kestrel_store_up says the rest), not at every scrape of it.
            if not self._store_failing:
                silent = f"no answer within {READ_SECONDS:g} s"
                log.warning(
                    "metrics: the store could not be read: %s",
                    exc if isinstance(exc, StoreError) else silent,
                )
            self._store_failing = True
            return _Snapshot(up=False)
        if self._store_failing:
            log.info("metrics: the store can be read again")
        self._store_failing = False
        now = self._clock()
        counts = dict.fromkeys(RequestKind, 0)
        oldest = dict.fromkeys(RequestKind, 0.0)
        for request, _status, _decision in requests:
            counts[request.kind] += 1
            age = max(0.0, (now - request.created_at).total_seconds())
            oldest[request.kind] = max(oldest[request.kind], age)
        return _Snapshot(
            up=True,
            runs=runs,
            open_requests=counts,
            oldest_seconds=oldest,
            backlog=backlog,
        )


class _ScrapeCollector(Collector):
    """The figures read from the store (by ``Metrics.render``) and from this process, at
    scrape time."""

    def __init__(self, duplicates: Callable[[], int]) -> None:
        self._duplicates = duplicates
        self.snapshot = _Snapshot()

    def describe(self) -> Iterator[Metric]:
        """The families this collector yields, without samples (the registry checks names)."""
        yield from self._families(_Snapshot(), 0)

    def collect(self) -> Iterator[Metric]:
        """The families with the last snapshot's figures."""
        yield from self._families(self.snapshot, self._duplicates())

    @staticmethod
    def _families(snapshot: _Snapshot, duplicates: int) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "kestrel_store_up",
            "1 when the database answered this scrape, 0 when it did not.",
            value=1 if snapshot.up else 0,
        )
        yield CounterMetricFamily(
            "kestrel_chat_duplicates_dropped",
            "Chat messages the platform delivered again, recognised and ignored.",
            value=duplicates,
        )
        runs = GaugeMetricFamily(
            "kestrel_runs", "Runs in the database, by status.", labels=["status"]
        )
        open_requests = GaugeMetricFamily(
            "kestrel_open_requests",
            "Requests waiting for a person: approvals, questions, uncertain effects.",
            labels=["kind"],
        )
        oldest = GaugeMetricFamily(
            "kestrel_open_request_oldest_seconds",
            "How long the oldest waiting request of each kind has waited (0 when none waits).",
            labels=["kind"],
        )
        backlog = GaugeMetricFamily(
            "kestrel_outbox_backlog",
            "Chat messages Kestrel has not yet got shown on the platform, by platform served.",
            labels=["platform"],
        )
        if snapshot.up:
            statuses = [status.value for status in RunStatus]
            statuses += sorted(set(snapshot.runs) - set(statuses))
            for status in statuses:
                runs.add_metric([status], snapshot.runs.get(status, 0))
            for kind in RequestKind:
                open_requests.add_metric([kind.value], snapshot.open_requests.get(kind, 0))
                oldest.add_metric([kind.value], snapshot.oldest_seconds.get(kind, 0.0))
            for platform, waiting in snapshot.backlog.items():
                backlog.add_metric([platform], waiting)
        yield from (runs, open_requests, oldest, backlog)
