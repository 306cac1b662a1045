"""``bot.logs``: one handler, one level, and the loggers held above or below it."""

from __future__ import annotations

import io
import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot import logs
from tests.fakes.processes import KESTREL, FakeOpenAIProcess, clean_env


@pytest.mark.parametrize("level", [logging.WARNING, logging.ERROR])
def test_serve_says_who_it_is_at_any_level(level: int) -> None:
    stream = io.StringIO()
    logs.configure(level, "json", stream)
    logging.getLogger(logs.SERVICE).info("kestrel serving as %s", "host:1:abc")
    logging.getLogger("kestrel.policy").info("what only info shows")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["level"], line["logger"], line["message"]) for line in lines] == [
        ("info", logs.SERVICE, "kestrel serving as host:1:abc")
    ]


def test_serve_speaks_at_debug_when_asked() -> None:
    stream = io.StringIO()
    logs.configure(logging.DEBUG, "text", stream)
    logging.getLogger(logs.SERVICE).debug("more")
    assert f"DEBUG {logs.SERVICE}: more" in stream.getvalue()


def test_the_schedulers_per_tick_lines_are_debug_only() -> None:
    # serve's sweeps run every poll_seconds (1 s): at info (the chart's and the unit's level)
    # APScheduler's executor said "Running job …" and "… executed successfully" for each,
    # four lines a second. They are heard at debug; its warnings and errors at every level.
    executor = logging.getLogger("apscheduler.executors.default")
    stream = io.StringIO()
    logs.configure(logging.INFO, "text", stream)
    executor.info('Running job "Supervisor.adopt_orphans"')
    executor.warning("Run time of job was missed by 0:00:02")
    assert "Running job" not in stream.getvalue() and "missed" in stream.getvalue()
    stream = io.StringIO()
    logs.configure(logging.DEBUG, "text", stream)
    executor.info('Running job "Supervisor.adopt_orphans"')
    assert "Running job" in stream.getvalue()


