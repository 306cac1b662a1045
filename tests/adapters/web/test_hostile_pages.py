"""Hostile tests of the run pages: every field that reaches the HTML carries markup that breaks
out of text and attribute contexts; the pages are loaded in a real Chromium and inspected.

A fake ``RunReader`` holds runs whose every string is attacker-shaped (ids included), so
nothing the real runtime would sanitise on the way in protects the page.
"""

from __future__ import annotations

import base64
import hashlib
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from adapters.web.app import web_routes
from adapters.web.auth import CONTENT_SECURITY_POLICY, WebConfig
from adapters.web.render import render_run_page
from adapters.web.timeline import build_run_page
from bot.chat.service import PendingRequest, RequestView, RunInspection, RunMark, RunView
from bot.config.settings import WebSettings
from bot.domain import (
    ArgumentOrigin,
    AssistantTurn,
    Budgets,
    Decision,
    DecisionKind,
    Fingerprint,
    Grant,
    GrantKind,
    PlanStep,
    ProcessStamp,
    Request,
    RequestKind,
    RequestStatus,
    RunStatus,
    StopReason,
    TerminalResult,
    ToolCall,
    ToolOutcome,
    Usage,
)
from bot.errors import UnknownRun
from bot.journal.entries import (
    AdvisoryEntry,
    AnswerSupplied,
    AssistantTurnEntry,
    Entry,
    GrantWritten,
    RunEnded,
    RunResumed,
    RunStarted,
    RunSuspended,
    ToolDeferred,
    ToolDispatched,
    ToolProcess,
    ToolResultEntry,
    UserMessageEntry,
)
from bot.journal.fold import fold
from bot.journal.log import JournalRecord
from bot.records import RunRecord
from tests.adapters.web.conftest import PUBLIC_URL, SECRET, TOKEN, serve
from tests.fakes.browser import browser_or_skip

# Breaks out of text, of double- and single-quoted attributes, of <pre>/<q>/<textarea>/<title>,
# and tries a javascript: URL; any of them running sets window.__pwned.
H = (
    "\"'></pre></q></title></textarea></code>"
    '<img src=x onerror="window.__pwned=1">'
    "<script>window.__pwned=2</script>"
    '<a id="jsurl" href="javascript:window.__pwned=3">x</a>'
    "<svg onload=window.__pwned=4>"
)
T0 = datetime(2023, 11, 14, 22, 0, tzinfo=UTC)


@dataclass
class Audit:
    at: datetime
    actor: str
    action: str
    run_id: str
    request_id: str
    detail: str


@dataclass
class Stored:
    record: RunRecord
    journal: list[JournalRecord]
    audit: list[Audit]
    requests: list[RequestView]


@dataclass
class HostileReader:
    """A RunReader over runs built in memory."""

    runs: dict[str, Stored] = field(default_factory=dict)
    open: list[PendingRequest] = field(default_factory=list)

    async def inspect(
        self, run_id: str, *, before: int | None = None, size: int = 400
    ) -> RunInspection:
        if run_id not in self.runs:
            raise UnknownRun(run_id)
        s = self.runs[run_id]
        stop = len(s.journal) if before is None else before
        page = s.journal[max(0, stop - size) : stop]
        view = RunView(s.record, fold(s.journal, run_id))
        return RunInspection(view, page, list(s.audit), s.requests, len(s.journal))

    async def mark(self, run_id: str) -> RunMark:
        if run_id not in self.runs:
            raise UnknownRun(run_id)
        s = self.runs[run_id]
        return RunMark(s.record, len(s.journal), s.audit[-1] if s.audit else None)

    async def entries(self, run_id: str, start: int, stop: int) -> list[JournalRecord]:
        return self.runs[run_id].journal[start:stop]

    async def recent(self, limit: int = 10) -> list[RunRecord]:
        return [s.record for s in self.runs.values()][:limit]

    async def pending(self) -> list[PendingRequest]:
        return list(self.open)


