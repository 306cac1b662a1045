"""Domain values: the ids every record, link and chat value carries."""

from __future__ import annotations

import re

from adapters.slack.ids import is_core_id
from bot.domain import new_id, request_id


def test_an_id_is_its_prefix_and_sixteen_lowercase_hex_digits_never_repeated() -> None:
    ids = [new_id("run") for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    for made in [*ids, request_id()]:
        assert re.fullmatch(r"(run|req)_[0-9a-f]{16}", made), made
        assert is_core_id(made), made  # what a Slack button's value carries back
    # All 64 bits vary (uuid4's first sixteen digits held its version, a 4, at one place).
    for place in range(16):
        assert len({made[4 + place] for made in ids}) == 16, place
