"""Secrets as real commands print them reach neither the model nor ``runs show``: redacted as
a terminal would show them (a colour code between a key's name and its value or inside a token,
as ``grep --color=always`` prints it; the NUL after each character of UTF-16 text), and an age
identity, plain or in a Kubernetes Secret's base64. A real ``kestrel run``, real grep and cat,
the real openai client against the fake server."""

from __future__ import annotations

import base64
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
SETTINGS = f"db_password={PASSWORD}\napi_token={GITHUB_TOKEN}\nkey {AWS_KEY}\n"
SCRIPT: list[dict[str, Any]] = [
    {"text": "looking", "calls": [{"name": "find_settings", "arguments": {}}]},
    {"text": "done"},
]


def kestrel(folder: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KESTREL, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=60
    )


def run_tool(folder: Path, command: list[str]) -> tuple[str, str]:
    """What the model read of ``command``'s output in a ``kestrel run``, and ``runs show``."""
    tool = {"name": "find_settings", "description": "Find the credentials", "command": command}
    (folder / "tools.yaml").write_text(yaml.safe_dump({"tools": [{**tool, "idempotent": True}]}))
    config = {
        "model": {"provider": "openai", "name": "fake", "max_retries": 0},
        "tools": ["tools.yaml"],
        "tool_isolation": {"mode": "none"},  # the guard is under test, not the namespaces
    }
    (folder / "kestrel.yaml").write_text(yaml.safe_dump(config))
    server = FakeOpenAIProcess(folder, SCRIPT, forked=True)
    try:
        env = clean_env(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=server.base_url)
        run = kestrel(folder, env, "run", "where are the credentials set?", "--json")
    finally:
        server.stop()
    assert run.returncode == 0, run.stderr
    output = json.loads(server.log.read_text().splitlines()[-1])["messages"][-1]["content"]
    shown = kestrel(folder, env, "runs", "show", json.loads(run.stdout)["run_id"])
    assert shown.returncode == 0, shown.stderr
    return output, shown.stdout


def assert_redacted(text: str) -> None:
    text = text.replace("\x00", "")  # read as the model reads UTF-16: through the NULs
    assert [secret for secret in SECRETS if secret in text] == [], text
    for kind in ("CONNECTION_STRING_PASSWORD", "GITHUB_TOKEN", "AWS_ACCESS_KEY"):
        assert f"<{kind}>" in text, text


@pytest.mark.skipif(shutil.which("grep") is None, reason="needs grep")
def test_secrets_grep_prints_in_colour_reach_neither_the_model_nor_runs_show(
    tmp_path: Path,
) -> None:
    (tmp_path / "app.conf").write_text(SETTINGS)
    # grep colours each match: "db_ESC[01;31mESC[KpasswordESC[mESC[K=…", "…ESC[KAKIAESC[mESC[K…".
    pattern = "password|ghp_|AKIA"
    output, shown = run_tool(
        tmp_path, ["grep", "--color=always", "-E", pattern, str(tmp_path / "app.conf")]
    )
    assert "\x1b[" in output  # the colours reached the guard, as grep printed them
    assert_redacted(output)
    assert_redacted(shown)


def test_secrets_in_a_utf16_file_reach_neither_the_model_nor_runs_show(tmp_path: Path) -> None:
    # Windows tools write UTF-16 (PowerShell's ">", a registry export): cat prints a NUL after
    # each ASCII character, which a terminal shows as nothing and the model reads through.
    (tmp_path / "app.conf").write_bytes(SETTINGS.encode("utf-16-le"))
    output, shown = run_tool(tmp_path, ["cat", str(tmp_path / "app.conf")])
    assert "\x00" in output
    assert_redacted(output)
    assert_redacted(shown)


# An age identity (SOPS's and Flux's key) as age-keygen writes it; its public key is no secret.
AGE_KEY = "AGE-SECRET-KEY-1GFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPQ4EGAEX"
AGE_FILE = (
    "# created: 2024-05-01T12:00:00Z\n"
    "# public key: age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p\n"
    f"{AGE_KEY}\n"
)


def test_an_age_key_plain_or_in_a_secret_reaches_neither_the_model_nor_runs_show(
    tmp_path: Path,
) -> None:
    (tmp_path / "keys.txt").write_text(AGE_FILE)
    # Flux's decryption Secret, as kubectl get secret sops-age -o yaml prints it.
    encoded = base64.b64encode(AGE_FILE.encode()).decode()
    (tmp_path / "secret.yaml").write_text(
        f"apiVersion: v1\ndata:\n  age.agekey: {encoded}\nkind: Secret\n"
    )
    files = [str(tmp_path / "keys.txt"), str(tmp_path / "secret.yaml")]
    output, shown = run_tool(tmp_path, ["cat", *files])
    for text in (output, shown):
        assert AGE_KEY not in text and encoded not in text, text
        assert text.count("<PRIVATE_KEY>") == 2, text
        assert "# public key: age1ql3z7" in text  # the public key is left as it is