def hostile_run(
    run_id: str,
    *,
    status: RunStatus = RunStatus.SUSPENDED,
    session: str | None = None,
    payload: str = H,
) -> tuple[Stored, PendingRequest]:
    """A run where every string field that reaches a page is ``payload`` (tagged by field)."""
    H = payload  # the module's markup, or another payload

    def h(tag: str) -> str:
        return f"{tag}:{H}"

    request = Request(
        id=f"req_{H}",
        run_id=run_id,
        kind=RequestKind.WAIT_APPROVAL,
        call_id=f"call_{H}",
        tool=h("reqtool"),
        arguments={H: H, "nested": {H: [H]}},
        digest=h("digest"),
        prompt=h("reqprompt"),
        options=(h("opt1"), h("opt2")),
        requested_by=h("reqby"),
        approvals_needed=2,
        created_at=T0,
        deadline=T0 + timedelta(hours=1),
        origins=(origin(H),),
        off_plan=h("offplan"),
    )
    decision = Decision(
        request_id=request.id, kind=DecisionKind.DENY, text=h("reason"), by=h("decider"), at=T0
    )
    calls = (
        ToolCall(id=f"call_{H}", name=h("tool"), arguments=f'{{"{H.replace(chr(34), "")}": 1}}'),
        ToolCall(id=f"c2_{H}", name=h("tool2"), arguments=h("notjson")),
        ToolCall(id=f"c3_{H}", name=h("tool3"), arguments='{"k": "' + "v" * 700 + '"}'),
    )
    entries: list[Entry] = [
        RunStarted(
            run_id=run_id,
            session_id=session or h("session"),
            requested_by=h("startedby"),
            fingerprint=Fingerprint(
                provider=h("provider"), model=h("model"), tools_digest="t", system_prompt_digest="s"
            ),
            budgets=Budgets(deadline_seconds=60),
            history=((H, H),),
            at=T0,
        ),
        UserMessageEntry(text=h("usertext"), by=h("userby")),
        AssistantTurnEntry(
            iteration=0,
            turn=AssistantTurn(
                text=h("modeltext"), calls=calls, finish_reason=h("finish"), usage=Usage()
            ),
        ),
        ToolDispatched(call_id=f"c2_{H}", tool=h("tool2")),
        ToolProcess(
            call_id=f"c2_{H}",
            process=ProcessStamp(host=h("host"), host_key="k", pgid=1, start_ticks=1),
        ),
        ToolResultEntry(
            call_id=f"c2_{H}", tool=h("tool2"), outcome=ToolOutcome.OK, output=h("output")
        ),
        ToolResultEntry(
            call_id=f"c3_{H}",
            tool=h("tool3"),
            outcome=ToolOutcome.ERROR,
            output=h("longoutput") * 20,
            is_error=True,
        ),
        ToolResultEntry(call_id=f"orphan_{H}", tool=h("orphan"), outcome=ToolOutcome.OK, output=H),
        ToolDeferred(call_id=f"call_{H}", tool=h("tool"), request=request),
        RunSuspended(reason=StopReason.ANSWERED, request_ids=(request.id,)),
        GrantWritten(grant=Grant(kind=GrantKind.ONE_SHOT, tool=h("granttool"), by=h("grantby"))),
        AnswerSupplied(decision=decision),
        RunResumed(owner=h("owner"), forced=True, taken_over_from=h("takenfrom")),
        AdvisoryEntry(text=h("advisory")),
    ]
    if status is not RunStatus.SUSPENDED and status is not RunStatus.RUNNING:
        entries.append(AssistantTurnEntry(iteration=1, turn=AssistantTurn(text=h("last"))))
        entries.append(
            RunEnded(
                result=TerminalResult(
                    status=status,
                    stop_reason=StopReason.ANSWERED,
                    text=h("answer"),
                    payload={H: H},
                    error=h("error"),
                )
            )
        )
    journal = [JournalRecord(run_id=run_id, seq=n, epoch=1, entry=e) for n, e in enumerate(entries)]
    record = RunRecord(
        id=run_id,
        session_id=session or h("session"),
        prompt=h("prompt"),
        requested_by=h("requester"),
        status=status,
        stop_reason=h("stopreason"),
        owner=h("replica"),
        epoch=3,
        lease_expires=T0 + timedelta(minutes=5),
        created_at=T0,
        updated_at=T0,
    )
    audit = [
        Audit(T0, h("actor"), h("action"), run_id, request.id, h("detail")),
        Audit(T0, h("actor2"), "deny", run_id, "", h("detail2")),
    ]
    view = RequestView(request, RequestStatus.OPEN, decision, (h("may1"), "group:" + H), h("why"))
    pending = PendingRequest(request, (h("may1"), "*"), note=h("note"))
    return Stored(record, journal, audit, [view]), pending


