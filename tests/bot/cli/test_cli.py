"""The ``kestrel`` command as a person uses it: real processes, real files, one-line errors."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
import yaml

from tests.fakes import warm_cli
from tests.fakes.openai_server import Canned, FakeOpenAI, chat_completion
from tests.storage.conftest import postgres_dsn, postgres_schema

ROOT = Path(__file__).resolve().parents[3]


CLI = "from bot.cli.main import main; main()"


def kestrel(
    cwd: Path, *args: str, stdin: str = "", env: dict[str, str] | None = None, script: str = CLI
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI (started by ``script``) in a fresh process, with no model endpoint in
    its environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "KESTREL_"))}
    clean["KESTREL_DEMO_STATE"] = str(cwd / "demo-state")
    clean.update(env or {})
    if script == CLI and warm_cli.forkable(clean):
        return warm_cli.kestrel(list(args), cwd=cwd, env=clean, stdin=stdin)
    command = [sys.executable, "-c", script, *args]
    return subprocess.run(
        command,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        env=clean,
        timeout=60,
        check=False,
    )


def write_config(folder: Path, **settings: object) -> Path:
    path = folder / "kestrel.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_chat_with_piped_input_completes_the_demo(tmp_path: Path) -> None:
    result = kestrel(tmp_path, "chat", stdin="checkout is failing, can you look?\na\nyes\n")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "tools (the demo's simulated services), journal" in out  # the banner says so
    assert "approval needed: restart_service" in out
    assert "Checkout is back up." in out
    assert (tmp_path / "demo-state" / "restarts.log").read_text() == "restart checkout\n"
    listed = kestrel(tmp_path, "runs", "list", "--json")
    (run,) = json.loads(listed.stdout)
    assert run["status"] == "completed"


def test_chat_lists_as_many_recent_runs_as_asked(tmp_path: Path) -> None:
    for _ in range(3):
        kestrel(tmp_path, "chat", stdin="checkout is failing\nl\n")
    listed = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)
    newest = [run["run_id"] for run in listed]  # newest first

    result = kestrel(tmp_path, "chat", stdin="/runs 2\n/runs\n/runs two\n/runs 0\n")

    lines = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  run_")]
    assert lines == newest[:2] + newest[:3]
    refusal = "! /runs lists the N most recent runs: N from 1 to 100"
    assert result.stdout.count(refusal) == 2, result.stdout


def test_a_prompt_of_several_lines_is_listed_on_one(tmp_path: Path) -> None:
    # `kestrel run - < incident.txt`: each further line of the prompt printed as a row of its
    # own under the table's header, and in the chat's /runs; a script read them as runs.
    assert kestrel(tmp_path, "run", "-", stdin="checkout is failing\nsince 09:41\n").returncode == 0
    listed = kestrel(tmp_path, "runs", "list").stdout.splitlines()
    assert len(listed) == 2 and listed[1].endswith("checkout is failing since 09:41"), listed
    chat = kestrel(tmp_path, "chat", stdin="/runs\n").stdout
    (row,) = [line for line in chat.splitlines() if line.startswith("  run_")]
    assert row.endswith("checkout is failing since 09:41")
    assert "\nsince" not in chat


def test_chat_later_suspends_and_resume_continues(tmp_path: Path) -> None:
    result = kestrel(tmp_path, "chat", stdin="checkout is failing\nl\n")
    assert "suspended" in result.stdout
    run_id = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)[0]["run_id"]
    later_again = kestrel(tmp_path, "chat", stdin=f"/resume {run_id}\nl\n")
    assert "approval needed: restart_service" in later_again.stdout  # asked again, inline
    shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    assert shown["status"] == "suspended"
    assert [r["kind"] for r in shown["requests"]] == ["wait_approval"]
    approved = kestrel(tmp_path, "chat", stdin=f"/resume {run_id}\na\nyes\n")
    assert "Checkout is back up." in approved.stdout
    shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    assert shown["status"] == "completed"


def test_run_json_shape_and_headless_refusal(tmp_path: Path) -> None:
    result = kestrel(tmp_path, "run", "checkout is failing", "--json")
    assert result.returncode == 0, result.stderr
    obj = json.loads(result.stdout)
    for key in ("run_id", "status", "stop_reason", "text", "payload", "usage", "requests"):
        assert key in obj
    assert obj["outcomes"]["gate_denied"] == 1  # nobody present: the restart is refused
    assert not (tmp_path / "demo-state" / "restarts.log").exists()


def two_approvals_catalog(folder: Path) -> Path:
    """The demo's catalog, its confirmed tools needing two approvals."""
    demo = ROOT / "bot" / "demo" / "tools" / "ops.yaml"
    text = demo.read_text().replace('"./bin/', f'"{demo.parent}/bin/')
    path = folder / "ops.yaml"
    path.write_text(text.replace("    confirm: true\n", "    confirm: true\n    approvals: 2\n"))
    return path


def test_runs_show_names_everyone_who_approved(tmp_path: Path) -> None:
    write_config(tmp_path, tools=[str(two_approvals_catalog(tmp_path))])
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    run_id, request_id = deferred["run_id"], deferred["requests"][0]["id"]
    for approver in ("U0ONE", "U0TWO"):
        approved = kestrel(tmp_path, "runs", "approve", run_id, request_id, "--as", approver)
        assert approved.returncode == 0, approved.stderr
    assert (tmp_path / "demo-state" / "restarts.log").read_text() == "restart checkout\n"
    shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    (closed,) = shown["closed_requests"]
    # ``by`` stays the approver whose approval closed it, for what reads it already.
    assert closed["decision"]["by"] == "U0TWO"
    assert closed["decision"]["approvers"] == ["U0ONE", "U0TWO"]
    text = kestrel(tmp_path, "runs", "show", run_id).stdout
    assert (
        f"  closed: wait_approval {request_id} for restart_service: Approved by U0ONE and U0TWO"
        in text.splitlines()
    )


def test_run_defer_then_approve_from_another_process(tmp_path: Path) -> None:
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    assert deferred["status"] == "suspended"
    (request,) = deferred["requests"]
    assert request["kind"] == "wait_approval" and request["tool"] == "restart_service"
    pending = kestrel(tmp_path, "runs", "pending")
    assert request["id"] in pending.stdout
    assert "may answer: anyone but the requester (U0REQ))" in pending.stdout
    mine = kestrel(tmp_path, "runs", "approve", deferred["run_id"], request["id"], "--as", "U0REQ")
    run_id, request_id = deferred["run_id"], request["id"]
    assert one_line_error(mine) == (
        "kestrel: you asked for this run: someone else must approve it;"
        " may approve: anyone but the requester (U0REQ). At this terminal, approve as one of"
        f" them (kestrel runs approve {run_id} {request_id} --as NAME), or resume the run in"
        f" kestrel chat (/resume {run_id}), where you may approve it"
    )
    approved = kestrel(
        tmp_path, "runs", "approve", deferred["run_id"], request["id"], "--as", "U0BOSS"
    )
    assert approved.returncode == 0, approved.stderr
    assert "suspended" in approved.stdout  # it went on, and now asks its question
    assert (tmp_path / "demo-state" / "restarts.log").read_text() == "restart checkout\n"
    shown = json.loads(kestrel(tmp_path, "runs", "show", deferred["run_id"], "--json").stdout)
    (question,) = shown["requests"]
    assert question["kind"] == "wait_user" and question["tool"] == "ask_human_confirm"
    (closed,) = shown["closed_requests"]  # the approval, with who decided it and when
    assert closed["id"] == request["id"] and closed["status"] == "answered"
    assert closed["decision"]["kind"] == "approve" and closed["decision"]["by"] == "U0BOSS"
    assert closed["decision"]["approvers"] == ["U0BOSS"]
    # One schema: the run object starts with the row ``runs list --json`` shows, stamps alike.
    (listed,) = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)
    assert listed.items() <= {**shown, "stop_reason": listed["stop_reason"]}.items()
    stamps = [shown["created_at"], deferred["created_at"], closed["decision"]["at"]]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", s) for s in stamps)
    # The approval says what the run waits on next, with the id and the command to answer it.
    arguments = json.dumps(question["arguments"])
    assert approved.stdout.splitlines()[1:] == [
        f"  waiting: wait_user {question['id']} ask_human_confirm {arguments}",
        f"    kestrel runs answer {deferred['run_id']} {question['id']} yes|no",
    ]
    answered = kestrel(
        tmp_path, "runs", "answer", deferred["run_id"], question["id"], "yes", "--as", "U0REQ"
    )
    assert "completed" in answered.stdout, answered.stderr
    audit = kestrel(tmp_path, "audit", "--run", deferred["run_id"]).stdout.splitlines()
    assert any(" U0BOSS " in line and " approve " in line for line in audit)
    # Each resume is audited as the person whose decision resumed it, not the process.
    assert [line.split()[2] for line in audit if " resume " in line] == ["U0BOSS", "U0REQ"]


