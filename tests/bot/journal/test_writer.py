"""``RunJournal`` on a journal log whose appends the test settles by hand."""

from __future__ import annotations

import asyncio
import gc
from typing import Any, cast

import pytest

from bot.errors import StoreError
from bot.journal.entries import Entry, UserMessageEntry
from bot.journal.fold import RunState
from bot.journal.log import JournalLog
from bot.journal.writer import RunJournal


class HeldLog:
    """Each append is a future the test settles."""

    def __init__(self) -> None:
        self.appends: list[asyncio.Future[None]] = []

    def submit(self, run_id: str, seq: int, epoch: int, entry: Entry) -> asyncio.Future[None]:
        self.appends.append(asyncio.get_running_loop().create_future())
        return self.appends[-1]


async def test_an_entry_failing_after_the_flush_that_raised_is_not_logged_as_unseen() -> None:
    log = HeldLog()
    journal = RunJournal(cast(JournalLog, log), RunState(run_id="run_1"), epoch=1)
    journal.append_soon(UserMessageEntry(text="a"))
    journal.append_soon(UserMessageEntry(text="b"))
    first, second = log.appends
    first.set_exception(StoreError("store away"))
    with pytest.raises(StoreError):
        await journal.flush()

    loop = asyncio.get_running_loop()
    unseen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unseen.append(context))
    try:
        # The store writes a run's entries in order: the next one fails once the first did.
        second.set_exception(StoreError("store away"))
        await asyncio.wait({second})
        del first, second
        log.appends.clear()
        gc.collect()
    finally:
        loop.set_exception_handler(None)

    # Its failure is the one the flush raised: asyncio must not log it as never retrieved.
    assert unseen == []
