"""CommandTool: whole-element substitution, no shell, minimal env, group kill, output cap."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bot.tools.base import ToolContext
from bot.tools.command import CommandTool, placeholder
from tests.fakes.processes import grandchild_tool, wait_dead

PY = sys.executable
ARGV_SCRIPT = "import json, sys; print(json.dumps(sys.argv[1:]))"
ENV_SCRIPT = "import json, os; print(json.dumps(dict(os.environ)))"
CTX = ToolContext(run_id="run_1", call_id="call_1")

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "unit": {"type": "string"},
        "since": {"type": "string"},
        "force": {"type": "boolean"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
    },
    "required": ["unit"],
}


def argv_tool(*elements: str, **kwargs: Any) -> CommandTool:
    return CommandTool(
        "argv", "print argv", [PY, "-c", ARGV_SCRIPT, *elements], parameters=SCHEMA, **kwargs
    )


def printed(output: str) -> Any:
    return json.loads(output.splitlines()[0])


async def test_whole_element_substitution() -> None:
    tool = argv_tool("--unit", "{unit}", "{force}", "{count}", "{ratio}")
    result = await tool.call({"unit": "a b", "force": True, "count": 3, "ratio": 1.5}, CTX)
    assert printed(result.output) == ["--unit", "a b", "true", "3", "1.5"]


async def test_absent_optional_parameter_drops_its_element() -> None:
    tool = argv_tool("{unit}", "--since", "{since}", "end")
    result = await tool.call({"unit": "nginx"}, CTX)
    assert printed(result.output) == ["nginx", "--since", "end"]


async def test_missing_required_argument_is_an_error() -> None:
    result = await argv_tool("{unit}").call({}, CTX)
    assert result.is_error
    assert "unit" in result.output


async def test_non_scalar_argument_is_an_error() -> None:
    result = await argv_tool("{unit}").call({"unit": ["a", "b"]}, CTX)
    assert result.is_error


def test_the_tool_keeps_its_own_copy_of_its_parameters() -> None:
    given = {
        "type": "object",
        "properties": {"unit": {"type": "string", "enum": ["a", "b"]}, "n": {"type": "integer"}},
        "required": ["unit"],
        "examples": [({"unit": "a"},)],
    }
    tool = CommandTool("t", "d", ["/bin/echo", "{unit}"], parameters=given)
    given["properties"]["unit"]["enum"].append("c")  # type: ignore[index]
    given["required"].append("n")  # type: ignore[attr-defined]
    given["examples"][0][0]["unit"] = "b"  # type: ignore[index]
    assert tool.parameters["properties"]["unit"]["enum"] == ["a", "b"]
    assert tool.parameters["required"] == ["unit"]
    assert tool.parameters["examples"] == [({"unit": "a"},)]


def test_embedded_placeholder_is_refused() -> None:
    with pytest.raises(ValueError, match="whole argv element"):
        argv_tool("--unit={unit}")


@pytest.mark.parametrize("element", ["{unit", "unit}", "{unit}}", "{{unit}", "--unit={unit", "}{"])
def test_a_brace_without_its_pair_is_refused(element: str) -> None:
    with pytest.raises(ValueError, match=f"command.3.: {re.escape(repr(element))} .*whole argv"):
        argv_tool(element)


@pytest.mark.parametrize("element", ["{}", "{print $1}", "{{.Names}}", "{.items[*]}", "f({})"])
async def test_paired_braces_are_literal_text(element: str) -> None:
    assert printed((await argv_tool(element).call({}, CTX)).output) == [element]


def test_placeholder_program_is_refused() -> None:
    with pytest.raises(ValueError, match="program"):
        CommandTool("x", "x", ["{unit}"], parameters=SCHEMA)


def test_undeclared_placeholder_is_refused() -> None:
    with pytest.raises(ValueError, match="not a declared parameter"):
        argv_tool("{nope}")


async def test_a_value_that_looks_like_an_option_is_refused_before_anything_runs() -> None:
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    tool = CommandTool("ls", "list", ["ls", "{path}"], parameters=schema)
    result = await tool.call({"path": "--version"}, CTX)
    assert result.is_error
    assert result.output == (
        "argument 'path' must not start with '-': the program would read it as an option"
    )
    assert tool.argument_errors({"path": "--version"}) == [result.output]


async def test_after_a_literal_double_dash_a_dash_value_is_an_operand() -> None:
    result = await argv_tool("--", "{unit}").call({"unit": "--version"}, CTX)
    assert printed(result.output) == ["--", "--version"]


async def test_allow_leading_dash_admits_the_named_parameter_only() -> None:
    tool = argv_tool("{count}", "{unit}", allow_leading_dash=["count"])
    assert printed((await tool.call({"count": -3, "unit": "a"}, CTX)).output) == ["-3", "a"]
    assert tool.argument_errors({"count": -3, "unit": "-a"}) == [
        "argument 'unit' must not start with '-': the program would read it as an option"
    ]


def test_allow_leading_dash_must_name_a_parameter() -> None:
    with pytest.raises(ValueError, match="allow_leading_dash: 'nope' is not a declared parameter"):
        argv_tool("{unit}", allow_leading_dash=["nope"])


def test_a_required_name_must_be_a_declared_parameter() -> None:
    schema = {**SCHEMA, "required": ["unit", "unti"]}
    message = "parameters.required.1.: 'unti' is required but is not a declared parameter"
    with pytest.raises(ValueError, match=message):
        CommandTool("x", "x", ["true", "{unit}"], parameters=schema)


def test_argument_errors_give_one_line_per_argument() -> None:
    tool = argv_tool("{unit}", "{since}")
    assert tool.argument_errors({"unit": ["a"], "since": "x\0y"}) == [
        "unit: ['a'] is not of type 'string'",
        "argument 'since' contains a NUL byte",
    ]


def test_a_long_argument_refused_is_quoted_only_so_far() -> None:
    schema = {
        "type": "object",
        "properties": {"unit": {"type": "string", "maxLength": 64, "pattern": "^[a-z-]+$"}},
    }
    tool = CommandTool("x", "x", ["true", "{unit}"], parameters=schema)
    problems = tool.argument_errors({"unit": "payments-db;" + "x" * 100_000})
    assert problems[0] == "unit: 100012 characters, more than the 64 allowed"
    assert problems[1] == "unit: 'payments-db;" + "x" * 66 + "… does not match '^[a-z-]+$'"


def test_a_pattern_re2_cannot_run_or_pattern_properties_is_refused() -> None:
    backreference = {"type": "object", "properties": {"unit": {"pattern": r"(a)\1"}}}
    with pytest.raises(ValueError, match=r"parameters.properties.unit.pattern: .* linear time"):
        CommandTool("x", "x", ["true"], parameters=backreference)
    by_pattern = {"type": "object", "patternProperties": {"^a": {}}}
    with pytest.raises(ValueError, match="patternProperties is not supported"):
        CommandTool("x", "x", ["true"], parameters=by_pattern)


async def test_no_shell_argument_arrives_as_one_literal_element(tmp_path: Path) -> None:
    hostile = "; rm -rf / $(touch pwned) `id` | cat > x"
    result = await argv_tool("{unit}").call({"unit": hostile}, CTX)
    assert printed(result.output) == [hostile]
    assert not (tmp_path / "pwned").exists()


async def test_child_sees_only_the_minimal_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("ALLOWED_VAR", "visible")
    tool = CommandTool("env", "env", [PY, "-c", ENV_SCRIPT], env=["ALLOWED_VAR", "UNSET_VAR"])
    env = printed((await tool.call({}, CTX)).output)
    assert "SECRET_TOKEN" not in env
    assert env["ALLOWED_VAR"] == "visible"
    assert set(env) == {"PATH", "LANG", "HOME", "ALLOWED_VAR"}
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert env["LANG"] == "C.UTF-8"


async def test_cwd_from_context_then_tool(tmp_path: Path) -> None:
    script = "import os; print(os.getcwd())"
    (tmp_path / "a").mkdir()
    tool = CommandTool("cwd", "cwd", [PY, "-c", script], cwd=tmp_path / "a")
    assert (await tool.call({}, CTX)).output.startswith(f"{tmp_path / 'a'}\n")
    ctx = ToolContext(run_id="r", call_id="c", workdir=tmp_path)
    assert (await tool.call({}, ctx)).output.startswith(f"{tmp_path}\n")


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    tool = grandchild_tool("spawner", "wait", timeout=0.5)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await tool.call({"pidfile": str(pidfile)}, CTX)
    assert time.monotonic() - started < 3
    grandchild = int(pidfile.read_text())
    assert await wait_dead(grandchild)


async def test_grandchild_holding_the_pipe_is_killed_after_the_child_exits(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "pid"
    tool = grandchild_tool("leaver", "echo done")
    started = time.monotonic()
    result = await tool.call({"pidfile": str(pidfile)}, CTX)
    assert time.monotonic() - started < 3
    assert result.output == "done\n[exit status 0]"
    assert await wait_dead(int(pidfile.read_text()))


async def test_output_is_capped_with_a_marker_and_the_child_is_not_blocked() -> None:
    script = "import sys; sys.stdout.buffer.write(b'x' * 1048576); sys.stdout.flush()"
    tool = CommandTool("flood", "flood", [PY, "-c", script], max_output=1000)
    async with asyncio.timeout(10):
        result = await tool.call({}, CTX)
    marker = "\n[output truncated: 1048576 bytes total, first 1000 shown]\n"
    assert result.output == "x" * 1000 + marker + "[exit status 0]"
    assert not result.is_error


async def test_a_cut_output_ends_at_a_line_not_inside_a_key() -> None:
    # The cap falls inside the key: its first half alone is too short for the PII guard to
    # know, so the cut goes back to the end of the last whole line.
    script = "import sys; sys.stdout.write('x' * 980 + '\\nkey AKIAZ4XQ7PLM3RT5VW2N\\n' * 9)"
    tool = CommandTool("keys", "keys", [PY, "-c", script], max_output=1000)
    result = await tool.call({}, CTX)
    marker = "\n[output truncated: 1214 bytes total, first 981 shown]\n"
    assert result.output == "x" * 980 + marker + "[exit status 0]"


async def test_stderr_is_merged_into_the_output() -> None:
    script = "import sys; sys.stderr.write('oops\\n')"
    result = await CommandTool("err", "err", [PY, "-c", script]).call({}, CTX)
    assert result.output == "oops\n[exit status 0]"


async def test_non_zero_exit_is_an_answer_not_an_error() -> None:
    script = "import sys; print('gone'); sys.exit(3)"
    result = await CommandTool("fail", "fail", [PY, "-c", script]).call({}, CTX)
    assert not result.is_error
    assert result.output == "gone\n[exit status 3]"


async def test_missing_program_cannot_start() -> None:
    result = await CommandTool("ghost", "ghost", ["/nonexistent/prog"]).call({}, CTX)
    assert result.is_error
    assert result.output.startswith("cannot start '/nonexistent/prog'")


async def test_non_executable_program_cannot_start(tmp_path: Path) -> None:
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    result = await CommandTool("noexec", "noexec", [str(script)]).call({}, CTX)
    assert result.is_error
    assert "cannot start" in result.output


PLACEHOLDER_FORMS = [
    "{a}",
    "{_}",
    "{unit}",
    "{A_9-x}",
    "{a-}",
    "{-a}",
    "{9a}",
    "{}",
    "{a b}",
    "{é}",
    "{a.b}",
    "x{a}",
    "{a}x",
    "{{a}}",
    "{a",
    "a}",
    "{",
    "}",
    "",
    "{a}\n",
    "{ab\u0661}",
    "{\u212a}",
]


@pytest.mark.parametrize("element", PLACEHOLDER_FORMS)
def test_a_placeholder_is_read_as_the_documented_pattern_reads_it(element: str) -> None:
    documented = re.fullmatch(r"\{([A-Za-z_][A-Za-z0-9_-]*)\}", element)
    assert placeholder(element) == (documented.group(1) if documented else None)


def left_behind(path: str) -> bool:
    return os.path.lexists(path)


HOME_SCRIPT = "import os, pathlib; h = os.environ['HOME']; {write}print(h, oct(os.stat(h).st_mode))"


@pytest.mark.parametrize("writes", [False, True])
async def test_each_call_has_a_private_home_that_is_removed_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writes: bool
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    write = "os.mkdir(h + '/cache'); pathlib.Path(h, 'cache', 'x').write_text('1'); "
    tool = CommandTool(
        "home", "home", [PY, "-c", HOME_SCRIPT.format(write=write if writes else "")]
    )
    home, mode = (await tool.call({}, CTX)).output.split()[:2]
    assert Path(home).parent == tmp_path and Path(home).name.startswith("kestrel-home-")
    assert mode == "0o40700"
    assert not left_behind(home)


async def test_a_home_is_made_where_the_temporary_folder_is_not_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    tool = CommandTool("home", "home", [PY, "-c", HOME_SCRIPT.format(write="")])
    result = await tool.call({}, CTX)
    home = result.output.split()[0]
    assert not result.is_error and Path(home).name.startswith("kestrel-home-")
    assert not left_behind(home)


@pytest.mark.parametrize("variable", ["TEMP", "TMP"])
async def test_a_home_is_made_where_temp_or_tmp_says_without_tmpdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, str(tmp_path))
    tool = CommandTool("home", "home", [PY, "-c", HOME_SCRIPT.format(write="")])
    home = (await tool.call({}, CTX)).output.split()[0]
    assert Path(home).parent == tmp_path
