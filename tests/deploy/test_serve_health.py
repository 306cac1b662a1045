"""One real ``kestrel serve slack discord``, started as the chart starts it (its args, its
probes, the image's HEALTHCHECK), in an environment as a cluster makes it: secrets in files,
Kubernetes' service-link variables, the configuration in a folder of its own, JSON logs at debug
level. Readiness tells the truth as Slack's socket, Discord's gateway and the store's schema
come and go, the gauges say the same, and no secret reaches the log."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bot import wire
from bot.cli.chat_cmd import STOP_NOTE_SECONDS
from bot.domain import Session, new_id
from storage.postgres import PostgresStore
from storage.sqlite import SqliteStore
from tests.deploy.kit import A_DATABASE, healthcheck_argv, one, render_chart
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.processes import KESTREL, clean_env
from tests.fakes.serving import free_port, log_records, serve_env, start_serve, wait_healthy
from tests.fakes.slack_api import FakeSlackApi, events_api_envelope
from tests.fakes.slack_client import app_mention, event_callback
from tests.fakes.slack_world import REQUESTER, write_config
from tests.fakes.tcp_proxy import proxied_dsn
from tests.fakes.waiting import until
from tests.storage.conftest import postgres_dsn, postgres_schema

# Each from a file (NAME_FILE), as Docker and Kubernetes secrets are, with a trailing newline.
IN_FILES = {
    "SLACK_BOT_TOKEN": "xoxb-file-5e1d7c3a9b",
    "SLACK_APP_TOKEN": "xapp-file-2f8b6d4c0e",
    "DISCORD_TOKEN": "discord-file-7a3e9c1b5d",
    "OPENAI_API_KEY": "sk-file-1c5a9e3f7b",
    "KESTREL_WEB_TOKEN": "webtoken-file-8b2d6f0a4c",
    "KESTREL_WEB_SECRET": "websecret-file-4d0b8f2c6a1e",
}
SIGNING_SECRET = "signing-env-6c2a8e4f0b"
SECRETS = [*IN_FILES.values(), SIGNING_SECRET]
# What Kubernetes injects for a Service named kestrel: ignored, not "unknown variable".
SERVICE_LINKS = {
    "KESTREL_SERVICE_HOST": "10.96.0.12",
    "KESTREL_SERVICE_PORT": "80",
    "KESTREL_SERVICE_PORT_HTTP": "80",
    "KESTREL_PORT": "tcp://10.96.0.12:80",
    "KESTREL_PORT_80_TCP": "tcp://10.96.0.12:80",
    "KESTREL_PORT_80_TCP_ADDR": "10.96.0.12",
}


def chart_argv(port: int) -> tuple[list[str], dict[str, str]]:
    """The chart's container args for ``slack`` and ``discord`` (on this test's loopback port),
    after the image's entrypoint; and the probes' paths."""
    values = {**A_DATABASE, "platforms": ["slack", "discord"], "logLevel": "debug"}
    container = one(render_chart(values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    args = [str(arg) for arg in container["args"]]
    args[args.index("--host") + 1] = "127.0.0.1"  # the pod's 0.0.0.0, kept to loopback here
    args[args.index("--port") + 1] = str(port)
    paths = {
        probe: container[probe]["httpGet"]["path"]
        for probe in ("livenessProbe", "readinessProbe", "startupProbe")
    }
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return ["--log-level", env["KESTREL_LOG_LEVEL"], *args], paths


def prepare(tmp: Path, model_url: str, slack_url: str, discord_url: str) -> dict[str, str]:
    """The configuration in its own folder, the secrets in files; the environment."""
    etc, secrets = tmp / "etc", tmp / "secrets"
    etc.mkdir()
    secrets.mkdir()
    config = yaml.safe_load(write_config(etc, model_url).read_text())
    del config["openai_api_key"]  # from OPENAI_API_KEY_FILE
    config["database"] = "kestrel.db"  # relative: beside the configuration
    (etc / "kestrel.yaml").write_text(yaml.safe_dump(config))
    env = clean_env(**SERVICE_LINKS)
    for name in ("SLACK_SIGNING_SECRET", "SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "DISCORD_TOKEN"):
        env.pop(name, None)
    for name, value in IN_FILES.items():
        (secrets / name).write_text(value + "\n")
        env[f"{name}_FILE"] = str(secrets / name)
    env.update(
        KESTREL_CONFIG=str(etc / "kestrel.yaml"),
        KESTREL_LOG_FORMAT="json",
        SLACK_SIGNING_SECRET=SIGNING_SECRET,
        SLACK_API_URL=slack_url,
        DISCORD_API_URL=discord_url,
    )
    return env


async def readyz(port: int, path: str, token: str = "") -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}", headers=headers) as response,
    ):
        return response.status, await response.json()


async def gauges(port: int) -> dict[str, float]:
    """``kestrel_ready`` and ``kestrel_platform_connected`` as /metrics shows them."""
    headers = {"Authorization": f"Bearer {IN_FILES['KESTREL_WEB_TOKEN']}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as response,
    ):
        assert response.status == 200
        text = await response.text()
    found = {}
    for line in text.splitlines():
        if line.startswith(("kestrel_ready ", "kestrel_platform_connected{")):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def health_command(port: int, path: str) -> int:
    """The image's HEALTHCHECK as written (``kestrel health --url …``), at this port and path."""
    argv = healthcheck_argv()
    url = argv[argv.index("--url") + 1].replace(":3000/", f":{port}/").rsplit("/", 1)[0] + path
    argv[argv.index("--url") + 1] = url
    assert argv[0] == "kestrel"
    done = subprocess.run([*KESTREL, *argv[1:]], capture_output=True, timeout=30, check=False)
    return done.returncode


