"""ToolSet's digests: the set's, kept in every run's fingerprint, and each tool's definition."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from bot.config.settings import demo_file
from bot.tools.catalog import load_catalog
from bot.tools.propose_plan import human_tools
from bot.tools.toolset import ToolSet, _shape


def demo_tools(folder: Path, edit: tuple[str, str] = ("", "")) -> ToolSet:
    catalog = demo_file("tools/ops.yaml")
    copy = folder / "ops.yaml"
    copy.write_text(catalog.read_text().replace(*edit) if edit[0] else catalog.read_text())
    (folder / "bin").symlink_to(catalog.parent / "bin")
    return ToolSet.assemble(load_catalog(copy), human_tools())


def test_the_sets_digest_is_the_one_fingerprints_were_made_with(tmp_path: Path) -> None:
    tools = demo_tools(tmp_path)
    shapes = [_shape(tool) for tool in tools.values()]
    kept = hashlib.sha256(json.dumps(shapes, sort_keys=True).encode()).hexdigest()[:16]
    assert tools.digest() == kept  # a run suspended before resumes without --force


def test_a_tools_definition_changes_with_what_it_runs_and_only_its_own(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    before = demo_tools(tmp_path / "a")
    after = demo_tools(tmp_path / "b", ('"restart", "{service}"', '"restart", "{service}", "-v"'))
    assert before.definition("restart_service") != after.definition("restart_service")
    assert before.definition("service_status") == after.definition("service_status")
    assert before.definition("no_such_tool") == ""
    arguments = {"service": "checkout"}
    assert before.call_digest("restart_service", arguments) != after.call_digest(
        "restart_service", arguments
    )
