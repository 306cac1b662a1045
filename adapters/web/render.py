"""The pages as HTML: Jinja2 templates (autoescaped) over the data of ``timeline``.

Everything that comes from a model, a tool or a person reaches the HTML through autoescaping;
the one filter that returns markup, ``marked``, escapes first and then wraps the PII guard's
placeholders in ``<span class="redacted">``. Every value a template prints shows its direction
overrides and isolates by code point (``[U+202E]``) instead of obeying them; a call's
arguments show every invisible character so (``[U+200B]``, ``invisibles_named``).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any, Protocol
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup, escape

from adapters.web.timeline import (
    STATUSES,
    Item,
    RunPage,
    RunRow,
    build_run_page,
    oldest_first,
    page_version,
    pretty_json,
    run_rows,
    shown,
)
from bot.chat.cards import PLAN_BINDING, off_plan_words, plan_steps
from bot.chat.contract import ENTITY_TYPES, WITHHELD_MESSAGE, AuditRecord, JournalRecord, RunRecord
from bot.chat.run_summary import PAGE_ENTRIES
from bot.chat.service import PendingRequest, RequestView, RunInspection, RunMark, RunView
from bot.chat.words import ORIGINS_TITLE, Origin, origin_lines, stop_reason_words, thread_of
from bot.domain import utcnow
from bot.text import invisibles_named, reordering_named

# While a run is running its page polls this often; while it is suspended, less often.
RUNNING_POLL_MS = 2000
SUSPENDED_POLL_MS = 10000
# A filtered run list looks through this many times as many of the newest runs as it shows.
FILTER_SCAN = 10

_REDACTED = re.compile(
    "&lt;(?:"
    + "|".join(re.escape(name) for name in ENTITY_TYPES)
    + ")&gt;|"
    + re.escape(str(escape(WITHHELD_MESSAGE)))
)


def _in_order(value: Any) -> Any:
    """A value a template prints (its ``finalize``), each direction override or isolate shown
    as its code point: obeyed, they show an argument "\u202ebd-stnemyap" as "payments-db".
    Markup stays markup (what replaces them holds no ``<&>"'``)."""
    if not isinstance(value, str) or value.isascii():
        return value
    shown = reordering_named(value)
    return Markup(shown) if isinstance(value, Markup) else shown


def marked(text: str | None) -> Markup:
    """``text`` escaped, with the PII guard's placeholders (``<EMAIL_ADDRESS>``, the withheld
    notice) wrapped in ``<span class="redacted">``."""
    escaped = str(escape(text or ""))
    return Markup(
        _REDACTED.sub(
            lambda m: (
                f'<span class="redacted" title="redacted by the PII guard">{m.group(0)}</span>'
            ),
            escaped,
        )
    )


def _span(delta: timedelta) -> str:
    seconds = int(abs(delta.total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d"


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _iso(value: datetime | None) -> str:
    return value.isoformat() if value is not None else ""


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return _span(timedelta(seconds=seconds))


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def _origins(origins: Sequence[Origin]) -> list[Markup]:
    """Each origin in words, its pieces escaped as code, an instruction-like output marked."""
    code = Markup("<code>{}</code>").format
    warn = Markup('<span class="badge warn instruction-like">{}</span>').format
    # Every piece is escaped by ``format``; the words around them are ours.
    return [Markup(line) for line in origin_lines(origins, code, warn)]


@functools.cache
def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("adapters.web", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
        finalize=_in_order,
    )
    env.filters.update(
        marked=marked,
        when=_when,
        iso=_iso,
        duration=_duration,
        number=_number,
        span=_span,
        pretty=pretty_json,
        shown=shown,
        named=invisibles_named,
        origins=_origins,
        reason=stop_reason_words,
    )
    env.globals.update(
        quote=lambda value: quote(str(value), safe=""),
        statuses=STATUSES,
        origins_title=ORIGINS_TITLE,
        plan_steps=plan_steps,
        off_plan_words=off_plan_words,
        plan_binding=PLAN_BINDING,
    )
    return env


def static_text(name: str) -> str:
    """A file of the package's ``static`` folder."""
    return _static(name)


@functools.cache
def _static(name: str) -> str:
    return resources.files("adapters.web").joinpath("static", name).read_text("utf-8")


def _render(template: str, **context: Any) -> str:
    context.setdefault("standalone", False)
    context.setdefault("operator", True)
    return _environment().get_template(template).render(**context)


def _run_context(page: RunPage, now: datetime, link_query: str, standalone: bool) -> dict[str, Any]:
    run_path = f"/runs/{quote(page.run_id, safe='')}"
    suffix = f"?{link_query}" if link_query else ""
    interval = RUNNING_POLL_MS if page.record.status.value == "running" else SUSPENDED_POLL_MS

    def before(seq: int) -> str:
        return f"{run_path}?before={seq}" + (f"&{link_query}" if link_query else "")

    return {
        "page": page,
        "now": now,
        "standalone": standalone,
        "operator": not link_query,
        "reload_url": run_path + suffix,
        "live_url": run_path + "/fragment" + suffix,
        "interval": interval,
        "older_url": before(page.first_seq),
        "newer_url": before(min(page.next_seq, page.stop + PAGE_ENTRIES)),
        "stream_marker": "",
    }


def render_run_page(
    page: RunPage,
    *,
    now: datetime | None = None,
    standalone: bool = False,
    link_query: str = "",
    stream_marker: Markup | None = None,
) -> str:
    """The whole page of one run.

    ``standalone``: one self-contained file (the stylesheet inlined and allowed by its hash in
    a ``<meta>`` Content-Security-Policy; no script, no link to another page) for an incident
    report. ``link_query``: the signed link's ``exp=…&sig=…`` the page was opened with,
    carried on its reload and live-update URLs (and the navigation to other pages hidden).
    ``stream_marker``: put at the end of the timeline, for the export to write its items there.
    """
    context = _run_context(page, now or utcnow(), link_query, standalone)
    if stream_marker is not None:
        context["stream_marker"] = stream_marker
    if standalone:
        css = static_text("style.css")
        digest = base64.b64encode(hashlib.sha256(css.encode()).digest()).decode()
        context["inline_css"] = Markup(css)  # our own file, not user data
        context["export_csp"] = (
            f"default-src 'none'; style-src 'sha256-{digest}'; img-src data:;"
            " base-uri 'none'; form-action 'none'"
        )
    return _render("run.html", **context)


def render_run_fragment(page: RunPage, *, now: datetime | None = None, link_query: str = "") -> str:
    """The part of a run's page that live updates replace (``<article id="run">``)."""
    return _render("_run.html", **_run_context(page, now or utcnow(), link_query, False))


def render_items(items: Sequence[Item], *, now: datetime, standalone: bool = False) -> str:
    """Items of a run's timeline alone (the export writes them a chunk at a time)."""
    return _render("_items.html", items=items, now=now, standalone=standalone)


def render_runs(
    rows: Sequence[RunRow],
    *,
    now: datetime | None = None,
    status: str = "",
    answerer: str = "",
    limit: int = 50,
) -> str:
    """``/runs``: recent runs, perhaps filtered."""
    return _render(
        "runs.html",
        rows=rows,
        now=now or utcnow(),
        status=status,
        answerer=answerer,
        limit=limit,
        scanned=scanned(limit, filtered=bool(status or answerer)),
    )


def render_pending(pending: Sequence[PendingRequest], *, now: datetime | None = None) -> str:
    """``/pending``: every open request, oldest first, with who may answer it."""
    return _render(
        "pending.html", pending=oldest_first(pending), now=now or utcnow(), thread_of=thread_of
    )


class RunPageReader(Protocol):
    """What one run's page is read through: ``bot.chat.service.RunReads`` (the store alone, for
    ``kestrel runs export``) or ``ChatService``."""

    async def inspect(
        self, run_id: str, *, before: int | None = None, size: int = PAGE_ENTRIES
    ) -> RunInspection: ...

    async def entries(self, run_id: str, start: int, stop: int) -> list[JournalRecord]: ...


class RunReader(RunPageReader, Protocol):
    """What the pages read runs through: ``bot.chat.service.ChatService`` (or anything with these
    read methods)."""

    async def mark(self, run_id: str) -> RunMark: ...

    async def recent(self, limit: int = 10) -> list[RunRecord]: ...

    async def pending(self) -> list[PendingRequest]: ...


@dataclass(frozen=True)
class RunSources:
    """What a run's page is built from, as ``ChatService`` returns it."""

    view: RunView
    journal: list[JournalRecord]
    audit: list[AuditRecord]
    requests: list[RequestView]
    length: int | None = None

    def page(self) -> RunPage:
        """The page (CPU only: the handlers build it off the event loop)."""
        return build_run_page(
            self.view, self.journal, self.audit, self.requests, length=self.length
        )


def mark_version(mark: RunMark) -> str:
    """The ``data-version`` of the page a ``RunMark`` was read for."""
    return page_version(mark.record, mark.length, mark.last_audit)


async def load_run_sources(
    chat: RunPageReader, run_id: str, *, before: int | None = None, size: int = PAGE_ENTRIES
) -> RunSources:
    """A run's record, a page of its journal, its audit and its requests
    (``bot.errors.UnknownRun`` for an unknown id)."""
    found = await chat.inspect(run_id, before=before, size=size)
    return RunSources(found.view, found.journal, found.audit, found.requests, found.length)


async def load_run_page(chat: RunReader, run_id: str, *, before: int | None = None) -> RunPage:
    """A run's page from the store (``bot.errors.UnknownRun`` for an unknown id)."""
    return (await load_run_sources(chat, run_id, before=before)).page()


def scanned(limit: int, *, filtered: bool) -> int:
    """How many of the newest runs a listing of ``limit`` looks through."""
    return limit * FILTER_SCAN if filtered else limit


async def load_run_rows(
    chat: RunReader, *, limit: int, status: str = "", answerer: str = ""
) -> list[RunRow]:
    """The newest runs (of ``limit``), filtered by status and by who may answer."""
    records = await chat.recent(scanned(limit, filtered=bool(status or answerer)))
    pending = await chat.pending()
    return run_rows(records, pending, status=status, answerer=answerer)[:limit]
