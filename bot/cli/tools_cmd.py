"""``kestrel tools``: the tool catalog."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bot.cli.common import Failure, config_option, echo, one_line_errors, settings_of
from bot.cli.placing import PlacingGroup

if TYPE_CHECKING:
    from bot.config.settings import Settings
    from bot.tools.base import ToolFlags
    from bot.tools.toolset import ToolSet


# Said where the demo's catalog stands in: run where no kestrel.yaml is (a --config forgotten),
# the tools shown are not the person's own.
DEMO_NOTE = "the offline demo's simulated services: no tools: configured here"


@click.group(cls=PlacingGroup)
def tools() -> None:
    """The tool catalog."""


@tools.command("list", short_help="The tools a run gets, with their flags.")
@one_line_errors
def tools_list() -> None:
    """The tools a run gets, with their flags: the MCP servers' too, started to list them."""
    import asyncio

    from bot.cli import compose
    from bot.config.settings import load_settings_sparing

    # The policy decides nothing here: a mistake in it is said, and the tools listed anyway.
    settings, policy_problem = load_settings_sparing(config_option(), spared="policy")
    if policy_problem:
        _warn_of_policy(policy_problem)
    if settings.uses_demo_catalog():
        echo(f"kestrel: {DEMO_NOTE}", err=True)
    if settings.mcp_servers:
        toolset = asyncio.run(_listed(settings))
    else:
        isolation = compose.build_isolation(settings)
        toolset = compose.build_tools(settings, isolation, checked=False)
        _check_names(settings, toolset)
    for name, tool in toolset.items():
        echo(f"{name:<24} {' '.join(flag_words(tool.flags)) or '-':<28} {tool.description}")


def _warn_of_policy(problem: str) -> None:
    """Say the policy's ``problem`` as a warning: the listing goes on without the policy."""
    echo(
        f"kestrel: warning: {problem}; the tools are listed without the policy,"
        " which every command that acts refuses until it is fixed",
        err=True,
    )


def _check_names(settings: Settings, toolset: ToolSet) -> None:
    """The names the policy and deadlines give, checked against the tools listed: a policy's
    misspelt tool is warned of (the listing is where its right name is looked up)."""
    from bot.cli import compose
    from bot.config.settings import ConfigError

    try:
        compose.check_tool_names(settings, toolset)
        compose.check_approvable(settings, toolset)
    except ConfigError as exc:
        if not str(exc).startswith("policy."):
            raise
        _warn_of_policy(str(exc))


async def _listed(settings: Settings) -> ToolSet:
    """The whole tool set, with each MCP server started for its listing and closed. Its
    warnings are heard at a one-shot command's level too: a tool a server lists and the
    listing leaves out (its schema invalid or too large) is said, not silently missing."""
    import logging

    from bot.cli import compose

    mcp_log = logging.getLogger("kestrel.mcp")
    mcp_log.setLevel(min(mcp_log.getEffectiveLevel(), logging.WARNING))

    async with compose.tool_source(settings, checked=False) as source:
        return source.current()


def flag_words(flags: ToolFlags) -> list[str]:
    """A tool's flags as ``tools list`` shows them: what gates a call and what the call is."""
    approval, traits = flags.approval, flags.traits
    words = ["deny"] if approval.deny else []
    if approval.confirm:
        words.append("confirm" if approval.approvals == 1 else f"confirm:{approval.approvals}")
    words += [f"tag:{tag}" for tag in approval.tags]
    if traits.idempotent:
        words.append("idempotent")
    if traits.operator_paced:
        words.append("operator_paced")
    return words


