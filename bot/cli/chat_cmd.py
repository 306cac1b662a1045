"""``kestrel chat`` and ``kestrel serve``: the terminal and the chat platforms."""

from __future__ import annotations

import functools
import logging
import signal
import sys
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Final

import click

from bot.cli.common import (
    Failure,
    as_option,
    echo,
    in_runtime,
    named_in_commands,
    one_line_errors,
    output_failed,
    plain_range,
    service_errors,
    settings_of,
    terminal_user,
)
from bot.cli.driving import hold_sigterm, on_stop_signals

if TYPE_CHECKING:
    from bot.cli.serving import ChatFront
    from bot.cli.stopping import Stop
    from bot.config.settings import Settings
    from bot.run.runtime import Runtime
    from bot.run.supervisor import Supervisor
    from bot.store import Store


@click.command(short_help="Chat in the terminal; the offline demo without a model.")
@as_option("Your user id in this session.")
@one_line_errors
def chat(user: str | None) -> None:
    """Chat in the terminal (the offline demo when no model endpoint is configured)."""
    import asyncio

    from adapters.console import ConsoleChat, ConsoleIO
    from bot.chat.service import ChatService
    from bot.cli.compose import check_approvable, policy_notices, program_notices, shown_database
    from bot.cli.stopping import Stop, end_on_signals, ending_code
    from bot.logs import CHAT
    from bot.run.supervisor import Supervisor

    if sys.stdout is None:  # closed before the command started (`kestrel chat >&-`)
        raise Failure("stdout is closed: the chat has nowhere to show itself")
    settings = settings_of(click.get_current_context())
    user = terminal_user(user)
    log = logging.getLogger(CHAT)

    async def work(rt: Runtime, stop: Stop) -> tuple[signal.Signals | None, str | None]:
        check_approvable(settings, rt.tools.current())
        supervisor = Supervisor(rt)
        banner = (
            f"Kestrel chat: model {rt.model.provider}/{rt.model.model}, "
            f"{len(rt.tools.current())} tools{_demo_said(settings)}, "
            f"journal {shown_database(settings)}. "
            "/help for commands, Ctrl-D to leave."
            f"\nYou are {user} (--as or KESTREL_USER to change it)."
        )
        notices = _unlogged("kestrel.policy", policy_notices(settings, rt.policy))
        notices += _unlogged("kestrel.tools", program_notices(settings))
        banner += "".join(f"\nnote: {notice}" for notice in notices)
        io = ConsoleIO()
        console = ConsoleChat(
            ChatService(supervisor),
            io,
            user,
            on_stop=stop.take,
            rules=rt.policy.settings,
            acting_as=named_in_commands(user),
        )
        stop.on_first(lambda: _left_by(stop, console.under_way()))
        try:
            await console.run(banner)
        finally:
            await supervisor.shutdown()
        if io.lost is not None:  # the chat ended there: a full disk says so, a reader gone not
            output_failed(sys.stdout, io.lost, "stdout")
        return console.terminated, console.suspended

    async def main() -> tuple[tuple[signal.Signals | None, str | None], Stop]:
        # The stop's rule is serve's, with no grace: a command under way is killed at once.
        stop = Stop(log, STOP_MARGIN_SECONDS)
        stop.started()
        return await in_runtime(lambda rt: work(rt, stop), settings), stop

    try:
        (terminated, suspended), stop = asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        end_on_signals(log)
        click.echo("\naborted", err=True)
        sys.exit(ending_code(signal.SIGINT))
    end_on_signals(log)
    if terminated:  # after a cut short too: the stop got through, its line said what it might not
        echo(_stopped(terminated, suspended), err=True)  # to a terminal that may be gone
    stop.exit_if_cut()
    if terminated:
        sys.exit(ending_code(terminated))


def _stopped(signum: signal.Signals, suspended: str | None) -> str:
    """The chat's last line after a SIGTERM or SIGHUP: whether it suspended a run (its id is
    above)."""
    if suspended is None:
        return f"stopped on {signum.name}: no run was under way"
    return "stopped: the run under way was suspended"