def origin(H: str) -> ArgumentOrigin:
    """Where an argument came from, every string of it ``H``."""
    return ArgumentOrigin(
        argument=f"arg:{H}",
        value=f"value:{H}",
        tool=f"from:{H}",
        call_id=f"call:{H}",
        line=3,
        excerpt=f"excerpt:{H}",
        instruction_like=True,
    )


def hostile_plan(run_id: str) -> PendingRequest:
    """An open plan whose every string (steps, reasons, origins) is ``H``."""
    steps = (
        PlanStep(
            tool=f"steptool:{H}",
            arguments={H: H},
            why=f"stepwhy:{H}",
            digest=f"stepdigest:{H}",
            call_id=f"stepcall:{H}",
            origins=(origin(H),),
        ),
        PlanStep(tool=f"free:{H}", arguments={"n": 1}, why=H, gated=False),
    )
    plan = Request(
        id=f"req_plan_{H}",
        run_id=run_id,
        kind=RequestKind.WAIT_PLAN,
        call_id=f"plan_{H}",
        tool=f"plantool:{H}",
        prompt=f"planprompt:{H}",
        digest=f"plandigest:{H}",
        steps=steps,
        requested_by=f"planby:{H}",
        created_at=T0,
    )
    return PendingRequest(plan, (f"planmay:{H}",), note=f"plannote:{H}")


RUN = f"run_{H}"
DONE = "run_done_plain"


@dataclass
class HostileSite:
    url: str
    config: WebConfig
    reader: HostileReader
    clock: list[float]

    def link(self, run_id: str) -> str:
        assert self.config.signer is not None
        return self.config.signer.link(PUBLIC_URL, run_id).removeprefix(PUBLIC_URL)


@pytest.fixture
async def hostile() -> AsyncIterator[HostileSite]:
    reader = HostileReader()
    stored, pending = hostile_run(RUN)
    reader.runs[RUN] = stored
    reader.open.append(pending)
    reader.open.append(hostile_plan(RUN))
    done, _ = hostile_run(DONE, status=RunStatus.COMPLETED)
    reader.runs[DONE] = done
    clock = [time.time()]
    config = WebConfig.from_settings(
        WebSettings(public_url=PUBLIC_URL),
        {"KESTREL_WEB_TOKEN": TOKEN, "KESTREL_WEB_SECRET": SECRET},
        clock=lambda: clock[0],
    )
    runner, url = await serve(web_routes(reader, config))
    yield HostileSite(url, config, reader, clock)
    await runner.cleanup()


BEARER = {"Authorization": f"Bearer {TOKEN}"}


def pages(site: HostileSite) -> list[str]:
    q = quote(RUN, safe="")
    return [
        f"/runs/{q}",
        f"/runs/{q}/fragment",
        f"/runs/{DONE}",
        "/runs",
        f"/runs?may_answer={quote(H[:190], safe='')}",
        "/pending",
    ]


# ------------------------------------------------------------------------------- markup


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def bad_markup(html: str) -> list[str]:
    """Tags, handlers and URLs in ``html`` that no escaped field could have produced."""
    parser = _Tags()
    parser.feed(html)
    found = []
    for tag, attrs in parser.tags:
        if tag in ("img", "svg", "iframe", "object", "embed", "textarea"):
            found.append(tag)
        if tag == "script" and dict(attrs).get("src") != "/static/live.js":
            found.append(f"script {attrs}")
        for name, value in attrs:
            if name.startswith("on"):
                found.append(f"{tag} {name}")
            if name in ("href", "src", "action") and not re.match(r"(https?:|/|#)", value or ""):
                found.append(f"{tag} {name}={value}")
            if name == "id" and value == "jsurl":
                found.append("jsurl")
    return found


def _noting(seen: list[str], attribute: str) -> Callable[[Any], None]:
    """A page event handler that notes one attribute of each event (a message's text)."""
    return lambda event: seen.append(str(getattr(event, attribute)))


async def test_every_field_is_escaped_in_the_html(hostile: HostileSite) -> None:
    async with aiohttp.ClientSession() as http:
        for path in pages(hostile):
            async with http.get(hostile.url + path, headers=BEARER) as response:
                assert response.status == 200, path
                html = await response.text()
            assert bad_markup(html) == [], path
            assert "<img" not in html and "<svg" not in html and "<script>" not in html, path


