"""Real processes for tests: the fake OpenAI server and ``kestrel`` commands."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bot.tools.base import ToolFlags, ToolTraits
from bot.tools.command import CommandTool

ROOT = Path(__file__).resolve().parents[2]
KESTREL = [sys.executable, "-c", "from bot.cli.main import main; main()"]
SETPRIV = shutil.which("setpriv")
# What lets root pass file permissions: without them, root reads and writes as another user.
_PERMISSION_CAPS = "-dac_override,-dac_read_search,-fowner"


class FakeOpenAIProcess:
    """The fake OpenAI-compatible server in its own process, logging every request to a file.

    ``forked`` starts it by forking this process (its imports already done) instead of a new
    interpreter: milliseconds instead of a second, for tests that start one per case.
    ``hang`` reads and logs every request and never answers it.
    """

    def __init__(
        self,
        folder: Path,
        script: list[dict[str, Any]],
        *,
        forked: bool = False,
        hang: bool = False,
    ) -> None:
        self.folder = folder
        (folder / "script.yaml").write_text(yaml.safe_dump(script))
        port_file = folder / "port"
        self.log = folder / "requests.jsonl"
        argv = ["--script", str(folder / "script.yaml"), "--port-file", str(port_file)]
        argv += ["--log", str(self.log), *(["--hang"] if hang else [])]
        self.pid = _fork(argv) if forked else _spawn(argv)
        deadline = time.monotonic() + 20
        while not port_file.exists() or not port_file.read_text().strip():
            assert time.monotonic() < deadline, "fake OpenAI server did not start"
            time.sleep(0.02)
        self.base_url = f"http://127.0.0.1:{port_file.read_text().strip()}/v1"

    def stop(self) -> None:
        """Kill it."""
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


def _spawn(argv: list[str]) -> int:
    command = [sys.executable, "-m", "tests.fakes.openai_server", *argv]
    return subprocess.Popen(command, cwd=ROOT).pid


def _fork(argv: list[str]) -> int:
    from tests.fakes import openai_server

    pid = os.fork()
    if pid == 0:
        try:
            openai_server.main(argv)
        finally:
            os._exit(0)
    return pid


def clean_env(**extra: str) -> dict[str, str]:
    """The environment minus any model endpoint or Kestrel setting of the developer's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "KESTREL_"))}
    env.update(extra)
    return env


def unprivileged() -> list[str]:
    """The command-line prefix that runs a command as root without the capabilities that pass
    file permissions (``setpriv``, util-linux), so that they hold for it as for another user;
    nothing when not root. The caller makes sure setpriv is there when root."""
    if os.geteuid() != 0:
        return []
    assert SETPRIV is not None
    return [SETPRIV, f"--inh-caps={_PERMISSION_CAPS}", f"--bounding-set={_PERMISSION_CAPS}", "--"]


def alive(pid: int) -> bool:
    """Whether the pid runs; a zombie awaiting an absent reaper counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


async def wait_dead(pid: int, seconds: float = 30.0) -> bool:
    """Whether the pid is dead within ``seconds`` (polled: nothing tells of another's end)."""
    # Generous for a loaded machine, yet half the life of ``grandchild_tool``'s grandchild: one
    # left running still fails.
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


def grandchild_tool(name: str, then: str, timeout: float | None = None) -> CommandTool:
    """A command whose shell starts a grandchild (``sleep 60``, its pid written to the file the
    ``pidfile`` argument names) and then runs ``then`` (``wait``, or ``echo done``); with the
    tool's ``timeout``, else the default flags."""
    flags = ToolFlags() if timeout is None else ToolFlags(traits=ToolTraits(timeout=timeout))
    return CommandTool(
        name,
        f"starts a grandchild, then {then}",
        ["sh", "-c", f'sleep 60 & echo $! > "$0"; {then}', "{pidfile}"],
        parameters={"type": "object", "properties": {"pidfile": {"type": "string"}}},
        flags=flags,
    )


def fresh_python(cache: Path, code: str, *args: str, **env: str) -> Any:
    """Run ``code`` in a fresh interpreter with ``cache`` as its cache home (its kept folder);
    the JSON it prints."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, "XDG_CACHE_HOME": str(cache), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)
