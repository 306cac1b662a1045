"""How a reader's time grows with its input, told apart from how fast or busy the machine is.

A bound on seconds fails whenever the machine is loaded, and passes a quadratic reader on a fast
one. What a linear reader keeps, on any machine, is the ratio of its CPU times on ``k`` times the
input and on the input: near ``k``, where a quadratic one's is near ``k * k``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

RUNS = 5  # each size's time is its fastest run: a run the machine was busy in is only slower
SLACK = 2  # a linear reader's ratio may be this many times ``k`` (caches, allocation)


def _seconds(read: Callable[[T], object], given: T) -> float:
    """The CPU time one call of ``read`` on ``given`` took."""
    # The thread's CPU time, not the wall clock's: on a loaded machine a long run is taken off
    # the CPU many times where a short one may not be, which would inflate the ratio.
    started = time.thread_time()
    read(given)
    return time.thread_time() - started


def growth(
    read: Callable[[T], object], small: T, large: T, runs: int = RUNS, plain: float = 0.0
) -> float:
    """How many times longer ``read`` takes on ``large`` than on ``small``, each its fastest;
    from the second run on, as soon as that is at most ``plain`` (no more runs can tell more)."""
    fastest_small = fastest_large = float("inf")
    gc.collect()
    gc.disable()  # a collection inside one run would be counted against that size alone
    try:
        for run in range(runs):  # interleaved: a load that comes and goes falls on both sizes
            fastest_small = min(fastest_small, _seconds(read, small))
            fastest_large = min(fastest_large, _seconds(read, large))
            if run and fastest_large / max(fastest_small, 1e-9) <= plain:
                break
    finally:
        gc.enable()
    return fastest_large / max(fastest_small, 1e-9)


def assert_linear(read: Callable[[T], object], small: T, large: T, k: float) -> None:
    """Fail if ``read``'s time grows much faster than its input, ``large`` being ``k`` times
    ``small``: the bound, ``SLACK * k``, is far below a quadratic reader's ``k * k``."""
    assert k >= 3 * SLACK, "too few times the input to tell a quadratic reader apart"
    # A ratio of ``k`` or less after two runs is plainly linear: only a later run twice as fast
    # on the small input could reach the bound, and a quadratic reader's ratio is near ``k * k``.
    ratio = growth(read, small, large, plain=k)
    assert ratio < SLACK * k, f"{k:g} times the input took {ratio:.1f} times as long"
