"""Settings: the shipped example validates, the environment overrides the file, errors name keys."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from bot.cli.compose import build_tools
from bot.config.settings import ConfigError, Settings, load_settings
from bot.config.sources import DERIVED_SETTINGS
from tests.fakes.fresh import fresh_json

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_configuration_is_valid() -> None:
    settings = load_settings(str(ROOT / "kestrel.example.yaml"))
    assert settings.policy.oncall == ["U0ONCALL"]
    assert settings.schedules[0].name == "morning-check"
    tools = build_tools(settings, isolation=None)  # the tools its policy and deadlines name
    assert "restart_unit" in tools


# A key line of YAML, set or commented out: its indentation, a list item's dash, the key.
KEY_LINE = re.compile(r"( *)(- )?([a-z_]+):(?: |$)")


def setting_keys(struct: msgspec.inspect.StructType, prefix: str = "") -> Iterator[str]:
    """Every key of ``struct`` as a dotted path, a section's and a list entry's keys too."""
    for field in struct.fields:
        key = prefix + field.encode_name
        if key in DERIVED_SETTINGS:
            continue
        yield key
        inner = field.type
        if isinstance(inner, msgspec.inspect.UnionType):  # optional: what it is when set
            inner = next(t for t in inner.types if not isinstance(t, msgspec.inspect.NoneType))
        if isinstance(inner, msgspec.inspect.ListType):
            inner = inner.item_type
        if isinstance(inner, msgspec.inspect.StructType):
            yield from setting_keys(inner, key + ".")


def shown_keys(text: str) -> set[str]:
    """The dotted keys a YAML text shows, set or in a comment written as a key line at the
    place it would have (``  # script: demo.yaml`` shows ``model.script``)."""
    shown: set[str] = set()
    enclosing: list[tuple[int, str]] = []  # (column, key) of the keys the next line is under
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            line = re.sub("# ?", "", line, count=1)  # the key where the comment mark was
        found = KEY_LINE.match(line)
        if found is None:
            continue
        column = len(found[1]) + len(found[2] or "")
        while enclosing and enclosing[-1][0] >= column:
            enclosing.pop()
        enclosing.append((column, found[3]))
        shown.add(".".join(key for _, key in enclosing))
    return shown


def test_the_example_configuration_shows_every_key() -> None:
    # docs/configuration.md says it does: a key added to the settings is added there too.
    shown = shown_keys((ROOT / "kestrel.example.yaml").read_text())
    root = msgspec.inspect.type_info(Settings)
    assert isinstance(root, msgspec.inspect.StructType)
    every = list(setting_keys(root))
    # The walk reaches a list entry's keys, and a key commented out counts as shown.
    assert "mcp_servers.timeout" in every and "model.script" in shown
    assert [key for key in every if key not in shown] == []
    assert sorted(shown - set(every)) == []  # nor a key the settings no longer have


def test_environment_overrides_nested_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kestrel.yaml"
    path.write_text("model: {name: from-file}\nbudgets: {max_iterations: 5}\n")
    monkeypatch.setenv("KESTREL_MODEL__NAME", "from-env")
    settings = load_settings(str(path))
    assert settings.model.name == "from-env"
    assert settings.budgets.max_iterations == 5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("modle: {name: x}\n", "modle: unknown key (did you mean model?)"),
        ("model: {nmae: x}\n", "model.nmae: unknown key (did you mean name?)"),
        ("policy: {approver: {}}\n", "policy.approver: unknown key (did you mean approvers?)"),
        ("mcp_servers: [{name: a, transport: stdio, comand: x}]\n", "(did you mean command?)"),
        ("zzz: 1\n", "zzz: unknown key"),
        ("budgets: {max_iterations: 0}\n", "budgets.max_iterations"),
        ("deadlines: {per_tool: {deploy: -5}}\n", "deadlines.per_tool.deploy"),
        ("deadlines: {per_tool: {deploy: 0}}\n", "deadlines.per_tool.deploy"),
        # Past the last date there is: the first gated call of every run failed with an internal
        # error (a deadline), or every sweep did and nothing expired (a reminder).
        ("deadlines: {wait_approval: 1e12}\n", "deadlines.wait_approval: must be a number <="),
        ("deadlines: {per_tool: {deploy: 1e12}}\n", "deadlines.per_tool.deploy: must be a"),
        ("deadlines: {remind_before: 1e11}\n", "deadlines.remind_before: must be a number <="),
        ("schedules: [{name: a, cron: 'not a cron', prompt: p}]\n", "cron 'not a cron'"),
        # A cron expression is checked on its own, whatever else is wrong with the schedule.
        ("schedules: [{name: a, cron: 'not a cron', prompt: 1}]\n", "schedules.0.cron: cron"),
        ("schedules: [{name: a, cron: 'not a cron', prompt: p, x: 1}]\n", "0.cron: cron"),
        ("schedules: [{name: a, cron: '0 7 * * *', prompt: '  '}]\n", "0.prompt: must not be"),
        # A day no month has: accepted, it would never fire and nobody would be told.
        (
            "schedules: [{name: a, cron: '0 0 30 2 *', prompt: p}]\n",
            "0.cron: cron '0 0 30 2 *': never",
        ),
        ("schedules: [{name: a, cron: '0 0 0 31 4 *', prompt: p}]\n", "31 4 *': never fires"),
        ("schedules: [{name: '', cron: '0 7 * * *', prompt: p}]\n", "0.name: must not be empty"),
        # Keyed by name: the first of two alike would never start, and nobody would be told.
        (
            "schedules: [{name: a, cron: '0 7 * * *', prompt: p},"
            " {name: b, cron: '0 8 * * *', prompt: q}, {name: a, cron: '0 9 * * *', prompt: r}]\n",
            "schedules: the 1st and 3rd schedules are both named 'a': give each its own name",
        ),
        # Kept in the store, which keeps neither (a start failed on them, every prompt's late
        # start with it).
        (
            "schedules: [{name: \"a\\0b\", cron: '0 7 * * *', prompt: p}]\n",
            "schedules.0.name: must not hold a NUL character (\\0)",
        ),
        (
            "schedules: [{name: a, cron: '0 7 * * *', prompt: \"p \\ud800\"}]\n",
            "schedules.0.prompt: must not hold an unpaired surrogate (\\ud800)",
        ),
        # One schedule and text are one prompt: the second of two so would never start.
        (
            "schedules: [{name: a, cron: '0 7 * * *', prompt: p},"
            " {name: b, cron: ' 0 7  * * * ', prompt: p}]\n",
            "schedules: the 1st and 2nd schedules ('a', 'b') have the same cron and prompt, and"
            " would start one run: remove one, or tell them apart",
        ),
        # Looked back on at every start: a grace past any date would end it with an OverflowError.
        (
            "schedules: [{name: a, cron: '0 7 * * *', prompt: p, grace_seconds: 1e12}]\n",
            "schedules.0.grace_seconds",
        ),
        (
            "deadlines: {per_tool: {1: 5}}\n",
            "per_tool.1: expected a string, got an integer (for a key)",
        ),
        ("tools: [a\n", "kestrel.yaml:2"),
        # libyaml reads past the tab; the line and PyYAML's words are said, not an IndexError.
        ("database: kestrel.db\nmax_output: !!int \t\n", "kestrel.yaml:2: not valid YAML"),
        ("- just a list\n", "top level must be a mapping"),
        # A tool written where its catalog is named: the key says what goes there instead.
        (
            "tools: [{name: restart_unit, command: [systemctl]}]\n",
            "tools.0: expected a string, got a mapping: tools lists catalog files"
            ' ("tools/*.yaml"); a tool\'s name, command and parameters go in one of them',
        ),
        (
            "tools: ops.yaml\n",
            'tools: expected a list or null, got a string: write it as a list, ["ops.yaml"]',
        ),
        # YAML 1.1 reads off as false: the choice it is not, not "got true or false".
        ("tool_isolation: {mode: off}\n", "tool_isolation.mode: 'off' is not one of namespaces"),
        # YAML keeps the last of a key written twice: a whole section was dropped unsaid.
        (
            "model:\n  name: a\npolicy: {}\nmodel:\n  name: b\n",
            "kestrel.yaml:4: not valid YAML (duplicate key 'model', first at line 1)",
        ),
        (
            "policy:\n  oncall: [U0A]\n  requesters: ['*']\n  oncall: [U0B]\n",
            "kestrel.yaml:4: not valid YAML (duplicate key 'oncall', first at line 2)",
        ),
        # Approvers listed as oncall is: whom they approve for is the key.
        (
            "policy: {approvers: [U0ALICE, 'group:S0SRE']}\n",
            "policy.approvers: expected a mapping, got a list: it maps a tool, tag:NAME or * to"
            ' who approves it, {"*": ["U0ALICE", "group:S0SRE"]} for every gated tool',
        ),
        # A host alone: every "View run" link would be a relative path, opening nothing.
        (
            "web: {public_url: kestrel.example.com}\n",
            "web.public_url: must be an http(s) URL with a host, not 'kestrel.example.com'",
        ),
        # Taken as written: every "View run" link went to a host named ${HOST}.
        (
            "web: {public_url: 'https://${HOST}/kestrel'}\n",
            "web.public_url: 'https://${HOST}/kestrel': its host is a variable, which nothing"
            " expands: write it",
        ),
        # One schedule where a list of them goes: made an item of a list.
        (
            "schedules: {name: daily, cron: '0 9 * * *', prompt: hi}\n",
            "schedules: expected a list, got a mapping: write it as a list of one, with - before"
            " its first key and its other keys under that one",
        ),
        # One id where a list of them goes: the list it meant, not msgspec's words alone.
        (
            "policy: {oncall: U0ONCALL}\n",
            'policy.oncall: expected a list, got a string: write it as a list, ["U0ONCALL"]',
        ),
        (
            "policy: {approvers: {'*': group:S0SRE}}\n",
            "policy.approvers.*: expected a list, got a string:"
            ' write it as a list, ["group:S0SRE"]',
        ),
        # Sent as it is: the server answered 404 for a model `` (or ` llama3.2`), run by run.
        ("model: {name: ''}\n", "model.name: must not be empty: name one of the server's models"),
        ("model: {name: ' llama3.2'}\n", "model.name: ' llama3.2' has spaces around it"),
        # Where OpenAI's own clients take them: the server and its key are Kestrel's variables.
        (
            "model: {name: llama3.2, base_url: 'http://127.0.0.1:11434/v1'}\n",
            "model.base_url: unknown key: the server's address is OPENAI_BASE_URL (the"
            " environment or .env), or openai_base_url: at the top level",
        ),
        (
            "model: {name: gpt-4.1-mini, api_key: sk-test}\n",
            "model.api_key: unknown key: the key is OPENAI_API_KEY, in the environment or .env"
            " (a secret: keep it out of this file)",
        ),
        # The model's name alone, as "model.name set to one of the server's models" reads.
        (
            "model: llama3.2\n",
            "model: expected a mapping, got a string: the model's name goes under it,"
            ' model: {name: "llama3.2"}',
        ),
    ],
)
def test_bad_configuration_names_the_cause(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "kestrel.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(str(path))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "key", "variable"),
    [
        ("database: ${DATABASE_URL}\n", "database: '${DATABASE_URL}'", "KESTREL_DATABASE_URL"),
        ("database: $DATABASE_URL\n", "database: '$DATABASE_URL'", "KESTREL_DATABASE_URL"),
        ("model: {name: '${MODEL:-gpt-4o}'}\n", "model.name", "KESTREL_MODEL__NAME"),
        ("openai_api_key: ' ${KEY} '\n", "openai_api_key", "OPENAI_API_KEY"),
        (
            "policy: {approvers: {'*': [alice, '${ONCALL}']}}\n",
            "policy.approvers.*.1: '${ONCALL}'",
            "KESTREL_POLICY__APPROVERS",
        ),
    ],
)
def test_a_value_written_as_a_variable_is_refused_naming_the_one_that_sets_it(
    tmp_path: Path, text: str, key: str, variable: str
) -> None:
    # Read as its own text, ${DATABASE_URL} was a SQLite journal of that name beside the file.
    path = tmp_path / "kestrel.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(str(path))
    said = str(caught.value)
    assert f"kestrel.yaml: {key}" in said and "does not expand" in said, said
    assert f"set {variable} in the environment or .env" in said, said
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("databse: ${DATABASE_URL}\n", "databse: unknown key (did you mean database?)"),
        ("model: {nmae: $MODEL}\n", "model.nmae: unknown key (did you mean name?)"),
    ],
)
def test_a_variable_under_a_misspelt_key_is_told_of_the_key(
    tmp_path: Path, text: str, said: str
) -> None:
    # It was told to set KESTREL_DATABSE, which sets nothing (an unknown variable, then).
    path = tmp_path / "kestrel.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(str(path))
    assert said in str(caught.value) and "KESTREL_" not in str(caught.value), caught.value


