"""How ``kestrel serve`` and ``kestrel chat`` stop: one deadline, counted from the first SIGTERM
or Ctrl-C, whatever the stop waits on (a migration, a silent store, a tool); and a later signal
that ends the process at once. Each says, in one line, what it cut short."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Final

# Past the stop's deadline, what the process is given to exit (the event loop's and the
# interpreter's own teardown) before it ends itself: orchestrators kill at 40 s.
EXIT_SECONDS: Final = 3.0
# Before the deadline, when a start-up still under way is cancelled: what it is given to undo
# itself (a migration's transaction rolled back, the pool closed).
UNDO_SECONDS: Final = 3.0
# After a second signal, how long the runs have to kill their tools and suspend (a store that
# answers takes milliseconds) before the process ends without them.
SECOND_SECONDS: Final = 1.0


def ending_code(signum: int) -> int:
    """The shell's convention for a process stopped by signal ``signum``: 128 + N (130, 143)."""
    return 128 + signum


class Stop:
    """The stop of one process: the first signal sets ``event`` and starts the deadline
    (``seconds``, then ``EXIT_SECONDS``); a start-up still under way by then is cancelled
    (``cut_start``); a later signal ends the process within ``SECOND_SECONDS``. ``doing`` names
    what the stop waits on, for the line a cut says."""

    def __init__(self, log: logging.Logger, seconds: float) -> None:
        self.event = asyncio.Event()
        self.received: list[int] = []
        self.doing = "starting (the schema's migration, or the wait for another replica's)"
        self.cut_start = False  # the start-up was still under way at the deadline: cancelled
        self.ended_by: int | None = None  # the later signal that cut the stop short
        self._log = log
        self._seconds = seconds
        self._main = asyncio.current_task()
        self._starting = True
        self._first: list[Callable[[], object]] = []
        self._second: list[Callable[[], object]] = []
        self.began: float | None = None

    def on_first(self, act: Callable[[], object]) -> None:
        """Call ``act`` on the first signal (at once, if it came already)."""
        self._first.append(act)
        if self.received:
            act()

    def on_second(self, act: Callable[[], object]) -> None:
        """Call ``act`` when a later signal cuts the stop short (tools to kill at once)."""
        self._second.append(act)

    def started(self) -> None:
        """The start-up is done: the deadline no longer cancels it."""
        self._starting = False

    @property
    def ends(self) -> float:
        """The stop's deadline (the event loop's time): its first signal, plus ``seconds``."""
        began = asyncio.get_running_loop().time() if self.began is None else self.began
        return began + self._seconds

    def take(self, signum: int) -> None:
        """A SIGTERM or Ctrl-C: the first starts the stop, a later one cuts it short."""
        if self.received:
            self._cut_short(signum)
            return
        self.received.append(signum)
        loop = asyncio.get_running_loop()
        self.began = loop.time()
        self.event.set()
        if self._starting:  # said now: the start-up may go on for most of the deadline
            self._log.info(
                "%s while starting: the start-up goes on for up to %g s, then is cut short",
                signal.Signals(signum).name,
                self._seconds - UNDO_SECONDS,
            )
        for act in self._first:
            act()
        loop.call_at(self.ends - UNDO_SECONDS, self._cut_start_up)
        loop.call_at(self.ends + EXIT_SECONDS, self._overdue)

    def exit_if_cut(self) -> None:
        """Exit 128+N when a later signal N cut the stop short (its line said what)."""
        if self.ended_by is not None:
            sys.exit(ending_code(self.ended_by))

    def _cut_start_up(self) -> None:
        if self._starting and self._main is not None:
            self.cut_start = True
            self._main.cancel()

    def _cut_short(self, signum: int) -> None:
        if self.ended_by is not None:
            return  # the line is said; the end is on its way
        self.ended_by = signum
        self._log.warning(
            "%s again while stopping: stopping at once, cutting short %s",
            signal.Signals(signum).name,
            self.doing,
        )
        for act in self._second:
            act()
        asyncio.get_running_loop().call_later(SECOND_SECONDS, self._end, ending_code(signum))

    def _overdue(self) -> None:
        self._log.error(
            "the stop outlasted its deadline (%g s): ending now, cutting short %s",
            self._seconds + EXIT_SECONDS,
            self.doing,
        )
        self._end(ending_code(self.received[0]))

    @staticmethod
    def _end(code: int) -> None:
        """End the process now: what is written is flushed, nothing else waited for (the
        runs' leases run out, and another process takes them up, as after a kill)."""
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass  # closed, or a pipe with nobody reading: nothing more to say
        os._exit(code)


def end_on_signals(log: logging.Logger) -> None:
    """From now on (the event loop closed, its handlers gone), a SIGTERM or Ctrl-C ends the
    process at once, saying so: the stop is done, only the interpreter's teardown is left."""

    def ended(signum: int, _frame: object) -> None:
        log.warning("%s again after the stop: exiting now", signal.Signals(signum).name)
        Stop._end(ending_code(signum))

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, ended)
