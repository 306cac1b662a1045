"""MCP servers as tool sources, against a real MCP server subprocess over stdio."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from bot.cli.compose import runtime, tool_source
from bot.config.settings import ConfigError, McpServerSettings, Settings
from bot.domain import AssistantTurn, DecisionKind, RunStatus
from bot.journal.entries import AdvisoryEntry, ToolResultEntry
from bot.llm.base import Message, Notice, ToolSpec
from bot.llm.scripted import Script, ScriptedProvider
from bot.plain import Invalid, convert
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from bot.tools.base import DEFAULT_MAX_OUTPUT, Tool, ToolContext, ToolResult
from bot.tools.mcp import (
    CLOSE_SECONDS,
    McpSource,
    McpStartError,
    McpTools,
    render,
    tool_flags,
    tool_name,
)
from bot.tools.python import function_tool
from bot.tools.toolset import ToolCollision
from storage.sqlite import open_sqlite
from tests.fakes.runtime import ScriptedPrompter, TextArgs, call, reply
from tests.fakes.waiting import until

SERVER = Path(__file__).resolve().parents[2] / "fakes" / "mcp_server.py"
CTX = ToolContext(run_id="run_test", call_id="call_test")
CHANGE = "MCP server srv: tools added: srv__extra; removed: srv__plain"


def settings(**overrides: Any) -> McpServerSettings:
    """The fake server, run by this interpreter over stdio."""
    values: dict[str, Any] = {
        "name": "srv",
        "transport": "stdio",
        "command": [sys.executable, str(SERVER)],
        "timeout": 15,
    }
    return McpServerSettings(**(values | overrides))


def builtin(name: str) -> Tool:
    """An in-process tool with a chosen name."""

    @function_tool(name=name, idempotent=True)
    async def echo(args: TextArgs) -> str:
        """Return the text."""
        return args.text

    return echo


@pytest.fixture
async def mcp() -> AsyncIterator[McpTools]:
    """The fake server (``lookup`` gated by config) behind an aggregator with one built-in tool."""
    tools = McpTools([builtin("echo")], [McpSource(settings(confirm=["lookup"]))])
    await tools.start()
    yield tools
    await tools.close()


async def call_tool(tools: McpTools, name: str, **arguments: Any) -> ToolResult:
    """Call a tool of the current set, bounded."""
    async with asyncio.timeout(10):
        result = await tools.source.current()[name].call(arguments, CTX)
    assert isinstance(result, ToolResult)
    return result


async def test_tools_come_with_the_prefix_and_flags_and_answer_calls(mcp: McpTools) -> None:
    current = mcp.source.current()
    assert list(current) == [
        "echo",
        "srv__lookup",
        "srv__restart",
        "srv__plain",
        "srv__mutate",
        "srv__crash",
    ]
    flags = {name: current[name].flags for name in current}
    assert (flags["srv__lookup"].approval.confirm, flags["srv__lookup"].traits.idempotent) == (
        True,
        True,
    )
    assert (flags["srv__restart"].approval.confirm, flags["srv__restart"].traits.idempotent) == (
        True,
        False,
    )
    assert (flags["srv__plain"].approval.confirm, flags["srv__plain"].traits.idempotent) == (
        True,
        False,
    )
    assert (flags["srv__mutate"].approval.confirm, flags["srv__mutate"].traits.idempotent) == (
        False,
        False,
    )
    assert flags["srv__lookup"].approval.tags == ("mcp", "mcp:srv")
    assert current["srv__lookup"].parameters["required"] == ["key"]
    assert current.validate("srv__lookup", {}) != []
    # One server start serves the calls too: starting one costs about a second.
    assert await call_tool(mcp, "srv__lookup", key="disk") == ToolResult("value of disk")
    failed = await call_tool(mcp, "srv__lookup", key="missing")
    assert failed.is_error and "no such key: missing" in failed.output


async def test_a_list_change_swaps_a_new_whole_set_and_leaves_the_snapshot(
    mcp: McpTools,
) -> None:
    snapshot = mcp.source.current()
    assert await call_tool(mcp, "srv__mutate") == ToolResult("mutated")
    current = mcp.source.current()
    assert current is not snapshot
    assert "srv__extra" in current and "srv__plain" not in current
    assert "srv__plain" in snapshot and "srv__extra" not in snapshot
    assert mcp.source.drain() == [CHANGE]
    gone = await snapshot["srv__plain"].call({"text": "x"}, CTX)
    assert isinstance(gone, ToolResult) and gone.is_error
    assert "Unknown tool: plain" in gone.output
    assert await call_tool(mcp, "srv__extra") == ToolResult("extra")


async def test_a_change_that_would_collide_is_refused_and_the_old_set_stays() -> None:
    tools = McpTools([builtin("srv__extra")], [McpSource(settings())])
    await tools.start()
    try:
        before = tools.source.current()
        assert await call_tool(tools, "srv__mutate") == ToolResult("mutated")
        assert tools.source.current() is before
        [advisory] = tools.source.drain()
        assert advisory.startswith("MCP server srv: refused a tool list change")
        assert "'srv__extra' is declared by the built-in tools" in advisory
    finally:
        await tools.close()


async def test_a_collision_with_a_catalog_tool_aborts_assembly() -> None:
    source = McpSource(settings())
    tools = McpTools([builtin("srv__lookup")], [source])
    with pytest.raises(ToolCollision) as caught:
        await tools.start()
    assert str(caught.value) == (
        "tool name collision: 'srv__lookup' is declared by the built-in tools "
        "(catalog and ask_human) and by MCP server srv"
    )
    assert await source.call("lookup", {"key": "k"}) == ToolResult(
        "MCP server srv is not connected", is_error=True
    )


async def test_a_server_that_exits_at_once_fails_start_with_its_name() -> None:
    tools = McpTools([], [McpSource(settings(command=[sys.executable, "-c", "pass"]))])
    with pytest.raises(McpStartError, match="MCP server srv: cannot start"):
        await tools.start()


async def test_the_runtime_starts_the_configured_servers_and_closes_them(tmp_path: Path) -> None:
    config = Settings(database=str(tmp_path / "k.db"), mcp_servers=[settings()])
    async with runtime(config) as rt:
        lookup = rt.tools.current()["srv__lookup"]
        assert await lookup.call({"key": "k"}, CTX) == ToolResult("value of k")
    closed = await lookup.call({"key": "k"}, CTX)
    assert closed == ToolResult("MCP server srv is not connected", is_error=True)


async def test_a_server_that_will_not_start_is_a_config_error(tmp_path: Path) -> None:
    broken = settings(command=[sys.executable, "-c", "pass"])
    config = Settings(database=str(tmp_path / "k.db"), mcp_servers=[broken])
    with pytest.raises(ConfigError, match="mcp_servers: MCP server srv: cannot start"):
        async with runtime(config):
            pass


class RecordingProvider(ScriptedProvider):
    """The scripted model, keeping the tool names each call was given."""

    def __init__(self, script: Script) -> None:
        super().__init__(script)
        self.seen: list[list[str]] = []

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        timeout: float,
        *,
        notice: Notice | None = None,
    ) -> AssistantTurn:
        """Record, then reply from the script."""
        self.seen.append([tool.name for tool in tools])
        return await super().complete(messages, tools, timeout, notice=notice)


async def test_a_batch_keeps_its_snapshot_and_the_advisory_comes_with_the_next_call(
    tmp_path: Path, mcp: McpTools
) -> None:
    model = RecordingProvider.from_replies(
        [reply(call("srv__mutate"), call("srv__plain", text="x")), reply(text="done")]
    )
    assert isinstance(model, RecordingProvider)
    store = await open_sqlite(tmp_path / "k.db")
    sup = Supervisor(Runtime(store=store, model=model, tools=mcp.source))
    prompter = ScriptedPrompter([DecisionKind.APPROVE])
    try:
        live = await sup.start_turn("change the tools", requested_by="U0REQ", prompter=prompter)
        async with asyncio.timeout(20):
            state = await sup.wait(live)
        records = await store.load(live.run_id)
    finally:
        await store.close()
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    results = {r.entry.tool: r.entry for r in records if isinstance(r.entry, ToolResultEntry)}
    assert results["srv__mutate"].output == "mutated"
    assert results["srv__plain"].is_error
    assert "Unknown tool: plain" in results["srv__plain"].output
    assert [request.tool for request in prompter.asked] == ["srv__plain"]
    kinds = [r.entry.kind for r in records]
    turns = [i for i, kind in enumerate(kinds) if kind == "assistant_turn"]
    advisories = [r.entry for r in records if isinstance(r.entry, AdvisoryEntry)]
    assert [a.text for a in advisories] == [CHANGE]
    assert kinds.index("advisory") == turns[1] - 1
    assert "srv__plain" in model.seen[0] and "srv__extra" not in model.seen[0]
    assert "srv__extra" in model.seen[1] and "srv__plain" not in model.seen[1]


def test_names_fit_the_model_alphabet_and_stay_distinct() -> None:
    assert tool_name("ops", "scale") == "ops__scale"
    dotted, underscored = tool_name("ops", "db.query"), tool_name("ops", "db_query")
    assert dotted.startswith("ops__db_query_") and dotted != underscored
    long = tool_name("a" * 24, "t" * 100)
    assert len(long) == 64 and long == tool_name("a" * 24, "t" * 100)
    assert tool_name("ops", "x" * 70) != tool_name("ops", "x" * 71)


def test_flags_follow_the_hints_and_the_confirm_list() -> None:
    read_only = types.ToolAnnotations(read_only_hint=True)
    idempotent = types.ToolAnnotations(idempotent_hint=True, destructive_hint=False)
    assert not tool_flags(read_only, gated=False, timeout=5).approval.confirm
    assert tool_flags(read_only, gated=True, timeout=5).approval.confirm
    assert tool_flags(idempotent, gated=False, timeout=5).traits.idempotent
    assert tool_flags(None, gated=False, timeout=5).approval.confirm
    assert tool_flags(types.ToolAnnotations(), gated=False, timeout=5).approval.confirm


def test_content_parts_are_rendered_as_text_or_summaries() -> None:
    resource = types.TextResourceContents(uri="file:///a.txt", text="alpha")
    result = types.CallToolResult(
        content=[
            types.TextContent(text="one"),
            types.ImageContent(data="", mime_type="image/png"),
            types.EmbeddedResource(resource=resource),
        ]
    )
    assert render(result) == "one\n[image: image/png]\n[resource: file:///a.txt]\nalpha"
    assert render(types.CallToolResult(content=[], structured_content={"n": 1})) == '{"n": 1}'


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"transport": "stdio"}, "a stdio server needs command"),
        ({"transport": "http"}, "an http server needs url"),
        ({"transport": "http", "url": "http://x", "command": ["y"]}, "are for stdio servers"),
        (
            {"transport": "stdio", "command": ["y"], "name": "Bad Name"},
            "name: must be a string matching",
        ),
        ({"transport": "stdio", "command": ["y"], "extra": 1}, "extra: unknown key"),
        ({"transport": "stdio", "command": ["y"], "name": "srv\n"}, "name: must be a string"),
    ],
)
def test_server_settings_are_checked(values: dict[str, Any], problem: str) -> None:
    with pytest.raises(Invalid, match=problem):
        convert({"name": "srv"} | values, McpServerSettings)


RAW_SERVER = Path(__file__).resolve().parents[2] / "fakes" / "raw_mcp_server.py"
READ_ONLY_HINTS = {"readOnlyHint": True}


def raw_server(*tools: dict[str, Any]) -> McpSource:
    """A server listing exactly ``tools`` (which the SDK's server would not list)."""
    listed = json.dumps([{"inputSchema": {"type": "object"}} | tool for tool in tools])
    return McpSource(settings(command=[sys.executable, str(RAW_SERVER), listed]))


@pytest.mark.parametrize(
    "broken",
    [
        {"type": "object", "properties": {"x": {"type": "nonsense"}}},
        # Valid as a schema, but its first call failed in the validator: the run panicked.
        {"type": "object", "properties": {"x": {"$ref": "#/$defs/nowhere"}}},
    ],
)
async def test_a_tool_whose_schema_is_not_json_schema_is_left_out_with_why(
    caplog: pytest.LogCaptureFixture, broken: dict[str, Any]
) -> None:
    tools = McpTools([], [raw_server({"name": "bad", "inputSchema": broken}, {"name": "good"})])
    await tools.start()
    try:
        current = tools.source.current()
        assert "srv__bad" not in current
        assert (await call_tool(tools, "srv__good")).output == "ok good"
    finally:
        await tools.close()
    assert "srv: tool 'bad' left out: its inputSchema is not valid JSON Schema" in caplog.text


async def test_a_server_listing_one_name_twice_fails_start_saying_so() -> None:
    twice = raw_server(
        {"name": "dup", "annotations": READ_ONLY_HINTS}, {"name": "dup", "annotations": {}}
    )
    with pytest.raises(McpStartError, match=r"MCP server srv: cannot start: .*'dup' twice"):
        await McpTools([], [twice]).start()


def test_a_server_s_stray_stdout_lines_are_said_once_named_and_guarded(tmp_path: Path) -> None:
    # A server that logs on stdout: the SDK printed an error of its own for each such line,
    # even at a one-shot command's level (error), naming no server, and with what the line
    # held (an address, a key) as the PII guard never read it.
    from tests.bot.cli.test_cli import kestrel, write_config

    peek = {"name": "peek", "inputSchema": {"type": "object"}, "annotations": READ_ONLY_HINTS}
    tools = json.dumps([peek])
    stray = "handled by oncall.lead@example.com"
    command = [sys.executable, str(RAW_SERVER), tools, stray]
    (tmp_path / "script.yaml").write_text(
        json.dumps([{"text": "looking", "calls": [{"name": "srv__peek"}]}, {"text": "done"}])
    )
    write_config(
        tmp_path,
        tools=[],
        model={"provider": "scripted", "script": "script.yaml"},
        mcp_servers=[{"name": "srv", "transport": "stdio", "command": command}],
    )

    quiet = kestrel(tmp_path, "run", "go")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "done\n"
    assert "example.com" not in quiet.stderr and "JSONRPC" not in quiet.stderr, quiet.stderr

    heard = kestrel(tmp_path, "--log-level", "info", "run", "go")
    said = [line for line in heard.stderr.splitlines() if "example.com" in line or "stdout" in line]
    assert "example.com" not in heard.stderr and "Traceback" not in heard.stderr, heard.stderr
    assert said[0].split(" ", 1)[1] == (
        "WARNING kestrel.mcp: MCP server srv wrote a line on its stdout that is no JSON-RPC"
        " message (its own logs belong on stderr); it is dropped, as each such line, logged at"
        " info: handled by <EMAIL_ADDRESS>"
    ), said
    # One per answer (initialize, the listing, the call): the first a warning, the rest info.
    assert [line.split(" ", 2)[1] for line in said] == ["WARNING", "INFO", "INFO"], said
    assert said[1].endswith(
        "INFO kestrel.mcp: MCP server srv: on stdout: handled by <EMAIL_ADDRESS>"
    )


def test_a_server_s_own_error_reaches_the_model_not_taken_for_a_closed_connection(
    tmp_path: Path,
) -> None:
    # -32000 is the SDK's code for a connection closed and the first of JSON-RPC's codes for a
    # server's own errors: a server's "rate limited" under it reached the model as "the
    # connection closed before it answered", its own words lost.
    from tests.bot.cli.test_cli import kestrel, write_config

    peek = {"name": "peek", "inputSchema": {"type": "object"}, "annotations": READ_ONLY_HINTS}
    command = [sys.executable, str(RAW_SERVER), json.dumps([peek])]
    call = {"name": "srv__peek", "arguments": {"error": "rate limited: retry in 60 s"}}
    (tmp_path / "script.yaml").write_text(
        json.dumps([{"text": "looking", "calls": [call]}, {"text": "done"}])
    )
    write_config(
        tmp_path,
        tools=[],
        model={"provider": "scripted", "script": "script.yaml"},
        mcp_servers=[{"name": "srv", "transport": "stdio", "command": command}],
    )

    ran = kestrel(tmp_path, "run", "go", "--json")

    assert ran.returncode == 0, ran.stderr
    shown = kestrel(tmp_path, "runs", "show", json.loads(ran.stdout)["run_id"]).stdout
    (result,) = [line.strip() for line in shown.splitlines() if "result call_1" in line]
    assert result == "result call_1: MCP server srv: peek: MCPError: rate limited: retry in 60 s"


def test_tools_list_says_which_tools_a_server_lists_are_left_out_and_why(
    tmp_path: Path,
) -> None:
    # A tool of megabytes went to the model with every request, and checking its schema held
    # the event loop for seconds; one left out (too large, or its schema invalid) was silently
    # missing from `tools list`, at a one-shot command's level (error).
    from tests.bot.cli.test_cli import kestrel, write_config

    words = {f"p{i}": {"type": "string", "description": "x" * 40} for i in range(1000)}
    tools = [
        {"name": "fine", "inputSchema": {"type": "object"}},
        {"name": "chatty", "description": "d" * 40_000, "inputSchema": {"type": "object"}},
        {"name": "sprawling", "inputSchema": {"type": "object", "properties": words}},
        {"name": "bad", "inputSchema": {"type": "object", "properties": {"x": {"type": "no"}}}},
    ]
    command = [sys.executable, str(RAW_SERVER), json.dumps(tools)]
    write_config(
        tmp_path, tools=[], mcp_servers=[{"name": "srv", "transport": "stdio", "command": command}]
    )

    listed = kestrel(tmp_path, "tools", "list")

    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert [name for name in names if name.startswith("srv__")] == ["srv__fine"], names
    said = [line.split(" ", 1)[1] for line in listed.stderr.splitlines()]
    sprawling = len(json.dumps(tools[2]["inputSchema"]))
    assert said[:2] == [
        "WARNING kestrel.mcp: MCP server srv: tool 'chatty' left out: its description and"
        " inputSchema are 40018 characters, over 32768 (every request to the model would carry"
        " them)",
        f"WARNING kestrel.mcp: MCP server srv: tool 'sprawling' left out: its description and"
        f" inputSchema are {sprawling} characters, over 32768 (every request to the model would"
        " carry them)",
    ], listed.stderr
    assert said[2].startswith(
        "WARNING kestrel.mcp: MCP server srv: tool 'bad' left out: its inputSchema is not valid"
    ), listed.stderr
    assert len(said) == 3, listed.stderr


async def test_a_huge_result_is_cut_to_the_output_cap_with_a_marker() -> None:
    tools = McpTools([], [raw_server({"name": "big", "annotations": READ_ONLY_HINTS})])
    await tools.start()
    try:
        result = await call_tool(tools, "srv__big", text="y", times=5_000_000)
    finally:
        await tools.close()
    cap = DEFAULT_MAX_OUTPUT
    assert result.output.startswith("y" * cap)
    assert len(result.output) < cap + 200
    assert result.output.endswith(f"[output truncated: 5000000 bytes total, first {cap} shown]")


async def test_a_server_that_dies_at_start_says_why_in_the_log_not_on_stderr(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger="kestrel.mcp")
    dying = "import sys; sys.stderr.write('boom: no config\\n'); sys.exit(3)"
    tools = McpTools([], [McpSource(settings(command=[sys.executable, "-c", dying]))])
    with pytest.raises(McpStartError, match=r"cannot start: .*\(its stderr: boom: no config\)"):
        await tools.start()

    assert "boom" not in capfd.readouterr().err  # a JSON log stays JSON
    assert "MCP server srv: boom: no config" in caplog.text


async def test_a_server_s_stderr_is_logged_as_the_pii_guard_leaves_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Servers log what they were asked and what they found; the model reads that redacted, and
    # the log, the one line of a server that died at start included, must not hold more.
    caplog.set_level(logging.INFO, logger="kestrel.mcp")
    said = "sys.stderr.write('login alice@example.com key AKIAZ4XQ7PLM3RT5VW2N\\n')"
    dying = f"import sys; {said}; sys.exit(3)"
    configured = Settings(tools=[], mcp_servers=[settings(command=[sys.executable, "-c", dying])])
    with pytest.raises(ConfigError) as refused:
        async with tool_source(configured, checked=False):
            pass
    assert "its stderr: login <EMAIL_ADDRESS> key <AWS_ACCESS_KEY>" in str(refused.value)
    assert "MCP server srv: login <EMAIL_ADDRESS> key <AWS_ACCESS_KEY>" in caplog.text
    assert "alice@example.com" not in caplog.text + str(refused.value)


# A generated key: mixed case and digits, no word the guard could take for prose.
_KEY = "sk-proj-" + "Ab3dEf6hIj9lMn2pQr5tUv8xYz1bCd4fGh7jKl0nPq3sTv6wXy9zA2cE5gH8kM1p"


def _stderr_lines() -> tuple[Any, list[str]]:
    from bot.pii.guard import PiiGuard, PiiMode, PiiSettings
    from bot.tools.mcp_stderr import _Lines

    guard = PiiGuard(PiiSettings(mode=PiiMode.REDACT))
    return _Lines("srv", lambda text: guard.scan_output(text).text), []


async def test_a_server_s_long_stderr_line_is_not_cut_inside_a_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The line was cut at its 2000th byte before the guard read it: a key across the cut kept
    # a first part too short to be known by, and reached the log.
    from bot.tools.mcp_stderr import MAX_LINE

    caplog.set_level(logging.INFO, logger="kestrel.mcp")
    lines, _ = _stderr_lines()
    lines.data_received(("a" * (MAX_LINE - 40) + " token " + _KEY + " ok\n").encode())
    assert "MCP server srv: aaa" in caplog.text
    assert _KEY[:30] not in caplog.text


async def test_a_server_s_stderr_line_with_no_end_in_sight_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A line longer than the pipe's read was logged in pieces: the piece after the cut began
    # with whatever lay there, a key's tail without the prefix that names it.
    caplog.set_level(logging.INFO, logger="kestrel.mcp")
    lines, _ = _stderr_lines()
    lines.data_received(b"b" * 4000 + b" token " + _KEY[:20].encode())
    lines.data_received(_KEY[20:].encode() + b" done\nnext line\n")
    assert "MCP server srv: bbb" in caplog.text
    assert "MCP server srv: next line" in caplog.text
    assert _KEY[20:40] not in caplog.text


async def test_a_server_that_crashes_is_connected_again_and_answers(
    mcp: McpTools, caplog: pytest.LogCaptureFixture
) -> None:
    assert (await call_tool(mcp, "srv__lookup", key="a")).output == "value of a"

    crashed = await call_tool(mcp, "srv__crash")

    # Cut off mid-call, as a timeout cuts it: the model must not take it for undone.
    assert crashed.is_error
    assert "the connection closed before it answered" in crashed.output
    assert "what it did, if anything, stands" in crashed.output
    refused: list[str] = []

    async def answered() -> bool:
        result = await call_tool(mcp, "srv__lookup", key="b")
        if result.is_error:
            refused.append(result.output)
        return result.output == "value of b"

    # The source connects again after its first wait (1 s); calls meanwhile are refused.
    await until(answered, timeout=10)
    assert all("not connected" in r or "connection closed" in r for r in refused), refused
    assert "MCP server srv: the session ended" in caplog.text
    assert "MCP server srv: connected again" in caplog.text


async def test_a_server_that_closes_its_stderr_is_not_taken_for_dead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kestrel.mcp")
    quiet = f"import os, runpy; os.close(2); runpy.run_path({str(SERVER)!r}, run_name='__main__')"
    tools = McpTools([], [McpSource(settings(command=[sys.executable, "-c", quiet]))])
    await tools.start()
    try:
        await until(lambda: "srv closed its stderr and still answers" in caplog.text, timeout=10)
        assert (await call_tool(tools, "srv__lookup", key="a")).output == "value of a"
    finally:
        await tools.close()
    assert "the session ended" not in caplog.text


async def test_close_does_not_wait_on_a_server_that_hangs_when_connected_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kestrel.mcp")
    marker = tmp_path / "started"
    once = (
        "import pathlib, runpy, sys, time; m = pathlib.Path(sys.argv[1])\n"
        "if m.exists(): print('hanging', file=sys.stderr, flush=True); time.sleep(600)\n"
        f"m.touch(); runpy.run_path({str(SERVER)!r}, run_name='__main__')"
    )
    tools = McpTools([], [McpSource(settings(command=[sys.executable, "-c", once, str(marker)]))])
    await tools.start()
    try:
        assert (await call_tool(tools, "srv__crash")).is_error
        await until(lambda: "MCP server srv: hanging" in caplog.text)
    finally:
        started = time.monotonic()
        await tools.close()
    # Cut short, not waited on for CLOSE_SECONDS (a shutdown's grace is for the runs).
    assert time.monotonic() - started < CLOSE_SECONDS / 2


async def test_a_server_that_dies_soon_after_each_start_is_waited_on_longer_each_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "started"
    # Up at once, every time, and dead a moment later: it keeps failing.
    brief = (
        "import os, pathlib, runpy, sys, threading; m = pathlib.Path(sys.argv[1])\n"
        "if m.exists(): threading.Timer(2, os._exit, [1]).start()\n"
        f"m.touch(); runpy.run_path({str(SERVER)!r}, run_name='__main__')"
    )
    tools = McpTools([], [McpSource(settings(command=[sys.executable, "-c", brief, str(marker)]))])
    await tools.start()
    try:
        assert (await call_tool(tools, "srv__crash")).is_error
        await until(lambda: "connecting again in 5s" in caplog.text, timeout=20)
    finally:
        await tools.close()


async def _http_server(port: int) -> asyncio.subprocess.Process:
    """The fake server over streamable HTTP on ``port``, once it takes connections."""
    serve = (
        f"import runpy, sys; g = runpy.run_path({str(SERVER)!r}); "
        f"g['server'].run('streamable-http', host='127.0.0.1', port={port})"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        serve,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )

    async def listening() -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        return True

    await until(listening, timeout=15)
    return process


async def test_an_http_server_restarted_while_idle_is_connected_again() -> None:
    # Redeployed between two calls: the server no longer knows Kestrel's session, and says so
    # to every request of it ("Session not found"); nothing else tells the client it is gone.
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = await _http_server(port)
    url = f"http://127.0.0.1:{port}/mcp"
    tools = McpTools([], [McpSource(settings(transport="http", url=url, command=[]))])
    try:
        await tools.start()
        assert (await call_tool(tools, "srv__lookup", key="a")).output == "value of a"
        server.kill()
        await server.wait()
        server = await _http_server(port)

        async def answered() -> bool:
            return (await call_tool(tools, "srv__lookup", key="b")).output == "value of b"

        await until(answered, timeout=10)
    finally:
        await tools.close()
        server.kill()
        await server.wait()


@pytest.mark.parametrize("form", ["text", "json"])
async def test_an_http_servers_token_in_its_url_is_not_logged(form: str) -> None:
    # A server's URL may carry its credential in the query (?token=); the HTTP client logs
    # each request's URL at info, the chart's and the unit's level.
    import io
    import socket

    from bot import logs

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = await _http_server(port)
    url = f"http://127.0.0.1:{port}/mcp?token={MCP_TOKEN}&region=eu"
    tools = McpTools([], [McpSource(settings(transport="http", url=url, command=[]))])
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    logs.configure(logging.INFO, form, stream)
    try:
        await tools.start()
        assert (await call_tool(tools, "srv__lookup", key="a")).output == "value of a"
    finally:
        await tools.close()
        server.kill()
        await server.wait()
        root.handlers[:] = handlers
        root.setLevel(level)
    said = stream.getvalue()
    assert "/mcp?token=…&region=eu" in said, said  # the request is still logged
    assert MCP_TOKEN not in said


MCP_TOKEN = "Mcp-T0ken-4e5f6a"


async def test_servers_that_outlive_their_stdin_are_closed_side_by_side() -> None:
    # A server that ignores its stdin closing and SIGTERM is killed only after the stdio
    # client's waits (some seconds); one after another, three of them held a SIGTERM'd serve
    # past a pod's grace with a few more.
    stubborn = (
        "import runpy, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"runpy.run_path({str(SERVER)!r}, run_name='__main__'); time.sleep(600)"
    )
    one = McpTools([], [McpSource(settings(command=[sys.executable, "-c", stubborn]))])
    await one.start()
    started = time.monotonic()
    await one.close()
    alone = time.monotonic() - started

    sources = [
        McpSource(settings(name=f"srv{i}", command=[sys.executable, "-c", stubborn]))
        for i in range(3)
    ]
    three = McpTools([], sources)
    await three.start()
    started = time.monotonic()
    await three.close()

    assert time.monotonic() - started < 2 * alone


async def test_a_server_s_descriptions_reach_the_model_as_the_pii_guard_leaves_them(
    tmp_path: Path,
) -> None:
    from bot.config.settings import ModelSettings, Secret
    from tests.fakes.mcp_server import LEAKY_EMAIL, LEAKY_KEY, LEAKY_PASSWORD
    from tests.fakes.openai_server import FakeOpenAI

    leaky = settings(command=[sys.executable, str(SERVER), "--leaky"])
    async with FakeOpenAI([{"text": "done"}]) as fake:
        config = Settings(
            database=str(tmp_path / "k.db"),
            tools=[],
            mcp_servers=[leaky],
            model=ModelSettings(provider="openai", name="m", max_retries=0),
            openai_api_key=Secret("k"),
            openai_base_url=fake.base_url,
        )
        async with runtime(config) as rt:
            sup = Supervisor(rt)
            state = await sup.wait(await sup.start_turn("deploy it", requested_by="U0REQ"))

    assert state.result is not None and state.result.text == "done"
    (request,) = fake.requests
    sent = json.dumps(request)
    for secret in (LEAKY_KEY, LEAKY_PASSWORD, LEAKY_EMAIL):
        assert secret not in sent
    (deploy,) = [t["function"] for t in request["tools"] if t["function"]["name"] == "srv__deploy"]
    assert deploy["description"] == (
        "Deploy a target. Uses API key <OPENAI_API_KEY>; questions to <EMAIL_ADDRESS>."
    )
    target = deploy["parameters"]["properties"]["target"]
    assert target["description"] == (
        "A URL such as https://deploy:<CONNECTION_STRING_PASSWORD>@ci.example.net/x"
    )
    assert target["type"] == "string" and deploy["parameters"]["required"] == ["target"]


def test_only_a_schema_s_words_for_people_are_guarded_never_what_validates() -> None:
    from bot.tools.mcp import guarded_schema

    schema = {
        "type": "object",
        "title": "secret words",
        "properties": {
            "description": {"type": "string", "enum": ["secret a"], "description": "secret b"},
            "mode": {"const": "secret c", "default": "secret d", "examples": [{"x": "secret e"}]},
        },
        "$defs": {"title": {"pattern": "^secret$", "$comment": "secret f"}},
        "required": ["description"],
    }

    guarded = guarded_schema(schema, lambda text: text.replace("secret", "<X>"))

    assert guarded == {
        "type": "object",
        "title": "<X> words",
        "properties": {
            "description": {"type": "string", "enum": ["secret a"], "description": "<X> b"},
            "mode": {"const": "secret c", "default": "<X> d", "examples": [{"x": "<X> e"}]},
        },
        "$defs": {"title": {"pattern": "^secret$", "$comment": "<X> f"}},
        "required": ["description"],
    }


_DIGEST_OF_LEAKY = """
import asyncio, sys
from bot.cli.compose import tool_source
from bot.config.settings import McpServerSettings, Settings
from bot.pii.settings import OperatorSpec, PiiSettings

async def main() -> None:
    server = McpServerSettings(name="srv", transport="stdio", command=sys.argv[1:], timeout=15)
    pii = PiiSettings(operators={"EMAIL_ADDRESS": OperatorSpec(type="hash")})
    config = Settings(database=":memory:", tools=[], mcp_servers=[server], pii=pii)
    async with tool_source(config) as source:
        toolset = source.current()
        print(toolset.digest(), toolset.get("srv__deploy").description)

asyncio.run(main())
"""


def test_a_hashed_description_reads_the_same_in_every_process(tmp_path: Path) -> None:
    # The process's random salt hashed a description differently in each process: the tool
    # set's digest changed with it, and a suspended run's resume was refused as a change.
    import subprocess

    argv = [sys.executable, "-c", _DIGEST_OF_LEAKY, sys.executable, str(SERVER), "--leaky"]
    first, second = (
        subprocess.run(argv, capture_output=True, text=True, check=True, cwd=tmp_path).stdout
        for _ in range(2)
    )

    assert first == second
    assert "questions to <EMAIL_ADDRESS>." in first
