"""``kestrel run``: one prompt headless, and how a command that drives runs meets signals."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from bot.cli import render
from bot.cli.common import (
    Failure,
    as_option,
    echo,
    exit_status,
    one_line_errors,
    terminal_user,
    with_runtime,
)

if TYPE_CHECKING:
    from bot.run.runtime import Runtime
    from bot.run.supervisor import Supervisor
    from bot.store import Store


def on_stop_signals(handler: Callable[[int], object]) -> None:
    """Call ``handler(signum)`` on SIGINT and SIGTERM instead of dying mid-write."""
    import asyncio

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, handler, signum)


def suspend_on_signals(supervisor: Supervisor, received: list[int]) -> None:
    """On SIGINT or SIGTERM, stop the runs this command drives now (their tools killed): they
    suspend and give their leases up; ``received`` collects the signal."""

    def stop(signum: int) -> None:
        received.append(signum)
        supervisor.interrupt_all()

    on_stop_signals(stop)


def exit_if_signalled(received: list[int]) -> None:
    """Exit 128+N when signal N stopped the command."""
    # The run was suspended with its lease released; the shell's convention for the code.
    if received:
        sys.exit(128 + received[0])


@click.command()
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
        suspend_on_signals(supervisor, received)
        await chat.wait(live)
        if live.error:
            raise Failure(live.error)
        return await run_object(rt, live.run_id)

    received: list[int] = []
    obj = with_runtime(work)
    print_run(obj, as_json)
    exit_if_signalled(received)
    sys.exit(exit_status(obj["status"]))


async def run_object(rt: Runtime, run_id: str) -> dict[str, Any]:
    """The run as ``kestrel run --json`` prints it."""
    from bot.journal.fold import fold

    record = await rt.store.get_run(run_id)
    state = fold(await rt.store.load(run_id), run_id)
    return render.run_object(record, state, await closed_requests(rt.store, run_id))


async def closed_requests(store: Store, run_id: str) -> list[render.StoredRequest]:
    """The run's requests that were decided, expired or cancelled, oldest first."""
    from bot.kinds import RequestStatus

    found = await store.list_requests(run_id=run_id, status=None)
    return [item for item in found if item[1] is not RequestStatus.OPEN]


def print_run(obj: dict[str, Any], as_json: bool) -> None:
    """A run's answer on stdout, its status and waits on stderr (or one JSON object)."""
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
