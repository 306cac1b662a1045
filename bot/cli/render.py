"""How runs look on the command line: one JSON object, or a readable transcript."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

# Types only: every command imports this module, ``--help`` included, and must not pull in the
# domain models.
if TYPE_CHECKING:
    from bot.journal.fold import RunState
    from bot.kinds import RequestKind
    from bot.llm.base import Message
    from bot.records import RunRecord
    from bot.store import AuditRecord


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
    def created_at(self) -> datetime: ...
    @property
    def deadline(self) -> datetime | None: ...


def run_line(run_id: str, status: str, stop_reason: str, prompt: str) -> str:
    """One line of ``runs list``."""
    return f"{run_id}  {status:<10} {stop_reason or '-':<16} {prompt[:60]}"


def run_object(record: RunRecord, state: RunState) -> dict[str, Any]:
    """The stable JSON shape of ``run --json`` and ``runs show --json``."""
    result = state.result
    usage = result.usage if result else state.usage
    return {
        "run_id": record.id,
        "status": record.status.value,
        "stop_reason": result.stop_reason.value if result else record.stop_reason or None,
        "text": result.text if result else state.last_text,
        "payload": result.payload if result else None,
        "error": result.error if result else "",
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
        "outcomes": state.outcomes(),
        "requests": [request_object(r) for r in state.open_requests],
        "requested_by": record.requested_by,
        "created_at": record.created_at.isoformat(),
    }


def request_object(request: ShownRequest) -> dict[str, Any]:
    """One open request as JSON."""
    return {
        "id": request.id,
        "kind": request.kind.value,
        "tool": request.tool,
        "arguments": request.arguments,
        "prompt": request.prompt,
        "options": list(request.options),
        "deadline": request.deadline.isoformat() if request.deadline else None,
    }


def audit_object(entry: AuditRecord) -> dict[str, Any]:
    """One audited fact as ``kestrel audit --json`` prints it."""
    return {
        "at": entry.at.isoformat(),
        "actor": entry.actor,
        "action": entry.action,
        "run_id": entry.run_id,
        "request_id": entry.request_id,
        "detail": entry.detail,
    }


def transcript(record: RunRecord, state: RunState) -> str:
    """The conversation and the terminal result, for people."""
    lines = [f"run {record.id}  [{record.status.value}]  by {record.requested_by or '-'}"]
    for message in state.messages:
        lines += _message_lines(message)
    for owner in state.takeovers:
        lines.append(f"  taken over from {owner}")
    for request in state.open_requests:
        lines.append(f"  waiting: {request.kind.value} {request.id} for {request.tool}")
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


def _message_lines(message: Message) -> list[str]:
    from bot.llm.base import AssistantMessage, SystemMessage, UserMessage

    if isinstance(message, SystemMessage):
        return []
    if isinstance(message, UserMessage):
        return [f"user: {message.text}"]
    if isinstance(message, AssistantMessage):
        turn = message.turn
        lines = [f"assistant: {turn.text}"] if turn.text else []
        return lines + [f"  call {c.id}: {c.name} {c.arguments}" for c in turn.calls]
    return [f"  result {r.call_id}: {_short(r.output)}" for r in message.results]


def _short(text: str, limit: int = 300) -> str:
    flat = text.replace("\n", " ⏎ ")
    return flat if len(flat) <= limit else flat[:limit] + "…"


def pending_line(request: ShownRequest, who: str, now: datetime, note: str = "") -> str:
    """One line of ``runs pending``: what waits, how long, until when, for whom (``who``, in
    words: ``Policy.may_answer_phrase``), and why."""
    args = json.dumps(request.arguments, sort_keys=True)
    age = _duration(now - request.created_at)
    deadline = f", expires in {_duration(request.deadline - now)}" if request.deadline else ""
    because = f"; {note}" if note else ""
    return (
        f"{request.run_id}  {request.id}  {request.kind.value:<13} {request.tool} {args}"
        f"  (open {age}{deadline}; may answer: {who}{because})"
    )


def _duration(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
