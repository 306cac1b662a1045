"""Reading a stored entry back, validated as the entry its ``kind`` names."""

from __future__ import annotations

from bot import wire
from bot.journal.entries import Entry


def decode_entry(body: str | bytes) -> Entry:
    """The entry stored as ``body`` (JSON); ``wire.Unreadable`` if it is not one."""
    return wire.from_json(body, Entry)  # type: ignore[arg-type]
