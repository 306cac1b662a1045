"""The cause an operator reads when a platform's API cannot be reached at start."""

from __future__ import annotations

import socket

import aiohttp
import pytest

from adapters.unreachable import unreachable, why


@pytest.mark.parametrize("exc", [TimeoutError(), aiohttp.ServerTimeoutError()])
def test_a_timeout_says_so(exc: BaseException) -> None:
    assert why(exc) == "no answer in time (timed out)"


def test_a_host_that_does_not_resolve_says_so() -> None:
    exc = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert why(exc) == "cannot resolve the host: Name or service not known"


def test_a_refusal_keeps_its_words_on_one_line() -> None:
    exc = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 9)\n")
    assert why(exc) == "[Errno 111] Connect call failed ('127.0.0.1', 9)"


def test_an_exception_without_words_is_named() -> None:
    assert why(aiohttp.ClientConnectionError()) == "ClientConnectionError"


def test_the_platforms_own_api_says_to_check_this_hosts_way_out() -> None:
    exc = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    said = unreachable("slack", "https://slack.com/api/", exc, variable="SLACK_API_URL")
    assert said == (
        "slack: cannot reach https://slack.com/api/: cannot resolve the host: Name or service not"
        " known; check this host's network (DNS, a firewall, a proxy)"
    )


def test_an_api_moved_by_its_variable_says_to_check_the_variable() -> None:
    exc = ConnectionRefusedError(111, "Connect call failed")
    said = unreachable(
        "discord", "http://127.0.0.1:9/api/v10", exc, variable="DISCORD_API_URL", moved=True
    )
    assert said.endswith(": [Errno 111] Connect call failed; check DISCORD_API_URL")
