"""Catalog commands cannot read Kestrel's secrets: not from their environment, not from
Kestrel's ``/proc`` entries, not from the configuration, ``.env`` or a hidden file, not even as
root after trying to unmount what covers them. Real ``kestrel run`` processes, as root in CI."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.domain import ProcessStamp
from bot.tools import orphans
from bot.tools.base import ToolContext
from bot.tools.catalog import CatalogError, load_catalog
from bot.tools.command import CommandTool
from bot.tools.isolation import Isolation, secret_files
from tests.fakes.processes import KESTREL, FakeOpenAIProcess
from tests.fakes.snoop import SCRIPT, SECRETS, found, prepare
from tests.fakes.waiting import until

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/ns/pid").exists(), reason="needs Linux namespaces"
)


def kestrel(folder: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KESTREL, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_command_run_by_kestrel_finds_none_of_its_secrets(tmp_path: Path) -> None:
    server = FakeOpenAIProcess(tmp_path, SCRIPT, forked=True)
    try:
        model = {"provider": "openai", "name": "fake", "max_retries": 0}
        env = {**prepare(tmp_path, model), "OPENAI_BASE_URL": server.base_url}
        run = kestrel(tmp_path, env, "run", "find the secrets", "--json")
    finally:
        server.stop()
    assert run.returncode == 0, run.stderr
    run_id = json.loads(run.stdout)["run_id"]
    shown = kestrel(tmp_path, env, "runs", "show", run_id, "--json")
    assert shown.returncode == 0, shown.stderr

    model_requests = server.log.read_text()
    output = json.loads(model_requests.splitlines()[-1])["messages"][-1]["content"]
    assert "SNOOP-DONE" in output and "[exit status 0]" in output, output
    assert "ppid=1 processes=" in output  # a /proc of its own namespace: a few processes
    journal = (tmp_path / "kestrel.db").read_bytes().decode(errors="replace")
    assert "SNOOP-DONE" in journal  # the journal holds the whole output
    assert found(output) == []
    assert found(journal) == []
    assert found(shown.stdout) == []
    assert found(model_requests) == []
    assert found(run.stdout + run.stderr) == []


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
@pytest.mark.skipif(os.geteuid() != 0, reason="drops a capability only root has")
def test_without_namespaces_kestrel_refuses_to_start_unless_told_so_loudly(
    tmp_path: Path,
) -> None:
    scripted = {"provider": "scripted", "script": "script.yaml"}
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(SCRIPT))
    env = prepare(tmp_path, scripted)
    # Root without CAP_SYS_ADMIN: a container that may not make namespaces.
    crippled = ["setpriv", "--bounding-set", "-sys_admin", "--", *KESTREL]

    def run(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*crippled, "run", "find the secrets", "--json"],
            cwd=tmp_path,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )

    # A probe that passed with every capability is remembered; it does not stand for this one.
    runtime_dir = tmp_path / "runtime"
    env["XDG_RUNTIME_DIR"] = str(runtime_dir)
    whole = subprocess.run(
        [*KESTREL, "run", "find the secrets", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert whole.returncode == 0, whole.stderr
    assert len(list((runtime_dir / "kestrel").glob("isolation-*"))) == 1
    refused = run({})
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "kestrel: tool_isolation: catalog commands cannot be isolated here (cannot create "
        "namespaces: Operation not permitted); run as root or where user namespaces are "
        "allowed, or set tool_isolation.mode: none"
    ]

    unisolated = run({"KESTREL_TOOL_ISOLATION__MODE": "none"})
    assert unisolated.returncode == 0, unisolated.stderr
    assert "tool_isolation.mode is none: catalog commands run without isolation" in (
        unisolated.stderr
    )
    # The same command, unisolated, finds every one of them: the other test can fail.
    journal = (tmp_path / "kestrel.db").read_bytes().decode(errors="replace")
    assert found(journal) == SECRETS


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
@pytest.mark.skipif(os.geteuid() != 0, reason="drops a capability only root has")
def test_the_offline_demo_runs_where_namespaces_cannot_be_made(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KESTREL_", "OPENAI_"))}
    crippled = ["setpriv", "--bounding-set", "-sys_admin", "--", *KESTREL]
    done = subprocess.run(
        [*crippled, "run", "checkout is failing, can you look?", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 3), done.stderr  # the demo's restart waits for approval
    assert "tool_isolation: unavailable here" in done.stderr
    assert "the demo runs without it" in done.stderr
    assert json.loads(done.stdout)["outcomes"]["ok"] >= 1  # its read-only tools ran


# --- what a command still gets: the group kill, the cap, its exit status, its stamp ----------

ISOLATED = Isolation()
CTX = ToolContext(run_id="run_1", call_id="call_1")


def sh(script: str, **kwargs: Any) -> CommandTool:
    return CommandTool("sh", "sh", ["/bin/sh", "-c", script], isolation=ISOLATED, **kwargs)


def host_processes_with(token: str) -> list[int]:
    """Live processes anywhere on this host whose command line holds ``token``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if token.encode() in cmdline and state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def gone(token: str) -> bool:
    return not host_processes_with(token)


