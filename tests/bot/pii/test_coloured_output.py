"""A command that prints in colour (``grep --color=always``, an application's coloured log) has
its secrets redacted as a terminal would show them: a colour code between a key's name and its
value, or inside a token, hides nothing from the guard. A real ``kestrel run``, a real grep,
the real openai client against the fake server."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.processes import KESTREL, FakeOpenAIProcess, clean_env

PASSWORD = "Tr0ub4dor-Xyz99"
GITHUB_TOKEN = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"
AWS_KEY = "AKIAZ4XQ7PLM3RT5VW2N"
SECRETS = [PASSWORD, GITHUB_TOKEN, AWS_KEY]
SCRIPT: list[dict[str, Any]] = [
    {"text": "looking", "calls": [{"name": "find_settings", "arguments": {}}]},
    {"text": "done"},
]


def kestrel(folder: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KESTREL, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(shutil.which("grep") is None, reason="needs grep")
def test_secrets_grep_prints_in_colour_reach_neither_the_model_nor_runs_show(
    tmp_path: Path,
) -> None:
    settings = tmp_path / "app.conf"
    settings.write_text(f"db_password={PASSWORD}\napi_token={GITHUB_TOKEN}\nkey {AWS_KEY}\n")
    # grep colours each match: "db_ESC[01;31mESC[KpasswordESC[mESC[K=…", "…ESC[KAKIAESC[mESC[K…".
    pattern = "password|ghp_|AKIA"
    tool = {
        "name": "find_settings",
        "description": "Find the credentials settings",
        "command": ["grep", "--color=always", "-E", pattern, str(settings)],
        "idempotent": True,
    }
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": [tool]}))
    config = {
        "model": {"provider": "openai", "name": "fake", "max_retries": 0},
        "tools": ["tools.yaml"],
        "tool_isolation": {"mode": "none"},  # the guard is under test, not the namespaces
    }
    (tmp_path / "kestrel.yaml").write_text(yaml.safe_dump(config))
    server = FakeOpenAIProcess(tmp_path, SCRIPT, forked=True)
    try:
        env = clean_env(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=server.base_url)
        run = kestrel(tmp_path, env, "run", "where are the credentials set?", "--json")
    finally:
        server.stop()
    assert run.returncode == 0, run.stderr
    output = json.loads(server.log.read_text().splitlines()[-1])["messages"][-1]["content"]
    assert "\x1b[" in output  # the colours reached the guard, as grep printed them
    assert [secret for secret in SECRETS if secret in output] == []
    for kind in ("CONNECTION_STRING_PASSWORD", "GITHUB_TOKEN", "AWS_ACCESS_KEY"):
        assert f"<{kind}>" in output, output
    shown = kestrel(tmp_path, env, "runs", "show", json.loads(run.stdout)["run_id"])
    assert shown.returncode == 0, shown.stderr
    assert "<GITHUB_TOKEN>" in shown.stdout
    assert [secret for secret in SECRETS if secret in shown.stdout] == []
