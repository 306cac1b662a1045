"""executeTool: every exit a tool call can take, in the seed's order, under one span."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import traceback
from collections.abc import Callable
from typing import Any, Final

import msgspec
from msgspec.structs import asdict, replace

from bot import wire
from bot.domain import (
    ArgumentOrigin,
    PlanStep,
    Request,
    RequestKind,
    ToolCall,
    ToolOutcome,
    new_id,
)
from bot.eager import started
from bot.events import (
    AdvisoryEvent,
    RequestOpenedEvent,
    ToolExitEvent,
    ToolStartedEvent,
)
from bot.hooks import HookFailure
from bot.journal.entries import (
    AdvisoryEntry,
    GrantWritten,
    ToolDeferred,
    ToolDispatched,
    ToolProcess,
    ToolResultEntry,
)
from bot.journal.writer import TakenOver
from bot.kinds import Provenance
from bot.nesting import loads
from bot.people.audit import Redact, origins_text
from bot.run.arguments import parse_arguments
from bot.run.context import RunContext
from bot.run.gate import Gate
from bot.run.interrupt import Interrupt, Interrupted
from bot.run.origins import consequential
from bot.run.plan import plan_request, proposed_steps
from bot.run.telemetry import span
from bot.tools import orphans
from bot.tools.base import Deferral, Tool, ToolContext, ToolResult
from bot.tools.toolset import ToolSet

log = logging.getLogger("kestrel.execute")

WITHHELD_BY_HOOK = "[output withheld: an output hook failed]"


class HookAbort(Exception):
    """A PreToolUse rewrite named an unregistered tool or carried invalid JSON."""


class CallExit(msgspec.Struct, frozen=True):
    """How one call left executeTool."""

    outcome: ToolOutcome
    output: str
    is_error: bool = False
    request: Request | None = None


class CallEnv(msgspec.Struct):
    """What executeTool needs for the calls of one batch: the run, its tool snapshot, its gate
    and where a call's arguments came from (``Tracer.origins``)."""

    run: RunContext
    tools: ToolSet
    gate: Gate
    trace: Callable[[str, Tool, dict[str, Any]], tuple[ArgumentOrigin, ...]] | None = None


# What a call that a cancel kept from starting after its dispatch was journaled answers.
NOT_STARTED: Final = "not run: the run was cancelled as this call was about to start"


def _error(outcome: ToolOutcome, output: str) -> CallExit:
    return CallExit(outcome, output, is_error=True)


async def execute_tool(call: ToolCall, env: CallEnv) -> CallExit:
    """Run one call through all its checks; journal and count whichever exit it takes."""
    began = time.monotonic()
    with span("tool", tool=call.name, call_id=call.id) as current:
        try:
            result = await _execute(call, env)
        except TakenOver:
            seconds = time.monotonic() - began
            taken = ToolExitEvent(
                env.run.run_id, call.id, call.name, ToolOutcome.TAKEN_OVER, seconds
            )
            env.run.events.emit(taken)
            raise
        current.set("outcome", result.outcome)  # a StrEnum: its value, without asking .value
        await _journal_exit(call, result, env, began)
        return result


async def _execute(call: ToolCall, env: CallEnv) -> CallExit:
    original = env.tools.get(call.name)
    if original is None:
        advice = f"the model called an unknown tool {call.name!r}"
        env.run.events.emit(AdvisoryEvent(env.run.run_id, advice))
        known = ", ".join(sorted(env.tools)) or "none"
        return _error(ToolOutcome.UNKNOWN_TOOL, f"unknown tool {call.name!r}; tools: {known}")
    gated = original.flags.approval.confirm
    try:
        verdict = await env.run.hooks.on_pre_tool(call, env.run.hook_ctx)
    except HookFailure as exc:
        log.warning("run %s: %s", env.run.run_id, exc)
        env.run.events.emit(AdvisoryEvent(env.run.run_id, str(exc)))
        return _error(ToolOutcome.HOOK_DENIED, "denied: a policy hook could not check this call")
    if not verdict.allow:
        return _error(ToolOutcome.HOOK_DENIED, f"denied by policy: {verdict.reason or 'no reason'}")
    effective, raw_arguments = _effective(call, verdict.tool, verdict.arguments, env.tools)
    arguments, problems = parse_arguments(raw_arguments)
    if not problems:
        problems = env.tools.validate(effective.name, arguments)
    if problems:
        return _error(ToolOutcome.INVALID_ARGUMENTS, "invalid arguments: " + "; ".join(problems))
    origins = _origins(call, original, effective, arguments, env)
    must_see = bool(origins) and env.run.provenance is Provenance.ASK
    if gated or effective.flags.approval.confirm or must_see or env.gate.decided(call.id):
        async with env.run.interrupt.guard():  # an approval asked inline may wait on a person
            gate = await env.gate.check(
                call.id, original, effective, arguments, origins, must_see=must_see
            )
        if gate.request is not None:
            return CallExit(ToolOutcome.DEFERRED, gate.reason, request=gate.request)
        if not gate.allowed:
            # A refusal may quote what a person typed (a deny reason): scanned as an answer is.
            return _error(ToolOutcome.GATE_DENIED, await post_tool(call, gate.reason, env))
        for used in env.gate.used():  # commits with the dispatch record, before the effect
            env.run.journal.append_soon(GrantWritten(grant=used))
    return await _dispatch(call, effective, arguments, env)


