"""The run pages over a store with real runs: what they show, escaped, and how they update."""

from __future__ import annotations

import base64
import hashlib
import re
from datetime import timedelta
from pathlib import Path

import aiohttp
from msgspec.structs import replace

from adapters.web.app import web_routes
from adapters.web.auth import WebConfig
from adapters.web.export import export_html
from adapters.web.render import load_run_page, marked, render_run_page
from adapters.web.timeline import (
    Ended,
    RequestItem,
    Suspended,
    Turn,
    UserText,
    build_run_page,
)
from bot.chat.service import ChatService, RunView
from bot.chat.words import stop_reason_words, thread_of
from bot.domain import (
    AssistantTurn,
    DecisionKind,
    Fingerprint,
    RunStatus,
    Session,
    StopReason,
    TerminalResult,
    ToolCall,
    ToolOutcome,
)
from bot.journal.entries import (
    AssistantTurnEntry,
    Entry,
    RunEnded,
    RunResumed,
    RunStarted,
    ToolDispatched,
    ToolResultEntry,
    UserMessageEntry,
)
from bot.journal.fold import fold
from bot.journal.log import JournalRecord
from bot.people.policy import Actor
from bot.pii.guard import WITHHELD_MESSAGE
from bot.records import RunRecord
from bot.run.supervisor import Supervisor
from tests.adapters.web.conftest import HOSTILE, TOKEN, Site, serve
from tests.fakes.runtime import make_runtime

ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


async def get(http: aiohttp.ClientSession, site: Site, path: str) -> tuple[int, str]:
    async with http.get(site.url + path, headers=site.bearer()) as response:
        return response.status, await response.text()


def calls_in(html: str) -> list[tuple[str, str]]:
    """(tool, exit) of each call, in page order."""
    return re.findall(
        r'<li class="call[^"]*"[^>]*data-outcome="([^"]+)">\s*<div class="call-head">'
        r'<code class="tool">([^<]+)</code>',
        html,
    )


async def test_the_run_page_shows_the_timeline_in_order_escaped(
    site: Site, http: aiohttp.ClientSession
) -> None:
    status, html = await get(http, site, f"/runs/{site.done}")
    assert status == 200
    assert [tool for _, tool in calls_in(html)] == ["echo", "echo", "echo", "boom"]
    assert [exit for exit, _ in calls_in(html)] == ["ok", "ok", "ok", "error"]
    # The tool output holding a script shows as text, in its arguments and its output.
    assert HOSTILE not in html and "<script>alert" not in html
    assert f'<pre class="output">{ESCAPED}</pre>' in html
    # The PII guard's placeholder is marked.
    assert '<span class="redacted"' in html
    assert re.search(r'<span class="redacted"[^>]*>&lt;EMAIL_ADDRESS&gt;</span>', html)
    # A long output is collapsed; a short one is not.
    assert re.search(r'<details class="output-box"[^>]*><summary>Output: 40 lines', html)
    assert "the tool failed: RuntimeError: kaboom" in html
    # The header: status, stop reason, requester, thread link, model, budgets.
    assert 'id="status" class="badge status status-completed">completed<' in html
    assert ">answered<" in html
    assert '<dd id="requester">U0REQ</dd>' in html
    assert 'href="https://app.slack.com/client/T0001/C0001/thread/C0001-1700000000.000100"' in html
    assert "test <span" in html  # the scripted model's name
    assert 'data-budget="tool_calls">tool calls: 4 of 50' in html
    # The terminal result: text and payload apart, both escaped.
    assert '<div class="text result-text" id="result-text">All good.' in html
    payload = re.search(r'<pre class="payload" id="result-payload">(.*?)</pre>', html, re.S)
    assert payload is not None and "&lt;b&gt;fine&lt;/b&gt;" in payload.group(1)
    assert "<b>fine</b>" not in html
    # A finished run does not poll.
    assert "live.js" not in html and "data-live-url" not in html