def test_the_schedulers_job_lines_are_debug_only() -> None:
    # At info (the chart's and the unit's level) serve began with APScheduler's "Scheduler
    # started" and an "Added job … to job store" line for each sweep, each open request's
    # reminder and deadline and each scheduled prompt, again as each was opened or came round,
    # and ended with "Scheduler has been shut down": its own names for what serve says itself.
    scheduler = logging.getLogger("apscheduler.scheduler")
    stream = io.StringIO()
    logs.configure(logging.INFO, "text", stream)
    scheduler.info('Added job "Scheduler.sweep" to job store "default"')
    scheduler.warning("Execution of job skipped: maximum number of running instances reached")
    assert "Added job" not in stream.getvalue() and "skipped" in stream.getvalue()
    stream = io.StringIO()
    logs.configure(logging.DEBUG, "text", stream)
    scheduler.info('Added job "Scheduler.sweep" to job store "default"')
    assert "Added job" in stream.getvalue()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("amqp://guest:p@ss@rabbit/vhost", "amqp://guest:…@rabbit/vhost"),
        (
            "https://proxy:s3cr3t@proxy.example.com:8080/v1",
            "https://proxy:…@proxy.example.com:8080/v1",
        ),
        ("https://proxy.example.com/v1?a=b@c", "https://proxy.example.com/v1?a=b@c"),
    ],
)
def test_a_urls_password_is_masked_whole_in_a_log_line(url: str, shown: str) -> None:
    """The last "@" before the host ends the password: one holding an "@" is masked whole."""
    record = logging.LogRecord(
        "httpx", logging.INFO, __file__, 1, "HTTP Request: POST %s", (url,), None
    )
    assert logs.TextLines().format(record).endswith(f"httpx: HTTP Request: POST {shown}")
    assert f"POST {shown}" in json.loads(logs.JsonLines().format(record))["message"]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://mcp.example/?token=abc", "https://mcp.example/?token=…"),
        (
            "https://mcp.example/mcp?api_key=k1&region=eu",
            "https://mcp.example/mcp?api_key=…&region=eu",
        ),
        (
            "https://mcp.example/mcp?region=eu&access_token=ya29.a0",
            "https://mcp.example/mcp?region=eu&access_token=…",
        ),
        (
            "https://acct.blob.example/c/b?sv=2022-11-02&sig=AbC%2Fd%3D",
            "https://acct.blob.example/c/b?sv=2022-11-02&sig=…",
        ),
        (
            "https://s3.example/b/k?X-Amz-Signature=9f8e7d",
            "https://s3.example/b/k?X-Amz-Signature=…",
        ),
        (
            "https://bot:hunter22@mcp.example/mcp?Token=abc#top",
            "https://bot:…@mcp.example/mcp?Token=…#top",
        ),
        ("/runs/run_1?exp=1765000000&sig=4f3e2d", "/runs/run_1?exp=1765000000&sig=…"),
        # What names no credential stays: a sort key, a token count, an empty value.
        (
            "https://api.example/items?sort_key=name&page=2",
            "https://api.example/items?sort_key=name&page=2",
        ),
        (
            "https://api.example/x?max_tokens=5&monkey=1",
            "https://api.example/x?max_tokens=5&monkey=1",
        ),
        ("https://api.example/x?token=&a=b", "https://api.example/x?token=&a=b"),
    ],
)
def test_a_urls_query_credentials_are_masked_in_a_log_line(url: str, shown: str) -> None:
    """A query parameter named for a credential (token, sig, an API key) is masked, as the PII
    guard reads one: an HTTP MCP server's URL may carry its token there."""
    record = logging.LogRecord(
        "httpx", logging.INFO, __file__, 1, "HTTP Request: POST %s", (url,), None
    )
    assert logs.TextLines().format(record).endswith(f"httpx: HTTP Request: POST {shown}")
    assert json.loads(logs.JsonLines().format(record))["message"] == f"HTTP Request: POST {shown}"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://mcp.example/mcp?client_id=kestrel&client_secret=Cs-8d7c6b5a",
            "https://mcp.example/mcp?client_id=kestrel&client_secret=…",
        ),
        ("https://mcp.example/mcp?secret=Cs-8d7c6b5a", "https://mcp.example/mcp?secret=…"),
        (
            "https://mcp.example/mcp?user=ops&password=Pw-8d7c6b5a",
            "https://mcp.example/mcp?user=ops&password=…",
        ),
        ("https://mcp.example/mcp?DB_PASSWD=Pw-8d7c6b5a", "https://mcp.example/mcp?DB_PASSWD=…"),
        # What names no credential stays.
        ("https://api.example/x?sort=token_count", "https://api.example/x?sort=token_count"),
    ],
)
def test_a_password_or_secret_in_a_urls_query_is_masked_in_a_log_line(url: str, shown: str) -> None:
    # The PII guard redacts ?password= and ?client_secret= in tool output (its key=value and
    # named-secret readers); the logs wrote them as they were, in the HTTP client's line for
    # each request to an HTTP MCP server given so.
    record = logging.LogRecord(
        "httpx", logging.INFO, __file__, 1, "HTTP Request: POST %s", (url,), None
    )
    assert logs.TextLines().format(record).endswith(f"httpx: HTTP Request: POST {shown}")
    assert f"POST {shown}" in json.loads(logs.JsonLines().format(record))["message"]


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        # A URL's ;parameters (matrix parameters, a JDBC URL's properties).
        (
            "jdbc:postgresql://db/kestrel;user=ops;password=Pw-8d7c6b5a;ssl=true",
            "jdbc:postgresql://db/kestrel;user=ops;password=…;ssl=true",
        ),
        ("https://api.example/x;token=ya29.a0&a=b", "https://api.example/x;token=…&a=b"),
        # A fragment's parameters (OAuth's implicit grant hands the token back there).
        (
            "https://app.example/cb#access_token=ya29.a0&expires_in=3599",
            "https://app.example/cb#access_token=…&expires_in=3599",
        ),
        (
            "https://app.example/cb?state=1#id_token=eyJ.x.y",
            "https://app.example/cb?state=1#id_token=…",
        ),
        # A name percent-encoded, read as what it decodes to.
        ("https://mcp.example/mcp?%74oken=abc123&a=b", "https://mcp.example/mcp?%74oken=…&a=b"),
        ("https://mcp.example/mcp?api%5Fkey=k1", "https://mcp.example/mcp?api%5Fkey=…"),
        ("https://mcp.example/mcp?PASS%57ORD=Pw-1", "https://mcp.example/mcp?PASS%57ORD=…"),
        # Slack's Socket Mode URL, in its SDK's debug line of apps.connections.open's answer.
        (
            "{'ok': True, 'url': 'wss://wss-primary.slack.com/link/?ticket=7f3e9a1c-5b2d&app_id=A1'}",
            "{'ok': True, 'url': 'wss://wss-primary.slack.com/link/?ticket=…&app_id=A1'}",
        ),
        # A token given as the URL's user, no password after it (GitHub takes one so).
        (
            "git clone https://ghp_16C7e42F292c6912E7710c838347Ae178B4a@github.com/o/r.git",
            "git clone https://…@github.com/o/r.git",
        ),
        ("https://glpat-abcdefghij0123456789@gitlab.example/o/r", "https://…@gitlab.example/o/r"),
        ("https://ghp_xxx@github.com/o/r", "https://…@github.com/o/r"),
        # What is no credential stays: a login name as the user, a fragment, a name that
        # decodes to none, an anchor.
        ("postgresql://kestrel@db:5432/kestrel", "postgresql://kestrel@db:5432/kestrel"),
        ("ssh://git@github.com/o/r.git", "ssh://git@github.com/o/r.git"),
        ("https://docs.example/page#token-usage", "https://docs.example/page#token-usage"),
        ("https://api.example/x?sort%5Fkey=name", "https://api.example/x?sort%5Fkey=name"),
        ("https://api.example/x;jsessionid=1;page=2", "https://api.example/x;jsessionid=1;page=2"),
    ],
)
def test_a_credential_elsewhere_in_a_url_is_masked_in_a_log_line(line: str, shown: str) -> None:
    # The masker read a query's "?name=" and "&name=" alone, by names as written: a JDBC URL's
    # ";password=", an OAuth callback's "#access_token=", "?%74oken=" and a token given as the
    # URL's user (https://ghp_…@github.com) were logged as they were.
    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, "GET %s", (line,), None)
    assert logs.TextLines().format(record).endswith(f"httpx: GET {shown}")
    assert json.loads(logs.JsonLines().format(record))["message"] == f"GET {shown}"


