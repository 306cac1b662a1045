"""Commands say the truth: the version, help, ``db check`` that only reads, install hints."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import sqlite3
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import click
import pytest

from bot import DISTRIBUTION, __version__
from bot.cli.commands import cli
from tests.bot.cli.test_cli import kestrel, write_config

PG_DSN = os.environ.get("KESTREL_TEST_POSTGRES_DSN", "")


def test_version_and_h_everywhere(tmp_path: Path) -> None:
    version = kestrel(tmp_path, "--version")
    assert version.returncode == 0 and version.stdout == f"kestrel {__version__}\n"
    for args in (("-h",), ("runs", "-h"), ("runs", "list", "-h"), ("db", "check", "-h")):
        helped = kestrel(tmp_path, *args)
        assert helped.returncode == 0 and helped.stdout.startswith("Usage: kestrel"), args
    pyproject = (Path(__file__).resolve().parents[3] / "pyproject.toml").read_text()
    assert f'name = "{DISTRIBUTION}"' in pyproject and 'attr = "bot.__version__"' in pyproject


def helps(command: click.Command, path: str) -> Iterator[tuple[str, str]]:
    """``(command line, its --help)`` for ``command`` and every subcommand under it."""
    context = click.Context(command, info_name=path)
    yield path, command.get_help(context)
    if isinstance(command, click.Group):
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            assert sub is not None
            yield from helps(sub, f"{path} {name}")


def test_help_is_plain_text_without_markup() -> None:
    # Click prints a docstring as written: the RST the code's docstrings use would show raw.
    shown = dict(helps(cli, "kestrel"))
    assert len(shown) > 20  # every command, the groups' too
    assert [path for path, text in shown.items() if "`" in text] == []


def commands(command: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
    """``(command line, command)`` for ``command`` and every subcommand under it."""
    yield path, command
    if isinstance(command, click.Group):
        context = click.Context(command, info_name=path)
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            assert sub is not None
            yield from commands(sub, f"{path} {name}")


def test_every_option_says_what_it_does() -> None:
    # --limit (runs list, audit) and health's --timeout showed a range and a default alone.
    silent = [
        f"{path} {param.opts[0]}"
        for path, command in commands(cli, "kestrel")
        for param in command.params
        if isinstance(param, click.Option) and not param.help
    ]
    assert silent == []


def test_every_option_names_what_it_takes_in_words() -> None:
    # ``kestrel --help`` showed ``--config PATH`` where the README, and the hint for --config
    # given after a command, say ``--config FILE``; click's type names are no one's words.
    typed = {"PATH", "INTEGER", "FLOAT", "INTEGER RANGE", "FLOAT RANGE", "FILENAME"}
    shown = [
        f"{path} {param.opts[0]} {metavar}"
        for path, command in commands(cli, "kestrel")
        for param in command.params
        if isinstance(param, click.Option) and not param.is_flag
        if (metavar := param.make_metavar(click.Context(command))) in typed
    ]
    assert shown == []


def documented_commands() -> dict[str, str]:
    """The command line's table in docs/configuration.md: each command's words, by its path
    (``kestrel runs list``)."""
    docs = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"
    found: dict[str, str] = {}
    for line in docs.read_text().splitlines():
        if not line.startswith("| `kestrel "):
            continue
        first_cell = re.split(r"(?<!\\)\|", line)[1]
        for spec in re.findall(r"`([^`]*)`", first_cell):
            words = spec.removeprefix("kestrel ").split()
            path = " ".join(itertools.takewhile(re.compile("[a-z]+").fullmatch, words))
            found[f"kestrel {path}"] = found.get(f"kestrel {path}", "") + " " + spec
    return found


def test_every_option_is_in_the_docs_table() -> None:
    # `runs pending`, `replicas` and `runs resume` print --json, whose --help points to
    # docs/configuration.md, and its table did not say they take it; nor health's --timeout.
    table = documented_commands()
    unsaid = [
        f"{path} {param.opts[0]}"
        for path, command in commands(cli, "kestrel")
        if not isinstance(command, click.Group)
        for param in command.params
        if isinstance(param, click.Option) and param.opts[0] != "--help"
        if not any(opt in table.get(path, "") for opt in param.opts)
    ]
    assert unsaid == []


def test_no_command_is_cut_short_in_its_groups_help(tmp_path: Path) -> None:
    # At 80 columns (a pipe's, a narrow terminal's) the listing cut eleven of them with "...":
    # "chat  Chat in the terminal (the offline demo when no model endpoint..." first of all.
    for group in ((), ("runs",), ("tools",), ("db",)):
        shown = kestrel(tmp_path, *group, "--help").stdout
        listed = shown.split("Commands:\n", 1)[1].splitlines()
        assert listed and [line for line in listed if line.endswith("...")] == [], group


def older_schema(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT)")
        conn.execute("INSERT INTO schema_version VALUES (1, 'then')")
    conn.close()


def test_db_check_only_reads(tmp_path: Path) -> None:
    missing = kestrel(tmp_path, "db", "check")
    assert missing.returncode == 1 and "no schema yet" in missing.stderr
    assert not list(tmp_path.iterdir())  # no kestrel.db, nothing else
    db = tmp_path / "kestrel.db"
    older_schema(db)
    before = db.read_bytes()
    behind = kestrel(tmp_path, "db", "check")
    assert behind.returncode == 1 and "schema version 1" in behind.stderr
    assert "kestrel db migrate" in behind.stderr and "Traceback" not in behind.stderr
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kestrel.db"]
    db.unlink()
    assert kestrel(tmp_path, "db", "migrate").returncode == 0
    checked = kestrel(tmp_path, "db", "check")
    assert checked.returncode == 0 and "ok, schema version" in checked.stdout


@pytest.mark.skipif(not PG_DSN, reason="set KESTREL_TEST_POSTGRES_DSN to check PostgreSQL")
def test_db_check_on_postgres_creates_no_schema(tmp_path: Path) -> None:
    import asyncpg

    schema = f"dbcheck_{uuid.uuid4().hex[:12]}"
    write_config(tmp_path, database=f"{PG_DSN}?schema={schema}")
    missing = kestrel(tmp_path, "db", "check")
    assert missing.returncode == 1 and "no schema yet" in missing.stderr

    async def schemas() -> int:
        conn = await asyncpg.connect(PG_DSN)
        try:
            query = "SELECT count(*) FROM pg_namespace WHERE nspname = $1"
            return int(await conn.fetchval(query, schema))
        finally:
            await conn.close()

    assert asyncio.run(schemas()) == 0


@pytest.mark.skipif(not PG_DSN, reason="set KESTREL_TEST_POSTGRES_DSN to check PostgreSQL")
def test_no_database_password_reaches_the_terminal(tmp_path: Path) -> None:
    import asyncpg

    schema = f"shown_{uuid.uuid4().hex[:12]}"
    parts = urlsplit(PG_DSN)
    user, _, host = parts.netloc.rpartition("@")
    # Trust authentication ignores both passwords; libpq reads either spelling.
    with_passwords = parts._replace(
        netloc=f"{user}:UserInfoPW@{host}", query=f"schema={schema}&password=QuerySecret99"
    )
    write_config(tmp_path, database=urlunsplit(with_passwords))
    try:
        checked = kestrel(tmp_path, "db", "check")
        chatted = kestrel(tmp_path, "chat")
    finally:

        async def drop() -> None:
            conn = await asyncpg.connect(PG_DSN)
            try:
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            finally:
                await conn.close()

        asyncio.run(drop())
    assert checked.returncode == 1 and f"(schema {schema}): no schema yet" in checked.stderr
    assert chatted.returncode == 0 and f"(schema {schema}). /help" in chatted.stdout
    for said in (checked.stdout, checked.stderr, chatted.stdout, chatted.stderr):
        assert "UserInfoPW" not in said and "QuerySecret99" not in said


def test_a_missing_extra_names_what_installs_it(tmp_path: Path) -> None:
    # asyncpg made unimportable for this process alone, as on an install without the extra.
    shadow = tmp_path / "shadow" / "asyncpg"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no asyncpg here')\n")
    write_config(tmp_path, database="postgresql://kestrel@127.0.0.1:1/kestrel")
    env = {"PYTHONPATH": f"{shadow.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for args in (("db", "check"), ("runs", "show", "run_x")):
        result = kestrel(tmp_path, *args, env=env)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert f"pip install '{DISTRIBUTION}[postgres]'" in result.stderr
        assert "pip install -e '.[postgres]'" in result.stderr


TOOL = """\
tools:
  - name: {name}
    description: x
    command: ["true"]
