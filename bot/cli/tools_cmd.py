"""``kestrel tools``: the tool catalog."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bot.cli.common import echo, one_line_errors, settings_of


@click.group()
def tools() -> None:
    """The tool catalog."""


@tools.command("list")
@one_line_errors
def tools_list() -> None:
    """The tools a run gets, with their flags."""
    from bot.cli import compose

    settings = settings_of(click.get_current_context())
    toolset = compose.build_tools(settings, compose.build_isolation(settings))
    for name, tool in toolset.items():
        flags = [
            f for f in ("confirm", "idempotent", "operator_paced", "deny") if getattr(tool.flags, f)
        ]
        click.echo(f"{name:<24} {' '.join(flags) or '-':<28} {tool.description}")


@tools.command("check")
@click.argument("files", nargs=-1, type=click.Path())
@one_line_errors
def tools_check(files: tuple[str, ...]) -> None:
    """Validate catalog FILES (by default the configured catalogs) as one tool set; every
    problem is reported with file and line."""
    from bot.tools.catalog import check_catalogs, check_configured
    from bot.tools.propose_plan import human_tools

    # Reserved whether or not human_in_the_loop is on: a catalog must not depend on it being off.
    builtin = [tool.name for tool in human_tools()]
    if files:
        checked = [Path(f) for f in files]
        problems = check_catalogs(checked, reserved=builtin)
    else:
        settings = settings_of(click.get_current_context())
        patterns = settings.tool_patterns()
        checked, problems = check_configured(patterns, settings.base_dir, reserved=builtin)
    for problem in problems:
        echo(problem, err=True)
    if problems:
        sys.exit(1)
    echo(f"{len(checked)} catalog file(s) OK: {', '.join(map(str, checked))}")
