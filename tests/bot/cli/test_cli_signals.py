"""SIGTERM and SIGINT stop `kestrel run`, `chat` and `serve` at once: the model call or the
command under way is cut short, the run suspends and gives its lease up, the process exits.
Real processes, real signals, a real SQLite file."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import signal
import sqlite3
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot import wire
from bot.domain import RunStatus, Session, new_id
from bot.journal.entries import ToolProcess
from bot.tools import orphans
from storage.sqlite import SqliteStore
from tests.fakes.processes import KESTREL, FakeOpenAIProcess, clean_env

SLOW = {
    "name": "slow",
    "description": "A slow effect",
    "command": ["/bin/sh", "./slow.sh"],
    "idempotent": False,
    "timeout": 60,
    "env": ["EFFECTS_FILE"],
}
SLOW_SCRIPT = [{"text": "working", "calls": [{"name": "slow", "arguments": {}}]}, {"text": "done"}]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "slow.sh").write_text(
        'echo start >> "$EFFECTS_FILE"\nsleep 30\necho end >> "$EFFECTS_FILE"\n'
    )
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": [SLOW]}))
    return tmp_path


@pytest.fixture
def hanging_model(folder: Path) -> Iterator[FakeOpenAIProcess]:
    server = FakeOpenAIProcess(folder, [{"text": "never"}], forked=True, hang=True)
    yield server
    server.stop()


def configure(folder: Path, model: dict[str, Any]) -> dict[str, str]:
    config = {"model": model, "tools": ["tools.yaml"], "replica": {"poll_seconds": 0.1}}
    (folder / "kestrel.yaml").write_text(yaml.safe_dump(config))
    return clean_env(EFFECTS_FILE=str(folder / "effects.txt"), OPENAI_API_KEY="test")


def scripted(folder: Path) -> dict[str, str]:
    (folder / "script.yaml").write_text(yaml.safe_dump(SLOW_SCRIPT))
    return configure(folder, {"provider": "scripted", "script": "script.yaml"})


def fake_openai(folder: Path, server: FakeOpenAIProcess) -> dict[str, str]:
    env = configure(folder, {"provider": "openai", "name": "fake", "max_retries": 0})
    return {**env, "OPENAI_BASE_URL": server.base_url}


def start(folder: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*KESTREL, *args],
        cwd=folder,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.05)


def effects(folder: Path) -> list[str]:
    path = folder / "effects.txt"
    return path.read_text().split() if path.exists() else []


def process_recorded(folder: Path) -> bool:
    """Whether the journal says where the command's process group runs (a stop that lands
    before then kills the group while it starts, with nothing to record)."""
    with contextlib.closing(sqlite3.connect(folder / "kestrel.db")) as db:
        return (
            db.execute("SELECT 1 FROM journal WHERE kind = 'tool_process'").fetchone() is not None
        )


def the_run(folder: Path) -> tuple[Any, list[Any]]:
    """The one run in the journal, and its entries."""

    async def read() -> tuple[Any, list[Any]]:
        store = SqliteStore(folder / "kestrel.db")
        await store.migrate()
        try:
            (record,) = await store.list_runs()
            return record, [r.entry for r in await store.load(record.id)]
        finally:
            await store.close()

    return asyncio.run(read())


def assert_suspended_and_released(folder: Path, reason: str = "interrupted") -> list[Any]:
    """The one run suspended for ``reason`` (a command stopped by a person: interrupted; a
    replica: handed back), its lease given up; its entries."""
    record, entries = the_run(folder)
    assert record.status is RunStatus.SUSPENDED
    assert record.stop_reason == reason
    assert record.owner == "" and record.lease_expires is None
    return entries


# SIGHUP: the terminal closed, or the ssh session that ran the command dropped.
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_run_stops_the_command_and_suspends(folder: Path, signum: signal.Signals) -> None:
    run = start(folder, scripted(folder), "run", "do the slow thing")
    wait_until(lambda: effects(folder) == ["start"], "the command's start")
    wait_until(lambda: process_recorded(folder), "the command's process record")

    run.send_signal(signum)
    _, err = run.communicate(timeout=10)

    assert run.returncode == 128 + signum, err
    assert "Traceback" not in err
    entries = assert_suspended_and_released(folder)
    processes = [e.process for e in entries if isinstance(e, ToolProcess)]
    assert len(processes) == 1, [e.kind for e in entries]
    (process,) = processes
    # The whole group went with it: killed before the command exited; what the kernel still
    # tears down (a process's memory, a PID namespace) is waited for, not raced.
    wait_until(lambda: orphans.members(process) == [], "the whole group's end")
    time.sleep(0.3)
    assert effects(folder) == ["start"]


def test_a_command_started_with_nohup_is_not_stopped_by_a_hang_up(folder: Path) -> None:
    # nohup ignores SIGHUP so that the command outlives its terminal: the stop's own handler
    # must not undo that.
    run = subprocess.Popen(
        ["nohup", *KESTREL, "run", "do the slow thing"],
        cwd=folder,
        env=scripted(folder),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: effects(folder) == ["start"], "the command's start")
    wait_until(lambda: process_recorded(folder), "the command's process record")

    hang_ups_ignored = ignores_hang_ups(run.pid)  # its stop's handlers are set by now
    run.send_signal(signal.SIGHUP)
    run.send_signal(signal.SIGTERM)  # what stops it, the hang-up having done nothing
    _, err = run.communicate(timeout=10)

    assert hang_ups_ignored
    assert run.returncode == 128 + signal.SIGTERM, err


def ignores_hang_ups(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGHUP, as /proc says (SigIgn: a mask of signals)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGHUP - 1) & 1)
    raise AssertionError(f"no SigIgn in /proc/{pid}/status")


def test_a_resumed_interrupted_command_asks_on_call_instead_of_running_again(
    folder: Path,
) -> None:
    env = scripted(folder)
    run = start(folder, env, "run", "do the slow thing")
    wait_until(lambda: effects(folder) == ["start"], "the command's start")
    run.send_signal(signal.SIGTERM)
    run.communicate(timeout=10)
    record, _ = the_run(folder)

    resumed = subprocess.run(
        [*KESTREL, "runs", "resume", record.id, "--json"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )

    out = json.loads(resumed.stdout)
    assert [r["kind"] for r in out["requests"]] == ["wait_effect"], resumed.stderr
    assert effects(folder) == ["start"]


def test_run_cuts_a_hanging_model_call_short(
    folder: Path, hanging_model: FakeOpenAIProcess
) -> None:
    run = start(folder, fake_openai(folder, hanging_model), "run", "hello")
    wait_until(hanging_model.log.exists, "the model call")

    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=10)

    assert run.returncode == 130, err
    assert_suspended_and_released(folder)
    # A person's pause waits for that person: the command that takes it up is named.
    record, _ = the_run(folder)
    assert f"kestrel runs resume {record.id}" in err
    shown = subprocess.run(
        [*KESTREL, "runs", "show", record.id], cwd=folder, capture_output=True, text=True
    )
    assert f"stopped: kestrel runs resume {record.id}" in shown.stdout, shown.stderr


def test_serve_suspends_a_run_waiting_on_a_hanging_model(
    folder: Path, hanging_model: FakeOpenAIProcess
) -> None:
    env = fake_openai(folder, hanging_model)
    serve = start(folder, env, "serve", "--port", "0")
    run_id = new_id("run")

    async def submit() -> None:
        store = SqliteStore(folder / "kestrel.db")
        await store.migrate()
        session = Session(id=new_id("ses"), platform="test")
        payload = {"run_id": run_id, "prompt": "hello", "session": wire.to_plain(session)}
        await store.enqueue_work("start", {**payload, "requested_by": "U0REQ"})
        await store.close()

    asyncio.run(submit())
    wait_until(hanging_model.log.exists, "the model call")
    assert len(asyncio.run(replicas(folder))) == 1  # it took the work: it is registered

    serve.send_signal(signal.SIGTERM)
    _, err = serve.communicate(timeout=10)

    assert serve.returncode == 0, err
    assert_suspended_and_released(folder, "handed_back")
    # With serve stopped, nothing in `runs show` said how the run would go on.
    shown = subprocess.run(
        [*KESTREL, "runs", "show", run_id], cwd=folder, env=env, capture_output=True, text=True
    )
    said = "handed back at a stop: a running kestrel serve takes it up, or kestrel runs resume"
    assert f"{said} {run_id}" in shown.stdout, shown.stderr
    # Stopped cleanly: gone from `kestrel replicas` at once, not once its heartbeat is old.
    listed = subprocess.run(
        [*KESTREL, "replicas"], cwd=folder, env=env, capture_output=True, text=True, check=False
    )
    assert listed.stdout.strip() == "no live replicas", listed.stderr


def test_serve_says_it_is_stopping_while_a_command_finishes(folder: Path) -> None:
    # Through the grace a stopping replica drives its runs no further than their suspend:
    # `kestrel replicas` and a refused resume say so rather than name it as their driver.
    (folder / "slow.sh").write_text('echo start >> "$EFFECTS_FILE"\nsleep 3\n')
    env = scripted(folder)
    config = yaml.safe_load((folder / "kestrel.yaml").read_text())
    config["replica"]["shutdown_grace_seconds"] = 30
    (folder / "kestrel.yaml").write_text(yaml.safe_dump(config))
    serve = start(folder, env, "serve", "--port", "0")

    async def submit() -> None:
        store = SqliteStore(folder / "kestrel.db")
        await store.migrate()
        session = Session(id=new_id("ses"), platform="test")
        payload = {"run_id": new_id("run"), "prompt": "slow", "session": wire.to_plain(session)}
        await store.enqueue_work("start", {**payload, "requested_by": "U0REQ"})
        await store.close()

    asyncio.run(submit())
    wait_until(lambda: effects(folder) == ["start"], "the command's start")
    assert [r.stopping for r in asyncio.run(replicas(folder))] == [False]

    serve.send_signal(signal.SIGTERM)

    wait_until(lambda: [r.stopping for r in asyncio.run(replicas(folder))] == [True], "the mark")
    _, err = serve.communicate(timeout=20)
    assert serve.returncode == 0, err
    # The operator reads that the drain began, what it holds and for how long, before its end.
    lines = [line.split(" kestrel.serve: ", 1)[-1] for line in err.splitlines()]
    began = "stopping on SIGTERM: not ready from now on; handing back 1 live run(s), a command"
    assert lines.index(f"{began} under way given up to 30 s") < lines.index(
        "stopped: live runs suspended and their leases released"
    ), err


async def replicas(folder: Path) -> list[Any]:
    store = SqliteStore(folder / "kestrel.db")
    await store.migrate()
    try:
        return list(await store.list_replicas())
    finally:
        await store.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_chat_stops_on_sigterm_and_on_a_hang_up(folder: Path, signum: signal.Signals) -> None:
    chat = start(folder, scripted(folder), "chat")
    assert chat.stdin is not None
    chat.stdin.write("do the slow thing\n")
    chat.stdin.flush()
    wait_until(lambda: effects(folder) == ["start"], "the command's start")

    chat.send_signal(signum)
    out, err = chat.communicate(timeout=10)

    assert chat.returncode == 128 + signum, err
    assert "suspended" in out
    assert err.strip().endswith("stopped: the run under way was suspended"), err
    assert_suspended_and_released(folder)


def test_chat_whose_terminal_closes_suspends_its_run_and_exits_as_hung_up(folder: Path) -> None:
    # The terminal window closed, or the ssh session dropped: SIGHUP, and from then on every
    # read and write of the terminal fails (EIO), the lines saying the run suspended included.
    terminal, its_end = pty.openpty()
    chat = subprocess.Popen(
        [*KESTREL, "chat"],
        cwd=folder,
        env=scripted(folder),
        stdin=its_end,
        stdout=its_end,
        stderr=its_end,
        start_new_session=True,  # then the terminal becomes the session's, as a shell's is
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    os.close(its_end)
    os.write(terminal, b"do the slow thing\n")
    wait_until(lambda: effects(folder) == ["start"], "the command's start")

    os.close(terminal)

    assert chat.wait(timeout=10) == 128 + signal.SIGHUP
    assert_suspended_and_released(folder)


def test_approve_stops_the_run_it_carries_on_and_suspends(folder: Path) -> None:
    catalog = {"tools": [{**SLOW, "confirm": True}]}
    (folder / "tools.yaml").write_text(yaml.safe_dump(catalog))
    env = scripted(folder)
    deferred = subprocess.run(
        [*KESTREL, "run", "do the slow thing", "--defer", "--json"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    run = json.loads(deferred.stdout)
    (request,) = run["requests"]
    approve = start(folder, env, "runs", "approve", run["run_id"], request["id"], "--as", "U0BOSS")
    wait_until(lambda: effects(folder) == ["start"], "the approved command's start")
    wait_until(lambda: process_recorded(folder), "the command's process record")

    approve.send_signal(signal.SIGTERM)
    out, err = approve.communicate(timeout=10)

    assert approve.returncode == 143, err
    entries = assert_suspended_and_released(folder)
    assert f"kestrel runs resume {run['run_id']}" in out
    (process,) = [e.process for e in entries if isinstance(e, ToolProcess)]
    wait_until(lambda: orphans.members(process) == [], "the whole group's end")


def test_a_second_sigterm_cuts_serves_stop_short(folder: Path) -> None:
    # A second SIGTERM (or Ctrl-C) while serve stops was taken as the first again: the stop
    # went on for the whole grace, a command under way with it, and nothing said so.
    env = scripted(folder)
    config = yaml.safe_load((folder / "kestrel.yaml").read_text())
    config["replica"]["shutdown_grace_seconds"] = 30
    (folder / "kestrel.yaml").write_text(yaml.safe_dump(config))
    serve = start(folder, env, "serve", "--port", "0")
    asyncio.run(submit_slow(folder))
    wait_until(lambda: effects(folder) == ["start"], "the command's start")
    serve.send_signal(signal.SIGTERM)
    wait_until(lambda: [r.stopping for r in asyncio.run(replicas(folder))] == [True], "the mark")

    serve.send_signal(signal.SIGTERM)
    _, err = serve.communicate(timeout=10)

    assert serve.returncode == 143, err
    assert "Traceback" not in err
    record, _ = the_run(folder)
    said = "SIGTERM again while stopping: stopping at once, cutting short the grace of the"
    assert f"{said} command(s) under way: slow (run {record.id})" in err, err
    # The stop still got through (the command killed, the run handed back): said, as without
    # the second signal, so that nobody waits on leases that were released.
    assert record.status is RunStatus.SUSPENDED and record.owner == ""
    assert "stopped: live runs suspended and their leases released" in err, err
    assert effects(folder) == ["start"]  # killed, not finished


async def submit_slow(folder: Path) -> None:
    store = SqliteStore(folder / "kestrel.db")
    await store.migrate()
    session = Session(id=new_id("ses"), platform="test")
    payload = {"run_id": new_id("run"), "prompt": "slow", "session": wire.to_plain(session)}
    await store.enqueue_work("start", {**payload, "requested_by": "U0REQ"})
    await store.close()


def test_a_sigterm_after_serve_said_stopped_ends_it_at_once(folder: Path) -> None:
    # After "stopped:" the process still closes its MCP servers (one that ignores its stdin's
    # end and SIGTERM takes 4 s to be killed): a SIGTERM then was taken as the first again,
    # and the process went on closing, or, once the event loop had closed, died by it.
    server = Path(__file__).resolve().parents[2] / "fakes" / "mcp_server.py"
    stubborn = f"trap '' TERM; {sys.executable} {server}; sleep 30"
    env = scripted(folder)
    config = yaml.safe_load((folder / "kestrel.yaml").read_text())
    srv = {"name": "srv", "transport": "stdio", "command": ["sh", "-c", stubborn]}
    config["mcp_servers"] = [srv]
    (folder / "kestrel.yaml").write_text(yaml.safe_dump(config))
    serve = start(folder, env, "serve", "--port", "0")
    assert serve.stderr is not None
    wait_until(lambda: replicas_now(folder) == 1, "the replica's start")
    serve.send_signal(signal.SIGTERM)
    said = []
    for line in serve.stderr:
        said.append(line)
        if "stopped: live runs suspended" in line:
            break

    signalled = time.monotonic()
    serve.send_signal(signal.SIGTERM)
    _, err = serve.communicate(timeout=10)

    assert time.monotonic() - signalled < 2.5, err
    assert serve.returncode == 143, "".join(said) + err
    assert "Traceback" not in err
    assert "SIGTERM again" in err and "after the stop" in err, err


def replicas_now(folder: Path) -> int:
    if not (folder / "kestrel.db").exists():
        return 0
    with contextlib.closing(sqlite3.connect(folder / "kestrel.db")) as db:
        try:
            return int(db.execute("SELECT count(*) FROM replicas").fetchone()[0])
        except sqlite3.OperationalError:  # not migrated yet
            return 0


def test_signals_in_quick_succession_name_the_command_serve_cuts_short(folder: Path) -> None:
    # Two signals read in one pass of the event loop (an impatient operator, a supervisor that
    # sends SIGTERM then SIGINT): the second cut the stop short before serve had said what it
    # waited on, and the line named the start-up ("the schema's migration") of a replica that
    # had served for a while, not the command it killed.
    env = scripted(folder)
    config = yaml.safe_load((folder / "kestrel.yaml").read_text())
    config["replica"]["shutdown_grace_seconds"] = 30
    (folder / "kestrel.yaml").write_text(yaml.safe_dump(config))
    serve = start(folder, env, "serve", "--port", "0")
    asyncio.run(submit_slow(folder))
    wait_until(lambda: effects(folder) == ["start"], "the command's start")
    wait_until(lambda: process_recorded(folder), "the command's process record")

    serve.send_signal(signal.SIGTERM)
    serve.send_signal(signal.SIGINT)
    _, err = serve.communicate(timeout=10)

    assert serve.returncode in (130, 143), err
    record, entries = the_run(folder)
    assert "the schema's migration" not in err, err
    assert f"cutting short the grace of the command(s) under way: slow (run {record.id})" in err
    (process,) = [e.process for e in entries if isinstance(e, ToolProcess)]
    wait_until(lambda: orphans.members(process) == [], "the whole group's end")


def loaded(pid: int, library: str) -> bool:
    """Whether process ``pid`` has mapped a shared object whose path names ``library``."""
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_a_sigterm_while_serve_imports_is_kept_for_its_stop(folder: Path) -> None:
    # serve held a SIGTERM for its stop only after its own imports (aiohttp, the supervisor,
    # the scheduler: most of a second): one that came then killed it outright, and PID 1 (a
    # container's kestrel) dropped it, started anyway and was killed at the end of the grace.
    serve = start(folder, scripted(folder), "serve", "--port", "0")
    wait_until(lambda: loaded(serve.pid, "multidict"), "aiohttp's import")

    serve.send_signal(signal.SIGTERM)
    _, err = serve.communicate(timeout=20)

    assert serve.returncode == 0, err
    assert "stopping on SIGTERM" in err, err


def test_an_idle_chat_stopped_by_sigterm_says_no_run_was_suspended(folder: Path) -> None:
    # With nothing under way, the chat said "stopped: the run under way was suspended": its
    # person looked for a run that never was.
    chat = start(folder, scripted(folder), "chat")
    assert chat.stdout is not None
    shown = b""
    while b"you> " not in shown:  # the prompt: the chat reads, its signal handlers are set
        chunk = os.read(chat.stdout.fileno(), 4096)
        assert chunk, "the chat ended before its prompt"
        shown += chunk

    chat.send_signal(signal.SIGTERM)
    chat.wait(timeout=10)  # stdin left open: its end would race the signal
    assert chat.stderr is not None
    err = chat.stderr.read()

    assert chat.returncode == 143, err
    assert "stopped on SIGTERM: no run was under way" in err, err
    assert "suspended" not in err, err
