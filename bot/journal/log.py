"""The journal's store role (``JournalLog``), its record (``JournalRecord``) and a page's tally."""

from __future__ import annotations

import asyncio
from typing import Protocol

import msgspec

from bot.journal.entries import Entry


class JournalRecord(msgspec.Struct, frozen=True):
    """One stored entry with its position and the epoch that wrote it. A plain record: its
    entry was validated by its kind's model as it was read, and nothing else in it needs it."""

    run_id: str
    seq: int
    epoch: int
    entry: Entry


class JournalTally(msgspec.Struct, frozen=True):
    """What a run page's header adds up over a range of a journal, read without its bodies
    leaving the database: entries by kind, tool results by outcome, tokens, and the seqs of
    the few entries the header reads itself. Tallies of adjacent ranges add up (``+``)."""

    stop: int = 0  # the end of the range tallied (exclusive)
    kinds: dict[str, int] = msgspec.field(default_factory=dict)
    outcomes: dict[str, int] = msgspec.field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0
    iterations: int = 0  # the last assistant turn's iteration + 1
    started_seq: int | None = None  # the first run_started
    last_turn_seq: int | None = None  # the last assistant turn
    last_text_seq: int | None = None  # the last assistant turn with text
    changed_seq: int | None = None  # the last forced resume that went on with a new fingerprint

    def __add__(self, later: JournalTally) -> JournalTally:
        return JournalTally(
            stop=max(self.stop, later.stop),
            kinds=_summed(self.kinds, later.kinds),
            outcomes=_summed(self.outcomes, later.outcomes),
            input_tokens=self.input_tokens + later.input_tokens,
            output_tokens=self.output_tokens + later.output_tokens,
            iterations=max(self.iterations, later.iterations),
            started_seq=self.started_seq if self.started_seq is not None else later.started_seq,
            last_turn_seq=_later(self.last_turn_seq, later.last_turn_seq),
            last_text_seq=_later(self.last_text_seq, later.last_text_seq),
            changed_seq=_later(self.changed_seq, later.changed_seq),
        )


def _summed(first: dict[str, int], second: dict[str, int]) -> dict[str, int]:
    total = dict(first)
    for key, count in second.items():
        total[key] = total.get(key, 0) + count
    return total


def _later(first: int | None, second: int | None) -> int | None:
    return first if second is None else second


class JournalLog(Protocol):
    """A run's journal: fenced appends, the epoch that fences them, the whole journal back."""

    async def current_epoch(self, run_id: str) -> int:
        """The run's epoch now (the takeover check compares its own with this)."""
        ...

    async def append(self, run_id: str, seq: int, epoch: int, entry: Entry) -> None:
        """Append at ``seq`` fenced by ``epoch``: identical record there is a no-op; raises
        ``StaleEpoch``, ``SeqConflict`` or ``SeqGap``. In the same transaction the run's row
        takes the status the entry moves it to, and a suspend or an end releases the lease."""
        ...

    def submit(self, run_id: str, seq: int, epoch: int, entry: Entry) -> asyncio.Future[None]:
        """``append`` without waiting: queued at once, written in submission order; the future
        settles (or fails as ``append`` would) once the entry is durable."""
        ...

    async def load(self, run_id: str) -> list[JournalRecord]:
        """The run's whole journal, in order; ``UnreadableJournal`` if an entry does not read
        back or is missing."""
        ...

    async def load_range(self, run_id: str, start: int, stop: int) -> list[JournalRecord]:
        """The run's entries with ``start <= seq < stop``, in order (seqs have no gaps, so a
        page of the journal is a range); raises ``UnknownRun``."""
        ...

    async def journal_length(self, run_id: str) -> int:
        """How many entries the run's journal holds (its last seq + 1): one number that moves
        with every append; raises ``UnknownRun``."""
        ...

    async def journal_tally(self, run_id: str, start: int, stop: int) -> JournalTally:
        """``JournalTally`` of the entries with ``start <= seq < stop``, added up in the
        database; raises ``UnknownRun``."""
        ...

    async def journal_landmarks(self, run_id: str, stop: int) -> JournalTally:
        """The seqs of the first ``run_started``, the last assistant turn and the last one with
        text before ``stop``, and no sums: what a finished run's header reads beside its end."""
        ...
