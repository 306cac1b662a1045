"""Real processes for tests: the fake OpenAI server and ``kestrel`` commands."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
KESTREL = [sys.executable, "-c", "from bot.cli.main import main; main()"]


class FakeOpenAIProcess:
    """The fake OpenAI-compatible server in its own process, logging every request to a file."""

    def __init__(self, folder: Path, script: list[dict[str, Any]]) -> None:
        self.folder = folder
        (folder / "script.yaml").write_text(yaml.safe_dump(script))
        port_file = folder / "port"
        self.log = folder / "requests.jsonl"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fakes.openai_server",
                "--script",
                str(folder / "script.yaml"),
                "--port-file",
                str(port_file),
                "--log",
                str(self.log),
            ],
            cwd=ROOT,
        )
        deadline = time.monotonic() + 20
        while not port_file.exists() or not port_file.read_text().strip():
            assert time.monotonic() < deadline, "fake OpenAI server did not start"
            time.sleep(0.05)
        self.base_url = f"http://127.0.0.1:{port_file.read_text().strip()}/v1"

    def stop(self) -> None:
        """Kill it."""
        self.process.kill()
        self.process.wait()


def clean_env(**extra: str) -> dict[str, str]:
    """The environment minus any model endpoint or Kestrel setting of the developer's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "KESTREL_"))}
    env.update(extra)
    return env
