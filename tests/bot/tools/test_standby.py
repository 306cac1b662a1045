"""A helper started ahead of its command runs that command once, confined as any other, in
its folder and environment; one nothing takes, or whose Kestrel dies, runs nothing and goes.
Real helpers in real namespaces (root in CI), real ``kestrel`` processes."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import msgspec
import pytest

from bench.commits import EXIT_SUSPENDED, workspace
from bot.tools.base import ToolContext
from bot.tools.command import CommandTool
from bot.tools.confine import CANNOT_START, FAILED
from bot.tools.isolation import Isolation, command_message, secret_files
from bot.tools.standby import Standby
from tests.bot.cli.test_cli import kestrel
from tests.bot.tools.test_isolation import gone, host_processes_with
from tests.fakes.waiting import until

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/ns/pid").exists(), reason="needs Linux namespaces"
)

# The number of read(2) on this machine, as /proc/<pid>/syscall says it.
_READ = {"x86_64": "0", "aarch64": "63"}.get(platform.machine(), "")
REPORT = 'echo "pwd=$(pwd) a=$A secret=$(cat "$1")"; echo ran >> "$2"'


def reporting(isolation: Isolation, secret: Path, count: Path, cwd: Path) -> CommandTool:
    """A command that says where it runs, what it was given and what the secret reads as, and
    counts its runs."""
    argv = ["/bin/sh", "-c", REPORT, "sh", str(secret), str(count)]
    return CommandTool("report", "r", argv, isolation=isolation, env=["A"], cwd=cwd)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_text("s3cr3t")
    return path


async def test_the_first_command_runs_once_in_the_standing_helper_confined(
    tmp_path: Path, secret: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("A", "1=2 é")
    count, folder = tmp_path / "count", tmp_path / "folder"
    folder.mkdir()
    standby = Standby(Isolation((str(secret),)))
    await standby.start()
    standing = standby.pid
    assert standing is not None and alive(standing)
    isolation = Isolation((str(secret),), standby=standby)
    groups: list[int] = []
    ctx = ToolContext(run_id="r", call_id="c", started=groups.append)

    first = await reporting(isolation, secret, count, folder).call({}, ctx)
    second = await reporting(isolation, secret, count, folder).call({}, ctx)

    said = f"pwd={folder} a=1=2 é secret=\n[exit status 0]"
    assert (first.output, first.is_error) == (said, False)
    assert (second.output, second.is_error) == (said, False)
    assert count.read_text() == "ran\nran\n"
    assert groups[0] == standing  # the first ran in the helper started ahead
    assert groups[1] != standing and standby.pid is None  # the second in its own
    await standby.close()


async def test_a_command_that_cannot_be_sent_leaves_the_helper_standing(secret: Path) -> None:
    standby = Standby(Isolation((str(secret),)))
    await standby.start()
    pid = standby.pid
    with pytest.raises(UnicodeEncodeError):  # no file name can hold a lone surrogate
        standby.take(["/bin/echo", "\ud800"], {}, "/", 100)
    assert standby.pid == pid  # still there to take, or to end
    await standby.close()
    assert pid is not None and not alive(pid)


async def test_a_helper_nothing_takes_is_ended_with_nothing_run(secret: Path) -> None:
    standby = Standby(Isolation((str(secret),)))
    await standby.start()
    pid = standby.pid
    assert pid is not None
    await standby.close()
    assert not alive(pid) and standby.pid is None
    await standby.close()  # twice is harmless


async def test_a_helper_that_died_is_not_taken_the_command_starts_its_own(
    tmp_path: Path, secret: Path
) -> None:
    count = tmp_path / "count"
    standby = Standby(Isolation((str(secret),)))
    await standby.start()
    dead = standby.pid
    assert dead is not None
    os.killpg(dead, signal.SIGKILL)
    await until(lambda: not alive(dead), timeout=5)
    groups: list[int] = []
    tool = reporting(Isolation((str(secret),), standby=standby), secret, count, tmp_path)

    result = await tool.call({}, ToolContext(run_id="r", call_id="c", started=groups.append))

    assert result.output.endswith("secret=\n[exit status 0]")
    assert count.read_text() == "ran\n"
    assert groups != [dead]


def test_a_helper_whose_kestrel_is_killed_runs_nothing_and_ends(tmp_path: Path) -> None:
    token = tmp_path / f"hidden-{uuid.uuid4().hex}"  # names the helper's processes
    token.write_text("")
    script = (
        "import asyncio, os\n"
        "from bot.tools.isolation import Isolation\n"
        "from bot.tools.standby import Standby\n"
        "async def main():\n"
        "    standby = Standby(Isolation((os.environ['HIDDEN'],)))\n"
        "    await standby.start()\n"
        "    print(standby.pid, flush=True)\n"
        "    await asyncio.Event().wait()\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, "HIDDEN": str(token)}  # not on the owner's command line
    owner = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    assert owner.stdout is not None
    helper = int(owner.stdout.readline())
    assert host_processes_with(token.name) == [helper]

    owner.kill()
    owner.wait(timeout=10)

    wait_until_gone(token.name)


def wait_until_gone(token: str) -> None:
    """Block until no process on this host names ``token`` (an orphan is reaped by init)."""
    import asyncio

    asyncio.run(until(lambda: gone(token), timeout=10))


@pytest.mark.parametrize(
    ("sent", "status", "said"),
    [
        (b"", 0, ""),
        (command_message([], {"A": "1"}, "/"), FAILED, "kestrel: the command sent was unreadable"),
        (command_message(["/bin/true"], {}, "/nowhere"), CANNOT_START, "cannot start '/bin/true'"),
    ],
    ids=["nothing sent", "no argv", "no such folder"],
)
def test_the_helper_runs_what_it_reads_or_nothing(sent: bytes, status: int, said: str) -> None:
    done = subprocess.run(Isolation().wrap([]), input=sent, capture_output=True, timeout=30)
    assert done.returncode == status
    assert done.stdout == b"" and said in done.stderr.decode()


def test_the_command_read_keeps_empty_arguments_and_any_character() -> None:
    argv = ["/bin/sh", "-c", 'printf "%s|" "$@"; echo "$B"', "sh", "", "b=c", "é\n"]
    message = command_message(argv, {"PATH": "/usr/bin:/bin", "B": "x=y"}, "/")
    done = subprocess.run(Isolation().wrap([]), input=message, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "|b=c|é\n|x=y\n"


# --- kestrel runs approve -------------------------------------------------------------------


def approvable(folder: Path, *, counted: Path, hidden: Path) -> list[str]:
    """A workspace whose one gated command counts its runs, and the run and request that
    ``kestrel run`` left waiting on it; ``hidden`` is covered for commands (and so names the
    helper's processes)."""
    config = workspace(folder)
    (folder / "tools.yaml").write_text(counting_catalog(counted))
    hide = f"tool_isolation:\n  hide: [{json.dumps(str(hidden))}]\n"
    config.write_text(config.read_text() + hide)
    deferred = kestrel(folder, "run", "restart checkout", "--defer", "--json", "--as", "bob")
    assert deferred.returncode == EXIT_SUSPENDED, deferred.stderr
    run = json.loads(deferred.stdout)
    return [run["run_id"], run["requests"][0]["id"]]


def counting_catalog(counted: Path) -> str:
    """bench.commits' catalog, its command counting its runs (JSON is YAML)."""
    command = ["/bin/sh", "-c", f"echo ran >> {counted}", "sh", "{service}"]
    return msgspec.json.encode(
        {
            "tools": [
                {
                    "name": "restart_service",
                    "description": "Restart a service",
                    "command": command,
                    "parameters": {
                        "type": "object",
                        "properties": {"service": {"type": "string"}},
                        "required": ["service"],
                    },
                    "confirm": True,
                }
            ]
        }
    ).decode()


def test_runs_approve_runs_the_command_once_and_leaves_no_helper(tmp_path: Path) -> None:
    counted, hidden = tmp_path / "count", tmp_path / f"hidden-{uuid.uuid4().hex}"
    hidden.write_text("")
    ids = approvable(tmp_path, counted=counted, hidden=hidden)

    approved = kestrel(tmp_path, "runs", "approve", *ids, "--as", "alice")

    assert approved.returncode == 0, approved.stderr
    assert "is now completed" in approved.stdout
    assert counted.read_text() == "ran\n"
    assert gone(hidden.name)


def test_an_approval_refused_runs_nothing_and_leaves_no_helper(tmp_path: Path) -> None:
    counted, hidden = tmp_path / "count", tmp_path / f"hidden-{uuid.uuid4().hex}"
    hidden.write_text("")
    ids = approvable(tmp_path, counted=counted, hidden=hidden)

    refused = kestrel(tmp_path, "runs", "approve", *ids, "--as", "mallory")

    assert refused.returncode != 0 and "mallory" in refused.stderr
    assert not counted.exists()
    assert gone(hidden.name)


# --- what changes while the helper stands by ------------------------------------------------


WAITS_ON_READ = pytest.mark.skipif(not _READ, reason="read(2)'s number known on x86_64, aarch64")


@WAITS_ON_READ
async def test_a_file_replaced_while_the_helper_stands_by_is_covered_as_it_is_then(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("old")
    isolation = Isolation((str(secret),))
    standby = await standing_by(isolation)
    renamed = tmp_path / "secret.new"  # an editor's save, a rotated password: a new file
    renamed.write_text("new")
    renamed.rename(secret)
    offered = msgspec.structs.replace(isolation, standby=standby)
    tool = CommandTool("cat", "c", ["/bin/cat", str(secret)], isolation=offered)

    result = await tool.call({}, ToolContext(run_id="r", call_id="c"))

    assert result.output == "[exit status 0]"
    assert standby.pid is None  # it was the standing helper that ran it


@WAITS_ON_READ
async def test_a_link_retargeted_while_the_helper_stands_by_is_covered_where_it_leads(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "v1", tmp_path / "v2"
    first.write_text("token one")
    second.write_text("token two")
    link = tmp_path / "token"  # a Kubernetes Secret's file, which leads to a new one
    link.symlink_to(first)
    isolation = Isolation(secret_files(None, None, [link]))
    standby = await standing_by(isolation)
    link.unlink()
    link.symlink_to(second)
    offered = msgspec.structs.replace(isolation, standby=standby)
    tool = CommandTool("cat", "c", ["/bin/cat", str(link)], isolation=offered)

    result = await tool.call({}, ToolContext(run_id="r", call_id="c"))

    assert result.output == "[exit status 0]"
    assert standby.pid is None


async def standing_by(isolation: Isolation) -> Standby:
    """A helper started for ``isolation``, once it has got as far as reading its stdin."""
    standby = Standby(isolation)
    await standby.start()
    pid = standby.pid
    assert pid is not None
    await until(lambda: reads_stdin(pid), timeout=10)
    return standby


def reads_stdin(pid: int) -> bool:
    """Whether ``pid`` is blocked in read(0, ...) (/proc's numbering of system calls)."""
    try:
        syscall = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return syscall[:2] == [_READ, "0x0"]


@pytest.mark.parametrize("kept", [0.5, 0.9, 0.99])
def test_a_command_cut_short_on_its_way_runs_nothing(tmp_path: Path, kept: float) -> None:
    # Kestrel killed while the loop still writes a long command: the helper reads part of it,
    # then the end of stdin. What it read is no command anyone approved.
    counted = tmp_path / "count"
    argv = ["/bin/sh", "-c", f'echo "$#" >> {counted}', "sh", *(["x" * 1000] * 100)]
    message = command_message(argv, {"PATH": "/usr/bin:/bin"}, "/")
    cut_short = message[: int(len(message) * kept)]

    done = subprocess.run(Isolation().wrap([]), input=cut_short, capture_output=True, timeout=30)

    assert not counted.exists()
    assert done.returncode == FAILED
    assert b"the command sent was unreadable" in done.stderr


async def test_the_command_in_a_standing_helper_has_stdin_as_one_started_for_it_has(
    tmp_path: Path,
) -> None:
    argv = ["/bin/sh", "-c", "cat; echo to-stdin >&0 && echo stdin-writable"]
    said = []
    for standby in (None, await standing_by(Isolation())):
        tool = CommandTool("io", "i", argv, isolation=Isolation(standby=standby), cwd=tmp_path)
        said.append((await tool.call({}, ToolContext(run_id="r", call_id="c"))).output)
    assert said == ["stdin-writable\n[exit status 0]"] * 2  # /dev/null, read and write


async def test_the_command_gets_the_environment_kestrel_chose_standing_helper_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # LANG=C passed through: the helper's interpreter coerces the C locale into its own
    # environment (PEP 538), which a command it becomes must not inherit.
    monkeypatch.setenv("LANG", "C")
    monkeypatch.delenv("LC_ALL", raising=False)
    monkeypatch.delenv("LC_CTYPE", raising=False)
    said = []
    for standby in (None, await standing_by(Isolation())):
        isolation = Isolation(standby=standby)
        tool = CommandTool("env", "e", ["/usr/bin/env"], isolation=isolation, env=["LANG"])
        said.append((await tool.call({}, ToolContext(run_id="r", call_id="c"))).output)
    names = [sorted(line.split("=", 1)[0] for line in text.splitlines()[:-1]) for text in said]
    assert names == [["HOME", "LANG", "PATH"]] * 2


async def test_a_command_whose_folder_is_covered_starts_in_the_cover_standing_helper_or_not(
    tmp_path: Path,
) -> None:
    covered = tmp_path / "covered"
    covered.mkdir()
    (covered / "key").write_text("s3cr3t")
    argv = ["/bin/sh", "-c", "cat key; ls -A"]
    said = []
    for standby in (None, await standing_by(Isolation((str(covered),)))):
        isolation = Isolation((str(covered),), standby=standby)
        tool = CommandTool("ls", "l", argv, isolation=isolation, cwd=covered)
        said.append((await tool.call({}, ToolContext(run_id="r", call_id="c"))).output)
    assert said == ["cat: key: No such file or directory\n[exit status 0]"] * 2
