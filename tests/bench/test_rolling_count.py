"""How the rolling restart counts a card's updates: what it shows, not the edits sent."""

from __future__ import annotations

from bench.rolling import changes


def test_an_edit_to_what_the_card_shows_already_is_no_update() -> None:
    # A post found again after its replica died before recording it is edited to the same.
    assert changes("open", ["open", "closed", "closed"]) == 1


def test_a_decided_card_shown_open_again_counts_twice() -> None:
    assert changes("open", ["closed", "open"]) == 2
    assert changes("open", ["open", "closed", "open", "closed"]) == 2


def test_a_card_never_decided_counts_no_update() -> None:
    assert changes("open", ["open"]) == 0
    assert changes("open", []) == 0
