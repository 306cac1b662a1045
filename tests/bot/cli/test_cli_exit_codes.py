"""``kestrel run``'s exit status says how the run stopped: scripts can tell failure from success."""

from __future__ import annotations

import errno
import json
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from bot.cli.common import (
    EXIT_CANCELLED,
    EXIT_COMPLETED,
    EXIT_FAILED,
    EXIT_SUSPENDED,
    EXIT_TEMPFAIL,
    exit_status,
    not_answering,
)
from bot.config.sources import DATABASE_VARIABLE as DATABASE
from bot.domain import RunStatus
from bot.errors import StoreError
from tests.bot.cli.test_cli import kestrel, one_line_error, write_config
from tests.fakes.serving import free_port


def test_a_completed_run_exits_0(tmp_path: Path) -> None:
    result = kestrel(tmp_path, "run", "checkout is failing", "--json")
    assert json.loads(result.stdout)["status"] == "completed"
    assert result.returncode == 0, result.stderr


def test_a_failed_run_exits_1_with_its_result_still_printed(tmp_path: Path) -> None:
    write_config(tmp_path, budgets={"max_iterations": 1})
    result = kestrel(tmp_path, "run", "checkout is failing", "--json")
    obj = json.loads(result.stdout)
    assert (obj["status"], obj["stop_reason"]) == ("failed", "iteration_limit")
    assert result.returncode == 1, result.stderr
    plain = kestrel(tmp_path, "run", "checkout is failing")
    assert plain.returncode == 1
    assert "failed, iteration_limit" in plain.stderr


def test_a_deferred_run_exits_3(tmp_path: Path) -> None:
    result = kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json")
    assert json.loads(result.stdout)["status"] == "suspended"
    assert result.returncode == 3, result.stderr


def test_a_refused_start_is_still_the_usage_status(tmp_path: Path) -> None:
    write_config(tmp_path, policy={"requesters": ["U0ALLOWED"]})
    assert "may not start runs" in one_line_error(kestrel(tmp_path, "run", "hi", "--as", "U0X"))


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (RunStatus.COMPLETED, EXIT_COMPLETED),
        (RunStatus.FAILED, EXIT_FAILED),
        (RunStatus.CANCELLED, EXIT_CANCELLED),
        (RunStatus.SUSPENDED, EXIT_SUSPENDED),
        (RunStatus.RUNNING, EXIT_SUSPENDED),  # taken over: it goes on elsewhere, not done here
    ],
)
def test_every_status_has_its_own_code(status: RunStatus, code: int) -> None:
    assert exit_status(status.value) == code
    assert len({EXIT_COMPLETED, EXIT_FAILED, 2, EXIT_SUSPENDED, EXIT_CANCELLED}) == 5


def test_the_codes_are_documented_in_help(tmp_path: Path) -> None:
    shown = kestrel(tmp_path, "run", "--help").stdout
    for line in ("0  completed", "1  failed", "2  not run", "3  suspended", "4  cancelled"):
        assert line in shown, shown


def test_serve_with_a_bad_configuration_exits_2_which_no_restart_retries(tmp_path: Path) -> None:
    # systemd's RestartPreventExitStatus=2: a mistake in the file stops the unit, loudly.
    write_config(tmp_path, budgets={"max_iterations": "many"})
    line = one_line_error(kestrel(tmp_path, "serve", "--port", "0"))
    assert "max_iterations" in line, line


def test_serve_whose_store_does_not_answer_exits_75_to_be_started_again(tmp_path: Path) -> None:
    # PostgreSQL down at start (a host booting, a failover): EX_TEMPFAIL, which the unit's
    # Restart=on-failure retries, unlike 2. Nobody listens on the port.
    closed = f"postgresql://kestrel:secret@127.0.0.1:{free_port()}/kestrel"
    result = kestrel(tmp_path, "serve", "--port", "0", env={DATABASE: closed})
    assert result.returncode == EXIT_TEMPFAIL == 75, result.stderr
    assert "Traceback" not in result.stderr and "secret" not in result.stderr
    assert "127.0.0.1" in result.stderr.strip().splitlines()[-1], result.stderr


@contextmanager
def http_status_server(status: int) -> Iterator[str]:
    """An HTTP server that answers every request with ``status`` (a gateway before an MCP
    server down, or refusing a token); yields its URL."""

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_DELETE = do_POST

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mcp"
    finally:
        server.shutdown()
        server.server_close()


