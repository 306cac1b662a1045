"""``kestrel serve`` as a real process for tests: a free port, a clean environment naming the
fakes, the process itself, a wait for its ``/healthz``, and its stderr read as log records."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

from tests.fakes.processes import KESTREL, ROOT
from tests.fakes.slack_world import SECRET

# A line of the text format: ``2025-05-01T09:30:00.123Z WARNING kestrel.slack: message``.
_TEXT_LINE = re.compile(r"(?P<ts>\S+Z) (?P<level>[A-Z]+) (?P<logger>\S+): (?P<message>.*)")
_RECORD_KEYS = {"ts", "level", "logger", "message"}


def free_port() -> int:
    """A port nobody listens on right now, below the kernel's ephemeral range: a server is
    started on it a moment later (and may restart on it), and in between a socket bound to
    port 0 anywhere on the machine could otherwise be handed it."""
    while True:
        port = random.randrange(20_000, 32_768)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def serve_env(config: Path, slack_api_url: str, **extra: str) -> dict[str, str]:
    """This environment without Kestrel's, Slack's and Discord's variables, then the test's:
    the configuration file, Slack's test credentials and API URL, and ``extra``."""
    prefixes = ("KESTREL_", "SLACK_", "DISCORD_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(
        KESTREL_CONFIG=str(config),
        SLACK_BOT_TOKEN="xoxb-test",
        SLACK_SIGNING_SECRET=SECRET,
        SLACK_API_URL=slack_api_url,
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


def start_serve(
    folder: Path, port: int, env: dict[str, str], *platforms: str, verbose: bool = False
) -> subprocess.Popen[str]:
    """``kestrel serve PLATFORMS --port PORT`` in ``folder``, its output piped (with
    ``verbose``, its warnings too: ``kestrel -v``)."""
    argv = [*KESTREL, *(["-v"] if verbose else []), "serve", *platforms, "--port", str(port)]
    return subprocess.Popen(
        argv, env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def run_serve(folder: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``kestrel serve ARGS`` to its end (a misconfiguration ends it at once)."""
    return subprocess.run(
        [*KESTREL, "serve", *args], env=env, cwd=folder, capture_output=True, text=True, timeout=60
    )


async def wait_healthy(port: int, process: subprocess.Popen[str]) -> None:
    """Until ``/healthz`` answers 200; fails with the process's stderr if it ends first."""
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


def log_records(stderr: str, form: str) -> list[dict[str, Any]]:
    """Each line of a ``kestrel`` process's stderr as the log record it must be in ``form``
    (``KESTREL_LOG_FORMAT``: json or text), its level in lower case; fails on a line that is
    not one."""
    records = []
    for line in stderr.splitlines():
        record = _json_record(line) if form == "json" else _text_record(line)
        records.append({**record, "level": record["level"].lower()})
    return records


def _json_record(line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError:
        raise AssertionError(f"not a JSON line: {line!r}") from None
    assert isinstance(record, dict) and record.keys() >= _RECORD_KEYS, line
    return record


def _text_record(line: str) -> dict[str, Any]:
    found = _TEXT_LINE.fullmatch(line)
    assert found is not None, f"not a log line: {line!r}"
    return found.groupdict()
