"""A call's raw arguments as the JSON object every check after them reads."""

from __future__ import annotations

from typing import Any

from bot.nesting import MAX_DEPTH, loads, too_deep


def parse_arguments(raw: str) -> tuple[dict[str, Any], list[str]]:
    """The arguments as an object, or the problems that make them none."""
    try:
        value = loads(raw or "{}")
    except ValueError as exc:
        return {}, [f"arguments are not valid JSON ({exc})"]
    if not isinstance(value, dict):
        return {}, ["arguments must be a JSON object"]
    if too_deep(raw, value):
        return {}, [f"arguments nest deeper than {MAX_DEPTH} levels"]
    return value, []
