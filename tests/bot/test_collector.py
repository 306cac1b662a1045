"""The collector as a serving process settles it (``bot.collector``), in a fresh interpreter:
the test process's own collector is left alone."""

from __future__ import annotations

from tests.fakes.fresh import fresh_json

_SETTLED = """
import gc, json
from bot.collector import YOUNG_THRESHOLD, settle_for_service
before = gc.get_threshold()
settle_for_service()
print(json.dumps({"before": before, "after": gc.get_threshold(),
                  "frozen": gc.get_freeze_count(), "young": YOUNG_THRESHOLD}))
"""


def test_start_up_is_frozen_and_only_the_young_threshold_is_raised() -> None:
    found = fresh_json(_SETTLED)
    assert found["after"] == [found["young"], *found["before"][1:]]
    assert found["after"][0] > found["before"][0]
    assert found["frozen"] > 1000  # the interpreter's and Kestrel's start-up objects


_HELD = """
import gc, json
from bot.collector import hold_during_start_up, settle_after_start_up
hold_during_start_up()
held = gc.isenabled()
import bot.chat.service  # start-up: nothing it builds is garbage
settle_after_start_up()
print(json.dumps({"held": held, "after": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""


def test_no_pass_during_start_up_and_passes_again_after_it() -> None:
    found = fresh_json(_HELD)
    assert found["held"] is False
    assert found["after"] is True
    assert found["frozen"] > 1000


_NOT_HELD = """
import gc, json
from bot.collector import settle_after_start_up
settle_after_start_up()
print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""


def test_a_process_that_held_nothing_keeps_its_collector_as_it_is() -> None:
    assert fresh_json(_NOT_HELD) == {"enabled": True, "frozen": 0}


_OFF_BY_ITSELF = """
import gc, json
from bot.collector import settle_after_start_up
gc.disable()  # the host's own choice, not Kestrel's hold
settle_after_start_up()
print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""


def test_a_collector_turned_off_by_its_host_stays_off() -> None:
    assert fresh_json(_OFF_BY_ITSELF) == {"enabled": False, "frozen": 0}