"""


def test_tools_list_shows_every_tool_with_what_gates_it(tmp_path: Path) -> None:
    (tmp_path / "ops.yaml").write_text(
        TOOL.format(name="restart")
        + "    confirm: true\n    approvals: 2\n    tags: [prod]\n"
        + TOOL.format(name="status").removeprefix("tools:\n")
        + "    idempotent: true\n"
    )
    write_config(tmp_path, tools=["ops.yaml"])
    listed = kestrel(tmp_path, "tools", "list")
    assert listed.returncode == 0, listed.stderr
    # Columns: the name (24), the flags (28), the description.
    rows = {line[:24].strip(): line[25:53].split() for line in listed.stdout.splitlines()}
    assert rows["restart"] == ["confirm:2", "tag:prod"]
    assert rows["status"] == ["idempotent"]
    assert rows["ask_human_input"] == ["idempotent", "operator_paced"]


def test_tools_list_lists_the_tools_past_a_policy_mistake_and_warns(tmp_path: Path) -> None:
    # The policy decides nothing in a listing: a typo there is said, and the tools listed.
    (tmp_path / "ops.yaml").write_text(TOOL.format(name="restart") + "    confirm: true\n")
    write_config(tmp_path, tools=["ops.yaml"], policy={"aprovers": {"*": ["*"]}})

    listed = kestrel(tmp_path, "tools", "list")

    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split()[1:] for line in listed.stdout.splitlines()}
    assert rows["restart"][:1] == ["confirm"] and "ask_human_input" in rows
    assert listed.stderr == (
        "kestrel: warning: kestrel.yaml: policy.aprovers: unknown key (did you"
        " mean approvers?); the tools are listed without the policy, which every command that"
        " acts refuses until it is fixed\n"
    )
    # A mistake elsewhere still stops it, and the policy's is named with it.
    write_config(tmp_path, tools=["ops.yaml"], policy={"aprovers": {}}, budgets={"max": 1})
    refused = kestrel(tmp_path, "tools", "list")
    assert refused.returncode == 2 and "budgets.max: unknown key" in refused.stderr
    assert "policy.aprovers" in refused.stderr


def test_tools_list_lists_the_tools_past_an_approver_naming_no_tool(tmp_path: Path) -> None:
    # The approvers' key misspelt is the likeliest policy mistake, and the listing is where one
    # looks up the right name: it must not be the one command that refuses to show it.
    (tmp_path / "ops.yaml").write_text(TOOL.format(name="restart") + "    confirm: true\n")
    write_config(tmp_path, tools=["ops.yaml"], policy={"approvers": {"restrat": ["*"]}})

    listed = kestrel(tmp_path, "tools", "list")

    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split()[0] == "restart"
    assert listed.stderr == (
        "kestrel: warning: policy.approvers: 'restrat' names no tool or tag here (did you mean"
        " 'restart'?); the tools are listed without the policy, which every command that acts"
        " refuses until it is fixed\n"
    )
    assert "'restrat' names no tool" in kestrel(tmp_path, "run", "hello").stderr


def test_tools_list_shows_the_mcp_servers_tools_too(tmp_path: Path) -> None:
    server = Path(__file__).resolve().parents[2] / "fakes" / "mcp_server.py"
    write_config(
        tmp_path,
        tools=[],
        mcp_servers=[
            {"name": "srv", "transport": "stdio", "command": [sys.executable, str(server)]}
        ],
    )
    listed = kestrel(tmp_path, "tools", "list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split()[1:] for line in listed.stdout.splitlines()}
    assert rows["srv__lookup"][:3] == ["tag:mcp", "tag:mcp:srv", "idempotent"]
    assert rows["srv__restart"][:3] == ["confirm", "tag:mcp", "tag:mcp:srv"]
    assert "ask_human_input" in rows


def test_tools_check_says_an_mcp_server_whose_command_cannot_start(tmp_path: Path) -> None:
    # Passed as "nothing to check", then run, chat and serve all refused to start: the
    # server's command is checked as a catalog program is, without starting the server.
    (tmp_path / "srv").mkdir()
    server = Path(__file__).resolve().parents[2] / "fakes" / "mcp_server.py"
    servers = [
        {"name": "fine", "transport": "stdio", "command": [sys.executable, str(server)]},
        {"name": "typo", "transport": "stdio", "command": ["no-such-mcp-server", "--stdio"]},
        {"name": "near", "transport": "stdio", "command": ["./serve.sh"], "cwd": "srv"},
        {"name": "http", "transport": "http", "url": "http://127.0.0.1:9/mcp"},
    ]
    write_config(tmp_path, tools=[], mcp_servers=servers)

    checked = kestrel(tmp_path, "tools", "check")

    assert checked.returncode == 1, checked.stderr
    assert checked.stderr.splitlines() == [
        "mcp_servers: MCP server typo: command 'no-such-mcp-server' is not on its PATH",
        "mcp_servers: MCP server near: command './serve.sh' cannot start: No such file or"
        f" directory (from {tmp_path / 'srv'})",
    ]
    assert checked.stdout == ""
    write_config(tmp_path, tools=[], mcp_servers=servers[:1])
    assert kestrel(tmp_path, "tools", "check").returncode == 0


def test_tools_check_with_no_catalog_says_so(tmp_path: Path) -> None:
    write_config(tmp_path, tools=[])
    checked = kestrel(tmp_path, "tools", "check")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout == "no catalog configured: nothing to check\n"


def test_tools_check_without_files_checks_the_configured_catalogs(tmp_path: Path) -> None:
    shipped = kestrel(tmp_path, "tools", "check")  # no configuration: the demo catalog
    assert shipped.returncode == 0 and "1 catalog file(s) OK" in shipped.stdout
    assert "demo/tools/ops.yaml" in shipped.stdout
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "a.yaml").write_text(TOOL.format(name="restart"))
    (tmp_path / "tools" / "b.yaml").write_text(TOOL.format(name="restart"))
    write_config(tmp_path, tools=["tools/*.yaml", "missing/*.yaml"])
    checked = kestrel(tmp_path, "tools", "check")
    assert checked.returncode == 1, checked.stderr
    assert checked.stderr.splitlines() == [
        f"missing/*.yaml: catalog pattern matches no file (in {tmp_path})",
        f"{tmp_path}/tools/b.yaml:2: tool 'restart' is also declared at {tmp_path}/tools/a.yaml:2",
    ]
