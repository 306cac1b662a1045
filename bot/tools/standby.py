"""The isolation helper of a catalog command, started for it, or ahead of it (``Standby``:
``kestrel runs approve``), and sent its command on stdin.

The helper is a fresh interpreter (``bot.tools.confine``): its start is a fifth of an approval
at the command line, spent while the approved command waits. Started with the runtime, it
starts on another core while Kestrel loads the run, and waits on stdin. The first command takes
it (``take``): the command's folder, environment and argv go down the pipe, and only then are
the secret files covered (as they are then: the wait may outlast a model's turn, and a file
replaced or a link led elsewhere meanwhile is covered as a helper started then would cover it)
and anything run. A helper nothing takes is killed with the runtime; one that outlives a killed
Kestrel reads the end of stdin, or part of a command, and runs nothing.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from bot.tools.base import DEFAULT_MAX_OUTPUT
from bot.tools.child import PIPE_GRACE, Capture, kill_group, spawn, within
from bot.tools.isolation import Isolation, command_message

# The helper's own environment: the command's is sent with the command.
_HELPER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


class Standby:
    """A helper that waits for one command; the first ``take`` has it, or ``close`` ends it."""

    def __init__(self, isolation: Isolation) -> None:
        self._isolation = isolation
        self._started: tuple[asyncio.SubprocessTransport, Capture] | None = None

    @property
    def pid(self) -> int | None:
        """The standing helper's process id (its group's too); None if none stands."""
        return None if self._started is None else self._started[0].get_pid()

    async def start(self) -> None:
        """Start the helper (it waits for its command, then covers the files); a failure
        leaves none standing, and the command then starts its own helper, which says what
        failed."""
        try:
            self._started = await spawn_helper(self._isolation)
        except OSError:
            self._started = None

    def take(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | Path, cap: int
    ) -> tuple[asyncio.SubprocessTransport, Capture] | None:
        """The helper, now running ``argv`` with ``env`` in ``cwd`` and keeping ``cap`` bytes of
        its output; None if there is none to take (taken, never started, or gone)."""
        message = command_message(argv, env, cwd)  # before the take: it may raise
        standing, self._started = self._started, None
        if standing is None:
            return None
        transport, capture = standing
        if capture.exited.done() or not _running(transport.get_pid()):
            transport.close()
            return None
        give(transport, capture, message, cap)
        return standing

    async def close(self) -> None:
        """End a helper nothing took: it has run nothing, so its group is killed."""
        standing, self._started = self._started, None
        if standing is None:
            return
        transport, capture = standing
        kill_group(transport.get_pid())
        await within(capture.exited, PIPE_GRACE)
        transport.close()


async def spawn_helper(isolation: Isolation) -> tuple[asyncio.SubprocessTransport, Capture]:
    """A helper for ``isolation``, waiting for its command on stdin; OSError if none starts.
    Its output is kept up to the default cap, its own words if it fails before its command."""
    return await spawn(
        isolation.wrap([]), DEFAULT_MAX_OUTPUT, env=_HELPER_ENV, stdin=subprocess.PIPE
    )


def give(
    transport: asyncio.SubprocessTransport, capture: Capture, message: bytes, cap: int
) -> None:
    """Send a waiting helper its command (``command_message``); keep ``cap`` bytes of output."""
    capture.cap = cap
    stdin = transport.get_pipe_transport(0)
    assert isinstance(stdin, asyncio.WriteTransport)  # started with stdin=PIPE
    stdin.write(message)
    stdin.close()


def _running(pid: int) -> bool:
    """Whether our child ``pid`` has not exited, asked of the kernel: the loop hears of an exit
    a moment later, and a command handed to a helper already dead would read as killed."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:  # reaped already
        return False
