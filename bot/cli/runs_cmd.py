"""``kestrel runs``: inspect and operate runs."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click

from bot.cli import render
from bot.cli.common import (
    EXIT_USAGE,
    Failure,
    as_option,
    config_option,
    echo,
    exit_status,
    fail,
    known_before_the_key,
    limit_option,
    one_line_errors,
    settings_of,
    terminal_user,
    unheard,
    with_reader,
    with_runtime,
)
from bot.cli.decisions import approval, decide
from bot.cli.driving import closed_requests, driving_chat, exit_if_signalled, run_object
from bot.cli.placing import PlacingGroup
from bot.cli.run_cmd import print_run

if TYPE_CHECKING:
    from bot.chat.service import PendingRequest
    from bot.domain import Request
    from bot.run.runtime import Runtime
    from bot.store import Store


# What a resumed run that is still suspended waits on: any of the three, as `run --help` says.
WAITS: Final = "the run still waits for an approval, an answer or on-call (kestrel runs pending)"


@click.group(cls=PlacingGroup)
def runs() -> None:
    """Inspect and operate runs."""


@runs.command("list")
@limit_option(20)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (its schema: docs/configuration.md)."
)
@one_line_errors
def runs_list(limit: int, as_json: bool) -> None:
    """The newest runs."""
    from bot.cli import quick

    settings = None if as_json else quick.read_settings(config_option())
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
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (its schema: docs/configuration.md)."
)
@one_line_errors
def runs_show(run_id: str, as_json: bool) -> None:
    """A run's transcript and terminal result."""
    from bot.journal.fold import fold

    async def work(store: Store) -> tuple[dict[str, Any], str]:
        record = await store.get_run(run_id)
        state = fold(await store.load(run_id), run_id)
        closed = await closed_requests(store, run_id)
        return render.run_object(record, state, closed), render.transcript(record, state, closed)

    obj, text = with_reader(work)
    echo(json.dumps(obj, indent=2, sort_keys=True) if as_json else text)


@runs.command("export", short_help="A run's page as one HTML file, for an incident report.")
@click.argument("run_id")
@click.option(
    "--html",
    "html_name",
    required=True,
    # Kept as written: a Path of "" is ".", and an empty name would be said as the folder.
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    help="The file to write; - for stdout.",
)
@one_line_errors
def runs_export(run_id: str, html_name: str) -> None:
    """A run's page as one self-contained HTML file, for an incident report."""
    from adapters.web.export import write_export
    from bot.chat.service import RunReads
    from bot.cli import compose
    from bot.people.policy import Policy

    if not html_name.strip():  # a script's --html "$OUT" with the variable unset
        raise Failure("--html: the path is empty: name the file to write, or - for stdout")
    # stdout, as ``run -`` reads stdin: not a file named "-"
    html_file = Path("/dev/stdout" if html_name == "-" else html_name)
    settings = settings_of(click.get_current_context())
    # The store alone, read only, as `runs show` reads it: no model (nor its key), no tool.
    flags_of = compose.tool_flags(settings)  # the catalog's flags (tags) pick approvers
    policy = Policy(settings.policy)

    def who_may_answer(request: Request) -> tuple[str, ...]:
        flags = flags_of(request.tool)
        return tuple(policy.who_may_answer(request, flags, flags_of))

    def phrase_of(request: Request) -> str:
        return policy.may_answer_phrase(request, flags_of(request.tool), flags_of)

    # A link's target is what is written, not the link; a pipe or a device (/dev/stdout) is
    # written to as it is: a file renamed over it would replace it.
    through = html_file.exists() and not html_file.is_file()
    target = html_file if through else html_file.resolve()
    partial = target if through else target.with_name(f".{target.name}.partial")

    async def work(store: Store) -> int:
        # Written as it is read (bounded memory), to a file beside the target that replaces
        # it once complete: an unknown run or a failure leaves no half-written file behind.
        size = 0
        with partial.open("wb") as out:

            def write(text: str) -> None:
                nonlocal size
                data = text.encode()
                out.write(data)
                size += len(data)

            await write_export(RunReads(store, who_may_answer, phrase_of), run_id, write)
        return size

    try:
        size = with_reader(work)
        if not through:
            partial.replace(target)
    except OSError as exc:
        if through and unheard(exc):
            return  # written through a pipe whose reader left (``| head``): nothing to say
        fail(f"cannot write {html_file}: {exc.strerror or exc}")
        sys.exit(EXIT_USAGE)
    finally:
        # Where nothing can be made (a read-only file system, a path under a file), there is
        # nothing to remove either, and the failure is said above.
        with contextlib.suppress(OSError):
            if not through:
                partial.unlink(missing_ok=True)
    echo(f"wrote {html_file} ({size:,} bytes)", err=True)


