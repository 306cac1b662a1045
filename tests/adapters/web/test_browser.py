"""The run pages in a real headless Chromium (Playwright): what a person sees, and who may.

The browser is found as ``tests.fakes.browser`` says (``KESTREL_CHROMIUM``, else ``chromium``
on ``PATH``); without one every test here skips, saying so. One browser serves the module;
each test gets its own store, server and browser contexts.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
from aiohttp import web
from pydantic import BaseModel

from adapters.web.app import web_routes
from adapters.web.auth import WebConfig
from adapters.web.render import SUSPENDED_POLL_MS
from bot.chat.handles import RunHandle
from bot.chat.links import LinkSigner
from bot.chat.service import ChatService
from bot.domain import DecisionKind, RunStatus, Session
from bot.people.policy import Actor, Policy, PolicyRules
from bot.prompter import DeferringPrompter
from bot.run.supervisor import Supervisor
from bot.tools.base import Tool
from bot.tools.python import function_tool
from tests.fakes.browser import browser_or_skip
from tests.fakes.runtime import make_runtime
from tests.fakes.waiting import until

async_api = pytest.importorskip(
    "playwright.async_api", reason="playwright is not installed: pip install -e '.[dev]'"
)
expect = async_api.expect

if TYPE_CHECKING:
    from playwright.async_api import Browser, ConsoleMessage, Page, Response

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "operator-token-0123456789"
SECRET = "link-secret-0123456789abcdef"
TTL = 3600.0
REQUESTER = Actor("U0REQ")
APPROVER = Actor("U0BOSS")
# The README's screenshot is written again only when asked (KESTREL_UPDATE_SCREENSHOT=1), so
# that a test run leaves the clone as it was.
SCREENSHOT = Path(__file__).resolve().parents[3] / "docs" / "screenshots" / "run-page.png"
PNG = b"\x89PNG\r\n\x1a\n"

HOSTILE = (
    "<script>window.__pwned=1</script>"
    '<img src=x onerror="window.__pwned=2">'
    "</pre><script>window.__pwned=3</script>"
)
STATUS = (
    "checkout.service - Checkout API\n"
    "   Active: failed (Result: oom-kill) since 09:41:07 UTC; 2 min ago\n"
    "   OOM-killed 3 times in 10 min; memory 2.0G of 2.0G limit"
)
LOGS = (
    "09:40:58 checkout[8812]: GC overhead limit exceeded (heap 1.9G)\n"
    "09:41:02 checkout[8812]: paging on-call: <EMAIL_ADDRESS>\n"
    "09:41:07 systemd[1]: checkout.service: A process of this unit has been killed"
    " by the OOM killer."
)
RESTARTED = "restarted checkout.service: active (running) since 09:43:30 UTC"
ANSWER = "Restarted checkout.service; it is up again and serving. Memory is at 0.6G of 2.0G."
WATCHED = "Checkout stayed up while I watched."
REASON = "go ahead, it is down anyway"

POLICY = PolicyRules(
    requesters=[REQUESTER.user],
    approvers={"restart_service": [APPROVER.user, "group:S0SRE"]},
)

# Position 0 by the prompt, 1 and 2 by the tools' outputs.
SCRIPT: list[dict[str, Any]] = [
    {
        "one_of": [
            {
                "match": "^checkout",
                "text": "Looking at checkout's unit and its last log lines.",
                "calls": [
                    {"name": "service_status", "arguments": {"service": "checkout"}},
                    {"name": "tail_logs", "arguments": {"service": "checkout", "lines": 3}},
                ],
            },
            {
                "match": "^echo",
                "text": "Echoing it.",
                "calls": [{"name": "echo", "arguments": {"text": HOSTILE}}],
            },
            {
                "match": "^watch",
                "text": "Watching checkout.",
                "calls": [{"name": "hold", "arguments": {"text": HOSTILE}}],
            },
        ]
    },
    {
        "one_of": [
            {
                "match": "OOM",
                "text": "Checkout is OOM-killed in a loop; a restart should bring it back.",
                "calls": [{"name": "restart_service", "arguments": {"service": "checkout"}}],
            },
            {"match": "^held", "text": WATCHED},
            {"text": "Done."},
        ]
    },
    {"one_of": [{"match": "^restarted", "text": ANSWER}, {"text": "Left checkout as it is."}]},
]


class ServiceArgs(BaseModel):
    service: str


class LogArgs(BaseModel):
    service: str
    lines: int = 20


class TextArgs(BaseModel):
    text: str


def ops_tools(entered: asyncio.Event, gate: asyncio.Event) -> list[Tool]:
    """service_status, tail_logs, restart_service (gated), echo, and hold (waits for ``gate``)."""

    @function_tool(name="service_status")
    async def service_status(args: ServiceArgs) -> str:
        """The unit's state."""
        return STATUS

    @function_tool(name="tail_logs")
    async def tail_logs(args: LogArgs) -> str:
        """The unit's last log lines."""
        return LOGS

    @function_tool(name="restart_service", confirm=True, idempotent=False)
    async def restart_service(args: ServiceArgs) -> str:
        """Restart the unit (an approver must approve)."""
        return RESTARTED

    @function_tool(name="echo")
    async def echo(args: TextArgs) -> str:
        """Return the text."""
        return args.text

    @function_tool(name="hold")
    async def hold(args: TextArgs) -> str:
        """Wait until the test lets go."""
        entered.set()
        await gate.wait()
        return f"held {args.text}"

    return [service_status, tail_logs, restart_service, echo, hold]


