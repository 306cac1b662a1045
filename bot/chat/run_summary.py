"""A run's header (its budgets, calls, result) and one page of its journal, read without
loading the whole journal: what a run page shows of a run of any length.

The header's sums come from ``JournalTally`` (added up in the database) and are kept per run,
so a page read again only tallies the entries appended since (a journal never changes what it
holds). What depends on the current batch (a call deferred and not yet answered, why the model
asked) comes from folding the journal since its last model turn.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Final, Protocol

import msgspec
from msgspec.structs import replace

from bot.domain import TERMINAL_STATUSES, Fingerprint, Usage
from bot.journal.entries import AssistantTurnEntry, RunEnded, RunResumed, RunStarted
from bot.journal.fold import RunState, fold
from bot.journal.log import JournalRecord, JournalTally
from bot.records import RunRecord

# The entries a page of the timeline shows (the newest page, or those before ``before``).
PAGE_ENTRIES: Final = 400
# A page begins at the model turn its first entries answer, when that turn is this close.
LOOKBACK: Final = 64
# The entries since the last model turn folded for the current batch, at most.
TAIL_ENTRIES: Final = 2_000
# Runs whose tally is kept.
KEPT_TALLIES: Final = 256
_FOLLOW_UPS: Final = frozenset({"tool_result", "tool_dispatched", "tool_process", "tool_deferred"})


class JournalPages(Protocol):
    """The journal reads a run page makes (``bot.journal.log.JournalLog``'s)."""

    async def load_range(self, run_id: str, start: int, stop: int) -> list[JournalRecord]: ...

    async def journal_tally(self, run_id: str, start: int, stop: int) -> JournalTally: ...

    async def journal_landmarks(self, run_id: str, stop: int) -> JournalTally: ...


class JournalPage(msgspec.Struct, frozen=True):
    """One page of a run's journal and the run's state as its header shows it."""

    state: RunState
    records: list[JournalRecord]
    length: int  # entries in the whole journal when read


class _Kept(msgspec.Struct):
    tally: JournalTally
    started: RunStarted | None
    # What a forced resume went on with (``changed_seq``'s entry), read once.
    changed: Fingerprint | None = None
    changed_seq: int | None = None


class RunSummaries:
    """Pages of runs' journals with their headers; keeps each run's tally for the next read."""

    def __init__(self, journal: JournalPages) -> None:
        self._journal = journal
        self._kept: OrderedDict[str, _Kept] = OrderedDict()

    async def page(
        self,
        record: RunRecord,
        length: int,
        *,
        before: int | None = None,
        size: int | None = None,
    ) -> JournalPage:
        """The ``size`` entries (``PAGE_ENTRIES`` without it) before ``before`` (the newest
        without it), beginning at the model turn they answer, and the run's state for its
        header."""
        run_id = record.id
        stop = length if before is None else max(0, min(before, length))
        start = max(0, stop - (PAGE_ENTRIES if size is None else size))
        records = _aligned(await self._journal.load_range(run_id, start - LOOKBACK, stop), start)
        kept = await self._tallied(record, length)
        state = await self._state(record, kept, length, records)
        return JournalPage(state, records, length)

    async def _tallied(self, record: RunRecord, length: int) -> _Kept:
        run_id = record.id
        kept = self._kept.pop(run_id, None) or _Kept(JournalTally(), None)
        if kept.tally.stop == 0 and record.status in TERMINAL_STATUSES and length:
            kept.tally = await self._ended_tally(run_id, length) or kept.tally
        if kept.tally.stop < length:
            kept.tally = kept.tally + await self._journal.journal_tally(
                run_id, kept.tally.stop, length
            )
        if kept.started is None and kept.tally.started_seq is not None:
            entry = (await self._one(run_id, kept.tally.started_seq, [])).entry
            kept.started = entry if isinstance(entry, RunStarted) else None
        changed = kept.tally.changed_seq
        if changed is not None and changed != kept.changed_seq:
            kept.changed_seq = changed
            entry = (await self._one(run_id, changed, [])).entry
            kept.changed = entry.fingerprint if isinstance(entry, RunResumed) else None
        self._kept[run_id] = kept
        while len(self._kept) > KEPT_TALLIES:
            self._kept.popitem(last=False)
        return kept

    async def _ended_tally(self, run_id: str, length: int) -> JournalTally | None:
        """A finished run's tally from its end, which carries the run's usage and outcomes, and
        the few seqs read from the journal's ends: its first view reads a few rows, not all."""
        (last,) = await self._journal.load_range(run_id, length - 1, length)
        if not isinstance(last.entry, RunEnded):
            return None
        marks = await self._journal.journal_landmarks(run_id, length)
        iterations = 0
        if marks.last_turn_seq is not None:
            turn = (await self._one(run_id, marks.last_turn_seq, [])).entry
            iterations = turn.iteration + 1 if isinstance(turn, AssistantTurnEntry) else 0
        result = last.entry.result
        # As a tally counts them: answered calls only; the current batch adds its deferred.
        outcomes = {kind: n for kind, n in result.outcomes.items() if kind != "deferred"}
        return replace(
            marks,
            stop=length,
            outcomes=outcomes,
            input_tokens=result.usage.input_tokens,
            output_tokens=result.usage.output_tokens,
            iterations=iterations,
        )

    async def _state(
        self, record: RunRecord, kept: _Kept, length: int, page: list[JournalRecord]
    ) -> RunState:
        tally = kept.tally
        tail = await self._tail(record.id, tally, length, page)
        current = fold(tail, record.id)
        last_text = ""
        if tally.last_text_seq is not None:
            turn = (await self._one(record.id, tally.last_text_seq, [*page, *tail])).entry
            if turn.kind == "assistant_turn":
                last_text = turn.turn.text or ""
        outcomes = Counter(tally.outcomes)
        outcomes["deferred"] += current.outcome_counts["deferred"]
        last = tail[-1].entry if tail else None
        ended = last if last is not None and last.kind == "run_ended" else None
        return RunState(
            run_id=record.id,
            started=kept.started,
            fingerprint=kept.changed or (kept.started.fingerprint if kept.started else None),
            next_seq=length,
            messages=current.messages,
            iteration=tally.iterations,
            tool_calls=sum(tally.outcomes.values()),
            usage=Usage(input_tokens=tally.input_tokens, output_tokens=tally.output_tokens),
            batch=current.batch,
            status=ended.result.status if ended else record.status,
            result=ended.restored(last_text) if ended else None,
            last_text=last_text,
            outcome_counts=outcomes,
        )

    async def _tail(
        self, run_id: str, tally: JournalTally, length: int, page: list[JournalRecord]
    ) -> list[JournalRecord]:
        """The entries since the last model turn (the current batch), at most TAIL_ENTRIES."""
        start = max(tally.last_turn_seq or 0, length - TAIL_ENTRIES)
        if start >= length:
            return []
        if page and page[0].seq <= start and page[-1].seq == length - 1:
            return page[start - page[0].seq :]
        return await self._journal.load_range(run_id, start, length)

    async def _one(self, run_id: str, seq: int, have: Sequence[JournalRecord]) -> JournalRecord:
        for found in have:
            if found.seq == seq:
                return found
        (found,) = await self._journal.load_range(run_id, seq, seq + 1)
        return found


def _aligned(records: list[JournalRecord], start: int) -> list[JournalRecord]:
    """``records`` from ``start`` on; from the model turn before it instead when the first of
    them answer that turn (its results, its requests), so that they show with their calls."""
    first = next((n for n, r in enumerate(records) if r.seq >= start), len(records))
    if first == len(records) or records[first].entry.kind not in _FOLLOW_UPS:
        return records[first:]
    for n in range(first - 1, -1, -1):
        if records[n].entry.kind == "assistant_turn":
            return records[n:]
    return records[first:]
