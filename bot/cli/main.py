"""The ``kestrel`` command."""

from __future__ import annotations

import functools
import json
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import click

from bot import __version__
from bot.cli import render
from bot.text import printable

# Each command imports what it needs when it runs: ``kestrel --help`` needs click alone, and
# the read-only commands (``runs list``, ``runs pending``) the settings and the store, not the
# model client or the code that drives runs. bench/startup.py times them.
if TYPE_CHECKING:
    from bot.chat.service import PendingRequest
    from bot.config.settings import Settings
    from bot.domain import DecisionKind
    from bot.run.runtime import Runtime
    from bot.run.supervisor import Supervisor
    from bot.store import Store

P = ParamSpec("P")
R = TypeVar("R")

# Exit statuses of ``kestrel run`` (see its --help); 2 is also click's for usage errors.
EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SUSPENDED = 3
EXIT_CANCELLED = 4
_EXIT_BY_STATUS = {"completed": EXIT_COMPLETED, "failed": EXIT_FAILED, "cancelled": EXIT_CANCELLED}


class Failure(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def exit_status(run_status: str) -> int:
    """The exit status for a run that stopped in ``run_status``; not ended is suspended."""
    return _EXIT_BY_STATUS.get(run_status, EXIT_SUSPENDED)


def echo(text: str, *, err: bool = False) -> None:
    """Print for a terminal: model and tool text never reaches it with control sequences."""
    click.echo(printable(text), err=err)


def fail(message: str) -> None:
    """The one line a user sees on error, on stderr."""
    echo("kestrel: " + " ".join(message.split()), err=True)


def one_line_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Bad configuration, stores and arguments end in one clear line, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not _is_user_error(exc):
                raise
            fail(str(exc))
            sys.exit(EXIT_USAGE)

    return wrapper


# The errors a user sees as one line, by module: configuration, store, resume and policy.
_USER_ERRORS = (
    ("bot.config.sources", "ConfigError"),
    ("bot.errors", "StoreError"),
    ("bot.errors", "ResumeRefused"),
    ("bot.people.policy", "NotPermitted"),
)


def _is_user_error(exc: Exception) -> bool:
    """Whether ``exc`` ends in one line. A module not imported yet raised none of its errors, so
    only the imported ones are checked: this wrapper imports nothing."""
    if isinstance(exc, Failure):
        return True
    for module, name in _USER_ERRORS:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(exc, getattr(loaded, name)):
            return True
    return False


def terminal_user(given: str | None = None) -> str:
    """Who acts at this terminal: ``--as``, else ``KESTREL_USER``, else the login name."""
    import getpass
    import os

    for name in (given, os.environ.get("KESTREL_USER"), os.environ.get("USER")):
        if name and name.strip():
            return name.strip()
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "terminal"  # no login name at all (a container without one): still one name


def as_option(help_text: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``--as USER``: who acts, defaulting to the terminal's one identity (``terminal_user``)."""
    return click.option(
        "--as",
        "user",
        default=None,
        metavar="USER",
        help=f"{help_text} [default: $KESTREL_USER, else your login name]",
    )


def _config_option() -> str | None:
    """The ``--config`` given, if any."""
    obj: dict[str, Any] = click.get_current_context().ensure_object(dict)
    return obj.get("config")


def settings_of(ctx: click.Context) -> Settings:
    """The settings, loaded once per invocation."""
    obj: dict[str, Any] = ctx.ensure_object(dict)
    if "settings" not in obj:
        from bot.config.settings import load_settings

        obj["settings"] = load_settings(obj.get("config"))
    settings: Settings = obj["settings"]
    return settings


def with_runtime(work: Callable[[Runtime], Awaitable[R]]) -> R:
    """Run ``work`` with a runtime built from the current settings."""
    import asyncio

    from bot.cli import compose

    settings = settings_of(click.get_current_context())

    async def main() -> R:
        async with compose.runtime(settings) as rt:
            return await work(rt)

    return asyncio.run(main())


def with_reader(work: Callable[[Store], Awaitable[R]]) -> R:
    """Run ``work`` with the store opened for reading only (no migration, no write lock)."""
    import asyncio

    from bot.cli import compose

    settings = settings_of(click.get_current_context())

    async def main() -> R:
        async with compose.reader(settings) as store:
            return await work(store)

    return asyncio.run(main())


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="kestrel", message="%(prog)s %(version)s")
@click.option("--config", "config", type=click.Path(), help="kestrel.yaml to use.")
@click.option("-v", "--verbose", is_flag=True, help="Log at info level (--log-level info).")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default=None,
    help="What reaches stderr [KESTREL_LOG_LEVEL, else warning]; KESTREL_LOG_FORMAT=json for"
    " one JSON object per line.",
)
@click.pass_context
def cli(ctx: click.Context, config: str | None, verbose: bool, log_level: str | None) -> None:
    """Kestrel: a chat-ops agent with people in the loop."""
    import os

    from bot import logs

    ctx.ensure_object(dict)["config"] = config
    # A service's log shows warnings; a one-shot command's answer stays its one line.
    default = logs.DEFAULT_LEVEL if ctx.invoked_subcommand == "serve" else "error"
    try:
        level, form = logs.chosen(log_level or ("info" if verbose else None), os.environ, default)
    except logs.LogSetupError as exc:
        fail(str(exc))
        sys.exit(EXIT_USAGE)
    logs.configure(level, form)