@dataclass
class World:
    """A store with the ops tools, and the pages served on localhost: the operators' token,
    and signed links whose public URL is this server."""

    url: str
    chat: ChatService
    config: WebConfig
    entered: asyncio.Event  # the hold tool started
    gate: asyncio.Event  # lets the hold tool finish
    threads: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def link(self, run_id: str, issued: float | None = None) -> str:
        """The "View run" link a chat message would carry."""
        assert self.config.signer is not None and self.config.public_url == self.url
        return self.config.signer.link(self.url, run_id, issued)

    async def start(self, text: str) -> RunHandle:
        """A run of ``text`` in a Slack thread of its own; approvals wait for a person."""
        ts = f"17000000{next(self.threads):02d}.000100"
        session = Session(
            id=f"slack:T0001:C0OPS:{ts}", platform="slack", channel="C0OPS", thread=ts
        )
        return await self.chat.submit_turn(
            text, user=REQUESTER, session=session, prompter=DeferringPrompter()
        )

    async def waiting(self) -> tuple[str, str]:
        """A run suspended on the approval of restart_service: (run id, request id)."""
        live = await self.start("checkout is down again")
        state = await self.chat.wait(live)
        (request,) = state.open_requests
        return live.run_id, request.id

    async def approve(self, run_id: str, request_id: str) -> None:
        """The approver approves; the run resumes and ends."""
        decided = await self.chat.decide(
            run_id, request_id, DecisionKind.APPROVE, user=APPROVER, text=REASON
        )
        assert decided.accepted and decided.resumed is not None, decided
        await self.chat.wait(decided.resumed)

    async def finished(self) -> str:
        """A completed run: two calls, an approved restart, the answer."""
        run_id, request_id = await self.waiting()
        await self.approve(run_id, request_id)
        assert (await self.chat.status(run_id)).record.status is RunStatus.COMPLETED
        return run_id

    async def echoed(self) -> str:
        """A completed run whose one tool output is ``HOSTILE``."""
        live = await self.start("echo this")
        await self.chat.wait(live)
        return live.run_id


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def chromium() -> AsyncIterator[Browser]:
    async with browser_or_skip() as launched:
        yield launched


@pytest_asyncio.fixture(loop_scope="module")
async def world(tmp_path: Path, chromium: Browser) -> AsyncIterator[World]:
    entered, gate = asyncio.Event(), asyncio.Event()
    rt, _ = await make_runtime(tmp_path / "k.db", SCRIPT, ops_tools(entered, gate))
    rt.policy = Policy(POLICY)
    chat = ChatService(Supervisor(rt))
    # The port is known before the app is built: the links' public URL is this server.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    config = WebConfig(token=TOKEN, signer=LinkSigner(SECRET, TTL), public_url=url)
    runner = web.AppRunner(web_routes(chat, config), access_log=None)
    await runner.setup()
    await web.SockSite(runner, listener).start()
    yield World(url, chat, config, entered, gate)
    gate.set()
    await runner.cleanup()
    await rt.store.close()


