"""``exit_at_once``: a command done skips the interpreter's teardown, yet loses nothing an
ordinary exit keeps: its status, its unflushed output, its exit functions, a running thread."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.cold import PROMPT
from bench.commits import EXIT_SUSPENDED, workspace
from tests.bot.cli.test_cli import kestrel

# Says "torn down" when the interpreter tears itself down (the audit event it raises there is
# named so on 3.11, and so from 3.12).
TEARDOWN_SAID = """
import os, sys
def said_at_teardown(event, args, write=os.write):
    if event in ("cpython.PyInterpreterState_Clear", "cpython._PySys_ClearAuditHooks"):
        write(1, b" torn down")
sys.addaudithook(said_at_teardown)
"""
# Output left in the buffers (a pipe's are not flushed per line) and an exit function.
BUFFERED = (
    TEARDOWN_SAID
    + """
import atexit
from bot.cli.common import exit_at_once
sys.stdout.write("said")
atexit.register(lambda: sys.stdout.write(" and at exit"))
exit_at_once(5)
"""
)
# A thread still running at the exit: it answers only once the parent writes to it.
THREADED = """
import sys, threading
from bot.cli.common import exit_at_once
thread = threading.Thread(target=lambda: print(sys.stdin.readline().strip(), "after the exit"))
thread.start()
print("exiting", file=sys.stderr, flush=True)
exit_at_once(0)
"""
APPROVE = TEARDOWN_SAID + "from bot.cli.main import main\nmain()\n"


def python(script: str) -> subprocess.Popen[str]:
    """``script`` in a fresh interpreter, its three streams piped."""
    pipe = subprocess.PIPE
    return subprocess.Popen(
        [sys.executable, "-c", script], stdin=pipe, stdout=pipe, stderr=pipe, text=True
    )


def test_the_status_output_and_exit_functions_are_kept_and_the_teardown_skipped() -> None:
    process = python(BUFFERED)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 5, err
    assert out == "said and at exit"


def test_a_running_thread_is_waited_for() -> None:
    process = python(THREADED)
    assert process.stderr is not None and process.stderr.readline() == "exiting\n"
    out, err = process.communicate("answered\n", timeout=60)
    assert process.returncode == 0, err
    assert out == "answered after the exit\n"


def test_runs_approve_ends_so_having_said_where_the_run_is(tmp_path: Path) -> None:
    workspace(tmp_path)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    deferred = kestrel(tmp_path, "run", PROMPT, "--as", "bob", "--defer", "--json", env=env)
    assert deferred.returncode == EXIT_SUSPENDED, deferred.stderr
    started = json.loads(deferred.stdout)
    ids = [started["run_id"], started["requests"][0]["id"]]
    approve = ("runs", "approve", *ids, "--as", "alice")
    approved = kestrel(tmp_path, *approve, env=env, script=APPROVE)
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.endswith(f"run {ids[0]} is now completed: Checkout restarted.\n")
    # The store was closed before the exit: its last connection checkpointed the WAL away.
    assert [p.name for p in tmp_path.glob("kestrel.db-*")] == []
    shown = kestrel(tmp_path, "runs", "show", ids[0], "--json", env=env)
    assert json.loads(shown.stdout)["status"] == "completed", shown.stderr
