"""A command's child process as the event loop sees it: its output, its exit and its group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from bot.tools.base import cut, cut_marker

# After the direct child exits, a grandchild may still hold stdout open; wait this long for EOF.
PIPE_GRACE = 1.0


class Capture(asyncio.SubprocessProtocol):
    """Output kept up to a cap; the rest is counted and dropped so the child never blocks.

    A protocol rather than ``Process.wait()``: on Python 3.11 that waits for every pipe to
    close, so a grandchild holding stdout would hide the direct child's exit.
    """

    def __init__(self, cap: int) -> None:
        loop = asyncio.get_running_loop()
        self.cap = cap
        self.kept = bytearray()
        self.total = 0
        self.exited: asyncio.Future[None] = loop.create_future()
        self.eof: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:  # noqa: ARG002
        """Keep what fits under the cap, count the rest."""
        chunk = data.encode() if isinstance(data, str) else data
        self.total += len(chunk)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:  # noqa: ARG002
        """Every holder of the write end has closed it."""
        if not self.eof.done():
            self.eof.set_result(None)

    def process_exited(self) -> None:
        """The direct child exited (and was reaped)."""
        if not self.exited.done():
            self.exited.set_result(None)

    def render(self, status: int) -> str:
        """The output, a truncation marker if any, and the exit status line."""
        cut_short = self.total > self.cap
        kept = cut(bytes(self.kept)) if cut_short else self.kept
        text = kept.decode("utf-8", errors="replace")
        if text and not text.endswith("\n"):
            text += "\n"
        if cut_short:
            text += cut_marker(self.total, len(kept)) + "\n"
        return text + _status_line(status)


def _status_line(status: int) -> str:
    if status >= 0:
        return f"[exit status {status}]"
    try:
        return f"[killed by signal {signal.Signals(-status).name}]"
    except ValueError:
        return f"[killed by signal {-status}]"


def ended_badly(output: str) -> bool:
    """Whether a command's output, as ``render`` made it, ends saying the command failed: a
    non-zero exit status, or a signal. The model reads it as any answer; people watching the
    thread's progress should not see such a call as done."""
    last = output[output.rfind("\n") + 1 :]
    if last.startswith("[killed by signal "):
        return True
    return last.startswith("[exit status ") and last != _status_line(0)


def kill_group(pgid: int) -> None:
    """SIGKILL the group ``pgid`` leads, if it is still there."""
    # The child leads its own session, so its pid is the group id of everything it spawned.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def started(
    spawning: Coroutine[Any, Any, tuple[asyncio.SubprocessTransport, Capture]],
) -> tuple[asyncio.SubprocessTransport, Capture]:
    """The started process; a cancellation (a timeout, an interrupt) that lands while it
    starts still waits for it and kills its whole group: asyncio would kill the direct child
    only, leaving what it already spawned running unrecorded."""
    starting = asyncio.ensure_future(spawning)
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        with contextlib.suppress(OSError):
            transport, capture = await starting
            kill_group(transport.get_pid())
            await within(capture.exited, PIPE_GRACE)
            transport.close()
        raise


async def within(future: asyncio.Future[None], seconds: float | None = None) -> None:
    """Wait up to ``seconds`` (None: no limit) for the future, never cancelling it."""
    await asyncio.wait({future}, timeout=seconds)


async def spawn(
    argv: Sequence[str],
    cap: int,
    *,
    env: Mapping[str, str],
    cwd: str | Path | None = None,
    stdin: int = subprocess.DEVNULL,
) -> tuple[asyncio.SubprocessTransport, Capture]:
    """``argv`` started in a session and group of its own, its output (stdout and stderr
    together) captured up to ``cap`` bytes; OSError if it cannot start."""
    loop = asyncio.get_running_loop()
    spawning = loop.subprocess_exec(
        lambda: Capture(cap),
        *argv,
        start_new_session=True,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
    )
    return await started(spawning)
