"""Helpers that import nothing of Kestrel: the floors use them, so their figures are their own."""

from __future__ import annotations

import resource
import statistics
from collections.abc import Sequence


def w1_replies(iterations: int) -> list[dict[str, object]]:
    """One distinct echo call per iteration (so no-progress never trips), then an answer."""
    usage = {"input_tokens": 100, "output_tokens": 10}
    calls: list[dict[str, object]] = [
        {"calls": [{"name": "echo", "arguments": {"text": f"step {i}"}}], "usage": usage}
        for i in range(iterations)
    ]
    return [*calls, {"text": "done", "usage": usage}]


def peak_rss_mib() -> float:
    """This process's peak resident set size so far, in MiB.

    Linux's ``VmHWM``: ``ru_maxrss`` survives ``exec``, so a scenario started from a bigger
    parent would report the parent's size as its own.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median(values: Sequence[float]) -> float:
    """The median of ``values``."""
    return statistics.median(values)