@cli.command()
@as_option("Your user id in this session.")
@one_line_errors
def chat(user: str | None) -> None:
    """Chat in the terminal (the offline demo when no model endpoint is configured)."""
    import asyncio

    from adapters.console import ConsoleChat, ConsoleIO
    from bot.chat.service import ChatService
    from bot.run.supervisor import Supervisor

    settings = settings_of(click.get_current_context())
    user = terminal_user(user)

    async def work(rt: Runtime) -> bool:
        supervisor = Supervisor(rt)
        banner = (
            f"Kestrel chat: model {rt.model.provider}/{rt.model.model}, "
            f"{len(rt.tools.current())} tools, journal {settings.database}. "
            "/help for commands, Ctrl-D to leave."
            f"\nYou are {user} (--as or KESTREL_USER to change it)."
        ) + "".join(f"\nnote: {notice}" for notice in rt.policy.notices())
        console = ConsoleChat(ChatService(supervisor), ConsoleIO(), user)
        try:
            await console.run(banner)
        finally:
            await supervisor.shutdown()
        return console.terminated

    try:
        terminated = with_runtime(work)
    except (KeyboardInterrupt, asyncio.CancelledError):
        click.echo("\naborted", err=True)
        sys.exit(130)
    if terminated:
        click.echo("stopped: the run under way was suspended", err=True)
        sys.exit(128 + signal.SIGTERM)


PLATFORMS = ("slack", "discord")


