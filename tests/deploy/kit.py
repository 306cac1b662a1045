"""The deployment kit as tests read it: the Dockerfile's instructions, the chart rendered by
Helm's own engine (its Go SDK, through helm-python-sdk), the compose file."""

from __future__ import annotations

import configparser
import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.fakes.processes import ROOT

DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
CHART = DEPLOY / "helm" / "kestrel"
COMPOSE = DEPLOY / "compose.yaml"
UNIT = DEPLOY / "systemd" / "kestrel.service"
# The least the chart renders with: the replicas' shared journal.
DATABASE_URL = "postgresql://kestrel:pw@postgres:5432/kestrel"
A_DATABASE: dict[str, Any] = {"secret": {"values": {"KESTREL_DATABASE_URL": DATABASE_URL}}}


def unit_service() -> configparser.SectionProxy:
    """The systemd unit's ``[Service]`` settings, as systemd reads their names (case kept)."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(UNIT.read_text())
    return unit["Service"]


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of the final stage, continuation lines joined."""
    return dockerfile_stages(path)[-1]


def dockerfile_stages(path: Path = DOCKERFILE) -> list[list[tuple[str, str]]]:
    """Each stage's ``(INSTRUCTION, arguments)``, continuation lines joined."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    stages: list[list[tuple[str, str]]] = []
    for line in lines:
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            stages.append([])
        stages[-1].append((word.upper(), rest.strip()))
    return stages


def exec_form(arguments: str) -> list[str]:
    """A JSON-array instruction's argv (``CMD ["a", "b"]``)."""
    argv = json.loads(arguments)
    assert isinstance(argv, list), arguments
    return [str(part) for part in argv]


def healthcheck_argv() -> list[str]:
    """The final stage's HEALTHCHECK command, as Docker runs it (options dropped)."""
    (arguments,) = [rest for word, rest in dockerfile_instructions() if word == "HEALTHCHECK"]
    words = shlex.split(arguments.replace("[", " [", 1).split(" CMD ", 1)[1].strip(), posix=False)
    return exec_form(" ".join(words))


def healthcheck_seconds() -> float:
    """How long Docker lets the HEALTHCHECK's command run (``--timeout``; Docker's default 30 s)."""
    (arguments,) = [rest for word, rest in dockerfile_instructions() if word == "HEALTHCHECK"]
    found = re.search(r"--timeout=(\d+)s\b", arguments.split(" CMD ", 1)[0])
    return float(found.group(1)) if found else 30.0


def render_chart(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every manifest ``helm template kestrel deploy/helm/kestrel`` would print."""
    import helm_python

    chart = helm_python.Chart.load(str(CHART))
    rendered = chart.render(values, name="kestrel", namespace="team")
    documents = []
    for name in sorted(rendered):
        if name.endswith(".txt"):
            continue
        documents += [doc for doc in yaml.safe_load_all(rendered[name]) if doc]
    return documents


def one(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one manifest of ``kind``."""
    found = [doc for doc in documents if doc["kind"] == kind]
    assert len(found) == 1, [doc["kind"] for doc in documents]
    return found[0]


def compose_environment(service: str, variables: Mapping[str, str]) -> dict[str, str]:
    """A service's ``environment:`` in the compose file, as Compose interpolates it from
    ``variables`` (``${NAME}``, ``${NAME:?message}``)."""
    compose = yaml.safe_load(COMPOSE.read_text())
    given = compose["services"][service]["environment"]
    pattern = r"\$\{(\w+)(?::\?[^}]*)?\}"
    return {
        name: re.sub(pattern, lambda found: variables[found.group(1)], str(value))
        for name, value in given.items()
    }
