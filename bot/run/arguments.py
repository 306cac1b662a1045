"""A call's raw arguments as the JSON object every check after them reads."""

from __future__ import annotations

import json
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
    # Only an escape (``"\\ud800"``) makes a lone surrogate: UTF-8 text cannot hold one.
    if "\\u" in raw and not _unicode(value):
        return {}, ["arguments hold text that is not valid Unicode (a lone surrogate)"]
    return value, []


def _unicode(value: dict[str, Any]) -> bool:
    """Whether every string in ``value`` (keys included) can be written as UTF-8."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