async def test_readiness_follows_every_dependency_and_no_secret_is_logged(tmp_path: Path) -> None:
    script = [{"text": "checked: all good"}]
    async with FakeOpenAI(script) as model, FakeSlackApi() as slack, FakeDiscord() as discord:
        env = prepare(tmp_path, model.base_url, slack.url, discord.api_url)
        port = free_port()
        args, paths = chart_argv(port)
        (tmp_path / "run").mkdir()
        # Debug level writes more than a pipe holds: to a file, read at the end.
        log = (tmp_path / "stderr.log").open("w+")
        process = subprocess.Popen(  # noqa: ASYNC220 - a process that outlives this call
            [*KESTREL, *args],  # the image's ENTRYPOINT ["kestrel"], then the chart's args
            env=env,
            cwd=tmp_path / "run",
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            await wait_healthy(port, process)
            ready = paths["readinessProbe"]
            assert (await readyz(port, paths["livenessProbe"]))[0] == 200
            await until(lambda: _status_is(port, ready, 200), timeout=20)
            assert await asyncio.to_thread(health_command, port, "/healthz") == 0
            assert await asyncio.to_thread(health_command, port, ready) == 0
            assert await gauges(port) == {
                "kestrel_ready": 1.0,
                'kestrel_platform_connected{platform="slack"}': 1.0,
                'kestrel_platform_connected{platform="discord"}': 1.0,
            }

            # Slack's socket drops and Slack refuses a new one for a while.
            slack.refuse("apps.connections.open", "internal_error")
            await slack.close_sockets()
            body = await until(lambda: _problems_when_down(port, ready), timeout=20)
            assert list(body["problems"]) == ["slack"], body
            said = await gauges(port)
            assert said["kestrel_ready"] == 0.0
            assert said['kestrel_platform_connected{platform="slack"}'] == 0.0
            assert await asyncio.to_thread(health_command, port, ready) == 1
            assert await asyncio.to_thread(health_command, port, "/healthz") == 0  # alive
            slack.clear_faults("apps.connections.open")
            await until(lambda: _status_is(port, ready, 200), timeout=25)

            # Discord's gateway drops and refuses connections for a while.
            discord.gateway_refused = True
            await discord.close_gateway(4000)
            body = await until(lambda: _problems_when_down(port, ready), timeout=20)
            assert list(body["problems"]) == ["discord"], body
            assert body["platforms"] == {"slack": True, "discord": False}
            discord.gateway_refused = False
            await until(lambda: _status_is(port, ready, 200), timeout=25)

            # A newer Kestrel migrated the shared store: this replica is no longer ready.
            journal = tmp_path / "etc" / "kestrel.db"
            _schema(
                journal,
                "INSERT INTO schema_version(version, applied_at)"
                " SELECT MAX(version) + 1, MAX(applied_at) FROM schema_version",
            )
            body = await until(lambda: _problems_when_down(port, ready), timeout=20)
            assert "schema version" in body["problems"]["store"], body
            _schema(
                journal,
                "DELETE FROM schema_version"
                " WHERE version = (SELECT MAX(version) FROM schema_version)",
            )
            await until(lambda: _status_is(port, ready, 200), timeout=20)

            # A mention still flows after all that, its lines naming the run.
            mention = event_callback(app_mention(REQUESTER, "is checkout fine?"))
            await slack.wait_for_ack(await slack.socket_send(events_api_envelope(mention), 20))
            await slack.wait_for(lambda c: "all good" in json.dumps(c.args), timeout=20)
            await discord.dispatch(
                "MESSAGE_CREATE", p.message_create(author_id=REQUESTER, content="just chatting")
            )
        finally:
            process.send_signal(signal.SIGTERM)
            await asyncio.to_thread(process.wait, timeout=40)
            log.close()
    err = (tmp_path / "stderr.log").read_text()
    assert process.returncode == 0, err[-3000:]
    assert [secret for secret in SECRETS if secret in err] == []
    lines = log_records(err, "json")  # every line one object, serve's own lines too
    assert len(lines) > 50  # debug level: bolt's, discord.py's, aiohttp's and ours
    assert all(line["ts"].endswith("Z") for line in lines)
    levels = {line["level"] for line in lines}
    assert "debug" in levels
    loggers = {line["logger"].split(".")[0] for line in lines}
    assert {"slack_sdk", "discord", "kestrel"} <= loggers, loggers
    assert any("run_id" in line for line in lines)
    assert all(line.get("replica") for line in lines if line["logger"].startswith("kestrel."))
    assert {line.get("platform") for line in lines} >= {"slack", "discord"}
    assert "unknown variable" not in err


async def _status_is(port: int, path: str, status: int) -> bool:
    return (await readyz(port, path))[0] == status


async def _problems_when_down(port: int, path: str) -> dict[str, Any] | None:
    status, body = await readyz(port, path)
    return body if status == 503 else None


def _schema(journal: Path, statement: str) -> None:
    with sqlite3.connect(journal, timeout=10) as conn:
        conn.execute(statement)


async def test_readiness_says_which_check_failed_and_its_detail_to_operators_alone(
    tmp_path: Path,
) -> None:
    config = tmp_path / "kestrel.yaml"
    config.write_text("database: kestrel.db\ntools: []\n")
    token = "operator-token-5b1e9d3c7a"
    env = serve_env(config, "http://127.0.0.1:9", KESTREL_WEB_TOKEN=token)
    port = free_port()
    process = start_serve(tmp_path, port, env)
    journal = tmp_path / "kestrel.db"
    try:
        await wait_healthy(port, process)
        await until(lambda: _status_is(port, "/readyz", 200), timeout=20)
        # The store's error names the journal's file (on PostgreSQL: a host, a user).
        journal.rename(tmp_path / "moved.db")
        body = await until(lambda: _problems_when_down(port, "/readyz"), timeout=20)
        assert body["problems"] == {"store": "unreachable"}, body
        for _ in range(3):
            assert await readyz(port, "/readyz") == (503, body)
        assert await readyz(port, "/readyz", "not-the-operators-token") == (503, body)
        status, detailed = await readyz(port, "/readyz", token)
        assert status == 503
        assert str(journal) in detailed["problems"]["store"], detailed
        (tmp_path / "moved.db").rename(journal)
        await until(lambda: _status_is(port, "/readyz", 200), timeout=20)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(process.communicate, timeout=40)
    said = [line for line in err.splitlines() if "not ready: store:" in line]
    assert len(said) == 1, err
    assert str(journal) in said[0]


async def test_a_postgresql_outage_is_logged_once_by_readiness_and_its_end_too(
    tmp_path: Path,
) -> None:
    dsn = postgres_dsn()
    config = tmp_path / "kestrel.yaml"
    config.write_text("tools: []\n")
    token = "operator-token-9c4e2a6b8d"
    async with postgres_schema(dsn) as schema, proxied_dsn(dsn) as (proxied, proxy):
        env = serve_env(
            config,
            "http://127.0.0.1:9",
            # A password the server (trust) does not ask for: never in a line of the log.
            KESTREL_DATABASE_URL=_with_password(f"{proxied}?schema={schema}"),
            KESTREL_WEB_TOKEN=token,
            KESTREL_DATABASE_TIMEOUT_SECONDS="1",
        )
        port = free_port()
        process = start_serve(tmp_path, port, env)
        try:
            await wait_healthy(port, process)
            await until(lambda: _status_is(port, "/readyz", 200), timeout=20)
            proxy.cut()  # connections reset, new ones refused: the error reads as either
            await until(lambda: _problems_when_down(port, "/readyz"), timeout=20)
            for _ in range(5):  # probes, as a kubelet's and a balancer's come
                assert (await readyz(port, "/readyz"))[0] == 503
            proxy.restore()
            proxy.hold()  # then a network that passes nothing: the error reads otherwise
            await until(lambda: _detail_says(port, token, "no answer within"), timeout=20)
            proxy.restore()
            await until(lambda: _status_is(port, "/readyz", 200), timeout=30)
        finally:
            process.send_signal(signal.SIGTERM)
            _, err = await asyncio.to_thread(process.communicate, timeout=40)
    told = [line for line in err.splitlines() if " kestrel.health: " in line]
    assert len([line for line in told if "not ready: store: unreachable" in line]) == 1, err
    assert len([line for line in told if "store: fine again" in line]) == 1, err
    assert "Traceback" not in err
    assert DATABASE_PASSWORD not in err
    started = next(line for line in err.splitlines() if "kestrel serving as" in line)
    assert f"store: postgres@127.0.0.1:{proxy.port}/test (schema {schema}))" in started, started


DATABASE_PASSWORD = "Db-Pa55word-7e3c"


def _with_password(dsn: str) -> str:
    return dsn.replace("postgresql://postgres@", f"postgresql://postgres:{DATABASE_PASSWORD}@")


async def _detail_says(port: int, token: str, words: str) -> bool:
    status, body = await readyz(port, "/readyz", token)
    return status == 503 and words in json.dumps(body)


async def test_a_slack_reconnection_refused_is_logged_one_line_per_event(tmp_path: Path) -> None:
    # The Slack SDK's errors span lines ("…failed.\nThe server responded with: …"): in the text
    # format, the second would be a line of its own, with no time, level or logger.
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    async with FakeSlackApi() as slack:
        env = serve_env(config, slack.url, SLACK_APP_TOKEN="xapp-test", KESTREL_LOG_FORMAT="text")
        port = free_port()
        process = start_serve(tmp_path, port, env, "slack")
        try:
            await wait_healthy(port, process)
            await until(lambda: _status_is(port, "/readyz", 200), timeout=20)
            slack.refuse("apps.connections.open", "internal_error")
            await slack.close_sockets()
            await until(lambda: _problems_when_down(port, "/readyz"), timeout=20)
            await until(lambda: len(slack.calls_to("apps.connections.open")) >= 3, timeout=20)
            slack.clear_faults("apps.connections.open")
            await until(lambda: _status_is(port, "/readyz", 200), timeout=25)
        finally:
            process.send_signal(signal.SIGTERM)
            _, err = await asyncio.to_thread(process.communicate, timeout=40)
    assert process.returncode == 0, err
    records = log_records(err, "text")  # fails on a line that is no record
    refused = [r for r in records if "internal_error" in r["message"]]
    assert refused and all(r["logger"].startswith("kestrel.slack") for r in refused), err


async def test_a_stop_with_the_store_silent_says_so_within_the_grace(tmp_path: Path) -> None:
    # A network that passes nothing: each store write of the stop waited the whole
    # database_timeout_seconds (and its cancellation as long again), so a replica told to stop
    # was killed by the orchestrator first, saying nothing true of its leases.
    dsn = postgres_dsn()
    config = tmp_path / "kestrel.yaml"
    config.write_text("tools: []\n")
    async with postgres_schema(dsn) as schema, proxied_dsn(dsn) as (proxied, proxy):
        env = serve_env(
            config, "http://127.0.0.1:9", KESTREL_DATABASE_URL=f"{proxied}?schema={schema}"
        )
        port = free_port()
        log = (tmp_path / "stderr.log").open("w+")
        process = subprocess.Popen(  # noqa: ASYNC220 - a process that outlives this call
            [*KESTREL, "serve", "--port", str(port)], env=env, cwd=tmp_path, stderr=log, text=True
        )
        try:
            await wait_healthy(port, process)
            await until(lambda: _status_is(port, "/readyz", 200), timeout=20)
            proxy.hold()
            process.send_signal(signal.SIGTERM)
            await until(lambda: _said(tmp_path / "stderr.log", "stopped"), timeout=60)
            # Its last word comes once the store is closed: the process ends at once after it
            # (a second SIGTERM then would find no handler left, and kill it).
            await asyncio.to_thread(process.wait, timeout=10)
        finally:
            if process.poll() is None:
                process.kill()
                await asyncio.to_thread(process.wait, timeout=60)
            log.close()
            proxy.restore()
    err = (tmp_path / "stderr.log").read_text()
    lines = log_records(err, "text")
    said = {
        r["message"].split(":")[0].split(",")[0]: r for r in lines if r["logger"] == "kestrel.serve"
    }
    began, ended = said["stopping on SIGTERM"], said["stopped"]
    # Its last word: nothing after it says the store is being reconnected or tried again.
    assert lines[-1] == ended, err
    assert "the store did not answer" in ended["message"] and ended["level"] == "warning", err
    took = _seconds(ended["ts"]) - _seconds(began["ts"])
    # Its three bounded waits; the store's own took about two minutes.
    assert took < 6 * STOP_NOTE_SECONDS, err
    assert process.returncode == 0
    # A store write the stop gave up on ends by itself, and no one else's error is left: no
    # "Task exception was never retrieved" (tests/storage/test_postgres.py has the release's).
    assert "never retrieved" not in err and "Traceback" not in err, err


# A catalog command that outlives any grace: what the stop gives up on.
SLOW_CATALOG = {
    "tools": [
        {
            "name": "slow_check",
            "description": "a check that takes a minute",
            "command": ["/bin/sh", "./slow.sh"],
            "parameters": {"type": "object", "properties": {}},
            "env": ["MARK_FILE"],
            "timeout": 120,
        }
    ]
}
SLOW_SCRIPT: list[dict[str, Any]] = [
    {"text": "checking", "calls": [{"name": "slow_check", "arguments": {}}]},
    {"text": "checked"},
]
STOP_GRACE = 2.0  # replica.shutdown_grace_seconds, short so that the test is quick
# What a stop may take past the grace: Helm's, Compose's and systemd's 40 s hold the default
# 20 s grace and this.
STOP_MARGIN = 15.0


async def test_a_stop_with_the_store_silent_and_a_command_under_way_ends_within_the_grace(
    tmp_path: Path,
) -> None:
    # A run's command under way at the stop: its suspension, the read of what to hand back,
    # the replica's removal and the store's close each waited on the silent store in turn, and
    # the stop took grace + about 40 s, past the orchestrator's kill.
    dsn = postgres_dsn()
    (tmp_path / "catalog.yaml").write_text(yaml.safe_dump(SLOW_CATALOG))
    (tmp_path / "slow.sh").write_text('echo started >> "$MARK_FILE"\nsleep 60\n')
    mark = tmp_path / "started.txt"
    config = tmp_path / "kestrel.yaml"
    settings = {
        "model": {"provider": "openai", "name": "fake", "max_retries": 0},
        "tools": ["catalog.yaml"],
        "replica": {"shutdown_grace_seconds": STOP_GRACE},
    }
    config.write_text(yaml.safe_dump(settings))
    async with (
        FakeOpenAI(SLOW_SCRIPT) as model,
        postgres_schema(dsn) as schema,
        proxied_dsn(dsn) as (proxied, proxy),
    ):
        env = serve_env(
            config,
            "http://127.0.0.1:9",
            KESTREL_DATABASE_URL=f"{proxied}?schema={schema}",
            OPENAI_BASE_URL=model.base_url,
            OPENAI_API_KEY="test",
            MARK_FILE=str(mark),
        )
        port = free_port()
        log = (tmp_path / "stderr.log").open("w+")
        process = subprocess.Popen(  # noqa: ASYNC220 - a process that outlives this call
            [*KESTREL, "serve", "--port", str(port)], env=env, cwd=tmp_path, stderr=log, text=True
        )
        try:
            await wait_healthy(port, process)
            await until(lambda: _status_is(port, "/readyz", 200), timeout=20)
            await _start_a_postgres_run(f"{dsn}?schema={schema}")
            await until(mark.exists, timeout=30)
            proxy.hold()
            process.send_signal(signal.SIGTERM)
            await until(lambda: _said(tmp_path / "stderr.log", "stopped"), timeout=90)
            await asyncio.to_thread(process.wait, timeout=10)
        finally:
            if process.poll() is None:
                process.kill()
                await asyncio.to_thread(process.wait, timeout=60)
            log.close()
            proxy.restore()
    err = (tmp_path / "stderr.log").read_text()
    lines = log_records(err, "text")
    said = {
        r["message"].split(":")[0].split(",")[0]: r for r in lines if r["logger"] == "kestrel.serve"
    }
    began, ended = said["stopping on SIGTERM"], said["stopped"]
    assert "handing back 1 live run(s)" in began["message"], err
    assert lines[-1] == ended, err
    assert "the store did not answer" in ended["message"] and ended["level"] == "warning", err
    took = _seconds(ended["ts"]) - _seconds(began["ts"])
    assert took < STOP_GRACE + STOP_MARGIN, err
    assert process.returncode == 0, err
    assert "never retrieved" not in err and "Traceback" not in err, err


async def _start_a_postgres_run(database: str) -> None:
    """Queue a run's start on PostgreSQL as a chat adapter on any replica does."""
    store = PostgresStore(database.split("?")[0], schema=database.split("schema=")[1])
    await store.migrate()
    try:
        session = wire.to_plain(Session(id=new_id("ses"), platform="test"))
        payload = {"run_id": new_id("run"), "prompt": "is it fine?", "session": session}
        await store.enqueue_work("start", {**payload, "requested_by": "U0REQ"})
    finally:
        await store.close()


def _said(path: Path, words: str) -> bool:
    return f"kestrel.serve: {words}" in path.read_text()


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("form", ["json", "text"])
async def test_a_model_proxy_s_password_is_not_logged(tmp_path: Path, form: str) -> None:
    # OPENAI_BASE_URL may name a proxy with its credentials; the HTTP client logs the URL of
    # each model call at info, the chart's and the unit's level.
    (tmp_path / "kestrel.yaml").write_text(
        "model: {provider: openai, name: fake, max_retries: 0}\ntools: []\n"
    )
    async with FakeOpenAI([{"text": "all good"}]) as model:
        proxy_url = model.base_url.replace("http://", f"http://proxyuser:{PROXY_PASSWORD}@")
        env = serve_env(
            tmp_path / "kestrel.yaml",
            "http://127.0.0.1:9",
            OPENAI_BASE_URL=proxy_url,
            KESTREL_LOG_LEVEL="info",
            KESTREL_LOG_FORMAT=form,
        )
        port = free_port()
        process = start_serve(tmp_path, port, env)
        try:
            await wait_healthy(port, process)
            run_id = await _start_a_run(tmp_path / "kestrel.db")
            # Its end, not the model's count: the client logs the call once it has the answer,
            # and a stop before then cuts the call short, line and all.
            await until(lambda: _status(tmp_path / "kestrel.db", run_id) == "completed", timeout=20)
        finally:
            process.send_signal(signal.SIGTERM)
            _, err = await asyncio.to_thread(process.communicate, timeout=40)
    calls = [r for r in log_records(err, form) if "/chat/completions" in r["message"]]
    assert calls, err  # the line is still there, the proxy named
    assert PROXY_PASSWORD not in err
    assert all("proxyuser:…@127.0.0.1" in r["message"] for r in calls), err


PROXY_PASSWORD = "Pr0xy-S3cret-9d1f"


async def _start_a_run(journal: Path) -> str:
    """Queue a run's start as a chat adapter does; the run's id."""
    store = SqliteStore(journal)
    await store.migrate()
    try:
        session = wire.to_plain(Session(id=new_id("ses"), platform="test"))
        payload = {"run_id": new_id("run"), "prompt": "is it fine?", "session": session}
        await store.enqueue_work("start", {**payload, "requested_by": "U0REQ"})
    finally:
        await store.close()
    return str(payload["run_id"])


def _status(journal: Path, run_id: str) -> str:
    """The run's status as its row has it ("" before it is created)."""
    with sqlite3.connect(journal) as conn:
        row = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
    return str(row[0]) if row else ""


# Prometheus gives up on a scrape after its scrape_timeout, 10 s unless set (the chart's
# ServiceMonitor sets none): a scrape that outlasts it is `up 0`, its figures lost.
SCRAPE_TIMEOUT = 10.0


async def test_a_scrape_with_the_store_silent_answers_within_the_scraper_s_timeout(
    tmp_path: Path,
) -> None:
    # A network that passes nothing: the scrape waited 3 s for readiness, then the store's
    # reads each waited for a connection in turn (13 s), so kestrel_store_up 0 was never seen.
    dsn = postgres_dsn()
    config = tmp_path / "kestrel.yaml"
    config.write_text("tools: []\n")
    async with postgres_schema(dsn) as schema, proxied_dsn(dsn) as (proxied, proxy):
        env = serve_env(
            config,
            "http://127.0.0.1:9",
            KESTREL_DATABASE_URL=f"{proxied}?schema={schema}",
            KESTREL_WEB_TOKEN=IN_FILES["KESTREL_WEB_TOKEN"],
        )
        port = free_port()
        process = start_serve(tmp_path, port, env)
        try:
            await wait_healthy(port, process)
            assert (await _scrape_within(port, SCRAPE_TIMEOUT))["kestrel_store_up"] == 1.0
            proxy.hold()
            said = await _scrape_within(port, SCRAPE_TIMEOUT / 2)
            assert said["kestrel_store_up"] == 0.0 and said["kestrel_ready"] == 0.0, said
            proxy.restore()
            await until(lambda: _store_up_again(port), timeout=30)
        finally:
            proxy.restore()
            process.send_signal(signal.SIGTERM)
            _, err = await asyncio.to_thread(process.communicate, timeout=60)
    told = [line for line in err.splitlines() if "metrics: the store could not be read" in line]
    assert len(told) == 1 and "no answer within" in told[0], err
    assert "Traceback" not in err, err


async def _scrape_within(port: int, seconds: float) -> dict[str, float]:
    """``kestrel_store_up`` and ``kestrel_ready`` of a scrape that must answer within
    ``seconds``, as a scraper's timeout demands."""
    headers = {"Authorization": f"Bearer {IN_FILES['KESTREL_WEB_TOKEN']}"}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=seconds)) as session,
        session.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as response,
    ):
        assert response.status == 200
        text = await response.text()
    found = {}
    for line in text.splitlines():
        if line.startswith(("kestrel_store_up ", "kestrel_ready ")):
            name, value = line.split(" ")
            found[name] = float(value)
    return found


