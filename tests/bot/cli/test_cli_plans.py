"""Plans from the command line: real processes on one journal, a real catalog command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.bot.cli.test_cli import kestrel, one_line_error, write_config

RESTART = {
    "name": "restart_unit",
    "description": "Restart a unit",
    "command": ["/bin/sh", "-c", 'echo "$1" >> "$0"', "{log}", "{unit}"],
    "parameters": {
        "type": "object",
        "properties": {"unit": {"type": "string"}, "log": {"type": "string"}},
        "required": ["unit", "log"],
        "additionalProperties": False,
    },
    "confirm": True,
}


def plan_world(folder: Path, units: list[str]) -> Path:
    """A script whose first reply restarts ``units`` at once; the log the restarts go to."""
    log = folder / "restarts.log"
    calls = [
        {"name": "restart_unit", "arguments": {"unit": unit, "log": str(log)}} for unit in units
    ]
    script = [{"text": "restart them all", "calls": calls}, {"text": "all restarted"}]
    (folder / "script.yaml").write_text(yaml.safe_dump(script))
    (folder / "tools.yaml").write_text(yaml.safe_dump({"tools": [RESTART]}))
    write_config(
        folder,
        model={"provider": "scripted", "script": "script.yaml"},
        tools=["tools.yaml"],
    )
    return log


def deferred_plan(folder: Path) -> tuple[str, dict[str, Any]]:
    """Start a run that suspends on its plan; the run id and the plan as ``--json`` shows it."""
    started = kestrel(folder, "run", "restart payments", "--defer", "--json", "--as", "U0REQ")
    assert started.returncode == 3, started.stderr  # suspended
    obj = json.loads(started.stdout)
    assert obj["status"] == "suspended"
    (plan,) = obj["requests"]
    return obj["run_id"], plan


def test_one_approval_runs_every_step_of_the_plan(tmp_path: Path) -> None:
    log = plan_world(tmp_path, ["payments-api", "payments-db", "payments-worker"])
    run_id, plan = deferred_plan(tmp_path)
    assert plan["kind"] == "wait_plan"
    assert [s["arguments"]["unit"] for s in plan["steps"]] == [
        "payments-api",
        "payments-db",
        "payments-worker",
    ]
    assert plan["steps"][0]["needs_approval"] is True and plan["digest"]

    pending = kestrel(tmp_path, "runs", "pending")
    assert f"{plan['id']}  wait_plan" in pending.stdout
    assert 'step 2: restart_unit {"log": ' in pending.stdout
    assert not log.exists()

    approved = kestrel(tmp_path, "runs", "approve", run_id, plan["id"], "--as", "U0BOSS")

    assert approved.returncode == 0, approved.stderr
    assert "completed: all restarted" in approved.stdout
    assert log.read_text().split() == ["payments-api", "payments-db", "payments-worker"]
    shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    (closed,) = shown["closed_requests"]
    assert closed["kind"] == "wait_plan" and len(closed["steps"]) == 3
    assert closed["decision"]["by"] == "U0BOSS"
    audit = kestrel(tmp_path, "audit", "--json").stdout
    approvals = [a for a in json.loads(audit) if a["action"] == "approve"]
    assert len(approvals) == 1 and plan["digest"] in approvals[0]["detail"]


def test_step_by_step_asks_for_each_call(tmp_path: Path) -> None:
    log = plan_world(tmp_path, ["payments-api", "payments-db"])
    run_id, plan = deferred_plan(tmp_path)

    chose = kestrel(
        tmp_path, "runs", "approve", run_id, plan["id"], "--step-by-step", "--as", "U0BOSS"
    )

    assert chose.returncode == 0, chose.stderr
    shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    assert [r["kind"] for r in shown["requests"]] == ["wait_approval", "wait_approval"]
    assert not log.exists()
    for request in shown["requests"]:
        kestrel(tmp_path, "runs", "approve", run_id, request["id"], "--as", "U0BOSS")
    assert log.read_text().split() == ["payments-api", "payments-db"]


def test_a_denied_plan_runs_nothing(tmp_path: Path) -> None:
    log = plan_world(tmp_path, ["payments-api", "payments-db"])
    run_id, plan = deferred_plan(tmp_path)

    denied = kestrel(
        tmp_path, "runs", "deny", run_id, plan["id"], "--reason", "freeze", "--as", "U0BOSS"
    )

    assert denied.returncode == 0, denied.stderr
    assert not log.exists()
    shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    assert shown["status"] == "completed" and shown["outcomes"] == {"gate_denied": 2}
    transcript = kestrel(tmp_path, "runs", "show", run_id).stdout
    assert "denied by U0BOSS: freeze (the whole plan" in transcript


def test_always_is_no_answer_to_a_plan(tmp_path: Path) -> None:
    plan_world(tmp_path, ["payments-api", "payments-db"])
    run_id, plan = deferred_plan(tmp_path)

    refused = kestrel(tmp_path, "runs", "approve", run_id, plan["id"], "--always", "--as", "U0B")

    assert one_line_error(refused) == (
        "kestrel: --always is for an approval (wait_approval); this is a plan:"
        f" kestrel runs approve {run_id} {plan['id']} --as U0B [--step-by-step]"
        " (or deny --reason TEXT)"
    )


def test_invisible_characters_in_a_plan_are_named_where_the_terminal_shows_it(
    tmp_path: Path,
) -> None:
    plan_world(tmp_path, ["payments-api", "payments-db\u200b\U000e0041"])
    run_id, _ = deferred_plan(tmp_path)

    pending = kestrel(tmp_path, "runs", "pending").stdout
    transcript = kestrel(tmp_path, "runs", "show", run_id).stdout
    audit = kestrel(tmp_path, "audit", "--run", run_id).stdout

    for shown in (pending, transcript, audit):
        assert "payments-db[U+200B][U+E0041]" in shown, shown
        assert "\u200b" not in shown and "\U000e0041" not in shown


def scripted(folder: Path, script: list[dict[str, Any]]) -> Path:
    """A world of ``script``'s replies with the catalog's restart_unit; the log it writes."""
    (folder / "script.yaml").write_text(yaml.safe_dump(script))
    (folder / "tools.yaml").write_text(yaml.safe_dump({"tools": [RESTART]}))
    write_config(
        folder, model={"provider": "scripted", "script": "script.yaml"}, tools=["tools.yaml"]
    )
    return folder / "restarts.log"


def proposing(log: Path, summary: str, *units: str) -> dict[str, Any]:
    """A ``propose_plan`` call restarting ``units`` in order."""
    steps = [{"tool": "restart_unit", "arguments": {"unit": u, "log": str(log)}} for u in units]
    return {"name": "propose_plan", "arguments": {"summary": summary, "steps": steps}}


def restarting(log: Path, *units: str) -> dict[str, Any]:
    """A reply restarting ``units``, one call each."""
    calls = [{"name": "restart_unit", "arguments": {"unit": u, "log": str(log)}} for u in units]
    return {"text": f"restart {' '.join(units)}", "calls": calls}


def off_plan_world(folder: Path) -> Path:
    """A script that proposes restarting payments-api then payments-db, and once that is
    approved calls both with a changed unit in one reply; the log the restarts go to."""
    log = folder / "restarts.log"
    planned = [
        {"tool": "restart_unit", "arguments": {"unit": unit, "log": str(log)}}
        for unit in ("payments-api", "payments-db")
    ]
    changed = [
        {"name": "restart_unit", "arguments": {"unit": unit, "log": str(log)}}
        for unit in ("payments-apix", "payments-dbx")
    ]
    proposed = {"name": "propose_plan", "arguments": {"summary": "restart", "steps": planned}}
    script = [
        {"text": "the plan", "calls": [proposed]},
        {"text": "as approved", "calls": changed},  # both calls off the plan, in one reply
        {"text": "done"},
    ]
    (folder / "script.yaml").write_text(yaml.safe_dump(script))
    (folder / "tools.yaml").write_text(yaml.safe_dump({"tools": [RESTART]}))
    write_config(
        folder, model={"provider": "scripted", "script": "script.yaml"}, tools=["tools.yaml"]
    )
    return log


OFF_PLAN = (
    "off the approved plan: this plan's step 1 (against the approved step 1 of restart_unit):"
    " changed argument `unit`: `payments-apix` vs plan `payments-api`; this plan's step 2"
    " (against the approved step 2 of restart_unit): changed argument `unit`: `payments-dbx`"
    " vs plan `payments-db`"
)


def test_several_calls_off_an_approved_plan_are_asked_saying_how_each_differs(
    tmp_path: Path,
) -> None:
    log = off_plan_world(tmp_path)
    run_id, plan = deferred_plan(tmp_path)
    approved = kestrel(tmp_path, "runs", "approve", run_id, plan["id"], "--as", "U0BOSS")

    shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    (asked,) = shown["requests"]
    assert asked["kind"] == "wait_plan"
    assert asked["off_plan"] == OFF_PLAN
    # The approval names what the run waits on next, and the command that approves it: what
    # that command would approve is shown above it, as `runs pending` shows it.
    said = approved.stdout.splitlines()
    assert (
        said[1] == f'  waiting: wait_plan {asked["id"]} propose_plan {{"summary": "as approved"}}'
    )
    assert said[2:5] == [
        f"    {OFF_PLAN}",
        f'    step 1: restart_unit {{"log": "{log}", "unit": "payments-apix"}}',
        f'    step 2: restart_unit {{"log": "{log}", "unit": "payments-dbx"}}',
    ]
    assert said[5].startswith(f"    kestrel runs approve {run_id} {asked['id']}")
    pending = kestrel(tmp_path, "runs", "pending").stdout
    assert f"    {OFF_PLAN}\n    step 1: restart_unit" in pending
    assert not log.exists()


def test_a_step_called_twice_runs_once_and_its_card_says_it_has_run(tmp_path: Path) -> None:
    log = tmp_path / "restarts.log"
    planned = [
        {"tool": "restart_unit", "arguments": {"unit": unit, "log": str(log)}}
        for unit in ("payments-api", "payments-db")
    ]
    again = {"name": "restart_unit", "arguments": {"unit": "payments-api", "log": str(log)}}
    proposed = {"name": "propose_plan", "arguments": {"summary": "restart", "steps": planned}}
    script = [
        {"text": "the plan", "calls": [proposed]},
        {"text": "step 1, twice", "calls": [again, again]},
        {"text": "done"},
    ]
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(script))
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": [RESTART]}))
    write_config(
        tmp_path, model={"provider": "scripted", "script": "script.yaml"}, tools=["tools.yaml"]
    )
    run_id, plan = deferred_plan(tmp_path)

    kestrel(tmp_path, "runs", "approve", run_id, plan["id"], "--as", "U0BOSS")

    assert log.read_text().split() == ["payments-api"]
    pending = kestrel(tmp_path, "runs", "pending").stdout
    assert pending.splitlines()[1] == (
        "    off the approved plan: this is step 1 (restart_unit) once more; it has run, and a"
        " step covers one call"
    )


def test_a_plan_of_too_many_steps_is_refused_saying_how_many_are_allowed(tmp_path: Path) -> None:
    log = tmp_path / "restarts.log"
    steps = [
        {"tool": "restart_unit", "arguments": {"unit": f"unit-{n:03d}", "log": str(log)}}
        for n in range(200)
    ]
    proposed = {"name": "propose_plan", "arguments": {"summary": "all", "steps": steps}}
    script = [{"text": "the plan", "calls": [proposed]}, {"text": "too many"}]
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(script))
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": [RESTART]}))
    write_config(
        tmp_path, model={"provider": "scripted", "script": "script.yaml"}, tools=["tools.yaml"]
    )

    started = kestrel(tmp_path, "run", "restart everything", "--defer", "--json", "--as", "U0REQ")

    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    transcript = kestrel(tmp_path, "runs", "show", run_id).stdout
    (result,) = [line for line in transcript.splitlines() if "result call_1" in line]
    # What the model reads: the limit, not two hundred steps quoted back at it.
    assert (
        result == "  result call_1: invalid arguments: steps: 200 items, more than the 20 allowed"
    )
    assert not log.exists()


def test_a_step_approved_on_its_own_card_is_used_up(tmp_path: Path) -> None:
    log = tmp_path / "restarts.log"
    scripted(
        tmp_path,
        [
            {"text": "the plan", "calls": [proposing(log, "three", "aaaa", "bbbb", "cccc")]},
            restarting(log, "aaaa"),
            restarting(log, "cccc"),  # step 3 before step 2: a card of its own
            restarting(log, "bbbb"),
            restarting(log, "cccc"),  # step 3 again: it ran, approved on its card
            {"text": "done"},
        ],
    )
    run_id, plan = deferred_plan(tmp_path)
    approved = kestrel(tmp_path, "runs", "approve", run_id, plan["id"], "--as", "U0BOSS")
    (early,) = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)["requests"]

    kestrel(tmp_path, "runs", "approve", run_id, early["id"], "--as", "U0BOSS")

    assert approved.returncode == 0, approved.stderr
    assert log.read_text().split() == ["aaaa", "cccc", "bbbb"]
    assert early["off_plan"].endswith("has not run yet; approved here, it uses step 3 up")
    (again,) = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)["requests"]
    assert (again["kind"], again["arguments"]["unit"]) == ("wait_approval", "cccc")
    assert (
        again["off_plan"]
        == "off the approved plan: every step of it has run; this call is one more"
    )


def test_steps_proposed_again_run_once_in_all(tmp_path: Path) -> None:
    log = tmp_path / "restarts.log"
    scripted(
        tmp_path,
        [
            {"text": "the plan", "calls": [proposing(log, "three", "aaaa", "bbbb", "cccc")]},
            restarting(log, "aaaa"),
            {"text": "again", "calls": [proposing(log, "the rest", "bbbb", "cccc")]},
            restarting(log, "bbbb", "cccc"),
            restarting(log, "bbbb", "cccc"),  # both plans approved them once: not twice
            {"text": "done"},
        ],
    )
    run_id, plan = deferred_plan(tmp_path)
    kestrel(tmp_path, "runs", "approve", run_id, plan["id"], "--as", "U0BOSS")
    (rest,) = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)["requests"]

    kestrel(tmp_path, "runs", "approve", run_id, rest["id"], "--as", "U0BOSS")

    assert log.read_text().split() == ["aaaa", "bbbb", "cccc"]
    (asked,) = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)["requests"]
    assert asked["kind"] == "wait_plan" and asked["off_plan"].startswith("off the approved plan")
