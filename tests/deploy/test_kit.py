"""The deployment kit checked as far as this machine can without a container daemon or a
cluster: hadolint on the Dockerfile, the chart rendered by Helm with several value sets and every
manifest validated against the Kubernetes schemas, the compose file against the compose spec,
the systemd unit by systemd-analyze, and the configuration they ship loaded by Kestrel."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot import __version__
from bot.cli.common import EXIT_TEMPFAIL, EXIT_USAGE
from bot.config.settings import Settings, load_settings
from bot.config.sources import SECRET_FILE_VARIABLES
from storage.postgres import _MIGRATION_TIMEOUT
from tests.deploy.kit import (
    A_DATABASE,
    CHART,
    COMPOSE,
    DATABASE_URL,
    DEPLOY,
    DOCKERFILE,
    UNIT,
    compose_environment,
    dockerfile_instructions,
    dockerfile_stages,
    exec_form,
    healthcheck_argv,
    healthcheck_seconds,
    one,
    render_chart,
    unit_service,
)
from tests.fakes.pg_password import PasswordTaker
from tests.fakes.processes import KESTREL, ROOT, clean_env

BIN = Path(sys.executable).parent
KUBERNETES = "1.30.0"
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults and a database URL": A_DATABASE,
    "everything": {
        "replicaCount": 3,
        "platforms": ["slack", "discord"],
        "ingress": {"enabled": True, "className": "nginx", "tlsSecretName": "kestrel-tls"},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
        "replica": {"shutdownGraceSeconds": 45},
        "secret": {
            "values": {
                "KESTREL_DATABASE_URL": "postgresql://kestrel:pw@postgres:5432/kestrel",
                "SLACK_BOT_TOKEN": "xoxb-1",
                "SLACK_SIGNING_SECRET": "s",
                "DISCORD_TOKEN": "d",
                "KESTREL_WEB_TOKEN": "w",
            }
        },
        "extraEnv": [{"name": "KESTREL_MODEL__NAME", "value": "gpt-4.1"}],
    },
    "existing secret, no budget": {
        "replicaCount": 1,
        "platforms": ["discord"],
        "podDisruptionBudget": {"enabled": False},
        "secret": {
            "existingSecret": "team-kestrel",
            "keys": ["DISCORD_TOKEN", "KESTREL_DATABASE_URL", "OPENAI_API_KEY"],
        },
        "serviceMonitor": {"enabled": True, "bearerTokenKey": ""},
    },
    "a database URL from another Secret": {
        "extraEnv": [
            {
                "name": "KESTREL_DATABASE_URL",
                "valueFrom": {"secretKeyRef": {"name": "pg-app", "key": "uri"}},
            }
        ]
    },
    "a database in kestrel.yaml (its password in PGPASSFILE)": {
        "config": "database: postgresql://kestrel@pg/kestrel\ntools: []\n",
    },
    # The chart's list of them is SECRET_FILE_VARIABLES, kept by hand in the template.
    "every secret Kestrel reads from a file": {
        "secret": {
            "values": {"KESTREL_DATABASE_URL": DATABASE_URL}
            | {name: "x" for name in SECRET_FILE_VARIABLES}
        }
    },
    "secrets for catalog commands": {
        "secret": {
            "values": {
                "KESTREL_DATABASE_URL": DATABASE_URL,
                "SLACK_BOT_TOKEN": "xoxb-1",
                "GITHUB_TOKEN": "g",
                "SLACK_BOT_TOKN": "t",
            }
        }
    },
}


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    done = subprocess.run(
        [str(BIN / "hadolint"), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_runs_kestrel_serve_as_a_user_and_finds_its_configuration() -> None:
    final = dockerfile_instructions()
    base = final[0][1]
    assert base.startswith("python:") and "slim" in base
    words = {word for word, _ in final}
    assert "USER" in words and "HEALTHCHECK" in words
    (user,) = [rest for word, rest in final if word == "USER"]
    assert not user.startswith(("0", "root"))
    (entrypoint,) = [exec_form(rest) for word, rest in final if word == "ENTRYPOINT"]
    (cmd,) = [exec_form(rest) for word, rest in final if word == "CMD"]
    assert entrypoint == ["kestrel"] and cmd[0] == "serve"
    # No compiler in the final stage: it installs nothing, it copies the built virtualenv.
    assert not any(word == "RUN" and "apt-get" in rest for word, rest in final)
    env = " ".join(rest for word, rest in final if word == "ENV")
    assert "KESTREL_CONFIG=/etc/kestrel/kestrel.yaml" in env
    copies = [rest for word, rest in final if word == "COPY"]
    assert "deploy/kestrel.yaml /etc/kestrel/kestrel.yaml" in copies
    assert healthcheck_argv()[:2] == ["kestrel", "health"]
    # Nothing goes into the build context unless named: never .env, a journal or .git.
    rules = [r for r in (ROOT / ".dockerignore").read_text().splitlines() if r and r[0] != "#"]
    assert rules[0] == "*" and not any(".env" in r or ".db" in r for r in rules)


def test_the_build_stage_has_every_file_the_package_metadata_names() -> None:
    # license-files names LICENSE, which neither the build context nor the stage's COPY let
    # in: the wheel was built without its licence, setuptools warning that such a build stops
    # being supported (2027-02-18).
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = [project["readme"], *project["license-files"]]
    copied = " ".join(rest for word, rest in dockerfile_stages()[0] if word == "COPY").split()
    rules = (ROOT / ".dockerignore").read_text().splitlines()
    assert [name for name in named if name not in copied or f"!{name}" not in rules] == []


def test_the_image_ships_bytecode_it_can_use() -> None:
    # Its root is read-only and it sets PYTHONDONTWRITEBYTECODE: bytecode not made at build is
    # made again, in memory, at every start of every replica (and every HEALTHCHECK).
    final = dockerfile_instructions()
    assert "PYTHONDONTWRITEBYTECODE=1" in " ".join(rest for word, rest in final if word == "ENV")
    build = " ".join(rest for word, rest in dockerfile_stages()[0] if word == "RUN")
    # Hashes unchecked: a copy that changes the sources' times leaves it valid.
    assert "-m compileall -q --invalidation-mode unchecked-hash /opt/kestrel/lib" in build
    assert ("COPY", "--from=build /opt/kestrel /opt/kestrel") in final


def test_the_image_configuration_and_catalog_load(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("KESTREL_", "OPENAI_")):
            monkeypatch.delenv(name)
    settings = load_settings(str(DEPLOY / "kestrel.yaml"))
    assert settings.tool_patterns() == ["tools/*.yaml"]
    assert settings.replica.shutdown_grace_seconds == 20
    _check_catalogs([DEPLOY / "tools" / "checks.yaml"])


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_the_chart_renders_manifests_kubernetes_accepts(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kubernetes_validate  # type: ignore[import-untyped]

    values = VALUE_SETS[name]
    documents = render_chart(values)
    for doc in documents:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD's: no Kubernetes schema; checked by hand below
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    deployment = one(documents, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    given = values or {}
    assert deployment["spec"]["replicas"] == given.get("replicaCount", 2)
    assert pod["enableServiceLinks"] is False
    grace = given.get("replica", {}).get("shutdownGraceSeconds", 20)
    assert pod["terminationGracePeriodSeconds"] > grace
    (container,) = pod["containers"]
    env = {item["name"]: item for item in container["env"]}
    assert env["KESTREL_REPLICA__SHUTDOWN_GRACE_SECONDS"]["value"] == str(grace)
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Nothing listens until the schema is migrated: the startup probe outlasts a migration.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] > _MIGRATION_TIMEOUT
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["args"][0] == "serve"
    secret = given.get("secret", {})
    keys = set(secret.get("keys", []) or secret.get("values", {}))
    # Files only for the secrets Kestrel reads from one and hides from catalog commands: any
    # other key mounted beside them would be a file a command could read.
    file_keys = sorted(keys & set(SECRET_FILE_VARIABLES))
    for key in file_keys:
        assert env[f"{key}_FILE"]["value"] == f"/run/secrets/kestrel/{key}"
    mounted = [v["secret"]["items"] for v in pod["volumes"] if v["name"] == "secrets"]
    assert mounted == ([[{"key": k, "path": k} for k in file_keys]] if file_keys else [])
    mounts = [m["name"] for m in container["volumeMounts"]]
    assert ("secrets" in mounts) == bool(file_keys)
    for key in keys - set(SECRET_FILE_VARIABLES):  # the database URL, a catalog's env: secret
        assert env[key]["valueFrom"]["secretKeyRef"]["key"] == key
        assert f"{key}_FILE" not in env
    budget = [doc for doc in documents if doc["kind"] == "PodDisruptionBudget"]
    assert len(budget) == (0 if "no budget" in name else 1)
    assert one(documents, "Service")["spec"]["ports"][0]["targetPort"] == "http"
    ingresses = [doc for doc in documents if doc["kind"] == "Ingress"]
    if given.get("ingress", {}).get("enabled"):
        paths = ingresses[0]["spec"]["rules"][0]["http"]["paths"]
        assert [p["path"] for p in paths] == ["/slack/events"]
    else:
        assert not ingresses
    monitors = [doc for doc in documents if doc["kind"] == "ServiceMonitor"]
    assert len(monitors) == (1 if given.get("serviceMonitor", {}).get("enabled") else 0)
    for monitor in monitors:
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics" and endpoint["port"] == "http"
        assert monitor["spec"]["selector"] == deployment["spec"]["selector"]
    _loads_as_kestrel(documents, tmp_path, monkeypatch)


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"secret": {"existingSecret": "team-kestrel", "keys": ["SLACK_BOT_TOKEN"]}},
        {"config": "database: kestrel.db\n"},
    ],
)
def test_the_chart_refuses_to_render_without_a_shared_database(values: dict[str, Any]) -> None:
    # Else each pod opened a SQLite journal of its own in /etc/kestrel, on a read-only root.
    import helm_python

    with pytest.raises(helm_python.HelmRenderError, match="KESTREL_DATABASE_URL=postgresql://"):
        render_chart(values)


# Each a secret given where every reader of the release sees it: a ConfigMap (kestrel.yaml) or
# the Deployment's spec (extraEnv's value), both shown by `kubectl get -o yaml` to anyone who
# may read them, and by `helm get values`, where a Secret would keep it.
SECRETS_IN_THE_OPEN = {
    "an API key in kestrel.yaml": (
        {**A_DATABASE, "config": "openai_api_key: sk-live-5e1d7c3a9b\ntools: []\n"},
        "config holds openai_api_key",
    ),
    "the database's password in kestrel.yaml": (
        {"config": "database: postgresql://kestrel:pw-9c4e@pg:5432/kestrel\ntools: []\n"},
        "config holds a URL with a password",
    ),
    "a proxy's password in kestrel.yaml": (
        {**A_DATABASE, "config": "openai_base_url: http://me:pw-2f8b@proxy:3128/v1\n"},
        "config holds a URL with a password",
    ),
    "an API key under a quoted key in kestrel.yaml": (
        {**A_DATABASE, "config": '"openai_api_key": sk-live-5e1d7c3a9b\ntools: []\n'},
        "config holds openai_api_key",
    ),
    "an API key in kestrel.yaml's flow style": (
        {**A_DATABASE, "config": "{openai_api_key: sk-live-5e1d7c3a9b, tools: []}\n"},
        "config holds openai_api_key",
    ),
    "the database's password as its URL's parameter in kestrel.yaml": (
        {"config": "database: postgresql://kestrel@pg/kestrel?sslmode=require&password=pw-9c4e\n"},
        "config holds a URL with a password",
    ),
    "the database's password as its URL's parameter in extraEnv": (
        {
            "extraEnv": [
                {"name": "KESTREL_DATABASE_URL", "value": "postgresql://pg/kestrel?password=pw-1"}
            ]
        },
        "extraEnv KESTREL_DATABASE_URL holds a URL with a password",
    ),
    "the database URL with its password in extraEnv": (
        {"extraEnv": [{"name": "KESTREL_DATABASE_URL", "value": DATABASE_URL}]},
        "extraEnv KESTREL_DATABASE_URL holds a URL with a password",
    ),
    "a token in extraEnv": (
        {**A_DATABASE, "extraEnv": [{"name": "SLACK_BOT_TOKEN", "value": "xoxb-7a3e9c1b5d"}]},
        "extraEnv SLACK_BOT_TOKEN is a secret",
    ),
    "the database's password in extraEnv": (
        {
            "config": "database: postgresql://kestrel@pg:5432/kestrel\n",
            "extraEnv": [{"name": "PGPASSWORD", "value": "pw-4d0b8f2c"}],
        },
        "extraEnv PGPASSWORD is a secret",
    ),
}


@pytest.mark.parametrize("name", list(SECRETS_IN_THE_OPEN))
def test_the_chart_refuses_a_secret_outside_the_secret(name: str) -> None:
    # Else it sits in a ConfigMap or the pod's spec, which RBAC lets far more people read.
    import helm_python

    values, said = SECRETS_IN_THE_OPEN[name]
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(said)) as refused:
        render_chart(values)
    assert "secret.values" in str(refused.value)
    for secret in ("sk-live", "pw-", "xoxb-"):
        assert secret not in str(refused.value)  # the refusal is shown, logged, pasted


def test_the_chart_takes_a_secret_extra_env_composes_from_another() -> None:
    # Kubernetes expands $(NAME) from the variables before it, one a secretKeyRef's: the spec
    # holds the reference, never the password. A DSN is often composed so.
    password = {"name": "PG_PASS", "valueFrom": {"secretKeyRef": {"name": "pg", "key": "pw"}}}
    key = {"name": "RAW_KEY", "valueFrom": {"secretKeyRef": {"name": "ai", "key": "key"}}}
    extra = [
        password,
        key,
        {"name": "KESTREL_DATABASE_URL", "value": "postgresql://kestrel:$(PG_PASS)@pg/kestrel"},
        {"name": "OPENAI_API_KEY", "value": "$(RAW_KEY)"},
    ]
    env = one(render_chart({"extraEnv": extra}), "Deployment")["spec"]["template"]["spec"]
    values = {e["name"]: e.get("value") for e in env["containers"][0]["env"]}
    assert values["OPENAI_API_KEY"] == "$(RAW_KEY)"


def test_the_chart_takes_an_empty_api_key_in_its_config() -> None:
    # An empty key is no secret (Kestrel reads it as unset): nothing to keep in the Secret.
    for written in ('""', "null", "", "~"):
        render_chart({**A_DATABASE, "config": f"openai_api_key: {written}\ntools: []\n"})


def test_the_chart_refuses_a_scrape_with_a_token_the_secret_lacks() -> None:
    # Else the Prometheus Operator finds no such key, and the metrics are silently not scraped.
    import helm_python

    values = {**A_DATABASE, "serviceMonitor": {"enabled": True}}
    with pytest.raises(helm_python.HelmRenderError, match="bearerTokenKey is KESTREL_WEB_TOKEN"):
        render_chart(values)


# Each a shutdown grace given past replica.shutdownGraceSeconds, which sets it and the pod's
# terminationGracePeriodSeconds: in extraEnv it won (the later variable of a name does) and the
# kubelet killed the replica while it still waited for a command; in config the chart's
# variable won, and the grace asked for was silently not the one kept.
GRACES_PAST_THE_CHART: dict[str, dict[str, Any]] = {
    "extraEnv": {"extraEnv": [{"name": "KESTREL_REPLICA__SHUTDOWN_GRACE_SECONDS", "value": "60"}]},
    "extraEnv, in lower case": {
        "extraEnv": [{"name": "kestrel_replica__shutdown_grace_seconds", "value": "60"}]
    },
    "extraEnv, the section as JSON": {
        "extraEnv": [{"name": "KESTREL_REPLICA", "value": '{"shutdown_grace_seconds": 60}'}]
    },
    "config": {"config": "replica:\n  shutdown_grace_seconds: 60\n"},
}


@pytest.mark.parametrize("where", list(GRACES_PAST_THE_CHART))
def test_the_chart_refuses_a_shutdown_grace_given_past_its_value(where: str) -> None:
    import helm_python

    values = {**A_DATABASE, **GRACES_PAST_THE_CHART[where]}
    with pytest.raises(helm_python.HelmRenderError, match=r"set replica\.shutdownGraceSeconds"):
        render_chart(values)


def test_the_chart_takes_the_replica_s_other_settings_in_config() -> None:
    pod = one(
        render_chart({**A_DATABASE, "config": "replica:\n  lease_seconds: 10\n"}), "Deployment"
    )
    assert pod["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 40


def test_the_chart_deploys_the_package_s_version() -> None:
    # The image's tag defaults to the chart's appVersion: behind the package, the chart pulls
    # an older image; and the image docs/deploy.md builds must be the one it pulls.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    # The chart is versioned with the package, in SemVer as Helm needs (0.3.0.dev0 is
    # 0.3.0-dev.0, a pre-release `helm install` takes only with --devel).
    assert chart["version"] == re.sub(r"\.dev(\d+)$", r"-dev.\1", __version__)
    built = f"docker build -f deploy/Dockerfile -t registry.example.com/kestrel:{__version__} "
    assert built in (ROOT / "docs" / "deploy.md").read_text()


def test_helm_lint_finds_no_error() -> None:
    import helm_python

    for values in VALUE_SETS.values():
        report = helm_python.lint(str(CHART), values, strict=False)
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not problems and not report["errors"], report


def test_the_compose_file_is_valid_and_runs_two_replicas_on_postgres() -> None:
    done = subprocess.run(
        [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    replicas = [s for name, s in services.items() if name.startswith("kestrel")]
    assert len(replicas) == 2 and "postgres" in services
    for service in replicas:
        assert service["env_file"] == [".env"]
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert service["environment"]["KESTREL_DATABASE_URL"].startswith("postgresql://")
        assert service["command"][0] == "serve" and service["ports"]
        assert service["healthcheck"]["test"][1:3] == ["kestrel", "health"]
        # What the image copies from deploy/ is mounted from there: an edit of kestrel.yaml or
        # of a catalog takes effect at a restart, without building the image again.
        mounted = {m.split(":")[1]: m.split(":")[0] for m in service["volumes"]}
        for word, rest in dockerfile_instructions():
            if word == "COPY" and rest.startswith("deploy/"):
                source, target = rest.split()
                assert (COMPOSE.parent / mounted[target.rstrip("/")]) == ROOT / source.rstrip("/")


def _health_checks() -> list[tuple[str, list[str], float]]:
    """Each health check the kit runs: where, its command, and how long its runtime lets it run."""
    checks = [("the image", healthcheck_argv(), healthcheck_seconds())]
    for name, service in yaml.safe_load(COMPOSE.read_text())["services"].items():
        if name.startswith("kestrel"):
            check = service["healthcheck"]
            seconds = float(str(check["timeout"]).removesuffix("s"))
            checks.append((f"compose {name}", check["test"][1:], seconds))
    return checks


def test_no_process_of_a_replica_can_gain_a_privilege() -> None:
    # Catalog commands are what runs untrusted: without no_new_privs a setuid program of the
    # image (su, mount, passwd) or a file capability could give one what the user lacks. The
    # systemd unit had NoNewPrivileges=yes; the chart and Compose left it to the runtime.
    pod = one(render_chart(A_DATABASE), "Deployment")["spec"]["template"]["spec"]
    context = pod["containers"][0]["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"] and context["readOnlyRootFilesystem"]
    for name, service in yaml.safe_load(COMPOSE.read_text())["services"].items():
        if name.startswith("kestrel"):
            assert "no-new-privileges:true" in service["security_opt"], name
            assert service["cap_drop"] == ["ALL"], name
    assert re.search(r"^NoNewPrivileges=yes$", UNIT.read_text(), re.MULTILINE)


def test_a_health_check_that_gets_no_answer_says_so_before_it_is_killed() -> None:
    # kestrel health waited its default 5 s for a replica that accepts and never answers (a
    # loop stuck, a full backlog), as long as Docker's --timeout=5s: Docker killed it first and
    # `docker inspect` said "Health check exceeded timeout", never the line it would have.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        # Side by side, each against its own deadline: one after the other, they waited 11 s.
        checks = []
        for where, argv, seconds in _health_checks():
            assert argv[:2] == ["kestrel", "health"], where
            url = argv[argv.index("--url") + 1].replace(":3000/", f":{port}/")
            argv = [*argv[2:]]
            argv[argv.index("--url") + 1] = url
            check = subprocess.Popen(
                [*KESTREL, "health", *argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            checks.append((where, check, time.monotonic() + seconds))
        try:
            for where, check, deadline in checks:
                _, err = check.communicate(timeout=max(0.0, deadline - time.monotonic()))
                assert check.returncode == 1 and "timed out" in err, (where, err)
        finally:
            for _, check, _ in checks:
                check.kill()
                check.wait()


def test_a_readiness_check_waits_for_readiness_s_own_answer() -> None:
    # /readyz gives each check 3 s: a health check that gave up sooner said "timed out" where
    # the replica was about to say which check failed (the store: no answer within 3 s).
    from bot.replica.health import CHECK_SECONDS

    for where, argv, _ in _health_checks():
        if argv[argv.index("--url") + 1].endswith("/readyz"):
            assert float(argv[argv.index("--timeout") + 1]) > CHECK_SECONDS + 0.5, where


# A password as `openssl rand -base64` and people make them: Compose gives it to PostgreSQL as
# it is, so it may hold what a URL cannot.
A_PASSWORD = "Zx9/Qp+r4T#@?%2F=="


async def test_the_compose_replicas_log_in_with_any_password(tmp_path: Path) -> None:
    (tmp_path / "kestrel.yaml").write_text("tools: []\n")
    async with PasswordTaker() as postgres:
        for service in ("kestrel-1", "kestrel-2"):
            env = compose_environment(service, {"POSTGRES_PASSWORD": A_PASSWORD})
            here = {
                k: v.replace("@postgres:5432/", f"@127.0.0.1:{postgres.port}/")
                for k, v in env.items()
            }
            done = await asyncio.to_thread(
                subprocess.run,
                [*KESTREL, "db", "check"],
                env=clean_env(KESTREL_CONFIG=str(tmp_path / "kestrel.yaml"), **here),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert "password authentication failed" in done.stderr, done.stderr
            assert A_PASSWORD not in done.stderr
    assert postgres.passwords and set(postgres.passwords) == {A_PASSWORD}


async def test_a_password_file_credential_logs_in_as_docs_deploy_md_says(tmp_path: Path) -> None:
    # The systemd form's PostgreSQL password: a credential (a file only the service may read)
    # named by PGPASSFILE, and a URL without the password.
    (tmp_path / "kestrel.yaml").write_text("tools: []\n")
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    async with PasswordTaker() as postgres:
        pgpass = credentials / "pgpass"
        pgpass.write_text(f"127.0.0.1:{postgres.port}:kestrel:kestrel:{A_PASSWORD}\n")
        pgpass.chmod(0o400)  # as systemd hands a credential over
        env = clean_env(
            KESTREL_CONFIG=str(tmp_path / "kestrel.yaml"),
            KESTREL_DATABASE_URL=f"postgresql://kestrel@127.0.0.1:{postgres.port}/kestrel",
            PGPASSFILE=str(pgpass),
        )
        done = await asyncio.to_thread(
            subprocess.run,
            [*KESTREL, "db", "check"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert "password authentication failed" in done.stderr, done.stderr
    assert postgres.passwords and set(postgres.passwords) == {A_PASSWORD}


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_analyze_finds_nothing_in_the_unit(tmp_path: Path) -> None:
    # The unit as installed, but with a program and a user that exist on this machine.
    text = UNIT.read_text().replace("/opt/kestrel/bin/kestrel", shutil.which("true") or "")
    text = text.replace("User=kestrel", "User=root").replace("Group=kestrel", "Group=root")
    unit = tmp_path / "kestrel.service"
    unit.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    said = [line for line in done.stderr.splitlines() if str(unit) in line]
    assert done.returncode == 0 and not said, done.stderr
    assert "ExecStart=/opt/kestrel/bin/kestrel serve" in UNIT.read_text()


def _loads_as_kestrel(
    documents: list[dict[str, Any]], folder: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """The chart's kestrel.yaml and catalogs, laid out as the pod mounts them, load."""
    config_maps = {
        doc["metadata"]["name"]: doc["data"] for doc in documents if doc["kind"] == "ConfigMap"
    }
    (folder / "tools").mkdir()
    (folder / "kestrel.yaml").write_text(config_maps["kestrel"]["kestrel.yaml"])
    for name, text in config_maps["kestrel-catalogs"].items():
        (folder / "tools" / name).write_text(text)
    for name in list(os.environ):
        if name.startswith(("KESTREL_", "OPENAI_")):
            monkeypatch.delenv(name)
    settings = load_settings(str(folder / "kestrel.yaml"))
    _check_catalogs(sorted((folder / "tools").glob("*.yaml")))
    return settings


