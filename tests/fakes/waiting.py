"""Waiting on a condition instead of sleeping for a guessed time."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


async def until(check: Callable[[], Any], timeout: float = 40.0, interval: float = 0.05) -> Any:
    """Poll a condition (plain or async) until it returns something truthy, and return that;
    fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        # What is waited on is in a store or another process: no event of ours says it changed.
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")