NewPage = Callable[..., Awaitable["Page"]]


@pytest_asyncio.fixture(loop_scope="module")
async def new_page(chromium: Browser) -> AsyncIterator[NewPage]:
    """Pages in fresh browser contexts: with the operators' bearer token (``token``; None for
    none) and a viewport; every context is closed after the test."""
    contexts = []

    async def make(
        *,
        token: str | None = TOKEN,
        login: tuple[str, str] | None = None,
        width: int = 1200,
        height: int = 900,
    ) -> Page:
        headers = {"Authorization": f"Bearer {token}"} if token and not login else {}
        # ``login``: what a person types when the browser asks (user name, password).
        credentials = {"username": login[0], "password": login[1]} if login else None
        context = await chromium.new_context(
            extra_http_headers=headers,
            http_credentials=credentials,  # type: ignore[arg-type]
            viewport={"width": width, "height": height},
        )
        contexts.append(context)
        return await context.new_page()

    yield make
    for context in contexts:
        await context.close()


@dataclass
class Watch:
    """What a page did besides rendering: errors, console lines, CSP violations, navigations
    of its main frame, and the statuses of its live updates."""

    errors: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    navigations: list[str] = field(default_factory=list)
    fragments: list[int] = field(default_factory=list)

    def _console(self, message: ConsoleMessage) -> None:
        self.console.append(f"{message.type}: {message.text}")

    @classmethod
    async def on(cls, page: Page) -> Watch:
        watch = cls()
        page.on("pageerror", lambda error: watch.errors.append(str(error)))
        page.on("console", watch._console)
        page.on(
            "framenavigated",
            lambda frame: watch.navigations.append(frame.url) if frame == page.main_frame else None,
        )
        page.on(
            "response", lambda r: watch.fragments.append(r.status) if "/fragment" in r.url else None
        )
        # Injected by the browser itself, not by the page: the CSP does not apply to it.
        await page.add_init_script(
            "window.__violations = [];"
            " document.addEventListener('securitypolicyviolation',"
            " e => window.__violations.push(e.violatedDirective));"
        )
        return watch


async def goto(page: Page, url: str) -> Response:
    response = await page.goto(url)
    assert response is not None
    return response


def is_fragment(response: Response) -> bool:
    return "/fragment" in response.url


async def nothing_ran(page: Page) -> None:
    """No script of the page's data ran, and none of its markup became elements."""
    assert await page.evaluate("typeof window.__pwned") == "undefined"
    assert await page.evaluate("document.querySelectorAll('#run script, #run img').length") == 0
    assert await page.evaluate("window.__violations") == []


# --------------------------------------------------------------------------- what it shows


async def test_a_finished_runs_timeline_shows_the_calls_in_order_with_their_outputs(
    world: World, new_page: NewPage
) -> None:
    run_id = await world.finished()
    page = await new_page()
    watch = await Watch.on(page)
    response = await goto(page, f"{world.url}/runs/{run_id}")
    assert response.status == 200

    await expect(page.locator("#status")).to_have_text("completed")
    calls = page.locator("li.call")
    assert await calls.locator(".tool").all_inner_texts() == [
        "service_status",
        "tail_logs",
        "restart_service",
    ]
    assert await calls.locator(".exit").all_inner_texts() == ["ok", "ok", "ok"]
    outputs = calls.locator("pre.output")
    assert await outputs.all_inner_texts() == [STATUS, LOGS, RESTARTED]
    for n in range(3):
        await expect(outputs.nth(n)).to_be_visible()
    # The items in journal order: the turns, the request and its decision, the answer.
    kinds = await page.locator("#timeline > li.item").evaluate_all(
        "items => items.map(item => item.classList[1])"
    )
    assert kinds[:4] == ["started", "user", "turn", "turn"] and kinds[-2:] == ["turn", "ended"]
    assert kinds.index("request") < kinds.index("resumed") < len(kinds) - 2
    decision = page.locator("p.decision")
    await expect(decision).to_have_attribute("data-decision", "approve")
    await expect(decision).to_contain_text(f"by {APPROVER.user}")
    await expect(decision.locator("q.reason")).to_have_text(REASON)
    redacted = page.locator("pre.output .redacted")
    await expect(redacted).to_have_text("<EMAIL_ADDRESS>")
    await expect(redacted).to_have_attribute("title", "redacted by the PII guard")
    await expect(page.locator("#result-text")).to_have_text(ANSWER)
    # A finished run does not poll, and the operator sees the navigation.
    assert await page.evaluate("document.scripts.length") == 0
    await expect(page.locator("nav a")).to_have_text(["Runs", "Pending"])
    assert watch.errors == [] and watch.console == []