def traced_steps(steps: list[PlanStep], call_id: str, env: CallEnv) -> list[PlanStep]:
    """A plan's steps with where their values came from, as its card shows them: an approved
    plan covers a step whose values came from tool output only because its card showed that
    (``call_id``: the call before which a step that stands for no call of the reply is traced)."""
    if env.run.provenance is Provenance.OFF or env.trace is None:
        return steps
    traced = []
    for step in steps:
        tool = env.tools[step.tool]
        origins = env.trace(step.call_id or call_id, tool, step.arguments)
        traced.append(replace(step, origins=origins) if origins else step)
    return traced


def _origins(
    call: ToolCall, original: Tool, effective: Tool, arguments: dict[str, Any], env: CallEnv
) -> tuple[ArgumentOrigin, ...]:
    """Where a consequential call's arguments came from, if from tool output; a call that is
    not consequential, or a run with provenance off, pays nothing. Logged, not asked, in
    ``log`` mode (an advisory: journaled, kept from the model)."""
    mode = env.run.provenance
    if mode is Provenance.OFF or env.trace is None:
        return ()
    if not (consequential(original) or consequential(effective)):
        return ()
    origins = env.trace(call.id, effective, arguments)
    if origins and mode is Provenance.LOG:
        said = f"{call.name} took from tool output: {origins_text(origins)}"
        env.run.journal.append_soon(AdvisoryEntry(text=said))
    return origins


def _effective(
    call: ToolCall, name: str | None, arguments: str | None, tools: ToolSet
) -> tuple[Tool, str]:
    """The tool and raw arguments after PreToolUse; a malformed rewrite aborts the run."""
    effective_name = name or call.name
    effective_arguments = arguments if arguments is not None else call.arguments
    tool = tools.get(effective_name)
    if tool is None:
        raise HookAbort(f"a PreToolUse hook rewrote {call.name!r} to unknown tool {name!r}")
    if effective_arguments != call.arguments:
        try:
            loads(effective_arguments)
        except ValueError as exc:
            raise HookAbort(f"a PreToolUse hook rewrote {call.name!r} with invalid JSON") from exc
    return tool, effective_arguments


async def _dispatch(
    call: ToolCall, tool: Tool, arguments: dict[str, Any], env: CallEnv
) -> CallExit:
    traits = tool.flags.traits
    ctx = ToolContext(
        run_id=env.run.journal.run_id,
        call_id=call.id,
        requested_by=env.run.hook_ctx.requested_by,
        prompter=env.run.prompter if traits.needs_prompter else None,
        workdir=env.run.workdir if traits.needs_workdir else None,
        started=None if traits.idempotent else _process_recorder(call, env),
        stamp=env.run.stamp,
    )
    if not await _takeover_check(call, tool, env):
        return _error(ToolOutcome.ERROR, NOT_STARTED)
    env.run.events.announce(ToolStartedEvent, env.run.run_id, call.id, tool.name, arguments)
    outcome, output, is_error, deferral = await _invoke(
        tool, arguments, ctx, env.run.interrupt, env.run.redact
    )
    if deferral is not None and deferral.kind is RequestKind.WAIT_PLAN:
        return await _proposed(call, arguments, deferral.prompt, env)
    if deferral is not None:
        request = env.run.request(
            deferral.kind,
            call.id,
            tool.name,
            arguments,
            id=deferral.request_id or new_id("req"),
            prompt=deferral.prompt,
            options=deferral.options,
        )
        return CallExit(ToolOutcome.DEFERRED, deferral.prompt, request=request)
    output = await post_tool(call, output, env)
    return CallExit(outcome, output, is_error)


