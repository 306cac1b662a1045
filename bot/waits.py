"""Bounded waits: the time left before a deadline, a pause a stop ends, a wait that leaves what
it waited for to end by itself, and the outcome of what a wait leaves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

_T = TypeVar("_T")


def time_left(until: float | None, at_most: float | None = None) -> float | None:
    """``at_most`` seconds (None: no bound), cut to what is left before ``until`` (the running
    loop's time; None: no deadline)."""
    if until is None:
        return at_most
    left = max(0.0, until - asyncio.get_running_loop().time())
    return left if at_most is None else min(at_most, left)


async def paused(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds``, or less if ``stop`` is set meanwhile; whether it is."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


async def waited(work: Awaitable[_T], timeout: float | None) -> asyncio.Future[_T]:
    """``work`` as a future, waited for at most ``timeout`` seconds (None: until done); one not
    done then is left to end by itself, as cancelling a PostgreSQL statement waits for the
    server too, and its outcome is retrieved whenever it comes."""
    future = asyncio.ensure_future(work)
    future.add_done_callback(outcome_retrieved)
    await asyncio.wait({future}, timeout=timeout)
    return future


def outcome_retrieved(future: asyncio.Future[Any]) -> None:
    """A done callback retrieving a future's failure, which its waiter raised already or no
    longer waits for: asyncio would log it as never retrieved."""
    if not future.cancelled():
        future.exception()
