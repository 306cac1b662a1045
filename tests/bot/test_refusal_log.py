"""The refusals' log bounded whoever floods it: many people refused at once are at most
``LINES_PER_WINDOW`` lines a minute, the rest counted in the next line."""

from __future__ import annotations

import logging

import pytest

from bot.chat.refusals import LINES_PER_WINDOW, RefusalLog
from bot.place import Place
from tests.fakes.clock import MovingClock


def test_a_flood_of_people_refused_is_bounded_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kestrel.chat")
    clock = MovingClock()
    said = RefusalLog(clock, lambda text: text)
    place = Place("slack", "T0001", "C0001", "1700000000.000100")
    for n in range(LINES_PER_WINDOW + 25):
        said.refused(f"U{n:05d}", "approve", place, "may not approve restart_service")
    assert len(caplog.records) == LINES_PER_WINDOW
    clock.advance(61)
    said.refused("U0LATER", "start", place, "may not start runs here\nforged: line")
    last = caplog.records[-1].getMessage()
    assert last.startswith("refused: U0LATER may not start, from slack:T0001:C0001:"), last
    assert "\n" not in last and last.endswith(
        "; 25 other refusal(s) not logged (too many a minute)"
    )
