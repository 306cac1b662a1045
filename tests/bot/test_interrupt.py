"""Interrupt: a stop request cuts a guarded wait at once and never the step after it."""

from __future__ import annotations

import asyncio

import pytest

from bot.run.interrupt import Interrupt, Interrupted


async def test_a_request_cuts_the_guarded_wait_and_refuses_later_guards() -> None:
    interrupt = Interrupt()

    async def wait() -> None:
        async with interrupt.guard():
            await asyncio.sleep(30)

    task = asyncio.ensure_future(wait())
    await asyncio.sleep(0)
    interrupt.request()
    with pytest.raises(Interrupted):
        await task
    with pytest.raises(Interrupted):
        async with interrupt.guard():
            pass


async def test_a_spared_tool_finishes_and_a_full_request_still_cuts_it() -> None:
    interrupt = Interrupt()
    finished = asyncio.Event()

    async def tool(seconds: float) -> None:
        async with interrupt.guard(tool=True):
            await asyncio.sleep(seconds)
            finished.set()

    spared = asyncio.ensure_future(tool(0.05))
    await asyncio.sleep(0)
    interrupt.request(spare_tools=True)
    await spared
    assert finished.is_set()

    interrupt.requested = False
    finished.clear()
    cut = asyncio.ensure_future(tool(30))
    await asyncio.sleep(0)
    interrupt.request(spare_tools=True)
    interrupt.request()
    with pytest.raises(Interrupted):
        await cut
    assert not finished.is_set()


async def test_a_cut_arriving_as_the_wait_ends_is_taken_inside_the_guard() -> None:
    for _ in range(50):
        interrupt = Interrupt()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def run(interrupt: Interrupt, done: asyncio.Future[None]) -> str:
            with pytest.raises(Interrupted):
                async with interrupt.guard():
                    await done
            await asyncio.sleep(0.001)  # a journal write: never the one cancelled
            return "written"

        task = asyncio.ensure_future(run(interrupt, done))
        await asyncio.sleep(0)
        done.set_result(None)  # the wait is over; the task is about to resume
        interrupt.request()
        assert await task == "written"