async def _proposed(
    call: ToolCall, arguments: dict[str, Any], summary: str, env: CallEnv
) -> CallExit:
    """``propose_plan``: its steps checked against the tool set, then one decision for all
    (now, if someone present answers at once; else later, on a ``wait_plan`` request)."""
    steps, problems = proposed_steps(arguments, env.tools)
    steps = traced_steps(steps, call.id, env)
    if problems:
        return _error(ToolOutcome.INVALID_ARGUMENTS, "no plan was opened: " + "; ".join(problems))
    if not any(step.gated for step in steps):
        return CallExit(ToolOutcome.OK, "no step of this plan needs approval: make the calls")
    request = plan_request(env.run.request, call.id, summary, steps, env.tools)
    async with env.run.interrupt.guard():  # a plan asked inline waits on a person
        decision = await env.gate.ask(request)
    if decision is None:
        return CallExit(ToolOutcome.DEFERRED, summary, request=request)
    output, refused = env.gate.settle_plan(request, decision)
    output = await post_tool(call, output, env)  # a deny reason is what a person typed
    if refused:
        return _error(ToolOutcome.GATE_DENIED, output)
    return CallExit(ToolOutcome.OK, output)


async def _takeover_check(call: ToolCall, tool: Tool, env: CallEnv) -> bool:
    """The last check before an effect: a cancel asked elsewhere, a fenced dispatch record or
    an epoch read, then that cancel again; False if one came as the record was written (the
    call must not start)."""
    look = env.run.look_for_cancel if consequential(tool) else None
    # A cancel another process asked (the store's mark) stops the run here, not only at its
    # next lease renewal: the effect it was asked before never starts (refused below, or as it
    # is invoked).
    before = look is not None and await look()
    if not tool.flags.traits.idempotent:
        # Refused before its dispatch is journaled, not after: a call stopped there never
        # started, and must not come back as an effect whose outcome is unknown.
        env.run.interrupt.refuse()
        await env.run.journal.append(ToolDispatched(call_id=call.id, tool=tool.name))
    elif not await env.run.journal.still_owner():
        raise TakenOver(f"run {env.run.journal.run_id} was claimed by another owner")
    # Read again once the record is durable (or the lease read): a cancel written before then,
    # while the record was, is seen here, and the call is answered as never started; one
    # written after finds the call under way.
    return look is None or before or not await look()


def _process_recorder(call: ToolCall, env: CallEnv) -> Callable[[int], None]:
    """Journals where a dispatched command runs, so a successor can find it if we die."""

    def record(pgid: int) -> None:
        process = orphans.stamp(pgid)
        if process is not None:
            # Queued, not awaited: the command is already running, and a write is never cut.
            env.run.journal.append_soon(ToolProcess(call_id=call.id, process=process))

    return record


async def _invoke(
    tool: Tool,
    arguments: dict[str, Any],
    ctx: ToolContext,
    interrupt: Interrupt,
    redact: Redact,
) -> tuple[ToolOutcome, str, bool, Deferral | None]:
    traits = tool.flags.traits
    limit = None if traits.operator_paced or traits.timeout <= 0 else traits.timeout
    try:
        answer = await _answer(tool, arguments, ctx, interrupt, limit)
    except Interrupted:
        raise
    except TimeoutError as exc:
        if limit is None:  # the tool's own: no timeout of ours was armed
            return _failed(tool, exc, redact)
        # A command's processes are killed, a function cancelled, an MCP server asked to cancel:
        # in each, part of the effect may have happened, which the model must not assume away.
        said = f"timed out after {limit:g}s; the call was cancelled, and what it did so far stands"
        return ToolOutcome.TIMEOUT, said, True, None
    except Exception as exc:
        return _failed(tool, exc, redact)
    if isinstance(answer, Deferral):
        deferral = _checked_deferral(answer)
        if deferral is None:
            # A plugin's code is not type-checked with ours: the request is built from these.
            return ToolOutcome.ERROR, f"the tool deferred with {_shown(answer)}", True, None
        return ToolOutcome.DEFERRED, deferral.prompt, False, deferral
    result = answer if isinstance(answer, ToolResult) else ToolResult(str(answer))
    if type(result.output) is not str or type(result.is_error) is not bool:
        # A plugin's code is not type-checked with ours; the journal holds text and a flag.
        shown = f"{type(result.output).__name__} output, is_error {result.is_error!r}"
        return ToolOutcome.ERROR, f"the tool answered with {shown}, not text", True, None
    # A tool that says it failed (a program that cannot start, an MCP error) failed the call:
    # the tally, metrics and every surface count and show it so, not as ``ok``.
    outcome = ToolOutcome.ERROR if result.is_error else ToolOutcome.OK
    return outcome, result.output, result.is_error, None