@tools.command("check", short_help="Validate catalog files (by default the configured ones).")
@click.argument("files", nargs=-1, type=click.Path())
@one_line_errors
def tools_check(files: tuple[str, ...]) -> None:
    """Validate catalog FILES (by default the configured catalogs) as one tool set; every
    problem is reported with file and line."""
    from bot.tools.catalog import check_catalogs, check_configured
    from bot.tools.propose_plan import human_tools

    # Reserved whether or not human_in_the_loop is on: a catalog must not depend on it being off.
    builtin = [tool.name for tool in human_tools()]
    demo = ""
    if files:
        if not all(f.strip() for f in files):  # a script's "$CATALOG" unset: Path("") is "."
            raise Failure(
                "tools check: a FILE is empty: name catalog files, or none for the configured ones"
            )
        checked = [Path(f) for f in files]
        settings_files = [path for path in checked if _is_configuration(path)]
        problems = [
            f"{path}: a configuration (kestrel.yaml), not a catalog: kestrel --config {path}"
            " tools check checks the catalogs it names"
            for path in settings_files
        ]
        catalogs = [path for path in checked if path not in settings_files]
        problems += check_catalogs(catalogs, reserved=builtin) if catalogs else []
    else:
        settings = settings_of(click.get_current_context())
        patterns = settings.tool_patterns()
        checked, problems = check_configured(patterns, settings.base_dir, reserved=builtin)
        problems = (problems or _named_problems(settings)) + mcp_problems(settings)
        demo = f" ({DEMO_NOTE})" if settings.uses_demo_catalog() else ""
    for problem in problems:
        echo(problem, err=True)
    if problems:
        sys.exit(1)
    if not checked:
        echo("no catalog configured: nothing to check")
        return
    echo(f"{len(checked)} catalog file(s) OK: {', '.join(map(str, checked))}{demo}")


def _named_problems(settings: Settings) -> list[str]:
    """The tool names ``policy.approvers`` and ``deadlines.per_tool`` give that the catalogs
    lack: ``run``, ``chat`` and ``serve`` refuse them, so a check that passed them would pass a
    configuration no replica starts with."""
    from bot.cli import compose
    from bot.config.settings import ConfigError

    try:
        tools = compose.build_tools(settings, None, checked=False)
        compose.check_tool_names(settings, tools)
        compose.check_approvable(settings, tools)
    except ConfigError as exc:
        return [str(exc)]
    return []


def mcp_problems(settings: Settings) -> list[str]:
    """Each stdio MCP server whose command cannot start on this host (as ``run``, ``chat`` and
    ``serve`` would start it: on its ``env``'s PATH, else ours, from its ``cwd``, else ours),
    which every one of them refuses to start with. No server is started: ``tools list`` does."""
    import os

    from bot.tools.isolation import unstartable

    problems: list[str] = []
    for server in settings.mcp_servers:
        if server.transport != "stdio":
            continue
        where = f"mcp_servers: MCP server {server.name}"
        cwd = settings.resolve(server.cwd) if server.cwd else Path.cwd()
        if not cwd.is_dir():
            problems.append(f"{where}: cwd {server.cwd!r} is not a folder here ({cwd})")
            continue
        program = server.command[0]
        path = server.env.get("PATH", os.environ.get("PATH", os.defpath))
        reason = unstartable(program, path, cwd)
        if reason is None:
            continue
        if "/" not in program:
            problems.append(f"{where}: command {program!r} is not on its PATH")
        else:
            problems.append(f"{where}: command {program!r} cannot start: {reason} (from {cwd})")
    return problems


def _is_configuration(path: Path) -> bool:
    """Whether ``path`` reads as a kestrel.yaml: a mapping whose keys are all settings, one at
    least no catalog has, or ``tools:`` alone (a catalog's key too) listing file names, not
    tools. What cannot be read is left to the catalog check, which names the problem."""
    from bot.config.settings import Settings
    from bot.plain import fields_of
    from bot.tools.catalog import CatalogFile
    from bot.yamldoc import NotYaml, safe_load

    try:
        data = safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, NotYaml, RecursionError):
        return False
    if not isinstance(data, dict) or not data:
        return False
    keys = set(data)
    if not keys <= fields_of(Settings).keys():
        return False
    if not keys <= fields_of(CatalogFile).keys():
        return True
    tools = data.get("tools")
    return isinstance(tools, list) and bool(tools) and all(isinstance(t, str) for t in tools)
