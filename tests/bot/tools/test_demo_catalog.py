"""The demo catalog shipped with the package loads, and its tools run offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.tools.base import ToolContext
from bot.tools.catalog import check_catalog, load_catalog, load_catalogs
from bot.tools.command import CommandTool
from bot.tools.toolset import ToolSet

ROOT = Path(__file__).resolve().parents[3]
CATALOG = ROOT / "bot" / "demo" / "tools" / "ops.yaml"
EXAMPLE = ROOT / "manifests" / "tools" / "ops.yaml"
CTX = ToolContext(run_id="run_1", call_id="call_1")
SHIPPED = "^[a-z0-9][a-z0-9@._-]*$"


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, CommandTool]:
    monkeypatch.setenv("KESTREL_DEMO_STATE", str(tmp_path))
    return {tool.name: tool for tool in load_catalogs(["bot/demo/tools/*.yaml"], ROOT)}


def test_demo_and_example_catalogs_are_clean() -> None:
    assert check_catalog(CATALOG) == []
    assert check_catalog(EXAMPLE) == []


def test_example_catalog_declares_the_demo_tools(tools: dict[str, CommandTool]) -> None:
    assert set(tools) == {"service_status", "tail_logs", "restart_service", "disk_usage"}
    assert tools["restart_service"].flags.approval.confirm
    assert not tools["restart_service"].flags.traits.idempotent
    assert all(tools[name].flags.traits.idempotent for name in ("service_status", "tail_logs"))


async def test_read_only_tools_run(tools: dict[str, CommandTool]) -> None:
    status = await tools["service_status"].call({"service": "checkout"}, CTX)
    assert status.output.startswith("checkout: degraded: OOM-killed")
    logs = await tools["tail_logs"].call({"service": "checkout"}, CTX)
    assert "Memory cgroup out of memory" in logs.output
    assert logs.output.endswith("[exit status 0]")
    short = await tools["tail_logs"].call({"service": "payments", "lines": 1}, CTX)
    assert len(short.output.splitlines()) == 2
    disk = await tools["disk_usage"].call({}, CTX)
    assert disk.output.startswith("Filesystem")
    assert not disk.is_error


async def test_unknown_service_is_an_answer(tools: dict[str, CommandTool]) -> None:
    result = await tools["service_status"].call({"service": "billing"}, CTX)
    assert not result.is_error
    assert result.output.endswith("[exit status 4]")


async def test_restart_effect_is_visible(tools: dict[str, CommandTool], tmp_path: Path) -> None:
    await tools["restart_service"].call({"service": "checkout"}, CTX)
    assert (tmp_path / "restarts.log").read_text() == "restart checkout\n"
    status = await tools["service_status"].call({"service": "checkout"}, CTX)
    assert "restarted via kestrel 1 time(s)" in status.output


def patterned(catalog: Path) -> list[tuple[ToolSet, str, str, dict[str, object]]]:
    """(tools, tool, parameter, otherwise valid arguments) for every parameter with a pattern."""
    tools = ToolSet(load_catalog(catalog))
    found: list[tuple[ToolSet, str, str, dict[str, object]]] = []
    for tool in tools.values():
        properties = tool.parameters["properties"]
        base: dict[str, object] = {"lines": 10} if "lines" in properties else {}
        found += [
            (tools, tool.name, name, base) for name in properties if "pattern" in properties[name]
        ]
    assert len(found) == 3
    return found


@pytest.mark.parametrize("catalog", [CATALOG, EXAMPLE], ids=["demo", "example"])
@pytest.mark.parametrize("value", ["-rf", "--help", "-", "checkout\n", "..", ".hidden", ""])
def test_shipped_patterns_refuse_options_newlines_and_dots(catalog: Path, value: str) -> None:
    for tools, tool, name, base in patterned(catalog):
        (problem,) = tools.validate(tool, {**base, name: value})
        assert f"does not match '{SHIPPED}'" in problem


@pytest.mark.parametrize("catalog", [CATALOG, EXAMPLE], ids=["demo", "example"])
def test_shipped_patterns_admit_real_names(catalog: Path) -> None:
    for tools, tool, name, base in patterned(catalog):
        assert tools.validate(tool, {**base, name: "foo@bar-2.service"}) == []
