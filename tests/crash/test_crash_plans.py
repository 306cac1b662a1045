"""Plans under SIGKILL after each kind of journal append: a finished step never runs again, a
step killed mid-effect becomes a ``wait_effect`` for on-call, and a denied plan runs nothing.
Real processes, a real SQLite file or PostgreSQL schema, real openai client (the harness of
test_crash_resume)."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.crash.database import kill_points
from tests.crash.test_crash_resume import assert_finished_each_effect_once, child, effects

# One reply, three gated calls: one plan.
PLAN_SCRIPT: list[dict[str, object]] = [
    {
        "text": "deploying three",
        "calls": [{"name": "deploy", "arguments": {"name": n}} for n in ("d", "e", "f")],
    },
    {"text": "deployed"},
]


def step(name: str) -> dict[str, object]:
    return {"tool": "deploy", "arguments": {"name": name}}


# The model proposes two steps, then makes them one reply at a time.
PROPOSED_SCRIPT: list[dict[str, object]] = [
    {
        "text": "a plan first",
        "calls": [
            {
                "name": "propose_plan",
                "arguments": {"summary": "deploy d then e", "steps": [step("d"), step("e")]},
            }
        ],
    },
    {"text": "first", "calls": [{"name": "deploy", "arguments": {"name": "d"}}]},
    {"text": "second", "calls": [{"name": "deploy", "arguments": {"name": "e"}}]},
    {"text": "deployed"},
]

# Each path with the append kinds (``kind:N``, the N-th of this process) its deciding process
# makes, so that the kill lands between every two durable steps of it.
PATHS: dict[str, tuple[list[dict[str, object]], list[str]]] = {
    "plan_approved": (
        PLAN_SCRIPT,
        [
            "decided",
            "run_resumed",
            "answer_supplied",
            "tool_dispatched",
            "tool_process",
            "tool_result",
            "grant_written",  # the first step used up, with its dispatch
            "grant_written:2",  # the plan's step grants, with the first step's result
            "tool_dispatched:2",
            "tool_process:2",
            "grant_written:5",  # the second step used up
            "tool_result:2",
            "tool_dispatched:3",
            "tool_result:3",
            "assistant_turn",
            "run_ended",
        ],
    ),
    "plan_inline": (
        PLAN_SCRIPT,
        [
            "assistant_turn",
            "tool_dispatched",
            "tool_result",
            "grant_written",
            "tool_dispatched:2",
            "tool_result:2",
            "tool_dispatched:3",
            "tool_result:3",
            "run_ended",
        ],
    ),
    "proposed": (
        PROPOSED_SCRIPT,
        [
            "decided",
            "answer_supplied",
            "tool_result",
            "grant_written",
            "assistant_turn",
            "tool_dispatched",
            "tool_result:2",
            "assistant_turn:2",
            "tool_dispatched:2",
            "tool_result:3",
            "run_ended",
        ],
    ),
}


def deciding_process(
    world: dict[str, Path | str], path: str, crash: str, decision: str = "approve"
) -> subprocess.CompletedProcess[str]:
    """Bring the run to its plan's decision, in a process that crashes on cue."""
    crash_args = ["--crash-after", crash if ":" in crash else f"{crash}:1"]
    if path == "plan_inline":
        return child(world, "--approve", *crash_args)  # as `kestrel chat`'s prompter does
    started = json.loads(child(world).stdout)
    (plan,) = started["requests"]
    assert plan["kind"] == "wait_plan", plan
    run_id = (Path(world["dir"]) / "run_id").read_text()
    return child(world, "--resume", run_id, "--settle", f"{plan['id']}={decision}", *crash_args)


# An approved plan is killed on PostgreSQL too, at every append of its deciding process: also
# those the list above passes over (the plan's third and fourth step grants, the third step's
# process and the grant it used up), each a commit of its own there.
ON_POSTGRES = {
    "plan_approved": ["grant_written:3", "grant_written:4", "tool_process:3", "grant_written:6"]
}


@pytest.mark.parametrize(
    ("world", "store_name", "path", "crash"), kill_points(PATHS, ON_POSTGRES), indirect=["world"]
)
def test_no_step_runs_again_without_a_fresh_decision(
    world: dict[str, Path | str], path: str, crash: str
) -> None:
    folder = Path(world["dir"])
    retries: Counter[str] = Counter()
    crashed = deciding_process(world, path, crash)
    assert crashed.returncode == -9, f"no {crash} append on this path: {crashed.stderr}"
    run_id = (folder / "run_id").read_text()

    assert_finished_each_effect_once(world, run_id, retries)


@pytest.mark.parametrize("world", [PLAN_SCRIPT], indirect=True)
def test_a_step_killed_mid_effect_is_asked_of_on_call(world: dict[str, Path | str]) -> None:
    folder = Path(world["dir"])
    crashed = deciding_process(world, "plan_approved", "tool_dispatched:2")
    assert crashed.returncode == -9, crashed.stderr
    run_id = (folder / "run_id").read_text()

    asked: dict[str, Any] = json.loads(child(world, "--resume", run_id).stdout)

    assert [r["kind"] for r in asked["requests"]] == ["wait_effect"]
    assert asked["requests"][0]["arguments"] == {"name": "e"}
    # The finished step did not run again; the next step, approved and not started, ran.
    assert effects(folder) == ["d", "f"]


@pytest.mark.parametrize(
    ("world", "crash"),
    [(PLAN_SCRIPT, kind) for kind in ("decided", "answer_supplied", "tool_result")],
    indirect=["world"],
)
def test_a_denied_plan_runs_nothing_across_a_crash(
    world: dict[str, Path | str], crash: str
) -> None:
    folder = Path(world["dir"])
    crashed = deciding_process(world, "plan_approved", crash, decision="deny")
    assert crashed.returncode == -9, crashed.stderr
    run_id = (folder / "run_id").read_text()

    out = json.loads(child(world, "--resume", run_id).stdout)

    assert out["status"] == "completed", out
    assert out["outcomes"] == {"gate_denied": 3}
    assert effects(folder) == []
