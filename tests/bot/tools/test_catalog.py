"""Catalogs: validation with file:line for every problem, globs, duplicates, ``./`` paths."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bot.tools.base import ToolContext
from bot.tools.catalog import CatalogError, check_catalog, load_catalog, load_catalogs
from bot.tools.toolset import ToolSet
from tests.fakes.processes import fresh_python

CTX = ToolContext(run_id="run_1", call_id="call_1")

GOOD = """\
tools:
  - name: restart_service
    description: Restart a unit
    command: ["systemctl", "restart", "{unit}"]
    parameters:
      type: object
      properties: {unit: {type: string, pattern: "^[a-z0-9@._-]+$"}}
      required: [unit]
    confirm: true
    idempotent: false
    timeout: 12.5
    operator_paced: true
    tags: [prod]
    approvals: 2
    deny: false
    env: [KUBECONFIG]
    cwd: /var/tmp
    max_output: 1024
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def only_problem(path: Path) -> str:
    problems = check_catalog(path)
    assert len(problems) == 1, problems
    return problems[0]


def test_good_catalog_loads_every_field(tmp_path: Path) -> None:
    (tool,) = load_catalog(write(tmp_path, "ops.yaml", GOOD))
    assert tool.name == "restart_service"
    assert tool.command == ("systemctl", "restart", "{unit}")
    assert tool.parameters["required"] == ["unit"]
    flags = tool.flags
    assert (flags.approval.confirm, flags.traits.idempotent, flags.traits.operator_paced) == (
        True,
        False,
        True,
    )
    assert (
        flags.traits.timeout,
        flags.approval.tags,
        flags.approval.approvals,
        flags.approval.deny,
    ) == (12.5, ("prod",), 2, False)


LOCAL = """\
tools:
  - name: restart
    description: Restart
    command: ["./bin/restart.sh", "{unit}"]
    parameters: {type: object, properties: {unit: {type: string}}, required: [unit]}
    cwd: work
"""


def digest_of(folder: Path, catalog: str) -> str:
    folder.mkdir()
    return ToolSet(load_catalog(write(folder, "ops.yaml", catalog))).digest()


def test_the_digest_holds_what_a_command_runs_wherever_its_catalog_lies(tmp_path: Path) -> None:
    here = digest_of(tmp_path / "a", LOCAL)
    assert digest_of(tmp_path / "b", LOCAL) == here  # a replica's copy in another folder
    in_place = LOCAL.replace("cwd: work", "cwd: .")
    assert digest_of(tmp_path / "c", in_place) == digest_of(tmp_path / "d", in_place)
    edits = (
        LOCAL.replace('"{unit}"]', '"--now", "{unit}"]'),
        LOCAL.replace("./bin/restart.sh", "./bin/stop.sh"),
        LOCAL.replace("cwd: work", "cwd: elsewhere"),
        LOCAL + "    env: [KUBECONFIG]\n",
    )
    for number, edited in enumerate(edits):
        assert edited != LOCAL
        assert digest_of(tmp_path / f"edit{number}", edited) != here


def test_unknown_key_names_file_line_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace("    deny: false\n", "    colour: red\n"))
    assert only_problem(path) == f"{path}:15: tools[0].colour: unknown key"


def test_bad_type(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace("timeout: 12.5", "timeout: soon"))
    assert only_problem(path) == f"{path}:11: tools[0].timeout: expected a number, got a string"


def test_strings_are_not_coerced(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace("confirm: true", 'confirm: "false"'))
    assert only_problem(path).startswith(f"{path}:9: tools[0].confirm: ")


def test_a_whole_number_is_a_timeout_but_no_float_is_an_approval_count(tmp_path: Path) -> None:
    whole = write(tmp_path, "ops.yaml", GOOD.replace("timeout: 12.5", "timeout: 30"))
    (tool,) = load_catalog(whole)
    assert tool.flags.traits.timeout == 30.0
    path = write(tmp_path, "two.yaml", GOOD.replace("approvals: 2", "approvals: 2.0"))
    assert only_problem(path) == f"{path}:14: tools[0].approvals: expected an integer, got a number"