@cli.command()
@click.argument("platforms", nargs=-1, type=click.Choice(PLATFORMS))
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="HTTP port: /healthz, the run pages, /metrics, /slack/events [3000; 0: any free].",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP address to bind.")
@one_line_errors
def serve(platforms: tuple[str, ...], port: int | None, host: str) -> None:
    """Run until stopped: take work from the store, adopt orphaned runs, fire deadlines,
    reminders and scheduled prompts, and serve the chat PLATFORMS named (slack, discord). SIGTERM or
    Ctrl-C suspends live runs and hands them back."""
    import asyncio
    import contextlib
    import gc

    from bot.cli.serving import ChatFront
    from bot.errors import StoreError
    from bot.replica.schedule import Scheduler
    from bot.replica.work import WorkTaker
    from bot.run.supervisor import Supervisor

    settings = settings_of(click.get_current_context())

    async def work(rt: Runtime) -> None:
        supervisor = Supervisor(rt)
        front = ChatFront(supervisor, platforms, host=host, port=port, web_settings=settings.web)
        taker = WorkTaker(supervisor, rt.store, inbound=front.chat.inbound)
        scheduler = Scheduler(supervisor, settings.deadlines, settings.schedules, store=rt.store)
        stop = asyncio.Event()
        _on_stop_signals(lambda _signum: stop.set())
        await front.start()
        await scheduler.start()
        # What start-up built (modules, schemas, the catalog) lives as long as the process:
        # kept out of the collector's full passes, each of which otherwise held the event
        # loop 20-70 ms (bench.web), while pages, Slack and /healthz waited.
        gc.freeze()
        taking = asyncio.create_task(taker.run())
        click.echo(f"kestrel serving as {rt.owner}", err=True)
        for line in [*front.describe(), *(f"note: {n}" for n in rt.policy.notices())]:
            echo(line, err=True)
        await stop.wait()
        front.drain()  # /readyz says 503 at once: the balancer stops sending here
        taker.stop()
        await scheduler.stop()
        grace = settings.replica.shutdown_grace_seconds
        for run_id in await supervisor.shutdown(tool_grace=grace):
            await taker.submit_resume(run_id)  # handed back: another replica goes on
        await front.stop()
        taking.cancel()
        await asyncio.gather(taking, return_exceptions=True)
        # Stopped cleanly: gone from `kestrel replicas` at once, not a minute later (with the
        # store away, it drops off once its heartbeat is a minute old).
        with contextlib.suppress(StoreError):
            await rt.store.forget_replica(rt.owner)
        click.echo("stopped: live runs suspended and their leases released", err=True)

    with_runtime(work)


@cli.group()
def db() -> None:
    """The store's schema."""


@db.command("migrate")
@one_line_errors
def db_migrate() -> None:
    """Bring the schema to the current version."""

    async def work(rt: Runtime) -> int:
        return await rt.store.migrate()

    click.echo(f"schema at version {with_runtime(work)}")


@db.command("check")
@one_line_errors
def db_check() -> None:
    """Connect and report the schema version, runs and open requests; reads only. Exits 1
    when the schema is missing, behind or newer than this Kestrel's (kestrel db migrate)."""
    import asyncio

    from bot.cli import compose

    settings = settings_of(click.get_current_context())
    found = asyncio.run(compose.check_schema(settings))
    where = _safe_url(settings.database)
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


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def replicas(as_json: bool) -> None:
    """Live replicas sharing the store, with the runs they hold and their lease ages."""
    from bot.domain import utcnow

    async def work(store: Store) -> list[Any]:
        return list(await store.list_replicas())

    rows = with_reader(work)
    if as_json:
        echo(json.dumps([r.model_dump(mode="json") for r in rows]))
        return
    now = utcnow()
    for replica in rows:
        seen = (now - replica.last_seen).total_seconds()
        echo(f"{replica.owner}  seen {seen:.0f}s ago  {len(replica.runs)} live run(s)")
        for run_id, expires in replica.runs:
            left = f"lease {(expires - now).total_seconds():+.0f}s" if expires else "no lease"
            echo(f"    {run_id}  {left}")
    if not rows:
        echo("no live replicas")


def _on_stop_signals(handler: Callable[[int], object]) -> None:
    """Call ``handler(signum)`` on SIGINT and SIGTERM instead of dying mid-write."""
    import asyncio

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, handler, signum)


def _suspend_on_signals(supervisor: Supervisor, received: list[int]) -> None:
    """On SIGINT or SIGTERM, stop the runs this command drives now (their tools killed): they
    suspend and give their leases up; ``received`` collects the signal."""

    def stop(signum: int) -> None:
        received.append(signum)
        supervisor.interrupt_all()

    _on_stop_signals(stop)


def _exit_if_signalled(received: list[int]) -> None:
    # The run was suspended with its lease released; the shell's convention for the code.
    if received:
        sys.exit(128 + received[0])