async def test_a_waiting_run_shows_its_request_and_updates_itself(
    site: Site, http: aiohttp.ClientSession
) -> None:
    status, html = await get(http, site, f"/runs/{site.waiting}")
    assert status == 200
    assert '<script src="/static/live.js" defer></script>' in html
    assert f'data-live-url="/runs/{site.waiting}/fragment"' in html
    assert f'<a class="reload" href="/runs/{site.waiting}">Reload</a>' in html
    assert f'id="req-{site.request_id}"' in html
    assert '<dd class="may-answer">U0BOSS, group:S0SRE</dd>' in html
    assert calls_in(html) == [("deferred", "deploy")]
    assert '<dd id="open-requests">1</dd>' in html

    version = re.search(r'data-version="([0-9a-f]+)"', html)
    assert version is not None
    fragment = f"/runs/{site.waiting}/fragment"
    async with http.get(site.url + fragment + f"?v={version.group(1)}", headers=site.bearer()) as r:
        assert r.status == 204
    status, part = await get(http, site, fragment)
    assert status == 200 and part.startswith('<article id="run"') and "<html" not in part

    decided = await site.chat.decide(
        site.waiting,
        site.request_id,
        DecisionKind.DENY,
        user=Actor("U0BOSS"),
        text="not during the <freeze>",
    )
    assert decided.accepted and decided.resumed is not None
    await site.chat.wait(decided.resumed)
    async with http.get(site.url + fragment + f"?v={version.group(1)}", headers=site.bearer()) as r:
        assert r.status == 200
        part = await r.text()
    assert 'data-status="completed"' in part and "data-live-url" not in part
    assert calls_in(part) == [("gate_denied", "deploy")]
    decision = re.search(r'<p class="decision" data-decision="deny">(.*?)</p>', part, re.S)
    assert decision is not None
    assert "U0BOSS" in decision.group(1) and "not during the &lt;freeze&gt;" in decision.group(1)
    assert '<tr data-action="deny">' in part  # the audit
    assert 'class="badge req-status req-answered">answered<' in part
    assert "Shipped v2." not in part  # denied: the second reply's other branch


async def test_runs_lists_and_filters(site: Site, http: aiohttp.ClientSession) -> None:
    status, html = await get(http, site, "/runs")
    assert status == 200
    listed = re.findall(r'<tr class="run" data-run="([^"]+)" data-status="([^"]+)"', html)
    assert listed == [(site.waiting, "suspended"), (site.done, "completed")]
    assert '<td class="requester">U0REQ</td>' in html
    assert "may answer: U0BOSS, group:S0SRE" in html
    # Two runs of 50 shown: there are no more to show, whatever ?limit= says.
    assert '<p class="hint">All 2 runs.</p>' in html
    status, html = await get(http, site, "/runs?limit=1")
    assert '<p class="hint">The 1 newest runs; <code>?limit=</code> shows more.</p>' in html

    for query, expected in [
        ("?status=suspended", [site.waiting]),
        ("?status=completed", [site.done]),
        ("?status=failed", []),
        ("?may_answer=U0BOSS", [site.waiting]),
        ("?may_answer=group:S0SRE&status=suspended", [site.waiting]),
        ("?may_answer=U0REQ", []),
        ("?limit=1", [site.waiting]),
    ]:
        status, html = await get(http, site, "/runs" + query)
        assert status == 200
        assert re.findall(r'<tr class="run" data-run="([^"]+)"', html) == expected, query
    for bad in ("?status=bogus", "?limit=ten"):
        status, _ = await get(http, site, "/runs" + bad)
        assert status == 400


async def test_pending_lists_open_requests_with_who_may_answer(
    site: Site, http: aiohttp.ClientSession
) -> None:
    status, html = await get(http, site, "/pending")
    assert status == 200
    assert re.findall(r'<li class="request" data-request="([^"]+)"', html) == [site.request_id]
    assert '<dd class="may-answer">U0BOSS, group:S0SRE</dd>' in html
    assert f'href="/runs/{site.waiting}"' in html
    assert re.search(r'<dd class="deadline"><time datetime="[^"]+">[^<]+</time> \(in \d+m\)', html)


async def test_an_unknown_run_is_404(site: Site, http: aiohttp.ClientSession) -> None:
    for path in ("/runs/run_nope", "/runs/run_nope/fragment"):
        status, body = await get(http, site, path)
        assert status == 404 and "no such run" in body