async def test_a_tool_output_carrying_a_script_renders_as_text_and_no_script_runs(
    world: World, new_page: NewPage
) -> None:
    run_id = await world.echoed()
    page = await new_page()
    watch = await Watch.on(page)
    assert (await goto(page, f"{world.url}/runs/{run_id}")).status == 200

    assert await page.locator("li.call pre.output").inner_text() == HOSTILE
    arguments = await page.locator("li.call pre.arguments").inner_text()
    assert "<script>window.__pwned=1</script>" in arguments and "onerror=" in arguments
    await nothing_ran(page)
    assert watch.errors == [] and watch.console == []

    # And were markup to get through, the Content-Security-Policy would not run it: an inline
    # script and an inline handler put on the page are refused, and reported.
    blocked = await page.evaluate(
        """() => new Promise(resolve => {
          const seen = [];
          document.addEventListener('securitypolicyviolation', e => {
            seen.push(e.violatedDirective);
            if (seen.length === 2) resolve(seen);
          });
          const script = document.createElement('script');
          script.textContent = 'window.__pwned = 4';
          document.body.append(script);
          const image = '<img src="/x" onerror="window.__pwned=5">';
          document.body.insertAdjacentHTML('beforeend', image);
          setTimeout(() => resolve(seen), 3000);
        })"""
    )
    assert sorted(blocked) == ["script-src-attr", "script-src-elem"], blocked
    assert await page.evaluate("typeof window.__pwned") == "undefined"
    assert any("Content Security Policy" in line for line in watch.console), watch.console
    assert watch.errors == []


async def test_a_live_runs_page_updates_when_the_run_moves_on(
    world: World, new_page: NewPage
) -> None:
    live = await world.start("watch checkout for a minute")
    await asyncio.wait_for(world.entered.wait(), 10)
    page = await new_page()
    watch = await Watch.on(page)
    assert (await goto(page, f"{world.url}/runs/{live.run_id}")).status == 200

    run = page.locator("#run")
    await expect(run).to_have_attribute("data-status", "running")
    await expect(run).to_have_attribute("data-interval", "2000")
    await expect(page.locator("li.call .tool")).to_have_text(["hold"])
    assert await page.locator("li.call pre.output").count() == 0
    await page.evaluate("window.__sameDocument = true")

    world.gate.set()
    await world.chat.wait(live)
    # live.js fetches the fragment (every 2 s while running) and swaps it in: no reload.
    await expect(run).to_have_attribute("data-status", "completed", timeout=10_000)
    await expect(page.locator("#status")).to_have_text("completed")
    assert await page.locator("li.call pre.output").all_inner_texts() == [f"held {HOSTILE}"]
    await expect(page.locator("#result-text")).to_have_text(WATCHED)
    assert await run.get_attribute("data-live-url") is None  # polling has stopped
    assert await page.evaluate("window.__sameDocument") is True
    assert watch.navigations == [f"{world.url}/runs/{live.run_id}"]
    assert 200 in watch.fragments and set(watch.fragments) <= {200, 204}
    await nothing_ran(page)  # the hostile output came in through the live update
    assert watch.errors == [] and watch.console == []


