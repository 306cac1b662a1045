"""Every decision is audited, whichever client made it: inline ones (``kestrel chat``) too."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bot.test_cli import kestrel

PROMPT = "checkout is failing, can you look?"


def audit_lines(folder: Path, run_id: str) -> list[str]:
    result = kestrel(folder, "audit", "--run", run_id)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def only_run(folder: Path) -> str:
    (run,) = json.loads(kestrel(folder, "runs", "list", "--json").stdout)
    return str(run["run_id"])


def actions_by(lines: list[str], actor: str) -> list[str]:
    """The actions ``actor`` is audited for, in order."""
    return [line.split()[3] for line in lines if line.split()[2] == actor]


def test_an_approval_and_an_answer_in_chat_are_audited(tmp_path: Path) -> None:
    chatted = kestrel(tmp_path, "chat", "--as", "U0ME", stdin=f"{PROMPT}\na\nyes\n")
    assert "Checkout is back up." in chatted.stdout, chatted.stderr

    lines = audit_lines(tmp_path, only_run(tmp_path))

    assert actions_by(lines, "U0ME") == ["approve", "answer"]
    approval = next(line for line in lines if " approve " in line)
    assert "restart_service" in approval


def test_a_denial_and_an_approval_for_the_run_in_chat_are_audited(tmp_path: Path) -> None:
    kestrel(tmp_path, "chat", "--as", "U0ME", stdin=f"{PROMPT}\nd\nnot now\n")
    kestrel(tmp_path, "chat", "--as", "U0YOU", stdin=f"{PROMPT}\nr\nno\n")

    runs = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)
    everything = [line for run in runs for line in audit_lines(tmp_path, run["run_id"])]

    assert actions_by(everything, "U0ME") == ["deny"]
    assert sorted(actions_by(everything, "U0YOU")) == ["answer", "approve_always"]


def test_an_approval_on_resume_is_audited_once(tmp_path: Path) -> None:
    kestrel(tmp_path, "chat", "--as", "U0ME", stdin=f"{PROMPT}\nl\n")
    run_id = only_run(tmp_path)

    kestrel(tmp_path, "chat", "--as", "U0ME", stdin=f"/resume {run_id}\na\nyes\n")

    assert actions_by(audit_lines(tmp_path, run_id), "U0ME") == ["request", "approve", "answer"]