async def test_every_field_is_inert_in_chromium(hostile: HostileSite) -> None:
    async with browser_or_skip() as browser:
        context = await browser.new_context(extra_http_headers=BEARER)
        page = await context.new_page()
        violations: list[str] = []
        page.on("console", lambda m: violations.append(m.text))
        for path in pages(hostile):
            response = await page.goto(hostile.url + path)
            assert response is not None and response.status == 200, path
            found = await page.evaluate(
                """() => ({
                  pwned: window.__pwned,
                  img: document.querySelectorAll('img, svg, iframe, object, embed').length,
                  handlers: [...document.querySelectorAll('*')].filter(
                      e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
                  scripts: [...document.scripts].map(s => s.src),
                  js: [...document.querySelectorAll('[href],[src],[action]')]
                      .map(e => e.getAttribute('href') || e.getAttribute('src')
                                || e.getAttribute('action'))
                      .filter(u => !/^(https?:|\\/|#)/.test(u)),
                  jsurl: document.querySelectorAll('#jsurl').length,
                })"""
            )
            assert found["pwned"] is None, (path, found)
            assert found["img"] == 0 and found["handlers"] == 0 and found["jsurl"] == 0, path
            assert all(src.endswith("/static/live.js") for src in found["scripts"]), path
            assert found["js"] == [], (path, found["js"])
        # The raw text shows as text: the model text appears verbatim.
        await page.goto(hostile.url + f"/runs/{quote(RUN, safe='')}")
        text = await page.locator("body").inner_text()
        assert f"modeltext:{H}" in text
        assert f"offplan:{H}"[:30].capitalize() in text and f"excerpt:{H}" in text
        # A plan's steps, their reasons and origins show as text too.
        await page.goto(hostile.url + "/pending")
        text = await page.locator("body").inner_text()
        for shown in (f"steptool:{H}", f"stepwhy:{H}", f"value:{H}", f"plannote:{H}"):
            assert shown in text, shown
        await context.close()


# ------------------------------------------------------------------------------- the thread link


@pytest.mark.parametrize(
    "session",
    [
        "slack:javascript:alert(1)//:1.2",
        "slack:T1:C2:1.2\njavascript:alert(1)",
        "discord:1:2/../../evil.example",
        "discord:1:2@evil.example",
        "slack:T1:C2:1.2#@evil.example",
        "slack:T1:C2:\uff11.\uff12",  # full-width digits
        "discord:\uff11\uff12:\uff13",
    ],
)
def test_the_thread_link_is_only_ever_a_fixed_https_host(session: str) -> None:
    stored, _ = hostile_run("run_x", status=RunStatus.COMPLETED, session=session)
    view = RunView(stored.record, fold(stored.journal, "run_x"))
    page = build_run_page(view, stored.journal, stored.audit, stored.requests)
    if page.thread.url is not None:
        assert re.fullmatch(
            r"https://(app\.slack\.com/client/[A-Z0-9]+/[A-Z0-9]+/thread/[A-Z0-9]+-[0-9.]+"
            r"|discord\.com/channels/[0-9]+/[0-9]+)",
            page.thread.url,
        ), page.thread.url
    html = render_run_page(page, now=T0)
    hrefs = re.findall(r'href="([^"]*)"', html)
    assert all(h.startswith(("https://", "/", "#")) for h in hrefs), hrefs


# ------------------------------------------------------------------------------- the export