def test_a_variable_under_a_key_no_variable_names_is_refused_as_such(tmp_path: Path) -> None:
    path = tmp_path / "kestrel.yaml"
    path.write_text("'Model': {name: $MODEL}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(str(path))
    assert str(caught.value).endswith(
        "kestrel.yaml: Model.name: '$MODEL' is a variable, which kestrel.yaml does not expand:"
        " write the value itself"
    )


@pytest.mark.parametrize(
    ("text", "variable", "value"),
    [
        (
            "deadlines: {per_tool: {ops__drain: $T}}\n",
            "KESTREL_DEADLINES__PER_TOOL",
            '{"ops__drain": 60}',
        ),
        (
            "policy: {approvers: {ops__drain: [$U]}}\n",
            "KESTREL_POLICY__APPROVERS",
            '{"ops__drain": ["U1"]}',
        ),
    ],
)
def test_a_variable_under_an_mcp_tool_names_the_section_that_sets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, variable: str, value: str
) -> None:
    # An MCP tool is SERVER__TOOL: KESTREL_DEADLINES__PER_TOOL__OPS__DRAIN was named, and an
    # unknown variable once set ("__" nests).
    path = tmp_path / "kestrel.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(str(path))
    assert f"set {variable} in the environment" in str(caught.value), caught.value
    path.write_text("{}\n")
    monkeypatch.setenv(variable, value)
    settings = load_settings(str(path))
    assert "ops__drain" in (settings.deadlines.per_tool | settings.policy.approvers)


