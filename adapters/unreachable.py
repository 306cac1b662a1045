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
