"""No value nested deeper than the journal can read back gets into it."""

from __future__ import annotations

import json

import pytest

from bot import wire
from bot.domain import Request, extract_payload
from bot.nesting import MAX_DEPTH, deeper_than
from tests.storage.test_store_contract import a_request


def nested(depth: int) -> dict[str, object]:
    """An object ``depth`` levels deep, objects and arrays taking turns."""
    value: dict[str, object] | list[object] = {}
    for outer in reversed(range(depth - 1)):  # the outermost wrapping is an object
        value = {"a": value} if outer % 2 == 0 else [value]
    assert isinstance(value, dict)
    return value


@pytest.mark.parametrize(
    ("value", "depth"),
    [({}, 1), ([], 1), ("text", 0), ({"a": [1, {"b": None}]}, 3), (nested(MAX_DEPTH), MAX_DEPTH)],
)
def test_depth_is_counted_in_objects_and_arrays(value: object, depth: int) -> None:
    assert not deeper_than(value, depth)
    assert deeper_than(value, depth - 1) == (depth > 0)


def test_the_deepest_value_allowed_reads_back_inside_a_request() -> None:
    request = a_request("run_1", arguments=nested(MAX_DEPTH))
    assert wire.from_json(wire.to_json(request), Request) == request


def test_a_structured_answer_nested_too_deep_is_no_payload() -> None:
    assert extract_payload(json.dumps(nested(MAX_DEPTH))) == nested(MAX_DEPTH)
    assert extract_payload(json.dumps(nested(MAX_DEPTH + 1))) is None
