"""Keeping catalog commands from Kestrel's secrets (``confine.py`` does it, per call).

Every catalog command runs in its own PID and mount namespaces: its ``/proc`` shows its own
processes only, so Kestrel's ``/proc/<pid>/environ``, ``cmdline`` and memory are out of its
reach; the files that hold secrets (the configuration file, the ``.env`` Kestrel read, a
PostgreSQL password file, any file ``tool_isolation.hide`` names) read as empty; and it lacks
the capabilities that would undo that (mount, umount, setns, raw memory, modules, ptrace), even
as root. Its environment is already Kestrel's choice (``minimal_env``), and a catalog may not
pass it a secret Kestrel reads, or a setting's variable (``is_kestrels_variable``).

Where namespaces cannot be made (no CAP_SYS_ADMIN and no user namespaces), ``check`` says so at
start-up and the process refuses to start, unless ``tool_isolation.mode: none`` opts out, which
is logged as a warning at every start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bot.config.sources import names_a_setting

HELPER: Final = str(Path(__file__).with_name("confine.py"))
# Variables Kestrel reads whose values are secrets, besides the settings' (KESTREL_<KEY>).
SECRET_VARIABLES: Final = frozenset(
    {
        "OPENAI_API_KEY",
        "SLACK_BOT_TOKEN",
        "SLACK_SIGNING_SECRET",
        "SLACK_APP_TOKEN",
        "DISCORD_TOKEN",
        "KESTREL_WEB_TOKEN",
        "KESTREL_WEB_SECRET",
        "KESTREL_TEST_POSTGRES_DSN",
        "KESTREL_BENCH_POSTGRES_DSN",
        "PGPASSWORD",
    }
)
_PROBE_TIMEOUT = 10.0


class IsolationUnavailable(Exception):
    """Catalog commands cannot be isolated here; the message says why, on one line."""


def is_kestrels_variable(name: str) -> bool:
    """Whether a catalog's ``env:`` names a secret Kestrel reads, or a setting's variable (the
    database URL and its password, a section holding an MCP server's tokens)."""
    upper = name.upper()
    return upper in SECRET_VARIABLES or names_a_setting(upper)


@dataclass(frozen=True)
class Isolation:
    """How each catalog command is started: inside the helper, with these files covered."""

    hidden: tuple[str, ...] = ()

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The argv that runs ``argv`` isolated; the helper is this process's interpreter."""
        return [sys.executable, "-I", "-S", HELPER, *self.hidden, "--", *argv]

    def check(self) -> None:
        """Run ``true`` isolated once; ``IsolationUnavailable`` with the helper's reason if not."""
        try:
            done = subprocess.run(
                self.wrap(["true"]),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
                timeout=_PROBE_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise IsolationUnavailable(str(exc)) from exc
        if done.returncode != 0:
            said = done.stderr.strip().splitlines()
            line = said[-1] if said else f"exit status {done.returncode}"
            reason = line.removeprefix("kestrel: ").removesuffix("; the command was not run")
            raise IsolationUnavailable(reason)


def secret_files(
    config_file: Path | None, env_file: Path | None, named: Iterable[Path] = ()
) -> tuple[str, ...]:
    """The absolute paths to cover (links resolved): those that exist now, each once."""
    candidates = [config_file, env_file, _pgpass(), *named]
    found = (path.resolve() for path in candidates if path is not None and path.exists())
    return tuple(dict.fromkeys(str(path) for path in found))


def _pgpass() -> Path | None:
    """libpq's password file, which asyncpg reads for a PostgreSQL database."""
    chosen = os.environ.get("PGPASSFILE")
    return Path(chosen) if chosen else Path("~/.pgpass").expanduser()


def program_problem(program: str, path: str, cwd: Path) -> str | None:
    """Why ``program`` cannot start, as ``spawn`` would say it; None if it can.

    The helper always starts, so a missing program is found here, before, to answer it as an
    error (not as output of a command that ran).
    """
    if "/" in program:
        return _executable_problem(cwd / program, program)
    for folder in path.split(os.pathsep):
        candidate = Path(folder or ".") / program
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return None
    return f"cannot start {program!r}: No such file or directory ({program})"


def _executable_problem(path: Path, program: str) -> str | None:
    if not path.exists():
        return f"cannot start {program!r}: No such file or directory ({program})"
    if path.is_dir() or not os.access(path, os.X_OK):
        return f"cannot start {program!r}: Permission denied ({program})"
    return None
