"""How runs look on the command line: one JSON object, or a readable transcript."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from bot.text import flattened  # loaded with bot.cli.common, by every command

# Types only: every command imports this module, ``--help`` included, and must not pull in the
# domain models; what it shows of a step and a request are protocols, for the type checker.
if TYPE_CHECKING:
    from bot.chat.words import Origin as ShownOrigin
    from bot.domain import Decision, Request
    from bot.journal.fold import RunState
    from bot.kinds import RequestKind, RequestStatus
    from bot.llm.base import Message
    from bot.records import RunRecord
    from bot.store_values import AuditRecord

    class ShownStep(Protocol):
        """One step of a plan as shown (``PlanStep``, or as stored)."""

        @property
        def tool(self) -> str: ...
        @property
        def arguments(self) -> dict[str, Any]: ...
        @property
        def why(self) -> str: ...
        @property
        def digest(self) -> str: ...
        @property
        def gated(self) -> bool: ...
        @property
        def origins(self) -> Sequence[ShownOrigin]: ...

    class ShownRequest(Protocol):
        """What is shown of an open request: a ``Request``, or its stored body as the fast way of
        ``runs pending`` reads it (``bot.cli.quick.StoredRequest``)."""

        @property
        def id(self) -> str: ...
        @property
        def run_id(self) -> str: ...
        @property
        def kind(self) -> RequestKind: ...
        @property
        def tool(self) -> str: ...
        @property
        def arguments(self) -> dict[str, Any]: ...
        @property
        def prompt(self) -> str: ...
        @property
        def options(self) -> tuple[str, ...]: ...
        @property
        def digest(self) -> str: ...
        @property
        def approvals_needed(self) -> int: ...
        @property
        def steps(self) -> Sequence[ShownStep]: ...
        @property
        def off_plan(self) -> str: ...
        @property
        def created_at(self) -> datetime: ...
        @property
        def deadline(self) -> datetime | None: ...
        @property
        def origins(self) -> Sequence[ShownOrigin]: ...


# A closed request from the store: the request, its status, the decision that closed it, if
# any, and everyone who approved it when several did (first approver first).
ClosedRequest = tuple["Request", "RequestStatus", "Decision | None", tuple[str, ...]]


# ``runs list``'s columns: the run, when it was created (UTC), how it stands, its prompt.
RUNS_HEADER = f"{'RUN':<20}  {'CREATED (UTC)':<19}  {'STATUS':<10} {'STOP REASON':<16} PROMPT"


def run_line(run_id: str, created: datetime, status: str, stop_reason: str, prompt: str) -> str:
    """One line of ``runs list``, under ``RUNS_HEADER``."""
    when = f"{created.astimezone(UTC):%Y-%m-%d %H:%M:%S}"
    # A prompt of several lines on one: its next lines would read as rows of their own.
    return f"{run_id:<20}  {when}  {status:<10} {stop_reason or '-':<16} {flattened(prompt)[:60]}"


def stamp(moment: datetime | None) -> str | None:
    """A timestamp as every JSON output writes it: UTC, ISO 8601, microseconds, ``Z``."""
    if moment is None:
        return None
    return f"{moment.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%f}Z"


def record_object(record: RunRecord) -> dict[str, Any]:
    """A run's row as JSON: each item of ``runs list --json``, and the start of a run object."""
    return {
        "run_id": record.id,
        "session_id": record.session_id,
        "prompt": record.prompt,
        "requested_by": record.requested_by,
        "status": record.status.value,
        "stop_reason": record.stop_reason or None,
        "owner": record.owner,
        "epoch": record.epoch,
        "lease_expires": stamp(record.lease_expires),
        "created_at": stamp(record.created_at),
        "updated_at": stamp(record.updated_at),
    }


def run_object(
    record: RunRecord, state: RunState, closed: Sequence[ClosedRequest] = ()
) -> dict[str, Any]:
    """The stable JSON shape of ``run --json`` and ``runs show --json``: the run's row (as
    ``runs list --json`` has it), its result, its open requests and its ``closed`` ones."""
    result = state.result
    usage = result.usage if result else state.usage
    return record_object(record) | {
        "stop_reason": result.stop_reason.value if result else record.stop_reason or None,
        "text": result.text if result else _last_words(state),
        "payload": result.payload if result else None,
        "error": result.error if result else "",
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
        "outcomes": state.outcomes(),
        "requests": [request_object(r) for r in waiting(state, closed)],
        "closed_requests": [closed_object(*item) for item in closed],
    }


def _last_words(state: RunState) -> str:
    """What a run not ended last said: its last reply with text, without its reasoning or the
    calls it wrote as text (which the run shows as calls; the journal keeps them all)."""
    from bot.llm.base import AssistantMessage
    from bot.llm.reply_words import shown

    said = state.last_text
    for message in reversed(state.messages):
        if isinstance(message, AssistantMessage) and message.turn.text == said:
            return shown(message.turn)
    return said


