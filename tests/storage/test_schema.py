"""What the schema version tells the releases beside this one: a release refuses a store whose
schema is newer than its own, so a store this release writes in a form an earlier release
cannot read must carry a newer version than that release's."""

from __future__ import annotations

import json
from pathlib import Path

from bot.domain import Request, RequestKind
from bot.wire import to_json
from storage import postgres_schema, sqlite_schema
from storage.sqlite import open_sqlite

# The schema version release 0.2.0 applies; it refuses to open a store past it.
SCHEMA_0_2_0 = 6
# The fields of a request 0.2.0 reads: any other makes the whole entry (and the request's row)
# unreadable there ("Extra inputs are not permitted").
REQUEST_FIELDS_0_2_0 = {
    "id",
    "run_id",
    "kind",
    "call_id",
    "tool",
    "arguments",
    "digest",
    "prompt",
    "options",
    "requested_by",
    "approvals_needed",
    "origins",
    "created_at",
    "deadline",
}


def test_requests_0_2_0_cannot_read_are_written_under_a_newer_schema() -> None:
    request = Request(run_id="run_1", kind=RequestKind.WAIT_APPROVAL, call_id="c1", tool="t")
    unknown = set(json.loads(to_json(request))) - REQUEST_FIELDS_0_2_0
    assert unknown, "every request reads in 0.2.0 again: the version bump may not be needed"
    assert sqlite_schema.SCHEMA_VERSION > SCHEMA_0_2_0
    assert postgres_schema.SCHEMA_VERSION > SCHEMA_0_2_0


async def test_a_store_this_release_opens_is_past_0_2_0s_schema(tmp_path: Path) -> None:
    store = await open_sqlite(tmp_path / "kestrel.db")
    try:
        assert await store.schema_version() > SCHEMA_0_2_0
    finally:
        await store.close()