def running(token: str, count: int) -> Callable[[], bool]:
    return lambda: len(host_processes_with(token)) >= count


async def test_a_timeout_kills_everything_the_command_started_even_out_of_its_group() -> None:
    token = f"6{uuid.uuid4().int % 10**8}"  # a sleep of that many seconds names our processes
    stamps: list[ProcessStamp | None] = []
    ctx = ToolContext(
        run_id="r", call_id="c", started=lambda pgid: stamps.append(orphans.stamp(pgid))
    )
    call = asyncio.ensure_future(sh(f"sleep {token} & setsid sleep {token} & wait").call({}, ctx))
    await until(running(token, 2))
    call.cancel()  # how the caller's timeout arrives
    with pytest.raises(asyncio.CancelledError):
        await call
    (stamp,) = stamps
    assert stamp is not None and stamp.host_key == orphans.host_key()
    await until(lambda: gone(token))


async def test_an_orphaned_isolated_group_is_found_and_stopped_by_its_stamp() -> None:
    token = f"7{uuid.uuid4().int % 10**8}"
    stamps: list[ProcessStamp | None] = []
    ctx = ToolContext(
        run_id="r", call_id="c", started=lambda pgid: stamps.append(orphans.stamp(pgid))
    )
    call = asyncio.ensure_future(sh(f"sleep {token}").call({}, ctx))
    await until(running(token, 1))
    (stamp,) = stamps
    assert stamp is not None and len(orphans.members(stamp)) >= 3  # helper, init, command
    said = await orphans.end_orphan(stamp)
    assert said.endswith("was still running and was stopped")
    await until(lambda: gone(token))
    assert (await call).output == "[killed by signal SIGKILL]"


@pytest.mark.parametrize(
    ("script", "output"),
    [
        ("echo out; echo err >&2; exit 3", "out\nerr\n[exit status 3]"),
        ("kill -TERM $$", "[killed by signal SIGTERM]"),
        ("echo $HOME | grep -c kestrel-home; env | wc -l", "1\n4\n[exit status 0]"),
        ("echo \"cannot start 'x': gone\"; exit 127", "cannot start 'x': gone\n[exit status 127]"),
        (
            "echo 'kestrel: no; the command was not run'; echo more; exit 126",
            "kestrel: no; the command was not run\nmore\n[exit status 126]",
        ),
        (
            "echo \"cannot start '/bin/sh': x\"; printf more; exit 127",
            "cannot start '/bin/sh': x\nmore\n[exit status 127]",
        ),
    ],
    ids=["exit code and stderr", "own signal", "environment", "own 127", "own 126", "more"],
)
async def test_output_and_exit_status_pass_through_unchanged(script: str, output: str) -> None:
    result = await sh(script).call({}, CTX)
    assert (result.output, result.is_error) == (output, False)