async def test_the_export_is_one_self_contained_file(
    chat: tuple[ChatService, str, str, str],
) -> None:
    service, done, waiting, _ = chat
    for run_id in (done, waiting):
        html = await export_html(service, run_id)
        # Nothing but anchors within the page.
        assert re.findall(r'(?<![\w-])(?:src|href|action)\s*=\s*"?([^"#])', html) == []
        assert "<script" not in html and "<link" not in html and "@import" not in html
        style = re.search(r"<style>(.*?)</style>", html, re.S)
        assert style is not None
        digest = base64.b64encode(hashlib.sha256(style.group(1).encode()).digest()).decode()
        csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', html)
        assert csp is not None
        assert f"style-src &#39;sha256-{digest}&#39;" in csp.group(1)
        assert "default-src &#39;none&#39;" in csp.group(1)
    html = await export_html(service, done)
    assert ESCAPED in html and HOSTILE not in html
    assert "https://app.slack.com/client/T0001/C0001/thread/C0001-1700000000.000100" in html


async def test_the_timeline_model(chat: tuple[ChatService, str, str, str]) -> None:
    service, done, waiting, request_id = chat
    page = await load_run_page(service, done)
    kinds = [item.kind for item in page.items]
    assert kinds == ["started", "user", "turn", "turn", "ended"]
    first = page.items[2]
    assert isinstance(first, Turn)
    assert [(c.tool, c.outcome) for c in first.calls] == [
        ("echo", "ok"),
        ("echo", "ok"),
        ("echo", "ok"),
        ("boom", "error"),
    ]
    assert first.calls[0].output == HOSTILE and first.calls[2].long and not first.calls[0].long
    ended = page.items[-1]
    assert isinstance(ended, Ended) and ended.result.payload == {"ok": True, "note": "<b>fine</b>"}
    assert not page.live and page.thread.platform == "slack"

    waiting_page = await load_run_page(service, waiting)
    request = next(i for i in waiting_page.items if isinstance(i, RequestItem))
    assert request.request.id == request_id and request.status == "open"
    assert request.may_answer == ("U0BOSS", "group:S0SRE")
    assert [row.action for row in request.decisions] == ["request"]
    assert isinstance(waiting_page.items[-1], Suspended) and waiting_page.live
    assert isinstance(waiting_page.items[1], UserText)


def test_threads_and_redaction_marks() -> None:
    assert thread_of("discord:123:456").url == "https://discord.com/channels/123/456"
    assert (
        thread_of("slack:T1X:C2Y:1.2").url == "https://app.slack.com/client/T1X/C2Y/thread/C2Y-1.2"
    )
    for odd in ("slack:T1:C2:javascript:alert(1)", "slack:t1:c2:1.2", "discord:x:1", "console"):
        thread = thread_of(odd)
        assert thread.url is None and thread.label == odd
    assert str(marked("a <IP_ADDRESS> b")) == (
        'a <span class="redacted" title="redacted by the PII guard">&lt;IP_ADDRESS&gt;</span> b'
    )
    assert "redacted" not in str(marked("<NOT_AN_ENTITY> &lt;EMAIL_ADDRESS&gt;"))
    assert 'class="redacted"' in str(marked(WITHHELD_MESSAGE))
    assert str(marked("<b>x</b>")) == "&lt;b&gt;x&lt;/b&gt;"


def big_run(entries: int) -> tuple[RunView, list[JournalRecord]]:
    """A finished run of about ``entries`` journal entries: turns of three calls each."""
    run_id = "run_big"
    journal: list[Entry] = [
        RunStarted(
            run_id=run_id,
            session_id="slack:T1:C1:1.1",
            requested_by="U1",
            fingerprint=Fingerprint(
                provider="p", model="m", tools_digest="t", system_prompt_digest="s"
            ),
        ),
        UserMessageEntry(text="go", by="U1"),
    ]
    turn = 0
    while len(journal) < entries - 2:
        calls = tuple(
            ToolCall(id=f"c{turn}_{n}", name="echo", arguments=f'{{"text": "n{n}"}}')
            for n in range(3)
        )
        journal.append(
            AssistantTurnEntry(iteration=turn, turn=AssistantTurn(text=f"turn {turn}", calls=calls))
        )
        for n, call in enumerate(calls):
            output = ("x" * 80 + "\n") * (20 if n == 2 else 2) + f"<EMAIL_ADDRESS> {HOSTILE}"
            journal.append(
                ToolResultEntry(call_id=call.id, tool="echo", outcome=ToolOutcome.OK, output=output)
            )
        turn += 1
    journal.append(AssistantTurnEntry(iteration=turn, turn=AssistantTurn(text="done")))
    result = TerminalResult(  # as the loop ends it: the outcomes of every call
        status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED, outcomes={"ok": 3 * turn}
    )
    journal.append(RunEnded.of(replace(result, text="done"), "done"))
    records = [JournalRecord(run_id=run_id, seq=n, epoch=1, entry=e) for n, e in enumerate(journal)]
    record = RunRecord(id=run_id, session_id="slack:T1:C1:1.1", status=RunStatus.COMPLETED)
    return RunView(record, fold(records, run_id)), records