def test_a_decision_of_the_wrong_kind_says_what_answers_the_request(tmp_path: Path) -> None:
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    ids = [deferred["run_id"], deferred["requests"][0]["id"]]
    # Named as the person who gave --as: the command, pasted, acts as them.
    how = f"this is an approval: kestrel runs approve {' '.join(ids)} --as U0B (or deny)"
    step_by_step = kestrel(tmp_path, "runs", "approve", *ids, "--step-by-step", "--as", "U0B")
    said = one_line_error(step_by_step)
    assert said == f"kestrel: --step-by-step is for a plan (wait_plan); {how}"
    answer = kestrel(tmp_path, "runs", "answer", *ids, "yes", "--as", "U0B")
    assert one_line_error(answer) == f"kestrel: runs answer is for a question (wait_user); {how}"
    shown = json.loads(kestrel(tmp_path, "runs", "show", ids[0], "--json").stdout)
    assert [r["id"] for r in shown["requests"]] == [ids[1]]  # still open, for the right command


def test_a_prompt_that_is_not_utf8_is_refused_before_any_run(tmp_path: Path) -> None:
    refused = kestrel(tmp_path, "run", "bad \udcff bytes")  # the bytes b"bad \xff bytes"
    said = "kestrel: the prompt is not valid UTF-8 text (byte 0xff at offset 4)"
    assert one_line_error(refused) == said
    assert kestrel(tmp_path, "runs", "list").stdout == "no runs\n"


def test_an_empty_prompt_starts_no_run(tmp_path: Path) -> None:
    for prompt in ("", " \t\n "):
        assert one_line_error(kestrel(tmp_path, "run", prompt)) == "kestrel: the prompt is empty"
    chatted = kestrel(tmp_path, "chat", stdin="\n   \n")  # blank lines at the chat: skipped
    assert chatted.returncode == 0, chatted.stderr
    assert kestrel(tmp_path, "runs", "list").stdout == "no runs\n"


def test_a_reason_or_answer_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    ids = [deferred["run_id"], deferred["requests"][0]["id"]]
    for args, what in (
        (("deny", *ids, "--reason", "caf\udce9"), "the reason"),
        (("answer", *ids, "caf\udce9"), "the answer"),
    ):
        refused = kestrel(tmp_path, "runs", *args, "--as", "U0B")
        said = f"kestrel: {what} is not valid UTF-8 text (byte 0xe9 at offset 3)"
        assert one_line_error(refused) == said
    shown = json.loads(kestrel(tmp_path, "runs", "show", ids[0], "--json").stdout)
    assert [r["id"] for r in shown["requests"]] == [ids[1]]  # still open


def test_unknown_config_key_names_the_key(tmp_path: Path) -> None:
    write_config(tmp_path, budgets={"max_iterationz": 3})
    assert "budgets.max_iterationz: unknown key" in one_line_error(kestrel(tmp_path, "run", "hi"))
    # Listing runs reads only where the journal is: on-call may look while the file is fixed.
    assert kestrel(tmp_path, "runs", "list").returncode == 0


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    write_config(tmp_path, model={"provider": "openai", "name": "from-file"})
    result = kestrel(tmp_path, "runs", "list", env={"KESTREL_MODEL__PROVIDER": "scripted"})
    assert result.returncode == 0, result.stderr


def test_missing_api_key_is_one_line(tmp_path: Path) -> None:
    write_config(tmp_path, model={"provider": "openai"})
    assert one_line_error(kestrel(tmp_path, "run", "hi")) == (
        "kestrel: model.provider is openai but OPENAI_API_KEY is not set: set it, or set"
        " OPENAI_BASE_URL alone for a local OpenAI-compatible server that needs no key"
    )


