"""Why a chat platform's API could not be reached, in words an operator can act on: a timeout
says so, though its exception has no text of its own (``slack: cannot reach URL:`` said
nothing after the colon)."""

from __future__ import annotations

import socket


def why(exc: BaseException) -> str:
    """``exc`` as the cause of an unreachable API, on one line and never empty."""
    if isinstance(exc, TimeoutError):  # asyncio's and aiohttp's timeouts too
        return "no answer in time (timed out)"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host: {exc.strerror}"
    return " ".join(str(exc).split()) or type(exc).__name__


def unreachable(
    platform: str, url: str, exc: BaseException, *, variable: str, moved: bool = False
) -> str:
    """The line a replica stops with when ``platform``'s API at ``url`` cannot be reached, and
    what to check: the ``variable`` that ``moved`` it from the platform's own, or else the way
    out of this host."""
    check = f"check {variable}" if moved else "check this host's network (DNS, a firewall, a proxy)"
    return f"{platform}: cannot reach {url}: {why(exc)}; {check}"
