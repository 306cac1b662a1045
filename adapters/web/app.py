"""The run pages on ``kestrel serve``'s HTTP listener (aiohttp), beside ``/healthz``.

Routes (``add_web_routes``):

- ``GET /runs``: recent runs; ``?status=`` (running, suspended, completed, failed, cancelled),
  ``?may_answer=`` (a user id or ``group:ID``: runs with an open request they may answer),
  ``?limit=`` (1 to 500, 50 by default);
- ``GET /runs/{run_id}``: one run's header and the newest page of its timeline;
  ``?before=SEQ``: the page of the entries before SEQ;
- ``GET /runs/{run_id}/fragment``: its ``<article id="run">`` alone, for live updates; with
  ``?v=VERSION`` (the ``data-version`` the page shows) it answers 204 while nothing changed,
  read from the run's row, its journal's length and its last audit (never the journal);
- ``GET /pending``: every open request, oldest first, with who may answer it;
- ``GET /``: a redirect to ``/runs`` (where a person typing the listener's address lands);
- ``GET /static/style.css``, ``GET /static/live.js`` and ``GET /static/favicon.svg`` (also at
  ``GET /favicon.ico``, which a browser asks for by itself): the stylesheet, the live-update
  script and the icon, the only things served without authorization.

Who may see what is ``adapters.web.auth``'s; every response carries its security headers,
aiohttp's own answers too when served by ``SecureRunner``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from aiohttp import web

from adapters.web.auth import Access, WebConfig, authorize, refusal, secure
from adapters.web.render import (
    RunReader,
    load_run_rows,
    load_run_sources,
    mark_version,
    render_pending,
    render_run_fragment,
    render_run_page,
    render_runs,
    static_text,
)
from adapters.web.timeline import STATUSES
from bot.chat.contract import UnknownRun
from bot.domain import utcnow

log = logging.getLogger("kestrel.web")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
_STATIC = {"style.css": "text/css", "live.js": "text/javascript", "favicon.svg": "image/svg+xml"}
# Where a browser looks for a site's icon unless a page names one (a refusal, /healthz).
_ICON = "/favicon.ico"


def add_web_routes(
    app: web.Application,
    chat: RunReader,
    config: WebConfig,
    *,
    clock: Callable[[], datetime] = utcnow,
) -> None:
    """Add the run pages' routes to ``app`` (the listener that serves ``/healthz``)."""
    pages = _Pages(chat, config, clock)
    app.router.add_get("/runs", _guarded(pages.runs))
    app.router.add_get("/runs/{run_id}", _guarded(pages.run))
    app.router.add_get("/runs/{run_id}/fragment", _guarded(pages.fragment))
    app.router.add_get("/pending", _guarded(pages.pending))
    app.router.add_get("/", _guarded(_to_runs))
    for name in _STATIC:
        app.router.add_get(f"/static/{name}", _guarded(_static_handler(name)))
    app.router.add_get(_ICON, _guarded(_static_handler("favicon.svg")))
    # Every response of the listener (the router's own 404 and 405, /metrics) carries the
    # security headers, and none names the server's software.
    app.on_response_prepare.append(_secure_response)


async def _secure_response(_request: web.Request, response: web.StreamResponse) -> None:
    secure(response.headers)
    response.headers.popall("Server", None)


class SecureRunner(web.AppRunner):
    """An ``AppRunner`` whose own answers carry the security headers too: what aiohttp cannot
    parse (a bad request line, a bad or oversized header) it answers itself, before any route,
    middleware or ``on_response_prepare`` sees the request."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        make = getattr(self.app, "_make_request", None)  # private: an aiohttp without it
        if make is not None:  # serves as a plain runner does
            server.request_factory = functools.partial(make, _cls=_Request)
        return server


class _Request(web.Request):
    """A request whose answer, if no route ever matched it, is secured as a routed one is."""

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        # aiohttp's own answer to what it could not parse: no route ever matched. Read with a
        # default, a private name: were it renamed, every answer is secured twice, none lost.
        if getattr(self, "_match_info", None) is None:
            await _secure_response(self, response)
        await super()._prepare_hook(response)


def web_routes(chat: RunReader, config: WebConfig) -> web.Application:
    """An application serving the run pages alone (tests; or to mount elsewhere)."""
    app = web.Application()
    add_web_routes(app, chat, config)
    return app


def _guarded(handler: Handler) -> Handler:
    """The handler, with the security headers on whatever it answers, and a bare 500 (that
    shows nothing) if it fails."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            response = await handler(request)
        except Exception:
            log.exception("web: %s %s failed", request.method, request.path)
            return refusal(500, "Something went wrong; the log says what.")
        secure(response.headers)
        return response

    return guarded


