"""A cancel of a suspended run, SIGKILLed between its durable steps: the run never goes on
after it (no model turn, no effect). Real processes, real SQLite file, real openai client
(the harness of test_crash_resume)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.crash.test_crash_resume import child, effects, positions_requested

# A gated call waits for approval; were the run to go on, its model would record an effect.
WAITING_SCRIPT: list[dict[str, object]] = [
    {"text": "deploying", "calls": [{"name": "deploy", "arguments": {"name": "d"}}]},
    {"text": "then recording", "calls": [{"name": "effect", "arguments": {"name": "e"}}]},
    {"text": "done"},
]


@pytest.mark.parametrize("world", [WAITING_SCRIPT], indirect=True)
@pytest.mark.parametrize("crash", ["closed:1", "run_ended:1"])
def test_a_cancel_killed_half_way_never_lets_the_run_go_on(
    world: dict[str, Path | str], crash: str
) -> None:
    folder = Path(world["dir"])
    started = json.loads(child(world).stdout)
    (request,) = started["requests"]
    assert request["kind"] == "wait_approval"
    run_id = (folder / "run_id").read_text()

    crashed = child(world, "--cancel", run_id, "--crash-after", crash)
    assert crashed.returncode == -9, crashed.stderr
    out = json.loads(child(world, "--resume", run_id).stdout)
    if crash == "run_ended:1":  # its request left open on the ended run: approving it is moot
        approved = child(world, "--resume", run_id, "--settle", f"{request['id']}=approve")
        assert approved.returncode == 0, approved.stderr
        assert "was cancelled" in json.loads(approved.stdout)["refused"], approved.stdout
        out = json.loads(child(world, "--resume", run_id).stdout)

    assert out["status"] == "cancelled", out
    assert effects(folder) == []
    assert sorted(positions_requested(folder)) == [0]
