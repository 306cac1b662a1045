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
is logged as an error at every start. ``check_remembered`` skips the probe (a process, about
40 ms) when one passed before under the same conditions; the helper refuses to run a command
where it cannot confine it whatever a check said, so what is remembered only decides how early
a host without namespaces is told.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from bot import kept
from bot.config.sources import names_a_setting
from bot.digest import sha256

if TYPE_CHECKING:
    from bot.tools.standby import Standby

HELPER: Final = str(Path(__file__).with_name("confine.py"))
# Imported, not run as a script: an import reads the byte code Python keeps beside the source,
# where a script is compiled again at every call (2 ms of each). Appended to the path, so the
# standard library still comes first.
_START_HELPER: Final = (
    f"import sys; sys.path.append({str(Path(HELPER).parent)!r}); import confine;"
    " confine.main(sys.argv[1:])"
)
# Variables Kestrel reads whose values are secrets, besides the settings' (KESTREL_<KEY>).
SECRET_VARIABLES: Final = frozenset(
    {
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",  # a setting of its own name, which may hold a proxy's password
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
# Switches that decide whether an unprivileged process may make namespaces, where they exist.
_SYSCTLS: Final = (
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/user/max_mnt_namespaces",
    "/proc/sys/user/max_pid_namespaces",
    "/proc/sys/kernel/unprivileged_userns_clone",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
)
# What in /proc/self/status decides it for this process: capabilities, seccomp, no_new_privs.
_STATUS_LINES: Final = ("Cap", "Seccomp", "NoNewPrivs")
_NOT_FOUND: Final = "No such file or directory"  # ENOENT, as the system says it
# How the helper says it ran nothing, as confine.py defines it (not imported from there: it
# loads ctypes): exit status 127 and "cannot start 'PROGRAM': …", or 126 and "kestrel: …; the
# command was not run", one line on stderr.
CANNOT_START: Final = 127
NOT_CONFINED: Final = 126
NOT_RUN: Final = "; the command was not run"


class IsolationUnavailable(Exception):
    """Catalog commands cannot be isolated here; the message says why, on one line."""


def is_kestrels_variable(name: str) -> bool:
    """Whether a catalog's ``env:`` names a secret Kestrel reads, or a setting's variable (the
    database URL and its password, a section holding an MCP server's tokens)."""
    upper = name.upper()
    return upper in SECRET_VARIABLES or names_a_setting(upper)


class Isolation(msgspec.Struct, frozen=True):
    """How each catalog command is started: inside the helper, with these files covered."""

    hidden: tuple[str, ...] = ()
    # A helper started ahead, which the first command may take (``bot.tools.standby``).
    standby: Standby | None = None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The argv that runs ``argv`` isolated (the probe's); the helper is this process's
        interpreter. With no ``argv``, the helper waits for its command on stdin
        (``command_message``), as every catalog command's does."""
        return [sys.executable, "-I", "-S", "-c", _START_HELPER, *self.hidden, "--", *argv]

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
            reason = line.removeprefix("kestrel: ").removesuffix(NOT_RUN)
            raise IsolationUnavailable(reason)

    def check_remembered(self) -> None:
        """``check``, unless one passed on this boot for the same user, namespaces,
        capabilities, seccomp filter, interpreter, helper and covered files (a marker file in
        ``$XDG_RUNTIME_DIR/kestrel``, else ``~/.cache/kestrel``, says so)."""
        marker = _marker(self.hidden)
        if marker is not None and marker.is_file():
            return
        self.check()
        if marker is None:
            return
        try:
            marker.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            marker.touch()
        except OSError:
            pass  # a read-only home: the next start probes again


def command_message(argv: Sequence[str], env: Mapping[str, str], cwd: str | Path) -> bytes:
    """What a helper waiting on stdin reads as its command (``confine.read_command``): the
    folder, each ``NAME=value``, an empty field, then argv, separated by NULs (none of them can
    hold one: the kernel's strings cannot, and an argument with one is refused first), after
    their length: a message cut short by Kestrel's death reads as none, not as a shorter one."""
    fields = [str(cwd), *(f"{name}={value}" for name, value in env.items()), "", *argv]
    body = b"\0".join(os.fsencode(field) for field in fields)
    return b"%d\0%s" % (len(body), body)


def _marker(hidden: Sequence[str]) -> Path | None:
    """The file that says a probe passed under this process's conditions; None where they
    cannot be read (no /proc): then every start probes."""
    try:
        conditions = [
            _proc_text("/proc/sys/kernel/random/boot_id").strip(),
            f"{os.getuid()}:{os.geteuid()}:{os.getgid()}:{os.getegid()}",
            *(str(os.stat(f"/proc/self/ns/{kind}").st_ino) for kind in ("user", "mnt", "pid")),
            *_status_lines(),
            *(f"{path}={_read(path)}" for path in _SYSCTLS),
            sys.executable,
            _stamp(HELPER),
            *hidden,
        ]
    except OSError:
        return None
    digest = sha256("\0".join(conditions).encode()).hexdigest()[:32]
    base = os.environ.get("XDG_RUNTIME_DIR") or str(Path("~/.cache").expanduser())
    return Path(base) / "kestrel" / f"isolation-{digest}"


def _status_lines() -> list[str]:
    lines = _proc_text("/proc/self/status").splitlines()
    return [line for line in lines if line.startswith(_STATUS_LINES)]


def _read(path: str) -> str:
    try:
        return _proc_text(path).strip()
    except OSError:
        return "-"


def _proc_text(path: str) -> str:
    """A file of /proc, read as bytes: every start reads seven, and ``Path.read_text``'s path
    and text layers cost 0.35 M instructions of a ``runs approve`` over them."""
    with open(path, "rb") as file:
        return file.read().decode()


def _stamp(path: str) -> str:
    found = os.stat(path)
    return f"{path}:{found.st_size}:{found.st_mtime_ns}:{found.st_ino}"


def secret_files(
    config_file: Path | None, env_file: Path | None, named: Iterable[Path] = ()
) -> tuple[str, ...]:
    """The absolute paths to cover, those that exist now, each once: each as resolved, and a
    link as given too, which each command's cover follows to where it leads then (a Kubernetes
    Secret's file leads to a new one once the Secret changes). The kept folder is among them,
    made if need be: it holds what Kestrel read of its settings file (``bot.kept``), and what
    another process keeps there later must be covered too."""
    candidates = [config_file, env_file, _pgpass(), kept.root(create=True), *named]
    found: list[Path] = []
    for path in candidates:
        if path is not None and _visible(path):
            found += [path.resolve(), path.absolute()]
    return tuple(dict.fromkeys(str(path) for path in found))


def _visible(path: Path) -> bool:
    """Whether ``path`` exists; not in a folder this user may not search (``./.env`` from root's
    home under ``sudo -u kestrel``), where no command of this user can read it either."""
    try:
        return path.exists()
    except PermissionError:
        return False


def _pgpass() -> Path | None:
    """libpq's password file, which asyncpg reads for a PostgreSQL database."""
    chosen = os.environ.get("PGPASSFILE")
    return Path(chosen) if chosen else Path("~/.pgpass").expanduser()


def program_problem(program: str, path: str, cwd: Path) -> str | None:
    """Why ``program`` cannot start, as ``spawn`` would say it; None if it can.

    The helper always starts, so a missing program is found here, before, to answer it as an
    error (not as output of a command that ran).
    """
    reason = unstartable(program, path, cwd)
    return None if reason is None else f"cannot start {program!r}: {reason} ({program})"


def ran_nothing(status: int, output: bytes | bytearray, program: str) -> str | None:
    """The helper's line if it ran nothing (``program`` could not start, or the confinement
    failed), else None. That line is the whole output: a command that exits 127 or 126 itself
    prints its own words (one that prints the helper's is taken at them: its call fails)."""
    one_line = output.endswith(b"\n") and output.count(b"\n") == 1
    if status not in (CANNOT_START, NOT_CONFINED) or not one_line:
        return None
    line = output[:-1].decode(errors="replace")
    if status == CANNOT_START and line.startswith(f"cannot start {program!r}: "):
        return line
    if status == NOT_CONFINED and line.startswith("kestrel: ") and line.endswith(NOT_RUN):
        return line
    return None


def unstartable(program: str, path: str, cwd: Path) -> str | None:
    """Why ``program`` (a path from ``cwd``, else a name looked up on ``path``) cannot start,
    in the system's words; None if it can."""
    if "/" in program:
        return _executable_problem(cwd / program)
    for folder in path.split(os.pathsep):
        candidate = Path(folder or ".") / program
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return None
    return _NOT_FOUND


def _executable_problem(path: Path) -> str | None:
    if not path.exists():
        return _NOT_FOUND
    if path.is_dir() or not os.access(path, os.X_OK):
        return "Permission denied"
    return None