async def _to_runs(_request: web.Request) -> web.StreamResponse:
    """The listener's root: the runs are the pages' first page (which says who may see it)."""
    return web.Response(status=302, headers={"Location": "/runs"})


def _static_handler(name: str) -> Handler:
    async def serve(_request: web.Request) -> web.StreamResponse:
        return web.Response(text=static_text(name), content_type=_STATIC[name], charset="utf-8")

    return serve


def _before(value: str | None) -> int | web.Response | None:
    """``?before=SEQ``: the page of the entries before SEQ (None: the newest)."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        return refusal(400, "before is a journal position (a number).")
    return int(value)


async def off_loop(render: Callable[[], str]) -> str:
    """``render()`` on the pages' worker thread: building and templating a page of a long
    run takes tens of milliseconds, which the loop serving chat and ``/healthz`` must not
    wait out. One thread: pages queue rather than fight for the interpreter."""
    return await asyncio.get_running_loop().run_in_executor(_RENDERER, render)


_RENDERER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kestrel-pages")


def _html(text: str) -> web.Response:
    return web.Response(text=text, content_type="text/html", charset="utf-8")


class _Pages:
    def __init__(self, chat: RunReader, config: WebConfig, clock: Callable[[], datetime]) -> None:
        self._chat = chat
        self._config = config
        self._clock = clock

    async def runs(self, request: web.Request) -> web.StreamResponse:
        access = authorize(request, self._config)
        if not isinstance(access, Access):
            return access
        query = request.rel_url.query
        status = query.get("status", "").strip()
        answerer = query.get("may_answer", "").strip()
        if status and status not in STATUSES:
            return refusal(400, f"status is one of: {', '.join(STATUSES)}.")
        if len(answerer) > 200:
            return refusal(400, "may_answer is too long.")
        try:
            limit = int(query.get("limit", DEFAULT_LIMIT))
        except ValueError:
            return refusal(400, "limit is a number.")
        limit = max(1, min(MAX_LIMIT, limit))
        rows = await load_run_rows(self._chat, limit=limit, status=status, answerer=answerer)
        now = self._clock()
        return _html(render_runs(rows, now=now, status=status, answerer=answerer, limit=limit))

    async def run(self, request: web.Request) -> web.StreamResponse:
        run_id = request.match_info["run_id"]
        access = authorize(request, self._config, run_id)
        if not isinstance(access, Access):
            return access
        before = _before(request.rel_url.query.get("before"))
        if isinstance(before, web.Response):
            return before
        try:
            sources = await load_run_sources(self._chat, run_id, before=before)
        except UnknownRun:
            return refusal(404, "There is no such run.")
        now, query = self._clock(), access.query

        def render() -> str:
            return render_run_page(sources.page(), now=now, link_query=query)

        return _html(await off_loop(render))

    async def fragment(self, request: web.Request) -> web.StreamResponse:
        run_id = request.match_info["run_id"]
        access = authorize(request, self._config, run_id)
        if not isinstance(access, Access):
            return access
        try:
            # The "has it changed" check: the run's row, its journal's length, its last audit.
            if request.rel_url.query.get("v") == mark_version(await self._chat.mark(run_id)):
                return web.Response(status=204)
            sources = await load_run_sources(self._chat, run_id)
        except UnknownRun:
            return refusal(404, "There is no such run.")
        now, query = self._clock(), access.query

        def render() -> str:
            return render_run_fragment(sources.page(), now=now, link_query=query)

        return _html(await off_loop(render))

    async def pending(self, request: web.Request) -> web.StreamResponse:
        access = authorize(request, self._config)
        if not isinstance(access, Access):
            return access
        pending, now = await self._chat.pending(), self._clock()
        return _html(await off_loop(lambda: render_pending(pending, now=now)))