async def test_a_waiting_run_opened_by_its_link_shows_the_decision_when_it_is_made(
    world: World, new_page: NewPage
) -> None:
    run_id, request_id = await world.waiting()
    page = await new_page(token=None)
    watch = await Watch.on(page)
    await page.clock.install()  # the 10 s polls of a suspended run, fast-forwarded
    assert (await goto(page, world.link(run_id))).status == 200

    run = page.locator("#run")
    await expect(run).to_have_attribute("data-status", "suspended")
    await expect(page.locator(".req-status")).to_have_text("open")
    async with page.expect_response(is_fragment) as unchanged:
        await page.clock.fast_forward(SUSPENDED_POLL_MS)
    assert (await unchanged.value).status == 204  # nothing changed: the page stays
    await expect(run).to_have_attribute("data-status", "suspended")

    await world.approve(run_id, request_id)
    async with page.expect_response(is_fragment) as changed:
        await page.clock.fast_forward(SUSPENDED_POLL_MS)
    # The update carries the link's signature: the fragment answers the link holder.
    assert (await changed.value).status == 200
    assert "sig=" in (await changed.value).url
    await expect(run).to_have_attribute("data-status", "completed")
    await expect(page.locator(".req-status")).to_have_text("answered")
    await expect(page.locator("p.decision")).to_contain_text(f"approve by {APPROVER.user}")
    await expect(page.locator("li.call .tool")).to_have_text(
        ["service_status", "tail_logs", "restart_service"]
    )
    await expect(page.locator("#result-text")).to_have_text(ANSWER)
    assert len(watch.navigations) == 1
    assert watch.errors == [] and watch.console == []


# --------------------------------------------------------------------------- who may see it


async def test_a_signed_link_opens_its_run_and_no_other(world: World, new_page: NewPage) -> None:
    run_id, other = await world.finished(), await world.echoed()
    page = await new_page(token=None)
    link = world.link(run_id)
    assert link.startswith(f"{world.url}/runs/{run_id}?exp=")

    response = await goto(page, link)
    assert response.status == 200
    await expect(page.locator("h1")).to_have_text(f"Run {run_id}")
    await expect(page.locator("li.call .tool")).to_have_count(3)
    await expect(page.locator("nav")).to_have_count(0)  # no way to the other pages
    query = link.partition("?")[2]
    assert (await goto(page, f"{world.url}/runs/{run_id}/fragment?{query}")).status == 200

    for path in (f"/runs/{other}", f"/runs/{other}/fragment", "/runs", "/pending"):
        response = await goto(page, f"{world.url}{path}?{query}")
        assert response.status == 403, path
        text = await page.locator("body").inner_text()
        assert "not valid" in text and other not in text and "Echoing" not in text, path


async def test_forged_altered_and_expired_links_get_403(world: World, new_page: NewPage) -> None:
    run_id = await world.finished()
    link = world.link(run_id)
    path, _, query = link.partition("?")
    params = dict(part.split("=", 1) for part in query.split("&"))
    exp, sig = params["exp"], params["sig"]
    flipped = ("0" if sig[0] != "0" else "1") + sig[1:]
    issued = time.time() - TTL - 60
    expired = world.link(run_id, issued=issued)
    expired_exp = expired.partition("?exp=")[2].partition("&")[0]
    expired_sig = expired.partition("&sig=")[2]
    # Rightly signed, and refused only for its age: valid when it was issued.
    assert LinkSigner(SECRET, TTL, clock=lambda: issued).valid(run_id, expired_exp, expired_sig)
    bad = {
        "forged": LinkSigner("not-the-server-secret-0123", TTL).link(world.url, run_id),
        "signature altered": f"{path}?exp={exp}&sig={flipped}",
        "expiry altered": f"{path}?exp={int(exp) + 1}&sig={sig}",
        "expiry extended": f"{path}?exp={int(exp) + 10 * int(TTL)}&sig={sig}",
        "signature missing": f"{path}?exp={exp}",
        "expiry missing": f"{path}?sig={sig}",
        "expired": expired,
    }
    page = await new_page(token=None)
    assert (await goto(page, link)).status == 200
    for what, url in bad.items():
        response = await goto(page, url)
        assert response.status == 403, what
        text = await page.locator("body").inner_text()
        assert "not valid" in text and "checkout" not in text, what


