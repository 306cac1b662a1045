"""The first hour with ``kestrel``: what a newcomer meets first says the right thing, plainly."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bot.cli.test_cli import CLI, kestrel, one_line_error, write_config
from tests.bot.cli.test_cli_plans import deferred_plan, plan_world


def test_the_demos_banner_says_nothing_of_oncall(tmp_path: Path) -> None:
    # The offline demo's simulated services have no on-call anyone could name.
    banner = kestrel(tmp_path, "chat")
    assert banner.returncode == 0, banner.stderr
    assert "oncall" not in banner.stdout + banner.stderr
    # A configuration of one's own tools is told, once.
    write_config(tmp_path, tools=[])
    configured = kestrel(tmp_path, "chat")
    assert configured.stdout.count("note: policy.oncall is empty") == 1


def test_the_chats_banner_names_a_tool_whose_program_is_not_there(tmp_path: Path) -> None:
    # A catalog written by hand, its program misspelt: the load only warns (it may be
    # installed later), and the chat's log shows errors alone, so it went unsaid until a call.
    (tmp_path / "ops.yaml").write_text(
        "tools:\n"
        "  - name: disk_usage\n"
        "    description: Disk usage\n"
        '    command: ["dff", "-h"]\n'
        "    idempotent: true\n"
    )
    write_config(tmp_path, tools=["ops.yaml"], policy={"oncall": ["U0ONCALL"]})
    banner = kestrel(tmp_path, "chat")
    assert banner.returncode == 0, banner.stderr
    said = (
        f"note: {tmp_path / 'ops.yaml'}:2: tool 'disk_usage': program 'dff' is not on the PATH"
        " commands run with (/usr/local/bin:/usr/bin:/bin); its calls fail until it can start"
    )
    assert banner.stdout.count(said) == 1, banner.stdout
    # Said once: with -v the log has said it already.
    logged = kestrel(tmp_path, "-v", "chat")
    assert "note: " not in logged.stdout, logged.stdout
    assert logged.stderr.count("program 'dff' is not on the PATH") == 1, logged.stderr
    # The demo's catalog, whose programs are all there, adds no note.
    write_config(tmp_path)
    assert "note:" not in kestrel(tmp_path, "chat").stdout


def test_serve_without_its_token_says_so_first_and_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "DISCORD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    write_config(tmp_path, tools=[])  # nobody on call: a warning, were the runtime built
    # Each says where the token is found, as the walkthrough does.
    for platform, variable, where in (
        ("slack", "SLACK_BOT_TOKEN", "OAuth & Permissions → Bot User OAuth Token; docs/slack.md"),
        ("discord", "DISCORD_TOKEN", "Bot → Reset Token; manifests/discord-app.md"),
    ):
        refused = one_line_error(kestrel(tmp_path, "serve", platform, "--port", "0"))
        assert refused.startswith(f"kestrel: {variable} is not set"), refused
        assert refused.endswith(f"{where})"), refused
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test")
    monkeypatch.delenv("SLACK_SIGNING_SECRET", raising=False)
    refused = one_line_error(kestrel(tmp_path, "serve", "slack", "--port", "0"))
    assert "(Basic Information → App Credentials → Signing Secret)" in refused, refused


def test_run_dash_reads_the_prompt_from_stdin(tmp_path: Path) -> None:
    done = kestrel(tmp_path, "run", "-", "--json", "--defer", stdin="checkout is failing\n")
    assert done.returncode == 3, done.stderr  # the demo's restart waits for an approver
    run_id = json.loads(done.stdout)["run_id"]
    shown = kestrel(tmp_path, "runs", "show", run_id).stdout
    assert "user: checkout is failing" in shown
    for empty in ("", " \n\n"):
        said = one_line_error(kestrel(tmp_path, "run", "-", stdin=empty))
        assert said == "kestrel: the prompt is empty (read from stdin, as - asks)"


def test_run_dash_refuses_stdin_that_is_not_utf8(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "KESTREL_"))}
    done = subprocess.run(
        [sys.executable, "-c", CLI, "run", "-"],
        cwd=tmp_path,
        input=b"bad \xff bytes",
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and done.stderr.decode().splitlines() == [
        "kestrel: the prompt is not valid UTF-8 text (byte 0xff at offset 4)"
    ]
    assert kestrel(tmp_path, "runs", "list").stdout == "no runs\n"


def test_tools_check_of_a_file_that_is_not_there_says_so(tmp_path: Path) -> None:
    (tmp_path / "folder.yaml").mkdir()
    (tmp_path / "latin1.yaml").write_bytes(b"tools: []  # caf\xe9\n")
    result = kestrel(tmp_path, "tools", "check", "nope.yaml", "folder.yaml", "latin1.yaml")
    assert result.returncode == 1
    assert "Errno" not in result.stderr and "codec" not in result.stderr
    assert result.stderr.splitlines() == [
        "nope.yaml: cannot read catalog: no such file",
        "folder.yaml: cannot read catalog: a folder, not a file",
        "latin1.yaml: cannot read catalog: not UTF-8 text (byte 0xe9 at offset 16)",
    ]


def test_the_export_says_who_may_answer_as_runs_pending_does(tmp_path: Path) -> None:
    done = kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ")
    run_id = json.loads(done.stdout)["run_id"]
    said = "anyone but the requester (U0REQ)"
    assert f"may answer: {said}" in kestrel(tmp_path, "runs", "pending").stdout
    exported = kestrel(tmp_path, "runs", "export", run_id, "--html", "run.html")
    assert exported.returncode == 0, exported.stderr
    assert f'<dd class="may-answer">{said}</dd>' in (tmp_path / "run.html").read_text()


def test_a_catalog_folder_in_the_configuration_says_how_to_name_its_files(
    tmp_path: Path,
) -> None:
    (tmp_path / "catalogs").mkdir()
    write_config(tmp_path, tools=["catalogs"])
    checked = kestrel(tmp_path, "tools", "check")
    assert checked.returncode == 1
    assert checked.stderr.splitlines() == [
        "catalogs: a folder, not a catalog file: name its files (catalogs/*.yaml)"
    ]


def test_a_deferred_run_says_the_command_that_moves_it_on(tmp_path: Path) -> None:
    done = kestrel(tmp_path, "run", "checkout is failing", "--defer", "--as", "U0REQ")
    assert done.returncode == 3, done.stderr
    (request,) = json.loads(kestrel(tmp_path, "runs", "pending", "--json").stdout)
    run_id, request_id = request["run_id"], request["id"]
    command = f"kestrel runs approve {run_id} {request_id} --as NAME"
    # Said to the requester, whose own approval is refused there: someone else approves.
    assert f"    {command} (or deny)" in done.stderr.splitlines(), done.stderr
    # What it says works, NAME someone other than the requester.
    approved = kestrel(tmp_path, *command.split()[1:-1], "U0BOSS")
    assert approved.returncode == 0, approved.stderr


def test_a_deferred_run_of_a_requester_who_may_approve_it_says_so(tmp_path: Path) -> None:
    # self_approval: true lets the requester approve their own run with runs approve: the
    # command said to them took --as NAME, someone else, whom they need not be. They gave
    # --as at a terminal whose login is another's: the command names them.
    write_config(tmp_path, policy={"self_approval": True})
    done = kestrel(tmp_path, "run", "checkout is failing", "--defer", "--as", "U0REQ", env=ERIN)
    assert done.returncode == 3, done.stderr
    (request,) = json.loads(kestrel(tmp_path, "runs", "pending", "--json").stdout)
    command = f"kestrel runs approve {request['run_id']} {request['id']} --as U0REQ"
    assert f"    {command} (or deny)" in done.stderr.splitlines(), done.stderr
    approved = kestrel(tmp_path, *command.split()[1:], env=ERIN)
    assert approved.returncode == 0, approved.stderr


# A terminal whose login name is someone other than the person acting (--as).
ERIN = {"USER": "erin"}


def pasted(result: subprocess.CompletedProcess[str], start: str) -> list[list[str]]:
    """The commands starting with ``start`` that ``result`` printed, as a shell would split
    them, their "(or deny)" left out."""
    lines = (result.stdout + result.stderr).replace("; ", "\n").splitlines()
    found = [line[line.index(start) :] for line in lines if start in line]
    return [shlex.split(line.removesuffix(" (or deny)")) for line in found]


def test_the_next_cards_commands_name_the_approver_who_gave_as(tmp_path: Path) -> None:
    # Approving a plan step by step as U0BOSS at erin's terminal printed each card's command
    # bare: pasted as printed, it acted as erin, and an approver other than erin was refused.
    log = plan_world(tmp_path, ["payments-api", "payments-db"])
    run_id, plan = deferred_plan(tmp_path)  # requested by U0REQ
    split = kestrel(
        tmp_path, "runs", "approve", run_id, plan["id"], "--step-by-step", "--as", "U0BOSS"
    )
    assert split.returncode == 0, split.stderr
    commands = pasted(split, "kestrel runs approve")
    assert len(commands) == 2 and all(c[-2:] == ["--as", "U0BOSS"] for c in commands), commands

    write_config(
        tmp_path,
        model={"provider": "scripted", "script": "script.yaml"},
        tools=["tools.yaml"],
        policy={"approvers": {"*": ["U0BOSS"]}},  # erin may not approve: only U0BOSS may
    )
    for command in commands:
        approved = kestrel(tmp_path, *command[1:], env=ERIN)
        assert approved.returncode == 0, approved.stderr
    assert log.read_text().split() == ["payments-api", "payments-db"]


def test_the_chats_commands_for_another_shell_name_who_chats(tmp_path: Path) -> None:
    # kestrel chat --as U0REQ at erin's terminal: the question left for later, the command
    # for another shell answered as erin, whom the policy lets answer nothing of U0REQ's run.
    chat = "checkout is failing, can you look?\na\nl\n"
    chatted = kestrel(tmp_path, "chat", "--as", "U0REQ", stdin=chat, env=ERIN)
    assert chatted.returncode == 0, chatted.stderr
    (command,) = pasted(chatted, "kestrel runs answer")
    assert command[-2:] == ["--as", "U0REQ"], command

    answered = kestrel(tmp_path, *[w.replace("yes|no", "yes") for w in command[1:]], env=ERIN)
    assert answered.returncode == 0, answered.stderr
    (run,) = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)
    assert run["status"] == "completed" and run["requested_by"] == "U0REQ"


def test_serve_on_a_port_in_use_says_so_once_and_what_to_do(tmp_path: Path) -> None:
    import socket

    write_config(tmp_path, policy={"oncall": ["U0SRE"]})  # no notice: the refusal alone

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = one_line_error(kestrel(tmp_path, "serve", "--port", str(port)))
    assert refused == (
        f"kestrel: cannot listen on 127.0.0.1:{port}: address already in use"
        " (another kestrel serve? --port chooses another)"
    )
    unknown = one_line_error(kestrel(tmp_path, "serve", "--port", "0", "--host", "nosuch.invalid"))
    assert unknown.startswith("kestrel: cannot listen on nosuch.invalid:0: ")
    assert "error -" not in unknown and "errno" not in unknown.lower()


@pytest.mark.parametrize("args", [("chat",), ("run", "-")])
def test_a_closed_stdin_is_the_end_of_input(tmp_path: Path, args: tuple[str, ...]) -> None:
    # `kestrel chat <&-`: the reader thread died on a traceback and the chat waited forever.
    closed = "import os, sys; os.close(0); sys.stdin = None; " + CLI
    done = kestrel(tmp_path, *args, script=closed)
    assert "Traceback" not in done.stderr, done.stderr
    if args == ("chat",):
        assert done.returncode == 0 and done.stdout.startswith("Kestrel chat: "), done.stderr
    else:
        said = one_line_error(done)
        assert said == "kestrel: the prompt is empty (read from stdin, as - asks)"


def test_a_chat_with_no_stdout_is_refused_in_one_line(tmp_path: Path) -> None:
    closed = "import os, sys; os.close(1); sys.stdout = None; " + CLI
    refused = one_line_error(kestrel(tmp_path, "chat", stdin="hello\n", script=closed))
    assert refused == "kestrel: stdout is closed: the chat has nowhere to show itself"
    assert kestrel(tmp_path, "runs", "list").stdout == "no runs\n"  # nothing was started


def test_tools_check_and_list_say_when_the_demo_catalog_stands_in(tmp_path: Path) -> None:
    # Run where no kestrel.yaml is (a --config forgotten), they checked and listed the demo's
    # simulated tools with nothing to say those were not the person's own.
    said = "the offline demo's simulated services: no tools: configured here"
    checked = kestrel(tmp_path, "tools", "check")
    assert checked.returncode == 0 and checked.stdout.rstrip().endswith(f"({said})")
    listed = kestrel(tmp_path, "tools", "list")
    assert listed.returncode == 0 and listed.stderr == f"kestrel: {said}\n"
    write_config(tmp_path, tools=[])
    assert kestrel(tmp_path, "tools", "list").stderr == ""


def test_a_configuration_that_is_not_utf8_names_the_byte_and_where(tmp_path: Path) -> None:
    # It said "(byte 0)": the offset, read as the byte's value.
    (tmp_path / "kestrel.yaml").write_bytes(b"model: {}\n# caf\xe9\n")
    refused = one_line_error(kestrel(tmp_path, "runs", "list"))
    assert refused == "kestrel: kestrel.yaml: not UTF-8 text (byte 0xe9 at offset 15)"
    (tmp_path / "kestrel.yaml").unlink()
    (tmp_path / ".env").write_bytes(b"\xffX=1\n")
    refused = one_line_error(kestrel(tmp_path, "runs", "list"))
    assert refused == "kestrel: .env: not UTF-8 text (byte 0xff at offset 0)"


async def test_serve_of_the_demo_catalog_still_says_nobody_is_on_call(tmp_path: Path) -> None:
    # A team serving the demo's catalog (the README's Slack steps, no kestrel.yaml yet) has
    # people to put on call, and its restart can end uncertain: only the chat's banner, one
    # person at a terminal, leaves the notice out.
    import asyncio
    import signal

    from tests.fakes.processes import clean_env
    from tests.fakes.serving import free_port, start_serve, wait_healthy

    port = free_port()
    env = clean_env(KESTREL_DEMO_STATE=str(tmp_path / "demo-state"))
    env = {k: v for k, v in env.items() if not k.startswith(("SLACK_", "DISCORD_"))}
    process = start_serve(tmp_path, port, env)
    try:
        await wait_healthy(port, process)
    finally:
        process.send_signal(signal.SIGTERM)
        _out, err = await asyncio.to_thread(process.communicate, timeout=30)
    assert process.returncode == 0, err
    assert err.count("WARNING kestrel.policy: policy.oncall is empty") == 1, err


def test_run_dash_refuses_a_prompt_that_holds_a_nul(tmp_path: Path) -> None:
    # Piped from a file with NUL bytes, it started a run PostgreSQL then refused to journal
    # ("create_run failed: invalid byte sequence for encoding UTF8: 0x00"), and SQLite kept.
    said = one_line_error(kestrel(tmp_path, "run", "-", stdin="look at this\x00log\n"))
    assert said == "kestrel: the prompt is not text: it holds a NUL byte (at offset 12)"
    assert kestrel(tmp_path, "runs", "list").stdout == "no runs\n"


PG_DSN = os.environ.get("KESTREL_TEST_POSTGRES_DSN", "")


@pytest.mark.skipif(not PG_DSN, reason="set KESTREL_TEST_POSTGRES_DSN to check PostgreSQL")
def test_a_chat_line_that_holds_a_nul_is_a_message_on_postgres(tmp_path: Path) -> None:
    # It said "(run … suspended) resume it with /resume RUN" of a run PostgreSQL had refused
    # to create: no journal keeps a NUL in text. It reads as a byte that is not UTF-8 does.
    import asyncio
    import uuid

    import asyncpg

    schema = f"nul_{uuid.uuid4().hex[:12]}"
    write_config(tmp_path, database=f"{PG_DSN}?schema={schema}")
    try:
        done = kestrel(tmp_path, "chat", stdin="checkout is\x00 failing, can you look?\nl\n")
        assert done.returncode == 0, done.stderr
        assert "you> checkout is\ufffd failing, can you look?" in done.stdout
        assert "approval needed: restart_service" in done.stdout, done.stdout
    finally:

        async def drop() -> None:
            conn = await asyncpg.connect(PG_DSN)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()

        asyncio.run(drop())


def test_run_dash_leaves_out_the_last_line_end_as_a_shell_does(tmp_path: Path) -> None:
    # `git log -1 | kestrel run -` kept the input's last newline: `runs show` showed a blank
    # line under the prompt, and --json's prompt ended in "\n", where "$(git log -1)" did not.
    done = kestrel(tmp_path, "run", "-", stdin="  indented\nchecked\n\n")
    assert done.returncode == 0, done.stderr
    (run,) = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)
    assert run["prompt"] == "  indented\nchecked"


def test_run_dash_says_a_broken_configuration_before_it_reads_the_prompt(
    tmp_path: Path,
) -> None:
    # At a terminal the prompt was typed out and ended with Ctrl-D, and only then was the
    # configuration refused: the prompt was lost. Stdin left open stands for that terminal.
    (tmp_path / "kestrel.yaml").write_text("modle: {}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "KESTREL_"))}
    process = subprocess.Popen(
        [sys.executable, "-c", CLI, "run", "-"],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()  # still reading stdin: the configuration was not checked first
    _out, err = process.communicate()
    assert process.returncode == 2, err
    assert err == "kestrel: kestrel.yaml: modle: unknown key (did you mean model?)\n"


@pytest.mark.parametrize(
    ("section", "said"),
    [
        (
            {"policy": {"approvers": {"restart_servce": ["*"]}}},
            "policy.approvers: 'restart_servce' names no tool or tag here",
        ),
        (
            {"deadlines": {"per_tool": {"restart": 60}}},
            "deadlines.per_tool: 'restart' names no tool here",
        ),
    ],
    ids=["approvers", "deadline"],
)
def test_tools_check_reports_a_tool_name_serve_would_refuse(
    tmp_path: Path, section: dict[str, object], said: str
) -> None:
    # A team lead validates before a deploy: it said "OK", and serve then refused to start.
    write_config(tmp_path, **section)
    checked = kestrel(tmp_path, "tools", "check")
    assert checked.returncode == 1, checked.stdout
    assert checked.stderr.splitlines() == [f"{said} (did you mean 'restart_service'?)"]
    assert "OK" not in checked.stdout


def test_the_help_says_the_log_level_each_command_starts_at(tmp_path: Path) -> None:
    # It said "else warning", and a newcomer's `kestrel run` showed no warning at all: only
    # serve starts at warning, a one-shot command's answer stays its one line.
    shown = kestrel(tmp_path, "--help")
    assert shown.returncode == 0, shown.stderr
    said = " ".join(shown.stdout.split())
    assert "[KESTREL_LOG_LEVEL, else warning for serve, error for the rest]" in said, said


@pytest.mark.parametrize(
    ("typed", "said"),
    [
        (("help",), "No such command 'help': it is an option here, kestrel --help"),
        (("version",), "No such command 'version': it is an option here, kestrel --version"),
        (("runs", "help"), "No such command 'help': it is an option here, kestrel runs --help"),
    ],
)
def test_help_typed_as_a_command_points_to_the_option(
    tmp_path: Path, typed: tuple[str, ...], said: str
) -> None:
    # `kestrel help`, as git and go spell it, was answered "Did you mean 'health'?".
    result = kestrel(tmp_path, *typed)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == f"Error: {said}"


def test_an_empty_path_or_run_a_script_passed_is_said(tmp_path: Path) -> None:
    # A script's "$OUT", "$CATALOG" or "$RUN" with the variable unset: --html "" was read as
    # "." ("cannot write .: Is a directory"), tools check "" checked the current folder ("a
    # folder, not a file"), and audit --run "" said "no audit entries" of a journal of them.
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json").stdout
    )
    run_id, request_id = deferred["run_id"], deferred["requests"][0]["id"]

    exported = kestrel(tmp_path, "runs", "export", run_id, "--html", "")
    assert one_line_error(exported) == (
        "kestrel: --html: the path is empty: name the file to write, or - for stdout"
    )
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".html") == []
    checked = kestrel(tmp_path, "tools", "check", "")
    said = "a FILE is empty: name catalog files, or none for the configured ones"
    assert one_line_error(checked) == f"kestrel: tools check: {said}"
    assert one_line_error(kestrel(tmp_path, "audit", "--run", "")) == "kestrel: unknown run ''"
    # The run's own entries are there, named.
    audited = kestrel(tmp_path, "audit", "--run", run_id).stdout
    assert f"request        {request_id}" in audited
