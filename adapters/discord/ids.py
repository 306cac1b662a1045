"""The opaque ids Kestrel's Discord messages carry, and the session id of a thread.

A component's ``custom_id`` comes back from Discord as the client sent it, so it names only
*what* is answered (a request id, an option's index), never who may answer: the core decides
that from the store and the policy. Every custom id fits Discord's 100 characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

# One template per kind of component; ``req`` is a core id (``req_…``), ``n`` an option index.
_REQ: Final = r"(?P<req>[A-Za-z0-9][A-Za-z0-9_.-]{0,79})"
APPROVE: Final = rf"kestrel:approve:{_REQ}"
APPROVE_RUN: Final = rf"kestrel:approve_run:{_REQ}"
DENY: Final = rf"kestrel:deny:{_REQ}"
STEP_BY_STEP: Final = rf"kestrel:step_by_step:{_REQ}"
ANSWER: Final = rf"kestrel:answer:{_REQ}"
ARGUMENTS: Final = rf"kestrel:arguments:{_REQ}"  # shows, never decides
# An option's button ends in its index; a menu of options (25 a menu) in ``mN``.
CHOOSE: Final = rf"kestrel:choose:{_REQ}(?::(?P<n>[0-9]{{1,3}})|:m(?P<menu>[0-9]))"
EFFECT: Final = rf"kestrel:effect:(?P<verb>retry|done|failed):{_REQ}"

DENY_MODAL: Final = "kestrel:deny_modal"
ANSWER_MODAL: Final = "kestrel:answer_modal"


def custom_id(kind: str, request_id: str, extra: str = "") -> str:
    """``kestrel:KIND:REQUEST[:EXTRA]`` (KIND: approve, approve_run, step_by_step, deny,
    answer, arguments, choose, effect); ``effect`` takes its verb first:
    ``kestrel:effect:VERB:REQUEST``."""
    if kind == "effect":
        return f"kestrel:effect:{extra}:{request_id}"
    return f"kestrel:{kind}:{request_id}" + (f":{extra}" if extra else "")


@dataclass(frozen=True)
class DiscordThread:
    """Where a Discord session lives: a guild and a thread (a channel id)."""

    guild: str
    thread: str


_SESSION: Final = re.compile(r"discord:([0-9]{1,20}):([0-9]{1,20})")


def thread_session_id(guild: int | str, thread: int | str) -> str:
    """The session id of a Discord thread: ``discord:GUILD:THREAD``."""
    return f"discord:{int(guild)}:{int(thread)}"


def parse_thread_session(session_id: str) -> DiscordThread | None:
    """The thread a session id names; None for another platform's session."""
    match = _SESSION.fullmatch(session_id)
    return DiscordThread(match.group(1), match.group(2)) if match else None