@runs.command("resume")
@click.argument("run_id")
@click.option("--force", is_flag=True, help="Resume although the model, tools or prompt changed.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (its schema: docs/configuration.md)."
)
@as_option("Who resumes (the requester or on-call).")
@one_line_errors
def runs_resume(run_id: str, force: bool, as_json: bool, user: str | None) -> None:
    """Continue a suspended run from its journal."""
    from bot.errors import already_ended
    from bot.people.policy import Actor

    async def work(rt: Runtime) -> dict[str, Any]:
        chat = driving_chat(rt, received)
        live = await chat.resume(run_id, user=Actor(terminal_user(user)), force=force)
        if live is not None:
            await chat.wait(live)
            if live.error:
                raise Failure(live.error)
            return await run_object(rt, run_id)
        obj = await run_object(rt, run_id)
        if not await chat.ended(run_id):
            echo(WAITS, err=True)
        else:  # shown as it ended, and exiting by it, as ``runs show``: said to be no resume
            echo(already_ended(run_id, obj["status"], "resume"), err=True)
        return obj

    received: list[int] = []
    settings = settings_of(click.get_current_context())
    known_before_the_key(settings, run_id)
    obj = with_runtime(work, settings)
    print_run(obj, as_json, terminal_user(user))
    exit_if_signalled(received)
    sys.exit(exit_status(obj["status"]))


@runs.command("cancel", short_help="Cancel a run: its requester or on-call may.")
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

    # A cancel asks no model: on-call cancels from a shell without the model's key.
    echo(with_runtime(work, calls_model=False))


# An open request as ``runs pending`` shows it: the request, who may answer it (principals,
# and in words), and why.
Pending = tuple["render.ShownRequest", list[str], str, str]


@runs.command("pending")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (its schema: docs/configuration.md)."
)
@one_line_errors
def runs_pending(as_json: bool) -> None:
    """Open requests: approvals, questions and uncertain effects."""
    from datetime import UTC, datetime

    from bot.cli import quick

    settings = quick.read_settings(config_option())
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

    return [(p.request, list(p.may_answer), p.phrase, p.note) for p in with_reader(work)]


@runs.command("approve", short_help="Approve a waiting call, or a whole plan.")
@click.argument("run_id")
@click.argument("request_id")
@click.option("--always", is_flag=True, help="Approve this tool for the rest of the run.")
@click.option(
    "--step-by-step", is_flag=True, help="A plan: approve none of it now, ask for each call."
)
@as_option("Who approves.")
@one_line_errors
def runs_approve(
    run_id: str, request_id: str, always: bool, step_by_step: bool, user: str | None
) -> None:
    """Approve a waiting call, or a whole plan (each step once, exactly as shown)."""
    decide(run_id, request_id, approval(always, step_by_step), "", user)


@runs.command("deny", short_help="Deny a waiting call or plan; the model reads why.")
@click.argument("run_id")
@click.argument("request_id")
@click.option("--reason", default="", help="Why: the model reads it.")
@as_option("Who denies.")
@one_line_errors
def runs_deny(run_id: str, request_id: str, reason: str, user: str | None) -> None:
    """Deny a waiting call, or every step of a plan; the model reads the reason."""
    from bot.domain import DecisionKind

    decide(run_id, request_id, DecisionKind.DENY, reason, user)


@runs.command("answer")
@click.argument("run_id")
@click.argument("request_id")
@click.argument("text")
@as_option("Who answers.")
@one_line_errors
def runs_answer(run_id: str, request_id: str, text: str, user: str | None) -> None:
    """Answer a question the run asked."""
    from bot.domain import DecisionKind

    decide(run_id, request_id, DecisionKind.ANSWER, text, user)


@runs.command("effect", short_help="Settle an effect of uncertain outcome.")
@click.argument("run_id")
@click.argument("request_id")
@click.argument("choice", type=click.Choice(["retry", "done", "failed"]))
@click.option("--output", default="", help="With done: the output to record.")
@as_option("Who settles it.")
@one_line_errors
def runs_effect(run_id: str, request_id: str, choice: str, output: str, user: str | None) -> None:
    """Settle an effect of uncertain outcome: retry it, or mark it done or failed."""
    from bot.domain import DecisionKind

    decide(run_id, request_id, DecisionKind(choice), output, user)