def waiting(state: RunState, closed: Sequence[ClosedRequest]) -> list[ShownRequest]:
    """The requests the run still waits on: its journal's open ones less those the store has
    closed since (decided while the run stayed suspended, expired, cancelled with the run)."""
    done = {item[0].id for item in closed}
    return [request for request in state.open_requests if request.id not in done]


def request_object(request: ShownRequest) -> dict[str, Any]:
    """One request as JSON."""
    return {
        "id": request.id,
        "kind": request.kind.value,
        "tool": request.tool,
        "arguments": request.arguments,
        "prompt": request.prompt,
        "options": list(request.options),
        "digest": request.digest,
        "approvals_needed": request.approvals_needed,
        "steps": [_step_object(step) for step in request.steps],
        "off_plan": request.off_plan,
        "created_at": stamp(request.created_at),
        "deadline": stamp(request.deadline),
        "origins": [origin_object(origin) for origin in request.origins],
    }


def origin_object(origin: ShownOrigin) -> dict[str, Any]:
    """Where one argument came from, as JSON."""
    return {
        "argument": origin.argument,
        "value": origin.value,
        "tool": origin.tool,
        "call_id": origin.call_id,
        "line": origin.line,
        "excerpt": origin.excerpt,
        "instruction_like": origin.instruction_like,
    }


def origin_lines(origins: Sequence[ShownOrigin], indent: str = "    ") -> list[str]:
    """Each argument taken from tool output, in words, one line each."""
    if not origins:
        return []
    from bot.chat.words import origin_lines as words

    return [indent + line for line in words(origins)]


def _step_object(step: ShownStep) -> dict[str, Any]:
    """One step of a plan as JSON, with where its argument values came from."""
    return {
        "tool": step.tool,
        "arguments": step.arguments,
        "why": step.why,
        "digest": step.digest,
        "needs_approval": step.gated,
        "origins": [origin_object(origin) for origin in step.origins],
    }


def closed_object(
    request: Request,
    status: RequestStatus,
    decision: Decision | None,
    approvers: Sequence[str] = (),
) -> dict[str, Any]:
    """A closed request as JSON, with how it closed and the decision that closed it: ``by``
    whoever closed it, ``approvers`` everyone who approved it (of several, first first)."""
    decided = None
    if decision is not None:
        decided = {
            "kind": decision.kind.value,
            "text": decision.text,
            "by": decision.by,
            "approvers": approved_by(decision, approvers),
            "at": stamp(decision.at),
        }
    return request_object(request) | {"status": status.value, "decision": decided}


def approved_by(decision: Decision, approvers: Sequence[str]) -> list[str]:
    """Everyone whose approval ``decision`` is, first approver first; none for a decision
    that approves nothing."""
    from bot.kinds import DecisionKind

    if decision.kind not in (DecisionKind.APPROVE, DecisionKind.APPROVE_ALWAYS):
        return []
    # The decision names the last approver only; the others approved before it.
    return list(dict.fromkeys((*approvers, decision.by)))


def audit_object(entry: AuditRecord) -> dict[str, Any]:
    """One audited fact as ``kestrel audit --json`` prints it."""
    return {
        "at": stamp(entry.at),
        "actor": entry.actor,
        "action": entry.action,
        "run_id": entry.run_id,
        "request_id": entry.request_id,
        "detail": entry.detail,
    }


def transcript(record: RunRecord, state: RunState, closed: Sequence[ClosedRequest] = ()) -> str:
    """The conversation, what it waits on and the terminal result, for people."""
    from bot.kinds import StopReason
    from bot.llm.base import SystemMessage

    lines = [f"run {record.id}  [{record.status.value}]  by {record.requested_by or '-'}"]
    messages = [message for message in state.messages if not isinstance(message, SystemMessage)]
    # The thread's earlier turns come first, as the run was given them: marked, never this run's.
    earlier = len(state.started.history) if state.started else 0
    if earlier:
        lines.append(f"earlier in the thread ({earlier} messages, not this run's):")
        for message in messages[:earlier]:
            lines += [
                f"  | {line}" for text in _message_lines(message) for line in text.split("\n")
            ]
        lines.append("this run:")
    for message in messages[earlier:]:
        lines += _message_lines(message)
    for owner in state.takeovers:
        lines.append(f"  taken over from {owner}")
    lines += [closed_line(*item) for item in closed]
    open_now = waiting(state, closed)
    for request in open_now:
        lines.append(f"  waiting: {request.kind.value} {request.id} for {request.tool}")
        lines += request_details(request)
    if not open_now and record.stop_reason == StopReason.INTERRUPTED:
        # Nothing is pending and no replica adopts it: the resume is the one way on.
        lines.append(f"  stopped: kestrel runs resume {record.id} takes it up")
    if not open_now and record.stop_reason == StopReason.HANDED_BACK:
        # A replica adopts it, if one runs: with serve stopped, on-call may go on at the shell.
        lines.append(
            "  handed back at a stop: a running kestrel serve takes it up,"
            f" or kestrel runs resume {record.id}"
        )
    for text in state.advisories:
        lines.append(f"  advisory: {text}")
    result = state.result
    if result is not None:
        lines.append(f"result: {result.status.value} ({result.stop_reason.value})")
        if result.error:
            lines.append(f"  error: {result.error}")
        if result.payload is not None:
            lines.append("  payload: " + json.dumps(result.payload, sort_keys=True))
        usage = result.usage
        lines.append(f"  usage: {usage.input_tokens} in, {usage.output_tokens} out")
        lines.append("  calls: " + json.dumps(result.outcomes, sort_keys=True))
    return "\n".join(lines)