async def _store_up_again(port: int) -> bool:
    return (await _scrape_within(port, SCRAPE_TIMEOUT))["kestrel_store_up"] == 1.0


async def test_each_run_s_course_is_logged_at_the_chart_s_level(tmp_path: Path) -> None:
    # At info, the chart's and the unit's level, a run left no line of Kestrel's own: on-call
    # reading the log could not tell which runs started, where, and how they ended.
    (tmp_path / "kestrel.yaml").write_text(
        "model: {provider: openai, name: fake, max_retries: 0}\ntools: []\n"
    )
    async with FakeOpenAI([{"text": "all good"}]) as model:
        env = serve_env(
            tmp_path / "kestrel.yaml",
            "http://127.0.0.1:9",
            OPENAI_BASE_URL=model.base_url,
            KESTREL_LOG_LEVEL="info",
            KESTREL_LOG_FORMAT="json",
        )
        port = free_port()
        process = start_serve(tmp_path, port, env)
        try:
            await wait_healthy(port, process)
            run_id = await _start_a_run(tmp_path / "kestrel.db")
            await until(lambda: _status(tmp_path / "kestrel.db", run_id) == "completed", timeout=20)
        finally:
            process.send_signal(signal.SIGTERM)
            _, err = await asyncio.to_thread(process.communicate, timeout=40)
    course = [
        r
        for r in log_records(err, "json")
        if r["logger"] == "kestrel.events" and r["level"] == "info"
    ]
    assert [r["message"] for r in course] == [
        f"run {run_id} started, requested by U0REQ",
        f"run {run_id} completed (answered)",
    ], err
    assert all(r["run_id"] == run_id and r["session"] for r in course), course
