"""How deep a JSON value nests, and the depth no value the journal holds may pass.

pydantic reads a JSON document at most 200 levels deep. A value from a model (a call's
arguments, a structured answer) lands a few levels down inside a journal entry and a request's
body, so one nested too deep would make the entry unreadable and its run stuck: such values are
refused where they arrive, well before that limit.
"""

from __future__ import annotations

from typing import Final

MAX_DEPTH: Final = 64


def deeper_than(value: object, limit: int) -> bool:
    """Whether ``value``'s objects and arrays nest more than ``limit`` levels (``{}`` is one)."""
    pending: list[tuple[object, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list | tuple):
            children = list(item)
        else:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False