async def test_no_page_answers_without_authorization(world: World, new_page: NewPage) -> None:
    run_id, request_id = await world.waiting()
    paths = [
        "/runs",
        "/runs?status=suspended",
        f"/runs/{run_id}",
        f"/runs/{run_id}/fragment",
        "/pending",
        "/runs/run_nope",
    ]
    # Anonymous, a browser is asked for a login; its person types a wrong one.
    anonymous, wrong, operator = (
        await new_page(login=("anyone", "not-the-token-0123456789")),
        await new_page(token="not-the-token-0123456789"),
        await new_page(),
    )
    for path in paths:
        for page in (anonymous, wrong):
            response = await goto(page, world.url + path)
            assert response.status == 401, path
            assert (await response.header_value("www-authenticate") or "").startswith("Bearer")
            text = await page.locator("body").inner_text()
            assert run_id not in text and request_id not in text and "checkout" not in text, path
        expected = 404 if path.endswith("run_nope") else 200
        assert (await goto(operator, world.url + path)).status == expected, path
    # The stylesheet, the live-update script and the icon are the only things served to anyone.
    for name in ("style.css", "live.js", "favicon.svg"):
        assert (await goto(anonymous, f"{world.url}/static/{name}")).status == 200
    assert (await goto(anonymous, f"{world.url}/favicon.ico")).status == 200


async def test_a_person_who_logs_in_with_the_token_sees_every_page_live(
    world: World, new_page: NewPage
) -> None:
    # A browser sends no bearer token: it asks its person, who types the token as the password.
    run_id, _request_id = await world.waiting()
    page = await new_page(login=("alice", TOKEN))
    watch = await Watch.on(page)
    for path in ("/runs", "/pending", f"/runs/{run_id}"):
        assert (await goto(page, world.url + path)).status == 200, path
        assert run_id in await page.locator("body").inner_text(), path
    # The open run's page polls for its live updates with the same login.
    await expect(page.locator("body")).to_contain_text("checkout")
    async with page.expect_response(is_fragment) as fragment:
        pass
    assert (await fragment.value).status in (200, 204)  # changed, or nothing new: let in
    assert watch.errors == []


async def test_every_page_gets_its_icon_and_no_request_fails(
    world: World, new_page: NewPage
) -> None:
    run_id, _request_id = await world.waiting()
    page = await new_page()
    watch = await Watch.on(page)
    for path in ("/runs", f"/runs/{run_id}", "/pending"):
        async with page.expect_response(lambda r: r.url.endswith("/favicon.svg")) as icon:
            assert (await goto(page, world.url + path)).status == 200, path
        assert (await icon.value).status == 200, path
    assert watch.errors == [] and watch.console == []


# --------------------------------------------------------------------------- how it looks


async def test_the_run_page_screenshot_and_a_phone_sized_render(
    world: World, new_page: NewPage, tmp_path: Path
) -> None:
    run_id = await world.finished()
    desktop = await new_page(width=1200, height=900)
    assert (await goto(desktop, f"{world.url}/runs/{run_id}")).status == 200
    await expect(desktop.locator("pre.output .redacted")).to_be_visible()
    await expect(desktop.locator("p.decision")).to_be_visible()
    shot = SCREENSHOT if os.environ.get("KESTREL_UPDATE_SCREENSHOT") else tmp_path / "run.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    await desktop.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == PNG

    phone = await new_page(width=390, height=844)
    assert (await goto(phone, f"{world.url}/runs/{run_id}")).status == 200
    overflow = await phone.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert overflow[0] <= overflow[1] + 1, f"scrollWidth {overflow[0]} > {overflow[1]} px"


# --------------------------------------------------------------------------- what other sites get


@dataclass
class OtherSite:
    """Another site's pages (no policy of ours: their scripts run), on a host name other than
    the run pages' (``localhost`` against ``127.0.0.1``: another site, to a browser)."""

    url: str
    pages: dict[str, str] = field(default_factory=dict)

    def page(self, name: str, html: str) -> str:
        """Serve ``html`` as the page ``name``; its address."""
        self.pages[name] = html
        return f"{self.url}/{name}"


