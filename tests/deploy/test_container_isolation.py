"""Catalog isolation (``tool_isolation: namespaces``, the shipped default) inside a container as
the Compose file and the chart ask for it. Each command gets a new ``/proc``, which the kernel
refuses to mount under a container runtime's masked ``/proc`` whatever the seccomp and AppArmor
profiles say: Kestrel would then refuse to start. The container's ``/proc`` is made here as the
runtime makes it (``tests/fakes/container.py``), masked unless the deployment unmasks it."""

from __future__ import annotations

import shutil
import sys
from typing import Any

import pytest
import yaml

from bot.tools.isolation import NOT_CONFINED, Isolation
from tests.deploy.kit import A_DATABASE, COMPOSE, one, render_chart
from tests.fakes import container

WHY_NOT = container.available()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


def compose_unmasks() -> tuple[bool, bool]:
    """Whether the Compose file's replicas run with ``/proc`` unmasked, and without gaining
    privileges."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    kestrel = [s for name, s in services.items() if name.startswith("kestrel")]
    assert kestrel
    unmasked = all("systempaths=unconfined" in s.get("security_opt", []) for s in kestrel)
    return unmasked, all("no-new-privileges:true" in s.get("security_opt", []) for s in kestrel)


def chart_unmasks() -> tuple[bool, bool]:
    """Whether the chart's container runs with ``/proc`` unmasked, and in a user namespace of
    its own, without which Kubernetes refuses ``procMount: Unmasked``; and without gaining
    privileges."""
    pod: dict[str, Any] = one(render_chart(A_DATABASE), "Deployment")["spec"]["template"]["spec"]
    (kestrel,) = pod["containers"]
    context = kestrel.get("securityContext", {})
    unmasked = context.get("procMount") == "Unmasked" and pod.get("hostUsers") is False
    return unmasked, context.get("allowPrivilegeEscalation") is False


def probe(*, unmasked: bool, no_new_privs: bool = False) -> tuple[int, str]:
    """Kestrel's start-up probe (``true``, isolated) as the image's user in that container."""
    candidates = [sys._base_executable, sys.executable, shutil.which("python3") or ""]  # type: ignore[attr-defined]
    python = container.interpreter([*candidates, "/usr/bin/python3"])
    if python is None:
        pytest.skip("no Python the image's user may run")
    argv = Isolation().wrap(["true"])
    done = container.run_in_container(
        [python, *argv[1:]], unmasked=unmasked, no_new_privs=no_new_privs
    )
    return done.returncode, done.stderr


def test_a_masked_proc_refuses_catalog_isolation() -> None:
    # What the tests below rely on: the masks alone are what stop it.
    status, said = probe(unmasked=False)
    assert status == NOT_CONFINED and "cannot mount /proc" in said, said


FORMS = [("compose", compose_unmasks), ("chart", chart_unmasks)]


@pytest.mark.parametrize(("form", "unmasks"), FORMS)
def test_the_shipped_deployment_lets_catalog_commands_be_isolated(form: str, unmasks: Any) -> None:
    unmasked, no_new_privs = unmasks()
    status, said = probe(unmasked=unmasked, no_new_privs=no_new_privs)
    assert status == 0, f"{form}: {said}"