async def test_the_output_cap_holds() -> None:
    script = "import sys; sys.stdout.buffer.write(b'x' * 1048576)"
    tool = CommandTool(
        "flood", "f", [sys.executable, "-c", script], max_output=1000, isolation=ISOLATED
    )
    result = await tool.call({}, CTX)
    marker = "\n[output truncated: 1048576 bytes total, first 1000 shown]\n"
    assert result.output == "x" * 1000 + marker + "[exit status 0]"


async def test_a_program_that_cannot_start_is_an_error_as_before(tmp_path: Path) -> None:
    missing = await CommandTool("m", "m", ["/nonexistent/prog"], isolation=ISOLATED).call({}, CTX)
    assert missing.is_error
    assert missing.output == (
        "cannot start '/nonexistent/prog': No such file or directory (/nonexistent/prog)"
    )
    unknown = await CommandTool("u", "u", ["no-such-program-x"], isolation=ISOLATED).call({}, CTX)
    assert unknown.is_error and unknown.output.startswith("cannot start 'no-such-program-x'")


async def test_a_program_the_helper_cannot_start_is_an_error(tmp_path: Path) -> None:
    script = tmp_path / "orphaned.sh"
    script.write_text("#!/nonexistent/interpreter\necho ran\n")
    script.chmod(0o755)
    result = await CommandTool("o", "o", [str(script)], isolation=ISOLATED).call({}, CTX)
    assert result.is_error
    assert result.output == f"cannot start {str(script)!r}: No such file or directory"


def test_the_helper_s_words_for_running_nothing_are_the_ones_it_says() -> None:
    from bot.tools import confine, isolation

    said = (isolation.CANNOT_START, isolation.NOT_CONFINED, isolation.NOT_RUN)
    assert said == (confine.CANNOT_START, confine.FAILED, confine.NOT_RUN)


def test_a_catalog_cannot_hand_a_command_kestrels_secrets(tmp_path: Path) -> None:
    path = tmp_path / "ops.yaml"
    tool = {"name": "t", "description": "t", "command": ["env"]}
    env = ["OPENAI_API_KEY", "KESTREL_DATABASE_URL", "KESTREL_DEMO_STATE", "SLACK_BOT_TOKEN"]
    path.write_text(yaml.safe_dump({"tools": [{**tool, "env": env}]}, sort_keys=False))
    with pytest.raises(CatalogError) as refused:
        load_catalog(path)
    assert refused.value.problems == [
        f"{path}:{line}: tools[0].env[{index}]: tool 't': {name} holds a secret or a setting of "
        "Kestrel's"
        for line, index, name in [
            (7, 0, "OPENAI_API_KEY"),
            (8, 1, "KESTREL_DATABASE_URL"),
            (10, 3, "SLACK_BOT_TOKEN"),
        ]
    ]


def test_a_catalog_cannot_hand_a_command_the_model_endpoint(tmp_path: Path) -> None:
    # OPENAI_BASE_URL sets a setting too, and may hold a proxy's password (user:password@).
    path = tmp_path / "ops.yaml"
    tool = {"name": "t", "description": "t", "command": ["env"], "env": ["OPENAI_BASE_URL"]}
    path.write_text(yaml.safe_dump({"tools": [tool]}, sort_keys=False))
    with pytest.raises(CatalogError) as refused:
        load_catalog(path)
    assert refused.value.problems == [
        f"{path}:7: tools[0].env[0]: tool 't': OPENAI_BASE_URL holds a secret or a setting of"
        " Kestrel's"
    ]


async def test_a_named_file_and_folder_the_password_file_and_kept_folder_read_as_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pgpass").write_text("db:5432:*:kestrel:pg-secret\n")
    (tmp_path / "vault").mkdir()
    (tmp_path / "vault" / "key").write_text("vault-secret\n")
    (tmp_path / "link").symlink_to(tmp_path / "vault" / "key")
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "pgpass"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    kept = tmp_path / "cache" / "kestrel" / "kept"
    (kept / "code" / "documents").mkdir(parents=True)
    (kept / "code" / "documents" / "read").write_text('{"openai_api_key": "kept-secret"}')
    hidden = secret_files(None, tmp_path / "absent.env", [tmp_path / "vault"])
    assert hidden == (str(tmp_path / "pgpass"), str(kept), str(tmp_path / "vault"))
    script = (
        'cat "$0"/pgpass "$0"/link "$0"/vault/key "$0"/cache/kestrel/kept/code/documents/read;'
        ' ls "$0"/vault; echo end'
    )
    tool = CommandTool(
        "c", "c", ["/bin/sh", "-c", script, str(tmp_path)], isolation=Isolation(hidden)
    )
    output = (await tool.call({}, CTX)).output
    assert "secret" not in output and output.endswith("end\n[exit status 0]"), output


