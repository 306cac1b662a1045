"""The first hour with ``kestrel``: what a newcomer meets first says the right thing, plainly."""

from __future__ import annotations

from pathlib import Path

from tests.bot.cli.test_cli import kestrel, write_config


def test_the_demos_banner_says_nothing_of_oncall(tmp_path: Path) -> None:
    # The offline demo's simulated services have no on-call anyone could name.
    banner = kestrel(tmp_path, "chat")
    assert banner.returncode == 0, banner.stderr
    assert "oncall" not in banner.stdout + banner.stderr
    # A configuration of one's own tools is told, once.
    write_config(tmp_path, tools=[])
    configured = kestrel(tmp_path, "chat")
    assert configured.stdout.count("note: policy.oncall is empty") == 1