@pytest.mark.parametrize(
    "text", ["model: {name: gpt-$4}\n", "database: 'kestrel-$(date).db'\n", "database: $\n"]
)
def test_a_dollar_inside_a_value_is_its_own_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "kestrel.yaml"
    path.write_text(text)
    load_settings(str(path))


def test_a_catalog_given_as_the_configuration_is_named_as_one(tmp_path: Path) -> None:
    # It said "tools.0: expected a string, got a mapping: …" once for each of its tools.
    tools = "".join(f"  - {{name: t{n}, description: x, command: [x]}}\n" for n in range(3))
    path = tmp_path / "ops.yaml"
    path.write_text("tools:\n" + tools)
    with pytest.raises(ConfigError) as caught:
        load_settings(str(path))
    assert str(caught.value) == (
        f"{path}: a tool catalog (its tools: lists tools), not a configuration: a kestrel.yaml"
        ' names catalog files, tools: ["ops.yaml"]'
    )


@pytest.mark.parametrize("named_by", ["--config", "KESTREL_CONFIG", ".env KESTREL_CONFIG"])
@pytest.mark.parametrize(
    ("name", "wrong"),
    [("nope.yaml", "does not exist"), (".", "is a folder"), (os.devnull, "is not a regular file")],
)
def test_a_config_file_that_is_not_there_is_named_with_who_named_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named_by: str, name: str, wrong: str
) -> None:
    # A KESTREL_CONFIG exported long ago, or a line of .env, was not named: the error read as
    # if the command line had asked for the file.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KESTREL_CONFIG", raising=False)
    if named_by == ".env KESTREL_CONFIG":
        (tmp_path / ".env").write_text(f"KESTREL_CONFIG={name}\n")
    elif named_by == "KESTREL_CONFIG":
        monkeypatch.setenv("KESTREL_CONFIG", name)
    with pytest.raises(ConfigError) as caught:
        load_settings(name if named_by == "--config" else None)
    assert str(caught.value).startswith(f"config file {name} ({named_by}) {wrong}")