def _failed(tool: Tool, exc: Exception, redact: Redact) -> tuple[ToolOutcome, str, bool, None]:
    # The traceback as the PII guard leaves it: an exception's text may quote what the tool was
    # given or fetched (a key, an address), and the log must not hold more than the model.
    said = redact("".join(traceback.format_exception(exc)).rstrip())
    log.warning("tool %s raised\n%s", tool.name, said)
    return ToolOutcome.ERROR, f"the tool failed: {type(exc).__name__}: {exc}", True, None


async def _answer(
    tool: Tool,
    arguments: dict[str, Any],
    ctx: ToolContext,
    interrupt: Interrupt,
    limit: float | None,
) -> object:
    """What the tool answered. Its first step is taken at once: an instant tool is done there,
    with no timer armed. The rest waits inside the interrupt guard and under the timeout."""
    # A call whose dispatch is journaled is under way: a stop that spares tools and came as
    # that record was written lets it start, or its resume would ask on-call about an effect
    # that never began. Anything else starts nothing once a stop is requested.
    under_way = not tool.flags.traits.idempotent
    interrupt.refuse(under_way)
    call = tool.call(arguments, ctx)
    first = started(call)
    if first is not None and first.done:
        return first.result
    interrupt.tool = tool.name
    async with interrupt.guard(tool=True, under_way=under_way), asyncio.timeout(limit):
        return await (call if first is None else first)


def _checked_deferral(deferral: Deferral) -> Deferral | None:
    """The deferral as a request holds it (its kind a ``RequestKind``, its options a tuple),
    each field converted to its declared type; None when one is of no type a request can hold."""
    try:
        return wire.from_plain(asdict(deferral), Deferral)
    except wire.Unreadable:
        return None


def _shown(deferral: Deferral) -> str:
    """A refused deferral's field types (not their content, which may be sensitive)."""
    kind = deferral.kind if isinstance(deferral.kind, str) else type(deferral.kind).__name__
    return (
        f"kind {kind!r}, {type(deferral.prompt).__name__} prompt, "
        f"{type(deferral.options).__name__} options, "
        f"{type(deferral.request_id).__name__} request_id; not a request"
    )


async def post_tool(call: ToolCall, output: str, env: CallEnv) -> str:
    """PostToolUse (the PII guard among them); a failing hook withholds the output."""
    try:
        return await env.run.hooks.on_post_tool(call, output, env.run.hook_ctx)
    except HookFailure as exc:
        log.warning("run %s: %s", env.run.run_id, exc)
        env.run.events.emit(AdvisoryEvent(env.run.run_id, str(exc)))
        return WITHHELD_BY_HOOK


async def _journal_exit(call: ToolCall, result: CallExit, env: CallEnv, began: float) -> None:
    """Journal the exit, then write the grants it staged (never before the call is answered);
    the exit's event says how long since the call entered (``began``, monotonic)."""
    seconds = round(time.monotonic() - began, 6)
    journal = env.run.journal
    if result.request is not None:
        # Opens the request as it lands; said once durable, so a card never shows a request
        # the store does not have. The run's suspend, next, commits with it.
        journal.append_soon(
            ToolDeferred(call_id=call.id, tool=result.request.tool, request=result.request),
            then=functools.partial(
                env.run.events.emit, RequestOpenedEvent(journal.run_id, result.request)
            ),
        )
    else:
        entry = ToolResultEntry(
            call_id=call.id,
            tool=call.name,
            outcome=result.outcome,
            output=result.output,
            is_error=result.is_error,
            seconds=seconds,
        )
        journal.append_soon(entry)
    for grant in env.gate.flush():
        journal.append_soon(GrantWritten(grant=grant))
    if result.request is None:
        await journal.flush()  # the answer and its grants, in one commit
    env.run.events.announce(
        ToolExitEvent, env.run.run_id, call.id, call.name, result.outcome, seconds, result.output
    )
