"""A run's journal as its task sees it: fenced appends that keep the folded state in step."""

from __future__ import annotations

from bot.domain import Entry
from bot.state import RunState, apply
from bot.store import StaleEpoch, Store


class TakenOver(Exception):
    """Another owner claimed the run: this task must stop without any further effect."""


class RunJournal:
    """Appends at the next seq under this task's epoch, then applies the entry to the state."""

    def __init__(self, store: Store, state: RunState, epoch: int) -> None:
        self.store = store
        self.state = state
        self.epoch = epoch

    @property
    def run_id(self) -> str:
        """The run this journal belongs to."""
        return self.state.run_id

    async def append(self, entry: Entry) -> None:
        """Append durably; a stale epoch means the run was taken over."""
        try:
            await self.store.append(self.run_id, self.state.next_seq, self.epoch, entry)
        except StaleEpoch as exc:
            raise TakenOver(str(exc)) from exc
        self.state.next_seq += 1
        apply(self.state, entry)

    async def still_owner(self) -> bool:
        """The takeover check: does the store still know this task's epoch?"""
        return await self.store.current_epoch(self.run_id) == self.epoch
