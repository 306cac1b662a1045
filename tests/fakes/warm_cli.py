"""``kestrel`` commands in real processes forked from a warm one, for tests that run many.

A fresh interpreter spends about half a second of CPU importing the openai client before a
command that reaches the model does anything; dozens of commands a test made the suite
CPU-bound. Here a server process (multiprocessing's forkserver) imports the heavy third-party
libraries once, and each command is a child forked from it: its own pid, working folder,
environment, standard streams and exit status (a SIGKILL shows as -9), running the real
``bot.cli.main.main``. Kestrel's own modules are not preloaded: each command imports them as
a fresh process does (some read ``sys.modules`` to know what has happened, e.g. whether the
logs were configured). Tests of start-up itself (imports, signals, the first hour) keep
starting a fresh interpreter.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# Imported by the server once: what a command that reaches the model or a catalog imports,
# none of it Kestrel's.
_PRELOAD = [
    "openai",
    "openai.resources.chat.completions.completions",
    "anyio._backends._asyncio",
    "jiter",
    "pydantic",
    "asyncpg",
    "aiosqlite",
    "click",
    "yaml",
    "msgspec",
    "re2",
    "jsonschema",
    "jsonschema.validators",
]

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(_PRELOAD)


def forkable(env: dict[str, str]) -> bool:
    """Whether a command in ``env`` runs as it would in a fresh interpreter when forked from
    the server: not where a ``PYTHON*`` variable (the import path, the streams' encoding)
    differs from this process's, which the server started with."""
    python = {name for name in (*env, *os.environ) if name.startswith("PYTHON")}
    return all(env.get(name) == os.environ.get(name) for name in python)


def kestrel(
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    stdin: str = "",
    crash: str = "",
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``kestrel ARGS`` in a process forked from the warm server, as ``subprocess.run`` with
    ``capture_output=True, text=True`` reports it; ``crash`` (``kind:N``): its store is killed
    right after the N-th durable append of that kind (``tests.crash.cli_crashing``)."""
    with tempfile.TemporaryDirectory(prefix="kestrel-cli-") as scratch:
        streams = {name: os.path.join(scratch, name) for name in ("in", "out", "err")}
        Path(streams["in"]).write_text(stdin)
        child = _CONTEXT.Process(
            target=_command, args=(args, str(cwd), env, streams, crash), daemon=True
        )
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(["kestrel", *args], timeout)
        out, err = (Path(streams[name]).read_text() for name in ("out", "err"))
        return subprocess.CompletedProcess(["kestrel", *args], child.exitcode, out, err)


def _command(
    args: list[str], cwd: str, env: dict[str, str], streams: dict[str, str], crash: str
) -> None:
    """In the child: take the command's place, streams and environment, then run it."""
    written = os.O_WRONLY | os.O_CREAT
    for fd, name, flags in ((0, "in", os.O_RDONLY), (1, "out", written), (2, "err", written)):
        opened = os.open(streams[name], flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["-c", *args]
    if crash:
        from tests.crash.cli_crashing import crash_on_cue

        crash_on_cue(crash)
    from bot.cli.main import main

    main()
