"""The real ``kestrel`` command line SIGKILLed right after each durable step of a person's
decision: ``runs approve``, ``runs answer``, on-call's ``runs effect … retry`` and ``runs
resume``. On-call then takes the run up with the same commands (``runs resume`` once the dead
process's lease runs out, ``runs effect … done`` for an effect of unknown outcome) until it
ends: the model is asked once for each step and no command runs more often than on-call chose
to retry it. Real processes, a real SQLite file or PostgreSQL schema, the real openai client
against the fake server (the world of test_crash_resume)."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.crash.database import STORES
from tests.crash.test_crash_paths import QUESTION_SCRIPT
from tests.crash.test_crash_resume import (
    GATED_SCRIPT,
    assert_journal_whole,
    effects,
    positions_requested,
)
from tests.fakes import warm_cli
from tests.fakes.processes import clean_env

# The approver, the answerer and on-call, as the policy names them.
POLICY = {"approvers": {"*": ["alice"]}, "oncall": ["carol"]}


def configure(world: dict[str, Path | str]) -> dict[str, str]:
    """The world's ``kestrel.yaml`` (its catalog, store and model, a short lease) and the
    environment its commands run in."""
    folder, db = Path(world["dir"]), str(world["db"])
    database = f"{db}?schema={world['schema']}" if db.startswith("postgresql://") else db
    config = {
        "model": {"provider": "openai", "name": "fake", "max_retries": 0},
        "tools": ["catalog.yaml"],
        "database": database,
        "policy": POLICY,
        "replica": {"lease_seconds": 0.5},
    }
    (folder / "kestrel.yaml").write_text(yaml.safe_dump(config))
    return clean_env(
        EFFECTS_FILE=str(folder / "effects.txt"),
        OPENAI_API_KEY="test",
        OPENAI_BASE_URL=str(world["base_url"]),
    )


def kestrel(
    world: dict[str, Path | str], *args: str, crash: str = ""
) -> subprocess.CompletedProcess[str]:
    """``kestrel ARGS`` in the world, its store killed after ``crash`` (``kind:N``) if given."""
    return warm_cli.kestrel(list(args), cwd=Path(world["dir"]), env=configure(world), crash=crash)


def waiting(world: dict[str, Path | str]) -> tuple[str, dict[str, Any]]:
    """``kestrel run --defer``: the run, suspended, and the one request it waits on."""
    started = kestrel(world, "run", "--defer", "--json", "--as", "bob", "deploy d")
    assert started.returncode == 3, started.stderr
    run = json.loads(started.stdout)
    (request,) = run["requests"]
    return run["run_id"], request


def taken_up(world: dict[str, Path | str], run_id: str) -> dict[str, Any]:
    """The run as on-call's ``runs resume --json`` leaves it, once the dead process's lease has
    run out (until then the resume is refused, and asked again)."""
    for _ in range(40):
        resumed = kestrel(world, "runs", "resume", run_id, "--json", "--as", "carol")
        if resumed.stdout.startswith("{"):
            out: dict[str, Any] = json.loads(resumed.stdout)
            return out
        assert "held by" in resumed.stderr, resumed.stderr
    raise AssertionError(f"run {run_id} was never taken up: {resumed.stderr}")


def finish(world: dict[str, Path | str], run_id: str) -> dict[str, Any]:
    """On-call takes the run up until it ends, marking each effect of unknown outcome done."""
    out = taken_up(world, run_id)
    for _ in range(3):
        if out["status"] != "suspended":
            return out
        (request,) = out["requests"]
        assert request["kind"] == "wait_effect", request
        settled = kestrel(world, "runs", "effect", run_id, request["id"], "done", "--as", "carol")
        assert settled.returncode in (0, 3), settled.stderr
        out = json.loads(kestrel(world, "runs", "show", run_id, "--json").stdout)
    return out


def assert_once_each(world: dict[str, Path | str], run_id: str, retried: int = 0) -> None:
    """The run completed, the model was asked once for each of its replies, no command ran
    more often than on-call retried it, and the journal is whole."""
    out = finish(world, run_id)
    assert out["status"] == "completed", out
    folder = Path(world["dir"])
    requested = positions_requested(folder)
    replies = len(yaml.safe_load((folder / "script.yaml").read_text()))
    assert sorted(requested) == list(range(replies)) and set(requested.values()) == {1}, requested
    ran = Counter(effects(folder))
    assert all(n <= 1 + retried for n in ran.values()), ran
    assert_journal_whole(world, run_id)


# What the approver's process appends, from the decision to the run's end.
APPROVED = ["decided", "answer_supplied", "tool_dispatched", "tool_process", "tool_result"]


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("world", [GATED_SCRIPT], indirect=True)
@pytest.mark.parametrize("crash", [*APPROVED, "run_ended"])
def test_runs_approve_killed_at_each_step_deploys_once(
    world: dict[str, Path | str], crash: str
) -> None:
    run_id, request = waiting(world)
    approving = ["runs", "approve", run_id, request["id"], "--as", "alice"]
    assert kestrel(world, *approving, crash=f"{crash}:1").returncode == -9

    assert_once_each(world, run_id)
    if crash in ("tool_result", "run_ended"):  # its answer journaled: it ran, once
        assert effects(Path(world["dir"])) == ["d"]


@pytest.mark.parametrize("world", [QUESTION_SCRIPT], indirect=True)
@pytest.mark.parametrize("crash", ["decided", "answer_supplied", "assistant_turn", *APPROVED[2:]])
def test_runs_answer_killed_at_each_step_records_once(
    world: dict[str, Path | str], crash: str
) -> None:
    run_id, request = waiting(world)
    assert request["kind"] == "wait_user", request
    answering = ["runs", "answer", run_id, request["id"], "yes", "--as", "carol"]
    assert kestrel(world, *answering, crash=f"{crash}:1").returncode == -9

    assert_once_each(world, run_id)


# One command that is not idempotent (no approval: a retry of a gated one asks it again).
RECORDING_SCRIPT: list[dict[str, object]] = [
    {"text": "recording", "calls": [{"name": "effect", "arguments": {"name": "e"}}]},
    {"text": "recorded"},
]


@pytest.mark.parametrize("world", [RECORDING_SCRIPT], indirect=True)
@pytest.mark.parametrize("crash", ["decided", *APPROVED[2:], "run_ended"])
def test_runs_effect_retry_killed_at_each_step_runs_it_once_more_at_most(
    world: dict[str, Path | str], crash: str
) -> None:
    started = ["run", "--json", "--as", "bob", "record e"]
    assert kestrel(world, *started, crash="tool_dispatched:1").returncode == -9
    (run,) = json.loads(kestrel(world, "runs", "list", "--json").stdout)
    run_id = run["run_id"]
    unknown = taken_up(world, run_id)
    (asked,) = unknown["requests"]
    assert asked["kind"] == "wait_effect", unknown

    retrying = ["runs", "effect", run_id, asked["id"], "retry", "--as", "carol"]
    assert kestrel(world, *retrying, crash=f"{crash}:1").returncode == -9

    assert_once_each(world, run_id, retried=1)


@pytest.mark.parametrize("world", [GATED_SCRIPT], indirect=True)
@pytest.mark.parametrize("crash", ["claimed", *APPROVED[2:], "run_ended"])
def test_runs_resume_of_a_dead_approvers_run_killed_at_each_step_deploys_once(
    world: dict[str, Path | str], crash: str
) -> None:
    run_id, request = waiting(world)
    approving = ["runs", "approve", run_id, request["id"], "--as", "alice"]
    assert kestrel(world, *approving, crash="decided:1").returncode == -9
    resuming = ["runs", "resume", run_id, "--as", "carol"]
    for _ in range(40):  # refused while the dead approver's lease runs
        resumed = kestrel(world, *resuming, crash=f"{crash}:1")
        if resumed.returncode == -9:
            break
        assert "held by" in resumed.stderr, resumed.stderr
    assert resumed.returncode == -9, resumed.stderr

    assert_once_each(world, run_id)
