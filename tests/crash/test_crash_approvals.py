"""Approvals the other crash modules do not take, under SIGKILL after each kind of journal append
and each store write of the deciding processes: an approval asked at the console as the run
resumes, a call that needs two approvers, an uncertain effect marked done or failed, and a plan
approved step by step. No effect runs again without a
fresh decision by on-call. Real processes, a real SQLite file or PostgreSQL schema, real openai
client (the harness of test_crash_resume)."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.crash.database import kill_points
from tests.crash.test_crash_plans import PLAN_SCRIPT
from tests.crash.test_crash_resume import (
    GATED_SCRIPT,
    SCRIPT,
    assert_journal_whole,
    child,
    effects,
    positions_requested,
)

# One call of a tool that needs two people's approval.
TWO_SCRIPT: list[dict[str, object]] = [
    {"text": "deploying", "calls": [{"name": "deploy2", "arguments": {"name": "d"}}]},
    {"text": "deployed"},
]

APPROVERS = ("U0ONCALL", "U0SECOND")


def with_two_approvers(folder: Path) -> None:
    """The crash world's catalog, and ``deploy2``: ``deploy`` needing two approvers."""
    catalog = yaml.safe_load((folder / "catalog.yaml").read_text())
    deploy = next(tool for tool in catalog["tools"] if tool["name"] == "deploy")
    catalog["tools"].append({**deploy, "name": "deploy2", "approvals": 2})
    (folder / "catalog.yaml").write_text(yaml.safe_dump(catalog))


def settle(
    world: dict[str, Path | str], run_id: str, requests: list[dict[str, Any]], retries: Counter[str]
) -> dict[str, Any]:
    """Decide ``requests`` as people would, one process each person: an approval by as many
    approvers as it still needs, a question ``yes``, an uncertain effect ``retry`` (counted)."""
    out: dict[str, Any] = {}
    for by in APPROVERS:
        args: list[str] = []
        for request in requests:
            if request["kind"] == "wait_effect":
                retries[request["arguments"]["name"]] += 1
                args += ["--settle", f"{request['id']}=retry"]
            elif request["kind"] == "wait_user":
                args += ["--settle", f"{request['id']}=answer:yes"]
            else:
                args += ["--settle", f"{request['id']}=approve"]
        if not args:
            break
        settled = child(world, "--resume", run_id, "--by", by, *args)
        assert settled.returncode == 0, settled.stderr
        out = json.loads(settled.stdout)
        assert "status" in out, out
        # What still waits for a second approver (the first one's counted; its run suspended).
        requests = [r for r in out["requests"] if r["approvals_needed"] > 1]
    return out