INTERACTION_TOKEN = "aW50ZXJhY3Rpb246MTIzNDU2Nzg5MDpTZWNyZXRUb2tlbg"


@pytest.mark.parametrize(
    ("logger", "level", "message", "args", "secret"),
    [
        # discord.py's rate limit warning names the URL, an interaction's token in its path.
        (
            "discord.http",
            logging.WARNING,
            "We are being rate limited. %s %s responded with 429. Retrying in %.2f seconds.",
            (
                "POST",
                f"https://discord.com/api/v10/interactions/1234/{INTERACTION_TOKEN}/callback",
                1.0,
            ),
            INTERACTION_TOKEN,
        ),
        (
            "discord.http",
            logging.DEBUG,
            "%s %s with %s has returned %s",
            (
                "PATCH",
                f"https://discord.com/api/v10/webhooks/99/{INTERACTION_TOKEN}/messages/@original",
                None,
                200,
            ),
            INTERACTION_TOKEN,
        ),
        # Its gateway's events at debug: an interaction's token as a dict's value.
        (
            "discord.gateway",
            logging.DEBUG,
            "For Shard ID %s: WebSocket Event: %s",
            (None, {"t": "INTERACTION_CREATE", "d": {"id": "1234", "token": INTERACTION_TOKEN}}),
            INTERACTION_TOKEN,
        ),
        # A Slack click's response_url: its last part lets anyone post to the channel.
        (
            "slack_bolt.AsyncApp",
            logging.DEBUG,
            "payload: %s",
            (
                "response_url=https://hooks.slack.com/actions/T0001/1234567890/Zq8xW3vR5tY7uI9oP1aS2dF4",
            ),
            "Zq8xW3vR5tY7uI9oP1aS2dF4",
        ),
        (
            "slack_sdk",
            logging.DEBUG,
            "body: %s",
            ({"ok": True, "client_secret": "Cs-8d7c6b5a4f3e", "user": "U1"},),
            "Cs-8d7c6b5a4f3e",
        ),
    ],
)
def test_a_platforms_token_in_a_path_or_a_payload_is_masked(
    logger: str, level: int, message: str, args: tuple[object, ...], secret: str
) -> None:
    # At warning (the default), discord.py's line for a rate-limited reply to a click named
    # the interaction's URL, whose token lets anyone answer for the bot for 15 minutes; at
    # debug, its events and Slack's payloads carried tokens as a dict's values.
    record = logging.LogRecord(logger, level, __file__, 1, message, args, None)
    text = logs.TextLines().format(record)
    assert secret not in text and "…" in text, text
    assert secret not in logs.JsonLines().format(record)


BEARER = "eyJhbGciOi.Jz8dK2mQ4pW7"