def _left_by(stop: Stop, run_id: str | None) -> None:
    """What the chat's stop does first, named if it is cut short: with it, what it leaves."""
    if run_id is None:
        stop.doing = "closing the journal"
        return
    stop.doing = (
        f"suspending run {run_id}: its lease runs out, then `kestrel runs resume {run_id}`"
        " takes it up"
    )


def _demo_said(settings: Settings) -> str:
    """What the banner adds when the demo's catalog stands in: its tools touch nothing real."""
    return " (the demo's simulated services)" if settings.uses_demo_catalog() else ""


def _unlogged(logger: str, notices: list[str]) -> list[str]:
    """Notices for the banner, unless ``logger`` has just shown them as warnings (``-v``)."""
    return [] if logging.getLogger(logger).isEnabledFor(logging.WARNING) else notices


PLATFORMS = ("slack", "discord")
# How long a stop waits on each store write it can do without (the mark that it is stopping,
# its registration's removal): a silent store made each wait database_timeout_seconds, and the
# stop outlasted the orchestrator's grace.
STOP_NOTE_SECONDS: Final = 5.0
# The whole stop past the tool grace (replica.shutdown_grace_seconds), whatever the store does:
# the runs' suspensions, their hand-back, the registration's removal and the store's close.
# Helm's, Compose's and the unit's 40 s hold the default 20 s grace, this, and the exit.
STOP_MARGIN_SECONDS: Final = 12.0
# Of that margin, what the store's close is kept at least (it has whatever the rest left): a
# close still waiting at the stop's deadline drops its connections.
STOP_CLOSE_SECONDS: Final = 3.0
# How long the runs a stop left (their suspension still being written) are given to fail once
# the store's connections are dropped, so that what they log comes before the stop's last line.
_LEFT_RUNS_SECONDS: Final = 1.0


async def _noted(write: Awaitable[object], until: float | None = None) -> bool:
    """Whether ``write``, a store write a stop can do without, landed in time (within
    ``STOP_NOTE_SECONDS``, and before ``until``, the event loop's time). One that did not is
    left to end by itself: cancelling a PostgreSQL statement waits for the server too."""
    from bot.errors import StoreError
    from bot.waits import time_left, waited

    task = await waited(write, time_left(until, STOP_NOTE_SECONDS))
    if not task.done():
        return False
    if isinstance(task.exception(), StoreError):
        return False
    task.result()  # anything else is a fault of ours: raised
    return True


async def _closed(store: Store, until: float) -> None:
    """Close ``store`` by ``until`` (the event loop's time): a close still waiting on a silent
    server then is cancelled, which drops its connections without a word to the server."""
    import asyncio

    from bot.waits import time_left, waited

    closing = await waited(store.close(), time_left(until))
    if closing.done():
        return
    closing.cancel()
    await asyncio.wait({closing})


async def _left_runs_ended(supervisor: Supervisor) -> None:
    """Give the runs a stop left, whose store connections are gone now, a moment to fail and
    say so; one still waiting for a connection is cancelled as the process ends."""
    import asyncio

    tasks = {live.task for live in supervisor.live.values() if live.task is not None}
    if tasks:
        await asyncio.wait(tasks, timeout=_LEFT_RUNS_SECONDS)


