"""Configuration as real environments give it: Kubernetes' service-link variables, secrets in
files, a bad log level; and readiness of a replica that has not registered."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from bot.config.settings import ConfigError, load_settings
from bot.config.sources import environment, names_a_setting
from bot.replica.health import CHECK_SECONDS, Health
from storage.postgres import PostgresStore
from storage.sqlite import SqliteStore
from tests.deploy.kit import A_DATABASE, one, render_chart
from tests.fakes.processes import KESTREL, ROOT, SETPRIV, unprivileged
from tests.fakes.tcp_proxy import proxied_dsn
from tests.storage.conftest import postgres_dsn, postgres_schema


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith(("KESTREL_", "OPENAI_", "SLACK_", "DISCORD_")):
            monkeypatch.delenv(name)
    return tmp_path


@pytest.mark.parametrize(
    "name",
    [
        "KESTREL_SERVICE_HOST",
        "KESTREL_SERVICE_PORT",
        "KESTREL_SERVICE_PORT_HTTP",
        "KESTREL_PORT",
        "KESTREL_PORT_3000_TCP",
        "KESTREL_PORT_3000_TCP_ADDR",
    ],
)
def test_kubernetes_service_links_are_no_settings(name: str) -> None:
    assert not names_a_setting(name)


def test_service_links_are_ignored_and_a_typo_still_named(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KESTREL_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KESTREL_PORT_80_TCP_PORT", "80")
    assert load_settings().database == "kestrel.db"
    monkeypatch.setenv("KESTREL_SERVICES__X", "1")
    with pytest.raises(ConfigError, match="KESTREL_SERVICES__X: unknown variable"):
        load_settings()


# What a Service named kestrel-postgresql (``helm install kestrel bitnami/postgresql``) puts in
# every pod of its namespace that does not say enableServiceLinks: false (a migration Job, say).
OTHER_SERVICE_LINKS = {
    "KESTREL_POSTGRESQL_SERVICE_HOST": "10.96.0.20",
    "KESTREL_POSTGRESQL_SERVICE_PORT": "5432",
    "KESTREL_POSTGRESQL_SERVICE_PORT_TCP_POSTGRESQL": "5432",
    "KESTREL_POSTGRESQL_PORT": "tcp://10.96.0.20:5432",
    "KESTREL_POSTGRESQL_PORT_5432_TCP": "tcp://10.96.0.20:5432",
    "KESTREL_POSTGRESQL_PORT_5432_TCP_PROTO": "tcp",
    "KESTREL_POSTGRESQL_PORT_5432_TCP_PORT": "5432",
    "KESTREL_POSTGRESQL_PORT_5432_TCP_ADDR": "10.96.0.20",
    "KESTREL_METRICS_V6_PORT": "tcp://[fd00::12]:9090",
}


def test_another_kestrel_services_links_are_ignored(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in OTHER_SERVICE_LINKS.items():
        monkeypatch.setenv(name, value)
    assert load_settings().database == "kestrel.db"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KESTREL_WEB_PORT", "8080"),  # a setting guessed, not a service's address
        ("KESTREL_WEB_SERVICE_HOST", "kestrel.example.com"),
        ("KESTREL_REPLICA__LEASE_PORT", "tcp://10.0.0.1:80"),  # a setting's path, with __
    ],
)
def test_a_look_alike_that_is_no_service_link_is_still_named(
    here: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"{name}: unknown variable"):
        load_settings()


def test_every_secret_comes_from_its_file_without_the_newline(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [
        "SLACK_BOT_TOKEN",
        "SLACK_SIGNING_SECRET",
        "SLACK_APP_TOKEN",
        "DISCORD_TOKEN",
        "OPENAI_API_KEY",
        "KESTREL_WEB_TOKEN",
        "KESTREL_WEB_SECRET",
    ]
    for name in names:
        (here / name).write_text(f"{name.lower()}-value\r\n" if "WEB" in name else f"{name}-v\n")
        monkeypatch.setenv(f"{name}_FILE", str(here / name))
    found = environment()
    assert found["SLACK_BOT_TOKEN"] == "SLACK_BOT_TOKEN-v"
    assert found["KESTREL_WEB_SECRET"] == "kestrel_web_secret-value"
    settings = load_settings()
    assert settings.openai_api_key is not None
    assert settings.openai_api_key.get_secret_value() == "OPENAI_API_KEY-v"


def test_an_unreadable_secret_file_is_one_line(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY_FILE", str(here / "missing"))
    with pytest.raises(ConfigError) as caught:
        load_settings()
    said = str(caught.value)
    assert said == f"OPENAI_API_KEY_FILE: cannot read {here / 'missing'}: No such file or directory"
    monkeypatch.setenv("OPENAI_API_KEY_FILE", str(here))
    with pytest.raises(ConfigError, match=r"cannot read .*: Is a directory"):
        load_settings()


@pytest.mark.parametrize("held", ["", "\n", "  \r\n"])
def test_a_secret_file_that_holds_nothing_is_one_line(
    here: Path, monkeypatch: pytest.MonkeyPatch, held: str
) -> None:
    # A secret mounted empty was read as a key never set: a replica started the scripted demo
    # model instead of refusing to start, now that a blank OPENAI_API_KEY is none.
    (here / "key").write_text(held)
    monkeypatch.setenv("OPENAI_API_KEY_FILE", str(here / "key"))
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert (
        str(caught.value) == f"OPENAI_API_KEY_FILE: {here / 'key'} is empty: the secret goes in it"
    )


def test_a_blank_secret_beside_its_file_is_not_given(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``OPENAI_API_KEY=`` left blank by a compose file that also mounts the key's file.
    (here / "key").write_text("sk-from-file\n")
    monkeypatch.setenv("OPENAI_API_KEY_FILE", str(here / "key"))
    monkeypatch.setenv("OPENAI_API_KEY", " ")
    key = load_settings().openai_api_key
    assert key is not None and key.get_secret_value() == "sk-from-file"


def test_a_secret_given_both_ways_is_refused(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (here / "token").write_text("xoxb-1\n")
    monkeypatch.setenv("SLACK_BOT_TOKEN_FILE", str(here / "token"))
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-2")
    with pytest.raises(ConfigError, match="SLACK_BOT_TOKEN and SLACK_BOT_TOKEN_FILE are both set"):
        environment()


def test_a_secret_s_surrounding_blanks_are_dropped_from_a_variable_or_a_file(
    here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Secret made --from-file and read into a variable keeps the file's newline; an editor
    # may leave a blank line after the key. Sent as it was, the key was refused by the HTTP
    # client as a header it will not send.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-a-variable\n")
    (here / "token").write_text("xoxb-from-a-file\n\n")
    monkeypatch.setenv("SLACK_BOT_TOKEN_FILE", str(here / "token"))
    settings = load_settings()
    assert settings.openai_api_key is not None
    assert settings.openai_api_key.get_secret_value() == "sk-from-a-variable"
    assert environment()["SLACK_BOT_TOKEN"] == "xoxb-from-a-file"


def test_serve_refuses_a_secret_file_of_two_lines_naming_the_file(here: Path) -> None:
    # Two tokens pasted into one file: the Web API's client refused the header, and serve
    # said "slack: cannot reach …: check SLACK_API_URL", naming the wrong thing.
    (here / "kestrel.yaml").write_text("database: kestrel.db\ntools: []\n")
    (here / "token").write_text("xoxb-old-5e1d7c\nxoxb-new-9a3f2b\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KESTREL_", "SLACK_"))}
    env.update(
        SLACK_BOT_TOKEN_FILE=str(here / "token"),
        SLACK_SIGNING_SECRET="signing-secret",
        SLACK_API_URL="http://127.0.0.1:9/api/",
        PYTHONPATH=str(ROOT),
    )
    done = subprocess.run(
        [*KESTREL, "serve", "slack", "--port", "0"],
        env=env,
        cwd=here,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"kestrel: SLACK_BOT_TOKEN_FILE: {here / 'token'} holds a line break or another"
        " control character: the secret alone goes in it, on one line\n"
    )


def test_on_call_s_commands_run_from_a_folder_the_user_may_not_search(tmp_path: Path) -> None:
    # deploy.md: `sudo -u kestrel env KESTREL_CONFIG=… kestrel runs pending`, typed in root's
    # home (0700): looking for ./.env and ./kestrel.yaml there ended in a PermissionError's
    # traceback.
    etc, home = tmp_path / "etc", tmp_path / "home"
    etc.mkdir()
    home.mkdir()
    (etc / "kestrel.yaml").write_text(
        "database: kestrel.db\ntools: []\nmodel: {provider: scripted}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KESTREL_", "OPENAI_"))}
    env.update(KESTREL_CONFIG=str(etc / "kestrel.yaml"), PYTHONPATH=str(ROOT))
    # The folder made unsearchable from inside it; root, which searches any, loses the right.
    if os.geteuid() == 0 and SETPRIV is None:
        pytest.skip("root, and no setpriv to drop its right to search any folder")
    shut = ["sh", "-c", 'chmod 0 . && exec "$@"', "sh", *unprivileged()]
    try:
        for args in (["db", "migrate"], ["run", "hello"], ["runs", "list"], ["runs", "pending"]):
            done = subprocess.run(
                [*shut, *KESTREL, *args],
                env=env,
                cwd=home,
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
            assert done.returncode == 0, (args, done.stderr[-2000:])
            assert "Traceback" not in done.stderr, (args, done.stderr[-2000:])
    finally:
        home.chmod(0o700)


def test_a_postgresql_socket_url_is_named_by_its_socket_folder(here: Path) -> None:
    # libpq's form for a server on this host's socket (a systemd host's PostgreSQL): the URL
    # lost its "//" on the way, and a failure named "PostgreSQL localhost", not the folder.
    sockets = here / "no-server-here"
    url = f"postgresql:///kestrel?host={sockets}&user=kestrel"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KESTREL_")}
    env.update(KESTREL_DATABASE_URL=url, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [*KESTREL, "db", "check"], env=env, cwd=here, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"kestrel: PostgreSQL kestrel@{sockets}/kestrel: connect failed")


def test_runs_list_names_an_unreadable_key_file_as_the_full_way_does(here: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KESTREL_", "OPENAI_"))}
    env.update(OPENAI_API_KEY_FILE=str(here / "missing"), PYTHONPATH=str(ROOT))
    for args in (["runs", "list"], ["runs", "list", "--json"]):
        done = subprocess.run(
            [*KESTREL, *args], env=env, cwd=here, capture_output=True, text=True, check=False
        )
        assert done.returncode == 2
        assert done.stderr.startswith("kestrel: OPENAI_API_KEY_FILE: cannot read"), done.stderr


def test_a_bad_log_level_is_one_line(here: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KESTREL_")}
    env.update(KESTREL_LOG_LEVEL="loud", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [*KESTREL, "runs", "list"], env=env, cwd=here, capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert done.stderr == (
        "kestrel: KESTREL_LOG_LEVEL must be one of debug, info, warning, error, not 'loud'\n"
    )


def test_a_bad_log_level_with_json_logs_asked_is_one_json_record(here: Path) -> None:
    # The chart's logLevel mistyped: the pod's one line was text, which a shipper parsing the
    # JSON lines it was promised could not read.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KESTREL_")}
    env.update(KESTREL_LOG_LEVEL="loud", KESTREL_LOG_FORMAT="json", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [*KESTREL, "serve"], env=env, cwd=here, capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    record = json.loads(line)
    assert record["level"] == "error" and record["logger"] == "kestrel"
    assert (
        record["message"]
        == "KESTREL_LOG_LEVEL must be one of debug, info, warning, error, not 'loud'"
    )


async def test_a_replica_that_never_sent_a_heartbeat_is_not_ready(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "kestrel.db")
    await store.migrate()
    try:
        health = Health(store, "replica-a", alive_within=30)
        await health.start(await store.schema_version())
        said = await health.check()
        assert list(said.problems) == ["replica"]
        assert said.problems["replica"] == (
            "replica-a has sent no heartbeat in the last 30 s (not registered)"
        )
        await store.heartbeat("replica-a")
        assert (await health.check()).ready
        health.stopping = True
        assert list((await health.check()).problems) == ["shutdown"]
        await health.stop()
    finally:
        await store.close()


async def test_readiness_answers_within_one_check_s_bound_when_the_store_is_slow() -> None:
    # The store's check, then the registration's, one after the other: each within the 3 s
    # bound, two in a row took up to 6 s, past the chart's readiness timeoutSeconds (5), so a
    # store answering slowly made the kubelet's probe time out on a replica that said ready.
    pod = one(render_chart(A_DATABASE), "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["readinessProbe"]["timeoutSeconds"] > CHECK_SECONDS + 0.5
    dsn = postgres_dsn()
    async with postgres_schema(dsn) as schema, proxied_dsn(dsn) as (proxied, proxy):
        store = PostgresStore(proxied, schema=schema)
        await store.migrate()
        try:
            await store.heartbeat("replica-a")
            health = Health(store, "replica-a", alive_within=30)
            await health.start(await store.schema_version())
            for _ in range(3):  # at full speed: each pooled connection prepares each read
                assert (await health.check()).ready
            proxy.slow(CHECK_SECONDS * 2 / 3)  # each read answers within the bound
            started = time.monotonic()
            said = await health.check()
            took = time.monotonic() - started
            proxy.slow(0)
            await health.stop()
        finally:
            await store.close()
    assert said.ready, said
    assert took < CHECK_SECONDS + 0.5, took


@asynccontextmanager
async def ready_sqlite_replica(path: Path) -> AsyncIterator[Health]:
    """The health of a replica writing the SQLite file ``path``, ready (checked), stopped and
    its store closed afterwards."""
    store = SqliteStore(path)
    await store.migrate()
    try:
        health = Health(store, "replica-a", alive_within=30)
        await health.start(await store.schema_version())
        await store.heartbeat("replica-a")
        assert (await health.check()).ready
        yield health
        await health.stop()
    finally:
        await store.close()


async def test_a_sqlite_journal_deleted_or_replaced_under_a_replica_is_not_ready(
    tmp_path: Path,
) -> None:
    # The writer holds the file open: once it is deleted (or another file put in its place)
    # every commit goes to a file no restart will read, yet /readyz said 200.
    path = tmp_path / "kestrel.db"
    async with ready_sqlite_replica(path) as health:
        path.rename(tmp_path / "moved.db")
        said = await health.check()
        assert list(said.problems) == ["store"]
        assert str(path) in said.problems["store"] and "no longer" in said.problems["store"]
        (tmp_path / "moved.db").rename(path)
        assert (await health.check()).ready
        path.unlink()
        path.write_bytes(b"")  # another file at the path
        assert "no longer" in (await health.check()).problems["store"]


async def test_a_sqlite_journal_s_write_ahead_log_deleted_under_a_replica_is_not_ready(
    tmp_path: Path,
) -> None:
    # `rm kestrel.db-*` to tidy up, or a backup restored without it: the writer kept
    # committing to the log it held open, which no other process and no restart reads; every
    # mention acknowledged since was lost, while /readyz said 200.
    async with ready_sqlite_replica(tmp_path / "kestrel.db") as health:
        wal = tmp_path / "kestrel.db-wal"
        wal.unlink()
        said = await health.check()
        assert list(said.problems) == ["store"]
        assert str(wal) in said.problems["store"], said.problems


class _Asked(dict[str, str]):
    """An environment that notes every name asked of it."""

    def __init__(self, **given: str) -> None:
        super().__init__(given)
        self.asked: set[str] = set()

    def get(self, name: str, default: Any = None) -> Any:
        self.asked.add(name)
        return super().get(name, default)

    def __getitem__(self, name: str) -> str:
        self.asked.add(name)
        return super().__getitem__(name)


def test_every_variable_serve_reads_is_in_env_example() -> None:
    # configuration.md: "Every variable the program reads is in .env.example", an operator's
    # one list of them; a variable read but left out there is a knob nobody finds.
    from adapters.discord.settings import DiscordSettings
    from adapters.slack.settings import SlackSettings
    from adapters.web.auth import WebConfig
    from bot.config.settings import WebSettings
    from bot.logs import chosen

    environ = _Asked(DISCORD_TOKEN="d", SLACK_BOT_TOKEN="xoxb-1", SLACK_SIGNING_SECRET="s")
    DiscordSettings.from_env(environ)
    SlackSettings.from_env(environ)
    WebConfig.from_settings(WebSettings(), environ)
    chosen(None, environ)
    listed = (ROOT / ".env.example").read_text()
    assert len(environ.asked) > 10, environ.asked
    assert [name for name in sorted(environ.asked) if f"# {name}=" not in listed] == []