def _safe_url(url: str) -> str:
    """A database URL without its password."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"


@cli.command()
@click.argument("prompt")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--defer", is_flag=True, help="Defer approvals and questions: suspend and exit.")
@as_option("Who asks.")
@one_line_errors
def run(prompt: str, as_json: bool, defer: bool, user: str | None) -> None:
    """Run one prompt headless: gated calls are refused (or deferred with --defer).

    The exit status says how the run stopped (with --json too):

    \b
      0  completed
      1  failed (model error, budget or deadline, no progress, refused, internal error)
      2  not run: bad usage, configuration or store (one line on stderr)
      3  suspended: waits for an approval, an answer or on-call (kestrel runs pending)
      4  cancelled
      128+N  stopped by signal N (130 Ctrl-C, 143 SIGTERM): the run is suspended
    """
    from bot.chat.service import ChatService
    from bot.people.policy import Actor
    from bot.prompter import DeferringPrompter
    from bot.run.supervisor import Supervisor

    async def work(rt: Runtime) -> dict[str, Any]:
        supervisor = Supervisor(rt)
        prompter = DeferringPrompter() if defer else None
        chat = ChatService(supervisor)
        live = await chat.submit_turn(prompt, user=Actor(terminal_user(user)), prompter=prompter)
        _suspend_on_signals(supervisor, received)
        await chat.wait(live)
        if live.error:
            raise Failure(live.error)
        return await _run_object(rt, live.run_id)

    received: list[int] = []
    obj = with_runtime(work)
    _print_run(obj, as_json)
    _exit_if_signalled(received)
    sys.exit(exit_status(obj["status"]))


async def _run_object(rt: Runtime, run_id: str) -> dict[str, Any]:
    from bot.journal.fold import fold

    record = await rt.store.get_run(run_id)
    state = fold(await rt.store.load(run_id), run_id)
    return render.run_object(record, state, await _closed_requests(rt.store, run_id))


async def _closed_requests(store: Store, run_id: str) -> list[render.StoredRequest]:
    """The run's requests that were decided, expired or cancelled, oldest first."""
    from bot.kinds import RequestStatus

    found = await store.list_requests(run_id=run_id, status=None)
    return [item for item in found if item[1] is not RequestStatus.OPEN]


def _print_run(obj: dict[str, Any], as_json: bool) -> None:
    if as_json:
        echo(json.dumps(obj, indent=2, sort_keys=True))
        return
    if obj["text"]:
        echo(obj["text"])
    echo(f"[{obj['run_id']}: {obj['status']}, {obj['stop_reason']}]", err=True)
    if obj["error"]:
        echo(f"  {obj['error']}", err=True)
    for request in obj["requests"]:
        args = json.dumps(request["arguments"], sort_keys=True)
        echo(f"  waiting: {request['kind']} {request['id']} {request['tool']} {args}", err=True)


@cli.group()
def runs() -> None:
    """Inspect and operate runs."""


@runs.command("list")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(0, 2**63 - 1))
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def runs_list(limit: int, as_json: bool) -> None:
    """The newest runs."""
    from bot.cli import quick

    settings = None if as_json else quick.read_settings(_config_option())
    rows = None if settings is None else quick.newest_runs(settings, limit)
    if rows is not None:
        lines = [
            render.run_line(
                row.id, quick.moment(row.created_at), row.status, row.stop_reason, row.prompt
            )
            for row in rows
        ]
        _print_runs(lines)
        return

    async def work(store: Store) -> list[Any]:
        return list(await store.list_runs(limit=limit))

    records = with_reader(work)
    if as_json:
        echo(json.dumps([render.record_object(r) for r in records]))
        return
    _print_runs(
        [
            render.run_line(r.id, r.created_at, r.status.value, r.stop_reason, r.prompt)
            for r in records
        ]
    )


def _print_runs(lines: list[str]) -> None:
    """``runs list``'s table, or "no runs"."""
    if not lines:
        echo("no runs")
        return
    echo(render.RUNS_HEADER)
    for line in lines:
        echo(line)


@runs.command("show")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def runs_show(run_id: str, as_json: bool) -> None:
    """A run's transcript and terminal result."""
    from bot.journal.fold import fold

    async def work(store: Store) -> tuple[dict[str, Any], str]:
        record = await store.get_run(run_id)
        state = fold(await store.load(run_id), run_id)
        closed = await _closed_requests(store, run_id)
        return render.run_object(record, state, closed), render.transcript(record, state)

    obj, text = with_reader(work)
    echo(json.dumps(obj, indent=2, sort_keys=True) if as_json else text)