@click.command(short_help="Serve the chat platforms and take work, until stopped.")
@click.argument("platforms", nargs=-1, type=click.Choice(PLATFORMS))
@click.option(
    "--port",
    type=plain_range(click.IntRange(0, 65535)),
    metavar="PORT",
    default=None,
    help="HTTP port: /healthz, the run pages, /metrics, /slack/events [3000; 0: any free].",
)
@click.option(
    "--host", default="127.0.0.1", show_default=True, metavar="HOST", help="HTTP address to bind."
)
@service_errors
def serve(platforms: tuple[str, ...], port: int | None, host: str) -> None:
    """Run until stopped: take work from the store, adopt orphaned runs, fire deadlines,
    reminders and scheduled prompts, and serve the chat PLATFORMS named (slack, discord). SIGTERM or
    Ctrl-C suspends live runs and hands them back, within replica.shutdown_grace_seconds + 12 s;
    a second one ends the stop at once, killing a command under way (exit 128+N: 143, 130).

    When it cannot start, it says why in one line on stderr and exits:

    \b
      2   a mistake to mend: bad usage, configuration or secret (restarting cannot help)
      75  the store, Slack, Discord or an MCP server did not answer (EX_TEMPFAIL: restart
          it later)
    """
    # First: the imports below take most of a second, and a SIGTERM during them must be kept.
    hold_sigterm()  # one that comes before the event loop is kept for the stop
    import asyncio

    from bot import __version__
    from bot.cli.compose import check_approvable, load_scanner, shown_database
    from bot.cli.serving import ChatFront, front_settings
    from bot.cli.stopping import Stop, end_on_signals
    from bot.collector import settle_for_service
    from bot.logs import SERVICE
    from bot.records import REPLICA_STOPPING
    from bot.replica.schedule import Scheduler
    from bot.replica.work import WorkTaker
    from bot.run.supervisor import Supervisor
    from bot.text import printable
    from bot.waits import outcome_retrieved, time_left

    settings = settings_of(click.get_current_context())
    # Before the runtime, whose notices would otherwise bury a refusal for a missing token.
    checked = front_settings(platforms, settings.web)
    log = logging.getLogger(SERVICE)
    grace = settings.replica.shutdown_grace_seconds

    async def work(rt: Runtime, stop: Stop) -> None:
        check_approvable(settings, rt.tools.current())
        load_scanner(settings)
        stop.started()
        supervisor = Supervisor(rt)
        front = ChatFront(supervisor, checked, host=host, port=port)
        taker = WorkTaker(supervisor, rt.store, inbound=front.chat.inbound)
        scheduler = Scheduler(supervisor, settings.deadlines, settings.schedules, store=rt.store)
        stop.on_first(front.drain)  # /readyz says 503 at once, even before the listener is up
        # A second signal kills the commands under way now, sparing none the grace.
        stop.on_second(lambda: supervisor.interrupt_all(hand_back=True))
        stop.doing = "starting the chat platforms and the listener"
        if not await _started_unless_stopped(front, stop):
            log.warning(
                "stopped on %s while the chat platforms connected: nothing was served",
                signal.Signals(stop.received[0]).name,
            )
            return
        # Named at the signal, not once serve resumes: a second signal read in the same pass
        # of the event loop cuts the stop short before then.
        stop.on_first(functools.partial(_name_under_way, stop, supervisor))
        if stop.event.is_set():
            front.drain()  # stopped while starting: the platforms started since are drained too
        await scheduler.start()
        # What start-up built (modules, schemas, the catalog) lives as long as the process:
        # kept out of the collector's full passes, each of which otherwise held the event
        # loop 20-70 ms (bench.web), while pages, Slack and /healthz waited; and the young
        # passes made rarer, which runs in flight would otherwise pay (bench.w1).
        settle_for_service()
        taking = asyncio.create_task(taker.run())
        # Log records, not prints: with KESTREL_LOG_FORMAT=json every line on stderr is one
        # object. The policy's notices were logged as warnings when the runtime was built.
        # What on-call asks of a replica's log first: which Kestrel, serving what, on which
        # journal (a PostgreSQL server without its password).
        log.info(
            "kestrel serving as %s (version %s; platforms: %s; store: %s)",
            rt.owner,
            __version__,
            ", ".join(checked.platforms) or "none",
            shown_database(settings),
        )
        if settings.uses_demo_catalog():
            log.warning(
                "tools: none set: serving the demo catalog's simulated services; set tools: to"
                " your catalogs (tools: [] for none)"
            )
        if settings.plays_demo_model():
            # A forgotten secret in a deployment: every mention answered by the demo's script.
            log.warning(
                "model: neither OPENAI_API_KEY nor OPENAI_BASE_URL is set: the offline demo"
                " model answers every mention; set one (model.provider: scripted with"
                " model.script plays a script of your own)"
            )
        for line in front.describe():
            log.info("%s", printable(line))  # the names in it come from Slack and Discord
        await stop.event.wait()
        # One deadline for the whole stop, counted from the signal (which may have come while
        # starting), whatever the store does: a silent one made each of its waits a store
        # timeout, and the orchestrator's kill came first.
        ends = stop.ends
        writes_end = ends - STOP_CLOSE_SECONDS
        # Said at once: the drain may take the whole grace, and the orchestrator's kill follows.
        log.info(
            "stopping on %s: not ready from now on; handing back %d live run(s), a command"
            " under way given up to %g s",
            signal.Signals(stop.received[0]).name,
            len(supervisor.live),
            grace,
        )
        # Marked first: through the grace, `kestrel replicas` and a refused resume say that its
        # leases run out rather than that it drives their runs. Not waited for: a silent
        # store would hold the grace back.
        noting = asyncio.ensure_future(rt.store.heartbeat(rt.owner, REPLICA_STOPPING))
        noting.add_done_callback(outcome_retrieved)
        taker.stop()
        await scheduler.stop()
        for run_id in await supervisor.shutdown(tool_grace=grace, hand_back=True, until=writes_end):
            stop.doing = "handing the suspended runs back"
            # Handed back: another replica goes on. Not queued, it is adopted as handed back.
            if not await _noted(taker.submit_resume(run_id), writes_end):
                break
        stop.doing = "closing the listener, the platforms and the store"
        await front.stop()
        taking.cancel()
        taking.add_done_callback(outcome_retrieved)
        # Not past the bound: a store statement it waits on may take as long to cancel.
        await asyncio.wait({taking}, timeout=time_left(writes_end, STOP_NOTE_SECONDS))
        # Stopped cleanly: gone from `kestrel replicas` at once, not a minute later (with the
        # store away, it drops off once its heartbeat is a minute old). Not while the mark is
        # still on its way, which, landing after, would register it again.
        await _noted(noting, writes_end)
        forgotten = noting.done() and await _noted(rt.store.forget_replica(rt.owner), writes_end)
        await _closed(rt.store, ends)
        await _left_runs_ended(supervisor)
        stop.doing = "closing the model's and the tools' connections, after the stop"
        # Said after a cut short too: the stop got through all the same, and its line said
        # only what it might leave.
        if forgotten:
            log.info("stopped: live runs suspended and their leases released")
            return
        log.warning(
            "stopped, but the store did not answer: this replica's leases run out within %g s,"
            " and the other replicas then take its runs up",
            rt.lease_seconds,
        )

    async def main() -> Stop:
        stop = Stop(log, grace + STOP_MARGIN_SECONDS)
        on_stop_signals(stop.take)
        try:
            await in_runtime(lambda rt: work(rt, stop), settings)
        except asyncio.CancelledError:
            if not stop.cut_start:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            log.warning(
                "stopped on %s while starting: the start-up was cut short at the stop's"
                " deadline (%g s); nothing was served, and a migration under way was rolled"
                " back whole (the next start applies it again)",
                signal.Signals(stop.received[0]).name,
                grace + STOP_MARGIN_SECONDS,
            )
        return stop

    stopped = asyncio.run(main())
    end_on_signals(log)
    stopped.exit_if_cut()


