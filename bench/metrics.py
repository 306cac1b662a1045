"""The cost of a ``/metrics`` scrape with a full store.

A SQLite store filled (through the store's API, in group commits) with 10,000 runs of every
status, a few hundred open requests of each kind and some chat messages waiting in the outbox;
then ``Metrics.render()`` timed over many scrapes, after a few uncounted ones: what the
``/metrics`` handler spends besides HTTP. Also each store read a scrape makes, alone.

Target (issue): a scrape with 10,000 runs in the store under 50 ms.

    python -m bench.metrics [--runs N] [--requests N] [--scrapes N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, Final

from bot.domain import (
    Request,
    RequestKind,
    RunStatus,
    Session,
    StopReason,
    TerminalResult,
    utcnow,
)
from bot.journal.entries import Entry, RunEnded, RunSuspended
from bot.records import RunRecord
from bot.replica.metrics import PLATFORMS, Metrics
from storage.sqlite import SqliteStore, open_sqlite

RUNS: Final = 10_000
REQUESTS: Final = 300
MESSAGES: Final = 200
SCRAPES: Final = 50
WARMUP: Final = 3
BATCH: Final = 500  # writes awaited together: one group commit
TARGET_MS: Final = 50.0
# Out of every 100 runs: how many end at each status (the rest wait on requests or run).
MIX: Final = (
    (RunStatus.COMPLETED, 70),
    (RunStatus.FAILED, 15),
    (RunStatus.CANCELLED, 5),
    (RunStatus.SUSPENDED, 7),
    (RunStatus.RUNNING, 3),
)


@dataclass(frozen=True)
class Figures:
    """What was measured, in ms (``reads``: each store read a scrape makes, its median)."""

    runs: int
    open_requests: int
    scrapes: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    bytes: int
    reads: dict[str, float]
    fill_s: float


def status_of(i: int) -> RunStatus:
    """The status of the ``i``-th run, following ``MIX``."""
    slot = i % 100
    for status, share in MIX:
        if slot < share:
            return status
        slot -= share
    return RunStatus.COMPLETED


def last_entry(status: RunStatus) -> Entry | None:
    """The entry that leaves a run at ``status`` (None: it stays running)."""
    if status is RunStatus.RUNNING:
        return None
    if status is RunStatus.SUSPENDED:
        return RunSuspended(reason=StopReason.WAITING)
    reason = {
        RunStatus.COMPLETED: StopReason.ANSWERED,
        RunStatus.FAILED: StopReason.ITERATION_LIMIT,
        RunStatus.CANCELLED: StopReason.CANCELLED,
    }[status]
    return RunEnded(result=TerminalResult(status=status, stop_reason=reason))


async def in_batches(jobs: Sequence[Callable[[], Awaitable[Any]]]) -> None:
    """Await ``jobs`` ``BATCH`` at a time, so that each batch lands in one group commit."""
    for start in range(0, len(jobs), BATCH):
        await asyncio.gather(*(job() for job in jobs[start : start + BATCH]))


async def fill(store: SqliteStore, runs: int, requests: int) -> None:
    """``runs`` runs of every status, ``requests`` open requests on the waiting ones (spread
    over the kinds, opened up to two days ago), and ``MESSAGES`` undelivered chat messages."""
    session = Session(id="ses_bench", platform="slack", channel="C1", thread="1")
    await store.ensure_session(session)
    records = [
        RunRecord(id=f"run_{i:06d}", session_id=session.id, prompt="bench", requested_by="U0")
        for i in range(runs)
    ]
    await in_batches([partial(store.create_run, record, "bench", 0.0) for record in records])
    endings = [(r.id, last_entry(status_of(i))) for i, r in enumerate(records)]
    await in_batches([partial(store.append, i, 0, 1, e) for i, e in endings if e is not None])
    waiting = [r.id for i, r in enumerate(records) if status_of(i) is RunStatus.SUSPENDED]
    kinds = list(RequestKind)
    now = utcnow()
    opened = [
        Request(
            run_id=waiting[n % len(waiting)],
            kind=kinds[n % len(kinds)],
            call_id=f"call_{n}",
            tool="deploy",
            arguments={"service": "checkout", "version": n},
            prompt="Deploy checkout?",
            created_at=now - timedelta(seconds=n * 600),
        )
        for n in range(requests)
    ]
    await in_batches([partial(store.open_request, request) for request in opened])
    platforms = [PLATFORMS[n % len(PLATFORMS)] for n in range(MESSAGES)]
    await in_batches(
        [
            partial(store.put_message, f"{platform}:card:{n}", platform, {"c": "C1"}, {"n": n})
            for n, platform in enumerate(platforms)
        ]
    )


async def timed(action: Callable[[], Awaitable[Any]], times: int) -> list[float]:
    """``action``'s wall time in ms, ``times`` times, after ``WARMUP`` uncounted runs."""
    for _ in range(WARMUP):
        await action()
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        await action()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def run(runs: int, requests: int, scrapes: int) -> Figures:
    """Fill a fresh store, then time the scrapes and each of their reads."""
    with tempfile.TemporaryDirectory(prefix="kestrel-bench-metrics-") as tmp:
        store = await open_sqlite(Path(tmp) / "kestrel.db", synchronous="NORMAL")
        try:
            started = time.perf_counter()
            await fill(store, runs, requests)
            fill_s = time.perf_counter() - started
            metrics = Metrics(store, duplicates=lambda: 0)
            text = await metrics.render()
            samples = await timed(metrics.render, scrapes)
            reads = {
                "count_runs_by_status": await timed(store.count_runs_by_status, scrapes),
                "list_requests (open)": await timed(store.list_requests, scrapes),
                "outbox_backlog (each platform)": await timed(
                    lambda: store.outbox_backlog(PLATFORMS[0]), scrapes
                ),
            }
        finally:
            await store.close()
    return Figures(
        runs=runs,
        open_requests=requests,
        scrapes=scrapes,
        p50_ms=percentile(samples, 50),
        p99_ms=percentile(samples, 99),
        max_ms=max(samples),
        bytes=len(text),
        reads={name: percentile(values, 50) for name, values in reads.items()},
        fill_s=fill_s,
    )


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def measure(runs: int = RUNS, requests: int = REQUESTS, scrapes: int = SCRAPES) -> Figures:
    """The figures of one fresh store."""
    return asyncio.run(run(runs, requests, scrapes))


