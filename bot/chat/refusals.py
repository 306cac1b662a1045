"""One info line per refusal in the operator's log, bounded: a person told privately that they
may not (a mention, a click, a slash command, a form) is audited in the store, and said on
``kestrel.chat`` too, so the log an operator reads at info shows who was refused what, where.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Final

import msgspec

from bot.place import Place
from bot.text import flattened

log = logging.getLogger("kestrel.chat")

# The same person refused the same verb from the same place is said once a window, with how
# many more there were; at most LINES_PER_WINDOW lines a window in all, whoever floods.
WINDOW_SECONDS: Final = 60.0
LINES_PER_WINDOW: Final = 60
# How many (person, verb, place) are remembered: the oldest is forgotten first.
KEPT: Final = 1024
# A reason is a line of policy text; one longer than this is cut (it may quote what was typed).
REASON_CHARS: Final = 300


class _Seen(msgspec.Struct):
    """When a (person, verb, place) was last said, and how many like it came since."""

    since: datetime
    more: int = 0


class RefusalLog:
    """Says refusals on ``kestrel.chat`` at info: once per person, verb and place a minute
    (then with how many more there were), and at most ``LINES_PER_WINDOW`` lines a minute in
    all. ``redact``: the PII guard, as a reason may quote what the person typed."""

    def __init__(self, clock: Callable[[], datetime], redact: Callable[[str], str]) -> None:
        self._clock = clock
        self._redact = redact
        self._seen: OrderedDict[tuple[str, str, str], _Seen] = OrderedDict()
        self._window = _Seen(clock())
        self._lines = 0

    def refused(
        self,
        who: str,
        verb: str,
        place: Place | None,
        reason: str,
        *,
        run_id: str = "",
        request_id: str = "",
    ) -> None:
        """Say that ``who`` was refused ``verb`` (on the run or request, if any) from
        ``place``, for ``reason``; or count it, if said within the window."""
        # Ids as the platform sent them: one line each, short, whatever they hold.
        who = flattened(who)[:80]
        where = flattened(place.describe())[:200] if place is not None else "the terminal"
        now = self._clock()
        key = (who, verb, where)
        seen = self._seen.get(key)
        if seen is not None and _within(seen.since, now):
            seen.more += 1
            return
        if not self._may_say(now):
            return
        self._remember(key, now)
        said = flattened(self._redact(reason))[:REASON_CHARS]
        more = f" ({seen.more} more like it in the last minute)" if seen and seen.more else ""
        on = _on(run_id, request_id)
        log.info(
            "refused: %s may not %s%s, from %s: %s%s%s",
            who,
            verb,
            on,
            where,
            said,
            more,
            self._others(),
        )

    def _may_say(self, now: datetime) -> bool:
        """Whether the window's lines are not all used (a new window begins when it ends)."""
        if not _within(self._window.since, now):
            self._window = _Seen(now, self._window.more)
            self._lines = 0
        if self._lines >= LINES_PER_WINDOW:
            self._window.more += 1
            return False
        self._lines += 1
        return True

    def _others(self) -> str:
        """How many refusals the window's limit kept out of the log, said once."""
        dropped, self._window.more = self._window.more, 0
        return f"; {dropped} other refusal(s) not logged (too many a minute)" if dropped else ""

    def _remember(self, key: tuple[str, str, str], now: datetime) -> None:
        self._seen[key] = _Seen(now)
        self._seen.move_to_end(key)
        while len(self._seen) > KEPT:
            self._seen.popitem(last=False)


def _within(since: datetime, now: datetime) -> bool:
    return (now - since).total_seconds() < WINDOW_SECONDS


def _on(run_id: str, request_id: str) -> str:
    """`` (run R request Q)``: what the refusal was on, if anything."""
    named = [f"{name} {id_}" for name, id_ in (("run", run_id), ("request", request_id)) if id_]
    return f" ({' '.join(named)})" if named else ""