def test_an_entry_with_several_problems_reports_each_at_its_line(tmp_path: Path) -> None:
    text = """\
    tools:
      - name: restart
        descripton: Restart
        command: []
        confirm: 1
        timeout: "30"
        approvals: 0
        env: [KUBECONFIG, 9LIVES]
    """
    path = write(tmp_path, "ops.yaml", text)
    assert check_catalog(path) == [
        f"{path}:3: tools[0].descripton: unknown key (did you mean description?)",
        f"{path}:2: tools[0].description: required key is missing",
        f"{path}:4: tools[0].command: must be a list of length >= 1",
        f"{path}:5: tools[0].confirm: expected true or false, got an integer",
        f"{path}:6: tools[0].timeout: expected a number, got a string",
        f"{path}:7: tools[0].approvals: must be an integer >= 1",
        rf"{path}:8: tools[0].env[1]: must be a string matching regex '^[A-Za-z_][A-Za-z0-9_]*\Z'",
        f"{path}:4: tools[0].command[0]: command must have at least one element (the program)",
    ]


@pytest.mark.parametrize(
    ("before", "after", "where"),
    [
        ("name: restart_service", 'name: "restart_service\\n"', "2: tools[0].name: a tool's"),
        ("env: [KUBECONFIG]", 'env: ["KUBECONFIG\\n"]', "16: tools[0].env[0]: must be a"),
    ],
)
def test_a_name_ending_in_a_newline_is_refused(
    tmp_path: Path, before: str, after: str, where: str
) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace(before, after))
    assert only_problem(path).startswith(f"{path}:{where} "), only_problem(path)


@pytest.mark.parametrize(
    ("line", "argv"),
    [
        ("systemctl restart '{unit}'", '["systemctl", "restart", "{unit}"]'),
        ("systemctl restart '{unit}", '["program", "argument", …]'),
    ],
    ids=["split", "a quote left open"],
)
def test_a_command_written_as_a_shell_line_shows_its_argv(
    tmp_path: Path, line: str, argv: str
) -> None:
    # The way one types it at a shell; a catalog's command is argv, which no shell splits.
    good = 'command: ["systemctl", "restart", "{unit}"]'
    path = write(tmp_path, "ops.yaml", GOOD.replace(good, f"command: {line}"))
    assert only_problem(path) == (
        f"{path}:4: tools[0].command: expected a list (the argv; no shell runs it), got a"
        f" string: write it as {argv}"
    )


def test_a_tag_written_alone_is_shown_as_a_list(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace("tags: [prod]", "tags: prod"))
    assert only_problem(path) == (
        f'{path}:13: tools[0].tags: expected a list, got a string: write it as a list, ["prod"]'
    )


def test_one_tool_written_as_the_mapping_itself_is_made_an_item(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", "tools:\n  name: x\n  description: y\n  command: [echo]\n")
    assert only_problem(path) == (
        f"{path}:1: tools: expected a list, got a mapping: write it as a list of one, with -"
        " before its first key and its other keys under that one"
    )


def test_tools_written_without_the_tools_key_say_where_they_go(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.split("tools:\n", 1)[1])
    assert only_problem(path) == (
        f"{path}:1: expected a mapping, got a list: the tools go under a key of their own,"
        " tools:, one item each"
    )


def test_missing_key_points_at_the_entry(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace("    description: Restart a unit\n", ""))
    assert only_problem(path) == f"{path}:2: tools[0].description: required key is missing"


def test_bad_schema_points_into_the_schema(tmp_path: Path) -> None:
    text = """\
    tools:
      - name: x
        description: x
        command: ["true"]
        parameters:
          type: object
          properties:
            unit:
              type: strin
    """
    path = write(tmp_path, "ops.yaml", text)
    problem = only_problem(path)
    assert problem.startswith(f"{path}:9: tools[0].parameters.properties.unit.type: ")
    assert "invalid JSON Schema" in problem


def test_parameters_must_be_an_object_schema(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace("type: object", "type: array"))
    assert "type: object" in only_problem(path)


def test_undeclared_placeholder(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace('"{unit}"]', '"{unit}", "{since}"]'))
    assert only_problem(path) == (
        f"{path}:4: tools[0].command[3]: placeholder {{since}} is not a declared parameter"
    )


def test_a_required_name_must_be_a_declared_parameter(tmp_path: Path) -> None:
    required = "required:\n        - unit\n        - since\n"
    path = write(tmp_path, "ops.yaml", GOOD.replace("required: [unit]\n", required))
    expected = (
        f"{path}:10: tools[0].parameters.required[1]: tool 'restart_service': 'since' is "
        "required but is not a declared parameter"
    )
    assert check_catalog(path) == [expected]
    with pytest.raises(CatalogError) as caught:
        load_catalog(path)
    assert caught.value.problems == [expected]


def test_embedded_placeholder_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace('"{unit}"]', '"--unit={unit}"]'))
    assert "tools[0].command[2]: '--unit={unit}' embeds a placeholder" in only_problem(path)