@pytest.mark.parametrize(
    "key",
    [
        "\u201csk-pasted-0123456789\u201d",
        "sk-pasted-0123456789\u2026",
        # Said to be a line break or another control character, which it is not.
        "sk-pasted-01234\u00a056789",
    ],
)
def test_an_api_key_pasted_with_quotes_or_an_ellipsis_is_one_line(tmp_path: Path, key: str) -> None:
    # Copied from a chat or a document, a key brings its curly quotes or its ellipsis along:
    # every run failed with "no usable reply from … (UnicodeEncodeError: 'ascii' codec …)",
    # after retries that could not help.
    write_config(tmp_path, model={"provider": "openai", "name": "m"})
    env = {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    said = one_line_error(kestrel(tmp_path, "run", "hi", env=env))

    assert said.startswith("kestrel: OPENAI_API_KEY holds a character that is not ASCII"), said
    assert "sk-pasted" not in said and "56789" not in said


@pytest.mark.parametrize("key", ['""', "''", '" "'])
def test_an_api_key_of_empty_quotes_is_no_key(tmp_path: Path, key: str) -> None:
    # OPENAI_API_KEY="" in an env file that keeps quotes is written empty, as for a local
    # server that needs no key: it was refused as a key in quotes, and serve did not start.
    write_config(tmp_path, model={"provider": "openai", "name": "m"})
    env = {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    ran = kestrel(tmp_path, "run", "hi", env=env)
    assert ran.returncode == 1 and "in quotes" not in ran.stderr, ran.stderr
    assert "cannot connect to http://127.0.0.1:9/v1" in ran.stderr, ran.stderr
    del env["OPENAI_BASE_URL"]
    said = one_line_error(kestrel(tmp_path, "run", "hi", env=env))
    assert said.startswith("kestrel: model.provider is openai but OPENAI_API_KEY is not set"), said


@pytest.mark.parametrize("key", ['"sk-quoted-0123456789"', "'sk-quoted-0123456789'"])
def test_an_api_key_in_quotes_is_one_line(tmp_path: Path, key: str) -> None:
    # Kept by docker run --env-file: every run failed with the server's 401 for a bad key.
    write_config(tmp_path, model={"provider": "openai", "name": "m"})
    env = {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    said = one_line_error(kestrel(tmp_path, "run", "hi", env=env))

    assert said.startswith("kestrel: OPENAI_API_KEY is in quotes, which are not part of it"), said
    assert "sk-quoted" not in said


def test_malformed_catalog_reports_file_and_line(tmp_path: Path) -> None:
    catalog = tmp_path / "bad.yaml"
    catalog.write_text(
        "tools:\n  - name: ok\n    description: x\n    command: [ls]\n    timeoutt: 3\n"
    )
    checked = kestrel(tmp_path, "tools", "check", str(catalog))
    assert checked.returncode == 1
    assert f"{catalog}:5" in checked.stderr and "timeoutt" in checked.stderr
    write_config(tmp_path, tools=["bad.yaml"])
    assert "bad.yaml:5" in one_line_error(kestrel(tmp_path, "run", "hi"))


def test_every_problem_of_a_catalog_is_one_clause_of_the_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "tools:\n  - {name: a, description: x, command: [ls], timeoutt: 3}\n"
        "  - {name: b, descriptionx: y, command: [ls]}\n"
    )
    # With on-call named, ``serve`` logs no notice before its error.
    write_config(tmp_path, tools=["bad.yaml"], policy={"oncall": ["U0ONCALL"]})
    catalog = tmp_path / "bad.yaml"
    problems = [
        f"{catalog}:2: tools[0].timeoutt: unknown key (did you mean timeout?)",
        f"{catalog}:3: tools[1].descriptionx: unknown key (did you mean description?)",
        f"{catalog}:3: tools[1].description: required key is missing",
    ]
    for args in (("run", "hi"), ("chat",), ("serve",)):
        said = one_line_error(kestrel(tmp_path, *args))
        assert said == "kestrel: tools: " + "; ".join(problems), args


def test_tools_check_names_a_program_that_cannot_start_here(tmp_path: Path) -> None:
    catalog = tmp_path / "ops.yaml"
    catalog.write_text("tools:\n  - {name: gone, description: x, command: [/nonexistent/prog]}\n")
    said = f"{catalog}:2: tool 'gone': program '/nonexistent/prog' cannot start: No such file"
    write_config(tmp_path, tools=["ops.yaml"])
    for args in (("tools", "check", str(catalog)), ("tools", "check")):
        checked = kestrel(tmp_path, *args)
        assert checked.returncode == 1
        assert checked.stderr == f"{said} or directory\n"


def test_a_command_that_cannot_start_is_counted_as_a_failed_call(tmp_path: Path) -> None:
    tools = [
        {"name": "gone", "description": "x", "command": ["/nonexistent/prog"]},
        {"name": "orphan", "description": "x", "command": ["./orphan.sh"]},
    ]
    (tmp_path / "ops.yaml").write_text(yaml.safe_dump({"tools": tools}))
    (tmp_path / "orphan.sh").write_text("#!/nonexistent/interpreter\n")
    (tmp_path / "orphan.sh").chmod(0o755)
    script = [{"text": "trying", "calls": [{"name": "gone"}, {"name": "orphan"}]}, {"text": "ok"}]
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(script))
    write_config(
        tmp_path, tools=["ops.yaml"], model={"provider": "scripted", "script": "script.yaml"}
    )
    ran = kestrel(tmp_path, "run", "try them", "--json")
    assert ran.returncode == 0, ran.stderr  # a missing program is warned of, not refused
    assert json.loads(ran.stdout)["outcomes"] == {"error": 2}
    shown = kestrel(tmp_path, "runs", "show", json.loads(ran.stdout)["run_id"]).stdout
    assert '  calls: {"error": 2}' in shown.splitlines()


def test_read_only_database_is_one_line_and_journal_untouched(tmp_path: Path) -> None:
    assert kestrel(tmp_path, "run", "checkout is failing").returncode == 0
    db = tmp_path / "kestrel.db"
    before = db.read_bytes()
    db.chmod(0o444)
    try:
        message = one_line_error(kestrel(tmp_path, "run", "again"))
    finally:
        db.chmod(0o644)
    assert "kestrel.db" in message
    assert db.read_bytes() == before


def test_a_database_path_that_cannot_hold_a_journal_is_named(tmp_path: Path) -> None:
    (tmp_path / "folder.db").mkdir()
    for database, why in (
        ("folder.db", "is a folder"),
        ("nowhere/k.db", "does not exist"),
        (f"{'x' * 300}/k.db", "too long"),
    ):
        write_config(tmp_path, database=database)
        for command in (("run", "hi"), ("runs", "list"), ("runs", "pending"), ("db", "check")):
            said = kestrel(tmp_path, *command)
            assert said.returncode in (1, 2) and "Traceback" not in said.stderr, said.stderr
            assert why in said.stderr and database in said.stderr, (command, said.stderr)
    (tmp_path / "config.yaml").mkdir()
    assert "is a folder" in one_line_error(kestrel(tmp_path, "--config", "config.yaml", "run", "x"))


def test_locked_database_is_one_line(tmp_path: Path) -> None:
    assert kestrel(tmp_path, "run", "checkout is failing").returncode == 0
    holder = sqlite3.connect(tmp_path / "kestrel.db")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        message = one_line_error(kestrel(tmp_path, "run", "again"))
    finally:
        holder.rollback()
        holder.close()
    assert "locked" in message or "busy" in message
    runs = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)
    assert [r["status"] for r in runs] == ["completed"]


def test_unknown_run_is_one_line(tmp_path: Path) -> None:
    assert "run_nope" in one_line_error(kestrel(tmp_path, "runs", "show", "run_nope"))
    assert "run_nope" in one_line_error(kestrel(tmp_path, "audit", "--run", "run_nope"))


def test_resume_refuses_a_changed_system_prompt_without_force(tmp_path: Path) -> None:
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json").stdout
    )
    write_config(tmp_path, system_prompt="a different prompt")
    refused = one_line_error(kestrel(tmp_path, "runs", "resume", deferred["run_id"]))
    assert "system prompt changed" in refused and "--force" in refused
    write_config(tmp_path, model={"provider": "openai"}, openai_base_url="http://127.0.0.1:9/v1")
    assert "provider" in one_line_error(kestrel(tmp_path, "runs", "resume", deferred["run_id"]))


def test_an_approval_never_runs_a_command_changed_since_the_run_started(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "bot" / "demo" / "tools", tmp_path / "tools")
    write_config(tmp_path, tools=["tools/ops.yaml"])
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    ids = [deferred["run_id"], deferred["requests"][0]["id"]]
    catalog = tmp_path / "tools" / "ops.yaml"
    edited = catalog.read_text().replace('"restart", "{service}"', '"restart", "{service}", "-v"')
    assert edited != catalog.read_text()
    catalog.write_text(edited)  # the same tool, name, schema and flags: another argv (that works)
    approved = kestrel(tmp_path, "runs", "approve", *ids, "--as", "U0BOSS")
    assert "tool set changed since the run started" in approved.stdout, approved.stderr
    # The command that does it, whole: `runs approve … --force` is a usage error.
    assert f"kestrel runs resume {ids[0]} --force" in approved.stdout
    assert not (tmp_path / "demo-state" / "restarts.log").exists()  # nothing ran
    assert "waiting" not in approved.stdout  # the request is decided: the run waits on no one
    shown = json.loads(kestrel(tmp_path, "runs", "show", ids[0], "--json").stdout)
    assert shown["requests"] == [] and shown["closed_requests"][0]["id"] == ids[1]
    assert "waiting" not in kestrel(tmp_path, "runs", "show", ids[0]).stdout
    # Resumed past the change, by the requester: the approval was for the old argv, so the
    # call asks again on a card of its own; only an approval of that one runs the new argv.
    forced = kestrel(tmp_path, "runs", "resume", ids[0], "--force", "--as", "U0REQ")
    assert forced.returncode == 3, forced.stderr  # suspended again, waiting
    assert not (tmp_path / "demo-state" / "restarts.log").exists()
    shown = json.loads(kestrel(tmp_path, "runs", "show", ids[0], "--json").stdout)
    assert shown["status"] == "suspended"
    (again,) = shown["requests"]
    assert again["id"] != ids[1] and again["tool"] == "restart_service"
    # The --force accepted the new argv: an approval of the card asked since runs it, with no
    # --force again, and the run goes on to the demo's follow-up question.
    approved = kestrel(tmp_path, "runs", "approve", ids[0], again["id"], "--as", "U0BOSS")
    assert f"run {ids[0]} is now suspended" in approved.stdout, approved.stderr
    ran = (tmp_path / "demo-state" / "restarts.log").read_text().splitlines()
    assert ran == ["restart checkout"]


