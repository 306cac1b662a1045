"""Reading a stored entry back, validated as the entry its ``kind`` names."""

from __future__ import annotations

from typing import get_args

import msgspec

from bot import wire
from bot.journal.entries import Entry


def decode_entry(body: str | bytes) -> Entry:
    """The entry stored as ``body`` (JSON); ``wire.Unreadable`` if it is not one."""
    try:
        return wire.from_json(body, Entry)  # type: ignore[arg-type]
    except wire.Unreadable as exc:
        raise wire.Unreadable(_cause(body, exc)) from exc


def _cause(body: str | bytes, exc: wire.Unreadable) -> str:
    """Why ``body`` is no entry, said so that a person knows what happened: a kind this
    Kestrel does not know was written by a newer one, and is not a damaged entry."""
    try:
        value = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return str(exc)
    kind = value.get("kind") if isinstance(value, dict) else None
    if not isinstance(kind, str) or kind in {entry.kind for entry in get_args(Entry)}:
        return str(exc)
    return f"its kind {kind!r} is not one this Kestrel knows (a newer version wrote it?)"