@pytest.mark.parametrize(
    ("message", "args", "secret"),
    [
        # A catalog command's output (curl -v, a script echoing its headers), as kestrel.events
        # logs a tool's exit at debug: with pii.mode off nothing redacted it before.
        (
            "%s",
            (
                {
                    "kind": "tool_exit",
                    "output": f"> GET / HTTP/1.1\n> Authorization: Bearer {BEARER}",
                },
            ),
            BEARER,
        ),
        ("%s", (f"Proxy-Authorization: Basic {BEARER}",), BEARER),
        ("%s", ("Authorization: Basic dXNlcjpwYXNzd29yZA==",), "dXNlcjpwYXNzd29yZA"),
        ("%s", (f"authorization={BEARER}",), BEARER),
        # A library's request headers at debug, as a dict's repr or as JSON.
        ("headers: %s", ({"Authorization": f"Bearer {BEARER}", "Accept": "*/*"},), BEARER),
        ("headers: %s", (json.dumps({"authorization": f"token {BEARER}"}),), BEARER),
        # Go's headers, each a list of values: printed (%v), and as JSON.
        ("%s", ("map[Accept:[*/*] Authorization:[Basic dXNlcjpwYXNzd29yZA==]]",), "dXNlcjpw"),
        ("%s", (json.dumps({"Authorization": ["Basic dXNlcjpwYXNzd29yZA=="]}),), "dXNlcjpw"),
        # A client's error quoting the token it sent.
        ("refused: invalid credentials Bearer %s", (BEARER,), BEARER),
    ],
)
def test_an_authorization_headers_credentials_are_masked_in_a_log_line(
    message: str, args: tuple[object, ...], secret: str
) -> None:
    # The logs masked a URL's password and a key named for a credential, not the header that
    # carries most of them: a token in a tool's output reached the log whole.
    record = logging.LogRecord("kestrel.events", logging.DEBUG, __file__, 1, message, args, None)
    text = logs.TextLines().format(record)
    # Masked ("…"), or at debug redacted by the PII guard after that ("<GENERIC_SECRET>").
    assert secret not in text and ("…" in text or "<GENERIC_SECRET>" in text), text
    assert secret not in logs.JsonLines().format(record)


@pytest.mark.parametrize(
    "line",
    ["Bearer authentication is required", "authorization: denied by policy", "the bearer of news"],
)
def test_words_about_authorization_are_left_as_they_are(line: str) -> None:
    record = logging.LogRecord("kestrel.events", logging.INFO, __file__, 1, line, None, None)
    assert line in logs.TextLines().format(record)


def _reconnect_logged(level: int, form: str) -> str:
    """discord.py's line for a gateway that dropped (``log.exception``), as ``form`` writes it
    at ``level``."""
    stream = io.StringIO()
    logs.configure(level, form, stream)
    try:
        raise ConnectionResetError("the gateway closed with 4000\nreconnecting")
    except ConnectionResetError:
        logging.getLogger("discord.client").exception("Attempting a reconnect in %.2fs", 1.62)
    return stream.getvalue()


def test_an_expected_failure_has_no_traceback_in_json_lines_above_debug() -> None:
    # A gateway that drops is logged with its exception by discord.py: text said it on one
    # line naming it, but a JSON line carried the whole traceback, at info (the chart's level).
    (line,) = _reconnect_logged(logging.INFO, "json").splitlines()
    record = json.loads(line)
    assert record["message"] == "Attempting a reconnect in 1.62s"
    assert record["exception"] == "ConnectionResetError: the gateway closed with 4000 reconnecting"
    text = _reconnect_logged(logging.INFO, "text")
    assert text.rstrip("\n").endswith(f": {record['exception']}") and "Traceback" not in text
    record = json.loads(_reconnect_logged(logging.DEBUG, "json"))
    assert record["exception"].startswith("Traceback (most recent call last):")


@pytest.mark.parametrize("form", ["json", "text"])
def test_a_gateway_reconnecting_is_a_warning_not_an_error(form: str) -> None:
    # discord.py logs each reconnect at error: an alert on errors paged for a blip that it
    # mends by itself, while /readyz already says "discord: not connected (reconnecting)".
    said = _reconnect_logged(logging.WARNING, form)
    level = json.loads(said)["level"] if form == "json" else said.split()[1]
    assert level.lower() == "warning", said


