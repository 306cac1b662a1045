"""Run one catalog command where Kestrel's secrets cannot be read (Linux; stdlib only).

``main(["FILE", ..., "--"])``, imported by an interpreter started with ``-I -S``
(``bot.tools.isolation``): the command comes on stdin once Kestrel has it (``read_command``;
``bot.tools.standby`` starts the helper, ahead or then), and stdin closed empty means there is
none: nothing runs. (``FILE... -- ARGV...`` runs ARGV in this process's folder and
environment, which its interpreter changed: the probe's ``true`` alone.) This process (the
group leader Kestrel records) enters a new mount namespace, covers each FILE with ``/dev/null``
there (a folder with an empty read-only file system), and starts the first
process of a new PID namespace. That one mounts a ``/proc`` showing its namespace alone, drops
the capabilities that could undo the covers or read another process's memory (from the
bounding set, so nothing it starts gets them back), and forks the command, which is an
ordinary process there (not the namespace's init: signals work as anywhere). When the command
ends, the namespace ends with it (the kernel kills whatever it left) and this process exits as
the command did: the same code, or the same signal. A command that cannot start is one line
on stderr and exit status 127; a confinement that fails runs nothing (126).

A module of its own, not of ``bot``, imported with ``-S`` (so from its byte code): each call
pays for an interpreter that loads ``os``, ``sys``, ``ctypes`` and ``_signal`` only.
(``signal`` wraps ``_signal``'s numbers in enums, and its import of ``enum``, ``functools``
and ``collections`` was a tenth of a call.)
"""

import _signal as signal  # type: ignore[import-not-found]  # no stub: the numbers signal wraps
import ctypes
import os

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
# CAP_SYS_MODULE, CAP_SYS_RAWIO (/proc/kcore, /dev/mem), CAP_SYS_PTRACE, CAP_SYS_ADMIN (mount,
# umount, setns), CAP_MKNOD (a device node for a disk), CAP_PERFMON, CAP_BPF.
DROPPED_CAPABILITIES = (16, 17, 19, 21, 27, 38, 39)
CANNOT_START = 127
FAILED = 126
NOT_RUN = "; the command was not run"

_libc = ctypes.CDLL(None, use_errno=True)


class Refused(Exception):
    """A step of the confinement failed: the command must not run."""


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise Refused(f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    encoded = [None if part is None else part.encode() for part in (source, target, fstype)]
    _check(_libc.mount(*encoded, flags, None), f"cannot mount {target}")


def _map_user(uid: int, gid: int) -> None:
    """Without root: be root of a new user namespace mapped to our own user, to mount."""
    for name, text in (("uid_map", f"0 {uid} 1"), ("setgroups", "deny"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as file:
            file.write(text)


def enter(hidden: list[str]) -> None:
    """New mount and PID namespaces (the PID one for our children), the files covered."""
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS | CLONE_NEWPID | (CLONE_NEWUSER if uid != 0 else 0)
    _check(_libc.unshare(flags), "cannot create namespaces")
    if uid != 0:
        _map_user(uid, gid)
    # Nothing mounted here may reach the host's mount table.
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for path in hidden:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        elif os.path.exists(path):  # a link is followed: covered where it leads now
            _mount("/dev/null", path, None, MS_BIND)


def confine() -> None:
    """In the new PID namespace: its own /proc, and no capability that undoes that."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "cannot set death signal")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    with open("/proc/sys/kernel/cap_last_cap") as file:
        last = int(file.read())
    for capability in DROPPED_CAPABILITIES:
        if capability <= last:
            _check(_libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0), "cannot drop capabilities")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


def command(argv: list[str], env: dict[str, str] | None) -> None:
    """Become the command (with ``env``, else this process's); one that cannot start says why
    on one line."""
    # Python ignores these; an ignored signal stays ignored across exec (as subprocess does).
    for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        if env is None:
            os.execvp(argv[0], argv)
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        # Only the reason: execvpe names the file that failed, execvp never did, and a
        # command's words are the same whichever ran it.
        os.write(2, f"cannot start {argv[0]!r}: {exc.strerror}\n".encode())
    os._exit(CANNOT_START)


def init(argv: list[str], env: dict[str, str] | None, report: int) -> None:
    """The namespace's first process: reap everything until the command ends, report it."""
    try:
        confine()
    except Refused as exc:
        os.write(2, f"kestrel: {exc}{NOT_RUN}\n".encode())
        os._exit(FAILED)
    child = os.fork()
    if child == 0:
        os.close(report)
        command(argv, env)
    while True:
        pid, status = os.wait()
        if pid == child:
            os.write(report, str(status).encode())
            os._exit(0)


def relay(status: int) -> None:
    """Exit as the command did: its exit code, or its signal."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        os._exit(128 + number)
    # No interpreter shutdown (a few ms of every call): this process buffered nothing.
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else FAILED)


def read_command() -> tuple[str, dict[str, str], list[str]] | None:
    """The command on stdin (``bot.tools.isolation.command_message``): its folder, environment
    and argv; None if stdin closed empty; ValueError if what came is not all of one (Kestrel
    died while writing it). Stdin is /dev/null then, as for any command."""
    chunks = []
    while chunk := os.read(0, 65536):
        chunks.append(chunk)
    null = os.open(os.devnull, os.O_RDWR)  # as subprocess.DEVNULL opens it
    os.dup2(null, 0)
    os.close(null)
    if not chunks:
        return None
    size, _, body = b"".join(chunks).partition(b"\0")
    if not size.isdigit() or int(size) != len(body):
        raise ValueError("cut short")
    cwd, *fields = os.fsdecode(body).split("\0")
    split = fields.index("")
    env = dict(field.split("=", 1) for field in fields[:split])
    argv = fields[split + 1 :]
    if not argv:
        raise ValueError("no program")
    return cwd, env, argv


def asked(argv: list[str]) -> tuple[list[str], dict[str, str] | None, str | None]:
    """``argv`` as given, or (none given) the command read from stdin, with its environment
    and folder; exits at once if there is none, or it cannot be read."""
    if argv:
        return argv, None, None
    try:
        sent = read_command()
    except ValueError:
        os.write(2, f"kestrel: the command sent was unreadable{NOT_RUN}\n".encode())
        os._exit(FAILED)
    if sent is None:
        os._exit(0)
    cwd, env, argv = sent
    return argv, env, cwd


def enter_folder(cwd: str, program: str) -> None:
    """Make ``cwd`` the folder the command starts in; exits at once if it cannot be entered."""
    try:
        os.chdir(cwd)
    except OSError as exc:
        os.write(2, f"cannot start {program!r}: {exc.strerror} ({cwd})\n".encode())
        os._exit(CANNOT_START)


def main(args: list[str]) -> None:
    """``FILE... -- ARGV...``, or ``FILE... --`` and the command on stdin."""
    split = args.index("--")
    hidden = args[:split]
    # The command first, then the covers: a helper that waited for it covers the files as
    # they are when it runs (one replaced, a link led elsewhere since), as one started then.
    argv, env, cwd = asked(args[split + 1 :])
    try:
        enter(hidden)
    except (Refused, OSError) as exc:
        os.write(2, f"kestrel: {exc}{NOT_RUN}\n".encode())
        os._exit(FAILED)
    if cwd is not None:
        enter_folder(cwd, argv[0])
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:
        os.close(read_end)
        init(argv, env, write_end)
    os.close(write_end)
    os.waitpid(first, 0)
    with os.fdopen(read_end, "rb") as reported:
        text = reported.read()
    relay(int(text) if text else FAILED << 8)
