"""W1's runtime, composed in code with the built-in tools, runs without importing pydantic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Two runs of W1 on a fresh SQLite file, the PII guard redacting; then what was imported.
RUN = """
import asyncio, json, sys
from bench.common import w1_runtime
from bot.run.supervisor import Supervisor
from storage.sqlite import open_sqlite

async def main(path):
    store = await open_sqlite(path)
    supervisor = Supervisor(w1_runtime(store, 3, guarded=True))
    lives = [await supervisor.start_turn("go") for _ in range(2)]
    states = [await supervisor.wait(live) for live in lives]
    await store.close()
    return [state.result.text for state in states]

answers = asyncio.run(main(sys.argv[1]))
print(json.dumps({"answers": answers, "pydantic": "pydantic" in sys.modules}))
"""


def test_w1_runs_its_runtime_without_pydantic(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", RUN, str(tmp_path / "w1.db")],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    said = json.loads(out.stdout)
    assert said == {"answers": ["done", "done"], "pydantic": False}
