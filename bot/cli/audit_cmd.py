"""``kestrel audit``: who decided what."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from bot.cli import render
from bot.cli.common import echo, limit_option, one_line_errors, with_reader
from bot.text import invisibles_named

if TYPE_CHECKING:
    from bot.store import Store


@click.command()
@click.option("--run", "run_id", default=None, metavar="RUN", help="Only this run's entries.")
@limit_option(200)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@one_line_errors
def audit(run_id: str | None, limit: int, as_json: bool) -> None:
    """Who requested, decided, answered, expired and resumed what."""

    async def work(store: Store) -> list[Any]:
        found = list(await store.list_audit(run_id=run_id, limit=limit))
        if run_id is not None and not found:  # "" too: a script's --run "$RUN" unset
            await store.get_run(run_id)  # a run with no audit yet, or none: says which
        return found

    entries = with_reader(work)
    if as_json:
        echo(json.dumps([render.audit_object(entry) for entry in entries]))
        return
    if not entries:
        echo("no audit entries")  # as ``runs list`` and ``runs pending`` say so: not silence
        return
    for entry in entries:
        target = entry.request_id or entry.run_id
        when = f"{entry.at:%Y-%m-%d %H:%M:%S}"
        actor = " ".join(entry.actor.split())  # one row a line, whatever a platform sent
        # The call approved, as the cards showed it: its invisible characters named.
        detail = invisibles_named(entry.detail)
        echo(f"{when}  {actor:<16} {entry.action:<14} {target}  {detail}")
