"""``systemctl stop`` as the shipped unit has systemd do it. Its ``KillMode=`` decides who gets
the SIGTERM: the main process alone (``mixed``, ``process``) or every process of the unit's
control group at once (``control-group``, the default), the catalog command under way included.
No systemd runs here, so the test sends the signal as that mode would, to a real ``kestrel
serve`` whose run is inside a command, and checks that the command may finish, as
``replica.shutdown_grace_seconds`` promises."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from pathlib import Path

import aiohttp
import yaml

from bot import wire
from bot.domain import Session, new_id
from storage.sqlite import SqliteStore
from tests.deploy.kit import unit_service
from tests.fakes.processes import KESTREL, clean_env
from tests.fakes.serving import free_port, wait_healthy
from tests.fakes.waiting import until

# A command that outlives the signal by a second, well within the grace.
SLOW = {
    "name": "slow",
    "description": "A slow effect",
    "command": ["/bin/sh", "./slow.sh"],
    "idempotent": False,
    "timeout": 60,
    "env": ["EFFECTS_FILE"],
}
SCRIPT = [{"text": "working", "calls": [{"name": "slow", "arguments": {}}]}, {"text": "done"}]


def kill_mode() -> str:
    """The unit's ``KillMode=``, systemd's default when it says none."""
    return unit_service().get("KillMode", "control-group")


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (what its control group would hold)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended while we looked
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def stop_as_systemd(process: subprocess.Popen[str], mode: str) -> None:
    """SIGTERM to whom ``KillMode=mode`` sends it on ``systemctl stop``."""
    targets = process_tree(process.pid) if mode == "control-group" else [process.pid]
    for pid in targets:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, signal.SIGTERM)


async def submit(folder: Path) -> None:
    store = SqliteStore(folder / "kestrel.db")
    await store.migrate()
    try:
        session = wire.to_plain(Session(id=new_id("ses"), platform="test"))
        payload = {"run_id": new_id("run"), "prompt": "go", "session": session}
        await store.enqueue_work("start", {**payload, "requested_by": "U0REQ"})
    finally:
        await store.close()


async def test_systemctl_stop_lets_the_command_under_way_finish(tmp_path: Path) -> None:
    effects = tmp_path / "effects.txt"
    (tmp_path / "slow.sh").write_text(
        f'echo start >> "$EFFECTS_FILE"\nwhile [ ! -e {tmp_path}/go ]; do sleep 0.05; done\n'
        'echo end >> "$EFFECTS_FILE"\n'
    )
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": [SLOW]}))
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(SCRIPT))
    config = {
        "model": {"provider": "scripted", "script": "script.yaml"},
        "tools": ["tools.yaml"],
        "replica": {"poll_seconds": 0.1, "shutdown_grace_seconds": 20},
    }
    (tmp_path / "kestrel.yaml").write_text(yaml.safe_dump(config))
    env = clean_env(EFFECTS_FILE=str(effects))
    port = free_port()
    serve = subprocess.Popen(  # noqa: ASYNC220 - a process that outlives this call
        [*KESTREL, "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        await wait_healthy(port, serve)
        await submit(tmp_path)
        await until(lambda: effects.exists() and "start" in effects.read_text(), timeout=30)
        stop_as_systemd(serve, kill_mode())
        # Kestrel took the signal (its /readyz says so); only then may the command end.
        await until(lambda: _stopping(port), timeout=20)
        (tmp_path / "go").touch()
        _, err = await asyncio.to_thread(serve.communicate, timeout=40)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    assert effects.read_text().split() == ["start", "end"], err
    assert serve.returncode == 0, err


async def _stopping(port: int) -> bool:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/readyz") as response,
    ):
        return "shutdown" in (await response.json())["problems"]
