"""A call a PreToolUse hook turns into a consequential one, under SIGKILL after each kind of
journal append: its effect never runs again without a fresh decision by on-call. Real
processes, a real SQLite file or PostgreSQL schema, real openai client (the harness of
test_crash_resume)."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.domain import ToolCall
from bot.hooks import HookContext, ToolVerdict
from tests.crash.database import STORES
from tests.crash.test_crash_resume import child, effects, positions_requested, settle_args

HOOK = ["--pre-tool-use", f"{__name__}:record_lookups"]

# The model only looks something up; the site's hook records every lookup as an effect.
LOOKUP_SCRIPT: list[dict[str, object]] = [
    {"text": "looking", "calls": [{"name": "lookup", "arguments": {"name": "a"}}]},
    {"text": "looked"},
]


async def record_lookups(call: ToolCall, ctx: HookContext) -> ToolVerdict:
    """Rewrite ``lookup`` (idempotent) to ``effect`` (not idempotent), arguments unchanged."""
    return ToolVerdict(tool="effect") if call.name == "lookup" else ToolVerdict()


def with_lookup(folder: Path) -> None:
    """The crash world's catalog, and ``lookup``: ``effect``'s command, marked idempotent."""
    catalog = yaml.safe_load((folder / "catalog.yaml").read_text())
    lookup = {**catalog["tools"][0], "name": "lookup", "idempotent": True}
    catalog["tools"].append(lookup)
    (folder / "catalog.yaml").write_text(yaml.safe_dump(catalog))


def hooked(world: dict[str, Path | str], *extra: str) -> subprocess.CompletedProcess[str]:
    """A crash child with the hook installed, as every process of the deployment has it."""
    return child(world, *HOOK, *extra)


def finish(
    world: dict[str, Path | str], run_id: str, retries: Counter[str], asked: list[str]
) -> dict[str, Any]:
    """Resume after the crash, settling each request as on-call would, until the run ends;
    ``asked`` gets the kind of each request settled."""
    out: dict[str, Any] = json.loads(hooked(world, "--resume", run_id).stdout)
    for _ in range(4):
        if out["status"] != "suspended":
            break
        asked += [request["kind"] for request in out["requests"]]
        settled = hooked(world, "--resume", run_id, *settle_args(out["requests"], retries))
        assert settled.returncode == 0, settled.stderr
        out = json.loads(settled.stdout)
    return out


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("world", [LOOKUP_SCRIPT], indirect=True)
@pytest.mark.parametrize("crash", ["tool_dispatched", "tool_process", "tool_result"])
def test_a_call_a_hook_made_consequential_never_runs_twice(
    world: dict[str, Path | str], crash: str
) -> None:
    folder = Path(world["dir"])
    with_lookup(folder)
    retries: Counter[str] = Counter()
    asked: list[str] = []
    crashed = hooked(world, "--crash-after", f"{crash}:1")
    assert crashed.returncode == -9, crashed.stderr
    run_id = (folder / "run_id").read_text()

    out = finish(world, run_id, retries, asked)

    assert out["status"] == "completed", out
    assert all(n == 1 for n in positions_requested(folder).values())
    runs = Counter(effects(folder))
    assert all(runs[name] <= 1 + retries[name] for name in runs), (runs, retries)
    # Started and never answered: on-call decides, however the model named the call.
    assert asked == ([] if crash == "tool_result" else ["wait_effect"]), asked