def closed_line(
    request: Request, status: RequestStatus, decision: Decision | None, approvers: Sequence[str]
) -> str:
    """How a closed request ended, as a card's closing line says it (every approver named)."""
    from bot.chat.cards import closing, listed

    ended = closing(status, decision, approvers)
    by = f" by {listed(ended.by)}" if ended.by else ""
    return f"  closed: {request.kind.value} {request.id} for {request.tool}: {ended.phrase}{by}"


def _message_lines(message: Message) -> list[str]:
    from bot.llm.base import AssistantMessage, SystemMessage, UserMessage

    if isinstance(message, SystemMessage):
        return []
    if isinstance(message, UserMessage):
        return [f"user: {message.text}"]
    if isinstance(message, AssistantMessage):
        turn = message.turn
        lines = [f"assistant: {turn.text}"] if turn.text else []
        from bot.text import invisibles_named

        calls = [f"  call {c.id}: {c.name} {invisibles_named(c.arguments)}" for c in turn.calls]
        return lines + calls
    return [f"  result {r.call_id}: {_short(r.output)}" for r in message.results]


def _short(text: str, limit: int = 300) -> str:
    flat = text.replace("\n", " ⏎ ")
    return flat if len(flat) <= limit else flat[:limit] + "…"


def pending_line(request: ShownRequest, who: str, now: datetime, note: str = "") -> str:
    """One line of ``runs pending``: what waits, how long, until when, for whom (``who``, in
    words: ``Policy.may_answer_phrase``), and why."""
    args = json.dumps(request.arguments, sort_keys=True)
    age = _duration(now - request.created_at)
    deadline = _deadline_words(request, now)
    because = f"; {note}" if note else ""
    line = (
        f"{request.run_id}  {request.id}  {request.kind.value:<13} {request.tool} {args}"
        f"  (open {age}{deadline}; may answer: {who}{because})"
    )
    return "\n".join([line, *request_details(request)])


def _deadline_words(request: ShownRequest, now: datetime) -> str:
    if request.deadline is None:
        return ""
    if request.deadline <= now:  # no replica swept it yet: a resume expires it, and goes on
        return f", expired; `kestrel runs resume {request.run_id}` moves the run on"
    return f", expires in {_duration(request.deadline - now)}"


def request_details(request: ShownRequest) -> list[str]:
    """The lines under a request's: where its arguments came from, a plan's steps (with where
    their values came from), or how a call differs from the approved plan; invisible
    characters in them named."""
    return _details(request.origins, request.off_plan, request.steps)


def object_details(request: Mapping[str, Any]) -> list[str]:
    """``request_details`` of a request as ``request_object`` wrote it (the run object of
    ``run`` and of a decision's command): what its next command approves is shown above it."""
    import msgspec

    from bot.domain import ArgumentOrigin, PlanStep

    def origins(items: Sequence[Mapping[str, Any]]) -> tuple[ArgumentOrigin, ...]:
        return tuple(msgspec.convert(item, ArgumentOrigin) for item in items)

    steps = [
        PlanStep(
            tool=step["tool"],
            arguments=step["arguments"],
            why=step["why"],
            gated=step["needs_approval"],
            origins=origins(step["origins"]),
        )
        for step in request["steps"]
    ]
    return _details(origins(request["origins"]), request["off_plan"], steps)


def _details(
    origins: Sequence[ShownOrigin], off_plan: str, steps: Sequence[ShownStep]
) -> list[str]:
    from bot.text import invisibles_named

    lines = origin_lines(origins)
    if off_plan:
        lines.append(f"    {invisibles_named(off_plan)}")
    for number, step in enumerate(steps, 1):
        args = invisibles_named(json.dumps(step.arguments, sort_keys=True, ensure_ascii=False))
        why = f"  ({step.why})" if step.why else ""
        free = "  [needs no approval]" if not step.gated else ""
        lines.append(f"    step {number}: {step.tool} {args}{why}{free}")
        lines += origin_lines(step.origins, indent="      ")
    return lines


def _duration(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
