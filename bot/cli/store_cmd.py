"""``kestrel db``, ``kestrel replicas`` and ``kestrel health``: the store and the replicas."""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING, Any

import click

from bot.cli.common import (
    EXIT_FAILED,
    echo,
    fail,
    one_line_errors,
    plain_range,
    settings_of,
    with_reader,
)
from bot.cli.placing import PlacingGroup

if TYPE_CHECKING:
    from datetime import datetime

    from bot.store import Store


@click.group(cls=PlacingGroup)
def db() -> None:
    """The store's schema."""


@db.command("migrate")
@one_line_errors
def db_migrate() -> None:
    """Bring the schema to the current version."""
    import asyncio

    from bot.cli import compose

    settings = settings_of(click.get_current_context())

    # The store alone, as db check: a migration job has the database, not the model's key,
    # the catalogs' programs or the MCP servers a runtime would start.
    async def work() -> int:
        store = await compose.open_store(settings)
        try:
            return await store.migrate()
        finally:
            await store.close()

    echo(f"schema at version {asyncio.run(work())}")


@db.command("check", short_help="The schema version, runs and open requests; reads only.")
@one_line_errors
def db_check() -> None:
    """Connect and report the schema version, runs and open requests; reads only. Exits 1
    when the schema is missing, behind or newer than this Kestrel's (kestrel db migrate)."""
    import asyncio

    from bot.cli import compose

    settings = settings_of(click.get_current_context())
    found = asyncio.run(compose.check_schema(settings))
    where = compose.shown_database(settings)
    applied, current = found.applied, found.current
    if applied == current:
        counts = f"{found.runs} runs, {found.open_requests} open requests"
        echo(f"{where}: ok, schema version {applied}, {counts}")
        return
    if applied == 0:
        fail(f"{where}: no schema yet; kestrel db migrate creates it (nothing was created)")
    elif applied < current:
        fail(f"{where}: schema version {applied}, this Kestrel needs {current}; kestrel db migrate")
    else:
        fail(f"{where}: schema version {applied} is newer than this Kestrel's ({current})")
    sys.exit(EXIT_FAILED)


@click.command(short_help="Live replicas sharing the store, their runs and leases.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (its schema: docs/configuration.md)."
)
@one_line_errors
def replicas(as_json: bool) -> None:
    """Live replicas sharing the store, with the runs they hold and their lease ages."""
    from bot import wire
    from bot.domain import utcnow

    async def work(store: Store) -> list[Any]:
        return list(await store.list_replicas())

    rows = with_reader(work)
    if as_json:
        echo(json.dumps([wire.to_plain(r) for r in rows]))
        return
    now = utcnow()
    for replica in rows:
        seen = (now - replica.last_seen).total_seconds()
        # A stopping replica drives none of its runs to the end: it hands them back, or lets
        # the claims it took meanwhile run out.
        held = "stopping: {} run(s) held" if replica.stopping else "{} live run(s)"
        echo(f"{replica.owner}  seen {seen:.0f}s ago  {held.format(len(replica.runs))}")
        for run_id, expires in replica.runs:
            echo(f"    {run_id}  {_lease(expires, now, replica.stopping)}")
    if not rows:
        echo("no live replicas")


def _lease(expires: datetime | None, now: datetime, stopping: bool) -> str:
    """A held run's lease as `kestrel replicas` shows it."""
    from datetime import UTC

    if expires is None:
        return "no lease"
    left = (expires - now).total_seconds()
    if stopping:
        return f"stopping, claim expires at {expires.astimezone(UTC):%H:%M:%S} UTC (in {left:.0f}s)"
    return f"lease {left:+.0f}s"


# What ``kestrel health`` asks by default: the image's HEALTHCHECK, on the same host.
HEALTH_URL = "http://127.0.0.1:3000/healthz"


class _Seconds(click.FloatRange):
    """Click's FloatRange, which takes NaN (every comparison with it is false) and then
    the socket refused it as if the replica had."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number.", param, ctx)
        return number


@click.command(short_help="Ask a running kestrel serve how it is (exit 0 on 200).")
@click.option(
    "--url",
    default=HEALTH_URL,
    metavar="URL",
    show_default=True,
    help="The endpoint to ask (/healthz: alive; /readyz: ready for traffic).",
)
@click.option(
    "--timeout",
    default=5.0,
    show_default=True,
    type=plain_range(_Seconds(0.1, 300)),
    metavar="SECONDS",
    help="Seconds to wait for the answer.",
)
def health(url: str, timeout: float) -> None:
    """Ask a running kestrel serve how it is: exit 0 on 200, else 1 with the answer on one
    line (the container's HEALTHCHECK; a probe where HTTP probes are not available)."""
    import urllib.error
    import urllib.parse
    import urllib.request

    if not url.startswith(("http://", "https://")):
        fail(f"{url}: not an http:// URL (the default is {HEALTH_URL})")
        sys.exit(1)
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - read for its ValueError: a port that is no number
    except ValueError as exc:  # an unclosed IPv6 bracket
        fail(f"{url}: {exc}")
        sys.exit(1)
    if "@" in parts.netloc:
        # urllib would take the user and password for a part of the host's name.
        fail(f"{url}: a probe sends no user or password: give the URL without them")
        sys.exit(1)
    # Straight to the replica: a proxy in the environment, there for the model's and the
    # platforms' endpoints, would be asked instead, and fail the probe or answer for it.
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with direct.open(url, timeout=timeout) as response:
            status, body = response.status, response.read(4096)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(4096)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        if isinstance(reason, ConnectionRefusedError):  # said as [Errno 111] Connection refused
            reason = "nothing listens there (is kestrel serve running, on that --port?)"
        fail(f"{url}: {reason}")
        sys.exit(1)
    echo(f"{status} {' '.join(body.decode('utf-8', 'replace').split())}", err=status != 200)
    sys.exit(0 if status == 200 else 1)