HOOK = """\
import json, os
from bot.hooks import ToolVerdict
async def pre(call, ctx):
    flag = os.path.join(os.path.dirname(__file__), "rewrite")
    if call.name == "restart_service" and os.path.exists(flag):
        return ToolVerdict(arguments=json.dumps({"service": "payments"}))
    return ToolVerdict()
"""


def test_an_approval_never_runs_a_call_a_hook_changed_after_its_card(tmp_path: Path) -> None:
    (tmp_path / "rewriting_hook.py").write_text(HOOK)
    write_config(tmp_path, hooks={"pre_tool_use": ["rewriting_hook:pre"]})
    env = {"PYTHONPATH": str(tmp_path)}
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", env=env).stdout
    )
    assert deferred["requests"][0]["arguments"] == {"service": "checkout"}  # the card's call
    (tmp_path / "rewrite").touch()  # from now on the hook sends the call to payments
    ids = [deferred["run_id"], deferred["requests"][0]["id"]]
    kestrel(tmp_path, "runs", "approve", *ids, "--as", "U0BOSS", env=env)
    assert not (tmp_path / "demo-state" / "restarts.log").exists()  # nothing ran unseen
    shown = json.loads(kestrel(tmp_path, "runs", "show", ids[0], "--json", env=env).stdout)
    (again,) = shown["requests"]
    assert again["arguments"] == {"service": "payments"}
    assert (
        again["off_plan"]
        == "asked again: U0BOSS approved restart_service as another card showed it"
    )


def test_a_resume_where_no_replica_runs_expires_what_is_overdue(tmp_path: Path) -> None:
    # No `kestrel serve` sweeps deadlines here: the resume itself expires the request (as
    # the deadline, audited), and the run goes on without it instead of waiting for good.
    write_config(tmp_path, deadlines={"wait_approval": 0.001})
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    run_id, request_id = deferred["run_id"], deferred["requests"][0]["id"]
    late = kestrel(tmp_path, "runs", "approve", run_id, request_id, "--as", "U0BOSS")
    assert "expired" in one_line_error(late)
    pending = kestrel(tmp_path, "runs", "pending").stdout
    assert f"expired; `kestrel runs resume {run_id}` moves the run on" in pending
    resumed = kestrel(tmp_path, "runs", "resume", run_id, "--as", "U0REQ")
    assert resumed.returncode == 0, resumed.stderr
    assert "expired before anyone answered" in resumed.stdout
    assert not (tmp_path / "demo-state" / "restarts.log").exists()
    audit = kestrel(tmp_path, "audit", "--run", run_id, "--json").stdout
    assert [row["actor"] for row in json.loads(audit) if row["action"] == "expire"] == ["deadline"]


def test_runs_resume_exits_by_the_status_the_run_is_in_as_run_does(tmp_path: Path) -> None:
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    run_id = deferred["run_id"]
    waiting = kestrel(tmp_path, "runs", "resume", run_id, "--as", "U0REQ")
    assert waiting.returncode == 3
    # It waits on an approval here: "an answer" alone read as if a question were open.
    said = "the run still waits for an approval, an answer or on-call (kestrel runs pending)"
    assert waiting.stderr.splitlines()[0] == said
    assert kestrel(tmp_path, "runs", "cancel", run_id, "--as", "U0REQ").returncode == 0
    ended = kestrel(tmp_path, "runs", "resume", run_id, "--as", "U0REQ")
    assert ended.returncode == 4
    # It said nothing: its transcript and status alone read as a resume that ran.
    said = f"run {run_id} already ended (cancelled): nothing to resume"
    assert ended.stderr.splitlines()[0] == said
    write_config(tmp_path, budgets={"max_iterations": 1})
    failing = json.loads(kestrel(tmp_path, "run", "checkout is failing", "--json").stdout)
    assert failing["status"] == "failed"
    again = kestrel(tmp_path, "runs", "resume", failing["run_id"], "--json")
    assert again.returncode == 1 and json.loads(again.stdout)["status"] == "failed"


def test_a_request_named_with_another_run_says_whose_it_is(tmp_path: Path) -> None:
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json").stdout
    )
    run_id, request_id = deferred["run_id"], deferred["requests"][0]["id"]
    refused = kestrel(tmp_path, "runs", "approve", "run_nope", request_id, "--as", "U0BOSS")
    assert one_line_error(refused).endswith(
        f"request {request_id} is run {run_id}'s, not run run_nope's"
    )


def test_a_cancel_needs_no_model_key(tmp_path: Path) -> None:
    # On-call stops a run from a shell that holds no OPENAI_API_KEY (the replicas' secret): a
    # cancel calls no model, yet it was refused for the key a model client would need.
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    write_config(tmp_path, model={"provider": "openai", "name": "gpt-4.1-mini"})
    cancelled = kestrel(tmp_path, "runs", "cancel", deferred["run_id"], "--as", "U0REQ")
    assert cancelled.returncode == 0, cancelled.stderr
    shown = json.loads(kestrel(tmp_path, "runs", "show", deferred["run_id"], "--json").stdout)
    assert shown["status"] == "cancelled"


@pytest.mark.parametrize(
    ("key", "decision"),
    [
        (None, ("approve", "{run}", "{request}")),
        (None, ("deny", "{run}", "{request}", "--reason", "no")),
        (None, ("answer", "{run}", "{request}", "yes")),
        (None, ("effect", "{run}", "{request}", "done")),
        (None, ("resume", "{run}")),
        # With the key, every command reads its ids alike: one says it for all.
        ("sk-test", ("approve", "{run}", "{request}")),
    ],
)
def test_ids_that_name_nothing_are_said_before_a_missing_model_key(
    tmp_path: Path, key: str | None, decision: tuple[str, ...]
) -> None:
    # An approver's shell without OPENAI_API_KEY, a run id mistyped: they were told to set the
    # key, then that the run does not exist. Said as with the key, whichever is set.
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    run_id, request_id = deferred["run_id"], deferred["requests"][0]["id"]
    write_config(tmp_path, model={"provider": "openai", "name": "gpt-4.1-mini"})
    env = {"OPENAI_API_KEY": key} if key else {}

    def said(run: str, request: str) -> str:
        argv = [part.format(run=run, request=request) for part in decision]
        return one_line_error(kestrel(tmp_path, "runs", *argv, "--as", "U0BOSS", env=env))

    assert said("run_nope", "req_nope") == "kestrel: unknown run 'run_nope'"
    if decision[0] != "resume":
        assert said(run_id, "req_nope") == "kestrel: there is no request req_nope"
    if decision[0] in ("approve", "deny"):  # the request's kind: answer and effect say it first
        assert said("run_nope", request_id) == (
            f"kestrel: request {request_id} is run {run_id}'s, not run run_nope's"
        )
    if key is None:  # what would go on with the run still needs the key
        assert "OPENAI_API_KEY is not set" in said(run_id, request_id)
    shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    assert [r["id"] for r in shown["requests"]] == [request_id]  # nothing was decided


