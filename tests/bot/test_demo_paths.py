"""The offline demo model through the real CLI: every path its demo allows ends in an answer
a model would give (a refused, denied or expired restart, a question left for later), never in
its script's internals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.bot.cli.test_cli import kestrel

PROMPT = "checkout is failing, can you look?"
# What a run of the demo must never show a person: the script's own machinery.
INTERNALS = ("script", "mismatch", "expected", "{who}", "{why}", "one_of")


def show(folder: Path, run_id: str) -> dict[str, Any]:
    shown = kestrel(folder, "runs", "show", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)  # type: ignore[no-any-return]


def assert_answered(run: dict[str, Any], *phrases: str) -> None:
    """The run completed with an answer saying ``phrases`` and nothing of the script."""
    assert (run["status"], run["stop_reason"]) == ("completed", "answered"), run
    for phrase in phrases:
        assert phrase in run["text"], run["text"]
    for internal in INTERNALS:
        assert internal not in run["text"].lower(), run["text"]


def deferred(folder: Path) -> tuple[str, str]:
    """A ``run --defer`` waiting on its restart approval: (run id, request id)."""
    started = kestrel(folder, "run", PROMPT, "--defer", "--json", "--as", "U0REQ")
    run = json.loads(started.stdout)
    (request,) = run["requests"]
    assert request["tool"] == "restart_service"
    return run["run_id"], request["id"]


def question(folder: Path, run_id: str) -> str:
    """The id of the open ask_human_confirm request of ``run_id``."""
    (request,) = show(folder, run_id)["requests"]
    assert request["tool"] == "ask_human_confirm", request
    return str(request["id"])


def test_headless_run_explains_the_refused_restart(tmp_path: Path) -> None:
    result = kestrel(tmp_path, "run", PROMPT, "--json")

    assert result.returncode == 0, result.stderr
    run = json.loads(result.stdout)
    assert_answered(run, "could not restart checkout", "refused", "kestrel run --defer")
    assert run["outcomes"]["gate_denied"] == 1


def test_defer_then_approve_and_answer(tmp_path: Path) -> None:
    run_id, request_id = deferred(tmp_path)
    approved = kestrel(tmp_path, "runs", "approve", run_id, request_id, "--as", "U0BOSS")
    assert approved.returncode == 0, approved.stderr

    answered = kestrel(
        tmp_path, "runs", "answer", run_id, question(tmp_path, run_id), "Y", "--as", "U0REQ"
    )

    assert answered.returncode == 0, answered.stderr
    assert_answered(show(tmp_path, run_id), "Checkout is back up.", "Follow-up (as you asked)")


def test_defer_then_deny_with_a_reason(tmp_path: Path) -> None:
    run_id, request_id = deferred(tmp_path)

    denied = kestrel(
        tmp_path, "runs", "deny", run_id, request_id, "--reason", "peak hour", "--as", "U0BOSS"
    )

    assert denied.returncode == 0, denied.stderr
    assert_answered(show(tmp_path, run_id), 'U0BOSS denied the restart ("peak hour")')
    assert not (tmp_path / "demo-state" / "restarts.log").exists()


def test_defer_then_deny_without_a_reason(tmp_path: Path) -> None:
    run_id, request_id = deferred(tmp_path)

    denied = kestrel(tmp_path, "runs", "deny", run_id, request_id, "--as", "U0BOSS")

    assert denied.returncode == 0, denied.stderr
    assert_answered(
        show(tmp_path, run_id), "I did not restart checkout: U0BOSS denied the restart."
    )


def test_chat_deny_with_a_reason(tmp_path: Path) -> None:
    result = kestrel(tmp_path, "chat", "--as", "U0ME", stdin=f"{PROMPT}\nd\nnot during the sale\n")

    assert result.returncode == 0, result.stderr
    assert (
        'kestrel> I did not restart checkout: U0ME denied the restart ("not during the sale")'
        in (result.stdout)
    )


def test_chat_later_twice_then_answered_from_elsewhere(tmp_path: Path) -> None:
    # The approval is left for later, then given on /resume; the question is left for later
    # too and answered with `runs answer` from another process: the same person at the same
    # terminal, without naming themselves (one identity for chat and the runs commands).
    first = kestrel(tmp_path, "chat", stdin=f"{PROMPT}\nl\n")
    assert "suspended" in first.stdout
    run_id = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)[0]["run_id"]
    resumed = kestrel(tmp_path, "chat", stdin=f"/resume {run_id}\na\nl\n")
    assert "Shall I record a follow-up" in resumed.stdout
    assert "suspended" in resumed.stdout

    answered = kestrel(tmp_path, "runs", "answer", run_id, question(tmp_path, run_id), "no")

    assert answered.returncode == 0, answered.stderr
    assert_answered(show(tmp_path, run_id), "Checkout is back up.", "no follow-up recorded")


def test_the_demo_can_be_played_again(tmp_path: Path) -> None:
    # The simulated checkout relapses after its restart: a second try shows the whole demo.
    for _ in range(2):
        result = kestrel(tmp_path, "chat", stdin=f"{PROMPT}\na\nyes\n")
        assert "approval needed: restart_service" in result.stdout
        assert "Checkout is back up." in result.stdout


def test_a_relative_demo_state_is_the_folder_the_command_runs_in(tmp_path: Path) -> None:
    # The simulated services run in an empty folder of their own: KESTREL_DEMO_STATE=state
    # kept the restart there, lost at once, and the status after it never saw the restart.
    result = kestrel(
        tmp_path, "chat", stdin=f"{PROMPT}\na\nyes\n", env={"KESTREL_DEMO_STATE": "state"}
    )

    assert (tmp_path / "state" / "restarts.log").read_text() == "restart checkout\n"
    assert "restarted via kestrel 1 time(s)" in result.stdout, result.stdout
    assert "Checkout is back up." in result.stdout


def test_another_question_gets_a_model_like_answer(tmp_path: Path) -> None:
    result = kestrel(tmp_path, "run", "what is the disk usage on db1?", "--json")

    assert_answered(json.loads(result.stdout), "offline demo model", PROMPT)


def test_an_expired_approval_is_explained(tmp_path: Path) -> None:
    config = {"deadlines": {"wait_approval": 1}, "replica": {"poll_seconds": 0.1}}
    (tmp_path / "kestrel.yaml").write_text(yaml.safe_dump(config))
    run_id, _ = deferred(tmp_path)
    time.sleep(1.2)
    serve = start_serve(tmp_path)
    try:
        run = wait_for_end(tmp_path, run_id)
    finally:
        serve.send_signal(signal.SIGTERM)
        _out, err = serve.communicate(timeout=20)

    assert_answered(run, "the approval request expired before anyone answered")
    # No tools set: serve says its tools are the demo's simulated ones.
    assert "tools: none set: serving the demo catalog's simulated services" in err
    # No model endpoint either: the operator is told who answers the mentions.
    assert "neither OPENAI_API_KEY nor OPENAI_BASE_URL is set: the offline demo model" in err
    audit = kestrel(tmp_path, "audit", "--run", run_id).stdout
    assert "deadline" in audit and "expire" in audit


def test_a_mismatch_in_a_users_script_is_a_model_error(tmp_path: Path) -> None:
    script = [
        {"text": "checking", "calls": [{"name": "service_status", "arguments": {"service": "x"}}]},
        {"expect": "healthy", "text": "all good"},
    ]
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(script))
    config = {"model": {"provider": "scripted", "script": "mine.yaml"}}
    (tmp_path / "kestrel.yaml").write_text(yaml.safe_dump(config))

    result = kestrel(tmp_path, "run", "is x ok?", "--json")

    run = json.loads(result.stdout)
    assert result.returncode == 1
    assert (run["status"], run["stop_reason"]) == ("failed", "model_error")
    assert "script 'mine' left its path at reply 2: expected 'healthy'" in run["error"]


def start_serve(folder: Path) -> subprocess.Popen[str]:
    """``kestrel serve`` in the background, in the same environment as ``kestrel``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "KESTREL_"))}
    env["KESTREL_DEMO_STATE"] = str(folder / "demo-state")
    command = [
        sys.executable,
        "-c",
        "from bot.cli.main import main; main()",
        "serve",
        "--port",
        "0",
    ]
    return subprocess.Popen(
        command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_end(folder: Path, run_id: str) -> dict[str, Any]:
    """The run once it ended (the serving replica expires its request and resumes it)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        run = show(folder, run_id)
        if run["status"] not in ("suspended", "running"):
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} never ended: {show(folder, run_id)}")
