"""Decisions that race, with the process that made the first one SIGKILLed after each of its
durable steps: a cancel after an approval, an approval after a deadline expired the request
(and a deadline after an approval). The call runs at most once, and never after the cancel or
the expiry that came first. Real processes, a real SQLite file or PostgreSQL schema, real openai
client (the harness of test_crash_resume)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.crash.database import STORES, rows
from tests.crash.test_crash_cancel import WAITING_SCRIPT
from tests.crash.test_crash_resume import assert_journal_whole, child, effects, positions_requested


def waiting(world: dict[str, Path | str]) -> tuple[str, str]:
    """The run, started and waiting for the approval of its ``deploy``; its request's id."""
    (request,) = json.loads(child(world).stdout)["requests"]
    assert request["kind"] == "wait_approval", request
    return (Path(world["dir"]) / "run_id").read_text(), request["id"]


# The approver's process, killed once its decision is durable, and then after each append of
# the run it went on with, up to the deploy's answer.
APPROVED = ["decided", "answer_supplied", "tool_dispatched", "tool_process", "tool_result"]


def lease_run_out(world: dict[str, Path | str], run_id: str) -> None:
    """Wait until the dead owner's lease of the run has expired (a few tenths of a second)."""
    for _ in range(100):
        ((expires,),) = rows(world, "SELECT lease_expires FROM runs WHERE id = ?", run_id)
        if isinstance(expires, str):  # SQLite's ISO text; PostgreSQL's is a datetime already
            expires = datetime.fromisoformat(expires)
        if expires is None or expires < datetime.now(UTC):
            return
        time.sleep(0.05)
    raise AssertionError(f"the lease of {run_id} never expired")


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("world", [WAITING_SCRIPT], indirect=True)
@pytest.mark.parametrize("crash", APPROVED)
@pytest.mark.parametrize("lease", ["held", "run out"])
def test_a_cancel_after_an_approval_whose_process_died_runs_nothing_more(
    world: dict[str, Path | str], crash: str, lease: str
) -> None:
    folder = Path(world["dir"])
    run_id, request = waiting(world)
    approving = ["--settle", f"{request}=approve", "--crash-after", f"{crash}:1"]
    crashed = child(world, "--resume", run_id, *approving)
    assert crashed.returncode == -9, crashed.stderr
    ran = effects(folder)  # the deploy's, if it answered before the crash

    if lease == "run out":
        lease_run_out(world, run_id)
    cancelled = child(world, "--cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    said = json.loads(cancelled.stdout)["cancel"]
    if said == "cancelled":  # the lease had run out: the cancel took the run and ended it
        out = json.loads(child(world, "--resume", run_id).stdout)
    else:  # held still (as "held" means, unless this machine is slow): the store carries it
        assert said.startswith("cancelling:") and lease == "held", said
        out = json.loads(child(world, "--resume", run_id, "--adopt").stdout)

    assert out["status"] == "cancelled", out
    # Nothing started after the cancel: not the deploy, nor the next turn. A deploy the dead
    # process had started may have finished by itself (killed as it started, before where it
    # runs was journaled: nothing could stop it); it ran once at most.
    assert effects(folder) in ([], ["d"]), effects(folder)
    if crash in ("decided", "tool_result"):
        assert effects(folder) == ran
    assert sorted(positions_requested(folder)) == [0]
    assert out["requests"] == []  # a cancelled run asks nobody, not even about its deploy
    assert_journal_whole(world, run_id)
    ((body,),) = rows(
        world, "SELECT body FROM journal WHERE run_id = ? AND kind = 'run_ended'", run_id
    )
    ended = json.loads(body)["result"]["error"]
    if crash in ("tool_dispatched", "tool_process"):  # said, that it may have taken effect
        assert "deploy" in ended, ended


# The deadline's process, killed once the expiry is durable, and after each append of the run
# it went on with.
EXPIRED = ["decided", "tool_result", "run_ended"]


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("world", [WAITING_SCRIPT], indirect=True)
@pytest.mark.parametrize("crash", EXPIRED)
def test_an_approval_after_the_deadline_expired_it_never_runs_the_call(
    world: dict[str, Path | str], crash: str
) -> None:
    folder = Path(world["dir"])
    run_id, request = waiting(world)
    crashed = child(world, "--resume", run_id, "--expire", request, "--crash-after", f"{crash}:1")
    assert crashed.returncode == -9, crashed.stderr

    approved = child(world, "--resume", run_id, "--settle", f"{request}=approve")
    assert approved.returncode == 0, approved.stderr
    refused = json.loads(approved.stdout)["refused"]
    if crash != "run_ended":  # the run goes on, past the deploy answered as expired
        out = json.loads(child(world, "--resume", run_id, "--adopt").stdout)
        assert out["status"] == "completed", out

    assert "already expired" in refused, refused
    # The deploy never ran; the model, told it expired, went on to record ``e``, once.
    assert effects(folder) == ["e"]
    assert all(n == 1 for n in positions_requested(folder).values())
    assert rows(world, "SELECT status FROM runs WHERE id = ?", run_id) == [("completed",)]
    assert_journal_whole(world, run_id)


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("world", [WAITING_SCRIPT], indirect=True)
def test_a_deadline_after_an_approval_whose_process_died_expires_nothing(
    world: dict[str, Path | str],
) -> None:
    folder = Path(world["dir"])
    run_id, request = waiting(world)
    approving = ["--settle", f"{request}=approve", "--crash-after", "decided:1"]
    assert child(world, "--resume", run_id, *approving).returncode == -9

    # The sweep finds the request overdue as the approval it lost to is taken up.
    out = json.loads(child(world, "--resume", run_id, "--expire", request, "--adopt").stdout)

    assert out["status"] == "completed", out
    assert effects(folder) == ["d", "e"]
    assert rows(world, "SELECT status FROM requests WHERE id = ?", request) == [("answered",)]
    assert_journal_whole(world, run_id)