def test_a_cancelled_run_waits_on_nothing(tmp_path: Path) -> None:
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    run_id, request_id = deferred["run_id"], deferred["requests"][0]["id"]
    assert kestrel(tmp_path, "runs", "cancel", run_id, "--as", "U0REQ").returncode == 0
    shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    assert shown["status"] == "cancelled" and shown["requests"] == []
    assert [(r["id"], r["status"]) for r in shown["closed_requests"]] == [(request_id, "cancelled")]
    assert "waiting" not in kestrel(tmp_path, "runs", "show", run_id).stdout
    assert request_id not in kestrel(tmp_path, "runs", "pending").stdout


def test_db_migrate_check_and_replicas(tmp_path: Path) -> None:
    migrated = kestrel(tmp_path, "db", "migrate")
    assert migrated.returncode == 0 and "schema at version" in migrated.stdout
    assert kestrel(tmp_path, "run", "checkout is failing").returncode == 0
    checked = kestrel(tmp_path, "db", "check")
    assert "ok, schema version" in checked.stdout and "1 runs" in checked.stdout
    assert "no live replicas" in kestrel(tmp_path, "replicas").stdout


def test_db_migrate_needs_the_store_alone(tmp_path: Path) -> None:
    # A migration job (before the replicas start) has the database URL, not the model's key
    # nor the catalogs' programs: migrating touches the store alone, as db check does.
    write_config(tmp_path, model={"provider": "openai", "name": "gpt-4.1-mini"})
    migrated = kestrel(tmp_path, "db", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "schema at version" in migrated.stdout
    checked = kestrel(tmp_path, "db", "check")
    assert checked.returncode == 0 and "ok, schema version" in checked.stdout


def test_another_programs_sqlite_file_is_refused_by_migrate_and_check(tmp_path: Path) -> None:
    app = tmp_path / "app.db"
    with sqlite3.connect(app) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    write_config(tmp_path, database=str(app))
    for args in (("db", "migrate"), ("db", "check")):
        message = one_line_error(kestrel(tmp_path, *args))
        assert "not Kestrel's (users)" in message and "nothing was written" in message, args
    with sqlite3.connect(app) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("users",)]


def test_another_programs_postgres_schema_is_refused_by_migrate_and_check(
    tmp_path: Path,
) -> None:
    dsn = postgres_dsn()

    async def scenario() -> list[str]:
        async with postgres_schema(dsn) as schema:
            admin = await asyncpg.connect(dsn)
            try:
                await admin.execute(f"CREATE TABLE {schema}.users (name text)")
                write_config(tmp_path, database=f"{dsn}?schema={schema}")
                for args in (("db", "migrate"), ("db", "check")):
                    said = await asyncio.to_thread(kestrel, tmp_path, *args)
                    message = one_line_error(said)
                    assert "not Kestrel's (users)" in message, (args, message)
                    assert "?schema=NAME" in message, message
                rows = await admin.fetch(
                    "SELECT tablename FROM pg_tables WHERE schemaname = $1", schema
                )
            finally:
                await admin.close()
        return [row["tablename"] for row in rows]

    assert asyncio.run(scenario()) == ["users"]


def test_postgres_url_without_a_server_is_one_line(tmp_path: Path) -> None:
    write_config(tmp_path, database="postgresql://kestrel:secret@127.0.0.1:1/kestrel")
    message = one_line_error(kestrel(tmp_path, "db", "check"))
    assert "127.0.0.1:1" in message and "secret" not in message


def test_a_database_url_of_another_kind_is_refused_not_taken_for_a_file(tmp_path: Path) -> None:
    write_config(tmp_path, database="mysql://kestrel:secret@db/kestrel")
    for args in (("db", "check"), ("runs", "list"), ("run", "hi")):
        message = one_line_error(kestrel(tmp_path, *args))
        assert "database: unsupported URL scheme 'mysql'" in message, args
        assert "secret" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kestrel.yaml"]


def test_an_empty_database_is_refused_naming_where_it_was_set(tmp_path: Path) -> None:
    # An empty KESTREL_DATABASE_URL (a Secret's key left blank, an unset variable substituted)
    # was taken for the config's folder: "SQLite database /…: is a folder", naming no cause.
    message = one_line_error(kestrel(tmp_path, "db", "check", env={"KESTREL_DATABASE_URL": ""}))
    assert "KESTREL_DATABASE_URL" in message and "empty" in message
    write_config(tmp_path, database=" ")
    for args in (("db", "check"), ("runs", "list"), ("run", "hi")):
        message = one_line_error(kestrel(tmp_path, *args))
        assert "database: empty" in message, (args, message)


def test_a_database_password_a_url_parser_would_cut_is_refused_unshown(tmp_path: Path) -> None:
    refused = {
        "postgresql://kestrel:Zm9v/YmFy+c2V@db:5432/k": "must percent-encode '/' as %2F",
        "postgresql://kestrel:Zm9v#YmFy@db/k": "must percent-encode '#' as %23",
        "postgres://kestrel:p@ss@db/k": "must percent-encode '@' as %40",
        "host=db user=kestrel password=Zm9vYmFy dbname=k": "a libpq keyword string",
    }
    for database, said in refused.items():
        write_config(tmp_path, database=database)
        for args in (("db", "check"), ("runs", "list")):
            message = one_line_error(kestrel(tmp_path, *args))
            assert said in message, (database, args)
            assert "Zm9v" not in message and "ss@" not in message, message


def test_a_policy_or_deadline_naming_no_tool_is_refused_with_the_nearest(tmp_path: Path) -> None:
    policies = {
        "restart_servce": "policy.approvers: 'restart_servce' names no tool or tag here"
        " (did you mean 'restart_service'?)",
        "tag:prd": "policy.approvers: 'tag:prd' names no tool or tag here"
        " (did you mean 'tag:prod'?)",
    }
    for key, said in policies.items():
        write_config(tmp_path, policy={"approvers": {key: ["U0BOSS"]}})
        for args in (("run", "hi"), ("chat",)):
            assert one_line_error(kestrel(tmp_path, *args)).endswith(said), (key, args)
    write_config(tmp_path, deadlines={"per_tool": {"nosuchtool": 5}})
    refused = one_line_error(kestrel(tmp_path, "run", "hi"))
    assert "deadlines.per_tool: 'nosuchtool' names no tool here; known: " in refused
    assert "restart_service" in refused
    write_config(
        tmp_path,
        policy={"approvers": {"restart_service": ["U0BOSS"], "tag:prod": ["U0BOSS"]}},
        deadlines={"per_tool": {"restart_service": 60}},
    )
    assert kestrel(tmp_path, "run", "checkout is failing").returncode == 0


@pytest.mark.parametrize(
    ("per_tool", "seconds"),
    [
        ({"restart_service": 60}, 60),
        ({"tag:prod": 120}, 120),
        ({"*": 180}, 180),
        # The tool's own entry outranks its tag's, and a tag's outranks every tool's.
        ({"*": 30, "tag:prod": 240, "restart_service": 300}, 300),
        ({"*": 30, "tag:prod": 240}, 240),
    ],
)
def test_a_deadline_set_per_tool_tag_or_every_tool_is_the_requests(
    tmp_path: Path, per_tool: dict[str, int], seconds: int
) -> None:
    # A tag's and "*"'s entries were accepted (tools check too) and then ignored: restarts
    # tagged prod stayed open the hour of deadlines.wait_approval, not the 2 minutes set.
    write_config(tmp_path, deadlines={"per_tool": per_tool})
    deferred = kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0R")
    (request,) = json.loads(deferred.stdout)["requests"]
    assert request["tool"] == "restart_service"
    opened = datetime.fromisoformat(request["created_at"])
    assert datetime.fromisoformat(request["deadline"]) - opened == timedelta(seconds=seconds)


