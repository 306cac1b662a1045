"""``runs approve`` and ``runs deny`` read without click: what the script reads itself, click
reads the same way, and the command then does and says the same; anything else is click's."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import click
import pytest

from bot.cli.commands import cli
from bot.cli.decisions import Decision, read
from tests.bot.cli.test_cli import CLI, kestrel, write_config
from tests.fakes.processes import FakeOpenAIProcess, clean_env

# The command line as click reads it, without the script's own reading.
CLICK_ONLY = "from bot.cli.commands import cli; cli(obj={}, prog_name='kestrel')"


def click_reading(argv: list[str]) -> dict[str, Any]:
    """The top-level and the command's parameters as click parses ``argv`` (nothing runs)."""
    top = click.Context(cli, obj={})
    rest = click.Command.parse_args(cli, top, list(argv))  # the group's options; what it leaves
    _, runs, rest = cli.resolve_command(top, rest)
    assert isinstance(runs, click.Group)
    group = click.Context(runs, parent=top)
    rest = click.Command.parse_args(runs, group, rest)
    name, command, rest = runs.resolve_command(group, rest)
    assert name is not None and command is not None
    with command.make_context(name, rest, parent=group) as leaf:
        return {"command": name, **top.params, **leaf.params}


def as_click_would(decision: Decision) -> dict[str, Any]:
    """The script's reading, in click's parameter names and defaults."""
    reading: dict[str, Any] = {
        "command": decision.command,
        "config": decision.value("--config"),
        "verbose": decision.flag("-v") or decision.flag("--verbose"),
        "log_level": decision.value("--log-level"),
        "run_id": decision.run_id,
        "request_id": decision.request_id,
        "user": decision.value("--as"),
    }
    if decision.command == "approve":
        return reading | {
            "always": decision.flag("--always"),
            "step_by_step": decision.flag("--step-by-step"),
        }
    return reading | {"reason": decision.value("--reason") or ""}


@pytest.mark.parametrize(
    "argv",
    [
        "runs approve run_1 req_1",
        "runs approve run_1 req_1 --as alice",
        "runs approve --as alice run_1 req_1",
        "runs approve run_1 --as=alice req_1 --always",
        "runs approve run_1 req_1 --step-by-step",
        "--config k.yaml -v runs approve run_1 req_1",
        "--config=k.yaml --log-level INFO runs approve run_1 req_1 --as bob",
        "--verbose --log-level=debug runs approve run_1 req_1",
        "runs deny run_1 req_1",
        "runs deny run_1 req_1 --reason 'not now' --as alice",
        "runs deny --reason=later run_1 req_1",
    ],
)
def test_what_the_script_reads_click_reads_the_same(argv: str) -> None:
    words = _words(argv)
    decision = read(words)
    assert decision is not None, "a common form must not need click"
    reading = click_reading(words)
    if reading["log_level"] is not None:
        reading["log_level"] = decision.value("--log-level")  # click lowers it, logs.chosen too
    assert as_click_would(decision) == reading


@pytest.mark.parametrize(
    "argv",
    [
        "--help",
        "runs approve --help",
        "runs approve -h run_1 req_1",
        "runs approve run_1",  # click: missing argument
        "runs approve run_1 req_1 extra",  # click: unexpected extra argument
        "runs approve run_1 req_1 --as",  # click: --as needs a value
        "runs approve run_1 req_1 --as alice --as bob",  # click takes the last one
        "runs approve run_1 req_1 --as -bob",  # click: a value that starts with a dash
        "runs approve run_1 req_1 --as=",
        "runs approve run_1 req_1 --always --step-by-step",  # they exclude each other
        "runs approve run_1 req_1 --reason no",  # deny's option
        "runs approve run_1 req_1 --always=yes",
        "runs approve -- run_1 req_1",
        "runs deny run_1 req_1 --always",
        "runs answer run_1 req_1 yes",
        "runs list",
        "--log-level loud runs approve run_1 req_1",
        "--config runs approve run_1 req_1",
        "-vv runs approve run_1 req_1",
        "runs --config k.yaml approve run_1 req_1",
        "runs approve run_1 req_1 --config k.yaml",
        "run approve run_1 req_1",
        "",
    ],
)
def test_anything_else_is_left_to_click(argv: str) -> None:
    assert read(_words(argv)) is None


def _words(argv: str) -> list[str]:
    return [w.strip("'") for w in re.findall(r"'[^']*'|\S+", argv)]