@runs.command("export")
@click.argument("run_id")
@click.option(
    "--html",
    "html_file",
    required=True,
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="The file to write.",
)
@one_line_errors
def runs_export(run_id: str, html_file: Path) -> None:
    """A run's page as one self-contained HTML file, for an incident report."""
    from adapters.web.export import write_export
    from bot.chat.service import ChatService
    from bot.run.supervisor import Supervisor

    partial = html_file.with_name(f".{html_file.name}.partial")

    async def work(rt: Runtime) -> int:
        # Written as it is read (bounded memory), to a file beside the target that replaces
        # it once complete: an unknown run or a failure leaves no half-written file behind.
        with partial.open("w", encoding="utf-8") as out:
            await write_export(ChatService(Supervisor(rt)), run_id, out.write)
            return out.tell()

    try:
        size = with_runtime(work)
        partial.replace(html_file)
    except OSError as exc:
        fail(f"cannot write {html_file}: {exc.strerror or exc}")
        sys.exit(EXIT_USAGE)
    finally:
        partial.unlink(missing_ok=True)
    echo(f"wrote {html_file} ({size:,} bytes)", err=True)


@runs.command("resume")
@click.argument("run_id")
@click.option("--force", is_flag=True, help="Resume although the model, tools or prompt changed.")
@click.option("--json", "as_json", is_flag=True)
@as_option("Who resumes (the requester or on-call).")
@one_line_errors
def runs_resume(run_id: str, force: bool, as_json: bool, user: str | None) -> None:
    """Continue a suspended run from its journal."""
    from bot.chat.service import ChatService
    from bot.people.policy import Actor
    from bot.run.supervisor import Supervisor

    async def work(rt: Runtime) -> dict[str, Any]:
        supervisor = Supervisor(rt)
        chat = ChatService(supervisor)
        _suspend_on_signals(supervisor, received)
        live = await chat.resume(run_id, user=Actor(terminal_user(user)), force=force)
        if live is None:
            if not await chat.ended(run_id):
                echo("the run still waits for an answer (kestrel runs pending)", err=True)
        else:
            await chat.wait(live)
            if live.error:
                raise Failure(live.error)
        return await _run_object(rt, run_id)

    received: list[int] = []
    obj = with_runtime(work)
    _print_run(obj, as_json)
    _exit_if_signalled(received)


@runs.command("cancel")
@click.argument("run_id")
@as_option("Who cancels (the requester or on-call).")
@one_line_errors
def runs_cancel(run_id: str, user: str | None) -> None:
    """Cancel a run: its requester or on-call (policy.oncall) may; audited either way."""
    from bot.chat.service import ChatService
    from bot.people.policy import Actor
    from bot.run.supervisor import Supervisor

    async def work(rt: Runtime) -> str:
        actor = Actor(terminal_user(user))
        return await ChatService(Supervisor(rt)).cancel(run_id, user=actor)

    echo(with_runtime(work))


# An open request as ``runs pending`` shows it: the request, who may answer it (principals,
# and in words), and why.
Pending = tuple[render.ShownRequest, list[str], str, str]


@runs.command("pending")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def runs_pending(as_json: bool) -> None:
    """Open requests: approvals, questions and uncertain effects."""
    from datetime import UTC, datetime

    from bot.cli import quick

    settings = quick.read_settings(_config_option())
    rows: Sequence[Pending] | None = None if settings is None else quick.pending(settings)
    if rows is None:
        rows = _pending_in_full()
    if as_json:
        objects = [
            render.request_object(request)
            | {"run_id": request.run_id, "may_answer": who, "note": note}
            for request, who, _phrase, note in rows
        ]
        echo(json.dumps(objects))
        return
    now = datetime.now(UTC)
    for request, _who, phrase, note in rows:
        echo(render.pending_line(request, phrase, now, note))
    if not rows:
        echo("no open requests")


