"""A PostgreSQL outage said in two lines: one when connecting first fails, one when it works
again, instead of asyncpg's pool logging a traceback at each of its retries."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Final

import asyncpg

log = logging.getLogger("kestrel.store")

# What connecting raises while the server is away: down, restarting, shutting down, or out of
# reach (refused, reset, timed out, a name that does not resolve). Anything else (a refused
# login, too many connections, a bug) is not an outage and is left to be logged in full.
_UNREACHABLE: Final = (
    OSError,  # TimeoutError and ConnectionError included
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
)
# The logger of asyncpg's pool, which warns with a traceback each time it fails to reconnect
# the connections it keeps open (at 1 s, then backing off).
POOL_LOGGER: Final = "asyncpg.pool"


# OSErrors too, yet the server answered: a certificate or protocol it and we disagree on is
# set-up to fix, not an outage to wait out. Only a handshake the peer cut short is one.
_MISCONFIGURED: Final = ssl.SSLError
_CUT_SHORT: Final = (ssl.SSLEOFError, ssl.SSLZeroReturnError)


def unreachable(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the server is away rather than that something is wrong."""
    if isinstance(exc, _MISCONFIGURED) and not isinstance(exc, _CUT_SHORT):
        return False
    return isinstance(exc, _UNREACHABLE)


class Outage:
    """Whether the server answers, said once when that changes: the first failed connection
    after one that worked, and the next one that works. A first connection that fails is no
    outage: the caller (opening the store) reports it."""

    def __init__(self, label: str, cause: Callable[[BaseException], str]) -> None:
        self._label = label
        self._cause = cause
        self.answered: bool | None = None  # None until a connection was first made

    def failed(self, exc: BaseException) -> None:
        """A connection could not be made; the line when this begins an outage."""
        if not unreachable(exc) or self.answered is not True:
            return
        self.answered = False
        log.warning(
            "%s: unreachable (%s); reconnecting in the background until it answers",
            self._label,
            self._cause(exc),
        )

    def connected(self) -> None:
        """A connection was made; the line when this ends an outage."""
        if self.answered is False:
            log.warning("%s answers again", self._label)
        self.answered = True


class QuietReconnects(logging.Filter):
    """Drops asyncpg's pool records of a failed reconnection while the server is away: the
    store's ``Outage`` says that once. Any other record, and any other error, passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a record carrying an outage's exception."""
        return not (record.exc_info and unreachable(record.exc_info[1]))


def quiet_pool_reconnects() -> None:
    """Install ``QuietReconnects`` on asyncpg's pool logger (once per process)."""
    pool = logging.getLogger(POOL_LOGGER)
    if not any(isinstance(each, QuietReconnects) for each in pool.filters):
        pool.addFilter(QuietReconnects())