def _deferred(folder: Path) -> list[str]:
    run = json.loads(
        kestrel(folder, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    return [run["run_id"], run["requests"][0]["id"]]


@pytest.mark.parametrize(
    "words",
    [
        ["approve", "--as", "U0BOSS"],
        ["approve", "--as", "U0REQ"],  # not an approver: one line, exit 2
        ["deny", "--reason", "not during the freeze", "--as", "U0BOSS"],
        ["approve", "--always", "--as", "U0BOSS"],
    ],
)
def test_the_command_does_and_says_what_click_s_does(tmp_path: Path, words: list[str]) -> None:
    write_config(tmp_path, policy={"approvers": {"*": ["U0BOSS"]}})
    results = []
    for script in (CLI, CLICK_ONLY):
        run_id, request_id = _deferred(tmp_path)
        argv = ["runs", words[0], run_id, request_id, *words[1:]]
        assert read(argv) is not None  # the script's own reading, under CLI
        done = kestrel(tmp_path, *argv, script=script)
        said = re.sub(r"\b(run|req)_[0-9a-f]{16}\b", r"\1_ID", done.stdout + done.stderr)
        shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
        results.append((done.returncode, said, shown["status"]))
    assert results[0] == results[1]
    assert "Traceback" not in results[0][1]


def test_a_bad_configuration_is_one_line_either_way(tmp_path: Path) -> None:
    (tmp_path / "kestrel.yaml").write_text("policy: [\n")
    argv = ["runs", "approve", "run_1", "req_1", "--as", "U0BOSS"]
    fast, slow = kestrel(tmp_path, *argv), kestrel(tmp_path, *argv, script=CLICK_ONLY)
    assert (fast.returncode, fast.stderr) == (slow.returncode, slow.stderr)
    assert fast.returncode == 2
    assert len(fast.stderr.strip().splitlines()) == 1


def test_a_closed_stdout_or_an_ascii_one_still_decides_without_a_traceback(
    tmp_path: Path,
) -> None:
    write_config(tmp_path, policy={"approvers": {"*": ["U0BOSS"]}})
    run_id, request_id = _deferred(tmp_path)
    deny = ["runs", "deny", run_id, request_id, "--as", "U0BOSS"]
    closed = subprocess.run(
        ["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-c", CLI, *deny],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (closed.returncode, closed.stderr) == (0, "")
    run_id, request_id = _deferred(tmp_path)
    argv = ["runs", "deny", run_id, request_id, "--as", "U0BOSS", "--reason", "pas maintenant, Zoë"]
    ascii_out = kestrel(tmp_path, *argv, env={"PYTHONIOENCODING": "ascii"})
    assert ascii_out.returncode == 0, ascii_out.stderr
    assert "Zoë" in ascii_out.stdout  # said in UTF-8, as click says it to such a stream


def test_a_shell_asking_for_completions_gets_click(tmp_path: Path) -> None:
    write_config(tmp_path, policy={"approvers": {"*": ["U0BOSS"]}})
    run_id, request_id = _deferred(tmp_path)
    argv = ["runs", "approve", run_id, request_id, "--as", "U0BOSS"]
    asked = kestrel(tmp_path, *argv, env={"_KESTREL_COMPLETE": "bash_source"})
    assert "complete" in asked.stdout  # click's completion script, nothing decided
    shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    assert shown["status"] == "suspended"


def _read_until(stream: IO[bytes], marker: bytes) -> bytes:
    """What ``stream`` says up to and with ``marker`` (a prompt ends with no newline)."""
    said = b""
    deadline = time.monotonic() + 30
    while marker not in said:
        assert time.monotonic() < deadline, said
        ready, _, _ = select.select([stream], [], [], 1)
        if ready:
            chunk = os.read(stream.fileno(), 4096)
            assert chunk, said  # the chat ended first
            said += chunk
    return said


def test_a_request_a_chat_asks_inline_is_not_said_to_be_missing(tmp_path: Path) -> None:
    # The chat's card shows the request's id; from another shell, `runs approve` with it said
    # only "there is no request", as if the id were mistyped.
    chat = subprocess.Popen(
        [sys.executable, "-c", CLI, "chat"],
        cwd=tmp_path,
        env=clean_env(KESTREL_DEMO_STATE=str(tmp_path / "demo-state")),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert chat.stdin is not None and chat.stdout is not None
    chat.stdin.write(b"checkout is failing, can you look?\n")
    chat.stdin.flush()
    card = _read_until(chat.stdout, b"[l]ater? ")
    found = re.search(rb"request (req_\w+)", card)
    assert found, card
    run_id = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)[0]["run_id"]

    refused = kestrel(tmp_path, "runs", "approve", run_id, found[1].decode(), "--as", "alice")
    chat.stdin.close()  # the end of input: the chat leaves the request open, and ends
    chat.wait(timeout=30)

    assert refused.returncode == 2
    assert f"run {run_id} is running" in refused.stderr
    assert "kestrel chat" in refused.stderr and "(l)" in refused.stderr


def test_an_approval_whose_run_then_fails_says_why(tmp_path: Path) -> None:
    # The model server went away while the approval waited: `runs approve` said only "run …
    # is now failed", and why took a `runs show`.
    restart = {"name": "restart_service", "arguments": {"service": "checkout"}}
    server = FakeOpenAIProcess(tmp_path, [{"text": "restarting", "calls": [restart]}])
    write_config(tmp_path, model={"provider": "openai", "name": "fake", "max_retries": 0})
    env = {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test"}
    try:
        deferred = kestrel(tmp_path, "run", "--defer", "--json", "restart checkout", env=env)
    finally:
        server.stop()
    assert deferred.returncode == 3, deferred.stderr
    run = json.loads(deferred.stdout)
    (request,) = run["requests"]

    approved = kestrel(
        tmp_path, "runs", "approve", run["run_id"], request["id"], "--as", "bob", env=env
    )

    assert approved.returncode == 0, approved.stderr
    said = approved.stdout.strip()
    assert said.startswith(f"recorded; run {run['run_id']} is now failed: "), said
    assert f"model call failed: cannot connect to {server.base_url}" in said
