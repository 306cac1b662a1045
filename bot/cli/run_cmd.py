"""``kestrel run``: one prompt headless."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from bot.cli.common import (
    Failure,
    as_option,
    checked_text,
    current_settings,
    echo,
    exit_status,
    one_line_errors,
    terminal_user,
    with_runtime,
)
from bot.cli.decisions import waiting_lines
from bot.cli.driving import exit_if_signalled, run_object, say_model_waits, suspend_on_signals

if TYPE_CHECKING:
    from bot.run.runtime import Runtime


# The prompt argument that asks for the prompt on stdin, as for most Unix tools.
FROM_STDIN = "-"


@click.command(short_help="Run one prompt headless; --defer waits for people.")
@click.argument("prompt")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--defer", is_flag=True, help="Defer approvals and questions: suspend and exit.")
@as_option("Who asks.")
@one_line_errors
def run(prompt: str, as_json: bool, defer: bool, user: str | None) -> None:
    """Run one PROMPT headless: gated calls are refused (or deferred with --defer). A PROMPT
    of - is read from stdin (echo "checkout is down" | kestrel run -).

    The exit status says how the run stopped (with --json too):

    \b
      0  completed
      1  failed (model error, budget or deadline, no progress, refused, internal error)
      2  not run: bad usage, configuration or store (one line on stderr)
      3  suspended: waits for an approval, an answer or on-call (kestrel runs pending)
      4  cancelled
      128+N  stopped by signal N (130 Ctrl-C, 143 SIGTERM): the run is suspended
    """
    # Before any run starts: nothing is journaled for a prompt no run should be started on.
    if prompt == FROM_STDIN:
        current_settings()  # a broken configuration said before a prompt is typed, not after
        prompt = _stdin_prompt()
        if not prompt.strip():
            raise Failure("the prompt is empty (read from stdin, as - asks)")
    if not prompt.strip():
        raise Failure("the prompt is empty")
    prompt = checked_text(prompt, "the prompt")

    from bot.chat.service import ChatService
    from bot.cli.compose import check_approvable
    from bot.people.policy import Actor
    from bot.prompter import DeferringPrompter
    from bot.run.supervisor import Supervisor

    async def work(rt: Runtime) -> dict[str, Any]:
        if defer:
            check_approvable(current_settings(), rt.tools.current())
        say_model_waits(rt)
        supervisor = Supervisor(rt)
        prompter = DeferringPrompter() if defer else None
        chat = ChatService(supervisor)
        live = await chat.submit_turn(prompt, user=Actor(terminal_user(user)), prompter=prompter)
        suspend_on_signals(supervisor, received)
        await chat.wait(live)
        if live.error:
            raise Failure(live.error)
        return await run_object(rt, live.run_id)

    received: list[int] = []
    obj = with_runtime(work)
    print_run(obj, as_json, terminal_user(user))
    exit_if_signalled(received)
    sys.exit(exit_status(obj["status"]))


def _stdin_prompt() -> str:
    """The whole of stdin, as ``checked_text`` reads an argument: bytes that are not UTF-8 kept
    as lone surrogates, for it to name. Its last line ends are left out, as a shell's
    ``$(…)`` leaves them. At a terminal, how to end it is said first."""
    stream = sys.stdin
    if stream is None:  # closed before the command started: nothing to read
        return ""
    if stream.isatty():
        echo("kestrel: reading the prompt from stdin; end it with Ctrl-D", err=True)
    return stream.buffer.read().decode("utf-8", errors="surrogateescape").rstrip("\r\n")


def print_run(obj: dict[str, Any], as_json: bool, reader: str) -> None:
    """A run's answer on stdout, its status and waits (as ``reader`` answers them under the
    policy) on stderr (or one JSON object)."""
    if as_json:
        echo(json.dumps(obj, indent=2, sort_keys=True))
        return
    if obj["text"]:
        echo(obj["text"])
    echo(f"[{obj['run_id']}: {obj['status']}, {obj['stop_reason']}]", err=True)
    if obj["error"]:
        echo(f"  {obj['error']}", err=True)
    # As `runs approve` says what the run waits on next.
    for line in waiting_lines(obj, reader, current_settings().policy):
        echo(line, err=True)