@pytest.mark.parametrize("element", ["$KUBE_CONTEXT", "${KUBE_CONTEXT}", "${KUBE_CONTEXT:-prod}"])
def test_a_shell_variable_as_an_element_is_refused(tmp_path: Path, element: str) -> None:
    # No shell runs the command: it reached the program as written ("$KUBE_CONTEXT").
    path = write(tmp_path, "ops.yaml", GOOD.replace('"{unit}"]', f'"--context", "{element}"]'))
    assert only_problem(path) == (
        f"{path}:4: tools[0].command[3]: {element!r} is a shell variable, which no shell expands"
        " here (commands run from argv): write its value, or a {param} the model fills"
    )


@pytest.mark.parametrize(
    ("cwd", "why"),
    [
        ("$HOME/ops", "holds the shell variable $HOME"),
        ("${OPS_DIR}", "holds the shell variable ${OPS_DIR}"),
        ("/srv/$env/ops", "holds the shell variable $env"),
        ("~/ops", "starts with ~"),
    ],
)
def test_a_cwd_a_shell_would_have_expanded_is_refused(tmp_path: Path, cwd: str, why: str) -> None:
    # It was a folder of that name beside the catalog: tools check passed, and every call
    # failed to start.
    path = write(tmp_path, "ops.yaml", GOOD.replace("cwd: /var/tmp", f'cwd: "{cwd}"'))
    assert only_problem(path) == (
        f"{path}:17: tools[0].cwd: {cwd!r} {why}, which no shell expands here (commands run"
        " from argv): write the whole path, or one relative to the catalog's folder"
    )


@pytest.mark.parametrize(
    "element", ["{print $1}", "price-$5", "$HOME/x", "$", "$p", "$G", "$svc", "$__loc__"]
)
def test_a_dollar_in_other_text_stays_literal(tmp_path: Path, element: str) -> None:
    # $name not in capitals (or of one letter) is a program's own: sed -n '$p' prints the last
    # line, sed '$G' adds a blank one after it, and jq reads $svc from --arg svc (each was
    # refused as a shell variable).
    path = write(tmp_path, "ops.yaml", GOOD.replace('"{unit}"]', f'"{element}", "{{unit}}"]'))
    assert check_catalog(path) == []


def test_a_placeholder_without_its_closing_brace_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace('"{unit}"]', '"{unit"]'))
    assert only_problem(path) == (
        f"{path}:4: tools[0].command[2]: '{{unit' has a brace without its pair; a {{param}} "
        "must be a whole argv element"
    )


def test_bad_name(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace("name: restart_service", "name: restart it"))
    # It said "must be a string matching regex '^[a-zA-Z0-9_-]{1,64}\Z'".
    assert only_problem(path) == (
        f"{path}:2: tools[0].name: a tool's name is 1 to 64 letters, digits, _ and -, as the"
        " model APIs take it: 'restart it' has ' '"
    )
    long = "x" * 65
    path = write(tmp_path, "ops.yaml", GOOD.replace("name: restart_service", f"name: {long}"))
    assert only_problem(path).endswith(f"as the model APIs take it: {long!r} has 65 characters")


def test_yaml_syntax_error_has_a_line(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace("tags: [prod]", "tags: [prod"))
    assert only_problem(path).startswith(f"{path}:14: YAML error: ")


