"""How a command that drives runs meets signals, and a run as the commands print it (no click:
``kestrel runs approve`` decides without it, ``bot.cli.decisions``)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bot.cli import render
from bot.cli.common import progress

if TYPE_CHECKING:
    from bot.chat.service import ChatService
    from bot.events import Event
    from bot.run.runtime import Runtime
    from bot.run.supervisor import Supervisor
    from bot.store import Store


# SIGTERMs taken by ``hold_sigterm`` before ``on_stop_signals`` took over.
_held: list[int] = []


def hold_sigterm() -> None:
    """Until ``on_stop_signals`` takes over, keep a SIGTERM for it. Without a handler the
    signal kills a process at once, and PID 1 (a container's ``kestrel``) never gets it at
    all: a replica told to stop while it started would start anyway, and be killed later."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: _held.append(signum))


def on_stop_signals(handler: Callable[[int], object]) -> None:
    """Call ``handler(signum)`` on SIGINT, SIGTERM and SIGHUP instead of dying mid-write; at
    once for a SIGTERM held since ``hold_sigterm``."""
    import asyncio

    loop = asyncio.get_running_loop()
    for signum in stop_signals():
        loop.add_signal_handler(signum, handler, signum)
    held, _held[:] = _held[:1], []
    for taken in held:
        handler(taken)


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals that stop a command. A hang-up (the terminal closed, the ssh session
    dropped) too: killed by it, a run stayed held until its lease ran out, its command still
    running. Not when it is ignored: nohup asked for the command to outlive its terminal."""
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        return (signal.SIGINT, signal.SIGTERM)
    return (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def suspend_on_signals(supervisor: Supervisor, received: list[int]) -> None:
    """On SIGINT, SIGTERM or SIGHUP, stop the runs this command drives now (their tools
    killed): they suspend and give their leases up; ``received`` collects the signal."""

    def stop(signum: int) -> None:
        received.append(signum)
        supervisor.interrupt_all()

    on_stop_signals(stop)


def driving_chat(rt: Runtime, received: list[int]) -> ChatService:
    """The chat service this command drives runs through: over a supervisor of ``rt`` whose
    runs suspend on a stop signal (``suspend_on_signals``), each model wait said on stderr
    (``say_model_waits``)."""
    # Imported once the runtime is built: a helper standing by starts before them.
    from bot.chat.service import ChatService
    from bot.run.supervisor import Supervisor

    say_model_waits(rt)
    supervisor = Supervisor(rt)
    suspend_on_signals(supervisor, received)
    return ChatService(supervisor)


def say_model_waits(rt: Runtime) -> None:
    """Say on stderr each wait before a model call is tried again (a rate limit's can hold a
    run a minute, the terminal silent meanwhile as if the command hung), unless the log says
    it already: the provider logs each wait at warning (``-v``, ``KESTREL_LOG_LEVEL``)."""
    import logging

    if logging.getLogger("kestrel.llm").isEnabledFor(logging.WARNING):
        return
    rt.events.add(_ModelWaits())


class _ModelWaits:
    """An event sink saying the model's advisories (its waits) as the command's progress."""

    def emit(self, event: Event) -> None:
        """Say a model's advisory; nothing else."""
        from bot.events import AdvisoryEvent

        if isinstance(event, AdvisoryEvent) and event.source == "model":
            progress(event.text)


def exit_if_signalled(received: list[int]) -> None:
    """Exit 128+N when signal N stopped the command."""
    # The run was suspended with its lease released; the shell's convention for the code.
    if received:
        sys.exit(128 + received[0])


async def run_object(rt: Runtime, run_id: str) -> dict[str, Any]:
    """The run as ``kestrel run --json`` prints it."""
    from bot.journal.fold import fold

    record = await rt.store.get_run(run_id)
    state = fold(await rt.store.load(run_id), run_id)
    return render.run_object(record, state, await closed_requests(rt.store, run_id))


async def closed_requests(store: Store, run_id: str) -> list[render.ClosedRequest]:
    """The run's requests that were decided, expired or cancelled, oldest first, each with
    everyone who approved it when several did (the store is read for these alone)."""
    from bot.domain import approved_by_several
    from bot.kinds import RequestStatus

    closed: list[render.ClosedRequest] = []
    for request, status, decision in await store.list_requests(run_id=run_id, status=None):
        if status is RequestStatus.OPEN:
            continue
        several = approved_by_several(request, status, decision)
        approvers = tuple(await store.approvers(request.id)) if several else ()
        closed.append((request, status, decision, approvers))
    return closed
