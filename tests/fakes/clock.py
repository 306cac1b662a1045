"""A clock a test moves forward instead of sleeping until something falls due."""

from __future__ import annotations

from datetime import datetime, timedelta

from bot.domain import utcnow


class MovingClock:
    """The wall clock plus however far the test has moved it: the runtime's and the store's."""

    def __init__(self) -> None:
        self.ahead = timedelta()

    def __call__(self) -> datetime:
        return utcnow() + self.ahead

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` for every reader of this clock."""
        self.ahead += timedelta(seconds=seconds)