def test_a_run_of_a_thousand_entries_shows_every_call_escaped() -> None:
    # How fast it renders is measured in bench/web.py, never asserted here.
    view, records = big_run(1000)
    assert len(records) >= 999
    page = build_run_page(view, records, [], [])
    html = render_run_page(page, now=view.record.created_at + timedelta(minutes=5))
    assert html.count('<li class="call') == 3 * ((len(records) - 4) // 4)
    assert HOSTILE not in html


DISGUISED = "Pay at <https://evil.example|https://bank.example>; see [docs](https://evil.example)."


def test_a_link_the_model_hides_is_text_on_the_page_with_its_target() -> None:
    # The page renders no Markdown and links nothing in text: what the model wrote is shown as
    # it was written, target and all, and the only links are Kestrel's own.
    run_id = "run_links"
    call = ToolCall(id="c1", name="echo", arguments='{"text": "[docs](https://evil.example)"}')
    journal: list[Entry] = [
        RunStarted(
            run_id=run_id,
            session_id="slack:T1:C1:1.1",
            requested_by="U1",
            fingerprint=Fingerprint(
                provider="p", model="m", tools_digest="t", system_prompt_digest="s"
            ),
        ),
        UserMessageEntry(text=DISGUISED, by="U1"),
        AssistantTurnEntry(iteration=0, turn=AssistantTurn(text=DISGUISED, calls=(call,))),
        ToolResultEntry(call_id="c1", tool="echo", outcome=ToolOutcome.OK, output=DISGUISED),
        AssistantTurnEntry(iteration=1, turn=AssistantTurn(text=DISGUISED)),
    ]
    result = TerminalResult(status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED)
    journal.append(RunEnded.of(replace(result, text=DISGUISED), "done"))
    records = [JournalRecord(run_id=run_id, seq=n, epoch=1, entry=e) for n, e in enumerate(journal)]
    record = RunRecord(id=run_id, session_id="slack:T1:C1:1.1", status=RunStatus.COMPLETED)
    view = RunView(record, fold(records, run_id))
    html = render_run_page(build_run_page(view, records, [], []), now=record.created_at)
    shown = str(marked(DISGUISED))
    assert html.count(shown) >= 4  # the prompt, the turns, the output and the answer
    assert "&lt;https://evil.example|https://bank.example&gt;" in shown
    hrefs = re.findall(r'href="([^"]*)"', html)
    assert hrefs and not [h for h in hrefs if "evil" in h or "bank" in h]


def test_a_page_says_why_a_run_stopped_in_the_words_every_platform_uses() -> None:
    view, records = big_run(40)
    result = TerminalResult(
        status=RunStatus.FAILED, stop_reason=StopReason.TOKEN_BUDGET, outcomes={"ok": 36}
    )
    records[-1] = replace(records[-1], entry=RunEnded(result=result))
    record = replace(
        view.record, status=RunStatus.FAILED, stop_reason=StopReason.TOKEN_BUDGET.value
    )
    view = RunView(record, fold(records, record.id))
    html = render_run_page(build_run_page(view, records, [], []), now=record.created_at)
    assert html.count(stop_reason_words(StopReason.TOKEN_BUDGET)) == 2  # the header, the end
    assert "token_budget" not in html


async def test_a_long_runs_page_shows_its_newest_entries_and_pages_back(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rt, _ = await make_runtime(tmp_path / "k.db", [])
    service = ChatService(Supervisor(rt))
    _, records = big_run(3_000)
    live = [r.entry for r in records[:-2]]  # no final turn, no end: the run is live
    session = Session(id="slack:T1:C1:1.1", platform="slack", channel="C1", thread="1.1")
    run = RunRecord(id="run_big", session_id=session.id, requested_by="U1")
    await rt.store.create_run(run, "elsewhere", 3600.0, session, live)
    config = WebConfig(token=TOKEN)
    runner, url = await serve(web_routes(service, config))
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    try:

        async def fetch(path: str) -> tuple[int, str]:
            async with http.get(url + path, headers=bearer) as response:
                return response.status, await response.text()

        status, html = await fetch("/runs/run_big")
        assert status == 200
        seqs = [int(s) for s in re.findall(r'<li class="item [a-z]+" id="seq-(\d+)"', html)]
        assert f'data-result-seq="{len(live) - 1}"' in html  # the newest entry
        assert 0 < seqs[0] < len(live) - 300 and seqs == sorted(seqs)
        assert "calls" in html and 'data-live-url="/runs/run_big/fragment"' in html
        older = re.search(r'id="earlier">[^<]*<a href="([^"]+)"', html)
        assert older is not None and older.group(1) == f"/runs/run_big?before={seqs[0]}"
        # The header adds up the whole journal (in SQL), as its fold does.
        state = fold(await rt.store.load("run_big"), "run_big")
        assert f'data-budget="tool_calls">tool calls: {state.tool_calls:,} of' in html
        assert f'data-budget="iterations">iterations: {state.iteration:,} of' in html
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(state.outcomes().items()))
        assert f'<dd id="calls">{state.tool_calls} <span class="muted">({outcomes})' in html

        status, page = await fetch(older.group(1).replace("&amp;", "&"))
        assert status == 200
        earlier = [int(s) for s in re.findall(r'<li class="item [a-z]+" id="seq-(\d+)"', page)]
        assert earlier[-1] < seqs[0] and "data-live-url" not in page  # an old page stays
        assert 'id="later"' in page and "result without its call" not in page
        status, first = await fetch("/runs/run_big?before=5")
        assert status == 200 and 'id="seq-0"' in first and 'id="earlier"' not in first
        status, _ = await fetch("/runs/run_big?before=-1")
        assert status == 400

        # The live check: unchanged, 204; an appended entry, 200 with it.
        version = re.search(r'data-version="([0-9a-f]+)"', html)
        assert version is not None
        status, _ = await fetch(f"/runs/run_big/fragment?v={version.group(1)}")
        assert status == 204
        epoch = await rt.store.claim("run_big", "elsewhere", 3600.0)
        assert epoch is not None
        status, _ = await fetch(f"/runs/run_big/fragment?v={version.group(1)}")
        assert status == 200  # the lease moved: the page shows it
        changed = re.search(r'data-version="([0-9a-f]+)"', _)
        assert changed is not None
        await rt.store.append("run_big", len(live), epoch, UserMessageEntry(text="more", by="U1"))
        status, part = await fetch(f"/runs/run_big/fragment?v={changed.group(1)}")
        assert status == 200 and f'id="seq-{len(live)}"' in part
    finally:
        await runner.cleanup()
        await rt.store.close()


async def test_a_plan_shows_its_steps_on_the_pending_and_run_pages(tmp_path: Path) -> None:
    from adapters.web.render import render_pending
    from tests.fakes.plans import APPROVER, plan_world
    from tests.fakes.runtime import call, reply

    calls = [call("restart_unit", unit=HOSTILE), call("drain_node", unit="node-1")]
    world = await plan_world(tmp_path, [reply(*calls, text="both"), reply(text="ok")])
    run_id = await world.start()
    plan = await world.plan(run_id)

    html = render_pending(await world.chat.pending(user=Actor(APPROVER)))
    assert html.count('<li class="plan-step">') == 2
    assert "restart_unit" in html and "drain_node" in html and ESCAPED in html
    assert "Approve plan lets each step run once" in html
    page = render_run_page(await load_run_page(world.chat, run_id))
    assert page.count('<li class="plan-step">') == 2 and f"<code>{plan.digest}</code>" in page
    await world.rt.store.close()


async def test_a_request_two_people_approved_names_both_on_the_run_page(tmp_path: Path) -> None:
    from bot.people.policy import Policy
    from bot.prompter import DeferringPrompter
    from tests.adapters.web.conftest import POLICY, SCRIPT, THREAD
    from tests.fakes.runtime import Counter, counting_tools

    tools = counting_tools(Counter(), approvals=2)
    rt, _ = await make_runtime(tmp_path / "k.db", SCRIPT, tools)
    rt.policy = Policy(POLICY)
    service = ChatService(Supervisor(rt))
    user = Actor("U0REQ")
    started = await service.submit_turn(
        "ship v2", user=user, session=THREAD, prompter=DeferringPrompter()
    )
    (request,) = (await service.wait(started)).open_requests
    first = await service.decide(
        started.run_id, request.id, DecisionKind.APPROVE, user=Actor("U0BOSS")
    )
    assert first.accepted and first.resumed is None
    sre = Actor("U0SRE", groups=frozenset({"S0SRE"}))
    second = await service.decide(started.run_id, request.id, DecisionKind.APPROVE, user=sre)
    assert second.resumed is not None
    await service.wait(second.resumed)

    html = render_run_page(await load_run_page(service, started.run_id))
    decision = re.search(r'<p class="decision" data-decision="approve">(.*?)</p>', html, re.S)
    assert decision is not None
    assert "by U0BOSS, U0SRE," in decision.group(1), decision.group(1)
    await rt.store.close()


async def test_pending_says_who_may_answer_in_the_clis_words(tmp_path: Path) -> None:
    from adapters.web.render import load_run_rows, render_pending, render_runs
    from bot.people.policy import Policy, PolicyRules
    from bot.prompter import DeferringPrompter
    from tests.adapters.web.conftest import SCRIPT, THREAD
    from tests.fakes.runtime import Counter, counting_tools

    rt, _ = await make_runtime(tmp_path / "k.db", SCRIPT, counting_tools(Counter()))
    rt.policy = Policy(PolicyRules())  # anyone approves, but not their own run
    service = ChatService(Supervisor(rt))
    started = await service.submit_turn(
        "ship v2", user=Actor("U0REQ"), session=THREAD, prompter=DeferringPrompter()
    )
    (request,) = (await service.wait(started)).open_requests
    said = rt.policy.may_answer_phrase(request, None)  # what `kestrel runs pending` says
    assert said == "anyone but the requester (U0REQ)"
    html = render_pending(await service.pending(user=Actor("U0BOSS")))
    assert f'<dd class="may-answer">{said}</dd>' in html
    page = render_run_page(await load_run_page(service, started.run_id))
    assert f'<dd class="may-answer">{said}</dd>' in page
    runs = render_runs(await load_run_rows(service, limit=10))
    assert f'<div class="may-answer">may answer: {said}</div>' in runs
    await rt.store.close()


async def test_a_run_of_ten_thousand_entries_is_read_whole_page_by_page(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    # Back from the newest page by "older pages", then forward by "the next page": every
    # call shows with its output on some page, none as a result without its call, every page
    # bounded, and each walk ends where it should.
    rt, _ = await make_runtime(tmp_path / "k.db", [])
    service = ChatService(Supervisor(rt))
    view, records = big_run(10_000)
    session = Session(id="slack:T1:C1:1.1", platform="slack", channel="C1", thread="1.1")
    await rt.store.create_run(view.record, "elsewhere", 3600.0, session, [r.entry for r in records])
    calls = {
        call.id
        for r in records
        if isinstance(r.entry, AssistantTurnEntry)
        for call in r.entry.turn.calls
    }
    runner, url = await serve(web_routes(service, WebConfig(token=TOKEN)))
    bearer = {"Authorization": f"Bearer {TOKEN}"}

    async def walk(path: str, rel: str) -> tuple[set[str], int]:
        """The calls shown with an output on the pages from ``path`` on, by links ``rel``."""
        shown: set[str] = set()
        pages = 0
        next_path: str | None = path
        while next_path is not None:
            async with http.get(url + next_path, headers=bearer) as response:
                assert response.status == 200, next_path
                html = await response.text()
            pages += 1
            assert pages <= 10_000 // 400 + 2, "the walk does not end"
            assert "result without its call" not in html, next_path
            assert len(re.findall(r'<li class="item ', html)) <= 400 + 3, next_path
            shown |= set(re.findall(r'data-call="([^"]+)" data-seq="\d+" data-result-seq', html))
            found = re.search(rf'<a href="([^"]+)" rel="{rel}">', html)
            next_path = found.group(1).replace("&amp;", "&") if found else None
        return shown, pages

    try:
        back, pages = await walk("/runs/run_big", "prev")
        assert back == calls and pages >= 10_000 // 400
        forward, _ = await walk("/runs/run_big?before=1", "next")
        assert forward == calls
    finally:
        await runner.cleanup()
        await rt.store.close()


def test_an_older_page_cut_between_an_effect_and_its_result_does_not_call_it_lost() -> None:
    # A page ends after a turn's effect started and before its result, which the next page
    # shows: the older page must not warn "effect started, no result" of a run that had it.
    finished, records = big_run(60)
    turn = next(r for r in records if isinstance(r.entry, AssistantTurnEntry) and r.seq > 20)
    assert isinstance(turn.entry, AssistantTurnEntry)
    first = turn.entry.turn.calls[0]
    entries = [r.entry for r in records]
    entries.insert(turn.seq + 1, ToolDispatched(call_id=first.id, tool=first.name))
    run_id = records[0].run_id
    journal = [JournalRecord(run_id=run_id, seq=n, epoch=1, entry=e) for n, e in enumerate(entries)]
    view = RunView(finished.record, fold(journal, run_id))
    cut = turn.seq + 2  # the dispatch on this page, the result on the next
    page = build_run_page(view, journal[:cut], [], [], length=len(journal))
    html = render_run_page(page)
    assert "effect started, no result" not in html
    call = re.search(rf'<li class="call[^"]*" data-call="{first.id}"[^>]*>', html)
    assert call is not None and 'data-outcome="on a newer page"' in call.group(0), call
    # On the newest page of a run, an effect with no result is said to be one.
    newest = build_run_page(view, journal[: turn.seq + 2], [], [])
    assert "effect started, no result" in render_run_page(newest)


def test_an_older_page_does_not_promise_a_result_the_run_never_had() -> None:
    # Cancelled while its last turn's effect ran (a shutdown cut it): the run ended with the
    # effect's outcome unknown. A page cut after the dispatch must not send its reader to a
    # newer page for a result no page has: it says the effect has none.
    finished, records = big_run(60)
    turn = next(r for r in records if isinstance(r.entry, AssistantTurnEntry) and r.seq > 20)
    assert isinstance(turn.entry, AssistantTurnEntry)
    first = turn.entry.turn.calls[0]
    cause = "cancelled on request; echo had started, and whether it took effect is unknown"
    ended = TerminalResult(
        status=RunStatus.CANCELLED, stop_reason=StopReason.CANCELLED, outcomes={"ok": 0}
    )
    entries = [r.entry for r in records[: turn.seq + 1]]
    entries += [ToolDispatched(call_id=first.id, tool=first.name), RunEnded.of(ended, cause)]
    run_id = records[0].run_id
    journal = [JournalRecord(run_id=run_id, seq=n, epoch=1, entry=e) for n, e in enumerate(entries)]
    view = RunView(replace(finished.record, status=RunStatus.CANCELLED), fold(journal, run_id))
    page = build_run_page(view, journal[: turn.seq + 2], [], [], length=len(journal))
    html = render_run_page(page)
    assert "on a newer page" not in html
    call = re.search(rf'<li class="call[^"]*" data-call="{first.id}"[^>]*>', html)
    assert call is not None and 'data-outcome="dispatched"' in call.group(0), call
    assert "effect started, no result" in html


def test_a_forced_resume_shows_the_model_the_run_went_on_with() -> None:
    # The header named the start's model for the rest of the run, after on-call had forced it
    # on to another one.
    view, records = big_run(12)
    then = Fingerprint(
        provider="openai", model="gpt-new", tools_digest="t", system_prompt_digest="s"
    )
    resumed = RunResumed(owner="w2", forced=True, by="U0ONCALL", fingerprint=then)
    records.insert(2, JournalRecord(run_id=view.record.id, seq=2, epoch=2, entry=resumed))
    records = [replace(r, seq=n) for n, r in enumerate(records)]
    view = RunView(view.record, fold(records, view.record.id))

    html = render_run_page(build_run_page(view, records, [], []), now=view.record.created_at)

    assert '<dd id="model">gpt-new <span class="muted">(openai)</span></dd>' in html
    assert "(forced, with model gpt-new)" in html