@pytest.mark.parametrize(
    ("make", "wrong"),
    [
        (Path.mkdir, "is a folder, not a file"),
        (lambda path: path.symlink_to("gone.yaml"), "links to gone.yaml: no such file"),
        (os.mkfifo, "is not a regular file"),
    ],
)
def test_a_kestrel_yaml_that_is_no_file_is_refused_not_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Callable[[Path], object], wrong: str
) -> None:
    # A container's bind mount of a kestrel.yaml missing on the host makes a folder there:
    # it was passed over, and Kestrel ran on the defaults (the demo's model and tools).
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KESTREL_CONFIG", raising=False)
    make(tmp_path / "kestrel.yaml")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value) == f"config file kestrel.yaml (read by default) {wrong}"


@pytest.mark.parametrize("given", ["", " "])
def test_an_empty_config_option_is_refused_not_read_as_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    # `kestrel --config "$CONFIG" runs approve …` with CONFIG unset read ./kestrel.yaml: the
    # settings, and the journal, of whatever folder the script ran in.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KESTREL_CONFIG", raising=False)
    (tmp_path / "kestrel.yaml").write_text("database: other.db\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(given)
    assert str(caught.value) == (
        "--config: the path is empty (leave the option out for ./kestrel.yaml)"
    )


def test_yaml_nested_past_the_parser_is_one_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "kestrel.yaml"
    config.write_text("model: " + "[" * 2000 + "]" * 2000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_settings(str(config))


COMPOSED_IN_CODE = """
import json, sys
from bot.llm.scripted import ScriptedProvider
from bot.run.runtime import Runtime
ScriptedProvider.from_replies([{"text": "done"}], name="code")
print(json.dumps("yaml" in sys.modules))
"""


def test_a_runtime_composed_in_code_loads_no_yaml_parser() -> None:
    # The parser is loaded with the first file read: a library user or a bench pays no memory
    # for it (about 1 MiB resident).
    assert fresh_json(COMPOSED_IN_CODE) is False


def test_the_demo_catalog_stands_in_only_when_no_tools_are_set(tmp_path: Path) -> None:
    server = {"name": "srv", "transport": "stdio", "command": ["srv"]}
    unset = load_settings(str(_written(tmp_path / "a.yaml", "{}")))
    none = load_settings(str(_written(tmp_path / "b.yaml", "tools: []")))
    mcp_only = msgspec.convert({"mcp_servers": [server]}, Settings)

    assert unset.uses_demo_catalog() and unset.tool_patterns()[0].endswith("demo/tools/ops.yaml")
    assert not none.uses_demo_catalog() and none.tool_patterns() == []
    assert not mcp_only.uses_demo_catalog() and mcp_only.tool_patterns() == []
    # tools: [] is no catalog at all: only the tools for asking people remain.
    assert "restart_service" not in build_tools(none, None)
    assert "restart_service" in build_tools(unset, None)


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_no_catalog_starts_where_commands_cannot_be_isolated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Isolation keeps catalog commands from Kestrel's secrets. With tools: [] (or MCP servers
    # alone) there is no command to keep: a host without user namespaces (a pod) must not be
    # refused for want of them, as it was not before tools: [] stopped meaning the demo.
    from bot.cli.compose import checked_isolation
    from bot.tools.isolation import Isolation, IsolationUnavailable

    def unavailable(_self: Isolation) -> None:
        raise IsolationUnavailable("user namespaces are not allowed")

    monkeypatch.setattr(Isolation, "check_remembered", unavailable)
    server = {"name": "srv", "transport": "stdio", "command": ["true"]}
    none = load_settings(str(_written(tmp_path / "a.yaml", "tools: []")))
    mcp_only = msgspec.convert({"mcp_servers": [server]}, Settings)
    catalog = load_settings(str(_written(tmp_path / "b.yaml", "tools: [ops.yaml]")))

    checked_isolation(none)
    checked_isolation(mcp_only)
    with pytest.raises(ConfigError, match="catalog commands cannot be isolated here"):
        checked_isolation(catalog)
