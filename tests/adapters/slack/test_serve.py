"""``kestrel serve slack`` as a user runs it: a real process, its environment, its port."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import aiohttp

from adapters.slack import ids
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.processes import KESTREL, ROOT
from tests.fakes.slack_api import FakeSlackApi
from tests.fakes.slack_client import SlackSender, app_mention, block_actions
from tests.fakes.slack_world import (
    APPROVER,
    REQUESTER,
    SECRET,
    button_value,
    restart_script,
    write_config,
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(config: Path, api_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KESTREL_", "SLACK_"))}
    env.update(
        KESTREL_CONFIG=str(config),
        SLACK_BOT_TOKEN="xoxb-test",
        SLACK_SIGNING_SECRET=SECRET,
        SLACK_API_URL=api_url,
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


def _serve(folder: Path, port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    argv = [*KESTREL, "serve", "slack", "--port", str(port)]
    return subprocess.Popen(
        argv, env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


async def _healthy(port: int, process: subprocess.Popen[str]) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            assert process.poll() is None, process.communicate()[1]
            try:
                async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("serve never became healthy")


async def test_serve_slack_runs_a_mention_to_its_answer(tmp_path: Path) -> None:
    async with FakeOpenAI(restart_script()) as model, FakeSlackApi() as api:
        config = write_config(tmp_path, model.base_url)
        port = _free_port()
        process = _serve(tmp_path, port, _env(config, api.url))
        try:
            await _healthy(port, process)
            sender = SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, api=api)
            mention = app_mention(REQUESTER, "checkout is failing")
            assert (await sender.event(mention)).status == 200
            cards = await api.wait_for(
                lambda c: c.ok is True and ids.APPROVE_ONCE in json.dumps(c.args), timeout=20
            )
            card = cards[0]
            ts = next(m["ts"] for m in api.messages["C0001"] if m.get("bot_id") and m.get("blocks"))
            click = block_actions(
                APPROVER,
                ids.APPROVE_ONCE,
                button_value(card, ids.APPROVE_ONCE),
                channel="C0001",
                message_ts=ts,
                thread_ts=mention["ts"],
            )
            assert (await sender.action(click)).status == 200
            await api.wait_for(lambda c: ids.FEEDBACK in json.dumps(c.args), timeout=20)
            assert (tmp_path / "executions.txt").read_text() == "checkout\n"
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=30)
        assert process.returncode == 0, err
        assert "slack: workspace T0001" in err
        assert "Traceback" not in err


def test_serve_slack_without_a_token_says_which_variable(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    env = _env(config, "http://127.0.0.1:9/api/")
    del env["SLACK_BOT_TOKEN"]
    done = subprocess.run(
        [*KESTREL, "serve", "slack", "--port", str(_free_port())],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "SLACK_BOT_TOKEN is not set" in done.stderr
    assert "Traceback" not in done.stderr


async def test_serve_slack_with_a_refused_token_says_so(tmp_path: Path) -> None:
    async with FakeSlackApi() as api:
        api.refuse("auth.test", "invalid_auth")
        config = write_config(tmp_path, "http://127.0.0.1:9/v1")
        done = await asyncio.to_thread(
            subprocess.run,
            [*KESTREL, "serve", "slack", "--port", str(_free_port())],
            env=_env(config, api.url),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert "auth.test refused SLACK_BOT_TOKEN: invalid_auth" in done.stderr
    assert "Traceback" not in done.stderr