def _pending_in_full() -> list[Pending]:
    """``runs pending``'s rows the full way: the settings validated whole, the catalogs read for
    their tags, the store opened."""
    from bot.chat.service import pending_requests
    from bot.cli import compose
    from bot.people.policy import Policy

    settings = settings_of(click.get_current_context())
    flags_of = compose.tool_flags(settings)  # the catalog's flags (tags) pick approvers
    policy = Policy(settings.policy)

    async def work(store: Store) -> list[PendingRequest]:
        return await pending_requests(store, policy, flags_of)

    return [
        (
            p.request,
            list(p.may_answer),
            policy.may_answer_phrase(p.request, flags_of(p.request.tool)),
            p.note,
        )
        for p in with_reader(work)
    ]


def _decide(run_id: str, request_id: str, kind: DecisionKind, text: str, user: str | None) -> None:
    from bot.chat.service import ChatService
    from bot.people.policy import Actor
    from bot.run.supervisor import Supervisor

    async def work(rt: Runtime) -> str:
        supervisor = Supervisor(rt)
        chat = ChatService(supervisor)
        _suspend_on_signals(supervisor, received)
        actor = Actor(terminal_user(user))
        decided = await chat.decide(run_id, request_id, kind, user=actor, text=text)
        if not decided.accepted:
            raise Failure(decided.message)
        if decided.resumed is not None:
            await chat.wait(decided.resumed)
        elif not await chat.ended(run_id):
            obj = await _run_object(rt, run_id)
            return "\n".join([decided.message, *_next_requests(obj)])
        obj = await _run_object(rt, run_id)
        said = f"{decided.message}; run {run_id} is now {obj['status']}" + (
            f": {obj['text']}" if obj["text"] else ""
        )
        return "\n".join([said, *_next_requests(obj)])

    received: list[int] = []
    echo(with_runtime(work))
    _exit_if_signalled(received)


# How each kind of request is answered from the command line.
_ANSWER_WITH = {
    "wait_approval": "kestrel runs approve {run} {id} (or deny)",
    "wait_user": "kestrel runs answer {run} {id} {text}",
    "wait_effect": "kestrel runs effect {run} {id} retry|done|failed",
}


def _next_requests(obj: dict[str, Any]) -> list[str]:
    """The requests a run waits on now, each with its id and the command that answers it."""
    lines = []
    for request in obj["requests"]:
        args = json.dumps(request["arguments"], sort_keys=True)
        text = "|".join(request["options"]) or "TEXT"
        how = _ANSWER_WITH.get(request["kind"], "")
        how = how.format(run=obj["run_id"], id=request["id"], text=text)
        lines.append(f"  waiting: {request['kind']} {request['id']} {request['tool']} {args}")
        lines.append(f"    {how}" if how else "")
    return [line for line in lines if line]


@runs.command("approve")
@click.argument("run_id")
@click.argument("request_id")
@click.option("--always", is_flag=True, help="Approve this tool for the rest of the run.")
@as_option("Who approves.")
@one_line_errors
def runs_approve(run_id: str, request_id: str, always: bool, user: str | None) -> None:
    """Approve a waiting call."""
    from bot.domain import DecisionKind

    kind = DecisionKind.APPROVE_ALWAYS if always else DecisionKind.APPROVE
    _decide(run_id, request_id, kind, "", user)


@runs.command("deny")
@click.argument("run_id")
@click.argument("request_id")
@click.option("--reason", default="")
@as_option("Who denies.")
@one_line_errors
def runs_deny(run_id: str, request_id: str, reason: str, user: str | None) -> None:
    """Deny a waiting call; the model reads the reason."""
    from bot.domain import DecisionKind

    _decide(run_id, request_id, DecisionKind.DENY, reason, user)


@runs.command("answer")
@click.argument("run_id")
@click.argument("request_id")
@click.argument("text")
@as_option("Who answers.")
@one_line_errors
def runs_answer(run_id: str, request_id: str, text: str, user: str | None) -> None:
    """Answer a question the run asked."""
    from bot.domain import DecisionKind

    _decide(run_id, request_id, DecisionKind.ANSWER, text, user)


