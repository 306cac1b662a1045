"""Every decision is audited, whichever client made it: inline ones (``kestrel chat``) too,
with the request they answer, the call's arguments and what the person said (redacted)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.bot.cli.test_cli import kestrel

PROMPT = "checkout is failing, can you look?"
CALL = 'restart_service {"service": "checkout"}'


def audit_rows(folder: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    args = ["--run", run_id] if run_id else []
    result = kestrel(folder, "audit", "--json", *args)
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def only_run(folder: Path) -> str:
    (run,) = json.loads(kestrel(folder, "runs", "list", "--json").stdout)
    return str(run["run_id"])


def actions_by(rows: list[dict[str, Any]], actor: str) -> list[str]:
    """The actions ``actor`` is audited for, in order."""
    return [row["action"] for row in rows if row["actor"] == actor]


def test_an_approval_and_an_answer_in_chat_are_audited(tmp_path: Path) -> None:
    chatted = kestrel(tmp_path, "chat", "--as", "U0ME", stdin=f"{PROMPT}\na\nyes\n")
    assert "Checkout is back up." in chatted.stdout, chatted.stderr

    rows = audit_rows(tmp_path, only_run(tmp_path))

    # Each decision taken inline comes after the row of the request it answers.
    assert actions_by(rows, "U0ME") == ["request", "approve", "request", "answer"]
    asked, approval = (row for row in rows if row["request_id"] == rows[0]["request_id"])
    assert asked["detail"].startswith(f"wait_approval {CALL} (digest ")
    assert approval["detail"].startswith(CALL) and approval["detail"].endswith("(inline)")
    answer = next(row for row in rows if row["action"] == "answer")
    assert "; answer: yes (inline)" in answer["detail"]


def test_a_denial_and_an_approval_for_the_run_in_chat_are_audited(tmp_path: Path) -> None:
    reason = "not now, page dave@example.com first"
    kestrel(tmp_path, "chat", "--as", "U0ME", stdin=f"{PROMPT}\nd\n{reason}\n")
    kestrel(tmp_path, "chat", "--as", "U0YOU", stdin=f"{PROMPT}\nr\nno\n")

    everything = audit_rows(tmp_path)

    assert actions_by(everything, "U0ME") == ["request", "deny"]
    assert sorted(actions_by(everything, "U0YOU")) == [
        "answer",
        "approve_always",
        "request",
        "request",
    ]
    # The reason is kept, through the PII guard like every other text a run keeps.
    (denial,) = (row for row in everything if row["action"] == "deny")
    assert "; reason: not now, page <EMAIL_ADDRESS> first (inline)" in denial["detail"]
    assert "dave@example.com" not in json.dumps(everything)


def test_an_approval_on_resume_is_audited_once(tmp_path: Path) -> None:
    kestrel(tmp_path, "chat", "--as", "U0ME", stdin=f"{PROMPT}\nl\n")
    run_id = only_run(tmp_path)

    kestrel(tmp_path, "chat", "--as", "U0ME", stdin=f"/resume {run_id}\na\nyes\n")

    rows = audit_rows(tmp_path, run_id)
    # The person who resumed the run is audited, not the process that drove it.
    assert actions_by(rows, "U0ME") == ["request", "approve", "resume", "request", "answer"]
    resumed = next(row for row in rows if row["action"] == "resume")
    assert resumed["detail"].startswith("on ")
