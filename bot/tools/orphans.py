"""A dispatched command's process group, found again after its owner died (Linux ``/proc``).

A command runs in its own process group, which outlives a SIGKILLed owner. The dispatch
journals where the group runs (host, group id, the leader's start time) so the process that
resumes the run can stop a group still running before on-call is asked to retry it. A tool
that leaves its group (``setsid``, a daemon that double-forks) escapes this.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
from pathlib import Path

import msgspec

from bot.domain import ProcessStamp

PROC = Path("/proc")
# How long a killed group may take to disappear before we say it could not be stopped.
_STOP_WAIT = 2.0
_POLL = 0.02


class _Stat(msgspec.Struct, frozen=True):
    state: str
    pgrp: int
    start_ticks: int


@functools.cache
def host_key() -> str:
    """This host as the kernel sees it: name, boot and PID namespace (ids mean nothing across)."""
    boot = _read(PROC / "sys/kernel/random/boot_id").strip()
    try:
        namespace = os.readlink(PROC / "self/ns/pid")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}/{boot}/{namespace}"


def stamp(pgid: int) -> ProcessStamp | None:
    """The stamp of a group whose leader is ``pgid``; None where ``/proc`` cannot tell."""
    stat = _stat(pgid)
    if stat is None:
        return None
    return ProcessStamp(
        host=socket.gethostname(), host_key=host_key(), pgid=pgid, start_ticks=stat.start_ticks
    )


async def end_orphan(orphan: ProcessStamp) -> str:
    """Stop the group if it still runs on this host; say what was found, for on-call."""
    where = f"process group {orphan.pgid} on {orphan.host}"
    if orphan.host_key != host_key():
        return f"it may still be running ({where}): check there before retrying"
    if not members(orphan):
        return f"its {where} had ended"
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(orphan.pgid, signal.SIGKILL)
    for _ in range(int(_STOP_WAIT / _POLL)):
        if not members(orphan):
            break
        await asyncio.sleep(_POLL)  # the group's exit is visible in /proc only: poll it
    if members(orphan):
        return f"its {where} was still running and could not be stopped"
    return f"its {where} was still running and was stopped"


def members(orphan: ProcessStamp) -> list[int]:
    """Live processes of the group (pids); none if the group id now names another group."""
    leader = _stat(orphan.pgid)
    if leader is not None and leader.start_ticks != orphan.start_ticks:
        # A group id is not reused while any member lives: this group is a new one.
        return []
    members = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is not None and stat.pgrp == orphan.pgid and stat.state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _stat(pid: int) -> _Stat | None:
    text = _read(PROC / str(pid) / "stat")
    # The command name may hold spaces and parentheses: fields start after the last one.
    fields = text.rpartition(")")[2].split()
    if len(fields) < 20:
        return None
    return _Stat(state=fields[0], pgrp=int(fields[2]), start_ticks=int(fields[19]))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
