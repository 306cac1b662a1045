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


@pytest.mark.parametrize(
    ("variable", "pasted"),
    [
        # Kept by docker run --env-file: a token was said to be of the wrong kind, and serve
        # started with the secret, to refuse every request Slack signs.
        ("SLACK_APP_TOKEN", '"xapp-1-zq9tok"'),
        ("SLACK_BOT_TOKEN", "'xoxb-1-2-zq9tok'"),
        ("SLACK_SIGNING_SECRET", '"0123abcd"'),
    ],
)
async def test_hostile_token_in_quotes(tmp_path: Path, variable: str, pasted: str) -> None:
    assert await _refused_at_start(tmp_path, variable, pasted) == (
        f"kestrel: {variable} is in quotes, which are not part of it: remove them (an env file"
        " read by docker run --env-file keeps them)\n"
    )


@pytest.mark.parametrize(
    ("variable", "pasted", "named"),
    [
        # Before the token, it was said to be the wrong kind of token.
        (
            "SLACK_APP_TOKEN",
            "\u201cxapp-1-zq9tok",
            "U+201C LEFT DOUBLE QUOTATION MARK, character 1 of 14",
        ),
        # Inside the token, where no strip reaches: said to be a line break or a control character.
        ("SLACK_BOT_TOKEN", "xoxb-1-2-\u00a0zq9tok", "U+00A0 NO-BREAK SPACE, character 10 of 16"),
        # Serve started, and would have refused every request Slack signed.
        (
            "SLACK_SIGNING_SECRET",
            "0123abcd\u201d",
            "U+201D RIGHT DOUBLE QUOTATION MARK, character 9 of 9",
        ),
        (
            "SLACK_APP_TOKEN",
            "xapp-1-zq9toke\u2026",
            "U+2026 HORIZONTAL ELLIPSIS, character 15 of 15",
        ),
    ],
)
async def test_hostile_token_pasted_with_a_character_that_is_not_ascii(
    tmp_path: Path, variable: str, pasted: str, named: str
) -> None:
    said = await _refused_at_start(tmp_path, variable, pasted)
    assert said == (
        f"kestrel: {variable} holds a character that is not ASCII ({named}), which no key or"
        " token has: was it pasted with quotes, an ellipsis or a no-break space? paste it again\n"
    )
    assert "zq9tok" not in said and "0123abcd" not in said


async def _refused_at_start(tmp_path: Path, variable: str, pasted: str) -> str:
    """``kestrel serve slack`` with ``variable`` set to ``pasted``: what it said, having exited
    2 at start."""
    async with FakeSlackApi() as api:
        config = write_config(tmp_path, "http://127.0.0.1:9/v1")
        env = {**serve_env(config, api.url), variable: pasted}
        done = await _serve(tmp_path, env, "--port", str(free_port()))
    assert done.returncode == 2, done.stderr[-600:]
    return done.stderr
