"""Hostile catalogs and arguments, as one table each: option injection, newlines, NUL, patterns
that backtrack or that RE2 cannot run, and names that clash across files or with a built-in."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bot.cli.commands import cli
from bot.tools.base import ToolContext
from bot.tools.catalog import CatalogError, check_catalogs, load_catalog, load_catalogs
from bot.tools.command import CommandTool
from bot.tools.toolset import ToolCollision, ToolSet
from tests.fakes.growth import assert_linear

PY = sys.executable
ARGV_SCRIPT = "import json, sys; print(json.dumps(sys.argv[1:]))"
CTX = ToolContext(run_id="run_1", call_id="call_1")
ROOT = Path(__file__).resolve().parents[3]
SHIPPED_PATTERN = "^[a-z0-9][a-z0-9@._-]*$"
# Python's re needs seconds for these on 25 characters; RE2 needs microseconds.
SLOW = "a" * 24 + "!"
SHORT = "a" * 3 + "!"  # SLOW is 6 times as long: a backtracking engine takes 2 ** 21 times as long
# (pattern, a value it matches); Python's re takes 1.2 to 7 seconds on SLOW for each.
CATASTROPHIC = [
    ("(a+)+$", "aaaa"),
    ("^(a|a?)+$", "aaaa"),
    ("^(a+)+b", "aab"),
    ("^(a*)*b", "aab"),
    ("^([a-z]+)*$", "abc"),
    ("^(\\w+\\s?)*$", "ab cd"),
]
OPTION = "must not start with '-'"


def argv_tool(*elements: str, schema: dict[str, Any] | None = None, **kwargs: Any) -> CommandTool:
    parameters = schema or {"type": "object", "properties": {"path": {"type": "string"}}}
    return CommandTool(
        "argv", "print argv", [PY, "-c", ARGV_SCRIPT, *elements], parameters=parameters, **kwargs
    )


def string_schema(pattern: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"path": {"type": "string", "pattern": pattern}}}


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def catalog(name: str = "lister", pattern: str | None = None, comment: str = "") -> str:
    """A one-tool catalog: its name on line 3 and its ``path`` parameter on line 9."""
    body = textwrap.dedent(
        f"""\
        tools:
          - name: {name}
            description: x
            command: ["ls", "{{path}}"]
            parameters:
              type: object
              properties:
                path: {{type: string}}
        """
    )
    if pattern is not None:
        body = body.replace(
            "{type: string}", "{type: string, pattern: " + json.dumps(pattern) + "}"
        )
    return f"# {comment}\n{body}"


# --- arguments -------------------------------------------------------------------------------

ARGUMENTS = [
    # (case, template after the program, value, allow_leading_dash, schema pattern, problem)
    ("long option", ["{path}"], "--version", [], None, OPTION),
    ("short options", ["{path}"], "-rf", [], None, OPTION),
    ("lone dash", ["{path}"], "-", [], None, OPTION),
    ("end of options as a value", ["{path}"], "--", [], None, OPTION),
    ("negative number", ["{path}"], -5, [], None, OPTION),
    ("dash after a literal option", ["--name", "{path}"], "-rf", [], None, OPTION),
    ("dash before a later --", ["{path}", "--"], "-rf", [], None, OPTION),
    ("dash after --", ["--", "{path}"], "--version", [], None, None),
    ("dash allowed by the catalog", ["{path}"], "-rf", ["path"], None, None),
    ("dash inside the value", ["{path}"], "a-b", [], None, None),
    ("NUL byte", ["{path}"], "a\0b", [], None, "contains a NUL byte"),
    ("NUL against a pattern", ["{path}"], "abc\0", [], "^[a-z]+$", "does not match"),
    ("trailing newline", ["{path}"], "checkout\n", [], "^[a-z]+$", "does not match"),
    ("leading newline", ["{path}"], "\ncheckout", [], "^[a-z]+$", "does not match"),
    ("inner newline", ["{path}"], "a\nb", [], "^[a-z]+$", "does not match"),
    ("lone surrogate", ["{path}"], "\ud800", [], "^[a-z]+$", "not valid Unicode"),
    ("shipped pattern: -rf", ["--", "{path}"], "-rf", [], SHIPPED_PATTERN, "does not match"),
    ("shipped pattern: newline", ["{path}"], "checkout\n", [], SHIPPED_PATTERN, "does not match"),
    ("shipped pattern: dot-dot", ["{path}"], "..", [], SHIPPED_PATTERN, "does not match"),
    ("shipped pattern: unit", ["{path}"], "foo@bar.service", [], SHIPPED_PATTERN, None),
]


@pytest.mark.parametrize(
    ("template", "value", "allow", "pattern", "problem"),
    [case[1:] for case in ARGUMENTS],
    ids=[case[0] for case in ARGUMENTS],
)
async def test_hostile_argument(
    template: list[str], value: Any, allow: list[str], pattern: str | None, problem: str | None
) -> None:
    schema = string_schema(pattern) if pattern else {"type": "object", "properties": {"path": {}}}
    tool = argv_tool(*template, schema=schema, allow_leading_dash=allow)
    problems = ToolSet([tool]).validate("argv", {"path": value})
    if problem is None:
        assert problems == []
        result = await tool.call({"path": value}, CTX)
        assert not result.is_error
        assert str(value) in json.loads(result.output.splitlines()[0])
        return
    assert len(problems) == 1, problems
    assert problem in problems[0]
    if pattern is None:
        # Even a call that skipped validation is refused, before anything runs.
        result = await tool.call({"path": value}, CTX)
        assert result.is_error
        assert problem in result.output


def test_the_option_error_is_one_clear_line() -> None:
    (problem,) = ToolSet([argv_tool("{path}")]).validate("argv", {"path": "--version"})
    assert problem == (
        "argument 'path' must not start with '-': the program would read it as an option"
    )


@pytest.mark.parametrize("pattern", [pattern for pattern, _ in CATASTROPHIC])
def test_catastrophic_pattern_returns_quickly(pattern: str) -> None:
    tools = ToolSet([argv_tool("{path}", schema=string_schema(pattern))])
    problems = tools.validate("argv", {"path": SLOW})
    assert problems and "does not match" in problems[0]
    assert_linear(
        lambda path: tools.validate("argv", {"path": path}), SHORT, SLOW, k=len(SLOW) / len(SHORT)
    )


@pytest.mark.parametrize(("pattern", "matching"), CATASTROPHIC)
def test_catastrophic_pattern_in_a_catalog_loads_and_answers_quickly(
    tmp_path: Path, pattern: str, matching: str
) -> None:
    (tool,) = load_catalog(write(tmp_path, "ops.yaml", catalog(pattern=pattern)))
    assert ToolSet([tool]).validate("lister", {"path": SLOW})
    assert ToolSet([tool]).validate("lister", {"path": matching}) == []
    tools = ToolSet([tool])
    assert_linear(
        lambda path: tools.validate("lister", {"path": path}), SHORT, SLOW, k=len(SLOW) / len(SHORT)
    )


# --- patterns RE2 cannot run -----------------------------------------------------------------

UNRUNNABLE = [
    ("backreference", r"^(a+)\1$"),
    ("named backreference", r"(?P<x>a)(?P=x)"),
    ("lookahead", r"^(?=.*\d)[a-z0-9]+$"),
    ("negative lookahead", r"^(?!-)[a-z]+$"),
    ("lookbehind", r"(?<=a)b"),
    ("possessive", r"a++"),
]


@pytest.mark.parametrize(
    "pattern", [case[1] for case in UNRUNNABLE], ids=[c[0] for c in UNRUNNABLE]
)
def test_pattern_re2_cannot_run_is_an_error_at_its_line(tmp_path: Path, pattern: str) -> None:
    path = write(tmp_path, "ops.yaml", catalog(pattern=pattern))
    (problem,) = check_catalogs([path])
    assert problem.startswith(
        f"{path}:9: tools[0].parameters.properties.path.pattern: tool 'lister': "
        f"pattern '{pattern}' cannot be checked in linear time ("  # as written, not escaped
    )
    assert "\n" not in problem
    with pytest.raises(CatalogError):
        load_catalog(path)
    with pytest.raises(ValueError, match="cannot be checked in linear time"):
        argv_tool("{path}", schema=string_schema(pattern))


def test_a_nested_pattern_re2_cannot_run_is_found(tmp_path: Path) -> None:
    text = catalog().replace(
        "path: {type: string}",
        'path: {anyOf: [{type: integer}, {type: string, pattern: "(a)\\\\1"}]}',
    )
    path = write(tmp_path, "ops.yaml", text)
    (problem,) = check_catalogs([path])
    assert problem.startswith(f"{path}:9: tools[0].parameters.properties.path.anyOf[1].pattern: ")


def test_pattern_properties_is_refused(tmp_path: Path) -> None:
    declared = "      properties:\n"
    text = catalog().replace(declared, '      patternProperties: {"(a+)+$": {}}\n' + declared)
    path = write(tmp_path, "ops.yaml", text)
    (problem,) = check_catalogs([path])
    assert problem.startswith(f"{path}:8: tools[0].parameters.patternProperties: tool 'lister': ")


# --- names across the set --------------------------------------------------------------------

BUILTIN = ["ask_human_input", "ask_human_select", "ask_human_confirm"]


def test_names_clashing_across_two_files_are_reported_by_check(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", catalog())
    second = write(tmp_path, "b.yaml", catalog(comment="another file\n# with two lines"))
    assert check_catalogs([first, second]) == [
        f"{second}:4: tool 'lister' is also declared at {first}:3"
    ]
    assert check_catalogs([first, first]) == []


def test_a_clash_is_found_while_the_other_file_has_problems(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", catalog())
    second = write(tmp_path, "b.yaml", catalog() + "  - name: other\n    descriptio: y\n")
    problems = check_catalogs([first, second])
    assert f"{second}:3: tool 'lister' is also declared at {first}:3" in problems
    assert f"{second}:11: tools[1].descriptio: unknown key (did you mean description?)" in problems


@pytest.mark.parametrize("name", BUILTIN)
def test_shadowing_a_builtin_is_reported(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, "ops.yaml", catalog(name=name))
    assert check_catalogs([path], reserved=BUILTIN) == [
        f"{path}:3: tool {name!r} shadows the built-in tool of that name"
    ]
    with pytest.raises(CatalogError):
        load_catalogs(["ops.yaml"], tmp_path, reserved=BUILTIN)


def test_a_collision_at_assembly_names_the_catalog_line(tmp_path: Path) -> None:
    from bot.tools.ask_human import ask_human_tools

    path = write(tmp_path, "ops.yaml", catalog(name="ask_human_input"))
    with pytest.raises(ToolCollision) as caught:
        ToolSet.assemble(load_catalogs(["ops.yaml"], tmp_path), ask_human_tools())
    assert str(caught.value) == (
        f"tool name collision: 'ask_human_input' is declared twice ({path}:3 and a built-in tool)"
    )


CLI_CASES = [
    # (case, files as (name, text), expected stderr lines with {dir} for the folder)
    (
        "clash beside a file that does not parse",
        [("a.yaml", catalog()), ("bad.yaml", "tools: ["), ("b.yaml", catalog(comment="b"))],
        [
            "{dir}/bad.yaml:1: YAML error: expected the node content, but found '<stream end>'",
            "{dir}/b.yaml:3: tool 'lister' is also declared at {dir}/a.yaml:3",
        ],
    ),
    (
        "clash across files",
        [("a.yaml", catalog()), ("b.yaml", catalog(comment="b"))],
        ["{dir}/b.yaml:3: tool 'lister' is also declared at {dir}/a.yaml:3"],
    ),
    (
        "shadows ask_human_input",
        [("a.yaml", catalog(name="ask_human_input"))],
        ["{dir}/a.yaml:3: tool 'ask_human_input' shadows the built-in tool of that name"],
    ),
    (
        "backreference",
        [("a.yaml", catalog(pattern=r"(a)\1"))],
        [
            "{dir}/a.yaml:9: tools[0].parameters.properties.path.pattern: tool 'lister': "
            r"pattern '(a)\1' cannot be checked in linear time (invalid escape sequence: \1); "
            "RE2 has no backreferences or lookaround"
        ],
    ),
]


@pytest.mark.parametrize(
    ("files", "expected"), [case[1:] for case in CLI_CASES], ids=[case[0] for case in CLI_CASES]
)
def test_tools_check_reports_the_whole_set(
    tmp_path: Path, files: list[tuple[str, str]], expected: list[str]
) -> None:
    paths = [str(write(tmp_path, name, text)) for name, text in files]
    result = CliRunner().invoke(cli, ["tools", "check", *paths], obj={})
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [line.format(dir=tmp_path) for line in expected]


def test_tools_check_passes_each_shipped_catalog_and_flags_the_two_together() -> None:
    paths = [str(ROOT / "bot/demo/tools/ops.yaml"), str(ROOT / "manifests/tools/ops.yaml")]
    for path in paths:
        result = CliRunner().invoke(cli, ["tools", "check", path], obj={})
        assert result.exit_code == 0, result.output
    # The two declare disk_usage each: not meant to be loaded together, and check says so.
    both = CliRunner().invoke(cli, ["tools", "check", *paths], obj={})
    assert both.exit_code == 1
    assert "tool 'disk_usage' is also declared at" in both.stderr


def test_a_catalog_nested_past_the_parser_is_reported_with_its_file(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("tools: " + "[" * 2000 + "]" * 2000 + "\n")
    (problem,) = check_catalogs([deep])
    assert problem.endswith("deep.yaml:1: YAML nested too deeply to be a catalog")
