"""How deep a JSON value nests, and the depth no value the journal holds may pass.

The journal's decoder reads a JSON document only so deep (pydantic's stopped at 200 levels,
msgspec's at the interpreter's recursion limit). A value from a model (a call's
arguments, a structured answer) lands a few levels down inside a journal entry and a request's
body, so one nested too deep would make the entry unreadable and its run stuck: such values are
refused where they arrive, well before that limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Final

MAX_DEPTH: Final = 64


def deeper_than(value: object, limit: int, seen: dict[int, int] | None = None) -> bool:
    """Whether ``value``'s objects and arrays nest more than ``limit`` levels (``{}`` is one).

    Recursive, but never past ``limit`` levels; a call's usual flat arguments cost one loop.
    ``seen``, for a YAML value, whose aliases share one container among many places: each
    container is looked into once per depth left (the most found shallow enough), so ten lines
    of nested aliases cost what their nodes do, not the billions of paths to them.
    """
    children: Iterable[object]
    if isinstance(value, dict):
        children = value.values()
    elif isinstance(value, list | tuple):
        children = value
    else:
        return False
    if limit < 1:
        return True
    if seen is not None and seen.get(id(value), -1) >= limit:
        return False
    for child in children:
        if isinstance(child, _CONTAINERS) and deeper_than(child, limit - 1, seen):
            return True
    if seen is not None:
        seen[id(value)] = limit
    return False


_CONTAINERS: Final = (dict, list, tuple)


def too_deep(text: str, value: object) -> bool:
    """Whether ``value``, read from the JSON ``text``, nests deeper than ``MAX_DEPTH``: each level
    takes two characters, so a shorter text is not looked into (most of a run's calls)."""
    return len(text) > 2 * MAX_DEPTH and deeper_than(value, MAX_DEPTH)


def loads(text: str) -> Any:
    """``json.loads``, where a text nested past the interpreter's recursion limit (which the
    decoder gives up on with a ``RecursionError``) is the ``ValueError`` any bad JSON is: a
    model's arguments or answer can be nested so, and must be refused, not crash the run."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deep to decode") from None
