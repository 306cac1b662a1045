"""A PostgreSQL outage in two lines, and asyncpg's pool quiet about it alone (no server needed)."""

from __future__ import annotations

import logging
import ssl

import asyncpg
import pytest

from storage.postgres_outage import POOL_LOGGER, Outage, QuietReconnects, quiet_pool_reconnects

LABEL = "PostgreSQL kestrel@db/kestrel"


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "kestrel.store"]


def test_an_outage_is_said_when_it_begins_and_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = Outage(LABEL, str)
    caplog.set_level(logging.WARNING)
    outage.connected()
    for _ in range(5):
        outage.failed(ConnectionRefusedError(111, "Connection refused"))
    outage.connected()
    outage.connected()

    assert said(caplog) == [
        f"{LABEL}: unreachable ([Errno 111] Connection refused);"
        " reconnecting in the background until it answers",
        f"{LABEL} answers again",
    ]


def test_a_first_connection_that_fails_is_no_outage(caplog: pytest.LogCaptureFixture) -> None:
    # Opening the store fails with the store's error: a line more would say it twice.
    outage = Outage(LABEL, str)
    caplog.set_level(logging.WARNING)
    outage.failed(ConnectionRefusedError(111, "Connection refused"))
    outage.connected()

    assert said(caplog) == []


def test_an_error_that_is_no_outage_is_not_said_as_one(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage(LABEL, str)
    caplog.set_level(logging.WARNING)
    outage.connected()
    outage.failed(asyncpg.InvalidPasswordError("password authentication failed"))

    assert said(caplog) == []


def test_a_refused_certificate_is_no_outage(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage(LABEL, str)
    caplog.set_level(logging.WARNING)
    outage.connected()
    outage.failed(ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] expired"))

    assert said(caplog) == []


def pool_record(exc: BaseException | None) -> logging.LogRecord:
    """A record as asyncpg's pool logs a failed reconnection (``exc_info=True``)."""
    info = None if exc is None else (type(exc), exc, exc.__traceback__)
    return logging.LogRecord(
        POOL_LOGGER,
        logging.WARNING,
        __file__,
        1,
        "Failed to restore the pool connection floor; retrying",
        (),
        info,
    )


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connection refused"),
        ConnectionResetError(104, "Connection reset by peer"),
        ConnectionError("unexpected connection_lost() call"),
        TimeoutError(),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        asyncpg.ConnectionDoesNotExistError("connection was closed"),
        ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),  # the server went away
    ],
)
def test_the_pool_is_quiet_about_an_outage(exc: BaseException) -> None:
    assert not QuietReconnects().filter(pool_record(exc))


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.InvalidPasswordError("password authentication failed"),
        asyncpg.TooManyConnectionsError("too many connections"),
        RuntimeError("a bug"),
        # An OSError, yet a certificate refused: the server answers, the set-up is wrong.
        ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate expired"),
        ssl.SSLError(1, "[SSL: UNSUPPORTED_PROTOCOL] unsupported protocol"),
        None,
    ],
)
def test_the_pool_still_says_what_is_no_outage(exc: BaseException | None) -> None:
    assert QuietReconnects().filter(pool_record(exc))


def test_the_filter_is_installed_once() -> None:
    pool = logging.getLogger(POOL_LOGGER)
    quiet_pool_reconnects()
    quiet_pool_reconnects()

    assert sum(isinstance(each, QuietReconnects) for each in pool.filters) == 1
