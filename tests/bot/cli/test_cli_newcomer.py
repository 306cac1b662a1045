"""The first hour with ``kestrel``: what a newcomer meets first says the right thing, plainly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bot.cli.test_cli import kestrel, one_line_error, write_config


def test_the_demos_banner_says_nothing_of_oncall(tmp_path: Path) -> None:
    # The offline demo's simulated services have no on-call anyone could name.
    banner = kestrel(tmp_path, "chat")
    assert banner.returncode == 0, banner.stderr
    assert "oncall" not in banner.stdout + banner.stderr
    # A configuration of one's own tools is told, once.
    write_config(tmp_path, tools=[])
    configured = kestrel(tmp_path, "chat")
    assert configured.stdout.count("note: policy.oncall is empty") == 1


def test_serve_without_its_token_says_so_first_and_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "DISCORD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    write_config(tmp_path, tools=[])  # nobody on call: a warning, were the runtime built
    for platform, variable in (("slack", "SLACK_BOT_TOKEN"), ("discord", "DISCORD_TOKEN")):
        refused = one_line_error(kestrel(tmp_path, "serve", platform, "--port", "0"))
        assert refused.startswith(f"kestrel: {variable} is not set"), refused
