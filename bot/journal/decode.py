"""Reading a stored entry back, validated as the entry its ``kind`` names."""

from __future__ import annotations

from bot import wire
from bot.journal.entries import Entry


def decode_entry(body: str | bytes) -> Entry:
    """The entry stored as ``body`` (JSON); ``wire.Unreadable`` if it is not one."""
    return wire.from_json(body, Entry)  # type: ignore[arg-type]


# Built with the module, not on first use. Only a process that writes or reads entries imports
# the journal, and the store checks that every entry it writes reads back as its kind: the first
# entry of each kind had its field types inspected inside the run (1.9 M of a fresh process's
# first suspend's 8.6 M instructions, bench.cold). Every kind's decoder then takes the types this
# one found (0.5 ms for all of them, once).
wire.prepare(Entry)