def report(runs: int = RUNS, requests: int = REQUESTS, scrapes: int = SCRAPES) -> None:
    """Print a scrape's p50, p99 and max, and what each of its store reads costs."""
    f = measure(runs, requests, scrapes)
    verdict = "ok" if f.p99_ms <= TARGET_MS else "over"
    print(
        f"/metrics scrape (Metrics.render, no HTTP) on SQLite: {f.runs} runs, {f.open_requests}"
        f" open requests, {MESSAGES} undelivered messages (python -m bench.metrics)"
    )
    print(f"  {f.scrapes} scrapes after {WARMUP} uncounted; target: under {TARGET_MS:.0f} ms")
    print(
        f"  render: p50 {f.p50_ms:.1f} ms, p99 {f.p99_ms:.1f} ms, max {f.max_ms:.1f} ms"
        f"  p99 {verdict}; {f.bytes} bytes"
    )
    for name, ms in f.reads.items():
        print(f"    {name:<32} p50 {ms:6.2f} ms")
    print(f"  (filling the store took {f.fill_s:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description="The cost of a /metrics scrape.")
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--scrapes", type=int, default=SCRAPES)
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    options = parser.parse_args()
    if options.json:
        print(json.dumps(asdict(measure(options.runs, options.requests, options.scrapes))))
    else:
        report(options.runs, options.requests, options.scrapes)


if __name__ == "__main__":
    main()
