"""``kestrel serve slack`` misconfigured: each mistake ends in one line naming the cause (exit
2), never a traceback."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from pathlib import Path

import pytest

from tests.fakes.serving import free_port, run_serve, serve_env
from tests.fakes.slack_api import FakeSlackApi
from tests.fakes.slack_world import write_config


async def _serve(tmp: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_serve, tmp, env, "slack", *args)


@pytest.mark.parametrize("url", ["http://", "http://127.0.0.1:99999/api/", "https://[::1/api/"])
async def test_hostile_malformed_slack_api_url(tmp_path: Path, url: str) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    done = await _serve(tmp_path, serve_env(config, url), "--port", str(free_port()))
    assert "Traceback" not in done.stderr, done.stderr[-600:]
    assert done.returncode == 2
    assert "SLACK_API_URL" in done.stderr


@pytest.mark.parametrize("port", ["99999", "-1"])
async def test_hostile_port_out_of_range(tmp_path: Path, port: str) -> None:
    async with FakeSlackApi() as api:
        config = write_config(tmp_path, "http://127.0.0.1:9/v1")
        done = await _serve(tmp_path, serve_env(config, api.url), "--port", port)
    assert "Traceback" not in done.stderr, done.stderr[-600:]
    assert done.returncode == 2
    assert "port" in done.stderr


async def test_hostile_port_in_use(tmp_path: Path) -> None:
    async with FakeSlackApi() as api:
        config = write_config(tmp_path, "http://127.0.0.1:9/v1")
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            done = await _serve(tmp_path, serve_env(config, api.url), "--port", str(port))
    assert "Traceback" not in done.stderr, done.stderr[-600:]
    assert done.returncode == 2
    assert str(port) in done.stderr