def test_empty_file(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", "")
    assert "empty" in only_problem(path)


def test_duplicate_key_is_not_resolved_silently(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace("    deny: false\n", "    confirm: false\n"))
    assert only_problem(path) == f"{path}:15: tools[0].confirm: duplicate key (first at line 9)"


def test_duplicate_name_in_one_file(tmp_path: Path) -> None:
    second = GOOD.split("tools:\n", 1)[1]
    path = write(tmp_path, "ops.yaml", GOOD + second)
    assert only_problem(path) == f"{path}:19: tools[1].name: duplicate tool name (first at line 2)"


def test_a_value_that_is_not_finite_is_said_once_at_its_line(tmp_path: Path) -> None:
    text = """\
    tools:
      - name: forever
        description: x
        command: ["true"]
        idempotent: true
        timeout: .inf
    """
    path = write(tmp_path, "ops.yaml", text)
    assert check_catalog(path) == [f"{path}:6: tools[0].timeout: must be a finite number"]


def test_check_catalog_returns_every_problem(tmp_path: Path) -> None:
    text = """\
    tools:
      - name: bad name
        description: x
        command: ["echo", "{nope}", "a{b}c"]
        timeout: -1
        shiny: true
      - name: ok
        description: x
        command: ["true"]
        parameters: {type: object, properties: {a: {type: strin}}}
    extra: 1
    """
    path = write(tmp_path, "ops.yaml", text)
    problems = check_catalog(path)
    assert [problem.split(": ", 2)[:2] for problem in problems] == [
        [f"{path}:11", "extra"],
        [f"{path}:6", "tools[0].shiny"],
        [f"{path}:2", "tools[0].name"],
        [f"{path}:5", "tools[0].timeout"],
        [f"{path}:4", "tools[0].command[1]"],
        [f"{path}:4", "tools[0].command[2]"],
        [f"{path}:10", "tools[1].parameters.properties.a.type"],
    ]
    with pytest.raises(CatalogError) as caught:
        load_catalog(path)
    assert caught.value.problems == problems
    assert str(caught.value) == "\n".join(problems)


def test_dot_slash_elements_and_cwd_resolve_against_the_catalog_folder(tmp_path: Path) -> None:
    folder = tmp_path / "catalogs"
    folder.mkdir()
    (folder / "run").mkdir()
    text = """\
    tools:
      - name: pwd
        description: x
        command: ["./bin/tool", "./data", "data/./x"]
        cwd: run
    """
    (tool,) = load_catalog(write(folder, "ops.yaml", text))
    assert tool.command == (str(folder / "bin/tool"), str(folder / "data"), "data/./x")


PROGRAMS = """\
tools:
  - {name: absent, description: x, command: [/nonexistent/prog]}
  - {name: beside, description: x, command: [./missing.sh]}
  - {name: named, description: x, command: [no-such-program-x]}
  - {name: plain, description: x, command: [./plain.txt]}
  - {name: loose, description: x, command: [bin/tool]}
  - {name: there, description: x, command: [./there.sh]}
  - {name: found, description: x, command: ["true"]}
  - {name: inside, description: x, command: [bin/tool], cwd: work}
  - {name: nowhere, description: x, command: ["true"], cwd: ops}
"""


def test_a_program_that_cannot_start_here_is_a_problem_of_the_check(tmp_path: Path) -> None:
    (tmp_path / "plain.txt").write_text("not a program\n")
    (tmp_path / "there.sh").write_text("#!/bin/sh\n")
    (tmp_path / "there.sh").chmod(0o755)
    (tmp_path / "work" / "bin").mkdir(parents=True)
    (tmp_path / "work" / "bin" / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "work" / "bin" / "tool").chmod(0o755)
    path = write(tmp_path, "ops.yaml", PROGRAMS)
    assert check_catalog(path) == [
        f"{path}:2: tool 'absent': program '/nonexistent/prog' cannot start: No such file or "
        "directory",
        f"{path}:3: tool 'beside': program './missing.sh' cannot start: No such file or "
        f"directory ({tmp_path}/missing.sh)",
        f"{path}:4: tool 'named': program 'no-such-program-x' is not on the PATH commands run "
        "with (/usr/local/bin:/usr/bin:/bin)",
        f"{path}:5: tool 'plain': program './plain.txt' cannot start: Permission denied "
        f"({tmp_path}/plain.txt)",
        f"{path}:6: tool 'loose': program 'bin/tool' cannot start: it is relative to the call's "
        "new, empty HOME (./ is the catalog's folder)",
        # It passed, and each call failed to start in it.
        f"{path}:10: tool 'nowhere': cwd 'ops' is not a folder here ({tmp_path}/ops): no call"
        " can start in it",
    ]


def test_a_misspelt_schema_keyword_is_named_with_the_keyword_it_meant(tmp_path: Path) -> None:
    # JSON Schema ignores a keyword it does not know: "patern" checked nothing, and a unit
    # named "-x; reboot" would have gone on to the approval card unrefused.
    text = """\
tools:
  - name: restart
    description: x
    command: ["systemctl", "restart", "--", "{unit}"]
    parameters:
      type: object
      properties:
        unit: {tpye: string, patern: "^[a-z]+$", x-shown-as: Unit, note: a systemd unit}
      requried: [unit]
"""
    path = write(tmp_path, "ops.yaml", text)
    assert check_catalog(path) == [
        f"{path}:9: tools[0].parameters.requried: tool 'restart': not a JSON Schema keyword"
        " (did you mean required?): a validator ignores it, and checks nothing",
        f"{path}:8: tools[0].parameters.properties.unit.tpye: tool 'restart': not a JSON Schema"
        " keyword (did you mean type?): a validator ignores it, and checks nothing",
        f"{path}:8: tools[0].parameters.properties.unit.patern: tool 'restart': not a JSON"
        " Schema keyword (did you mean pattern?): a validator ignores it, and checks nothing",
    ]


def test_a_type_json_schema_lacks_in_a_list_of_types_names_the_one_it_meant(
    tmp_path: Path,
) -> None:
    # A nullable parameter lists its types: "['str', 'null'] is not valid under any of the
    # given schemas" named neither the wrong one nor the right one.
    text = """\
tools:
  - name: scale
    description: x
    command: ["scale", "{n}"]
    parameters: {type: object, properties: {n: {type: [str, "null"]}}}
"""
    path = write(tmp_path, "ops.yaml", text)
    assert check_catalog(path) == [
        f"{path}:5: tools[0].parameters.properties.n.type: invalid JSON Schema: 'str' is not a"
        " type (did you mean string?); the types are array, boolean, integer, null, number,"
        " object and string"
    ]


def test_annotations_and_extensions_near_a_keyword_are_no_misspelling(tmp_path: Path) -> None:
    # OpenAPI's example, x- extensions and an annotation misspelt check nothing either way: a
    # schema written for OpenAPI or by Pydantic loads as it did, and a near keyword still says.
    text = """\
tools:
  - name: deploy
    description: x
    command: ["deploy", "{service}"]
    parameters:
      type: object
      x-order: 1
      $defs:
        svc: {type: string, example: checkout, x-description: Service, x-pattern: "[a-z]"}
      properties:
        service: {$ref: "#/$defs/svc", x-default: web, titel: Service, descripton: x}
        count: {type: integer, maximun: 3}
"""
    path = write(tmp_path, "ops.yaml", text)
    assert check_catalog(path) == [
        f"{path}:12: tools[0].parameters.properties.count.maximun: tool 'deploy': not a JSON"
        " Schema keyword (did you mean maximum?): a validator ignores it, and checks nothing"
    ]


def test_a_ref_that_points_to_nothing_is_a_catalog_error(tmp_path: Path) -> None:
    # The catalog loaded and tools check passed; the first call then failed inside the
    # validator, and the run panicked ("internal error: PointerToNowhere: ..."). A $ref out of
    # the schema is never fetched, so it resolves to nothing either.
    text = """\
tools:
  - name: deploy
    description: x
    command: ["echo", "{service}", "{region}", "{count}"]
    parameters:
      type: object
      $defs: {svc: {type: string}}
      properties:
        service: {$ref: "#/$defs/svc"}
        region: {$ref: "#/$defs/region"}
        count: {$ref: "https://example.com/count.json"}
"""
    path = write(tmp_path, "ops.yaml", text)
    assert check_catalog(path) == [
        f"{path}:10: tools[0].parameters.properties.region.$ref: tool 'deploy': '#/$defs/region'"
        " points to nothing in this schema (a $ref outside it is never fetched)",
        f"{path}:11: tools[0].parameters.properties.count.$ref: tool 'deploy':"
        " 'https://example.com/count.json' points to nothing in this schema (a $ref outside it"
        " is never fetched)",
    ]


def test_a_type_json_schema_lacks_names_the_types_it_has(tmp_path: Path) -> None:
    # Python's and YAML's names for it: "'str' is not valid under any of the given schemas".
    for written, meant in (("str", "string"), ("int", "integer"), ("bool", "boolean")):
        text = f"""\
tools:
  - name: scale
    description: x
    command: ["scale", "{{n}}"]
    parameters: {{type: object, properties: {{n: {{type: {written}}}}}}}
"""
        path = write(tmp_path, "ops.yaml", text)
        assert check_catalog(path)[0] == (
            f"{path}:5: tools[0].parameters.properties.n.type: invalid JSON Schema: {written!r}"
            f" is not a type (did you mean {meant}?); the types are array, boolean, integer,"
            " null, number, object and string"
        )


def test_a_shell_line_in_one_element_names_the_argv_it_meant(tmp_path: Path) -> None:
    # A list, so not refused as a string is: the whole line was looked for as one program.
    text = """\
tools:
  - {name: usage, description: x, command: ["df -h", "{path}"], parameters: {type: object,
     properties: {path: {type: string}}}}
  - {name: lines, description: x, command: ["wc -l '/var/log/app log'"]}
  - {name: odd, description: x, command: ["/opt/my tools/run"]}
"""
    path = write(tmp_path, "ops.yaml", text)
    assert check_catalog(path) == [
        f"{path}:2: tool 'usage': program 'df -h' is a command line, not a program: the"
        ' command is an argv, one word to an element: ["df", "-h", "{path}"]',
        f"{path}:4: tool 'lines': program \"wc -l '/var/log/app log'\" is a command line, not"
        ' a program: the command is an argv, one word to an element: ["wc", "-l",'
        ' "/var/log/app log"]',
        # A path with a space in it is a path: its first word is no program either.
        f"{path}:5: tool 'odd': program '/opt/my tools/run' cannot start: No such file or"
        " directory",
    ]


def test_a_program_that_cannot_start_here_is_only_warned_of_when_loading(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, "ops.yaml", PROGRAMS.split("  - {name: beside")[0])
    tools = load_catalogs(["ops.yaml"], tmp_path)
    assert [tool.name for tool in tools] == ["absent"]
    assert [record.getMessage() for record in caplog.records] == [
        f"{path}:2: tool 'absent': program '/nonexistent/prog' cannot start: No such file or "
        "directory; loaded all the same, its calls fail until it can start"
    ]


async def test_catalog_cwd_is_used(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    text = """\
    tools:
      - name: where
        description: x
        command: ["pwd"]
        cwd: run
    """
    (tool,) = load_catalog(write(tmp_path, "ops.yaml", text))
    assert (await tool.call({}, CTX)).output == f"{tmp_path / 'run'}\n[exit status 0]"


def test_load_catalogs_expands_globs_relative_to_base_dir(tmp_path: Path) -> None:
    (tmp_path / "tools").mkdir()
    write(tmp_path / "tools", "a.yaml", GOOD)
    write(tmp_path / "tools", "b.yaml", GOOD.replace("restart_service", "other"))
    tools = load_catalogs(["tools/*.yaml", "tools/a.yaml"], tmp_path)
    assert [tool.name for tool in tools] == ["restart_service", "other"]


def test_unmatched_pattern_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(CatalogError) as caught:
        load_catalogs(["nothing/*.yaml"], tmp_path)
    expected = f"nothing/*.yaml: catalog pattern matches no file (in {tmp_path})"
    assert caught.value.problems == [expected]


def test_duplicate_name_across_files_names_both(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", GOOD)
    second = write(tmp_path, "b.yaml", "# another\n" + GOOD)
    with pytest.raises(CatalogError) as caught:
        load_catalogs(["*.yaml"], tmp_path)
    assert caught.value.problems == [
        f"{second}:3: tool 'restart_service' is also declared at {first}:2"
    ]


def test_problems_of_every_file_are_reported_together(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", GOOD.replace("timeout: 12.5", "timeout: soon"))
    write(tmp_path, "b.yaml", "tools: [")
    with pytest.raises(CatalogError) as caught:
        load_catalogs(["a.yaml", "b.yaml", "c.yaml"], tmp_path)
    assert len(caught.value.problems) == 3


DASHED = """\
tools:
  - name: shift
    description: Move by an offset
    command: ["date", "{offset}", "{unit}"]
    parameters:
      type: object
      properties:
        offset: {type: integer}
        unit: {type: string}
    allow_leading_dash: [offset]
"""


async def test_allow_leading_dash_lets_only_the_named_parameter_start_with_a_dash(
    tmp_path: Path,
) -> None:
    (tool,) = load_catalog(write(tmp_path, "ops.yaml", DASHED))
    assert tool.argv({"offset": -5, "unit": "days"}) == ["date", "-5", "days"]
    with pytest.raises(ValueError, match="argument 'unit' must not start with '-'"):
        tool.argv({"offset": 5, "unit": "--days"})


def test_allow_leading_dash_names_a_declared_placeholder(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", DASHED.replace("[offset]", "[offset, ofset, unit]"))
    assert check_catalog(path) == [
        f"{path}:10: tools[0].allow_leading_dash[1]: tool 'shift': 'ofset' is not a declared "
        "parameter"
    ]
    unused = write(
        tmp_path, "unused.yaml", DASHED.replace(', "{unit}"', "").replace("[offset]", "[unit]")
    )
    assert check_catalog(unused) == [
        f"{unused}:10: tools[0].allow_leading_dash[0]: tool 'shift': 'unit' is not a placeholder "
        "of the command"
    ]


def test_allow_leading_dash_must_be_a_list_of_names(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", DASHED.replace("[offset]", "true"))
    assert only_problem(path).startswith(f"{path}:10: tools[0].allow_leading_dash: ")


def test_pattern_anchors_mean_the_whole_value(tmp_path: Path) -> None:
    (tool,) = load_catalog(write(tmp_path, "ops.yaml", GOOD))
    tools = ToolSet([tool])
    assert tools.validate("restart_service", {"unit": "nginx"}) == []
    (problem,) = tools.validate("restart_service", {"unit": "nginx\n"})
    assert problem == "unit: 'nginx\\n' does not match '^[a-z0-9@._-]+$'"


def test_an_unanchored_pattern_still_searches(tmp_path: Path) -> None:
    (tool,) = load_catalog(write(tmp_path, "ops.yaml", GOOD.replace("^[a-z0-9@._-]+$", "x")))
    assert ToolSet([tool]).validate("restart_service", {"unit": "axb"}) == []


TRUSTING = """\
tools:
  - name: list_units
    description: List the units
    command: ["systemctl", "list-units"]
    idempotent: true
  - name: restart_unit
    description: Restart a unit
    command: ["systemctl", "restart", "{unit}"]
    parameters:
      type: object
      properties: {unit: {type: string}}
    confirm: true
    trusted_from:
      unit: [list_units]
"""


def test_trusted_from_is_each_parameters_trusted_tools(tmp_path: Path) -> None:
    _, restart = load_catalog(write(tmp_path, "ops.yaml", TRUSTING))
    assert restart.flags.traits.trusted_from == (("unit", ("list_units",)),)


def test_trusted_from_names_a_declared_parameter(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", TRUSTING.replace("      unit: [list", "      unti: [list"))
    assert check_catalog(path) == [
        f"{path}:14: tools[1].trusted_from.unti: tool 'restart_unit': 'unti' is not a declared "
        "parameter"
    ]


def test_trusted_from_names_a_tool_of_the_catalogs(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", TRUSTING.replace("[list_units]", "[list_unit]"))
    with pytest.raises(CatalogError) as caught:
        load_catalogs(["ops.yaml"], tmp_path)
    assert caught.value.problems == [
        f"{path}:14: tool 'restart_unit': trusted_from.unit names unknown tool 'list_unit'"
    ]
    # Another file of the set may declare it.
    write(
        tmp_path,
        "more.yaml",
        TRUSTING.replace("list_units", "list_unit").split("  - name: restart")[0],
    )
    assert [t.name for t in load_catalogs(["*.yaml"], tmp_path)] == [
        "list_unit",
        "list_units",
        "restart_unit",
    ]


# In a fresh interpreter: load the catalog named by argv[1] (every problem, or its tools) and say
# which parsers and checkers had to be imported for it.
LOAD_FRESH = """
import json, sys
from bot.tools.catalog import CatalogError, load_catalog
from bot.tools.toolset import ToolSet
try:
    tools = load_catalog(sys.argv[1])
    said = {"digest": ToolSet(tools).digest(), "origins": [t.origin for t in tools],
            "argv": [t.argv({"unit": "nginx"}) for t in tools],
            "timeouts": [t.flags.traits.timeout for t in tools]}
except CatalogError as exc:
    said = {"problems": exc.problems}
said["imported"] = sorted({"yaml", "jsonschema", "re2"} & set(sys.modules))
print(json.dumps(said))
"""


def test_a_catalog_found_clean_is_read_back_as_it_was_read(tmp_path: Path) -> None:
    path = write(
        tmp_path, "ops.yaml", GOOD + "  - {name: status, description: S, command: [uptime]}\n"
    )
    first = fresh_python(tmp_path, LOAD_FRESH, str(path))
    second = fresh_python(tmp_path, LOAD_FRESH, str(path))
    assert first["imported"] == ["jsonschema", "re2", "yaml"] and second["imported"] == []
    assert {**first, "imported": []} == {**second, "imported": []}
    assert first["origins"] == [f"{path}:2", f"{path}:19"]
    assert first["timeouts"] == [12.5, 30]  # the default stays the int it was


def test_a_catalog_with_a_problem_is_checked_again_each_time(tmp_path: Path) -> None:
    path = write(tmp_path, "ops.yaml", GOOD.replace("timeout: 12.5", "timeout: soon"))
    first = fresh_python(tmp_path, LOAD_FRESH, str(path))
    second = fresh_python(tmp_path, LOAD_FRESH, str(path))
    assert first["problems"] == second["problems"]
    assert first["problems"] == [f"{path}:11: tools[0].timeout: expected a number, got a string"]
    assert "yaml" in second["imported"]


# In a fresh interpreter: load the catalogs of the folder argv[1] as one set, a built-in tool
# named "status"; say every problem, or each tool's argv and working folder.
LOAD_SET_FRESH = """
import json, sys
from pathlib import Path
from bot.tools.catalog import CatalogError, load_catalogs
try:
    tools = load_catalogs(["*.yaml"], Path(sys.argv[1]), reserved=["status"])
    said = {"tools": [[t.argv({}), str(t._cwd)] for t in tools]}
except CatalogError as exc:
    said = {"problems": exc.problems}
print(json.dumps(said))
"""
OWN_SCRIPT = """\
tools:
  - {name: check, description: C, command: [./check.sh], cwd: work,
     trusted_from: {x: [other]}, parameters: {type: object, properties: {x: {type: string}}}}
"""


def test_a_catalog_read_back_is_checked_with_its_own_place_and_set(tmp_path: Path) -> None:
    # The same text, kept once: each copy's ./ is its own folder, and each set is checked anew.
    alone, clashing = tmp_path / "alone", tmp_path / "clashing"
    for folder in (alone, clashing):
        folder.mkdir()
        write(folder, "a.yaml", OWN_SCRIPT)
    write(alone, "b.yaml", "tools:\n  - {name: other, description: O, command: [uptime]}\n")
    write(clashing, "b.yaml", "tools:\n  - {name: check, description: O, command: [uptime]}\n")
    cache = tmp_path / "cache"
    for _ in range(2):
        said = fresh_python(cache, LOAD_SET_FRESH, str(alone))
        assert said["tools"][0] == [[f"{alone}/check.sh"], f"{alone}/work"]
        assert fresh_python(cache, LOAD_SET_FRESH, str(clashing))["problems"] == [
            f"{clashing}/b.yaml:2: tool 'check' is also declared at {clashing}/a.yaml:2",
            f"{clashing}/a.yaml:3: tool 'check': trusted_from.x names unknown tool 'other'",
        ]
    assert list(cache.glob("kestrel/kept/*/catalogs/*"))  # read back the second time


@pytest.mark.parametrize("pattern", ["a.yaml/", "a.yaml/.", "missing.yaml", "tools", "tools/"])
def test_a_plain_pattern_names_a_file_only_as_glob_reads_it(tmp_path: Path, pattern: str) -> None:
    write(tmp_path, "a.yaml", GOOD)
    (tmp_path / "tools").mkdir()
    with pytest.raises(CatalogError) as caught:
        load_catalogs([pattern], tmp_path)
    if pattern.startswith("tools"):  # a folder: its files are what a catalog pattern names
        said = "a folder, not a catalog file: name its files (tools/*.yaml)"
        assert caught.value.problems == [f"{pattern}: {said}"]
        return
    assert caught.value.problems == [f"{pattern}: catalog pattern matches no file (in {tmp_path})"]
