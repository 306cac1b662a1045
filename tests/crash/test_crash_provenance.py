"""A consequential call with an argument copied from a tool's output (``provenance: ask``, the
default) runs only after a person's decision on a card that shows where it came from; SIGKILLed
after that decision and each kind of journal append of the run it resumed, the call still runs
once at most, and never on a standing grant alone. Real processes, a real SQLite file or
PostgreSQL schema, real openai client (the harness of test_crash_resume)."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.crash.database import kill_points
from tests.crash.test_crash_resume import assert_finished_each_effect_once, child, effects

# The model reads a log line naming a database, then restarts that database.
COPIED_SCRIPT: list[dict[str, object]] = [
    {"text": "reading the log", "calls": [{"name": "logs", "arguments": {}}]},
    {"text": "restarting", "calls": [{"name": "restart", "arguments": {"name": "zeta-db"}}]},
    {"text": "restarted"},
]


def with_log_and_restart(folder: Path) -> None:
    """The crash world's catalog, with ``logs`` (idempotent, its output names ``zeta-db``) and
    ``restart`` (not idempotent, not gated: only where its argument came from asks)."""
    catalog = yaml.safe_load((folder / "catalog.yaml").read_text())
    effect = catalog["tools"][0]
    catalog["tools"] += [
        {
            "name": "logs",
            "description": "Read the log",
            "command": ["/bin/echo", "error: please restart zeta-db"],
            "parameters": {"type": "object", "properties": {}},
            "idempotent": True,
        },
        {
            **effect,
            "name": "restart",
            "description": "Restart a database",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string", "pattern": "^[a-z-]+$"}},
                "required": ["name"],
            },
        },
    ]
    (folder / "catalog.yaml").write_text(yaml.safe_dump(catalog))


# The approving process, killed after its decision and each append of the run it resumed: on a
# card approved once, and for the run (which covers no call whose values came from tool output).
PATHS: dict[str, tuple[list[dict[str, object]], list[str]]] = {
    "approved_once": (
        COPIED_SCRIPT,
        [
            "decided",
            "answer_supplied",
            "tool_dispatched",
            "tool_process",
            "tool_result",
            "assistant_turn",
            "run_ended",
        ],
    ),
    "approved_always": (COPIED_SCRIPT, ["decided", "answer_supplied", "tool_result"]),
}
# On SQLite alone: where a value came from is the journal's, whichever store keeps it, and the
# approval path's commits on PostgreSQL are killed in test_crash_resume.
ON_POSTGRES: dict[str, list[str]] = {}


def deciding_process(
    world: dict[str, Path | str], path: str, crash: str
) -> subprocess.CompletedProcess[str]:
    """Bring the run to the card, then decide it in a process that crashes on cue."""
    asked = json.loads(child(world).stdout)
    (request,) = asked["requests"]
    assert request["kind"] == "wait_approval" and request["tool"] == "restart", request
    # The card shows where the value came from: the log's line.
    assert [o["tool"] for o in request["origins"]] == ["logs"], request["origins"]
    kind = "approve" if path == "approved_once" else "approve_always"
    run_id = (Path(world["dir"]) / "run_id").read_text()
    crash_args = ["--crash-after", crash if ":" in crash else f"{crash}:1"]
    return child(world, "--resume", run_id, "--settle", f"{request['id']}={kind}", *crash_args)


@pytest.mark.parametrize(
    ("world", "store_name", "path", "crash"), kill_points(PATHS, ON_POSTGRES), indirect=["world"]
)
def test_a_copied_value_runs_once_after_its_decision_across_a_crash(
    world: dict[str, Path | str], path: str, crash: str
) -> None:
    folder = Path(world["dir"])
    with_log_and_restart(folder)
    crashed = deciding_process(world, path, crash)
    assert crashed.returncode == -9, f"no {crash} append on this path: {crashed.stderr}"
    run_id = (folder / "run_id").read_text()

    retries: Counter[str] = Counter()
    assert_finished_each_effect_once(world, run_id, retries)
    # It ran: once, or once more if on-call retried it.
    assert 1 <= Counter(effects(folder))["zeta-db"] <= 1 + retries["zeta-db"], effects(folder)
