"""What a command does about its terminal: the signals that stop it, and its output once
nobody reads it (the command line and the console chat alike)."""

from __future__ import annotations

import errno
import os
import signal
from typing import TextIO


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals that stop a command. A hang-up (the terminal closed, the ssh session
    dropped) too: killed by it, a run stayed held until its lease ran out, its command still
    running. Not when it is ignored: nohup asked for the command to outlive its terminal."""
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        return (signal.SIGINT, signal.SIGTERM)
    return (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def unheard(exc: OSError) -> bool:
    """Whether a write failed because nobody reads the stream any more: its reader left
    (``| head``: EPIPE), or its terminal hung up (closed, an ssh session dropped: EIO)."""
    return exc.errno in (errno.EPIPE, errno.EIO)


def unread(stream: TextIO) -> None:
    """Send the rest of ``stream`` nowhere: its reader left (``kestrel runs list | head``) or
    its terminal hung up. That ends the output alone, quietly: the command goes on and exits
    with its own status, and Python's last flush of what a failed write left in the stream's
    buffer finds nothing to complain of (it would fail again, and end the process with 120)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    except (OSError, ValueError):  # no descriptor of its own (a test's capture): nothing to flush
        return
