"""A cancel of a suspended run, SIGKILLed between its durable steps: the run never goes on
after it (no model turn, no effect). Real processes, a real SQLite file or PostgreSQL schema,
real openai client (the harness of test_crash_resume)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tests.crash.database import STORES, rows
from tests.crash.test_crash_resume import SLOW_SCRIPT, child, effects, positions_requested

# A gated call waits for approval; were the run to go on, its model would record an effect.
WAITING_SCRIPT: list[dict[str, object]] = [
    {"text": "deploying", "calls": [{"name": "deploy", "arguments": {"name": "d"}}]},
    {"text": "then recording", "calls": [{"name": "effect", "arguments": {"name": "e"}}]},
    {"text": "done"},
]


@pytest.mark.parametrize("store_name", STORES)
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


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("world", [SLOW_SCRIPT], indirect=True)
def test_a_cancel_of_a_run_whose_process_died_mid_command_stops_the_command(
    world: dict[str, Path | str],
) -> None:
    folder = Path(world["dir"])
    (folder / "slow.sh").write_text('sleep 2\necho "late $1" >> "$EFFECTS_FILE"\n')
    catalog = yaml.safe_load((folder / "catalog.yaml").read_text())
    slow = {**catalog["tools"][0], "name": "slow", "command": ["/bin/sh", "./slow.sh", "{name}"]}
    catalog["tools"].append(slow)
    (folder / "catalog.yaml").write_text(yaml.safe_dump(catalog))
    crashed = child(world, "--crash-after", "tool_process:1")
    assert crashed.returncode == -9
    run_id = (folder / "run_id").read_text()

    cancelled = json.loads(child(world, "--cancel", run_id).stdout)["cancel"]
    if cancelled.startswith("cancelling:"):  # its lease not yet expired: carried by the store
        assert json.loads(child(world, "--resume", run_id).stdout)["status"] == "cancelled"
    else:
        assert cancelled == "cancelled"
    time.sleep(2.5)  # past the moment the command would have written its effect
    assert effects(folder) == []
    ((body,),) = rows(
        world, "SELECT body FROM journal WHERE run_id = ? AND kind = 'run_ended'", run_id
    )
    said = json.loads(body)["result"]["error"]
    assert "slow (its process group" in said and "was stopped" in said, said


# A command that takes a moment; were the run to go on past its cancel, its model would record
# an effect.
CANCELLED_WHILE_RUNNING_SCRIPT: list[dict[str, object]] = [
    {"text": "slowly", "calls": [{"name": "slow", "arguments": {"name": "s"}}]},
    {"text": "then recording", "calls": [{"name": "effect", "arguments": {"name": "e"}}]},
    {"text": "done"},
]


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("world", [CANCELLED_WHILE_RUNNING_SCRIPT], indirect=True)
def test_a_cancel_taken_by_the_process_that_died_driving_the_run_still_ends_it(
    world: dict[str, Path | str],
) -> None:
    folder = Path(world["dir"])
    (folder / "slow.sh").write_text('sleep 0.5\necho "$1" >> "$EFFECTS_FILE"\n')
    catalog = yaml.safe_load((folder / "catalog.yaml").read_text())
    slow = {**catalog["tools"][0], "name": "slow", "command": ["/bin/sh", "./slow.sh", "{name}"]}
    catalog["tools"].append(slow)
    (folder / "catalog.yaml").write_text(yaml.safe_dump(catalog))

    # Cancelled at the process that drives it (STOPPING_HERE), which
    # dies once the command under way has finished, before that boundary.
    crashed = child(world, "--cancel-while-running", "slow", "--crash-after", "tool_result:1")
    assert crashed.returncode == -9, crashed.stderr
    run_id = (folder / "run_id").read_text()
    # The cancel was taken before the crash.
    asked = rows(world, "SELECT actor FROM audit WHERE action = 'cancel'")
    assert asked == [("U0ONCALL",)]
    out = json.loads(child(world, "--resume", run_id).stdout)

    assert out["status"] == "cancelled", out
    assert effects(folder) == ["s"]  # the command under way finished; nothing after it ran
    assert sorted(positions_requested(folder)) == [0]
    ((body,),) = rows(
        world, "SELECT body FROM journal WHERE run_id = ? AND kind = 'run_ended'", run_id
    )
    assert json.loads(body)["result"]["error"] == "cancelled by U0ONCALL"