def finish(
    world: dict[str, Path | str], run_id: str, retries: Counter[str], asked: list[str]
) -> dict[str, Any]:
    """Resume after the crash, deciding every request as people would, until the run ends;
    ``asked`` gets the kind of each request decided."""
    resumed = child(world, "--resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    out: dict[str, Any] = json.loads(resumed.stdout)
    assert "status" in out, out
    for _ in range(6):
        if out["status"] != "suspended":
            return out
        if not out["requests"]:  # an approval that counted, its run waiting for a later one
            out = json.loads(child(world, "--resume", run_id).stdout)
            continue
        asked += [request["kind"] for request in out["requests"]]
        out = settle(world, run_id, out["requests"], retries)
    return out


# Each path with the append kinds (``kind:N``, the N-th of this process) and store writes its
# deciding process makes, so that the kill lands between every two durable steps of it.
PATHS: dict[str, tuple[list[dict[str, object]], list[str]]] = {
    # The first of two approvers: their approval counted, the request still open.
    "first_of_two": (TWO_SCRIPT, ["approved_partial"]),
    # The second: their approval counted (the request still open), then it closed, and the run
    # went on with the call.
    "second_of_two": (
        TWO_SCRIPT,
        [
            "approved_partial",
            "decided",
            "tool_dispatched",  # with the run's resume and the answer, on SQLite
            "tool_process",
            "tool_result",  # with the grant it used
            "run_ended",  # with the last reply
        ],
    ),
    # Resumed at the console (``kestrel chat``, ``kestrel runs resume`` at a terminal): the
    # approval asked there is written as the run resumes, then the call runs.
    "at_console": (
        GATED_SCRIPT,
        [
            "closed",
            "claimed",  # the lease taken to go on with the decision
            "tool_dispatched",
            "tool_process",
            "tool_result",
            "run_ended",
        ],
    ),
    # ``kestrel chat``: the card asked and approved at the keyboard, audited before it runs.
    "inline_audits": (GATED_SCRIPT, ["audited", "audited:2"]),
    # Another replica's sweep adopting an orphaned run, killed once it took the lease.
    "adopted": (SCRIPT, ["claimed"]),
    # on-call marks an uncertain effect done, or failed: nothing runs again.
    "effect_done": (SCRIPT, ["decided", "tool_result"]),
    "effect_failed": (SCRIPT, ["decided", "tool_result"]),
    # on-call retries a plan's step killed mid-effect: it runs again on the plan's approval.
    "plan_step_retry": (
        PLAN_SCRIPT,
        ["decided", "tool_dispatched", "tool_process", "tool_result", "assistant_turn"],
    ),
    # A plan approved step by step: its calls each open a card of their own ...
    "step_by_step": (PLAN_SCRIPT, ["decided", "answer_supplied", "run_suspended"]),
    # ... and those cards, approved at once, run each call once (SQLite commits the decision's
    # appends with the first dispatch, a step's result with the next one's dispatch).
    "steps_approved": (
        PLAN_SCRIPT,
        [
            "decided:3",
            "tool_dispatched",
            "tool_process",
            "tool_result",
            "tool_dispatched:2",
            "tool_dispatched:3",
            "tool_result:3",
            "run_ended",
        ],
    ),
}

# Killed on PostgreSQL too, where each append is a commit of its own, with the appends SQLite
# commits with a neighbour (above): the store writes about a decision (its audit, the lease
# taken), the console's decision, two approvers' rows and the decision, and on-call's settling
# of an uncertain effect.
ON_POSTGRES: dict[str, list[str]] = {
    "inline_audits": [],
    "adopted": [],
    "at_console": ["run_resumed", "answer_supplied", "grant_written"],
    "first_of_two": [],
    "second_of_two": ["run_resumed", "answer_supplied", "grant_written", "assistant_turn"],
    "effect_done": ["run_resumed", "answer_supplied"],
}


def deciding_process(
    world: dict[str, Path | str], path: str, crash: str
) -> subprocess.CompletedProcess[str]:
    """Bring the run to where ``path`` reaches a decision, in a process that crashes on cue."""
    folder = Path(world["dir"])
    crash_args = ["--crash-after", crash if ":" in crash else f"{crash}:1"]
    if path == "inline_audits":
        return child(world, "--approve", *crash_args)
    if path == "adopted":
        assert child(world, "--crash-after", "tool_result:1").returncode == -9
        run_id = (folder / "run_id").read_text()
        return child(world, "--resume", run_id, "--adopt", *crash_args)
    if path.startswith("effect_"):
        assert child(world, "--crash-after", "tool_dispatched:1").returncode == -9
        run_id = (folder / "run_id").read_text()
        (asked,) = json.loads(child(world, "--resume", run_id).stdout)["requests"]
        assert asked["kind"] == "wait_effect", asked
        settled = f"{asked['id']}={path.removeprefix('effect_')}"
        return child(world, "--resume", run_id, "--settle", settled, *crash_args)
    (request,) = json.loads(child(world).stdout)["requests"]
    run_id = (folder / "run_id").read_text()
    if path == "plan_step_retry":
        approving = ["--settle", f"{request['id']}=approve", "--crash-after", "tool_dispatched:2"]
        assert child(world, "--resume", run_id, *approving).returncode == -9
        (asked,) = json.loads(child(world, "--resume", run_id).stdout)["requests"]
        assert asked["kind"] == "wait_effect" and asked["arguments"] == {"name": "e"}, asked
        return child(world, "--resume", run_id, "--settle", f"{asked['id']}=retry", *crash_args)
    if path == "at_console":
        return child(world, "--resume", run_id, "--approve", *crash_args)
    if path == "first_of_two":
        return child(world, "--resume", run_id, "--settle", f"{request['id']}=approve", *crash_args)
    if path == "second_of_two":
        first = child(world, "--resume", run_id, "--settle", f"{request['id']}=approve")
        assert first.returncode == 0, first.stderr
        second = ["--by", APPROVERS[1], "--settle", f"{request['id']}=approve"]
        return child(world, "--resume", run_id, *second, *crash_args)
    assert request["kind"] == "wait_plan", request
    by_step = ["--settle", f"{request['id']}=step_by_step"]
    if path == "step_by_step":
        return child(world, "--resume", run_id, *by_step, *crash_args)
    cards = json.loads(child(world, "--resume", run_id, *by_step).stdout)["requests"]
    assert [card["kind"] for card in cards] == ["wait_approval"] * 3, cards
    approvals = [arg for card in cards for arg in ("--settle", f"{card['id']}=approve")]
    return child(world, "--resume", run_id, *approvals, *crash_args)


@pytest.mark.parametrize(
    ("world", "store_name", "path", "crash"), kill_points(PATHS, ON_POSTGRES), indirect=["world"]
)
def test_no_effect_runs_again_without_a_fresh_decision(
    world: dict[str, Path | str], path: str, crash: str
) -> None:
    folder = Path(world["dir"])
    with_two_approvers(folder)
    crashed = deciding_process(world, path, crash)
    assert crashed.returncode == -9, f"no {crash} append on this path: {crashed.stderr}"
    run_id = (folder / "run_id").read_text()

    # The deciding process's own retry, on that path, is on-call's too.
    retries: Counter[str] = Counter({"e": 1} if path == "plan_step_retry" else {})
    asked: list[str] = []
    out = finish(world, run_id, retries, asked)

    assert out["status"] == "completed", out
    requested = positions_requested(folder)
    assert all(n == 1 for n in requested.values()), requested
    replies = len(yaml.safe_load((folder / "script.yaml").read_text()))
    assert sorted(requested) == list(range(replies)), requested
    runs = Counter(effects(folder))
    # No effect ran more often than on-call chose to retry it, and one on-call marked done or
    # failed as it crashed mid-effect never ran again.
    assert set(runs) <= names(PATHS[path][0]), runs
    assert all(runs[name] <= 1 + retries[name] for name in runs), (runs, retries)
    if path.startswith("effect_"):
        assert runs["a"] <= retries["a"], (runs, retries)
    if path == "plan_step_retry":  # the plan approved the step: only on-call is asked again
        assert set(asked) <= {"wait_effect"}, asked
    assert_journal_whole(world, run_id)


def names(script: list[dict[str, Any]]) -> set[str]:
    """The names the script's calls record."""
    return {call["arguments"]["name"] for reply in script for call in reply.get("calls", [])}
