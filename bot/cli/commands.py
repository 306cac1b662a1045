"""The ``kestrel`` command line: its options, and its subcommands in the order ``--help`` lists
them."""

from __future__ import annotations

import sys
from types import CodeType
from typing import Any, NoReturn

import click

from bot import __version__
from bot.cli import audit_cmd, chat_cmd, run_cmd, runs_cmd, store_cmd, tools_cmd
from bot.cli.common import (
    OutputLost,
    configure_logs,
    output_failed,
    output_lost,
    unheard,
    unread,
    usage_error,
)
from bot.cli.placing import PlacingGroup

# The subcommand modules import click and bot.cli.common alone at import time (each command
# imports what it needs when it runs): ``kestrel --help`` stays light. bench/startup.py times it.


class _Cli(PlacingGroup):
    """The command group, whose usage errors are one JSON record when the logs are JSON lines
    (a start refused by a mistyped platform is a line a log shipper reads as every other)."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            usage_error(exc)
            raise
        except OSError as exc:
            _written_by_click(exc)
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.NoSuchOption as exc:
            placed = _own_option_placed(exc)
            usage_error(placed)
            raise placed from None
        except click.UsageError as exc:
            usage_error(exc)
            raise
        except OutputLost as exc:  # the chat's console; ``echo``'s in a command without
            output_lost(exc)  # one_line_errors
        except BrokenPipeError:
            _output_unread()
        except OSError as exc:
            _written_by_click(exc)
            raise


def _written_by_click(exc: OSError) -> None:
    """End the command if ``exc`` was raised by what click writes itself (``--help`` and
    ``--version`` of every command, to stdout): quietly if its reader left (``_output_unread``),
    else in one line (a full disk: ``OutputLost``). Any other error is left as it is: the stream
    is known only from the frame that wrote to it."""
    if not _raised_in(exc, click.utils.echo.__code__):
        return
    if unheard(exc):
        _output_unread()
    try:
        output_failed(sys.stdout, exc, "stdout")
    except OutputLost as lost:
        output_lost(lost)


def _raised_in(exc: BaseException, code: CodeType) -> bool:
    """Whether ``exc`` was raised in a call of the function whose code is ``code``."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


def _output_unread() -> NoReturn:
    """Output not written through ``echo`` (click's ``--help`` and ``--version``, the chat's
    console) went to a reader that left (``| head``): end quietly with exit 0 (click's status
    for a broken pipe is 1). What ``echo`` writes ends quietly there, the command going on."""
    unread(sys.stdout)
    sys.exit(0)


# kestrel's own options, with what each takes: given after a command, they are said where they go.
_OWN_OPTIONS = {"--config": " FILE", "-v": "", "--verbose": "", "--log-level": " LEVEL"}


def _own_option_placed(exc: click.NoSuchOption) -> click.NoSuchOption:
    """``exc``, saying where an option of kestrel itself goes when one was given after the
    command (``kestrel runs list --config x.yaml``): the usual place for other tools' options."""
    takes = _OWN_OPTIONS.get(exc.option_name)
    if takes is None or exc.ctx is None:
        return exc
    command = exc.ctx.command_path.partition(" ")[2]
    message = (
        f"{exc.message} It is kestrel's own option: give it before the command,"
        f" kestrel {exc.option_name}{takes} {command} …"
    )
    return click.NoSuchOption(exc.option_name, message, exc.possibilities, exc.ctx)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="kestrel", message="%(prog)s %(version)s")
@click.option("--config", "config", type=click.Path(), metavar="FILE", help="kestrel.yaml to use.")
@click.option("-v", "--verbose", is_flag=True, help="Log at info level (--log-level info).")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default=None,
    help="What reaches stderr [KESTREL_LOG_LEVEL, else warning for serve, error for the rest];"
    " KESTREL_LOG_FORMAT=json for one JSON object per line.",
)
@click.pass_context
def cli(ctx: click.Context, config: str | None, verbose: bool, log_level: str | None) -> None:
    """Kestrel: a chat-ops agent with people in the loop."""
    ctx.ensure_object(dict)["config"] = config
    command = ctx.invoked_subcommand
    configure_logs(log_level, verbose, serving=command == "serve", probing=command == "health")


for _command in (
    chat_cmd.chat,
    chat_cmd.serve,
    store_cmd.db,
    store_cmd.replicas,
    run_cmd.run,
    runs_cmd.runs,
    audit_cmd.audit,
    tools_cmd.tools,
    store_cmd.health,
):
    cli.add_command(_command)
