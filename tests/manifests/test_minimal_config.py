"""The minimal kestrel.yaml the README points to works when copied into an empty folder."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.processes import KESTREL, ROOT, clean_env

MINIMAL = ROOT / "manifests" / "kestrel.minimal.yaml"


async def test_the_minimal_config_runs_a_real_model_from_an_empty_folder(tmp_path: Path) -> None:
    shutil.copy(MINIMAL, tmp_path / "kestrel.yaml")
    script: list[dict[str, Any]] = [
        {
            "text": "Looking.",
            "calls": [{"name": "service_status", "arguments": {"service": "checkout"}}],
        },
        {"text": "Checkout is failing."},
    ]
    async with FakeOpenAI(script) as model:
        env = clean_env(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=model.base_url)
        done = await asyncio.to_thread(
            subprocess.run,
            [*KESTREL, "run", "how is checkout?", "--json"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "completed" and result["text"] == "Checkout is failing."
    assert result["outcomes"] == {"ok": 1}
    assert model.requests[0]["model"] == "gpt-4.1-mini"
    assert (tmp_path / "kestrel.db").exists()