def test_a_gated_tool_the_policy_lets_nobody_approve_is_refused(tmp_path: Path) -> None:
    # Each left the demo's restart_service (confirm: true, tag prod) to nobody: its card
    # waited an hour, every click refused with "only nobody may".
    said = (
        "policy.approvers: nobody may approve restart_service, which asks for approval"
        ' (confirm: true): name who may under restart_service, tag:prod or "*"'
    )
    nobody: list[dict[str, list[str]]] = [
        {},
        {"restart_service": []},
        {"*": []},
        {"tag:read-only": ["U0BOSS"]},
    ]
    for approvers in nobody:
        write_config(tmp_path, policy={"approvers": approvers})
        for args in (("run", "--defer", "hi"), ("chat",)):
            refused = one_line_error(kestrel(tmp_path, *args))
            assert refused.startswith(f"kestrel: {said}"), (approvers, args, refused)
        checked = kestrel(tmp_path, "tools", "check")
        assert checked.returncode == 1, (approvers, checked.stdout)
        assert checked.stderr.startswith(said), checked.stderr
    # Commands that ask nobody still work under such a policy (a freeze written as
    # approvers: {}): a headless run refuses gated calls itself, and a stuck run is cancelled.
    headless = kestrel(tmp_path, "run", "--json", "checkout is failing")
    assert headless.returncode == 0, headless.stderr
    run_id = json.loads(headless.stdout)["run_id"]
    for reading in (("runs", "list"), ("runs", "show", run_id)):
        assert kestrel(tmp_path, *reading).returncode == 0, reading
    write_config(tmp_path, policy={"approvers": {"tag:prod": ["U0BOSS"]}})
    assert kestrel(tmp_path, "run", "hi").returncode == 0


def test_only_requesters_may_start_runs(tmp_path: Path) -> None:
    write_config(tmp_path, policy={"requesters": ["U0ALLOWED", "group:S0OPS"]})
    refused = one_line_error(kestrel(tmp_path, "run", "hi", "--as", "U0OTHER"))
    # Who may, as every other refusal says: at the terminal, whom to be with --as.
    assert refused == (
        "kestrel: U0OTHER may not start runs: only U0ALLOWED or group:S0OPS may (policy.requesters)"
    )
    assert kestrel(tmp_path, "run", "checkout is failing", "--as", "U0ALLOWED").returncode == 0
    # It said "only nobody may".
    write_config(tmp_path, policy={"requesters": []})
    refused = one_line_error(kestrel(tmp_path, "run", "hi", "--as", "U0OTHER"))
    assert refused == "kestrel: U0OTHER may not start runs: policy.requesters is empty"


def test_with_json_logs_a_commands_one_line_error_is_a_json_record(tmp_path: Path) -> None:
    (tmp_path / "kestrel.yaml").write_text("modle: {}\n")
    for args in (("serve", "slack", "--port", "1"), ("run", "hi")):
        result = kestrel(tmp_path, *args, env={"KESTREL_LOG_FORMAT": "json"})
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.splitlines()
        record = json.loads(line)
        assert record["level"] == "error" and record["logger"] == "kestrel"
        assert record["message"] == "kestrel.yaml: modle: unknown key (did you mean model?)"


def test_with_json_logs_a_usage_error_is_a_json_record_too(tmp_path: Path) -> None:
    # A chart's platforms: [slak] ends serve in a usage error: with JSON logs it is one record
    # naming the problem, not click's three lines of text.
    cases = {
        ("serve", "slak", "--port", "1"): "'slak' is not one of 'slack', 'discord'",
        ("runs", "show"): "Missing argument 'RUN_ID'",
        ("--log-level", "trace", "runs", "list"): "'trace' is not one of",
        ("runs", "frobnicate"): "No such command 'frobnicate'",
    }
    for args, said in cases.items():
        result = kestrel(tmp_path, *args, env={"KESTREL_LOG_FORMAT": "json"})
        assert result.returncode == 2, (args, result.stderr)
        (line,) = result.stderr.splitlines()
        record = json.loads(line)
        assert record["level"] == "error" and record["logger"] == "kestrel", args
        assert said in record["message"], (args, record)
    text = kestrel(tmp_path, "runs", "show")
    assert text.returncode == 2 and "Usage: kestrel runs show" in text.stderr


def test_kestrels_own_options_after_the_command_say_where_they_go(tmp_path: Path) -> None:
    for args, said in (
        (("runs", "list", "--config", "x.yaml"), "--config FILE runs list"),
        (("runs", "approve", "run_1", "req_1", "--config=x.yaml"), "--config FILE runs approve"),
        (("audit", "-v"), "-v audit"),
        (("tools", "check", "--log-level", "info"), "--log-level LEVEL tools check"),
    ):
        result = kestrel(tmp_path, *args)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        option = said.split()[0]
        assert result.stderr.splitlines()[-1] == (
            f"Error: No such option '{option}'. It is kestrel's own option: give it before the"
            f" command, kestrel {said} …"
        ), args


def test_a_commands_option_before_the_command_says_where_it_goes(tmp_path: Path) -> None:
    # ``kestrel --json runs list`` was answered "Did you mean '--version'?", and ``kestrel --as
    # bob runs approve …`` with "No such option" alone, as if the command had none.
    for args, option, said in (
        (("--json", "runs", "list"), "--json", "runs list: … kestrel runs list --json"),
        (
            ("--as", "bob", "runs", "approve", "run_1", "req_1"),
            "--as",
            "runs approve: … kestrel runs approve --as USER",
        ),
        (
            ("--config", "x.yaml", "--limit=3", "audit"),
            "--limit",
            "audit: … kestrel audit --limit N",
        ),
    ):
        result = kestrel(tmp_path, *args)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        where = said.replace("…", "give it after the command,")
        assert result.stderr.splitlines()[-1] == (
            f"Error: No such option '{option}'. It is an option of kestrel {where} …"
        ), args
    # An option the command named has not, or no command at all: click's answer, as before.
    for plain in (("--as", "bob", "runs", "pending"), ("--json",)):
        said = kestrel(tmp_path, *plain).stderr.splitlines()[-1]
        assert "It is an option" not in said and said.startswith("Error: No such option"), plain


def test_a_commands_option_before_it_within_a_group_says_where_it_goes(tmp_path: Path) -> None:
    # ``kestrel runs --as bob approve …`` (as one writes ``git -C dir log``) was answered "No
    # such option '--as'" alone: only an option given before ``runs`` itself got the hint.
    for args, command, given in (
        (("runs", "--as", "bob", "approve", "run_1", "req_1"), "runs approve", "--as USER"),
        (("runs", "--limit", "5", "list"), "runs list", "--limit N"),
        (("runs", "--json", "pending"), "runs pending", "--json"),
    ):
        result = kestrel(tmp_path, *args)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        option = given.split()[0]
        assert result.stderr.splitlines()[-1] == (
            f"Error: No such option '{option}'. It is an option of kestrel {command}: give it"
            f" after the command, kestrel {command} {given} …"
        ), args
    # An option no command of the group has: click's answer, as before.
    said = kestrel(tmp_path, "tools", "--json", "list").stderr.splitlines()[-1]
    assert said == "Error: No such option '--json'.", said


def test_a_number_that_is_no_number_is_named_as_the_number_it_wants(tmp_path: Path) -> None:
    # ``--limit abc`` was "'abc' is not a valid integer range": a range is not what one types.
    for args, wanted in (
        (("runs", "list", "--limit", "abc"), "integer"),
        (("audit", "--limit", "1.5"), "integer"),
        (("serve", "--port", "http"), "integer"),
        (("health", "--timeout", "5s"), "float"),
    ):
        result = kestrel(tmp_path, *args)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        option, value = args[-2:]
        assert result.stderr.splitlines()[-1] == (
            f"Error: Invalid value for '{option}': '{value}' is not a valid {wanted}."
        ), args


