"""``kestrel runs export RUN --html FILE``: a run's page as one self-contained HTML file."""

from __future__ import annotations

from datetime import datetime

from adapters.web.render import RunReader, load_run_page, render_run_page


async def export_html(chat: RunReader, run_id: str, *, now: datetime | None = None) -> str:
    """The page of ``run_id`` as one file: the stylesheet inlined (allowed by its hash in a
    ``<meta>`` Content-Security-Policy), no script, no external asset, no link to another
    page; raises ``bot.store.UnknownRun`` for an unknown id."""
    page = await load_run_page(chat, run_id)
    return render_run_page(page, now=now, standalone=True)