def _check_catalogs(files: list[Path]) -> None:
    done = subprocess.run(
        [str(BIN / "kestrel"), "tools", "check", *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_every_stop_allowance_holds_serve_s_whole_stop() -> None:
    # serve's stop ends by the grace + STOP_MARGIN_SECONDS, and ends itself EXIT_SECONDS
    # later whatever it waits on: what Helm, Compose and the unit allow before SIGKILL must
    # hold both, or a stop that needed them all is killed half-written.
    from bot.cli.chat_cmd import STOP_MARGIN_SECONDS
    from bot.cli.stopping import EXIT_SECONDS

    grace = Settings().replica.shutdown_grace_seconds
    whole = grace + STOP_MARGIN_SECONDS + EXIT_SECONDS
    values = yaml.safe_load((DEPLOY / "helm" / "kestrel" / "values.yaml").read_text())
    assert values["replica"]["shutdownGraceSeconds"] == grace
    assert values["replica"]["terminationMarginSeconds"] >= STOP_MARGIN_SECONDS + EXIT_SECONDS
    compose = yaml.safe_load(COMPOSE.read_text())
    for name, service in compose["services"].items():
        if name.startswith("kestrel"):
            assert float(service["stop_grace_period"].removesuffix("s")) >= whole
    unit = UNIT.read_text()
    (allowed,) = re.findall(r"^TimeoutStopSec=(\d+)$", unit, re.MULTILINE)
    assert float(allowed) >= whole


def test_the_unit_restarts_on_an_outage_but_not_on_a_mistake() -> None:
    # `kestrel serve` exits 2 for a configuration no restart mends, 75 for a store or platform
    # not answering at start: restarting every 5 s is right for the one, a loop for the other.
    service = unit_service()
    assert service["Restart"] == "on-failure"
    assert service.get("RestartPreventExitStatus", "").split() == [str(EXIT_USAGE)]
    assert EXIT_TEMPFAIL not in {EXIT_USAGE, 0}  # on-failure restarts on any other status