def serve_with_mcp(folder: Path, server: dict[str, object]) -> tuple[int, str]:
    """``kestrel serve`` with ``server`` its one MCP server: its exit status and its last line."""
    write_config(folder, tools=[], mcp_servers=[{"name": "ops", "timeout": 2, **server}])
    result = kestrel(folder, "serve", "--port", "0")
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stderr.strip().splitlines()[-1]


def test_serve_whose_mcp_server_does_not_answer_exits_75_to_be_started_again(
    tmp_path: Path,
) -> None:
    # An MCP server is a dependency like the store: one that is not up yet when the host boots
    # must not leave the unit failed for good (RestartPreventExitStatus=2).
    closed = f"http://127.0.0.1:{free_port()}/mcp"
    code, line = serve_with_mcp(tmp_path, {"transport": "http", "url": closed})
    assert code == EXIT_TEMPFAIL, line
    assert line.startswith("kestrel: mcp_servers: MCP server ops: cannot start:"), line
    with http_status_server(503) as down:
        code, line = serve_with_mcp(tmp_path, {"transport": "http", "url": down})
    assert (code, line) == (
        EXIT_TEMPFAIL,
        "kestrel: mcp_servers: MCP server ops: cannot start: MCPError: Server returned an error"
        " response (HTTP 503)",
    )
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    code, line = serve_with_mcp(tmp_path, {"transport": "stdio", "command": silent})
    assert code == EXIT_TEMPFAIL, line
    assert line == "kestrel: mcp_servers: MCP server ops: no answer within 2s"


def test_serve_whose_mcp_server_refuses_or_is_missing_exits_2(tmp_path: Path) -> None:
    # A server that answered "no" (a token refused), or a command that is not there: no
    # restart mends either. The status the server gave is said, not only "an error response".
    with http_status_server(401) as refusing:
        code, line = serve_with_mcp(tmp_path, {"transport": "http", "url": refusing})
    assert (code, line) == (
        2,
        "kestrel: mcp_servers: MCP server ops: cannot start: MCPError: Server returned an error"
        " response (HTTP 401)",
    )
    missing = [str(tmp_path / "no-such-server")]
    code, line = serve_with_mcp(tmp_path, {"transport": "stdio", "command": missing})
    assert code == 2 and "FileNotFoundError" in line, line


def test_serve_with_a_malformed_store_address_exits_2(tmp_path: Path) -> None:
    # The store's own settings are configuration: no restart makes a bad DSN good.
    line = one_line_error(kestrel(tmp_path, "serve", "--port", "0", env={DATABASE: "mysql://x/y"}))
    assert "postgresql://" in line, line


def test_run_keeps_2_when_its_store_does_not_answer(tmp_path: Path) -> None:
    # Documented as "2: not run" for scripts; a one-shot command has no restart policy to tell.
    closed = f"postgresql://kestrel:pw@127.0.0.1:{free_port()}/kestrel"
    one_line_error(kestrel(tmp_path, "run", "hi", env={DATABASE: closed}))


@pytest.mark.parametrize(
    ("cause", "retried"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), True),
        (TimeoutError("no connection within 10 s"), True),
        (socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"), True),
        (OSError(errno.EHOSTUNREACH, "No route to host"), True),
        (PermissionError(errno.EACCES, "Permission denied"), False),  # a secret file of ours
        (FileNotFoundError(errno.ENOENT, "No such file"), False),
        (ValueError("invalid port"), False),
    ],
)
def test_only_a_dependency_not_answering_is_worth_a_restart(
    cause: Exception, retried: bool
) -> None:
    error = StoreError("PostgreSQL: connect failed")
    error.__cause__ = cause
    assert not_answering(error) is retried
    assert not not_answering(StoreError("PostgreSQL DSN must start with postgresql://"))


def test_serve_says_its_two_codes_in_help(tmp_path: Path) -> None:
    shown = kestrel(tmp_path, "serve", "--help").stdout
    assert "2   a mistake to mend" in shown, shown
    assert "75  the store, Slack, Discord or an MCP" in shown, shown


def test_serve_whose_postgresql_answers_no_such_database_exits_2(tmp_path: Path) -> None:
    # The server answered: the database named does not exist, which no restart creates.
    from tests.storage.conftest import postgres_dsn

    named = urlsplit(postgres_dsn())._replace(path="/kestrel_no_such_database").geturl()
    result = kestrel(tmp_path, "serve", "--port", "0", env={DATABASE: named})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "does not exist" in result.stderr.strip().splitlines()[-1], result.stderr