@pytest.mark.parametrize("value", ["nan", "NaN", "-nan"])
def test_health_refuses_a_timeout_that_is_no_number(tmp_path: Path, value: str) -> None:
    # Every comparison with NaN is false, so it passed the option's range and reached the
    # socket, which said "Invalid value NaN (not a number)" as the replica's answer (exit 1).
    result = kestrel(tmp_path, "health", "--timeout", value)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"Error: Invalid value for '--timeout': '{value}' is not a number."
    )


def test_health_with_nothing_listening_says_so_in_words(tmp_path: Path) -> None:
    # It said "[Errno 111] Connection refused"; the one-line answer is read by whoever runs it.
    from tests.fakes.serving import free_port

    url = f"http://127.0.0.1:{free_port()}/healthz"
    result = kestrel(tmp_path, "health", "--url", url)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"kestrel: {url}: nothing listens there (is kestrel serve running, on that --port?)\n"
    )


async def test_health_asks_the_replica_itself_whatever_proxy_the_environment_names(
    tmp_path: Path,
) -> None:
    # A pod given HTTP_PROXY for the model's and Slack's endpoints ran the image's HEALTHCHECK
    # through that proxy: the probe failed ("nothing listens there", or the proxy's own 502)
    # and the container was unhealthy though it served, or healthy on the proxy's word.
    from tests.fakes.processes import clean_env
    from tests.fakes.serving import free_port, start_serve, wait_healthy

    port, nowhere = free_port(), f"http://127.0.0.1:{free_port()}"
    env = clean_env(KESTREL_DEMO_STATE=str(tmp_path / "demo-state"))
    process = start_serve(tmp_path, port, env)
    try:
        await wait_healthy(port, process)
        proxied = {"HTTP_PROXY": nowhere, "http_proxy": nowhere, "NO_PROXY": "", "no_proxy": ""}
        url = f"http://127.0.0.1:{port}/healthz"
        result = await asyncio.to_thread(kestrel, tmp_path, "health", "--url", url, env=proxied)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("200 "), result.stdout
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("KESTREL_LOG_FORMAT", "xml", "KESTREL_LOG_FORMAT must be text or json, not 'xml'"),
        ("KESTREL_LOG_LEVEL", "verbose", "KESTREL_LOG_LEVEL must be one of debug, info, warning,"),
    ],
)
async def test_health_answers_the_probe_whatever_the_log_variables_say(
    tmp_path: Path, variable: str, value: str, said: str
) -> None:
    # The container's environment is the probe's: it exited 2 (which Docker reserves) on a
    # log variable it had no use for, and a replica serving with --log-level was unhealthy.
    from aiohttp import web

    from tests.fakes.serving import free_port

    async def alive(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/healthz", alive)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        url = f"http://127.0.0.1:{port}/healthz"
        env = {variable: value}
        result = await asyncio.to_thread(kestrel, tmp_path, "health", "--url", url, env=env)
    finally:
        await runner.cleanup()

    assert (result.returncode, result.stdout) == (0, "200 ok\n"), result.stderr
    assert result.stderr.startswith(f"kestrel: {said}"), result.stderr
    assert result.stderr.endswith("(ignored: the probe goes on)\n"), result.stderr


def test_health_names_neither_a_url_without_its_scheme_nor_its_credentials(tmp_path: Path) -> None:
    # "unknown url type: localhost" for --url localhost:3000; a URL's password was shown as is.
    said = kestrel(tmp_path, "health", "--url", "localhost:3000")
    assert said.returncode == 1
    assert said.stderr == (
        "kestrel: localhost:3000: not an http:// URL (the default is"
        " http://127.0.0.1:3000/healthz)\n"
    )
    from tests.fakes.serving import free_port

    url = f"http://probe:hunter22@127.0.0.1:{free_port()}/healthz"
    said = kestrel(tmp_path, "health", "--url", url)
    assert said.returncode == 1 and said.stderr.startswith("kestrel: http://probe:…@127.0.0.1:")
    assert said.stderr.endswith(": a probe sends no user or password: give the URL without them\n")
    assert "hunter22" not in said.stderr
    said = kestrel(tmp_path, "health", "--url", f"http://127.0.0.1:{free_port()}/?token=Tk-9f8e7d")
    assert said.returncode == 1 and "/?token=… " in said.stderr, said.stderr
    assert "Tk-9f8e7d" not in said.stderr


@pytest.mark.parametrize("url", ["http://[::1/healthz", "http://[::1]:3000x/healthz"])
def test_health_names_a_url_it_cannot_read_in_one_line(tmp_path: Path, url: str) -> None:
    # An unclosed IPv6 bracket (a typo in a HEALTHCHECK's --url) was a traceback, ValueError
    # at its last line, and a container that stayed "unhealthy" without a word of why.
    said = kestrel(tmp_path, "health", "--url", url)
    assert said.returncode == 1 and "Traceback" not in said.stderr, said.stderr
    assert said.stderr.startswith(f"kestrel: {url}: ") and said.stderr.count("\n") == 1


def test_tools_check_of_a_configuration_says_what_it_is_and_what_checks_it(
    tmp_path: Path,
) -> None:
    # kestrel.yaml given to tools check was read as a catalog: "database: unknown key", "model:
    # unknown key", … "tools: required key is missing", one line per setting.
    config = write_config(tmp_path, database="k.db", model={"name": "m"}, tools=["ops.yaml"])
    tool = {"name": "noop", "description": "Nothing", "command": ["true"], "idempotent": True}
    (tmp_path / "ops.yaml").write_text(yaml.safe_dump({"tools": [tool]}))
    result = kestrel(tmp_path, "tools", "check", "kestrel.yaml")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "kestrel.yaml: a configuration (kestrel.yaml), not a catalog: kestrel --config"
        " kestrel.yaml tools check checks the catalogs it names"
    ]
    # What it says to run works; a catalog given is checked as before.
    said = kestrel(tmp_path, "--config", config.name, "tools", "check")
    assert said.returncode == 0 and said.stdout.startswith("1 catalog file(s) OK"), said.stderr
    assert kestrel(tmp_path, "tools", "check", "ops.yaml").returncode == 0
    # tools: alone is a catalog's key too, but a catalog's tools are not file names.
    write_config(tmp_path, tools=["ops.yaml"])
    alone = kestrel(tmp_path, "tools", "check", "kestrel.yaml")
    assert alone.stderr.startswith("kestrel.yaml: a configuration (kestrel.yaml)"), alone.stderr


async def test_run_says_a_suspended_runs_words_without_the_calls_it_wrote_as_text(
    tmp_path: Path,
) -> None:
    # A run waiting on the approval of a call the model wrote as text printed that call's
    # markup, reasoning and all, as the run's words.
    said = "<think>A restart it is.</think>\nRestarting checkout.\n<tool_call>\n"
    said += '{"name": "restart", "arguments": {"service": "checkout"}}\n</tool_call>'
    restart = {
        "name": "restart",
        "description": "Restart a service",
        "command": ["true", "{service}"],
        "parameters": {"type": "object", "properties": {"service": {"type": "string"}}},
        "confirm": True,
    }
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": [restart]}))
    write_config(tmp_path, model={"provider": "openai", "name": "m"}, tools=["tools.yaml"])
    canned = [Canned(status=200, body=chat_completion(said))]
    async with FakeOpenAI(canned=canned) as fake:
        env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k"}
        done = await asyncio.to_thread(
            kestrel, tmp_path, "run", "--defer", "restart checkout", env=env
        )

    assert "suspended" in done.stderr, done.stderr
    assert done.stdout == "Restarting checkout.\n"
    shown = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)
    as_json = json.loads(
        kestrel(tmp_path, "runs", "show", str(shown[0]["run_id"]), "--json").stdout
    )
    assert as_json["text"] == "Restarting checkout."