async def _started_unless_stopped(front: ChatFront, stop: Stop) -> bool:
    """Start ``front``; or, when the stop comes while it starts, give its start up at once
    (nothing is served yet: a platform whose API does not answer held the stop for its whole
    deadline, which then ended the process as overdue) and say so with False. A stop that came
    before (while the schema migrated) lets it start, then stops it as usual."""
    import asyncio

    if stop.event.is_set():
        await front.start()
        return True
    starting = asyncio.ensure_future(front.start())
    stop.on_first(starting.cancel)  # at once, if the signal came already
    await asyncio.wait({starting})
    if not starting.cancelled():
        starting.result()  # a token refused, a port taken: raised as before
        return True
    await front.stop()
    return False


def _name_under_way(stop: Stop, supervisor: Supervisor) -> None:
    """Name what the stop waits on first, for the line a cut short says."""
    stop.doing = _under_way(supervisor)


def _under_way(supervisor: Supervisor) -> str:
    """What the stop waits on first: the commands under way (run and tool), or the suspends."""
    tools = [
        f"{tool} (run {run_id})"
        for run_id, live in supervisor.live.items()
        if (tool := live.signals.interrupt.tool_under_way())
    ]
    if not tools:
        return "suspending the live runs"
    return "the grace of the command(s) under way: " + ", ".join(tools)
