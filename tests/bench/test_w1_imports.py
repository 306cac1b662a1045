"""W1's runtime, composed in code with the built-in tools, runs without importing pydantic."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.fresh import fresh_json

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
    said = fresh_json(RUN, str(tmp_path / "w1.db"))
    assert said == {"answers": ["done", "done"], "pydantic": False}