async def test_the_export_has_no_script_no_external_reference_and_its_style_applies(
    hostile: HostileSite, tmp_path: Path
) -> None:
    for run_id in (RUN, DONE):
        inspected = await hostile.reader.inspect(run_id)
        page = build_run_page(
            inspected.view, inspected.journal, inspected.audit, inspected.requests
        )
        html = render_run_page(page, now=T0, standalone=True)
        lowered = html.lower()
        assert "<script" not in lowered and "<link" not in lowered and "@import" not in lowered
        assert "url(" not in re.search(r"<style>(.*?)</style>", html, re.S).group(1)  # type: ignore[union-attr]
        refs = re.findall(r'(?<![\w-])(?:src|href|action)\s*=\s*"([^"]*)"', html)
        assert all(ref.startswith("#") for ref in refs), refs
        path = tmp_path / f"{abs(hash(run_id))}.html"
        path.write_text(html, encoding="utf-8")

        async with browser_or_skip() as browser:
            context = await browser.new_context(offline=True)
            tab = await context.new_page()
            console: list[str] = []
            requests: list[str] = []
            tab.on("console", _noting(console, "text"))
            tab.on("request", _noting(requests, "url"))
            await tab.goto(path.as_uri())
            # The inlined style applies (body margin 0, the monospace font on pre).
            margin = await tab.evaluate("getComputedStyle(document.body).margin")
            pre_font = await tab.evaluate(
                "getComputedStyle(document.querySelector('pre')).fontFamily"
            )
            assert margin == "0px", margin
            assert "monospace" in pre_font, pre_font
            assert not [line for line in console if "Content Security Policy" in line], console
            assert requests == [path.as_uri()], requests
            assert await tab.evaluate("window.__pwned") is None
            assert await tab.locator("img, svg, script").count() == 0
            await context.close()


def test_the_export_csp_hash_matches_the_inlined_style_bytes() -> None:
    stored, _ = hostile_run("run_x", status=RunStatus.COMPLETED)
    view = RunView(stored.record, fold(stored.journal, "run_x"))
    page = build_run_page(view, stored.journal, stored.audit, stored.requests)
    html = render_run_page(page, now=T0, standalone=True)
    style = re.search(r"<style>(.*?)</style>", html, re.S)
    assert style is not None
    digest = base64.b64encode(hashlib.sha256(style.group(1).encode()).digest()).decode()
    assert f"sha256-{digest}" in html


# ------------------------------------------------------------------------------- headers on errors

SECURITY = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


async def test_refusals_and_errors_carry_no_store_and_show_no_internals(
    hostile: HostileSite,
) -> None:
    q = quote(RUN, safe="")
    cases = [
        ("GET", "/runs", {}, 401),
        ("GET", f"/runs/{q}?exp=1&sig={'0' * 64}", {}, 403),
        ("GET", "/runs/run_nope", BEARER, 404),
        ("GET", "/runs?status=<x>", BEARER, 400),
        ("GET", "/runs?limit=1e9", BEARER, 400),
        ("GET", "/runs?limit=" + "9" * 5000, BEARER, 400),
        # Digits to str.isdigit, not to int(): superscripts, circled digits.
        ("GET", f"/runs/{DONE}?before=%C2%B2", BEARER, 400),
        ("GET", f"/runs/{DONE}?before=%E2%91%A0", BEARER, 400),
    ]
    async with aiohttp.ClientSession() as http:
        for method, path, headers, expected in cases:
            async with http.request(method, hostile.url + path, headers=headers) as response:
                body = await response.text()
                assert response.status == expected, (path, response.status, body[:200])
                for name, value in SECURITY.items():
                    assert response.headers.get(name) == value, (path, name)
                assert "Traceback" not in body and "/work/" not in body and "<x>" not in body


async def test_a_500_shows_nothing(hostile: HostileSite) -> None:
    async def broken(_run_id: str) -> RunInspection:
        raise RuntimeError("secret detail /etc/kestrel/db password=hunter2")

    hostile.reader.inspect = broken  # type: ignore[method-assign, assignment]
    url = hostile.url + f"/runs/{DONE}"
    async with aiohttp.ClientSession() as http, http.get(url, headers=BEARER) as response:
        body = await response.text()
        assert response.status == 500
        assert "hunter2" not in body and "Traceback" not in body
        assert response.headers.get("Cache-Control") == "no-store"


async def test_routes_the_app_does_not_handle_still_carry_the_security_headers(
    hostile: HostileSite,
) -> None:
    """aiohttp's own 404/405 (an unmatched path under /runs, a POST) bypass ``_guarded``."""
    cases = [
        ("POST", f"/runs/{DONE}", BEARER),
        ("POST", "/runs", {}),
        ("GET", f"/runs/{DONE}/fragment/x", BEARER),
        ("GET", f"/runs/{DONE}/", BEARER),
        ("GET", "/static/../adapters/web/app.py", {}),
    ]
    missing = []
    async with aiohttp.ClientSession() as http:
        for method, path, headers in cases:
            async with http.request(method, hostile.url + path, headers=headers) as response:
                await response.read()
                assert response.status in (404, 405), (method, path, response.status)
                if response.headers.get("Cache-Control") != "no-store" or (
                    "Content-Security-Policy" not in response.headers
                ):
                    missing.append(f"{method} {path} -> {response.status}")
    assert missing == [], missing