@runs.command("effect")
@click.argument("run_id")
@click.argument("request_id")
@click.argument("choice", type=click.Choice(["retry", "done", "failed"]))
@click.option("--output", default="", help="With done: the output to record.")
@as_option("Who settles it.")
@one_line_errors
def runs_effect(run_id: str, request_id: str, choice: str, output: str, user: str | None) -> None:
    """Settle an effect of uncertain outcome: retry it, or mark it done or failed."""
    from bot.domain import DecisionKind

    _decide(run_id, request_id, DecisionKind(choice), output, user)


@cli.command()
@click.option("--run", "run_id", default=None)
@click.option("--limit", default=200, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@one_line_errors
def audit(run_id: str | None, limit: int, as_json: bool) -> None:
    """Who requested, decided, answered, expired and resumed what."""

    async def work(store: Store) -> list[Any]:
        return list(await store.list_audit(run_id=run_id, limit=limit))

    entries = with_reader(work)
    if as_json:
        echo(json.dumps([render.audit_object(entry) for entry in entries]))
        return
    for entry in entries:
        target = entry.request_id or entry.run_id
        when = f"{entry.at:%Y-%m-%d %H:%M:%S}"
        echo(f"{when}  {entry.actor:<16} {entry.action:<14} {target}  {entry.detail}")


@cli.group()
def tools() -> None:
    """The tool catalog."""


@tools.command("list")
@one_line_errors
def tools_list() -> None:
    """The tools a run gets, with their flags."""
    from bot.cli import compose

    settings = settings_of(click.get_current_context())
    toolset = compose.build_tools(settings, compose.build_isolation(settings))
    for name, tool in toolset.items():
        flags = [
            f for f in ("confirm", "idempotent", "operator_paced", "deny") if getattr(tool.flags, f)
        ]
        click.echo(f"{name:<24} {' '.join(flags) or '-':<28} {tool.description}")


@tools.command("check")
@click.argument("files", nargs=-1, type=click.Path())
@one_line_errors
def tools_check(files: tuple[str, ...]) -> None:
    """Validate catalog FILES (by default the configured catalogs) as one tool set; every
    problem is reported with file and line."""
    from bot.tools.ask_human import ask_human_tools
    from bot.tools.catalog import check_catalogs, check_configured

    # Reserved whether or not human_in_the_loop is on: a catalog must not depend on it being off.
    builtin = [tool.name for tool in ask_human_tools()]
    if files:
        checked = [Path(f) for f in files]
        problems = check_catalogs(checked, reserved=builtin)
    else:
        settings = settings_of(click.get_current_context())
        patterns = settings.tool_patterns()
        checked, problems = check_configured(patterns, settings.base_dir, reserved=builtin)
    for problem in problems:
        echo(problem, err=True)
    if problems:
        sys.exit(1)
    echo(f"{len(checked)} catalog file(s) OK: {', '.join(map(str, checked))}")


@cli.command()
@click.option(
    "--url",
    default="http://127.0.0.1:3000/healthz",
    show_default=True,
    help="The endpoint to ask (/healthz: alive; /readyz: ready for traffic).",
)
@click.option("--timeout", default=5.0, show_default=True, type=click.FloatRange(0.1, 300))
def health(url: str, timeout: float) -> None:
    """Ask a running ``kestrel serve``: exit 0 on 200, else 1 with the answer on one line
    (the container's HEALTHCHECK; a probe where HTTP probes are not available)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status, body = response.status, response.read(4096)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(4096)
    except (OSError, ValueError) as exc:
        fail(f"{url}: {getattr(exc, 'reason', None) or exc}")
        sys.exit(1)
    echo(f"{status} {' '.join(body.decode('utf-8', 'replace').split())}", err=status != 200)
    sys.exit(0 if status == 200 else 1)


def main() -> None:
    """Entry point of the ``kestrel`` script."""
    cli(obj={}, prog_name="kestrel")