def test_a_resume_of_a_run_asked_to_cancel_ends_it_rather_than_saying_it_waits(
    tmp_path: Path,
) -> None:
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    run_id = deferred["run_id"]
    # Asked to cancel, as a cancel whose end the store failed at the run's suspend leaves it:
    # audited and marked, the run still suspended on its card.
    with sqlite3.connect(tmp_path / "kestrel.db") as conn:
        conn.execute(
            "INSERT INTO audit (at, actor, action, run_id, request_id, detail)"
            " VALUES ('2026-01-01T00:00:00+00:00', 'U0ONCALL', 'cancel', ?, '', 'asked')",
            (run_id,),
        )
        conn.execute(
            "INSERT INTO once_keys VALUES (?, '2026-01-01T00:00:00+00:00')", (f"cancel:{run_id}",)
        )

    resumed = kestrel(tmp_path, "runs", "resume", run_id, "--json", "--as", "U0REQ")

    assert "waits" not in resumed.stderr, resumed.stderr
    shown = json.loads(resumed.stdout)
    assert shown["status"] == "cancelled" and shown["requests"] == [], shown
    assert resumed.returncode == 4
    assert "U0ONCALL" in shown["error"], shown
    assert not (tmp_path / "demo-state" / "restarts.log").exists()  # nothing it forbade ran


@pytest.mark.parametrize(
    ("failing", "status"),
    [("INSERT ON audit", "suspended"), ("UPDATE ON requests", "cancelled")],
    ids=["its-audit", "its-card-closing"],
)
def test_a_terminal_cancel_the_store_half_failed_says_what_took(
    tmp_path: Path, failing: str, status: str
) -> None:
    """The store fails the cancel's audit (nothing ended: it may not have counted), or the
    closing of its cards once the run's end is written (cancelled: never said to go on)."""
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    run_id = deferred["run_id"]
    with sqlite3.connect(tmp_path / "kestrel.db") as conn:
        conn.execute(
            f"CREATE TRIGGER away BEFORE {failing} BEGIN SELECT json('the store is away'); END"
        )

    cancelled = kestrel(tmp_path, "runs", "cancel", run_id, "--as", "U0REQ")

    shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    assert shown["status"] == status
    assert "Traceback" not in cancelled.stderr
    if status == "cancelled":
        assert (cancelled.returncode, cancelled.stdout.strip()) == (0, "cancelled"), cancelled
        with sqlite3.connect(tmp_path / "kestrel.db") as conn:
            audited = conn.execute("SELECT actor FROM audit WHERE action = 'cancel'").fetchall()
        assert audited == [("U0REQ",)]  # audited once, as it was asked
    else:
        assert cancelled.returncode == 2
        assert "may not have counted, and the run may go on" in cancelled.stderr


def test_a_cancel_marked_whose_end_the_store_failed_says_it_still_ends_the_run(
    tmp_path: Path,
) -> None:
    """Asked of a process holding the run, which gives it up as the mark lands: the cancel
    claims it and the store fails its end. The mark holds: the run is not said to go on."""
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    run_id = deferred["run_id"]
    with sqlite3.connect(tmp_path / "kestrel.db") as conn:
        conn.execute(
            "UPDATE runs SET owner = 'replica-b', lease_expires = '2999-01-01T00:00:00+00:00'"
        )
        conn.execute(
            "CREATE TRIGGER given_up AFTER INSERT ON once_keys"
            " BEGIN UPDATE runs SET owner = '', lease_expires = NULL; END"
        )
        conn.execute(
            "CREATE TRIGGER away BEFORE INSERT ON journal WHEN NEW.kind = 'run_ended'"
            " BEGIN SELECT json('the store is away'); END"
        )

    cancelled = kestrel(tmp_path, "runs", "cancel", run_id, "--as", "U0REQ")

    assert "Traceback" not in cancelled.stderr
    assert "may go on" not in cancelled.stdout + cancelled.stderr, cancelled
    assert cancelled.returncode == 0, cancelled.stderr
    assert "whoever takes the run up ends it" in cancelled.stdout, cancelled.stdout
    with sqlite3.connect(tmp_path / "kestrel.db") as conn:
        conn.execute("DROP TRIGGER away")
        marks = conn.execute("SELECT key FROM once_keys").fetchall()
    assert marks == [(f"cancel:{run_id}",)]
    # Its claim runs out; until then a resume says the run ends cancelled wherever it is driven.
    resumed = kestrel(tmp_path, "runs", "resume", run_id, "--as", "U0REQ")
    assert "it ends cancelled wherever it is driven" in resumed.stderr, resumed.stderr


def test_a_cancel_of_an_ended_run_is_refused_as_ended_when_its_audit_fails(
    tmp_path: Path,
) -> None:
    ran = kestrel(tmp_path, "run", "how is checkout", "--json", "--as", "U0REQ")
    run_id = json.loads(ran.stdout)["run_id"]
    with sqlite3.connect(tmp_path / "kestrel.db") as conn:  # the store fails every audit
        conn.execute(
            "CREATE TRIGGER away BEFORE INSERT ON audit BEGIN SELECT json('the store is away'); END"
        )

    cancelled = kestrel(tmp_path, "runs", "cancel", run_id, "--as", "U0REQ")

    # The run ended: it is said so, not that it may go on and must be cancelled again.
    assert "may go on" not in cancelled.stderr, cancelled.stderr
    assert f"run {run_id} already ended (completed)" in one_line_error(cancelled)


async def test_run_says_each_wait_of_a_rate_limited_model_on_stderr(tmp_path: Path) -> None:
    # The run waited out each Retry-After in silence, as if the command hung.
    write_config(tmp_path, model={"provider": "openai", "name": "m"})
    limited = Canned(status=429, headers={"retry-after": "0.05"})
    async with FakeOpenAI([{"text": "done"}], canned=[limited, limited]) as fake:
        url = fake.base_url.replace("http://", "http://proxyuser:proxypass@")
        env = {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "sk-secret-key-1234"}
        done = await asyncio.to_thread(kestrel, tmp_path, "run", "--json", "hi", env=env)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["text"] == "done"  # stdout stays one JSON object
    waits = [line for line in done.stderr.splitlines() if "trying again" in line]
    assert [line.startswith("kestrel: model call: 429 Too Many Requests") for line in waits] == [
        True,
        True,
    ], done.stderr
    assert waits[1].endswith("trying again in 0.05s (retry 2 of 2)"), waits
    for secret in ("sk-secret-key-1234", "proxypass"):
        assert secret not in done.stderr + done.stdout


async def test_a_rate_limited_runs_waits_are_json_records_when_the_logs_are(
    tmp_path: Path,
) -> None:
    write_config(tmp_path, model={"provider": "openai", "name": "m"})
    limited = Canned(status=429, headers={"retry-after": "0.05"})
    async with FakeOpenAI([{"text": "done"}], canned=[limited]) as fake:
        env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k"}
        env["KESTREL_LOG_FORMAT"] = "json"
        done = await asyncio.to_thread(kestrel, tmp_path, "run", "hi", env=env)

    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()[:-1]]  # the last: its status
    (wait,) = [r for r in records if "trying again" in r["message"]]
    assert wait["level"] == "warning" and wait["message"].startswith("model call: 429"), wait
