"""Rows read back from either store: a row of the wrong shape is named, never taken as it is."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from bot.errors import StoreError
from bot.kinds import RunStatus
from storage.common import outbox_from_row, run_from_row, work_from_row

STAMP = "2026-12-04T10:00:00+00:00"


def moment(value: Any) -> datetime:
    return datetime.fromisoformat(value)


def test_rows_as_the_store_writes_them_read_back() -> None:
    run = ("run_1", "ses_1", "hi", "bob", "suspended", "waiting", "", 2, None, STAMP, STAMP)
    work = (7, "resume", '{"run_id": "run_1"}', STAMP)
    outbox = ("slack:card:req_1", "slack", "{}", '{"text": "x"}', 2, 1, "ts", 0, STAMP, "")
    assert run_from_row(run, moment).status is RunStatus.SUSPENDED
    assert work_from_row(work, moment).payload == {"run_id": "run_1"}
    assert outbox_from_row((*outbox, STAMP, STAMP), moment).due


@pytest.mark.parametrize(
    "row",
    [
        (7, "bogus", "{}", STAMP),
        (7, "resume", "[1]", STAMP),
        ("seven", "resume", "{}", STAMP),
    ],
    ids=["unknown kind", "payload not an object", "id not a number"],
)
def test_a_work_row_of_another_shape_is_named(row: tuple[Any, ...]) -> None:
    with pytest.raises(StoreError, match=r"work item .*: unreadable"):
        work_from_row(row, moment)


def test_an_outbox_row_of_another_shape_is_named() -> None:
    row = ("k", "slack", "[]", "{}", "2", 1, "ts", 0, STAMP, "", STAMP, STAMP)
    with pytest.raises(StoreError, match="outbox message 'k': unreadable"):
        outbox_from_row(row, moment)