def test_a_librarys_logger_goes_through_the_one_handler_made_before_or_after() -> None:
    before = logging.getLogger("openai")
    own = logging.StreamHandler(io.StringIO())
    before.addHandler(own)
    before.setLevel(logging.DEBUG)
    before.propagate = False
    stream = io.StringIO()
    logs.configure(logging.WARNING, "text", stream)
    after = logging.getLogger("httpcore")
    for library in (before, after):
        assert (library.handlers, library.level, library.propagate) == ([], logging.NOTSET, True)
        library.info("not at warning")
        library.warning("heard")
    assert stream.getvalue().count("heard") == 2
    assert "not at warning" not in stream.getvalue()


# Secrets as a catalog command prints them, each of a kind the PII guard knows.
PRINTED_SECRETS = {
    "AWS_ACCESS_KEY": "AKIAZ4XQ7PLM3RT5VW2N",
    "GITHUB_TOKEN": "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
    "SLACK_TOKEN": "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "CONNECTION_STRING_PASSWORD": "Sup3rS3cretPw",
}
PRINTING = (
    f"echo key {PRINTED_SECRETS['AWS_ACCESS_KEY']} {PRINTED_SECRETS['GITHUB_TOKEN']}; "
    f"echo {PRINTED_SECRETS['SLACK_TOKEN']}; "
    f"echo postgresql://app:{PRINTED_SECRETS['CONNECTION_STRING_PASSWORD']}@db/x; "
    "echo owner alice@example.com"
)


@pytest.mark.parametrize("form", ["text", "json"])
def test_a_debug_log_prints_no_secret_of_a_tools_output_under_pii_off(
    tmp_path: Path, form: str
) -> None:
    # kestrel.events logs each tool's exit at debug with its output: with pii.mode off nothing
    # redacted it, and the log printed the command's keys and tokens whole.
    tool = {"name": "show_env", "description": "x", "command": ["sh", "-c", PRINTING]}
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": [{**tool, "idempotent": True}]}))
    config = {
        "model": {"provider": "openai", "name": "fake", "max_retries": 0},
        "tools": ["tools.yaml"],
        "pii": {"mode": "off"},
        "tool_isolation": {"mode": "none"},
    }
    (tmp_path / "kestrel.yaml").write_text(yaml.safe_dump(config))
    script: list[dict[str, Any]] = [
        {"text": "looking", "calls": [{"name": "show_env"}]},
        {"text": "done"},
    ]
    server = FakeOpenAIProcess(tmp_path, script, forked=True)
    try:
        env = clean_env(
            OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=server.base_url, KESTREL_LOG_FORMAT=form
        )
        run = subprocess.run(
            [*KESTREL, "--log-level", "debug", "run", "go"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.stop()
    assert run.returncode == 0, run.stderr
    (exit_line,) = [line for line in run.stderr.splitlines() if "'tool_exit'" in line]
    assert [secret for secret in PRINTED_SECRETS.values() if secret in run.stderr] == []
    for kind in PRINTED_SECRETS:
        assert f"<{kind}>" in exit_line, exit_line
    assert "alice@example.com" in exit_line  # personal data, not a secret: debugging reads it
    # The model read the output as pii.mode off leaves it: the log's redaction is the log's.
    model_read = server.log.read_text()
    assert all(secret in model_read for secret in PRINTED_SECRETS.values())


@pytest.mark.parametrize(
    ("pasted", "placeholder"),
    [
        (PRINTED_SECRETS["GITHUB_TOKEN"], "<GITHUB_TOKEN>"),
        ("4111 1111 1111 1111", "<CREDIT_CARD>"),  # nor a card or account number
    ],
)
def test_a_persons_message_in_a_platforms_debug_payload_has_its_secrets_redacted(
    pasted: str, placeholder: str
) -> None:
    # discord.py logs each gateway event at debug, a message's content as typed: a key pasted
    # into a mention reached the log whole (the PII guard reads it only on the way to the model).
    event = {"t": "MESSAGE_CREATE", "d": {"content": f"<@1> use {pasted} from alice@example.com"}}
    record = logging.LogRecord(
        "discord.gateway",
        logging.DEBUG,
        __file__,
        1,
        "For Shard ID %s: WebSocket Event: %s",
        (None, event),
        None,
    )
    for line in (logs.TextLines().format(record), logs.JsonLines().format(record)):
        assert pasted not in line and placeholder in line, line
        assert "alice@example.com" in line  # who and where: debugging reads them
    # Above debug, a line is left as its loggers wrote it (they print no payloads there).
    record.levelno, record.levelname = logging.INFO, "INFO"
    assert pasted in logs.TextLines().format(record)