# ------------------------------------------------------------------------------- text direction

# Direction overrides and isolates: each makes a browser show what follows in another order
# than it is written ("\u202ebd-stnemyap" reads as "payments-db", "\u202egnp.exe" as "exe.png").
REORDERING = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
FLIPPED = "\u202ebd-stnemyap\u202c \u2067gnp.exe\u2069 " + REORDERING


async def test_no_field_can_reorder_what_a_page_shows() -> None:
    run_id = "run_flip" + FLIPPED
    reader = HostileReader()
    stored, pending = hostile_run(run_id, payload=FLIPPED)
    reader.runs[run_id] = stored
    reader.open.append(pending)
    done, _ = hostile_run(DONE, status=RunStatus.COMPLETED, payload=FLIPPED)
    reader.runs[DONE] = done
    config = WebConfig.from_settings(WebSettings(), {"KESTREL_WEB_TOKEN": TOKEN})
    runner, url = await serve(web_routes(reader, config))
    q = quote(run_id, safe="")
    try:
        async with aiohttp.ClientSession() as http:
            for path in (f"/runs/{q}", f"/runs/{q}/fragment", f"/runs/{DONE}", "/runs", "/pending"):
                async with http.get(url + path, headers=BEARER) as response:
                    assert response.status == 200, path
                    html = await response.text()
                assert not set(REORDERING) & set(html), path
                # Each is shown, by its code point, where it was.
                assert "[U+202E]bd-stnemyap[U+202C]" in html, path
    finally:
        await runner.cleanup()
    inspected = await reader.inspect(DONE)
    page = build_run_page(inspected.view, inspected.journal, inspected.audit, inspected.requests)
    exported = render_run_page(page, now=T0, standalone=True)
    assert not set(REORDERING) & set(exported)
    assert "[U+2067]gnp.exe[U+2069]" in exported


# A zero-width space and a tag character in a call's arguments: the page would read
# "rm -rf /tmp/x" for a value that is not that.
HIDDEN = "rm -rf /tmp/x\u200b\U000e0041"


async def test_invisible_characters_in_arguments_are_named_on_the_pages() -> None:
    run_id = "run_hidden"
    reader = HostileReader()
    stored, pending = hostile_run(run_id, payload=HIDDEN)
    reader.runs[run_id] = stored
    reader.open.append(pending)
    config = WebConfig.from_settings(WebSettings(), {"KESTREL_WEB_TOKEN": TOKEN})
    runner, url = await serve(web_routes(reader, config))
    try:
        async with aiohttp.ClientSession() as http:
            for path, shown in (
                (f"/runs/{run_id}", '{"rm -rf /tmp/x[U+200B][U+E0041]": 1}'),
                (f"/runs/{run_id}", "detail:rm -rf /tmp/x[U+200B][U+E0041]"),  # audited
                ("/pending", '"rm -rf /tmp/x[U+200B][U+E0041]": "rm -rf /tmp/x[U+200B][U+E0041]"'),
            ):
                async with http.get(url + path, headers=BEARER) as response:
                    assert response.status == 200, path
                    html = await response.text()
                assert shown.replace('"', "&#34;") in html, path
    finally:
        await runner.cleanup()


async def test_invisible_characters_in_a_questions_options_are_named_on_the_run_page() -> None:
    run_id = "run_hidden_options"
    reader = HostileReader()
    stored, _pending = hostile_run(run_id, payload=HIDDEN)
    reader.runs[run_id] = stored
    config = WebConfig.from_settings(WebSettings(), {"KESTREL_WEB_TOKEN": TOKEN})
    runner, url = await serve(web_routes(reader, config))
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{url}/runs/{run_id}", headers=BEARER) as response,
        ):
            assert response.status == 200
            html = await response.text()
        assert "<li>opt1:rm -rf /tmp/x[U+200B][U+E0041]</li>" in html
        assert "\u200b" not in html.split('class="options"')[1].split("</ul>")[0]
    finally:
        await runner.cleanup()
