"""Deciding a waiting request from the command line (``kestrel runs approve``, ``deny``,
``answer``, ``effect``), and ``runs approve`` and ``deny`` read without click.

An approver waits on ``runs approve`` after every request, and click's import was a twentieth
of its whole process. So the ``kestrel`` script reads these two commands itself when they are
written in a form click reads the same way (``read``): options and values it knows, each once,
no value that starts with a dash, two arguments. Anything else (``--help``, a typo, an option
given twice) goes to click, which answers it as before.
tests/bot/cli/test_cli_decisions.py holds the two readings to each other.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec

from bot.cli.common import (
    Failure,
    checked_text,
    configure_logs,
    current_settings,
    echo,
    known_before_the_key,
    named_in_commands,
    one_line_errors,
    terminal_user,
    with_runtime,
)
from bot.cli.driving import driving_chat, exit_if_signalled, run_object

if TYPE_CHECKING:
    from bot.chat.service import ChatService
    from bot.config.settings import Settings
    from bot.domain import DecisionKind
    from bot.people.policy import Actor, PolicyRules
    from bot.run.runtime import Runtime

# Set by a shell asking click to complete a command line.
_COMPLETION: Final = "_KESTREL_COMPLETE"
# Before the command: the top-level options that take a value, and its flags.
_TOP_VALUES: Final = frozenset({"--config", "--log-level"})
_TOP_FLAGS: Final = frozenset({"-v", "--verbose"})
_LOG_LEVELS: Final = frozenset({"debug", "info", "warning", "error"})
# After it: each command's options that take a value, and its flags.
_VALUES: Final = {"approve": frozenset({"--as"}), "deny": frozenset({"--as", "--reason"})}
_FLAGS: Final = {"approve": frozenset({"--always", "--step-by-step"}), "deny": frozenset()}
# The text a decision of each kind carries, as its option or argument names it.
_TEXT_OF: Final = {"answer": "the answer", "deny": "the reason", "done": "the output"}
# The requests an approver decides (RequestKind's values: this module imports bot.kinds only
# when it acts, for a fast `runs approve`).
_DECIDED: Final = frozenset({"wait_approval", "wait_plan"})
# Each kind of request, as a person calls it.
_NOUNS: Final = {
    "wait_approval": "an approval",
    "wait_user": "a question",
    "wait_effect": "an uncertain effect",
    "wait_plan": "a plan",
}
# Each kind of decision, as the command line spells it.
_SPELLED: Final = {
    "approve": "runs approve",
    "approve_always": "--always",
    "step_by_step": "--step-by-step",
    "deny": "runs deny",
    "answer": "runs answer",
    "retry": "runs effect retry",
    "done": "runs effect done",
    "failed": "runs effect failed",
}


class Decision(msgspec.Struct, frozen=True):
    """``runs approve`` or ``runs deny`` as read from the command line."""

    command: str
    run_id: str
    request_id: str
    options: Mapping[str, str | bool]

    def value(self, name: str) -> str | None:
        """The value of option ``name`` (``--as``), None if it was not given."""
        given = self.options.get(name)
        return given if isinstance(given, str) else None

    def flag(self, name: str) -> bool:
        """Whether flag ``name`` (``--always``) was given."""
        return self.options.get(name) is True


def read(argv: Sequence[str]) -> Decision | None:
    """``argv`` (without the program) as a decision, or None to leave it to click."""
    options: dict[str, str | bool] = {}
    rest = _options(argv, _TOP_VALUES, _TOP_FLAGS, options, stop_at_argument=True)
    if rest is None or len(rest) < 2 or rest[0] != "runs" or rest[1] not in _VALUES:
        return None
    command = rest[1]
    arguments = _options(rest[2:], _VALUES[command], _FLAGS[command], options)
    if arguments is None or len(arguments) != 2:
        return None
    decision = Decision(command, arguments[0], arguments[1], options)
    level = decision.value("--log-level")
    if level is not None and level.lower() not in _LOG_LEVELS:
        return None  # click names the choices
    if decision.flag("--always") and decision.flag("--step-by-step"):
        return None  # ``approval`` says they exclude each other
    return decision


def _options(
    tokens: Sequence[str],
    values: frozenset[str],
    flags: frozenset[str],
    into: dict[str, str | bool],
    stop_at_argument: bool = False,
) -> list[str] | None:
    """Read ``tokens``' options into ``into``; the arguments left (from the first one on, if
    ``stop_at_argument``), or None if a token is not read as click would read it."""
    arguments: list[str] = []
    at = 0
    while at < len(tokens):
        token = tokens[at]
        at += 1
        if not token.startswith("-"):
            if stop_at_argument:
                return [token, *tokens[at:]]
            arguments.append(token)
            continue
        name, equals, value = token.partition("=")
        if name in into:
            return None  # given twice: click takes the last one
        if name in flags and not equals:
            into[name] = True
            continue
        if name not in values:
            return None
        if not equals:
            if at == len(tokens):
                return None
            value, at = tokens[at], at + 1
        if not value or value.startswith("-"):
            return None  # click may read it otherwise: let it say what it reads
        into[name] = value
    return arguments


def answered(argv: Sequence[str]) -> bool:
    """Decide here if ``argv`` is ``runs approve`` or ``deny`` as ``read`` reads it; False
    leaves the command line to click (and so does a shell asking click for completions)."""
    if _COMPLETION in os.environ:
        return False
    try:
        decision = read(argv)
        if decision is None:
            return False
        verbose = decision.flag("-v") or decision.flag("--verbose")
        configure_logs(decision.value("--log-level"), verbose, serving=False)
        one_line_errors(_decide_as_read)(decision)
    except KeyboardInterrupt:  # before the run's own handlers, or after: as click ends
        echo("", err=True)  # the line the terminal's ^C began
        echo("Aborted!", err=True)
        sys.exit(1)
    return True


def _decide_as_read(decision: Decision) -> None:
    from bot.config.settings import load_settings
    from bot.domain import DecisionKind

    if decision.command == "deny":
        kind, text = DecisionKind.DENY, decision.value("--reason") or ""
    else:
        kind, text = approval(decision.flag("--always"), decision.flag("--step-by-step")), ""
    settings = load_settings(decision.value("--config"))
    decide(decision.run_id, decision.request_id, kind, text, decision.value("--as"), settings)


def approval(always: bool, step_by_step: bool) -> DecisionKind:
    """The kind of an approval given with ``--always`` or ``--step-by-step`` (or neither)."""
    from bot.domain import DecisionKind

    if always and step_by_step:
        raise Failure("--always and --step-by-step exclude each other")
    if step_by_step:
        return DecisionKind.STEP_BY_STEP
    return DecisionKind.APPROVE_ALWAYS if always else DecisionKind.APPROVE


def decide(
    run_id: str,
    request_id: str,
    kind: DecisionKind,
    text: str,
    user: str | None,
    settings: Settings | None = None,
) -> None:
    """Decide the request as ``user``, resume the run if it can go on, and say where it is now
    and what it waits on next."""
    from bot.kinds import DecisionKind

    checked_text(text, _TEXT_OF.get(kind, "the text"))  # before the request is touched
    settings = settings or current_settings()
    known_before_the_key(settings, run_id, request_id)

    async def work(rt: Runtime) -> str:
        # Imported once the runtime is built: a helper standing by starts before them.
        from bot.people.policy import Actor

        chat = driving_chat(rt, received)
        actor = Actor(terminal_user(user))
        decided = await chat.decide(run_id, request_id, kind, user=actor, text=text)
        if not decided.accepted:
            said = await _misfit(chat, request_id, kind, actor.user)
            if not said:
                refused = decided.message
                said = refused + await _own_run(chat, run_id, request_id, refused, actor)
                said += await _asked_inline(rt, run_id, refused)
            raise Failure(said)
        if decided.resumed is not None:
            await chat.wait(decided.resumed)
            if decided.resumed.error:
                # Its task stopped on the store: the run is no longer "running" anywhere, and
                # the decision, recorded, is not undone by this failure.
                raise Failure(
                    f"{decided.message}; run {run_id} stopped here: {decided.resumed.error};"
                    f" it goes on from its journal when resumed (kestrel runs resume {run_id})"
                    " or adopted by a replica"
                )
        elif not await chat.ended(run_id):
            obj = await run_object(rt, run_id)
            return "\n".join([decided.message, *waiting_lines(obj, actor.user, rt.policy.settings)])
        obj = await run_object(rt, run_id)
        # A run that failed has no text: its error is why (the model gone, a budget spent).
        ended = obj["text"] or obj["error"]
        said = f"{decided.message}; run {run_id} is now {obj['status']}" + (
            f": {ended}" if ended else ""
        )
        return "\n".join([said, *waiting_lines(obj, actor.user, rt.policy.settings)])

    received: list[int] = []
    # A decision that lets the call it answers run (an approval, a retry of an uncertain one):
    # the command's isolation helper starts with the runtime, on another core while the run is
    # loaded (bot.tools.standby).
    runs_call = kind in (
        DecisionKind.APPROVE,
        DecisionKind.APPROVE_ALWAYS,
        DecisionKind.STEP_BY_STEP,
        DecisionKind.RETRY,
    )
    echo(with_runtime(work, settings, standby=runs_call))
    exit_if_signalled(received)


async def _misfit(chat: ChatService, request_id: str, kind: DecisionKind, user: str) -> str:
    """What ``kind`` is for and the command that answers the request instead, in the command
    line's words (as ``user`` would give it), when ``kind`` cannot answer a request of its kind
    at all (the policy's refusal says so in the journal's names); "" when the refusal was for
    another reason."""
    from bot.kinds import RequestKind, RequestStatus, how_answered
    from bot.people.policy import fits

    view = await chat.request(request_id)
    if view is None or view.status is not RequestStatus.OPEN or fits(kind, view.request.kind):
        return ""
    request = view.request
    meant = " or ".join(f"{_NOUNS[k]} ({k})" for k in RequestKind if fits(kind, k))
    how = how_answered(
        request.kind,
        request.run_id,
        request.id,
        request.options,
        acting_as=named_in_commands(user),
    )
    return f"{_SPELLED[kind]} is for {meant}; this is {_NOUNS[request.kind]}: {how}"


async def _own_run(
    chat: ChatService, run_id: str, request_id: str, refusal: str, actor: Actor
) -> str:
    """What the requester, refused the approval of their own run, can do at this terminal:
    approve as someone the policy names by id (``--as``), or in ``kestrel chat``, whose
    operator may approve their own run when one approval is needed; "" for other refusals."""
    from bot.people.policy import EVERYONE, OWN_RUN, PRINCIPAL_KINDS

    view = await chat.request(request_id) if refusal.startswith(OWN_RUN) else None
    if view is None:
        return ""
    named = [p for p in view.may_answer if p.partition(":")[0] not in PRINCIPAL_KINDS]
    ways = []
    if EVERYONE in named or any(p != actor.user for p in named):
        command = f"kestrel runs approve {run_id} {request_id} --as NAME"
        ways.append(f"approve as one of them ({command})")
    if view.request.approvals_needed <= 1:
        ways.append(f"resume the run in kestrel chat (/resume {run_id}), where you may approve it")
    return f". At this terminal, {', or '.join(ways)}" if ways else ""


async def _asked_inline(rt: Runtime, run_id: str, refusal: str) -> str:
    """Why a request id of a running run is not in the store: ``kestrel chat`` asks its run's
    requests inline and writes one down for others only when it is left for later; "" for
    other refusals, and for a run that runs nowhere now. A run that does not exist either is
    said instead (``UnknownRun``), as where the run alone is named."""
    from bot.kinds import RunStatus
    from bot.people.decisions import NO_REQUEST

    if not refusal.startswith(NO_REQUEST):
        return ""
    record = await rt.store.get_run(run_id)
    if record.status is not RunStatus.RUNNING:
        return ""
    return (
        f" here (yet): run {run_id} is running in {record.owner}; a request kestrel chat asks"
        " there is answered there, and here only once it is left for later (l)"
    )


def waiting_lines(obj: dict[str, Any], reader: str, rules: PolicyRules) -> list[str]:
    """The requests a run (``run_object``) waits on now, each with its id and the command that
    answers it, as ``reader`` would give it (the requester approves as someone else, unless
    ``rules`` let them approve their own); of a run a person stopped, the resume it waits on.
    A reader who gave ``--as`` is named in the commands that are theirs to give (an approval;
    of their own run, an answer too), so that one pasted as printed acts as them."""
    from bot.cli.render import object_details
    from bot.kinds import StopReason, how_answered
    from bot.people.policy import requester_approves

    paused = not obj["requests"] and obj["stop_reason"] == StopReason.INTERRUPTED
    if not obj["requests"] and not paused:
        return []  # a run that ended: no command to print
    own = obj["requested_by"] == reader
    # A question of someone else's run is its requester's to answer, not the approver's; the
    # login name (getpass, without $USER) is looked up only for a command that names them.
    named = own or any(request["kind"] in _DECIDED for request in obj["requests"])
    acting_as = named_in_commands(reader) if named else ""
    lines = []
    for request in obj["requests"]:
        args = json.dumps(request["arguments"], sort_keys=True)
        ids = (obj["run_id"], request["id"], request["options"])
        requester = own and not requester_approves(rules, request["approvals_needed"])
        theirs = own or request["kind"] in _DECIDED
        how = how_answered(
            request["kind"], *ids, requester=requester, acting_as=acting_as if theirs else ""
        )
        lines.append(f"  waiting: {request['kind']} {request['id']} {request['tool']} {args}")
        # As `runs pending` shows it: the command below approves a plan's steps, a call off
        # the approved plan, values taken from tool output; none of it unseen.
        lines += object_details(request)
        lines.append(f"    {how}" if how else "")
    if paused:
        lines.append(_paused_line(obj, reader, acting_as if own else ""))
    return [line for line in lines if line]


def _paused_line(obj: dict[str, Any], reader: str, acting_as: str) -> str:
    """How a run a person stopped (Ctrl-C, SIGTERM) goes on: it waits for a resume, which only
    its requester or on-call may give, and no replica takes it up alone."""
    from bot.kinds import as_flag

    command = f"kestrel runs resume {obj['run_id']}{as_flag(acting_as)}"
    if obj["requested_by"] == reader:
        return f"  stopped: {command} takes it up"
    return f"  stopped: {command} takes it up (its requester, {obj['requested_by']}, or on-call)"
