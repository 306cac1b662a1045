"""The licence and the changelog ship with the project, and the package metadata says so."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import bot

ROOT = Path(__file__).resolve().parent.parent


def test_the_licence_is_apache_2_and_pyproject_says_so() -> None:
    licence = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in licence
    assert "END OF TERMS AND CONDITIONS" in licence
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]


def test_the_changelog_starts_at_this_version() -> None:
    releases = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert "Unreleased" not in releases[1:]
    if releases[0] != "Unreleased":  # released: the version is the newest section's
        assert bot.__version__ == releases[0]
        return
    # What is not released yet comes first, under "Unreleased", and the code says it is past
    # the last release: a development release of the next one (0.3.0.dev0 after 0.2.0), so
    # that `kestrel --version`, the metrics and the image's tag never pass it off as released.
    found = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)\.dev(\d+)", bot.__version__)
    assert found, f"{bot.__version__} is not a development release (X.Y.Z.devN)"
    last = tuple(int(part) for part in releases[1].split("."))
    assert tuple(int(part) for part in found.groups()[:3]) > last, (bot.__version__, last)
