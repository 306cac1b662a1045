"""Hostile sizes: a run of 20,000 journal entries, a tool output of 8 MB. The page (and the
live fragment, re-sent whole on each change, every 2 s while running) is not bounded."""

from __future__ import annotations

from datetime import timedelta

from adapters.web.render import render_run_fragment, render_run_page
from adapters.web.timeline import build_run_page
from bot.chat.service import RunView
from bot.domain import AssistantTurn, ToolCall, ToolOutcome
from bot.journal.entries import AssistantTurnEntry, Entry, ToolResultEntry
from bot.journal.fold import fold
from bot.journal.log import JournalRecord
from tests.adapters.web.test_pages import big_run

# What one page may weigh; a bigger run should be paged, or its outputs cut with a note.
BOUND = 2_000_000


def test_a_run_of_twenty_thousand_entries_gives_a_bounded_page() -> None:
    view, records = big_run(20_000)
    page = build_run_page(view, records, [], [])
    html = render_run_page(page, now=view.record.created_at + timedelta(minutes=5))
    fragment = render_run_fragment(page, now=view.record.created_at + timedelta(minutes=5))
    assert 'id="earlier"' in html  # the page says what it leaves out
    assert len(html.encode()) < BOUND
    assert len(fragment.encode()) < BOUND


def test_one_huge_tool_output_gives_a_bounded_page() -> None:
    view, records = big_run(10)
    run_id = view.record.id
    huge = "x" * 8_000_000
    extra: list[Entry] = [
        AssistantTurnEntry(
            iteration=99, turn=AssistantTurn(calls=(ToolCall(id="h", name="cat", arguments="{}"),))
        ),
        ToolResultEntry(call_id="h", tool="cat", outcome=ToolOutcome.OK, output=huge),
    ]
    records = records[:-2] + [
        JournalRecord(run_id=run_id, seq=records[-3].seq + 1 + n, epoch=1, entry=e)
        for n, e in enumerate(extra)
    ]
    view = RunView(view.record, fold(records, run_id))
    page = build_run_page(view, records, [], [])
    html = render_run_page(page, now=view.record.created_at + timedelta(minutes=5))
    print(f"one 8 MB output: page {len(html.encode()):,} B")
    assert len(html.encode()) < BOUND


def test_an_open_request_with_megabytes_of_arguments_gives_a_bounded_pending_page() -> None:
    from msgspec.structs import replace

    from adapters.web.render import render_pending
    from bot.chat.service import PendingRequest
    from bot.domain import PlanStep
    from tests.adapters.web.test_hostile_pages import hostile_run

    _, pending = hostile_run("run_x", payload="p")
    huge = {"text": "x" * 8_000_000}
    call = replace(pending.request, id="req_call", arguments=huge)
    plan = replace(
        pending.request,
        id="req_plan",
        steps=(PlanStep(tool="deploy", arguments=huge), PlanStep(tool="deploy", arguments=huge)),
    )
    html = render_pending([PendingRequest(r, ("U1",)) for r in (call, plan)])
    assert len(html.encode()) < BOUND
    assert "more characters" in html  # and says what it left out
