"""What the chat adapters' benchmarks share: the model's script, following a fake's calls as
they arrive, latency samples, and the printed table."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

TIMEOUT_S: Final = 30.0

# A mention naming "restart" asks for the gated tool (its run then waits for an approval);
# any other gets a plain-text answer at once.
SCRIPT: Final[list[Any]] = [
    {
        "one_of": [
            {
                "match": "restart",
                "text": "Checkout is OOM-killed in a loop; a restart should bring it back.",
                "calls": [{"name": "restart_service", "arguments": {"service": "checkout"}}],
            },
            {"text": "All good."},
        ]
    },
    {"text": "Restarted checkout."},
]


C = TypeVar("C")


class Tail(Generic[C]):
    """A fake's calls from now on (each ``first`` looks at each call once: cheap to poll)."""

    def __init__(self, calls: Callable[[], Sequence[C]], platform: str) -> None:
        self._calls = calls
        self._platform = platform
        self._start = len(calls())

    def new(self) -> list[C]:
        """The calls that arrived since the last look (for scanning as they come)."""
        calls = list(self._calls()[self._start :])
        self._start += len(calls)
        return calls

    async def first(self, matches: Callable[[C], bool], what: str) -> C:
        """The first call since the tail began that ``matches`` (waiting for it)."""
        seen = self._start
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            calls = self._calls()
            for call in calls[seen:]:
                if matches(call):
                    return call
            seen = len(calls)
            await asyncio.sleep(0.001)
        raise RuntimeError(f"no {what} reached the fake {self._platform} in {TIMEOUT_S:.0f} s")


@dataclass
class Figures:
    """Latencies in ms, by what was timed; a burst's counts, if one ran."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    burst: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        """One sample, in seconds."""
        self.samples.setdefault(name, []).append(seconds * 1000)


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


Row = tuple[str, str, float | None, int]
"""A table row: the samples' name, its label, a target in ms (or None), the percentile it is
for (50 or 99)."""


def print_table(figures: Figures, rows: Sequence[Row], width: int = 46) -> None:
    """The rows as n, p50, p99 and max, with the verdict against each target."""
    print(f"  {'':<{width}}{'n':>5}{'p50':>10}{'p99':>10}{'max':>10}")
    for key, label, target, at in rows:
        samples = figures.samples[key]
        p50, p99 = percentile(samples, 50), percentile(samples, 99)
        line = f"  {label:<{width}}{len(samples):>5}{p50:>7.1f} ms{p99:>7.1f} ms"
        line += f"{max(samples):>7.1f} ms"
        if target is not None:
            verdict = "ok" if (p99 if at == 99 else p50) <= target else "over"
            line += f"  p{at} {verdict}"
        print(line)