@pytest_asyncio.fixture(loop_scope="module")
async def other_site() -> AsyncIterator[OtherSite]:
    pages: dict[str, str] = {}

    async def serve(request: web.Request) -> web.Response:
        html = pages.get(request.match_info["name"])
        if html is None:
            return web.Response(status=404)
        return web.Response(text=html, content_type="text/html")

    app = web.Application()
    app.router.add_get("/{name}", serve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield OtherSite(f"http://localhost:{runner.addresses[0][1]}", pages)
    await runner.cleanup()


def answers_of(page: Page, url: str) -> list[Response]:
    """The responses ``page`` (and its frames) got from ``url``'s server, as they come."""
    seen: list[Response] = []
    page.on("response", lambda r: seen.append(r) if r.url.startswith(url) else None)
    return seen


async def secured(responses: list[Response]) -> None:
    """Every response carries the headers that keep it from other sites and caches."""
    assert responses
    for response in responses:
        headers = await response.all_headers()
        assert headers.get("cache-control") == "no-store", response.url
        assert headers.get("x-content-type-options") == "nosniff", response.url
        assert headers.get("referrer-policy") == "no-referrer", response.url
        assert headers.get("x-frame-options") == "DENY", response.url
        assert "frame-ancestors 'none'" in headers.get("content-security-policy", "")
        assert headers.get("cross-origin-resource-policy") == "same-origin", response.url
        assert headers.get("cross-origin-opener-policy") == "same-origin", response.url


async def test_another_site_gets_nothing_through_a_logged_in_browser(
    world: World, new_page: NewPage, other_site: OtherSite
) -> None:
    run_id = await world.finished()
    page = await new_page(login=("alice", TOKEN))
    assert (await goto(page, f"{world.url}/runs")).status == 200  # the person is logged in
    answers = answers_of(page, world.url)
    # The other site frames a run, fetches it with the browser's login, and embeds the icon.
    url = other_site.page(
        "grab",
        f"""<!doctype html><title>grab</title>
        <iframe id="frame" src="{world.url}/runs/{run_id}"></iframe>
        <img id="icon" src="{world.url}/static/favicon.svg"
          onload="window.icon = 'loaded'" onerror="window.icon = 'blocked'">
        <script>
        fetch("{world.url}/runs/{run_id}", {{mode: "no-cors", credentials: "include"}})
          .then(r => window.fetched = r.type, e => window.fetched = "failed");
        </script>""",
    )
    await goto(page, url)
    await page.wait_for_function("window.icon && window.fetched")
    # Cross-Origin-Resource-Policy: the icon and the fetched page never reach the other site.
    assert await page.evaluate("[window.icon, window.fetched]") == ["blocked", "failed"]
    # The framed run is refused outright, the login notwithstanding: 403, not the run.
    framed = f"{world.url}/runs/{run_id}"
    await until_answered(answers, framed)
    run_answers = [r for r in answers if r.url == framed]
    assert [(r.request.resource_type, r.status) for r in run_answers] == [("document", 403)]
    (frame,) = page.main_frame.child_frames
    assert run_id not in await frame.content() and "checkout" not in await frame.content()
    await secured(run_answers)


async def test_a_signed_link_another_site_frames_or_opens_shows_it_nothing(
    world: World, new_page: NewPage, other_site: OtherSite
) -> None:
    run_id = await world.finished()
    link = world.link(run_id)
    page = await new_page(token=None)
    answers = answers_of(page, world.url)
    url = other_site.page(
        "frame",
        f'<!doctype html><title>frame</title><iframe id="frame" src="{link}"></iframe>',
    )
    await goto(page, url)
    # The link opens its run (200), but no other site's frame shows it (frame-ancestors 'none',
    # X-Frame-Options: DENY).
    await until_answered(answers, link)
    assert [r.status for r in answers if r.url == link] == [200]
    (frame,) = page.main_frame.child_frames
    assert run_id not in await frame.content() and "checkout" not in await frame.content()

    # Opened in a window of its own, the run shows; the opener gets no handle on it
    # (Cross-Origin-Opener-Policy): to it the window is closed at once.
    async with page.expect_popup() as popup:
        await page.evaluate(f"window.opened = window.open({link!r})")
    shown = await popup.value
    await expect(shown.locator("h1")).to_have_text(f"Run {run_id}")
    await page.wait_for_function("window.opened.closed === true")
    await secured(answers)


async def until_answered(answers: list[Response], url: str) -> None:
    """Wait until the server answered ``url``."""

    async def answered() -> bool:
        return any(r.url == url for r in answers)

    await until(answered)


async def test_a_link_another_site_shows_opens_a_page_only_from_here(
    world: World, new_page: NewPage, other_site: OtherSite
) -> None:
    run_id, _request_id = await world.waiting()
    page = await new_page(login=("alice", TOKEN))
    watch = await Watch.on(page)
    answers = answers_of(page, world.url)
    url = other_site.page(
        "links", f'<!doctype html><title>links</title><a id="runs" href="{world.url}/runs">runs</a>'
    )
    await goto(page, url)
    async with page.expect_navigation():
        await page.click("#runs")
    assert [r.status for r in answers if r.url == f"{world.url}/runs"] == [403]
    text = await page.locator("body").inner_text()
    assert "Another site opened this page" in text and run_id not in text, text
    # One click from here, the browser's login counts again.
    async with page.expect_navigation():
        await page.click("#elsewhere a")
    assert [r.status for r in answers if r.url == f"{world.url}/runs"] == [403, 200]
    assert page.url == f"{world.url}/runs"
    await expect(page.locator("#runs")).to_contain_text(run_id)
    assert watch.errors == []
    await secured(answers)


async def test_a_signed_pages_address_reaches_no_other_site(
    world: World, new_page: NewPage
) -> None:
    # The chat thread's link leaves for Slack: the page's address, signature and all, stays.
    run_id = await world.finished()
    page = await new_page(token=None)
    sent: list[dict[str, str]] = []

    async def slack(route: Any) -> None:
        sent.append(await route.request.all_headers())
        await route.fulfill(status=200, content_type="text/html", body="<p id=slack>Slack</p>")

    await page.context.route("https://app.slack.com/**", slack)
    assert (await goto(page, world.link(run_id))).status == 200
    async with page.expect_navigation():
        await page.click("#thread a")
    assert len(sent) == 1 and "referer" not in sent[0], sent
    assert await page.evaluate("document.referrer") == ""


async def test_a_page_asked_for_as_a_script_is_not_run(world: World, new_page: NewPage) -> None:
    # Served as text/html with nosniff: even a page of ours that asks for another as a script
    # (the Content-Security-Policy allows its own scripts) gets it refused, not run.
    run_id = await world.echoed()
    page = await new_page()
    watch = await Watch.on(page)
    assert (await goto(page, f"{world.url}/runs/{run_id}")).status == 200
    loaded = await page.evaluate(
        """() => new Promise(resolve => {
          const script = document.createElement('script');
          script.src = '/runs';
          script.onload = () => resolve('ran');
          script.onerror = () => resolve('refused');
          document.head.append(script);
        })"""
    )
    assert loaded == "refused"
    assert any("strict MIME type checking" in line for line in watch.console), watch.console


async def test_an_operator_following_an_expired_link_from_the_chats_site_opens_it_from_here(
    world: World, new_page: NewPage, other_site: OtherSite
) -> None:
    # A "View run" link older than its day, followed from the chat's web app by an operator
    # whose browser holds the login: before, the login opened it; it must stay one click away.
    run_id = await world.finished()
    expired = world.link(run_id, issued=time.time() - TTL - 60)
    page = await new_page(login=("alice", TOKEN))
    assert (await goto(page, f"{world.url}/runs")).status == 200  # the person is logged in
    answers = answers_of(page, world.url)
    url = other_site.page(
        "chat", f'<!doctype html><title>chat</title><a id="view" href="{expired}">View run</a>'
    )
    await goto(page, url)
    async with page.expect_navigation():
        await page.click("#view")
    assert [r.status for r in answers if r.url == expired] == [403]
    text = await page.locator("body").inner_text()
    assert "expired" in text and "checkout" not in text, text
    async with page.expect_navigation():
        await page.click("#elsewhere a")
    assert [r.status for r in answers if r.url == expired] == [403, 200]
    await expect(page.locator("h1")).to_have_text(f"Run {run_id}")
    await secured(answers)
