"""``kestrel runs export RUN --html FILE``: a run's page as one self-contained HTML file.

The file holds the whole timeline, however long the run: it is written as it is read, the
journal a chunk at a time, so memory stays one chunk (and the header's audit and requests).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import datetime
from typing import Final

from markupsafe import Markup

from adapters.web.render import RunPageReader, load_run_sources, render_items, render_run_page
from adapters.web.timeline import AuditRow, TimelineWalk
from bot.domain import utcnow

# Journal entries read (and rendered) at a time.
CHUNK_ENTRIES: Final = 1_000
# Where the timeline's items go in the page's skeleton (a comment no entry can produce:
# everything from the journal is escaped).
_MARKER: Final = Markup("<!--kestrel:timeline-->")


async def write_export(
    chat: RunPageReader, run_id: str, write: Callable[[str], object], *, now: datetime | None = None
) -> None:
    """Write the page of ``run_id`` as one file through ``write``, in chunks: the stylesheet
    inlined (allowed by its hash in a ``<meta>`` Content-Security-Policy), no script, no
    external asset, no link to another page; raises ``bot.errors.UnknownRun`` for an unknown
    id (before anything is written)."""
    now = now or utcnow()
    # The header, and no entry: the timeline is streamed into it below.
    sources = await load_run_sources(chat, run_id, before=0, size=0)
    length = sources.length if sources.length is not None else 0
    page = sources.page()
    skeleton = render_run_page(page, now=now, standalone=True, stream_marker=_MARKER)
    head, tail = skeleton.split(str(_MARKER), 1)
    write(head)
    audit = [AuditRow.of(row) for row in sources.audit]
    walk = TimelineWalk(sources.requests, audit, sources.view.state.last_text)
    for start in range(0, length, CHUNK_ENTRIES):
        records = await chat.entries(run_id, start, min(length, start + CHUNK_ENTRIES))
        write(render_items(walk.feed(records), now=now, standalone=True))
    write(render_items(walk.close(), now=now, standalone=True))
    write(tail)


async def export_html(chat: RunPageReader, run_id: str, *, now: datetime | None = None) -> str:
    """The page of ``run_id`` as one file, as a string (``write_export`` writes it to a file
    without holding it)."""
    out = io.StringIO()
    await write_export(chat, run_id, out.write, now=now)
    return out.getvalue()
