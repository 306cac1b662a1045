"""One identity at the terminal: ``--as``, else ``KESTREL_USER``, else the login name, shown
in the chat banner and used alike by ``chat``, ``run`` and the ``runs`` commands."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bot.test_cli import kestrel

PROMPT = "checkout is failing, can you look?"


def requester(folder: Path, run_id: str) -> str:
    shown = json.loads(kestrel(folder, "runs", "show", run_id, "--json").stdout)
    return str(shown["requested_by"])


def deferred(folder: Path, env: dict[str, str], *args: str) -> str:
    result = kestrel(folder, "run", PROMPT, "--defer", "--json", *args, env=env)
    assert result.returncode == 3, result.stderr
    return str(json.loads(result.stdout)["run_id"])


def test_the_login_name_is_the_default_and_kestrel_user_and_as_override_it(
    tmp_path: Path,
) -> None:
    by_login = deferred(tmp_path, {"USER": "erin"})
    by_variable = deferred(tmp_path, {"USER": "erin", "KESTREL_USER": "U0DAVE"})
    by_option = deferred(tmp_path, {"USER": "erin", "KESTREL_USER": "U0DAVE"}, "--as", "U0ANN")

    assert requester(tmp_path, by_login) == "erin"
    assert requester(tmp_path, by_variable) == "U0DAVE"
    assert requester(tmp_path, by_option) == "U0ANN"


def test_chat_and_the_runs_commands_act_as_the_same_person(tmp_path: Path) -> None:
    me = {"USER": "erin"}
    # A run deferred by `run` is resumed in chat without naming anyone: the approval is asked
    # again inline (as erin), left for later, and the run suspends once more.
    run_id = deferred(tmp_path, me)
    chatted = kestrel(tmp_path, "chat", stdin=f"/resume {run_id}\nl\n", env=me)
    assert chatted.returncode == 0, chatted.stderr
    assert "You are erin (--as or KESTREL_USER to change it)." in chatted.stdout.splitlines()[1]
    assert "approval needed: restart_service" in chatted.stdout
    assert "may not resume" not in chatted.stdout

    # A run started in chat is cancelled from the command line, as the same person.
    kestrel(tmp_path, "chat", stdin=f"{PROMPT}\nl\n", env=me)
    runs = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)
    in_chat = next(run["id"] for run in runs if run["id"] != run_id)
    cancelled = kestrel(tmp_path, "runs", "cancel", in_chat, env=me)
    assert cancelled.returncode == 0 and cancelled.stdout.strip() == "cancelled", cancelled.stderr
    cancelled = kestrel(tmp_path, "runs", "cancel", run_id, env=me)
    assert cancelled.stdout.strip() == "cancelled", cancelled.stderr

    audit = json.loads(kestrel(tmp_path, "audit", "--json").stdout)
    assert {row["actor"] for row in audit if row["action"] in ("resume", "cancel")} == {"erin"}
