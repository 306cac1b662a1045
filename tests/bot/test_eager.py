"""A coroutine's first step taken at once (``bot.eager``): it must behave as awaiting the
coroutine would, whatever the coroutine does after that step."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from bot.eager import Started, started


async def _instant() -> str:
    return "at once"


async def _waits(gate: asyncio.Event, seen: list[str]) -> str:
    seen.append("began")
    try:
        await gate.wait()
    except asyncio.CancelledError:
        seen.append("cancelled")
        raise
    finally:
        seen.append("left")
    return "after the wait"


async def test_a_coroutine_that_does_not_wait_is_done_at_its_first_step() -> None:
    first = Started(_instant())
    assert (first.done, first.result) == (True, "at once")


async def test_a_waiting_coroutine_goes_on_when_awaited() -> None:
    gate, seen = asyncio.Event(), list[str]()
    first = Started(_waits(gate, seen))
    assert (first.done, seen) == (False, ["began"])
    task = asyncio.ensure_future(_awaited(first))
    await asyncio.sleep(0)
    gate.set()
    assert await task == "after the wait"
    assert seen == ["began", "left"]


async def test_a_cancellation_reaches_the_coroutine_and_stops_it() -> None:
    gate, seen = asyncio.Event(), list[str]()
    task = asyncio.ensure_future(_awaited(Started(_waits(gate, seen))))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["began", "cancelled", "left"]


async def test_a_timeout_cuts_a_waiting_coroutine() -> None:
    gate, seen = asyncio.Event(), list[str]()
    first = Started(_waits(gate, seen))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await first
    assert seen == ["began", "cancelled", "left"]


async def test_an_exception_of_the_first_step_is_raised_at_once() -> None:
    async def fails() -> str:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        Started(fails())


async def test_an_exception_after_a_wait_is_raised_by_the_await() -> None:
    async def fails_later() -> str:
        await asyncio.sleep(0)
        raise ValueError("later")

    first = Started(fails_later())
    with pytest.raises(ValueError, match="later"):
        await first


async def test_closing_the_awaiting_coroutine_closes_the_stepped_one() -> None:
    gate, seen = asyncio.Event(), list[str]()
    outer = _awaited(Started(_waits(gate, seen)))
    outer.send(None)  # up to the wait
    outer.close()
    assert seen == ["began", "left"]


async def test_an_awaitable_that_is_not_a_coroutine_is_left_to_be_awaited() -> None:
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    assert started(future) is None
    coroutine = _instant()
    first = started(coroutine)
    assert first is not None and first.done


async def _awaited(first: Awaitable[str]) -> str:
    return await first
