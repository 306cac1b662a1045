"""A process in a container's ``/proc``, as Docker and Kubernetes' runtimes make it, without a
container runtime: a new PID and mount namespace with its own ``/proc``, the OCI runtime's
default masked paths (a file covered by ``/dev/null``, a folder by an empty read-only tmpfs)
and read-only paths over it unless the deployment unmasks them (Compose
``systempaths=unconfined``, Kubernetes ``procMount: Unmasked``), then the image's user without
a capability. Needs root, ``unshare`` and ``setpriv``.

The masks matter: the kernel lets a user namespace mount a new ``/proc`` only where one is
fully visible (``mount_too_revealing``), which is what ``tool_isolation: namespaces`` does."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence

# runc's and containerd's defaults (moby's oci/defaults.go, containerd's oci/spec.go).
MASKED = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
)
READ_ONLY = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
IMAGE_USER = 10001  # the Dockerfile's USER, the chart's runAsUser


def available() -> str | None:
    """Why a container's ``/proc`` cannot be made here; None when it can."""
    if os.geteuid() != 0:
        return "needs root (to make the namespaces and the masks)"
    missing = [tool for tool in ("unshare", "setpriv") if shutil.which(tool) is None]
    return f"needs {', '.join(missing)}" if missing else None


def run_in_container(
    argv: Sequence[str], *, unmasked: bool, no_new_privs: bool = False, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """``argv`` as the image's user, in a container's ``/proc`` (``unmasked``: none masked;
    ``no_new_privs``: as Compose's ``no-new-privileges`` and the chart's
    ``allowPrivilegeEscalation: false`` start it)."""
    script = [] if unmasked else _masks()
    drop = f"setpriv --reuid {IMAGE_USER} --regid {IMAGE_USER} --clear-groups"
    drop += " --no-new-privs" if no_new_privs else ""
    script.append(f'exec {drop} --inh-caps=-all --bounding-set=-all "$@"')
    namespaces = ["unshare", "--mount", "--pid", "--fork", "--mount-proc"]
    return subprocess.run(
        [*namespaces, "sh", "-ec", "\n".join(script), "container", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _masks() -> list[str]:
    lines = []
    for path in MASKED:
        quoted = shlex.quote(path)
        lines.append(f"if [ -d {quoted} ]; then mount -t tmpfs -o ro tmpfs {quoted};")
        lines.append(f"elif [ -e {quoted} ]; then mount --bind /dev/null {quoted}; fi")
    for path in READ_ONLY:
        quoted = shlex.quote(path)
        lines.append(
            f"if [ -e {quoted} ]; then mount --bind {quoted} {quoted}"
            f" && mount -o remount,bind,ro {quoted}; fi"
        )
    return lines


def interpreter(candidates: Sequence[str]) -> str | None:
    """The first of ``candidates`` the image's user can run (a venv under /root is not one)."""
    for candidate in candidates:
        if candidate and run_in_container([candidate, "-c", "pass"], unmasked=True).returncode == 0:
            return candidate
    return None
