"""A reader of ``kestrel``'s output that leaves (``kestrel runs list | head``) ends the output
alone: no traceback, and the command's own exit status."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from bot.cli.tools_cmd import DEMO_NOTE
from tests.bot.cli.test_cli import CLI, kestrel
from tests.fakes.processes import clean_env


def writing_to(
    stdout: int | IO[str],
    cwd: Path,
    *args: str,
    typed: str | None = None,
    before: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI with its stdout on ``stdout``, its stderr captured, ``typed`` on its
    stdin (none by default), ``before`` run in the child before it starts."""
    return subprocess.run(
        [sys.executable, "-c", CLI, *args],
        cwd=cwd,
        input=typed,
        stdin=subprocess.DEVNULL if typed is None else None,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(KESTREL_DEMO_STATE=str(cwd / "demo-state")),
        timeout=60,
        check=False,
        preexec_fn=before,
    )


def into_closed_pipe(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI with its stdout a pipe nobody reads any more (as ``| head`` leaves
    it once it has its lines), its stderr captured."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return writing_to(write_end, cwd, *args)
    finally:
        os.close(write_end)


def deferred_run(folder: Path) -> dict[str, str]:
    """A run of the demo waiting on the approval of a restart, asked for by U0REQ."""
    started = kestrel(folder, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ")
    obj = json.loads(started.stdout)
    return {"run": obj["run_id"], "request": obj["requests"][0]["id"]}


@pytest.mark.parametrize(
    "command",
    [
        ("runs", "list"),
        ("runs", "list", "--json"),
        ("runs", "pending"),
        ("runs", "show", "{run}"),
        ("audit",),
        ("tools", "list"),
        ("--help",),
        ("runs", "--help"),
        ("--version",),
        ("chat",),  # its console's banner: nobody reads it, the chat ends at once
    ],
)
def test_a_reader_that_left_ends_the_output_quietly_with_exit_0(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    # Each exited 1 (click's status for a broken pipe), failing a script's pipeline.
    ids = deferred_run(tmp_path)
    result = into_closed_pipe(tmp_path, *(part.format(**ids) for part in command))
    # The demo's tools are listed with a note on stderr, which no reader left.
    said = f"kestrel: {DEMO_NOTE}\n" if command == ("tools", "list") else ""
    assert (result.returncode, result.stderr) == (0, said)


def test_an_approval_into_a_closed_pipe_counts_and_exits_0(tmp_path: Path) -> None:
    # What the command did stands; only what it says of it goes nowhere.
    ids = deferred_run(tmp_path)
    result = into_closed_pipe(tmp_path, "runs", "approve", ids["run"], ids["request"], "--as", "U0")
    assert (result.returncode, result.stderr) == (0, "")
    assert (tmp_path / "demo-state" / "restarts.log").read_text() == "restart checkout\n"


def test_a_run_into_a_closed_pipe_keeps_its_own_exit_status(tmp_path: Path) -> None:
    # 3 says the run suspended: a closed stdout does not turn it into a success or a failure.
    result = into_closed_pipe(tmp_path, "run", "checkout is failing", "--defer")
    assert result.returncode == 3, result.stderr
    assert "suspended" in result.stderr and "Traceback" not in result.stderr  # its status line
    listed = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)
    assert [run["status"] for run in listed] == ["suspended"]


def into_a_full_disk(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI with its stdout on a device that is always full (ENOSPC)."""
    with open("/dev/full", "w") as full:
        return writing_to(full, cwd, *args)


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="needs /dev/full")
@pytest.mark.parametrize(
    "command",
    [
        ("runs", "list"),
        ("run", "checkout is failing"),
        # What click writes itself, and the chat's console, ended in a traceback too.
        ("--help",),
        ("--version",),
        ("runs", "approve", "--help"),
        ("chat",),
    ],
)
def test_output_on_a_full_disk_is_one_line(tmp_path: Path, command: tuple[str, ...]) -> None:
    # `kestrel runs list > report.txt` on a full disk ended in a traceback of thirty lines.
    kestrel(tmp_path, "run", "checkout is failing")
    written = into_a_full_disk(tmp_path, *command)
    assert written.stderr.splitlines()[-1:] == [
        "kestrel: cannot write to stdout: No space left on device"
    ], written.stderr
    assert "Traceback" not in written.stderr
    assert written.returncode == 1  # as before: not 2, which says nothing was done


def chat_writing_at_most(cwd: Path, limit: int, room: int) -> subprocess.CompletedProcess[str]:
    """``kestrel chat`` asked to look at checkout, and to approve what it asks (``a``), its
    stdout a file that takes ``room`` bytes more before it reaches the largest file a process
    may write (``limit``): past it, a write fails as on a full disk (EFBIG)."""
    cwd.mkdir()
    out = cwd / "out"
    out.write_bytes(b"." * (limit - room))

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    typed = "checkout is failing, can you look?\na\n"
    with out.open("a") as stdout:
        return writing_to(stdout, cwd, "chat", "--as", "U0REQ", typed=typed, before=limited)


def test_a_chat_whose_output_fills_the_disk_leaves_its_run_waiting(tmp_path: Path) -> None:
    # The approval card, unwritable, panicked the run (failed, its restart never to be
    # approved) and printed its traceback; the chat then went on, unseen.
    limit = 16 * 1024 * 1024  # more than the journal grows to
    seen = chat_writing_at_most(tmp_path / "a", limit, limit)  # room for everything
    said = (tmp_path / "a" / "out").read_bytes()
    room = said.index(b"approval needed")  # in a folder of the same length: the same
    result = chat_writing_at_most(tmp_path / "b", limit, room)
    assert seen.returncode == 0, seen.stderr
    assert result.stderr == "kestrel: cannot write to stdout: File too large\n"
    assert result.returncode == 1
    # Nobody saw the card: the `a` typed ahead approved nothing; the run waits, as at Ctrl-D.
    listed = json.loads(kestrel(tmp_path / "b", "runs", "list", "--json").stdout)
    assert [run["status"] for run in listed] == ["suspended"]
    assert not (tmp_path / "b" / "demo-state" / "restarts.log").exists()


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="needs /dev/full")
def test_an_error_with_stderr_on_a_full_disk_keeps_its_exit_status(tmp_path: Path) -> None:
    # Its one line could not be written, and that failure's traceback (as unwritable) turned
    # the status of an unknown run (2: nothing was done) into 1.
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-c", CLI, "runs", "show", "run_nope"],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=full,
            env=clean_env(),
            timeout=60,
            check=False,
        )
    assert result.returncode == 2
