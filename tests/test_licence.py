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
    # What is not released yet comes first, under "Unreleased"; then this version.
    assert next(r for r in releases if r != "Unreleased") == bot.__version__
    assert "Unreleased" not in releases[1:]