async def test_what_is_kept_after_the_start_reads_as_empty_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No kept folder at start (nothing read yet, or keeping off); another process keeps a
    # settings file in it while this one runs commands.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    hidden = secret_files(None, tmp_path / "absent.env")
    kept = tmp_path / "cache" / "kestrel" / "kept"
    (kept / "code" / "documents").mkdir(parents=True, exist_ok=True)
    (kept / "code" / "documents" / "read").write_text('{"openai_api_key": "kept-secret"}')
    script = 'cat "$0"/code/documents/read; echo end'
    tool = CommandTool("c", "c", ["/bin/sh", "-c", script, str(kept)], isolation=Isolation(hidden))
    output = (await tool.call({}, CTX)).output
    assert "secret" not in output, output


def test_a_passed_probe_is_remembered_per_covered_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    Isolation().check_remembered()
    Isolation((str(tmp_path),)).check_remembered()
    Isolation().check_remembered()  # remembered: no third marker
    assert len(list((tmp_path / "kestrel").glob("isolation-*"))) == 2


def _kubelet_writes(folder: Path, version: str, secrets: dict[str, str]) -> None:
    """A Secret volume's files as the kubelet writes them, and rewrites them when the Secret
    changes: a new ``..VERSION`` folder, ``..data`` swapped to it at once, the old one removed;
    each key a link through ``..data``."""
    fresh = folder / f"..{version}"
    fresh.mkdir(parents=True)
    for name, value in secrets.items():
        (fresh / name).write_text(value)
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(Path("..data") / name)
    old = (folder / "..data").resolve() if (folder / "..data").is_symlink() else None
    (folder / "..data_tmp").symlink_to(fresh.name)
    (folder / "..data_tmp").rename(folder / "..data")
    if old is not None:
        shutil.rmtree(old)


async def test_a_secret_file_the_kubelet_updates_reads_as_empty_after_the_update_too(
    tmp_path: Path,
) -> None:
    # Covered as the file it led to at start: once the Secret changed (a token rotated), that
    # file was gone and the link led to a new one, which every command could read.
    secrets = tmp_path / "secrets"
    _kubelet_writes(secrets, "2026_12_06_20_00_00.1", {"SLACK_BOT_TOKEN": "xoxb-old-secret"})
    hidden = secret_files(None, tmp_path / "absent.env", [secrets / "SLACK_BOT_TOKEN"])
    _kubelet_writes(secrets, "2026_12_06_21_00_00.2", {"SLACK_BOT_TOKEN": "xoxb-new-secret"})
    script = 'cat "$0"; echo end'
    argv = ["/bin/sh", "-c", script, str(secrets / "SLACK_BOT_TOKEN")]
    tool = CommandTool("c", "c", argv, isolation=Isolation(hidden))
    output = (await tool.call({}, CTX)).output
    assert "secret" not in output and output.endswith("end\n[exit status 0]"), output


def test_the_probes_marker_holds_to_its_conditions(tmp_path: Path) -> None:
    from bot.tools.isolation import _marker, _read

    if not Path("/proc/self/status").exists():
        pytest.skip("no /proc: every start probes")
    first = _marker(("/etc/kestrel.yaml",))
    assert first is not None
    assert _marker(("/etc/kestrel.yaml",)) == first
    assert _marker(("/etc/other.yaml",)) != first  # another file covered: probed again
    sysctl = tmp_path / "max_user_namespaces"
    sysctl.write_text("15000\n")
    assert _read(str(sysctl)) == "15000"
    assert _read(str(tmp_path / "absent")) == "-"
