"""The core's vocabulary: runs, calls, requests, grants, results and journal entries."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


def new_id(prefix: str) -> str:
    """A short unique id with a readable prefix, e.g. ``run_3f9a…``."""
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


class Model(BaseModel):
    """Base of every domain model: immutable, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class RunStatus(StrEnum):
    """Where a run stands."""

    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


class StopReason(StrEnum):
    """Why a run stopped or suspended: machine-readable, one value per cause."""

    ANSWERED = "answered"
    ITERATION_LIMIT = "iteration_limit"
    TOOL_CALL_LIMIT = "tool_call_limit"
    TOKEN_BUDGET = "token_budget"
    DEADLINE = "deadline"
    NO_PROGRESS = "no_progress"
    CANCELLED = "cancelled"
    MODEL_ERROR = "model_error"
    TRUNCATED = "truncated"
    POLICY = "policy"
    TAKEN_OVER = "taken_over"
    PANIC = "panic"
    UNCERTAIN_EFFECT = "uncertain_effect"
    HOOK_ABORT = "hook_abort"
    SETUP_ERROR = "setup_error"
    SUSPEND_REQUESTED = "suspend_requested"
    INTERRUPTED = "interrupted"
    WAITING = "waiting"


class Usage(Model):
    """Tokens spent by model calls."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


class ToolCall(Model):
    """One tool call proposed by the model; ``arguments`` is the raw JSON text it sent."""

    id: str
    name: str
    arguments: str = "{}"


class AssistantTurn(Model):
    """One model reply: text and/or tool calls, why it finished, what it cost."""

    text: str | None = None
    calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    usage: Usage = Usage()


class ToolOutcome(StrEnum):
    """The exit a call took through executeTool; counted per kind."""

    UNKNOWN_TOOL = "unknown_tool"
    HOOK_DENIED = "hook_denied"
    INVALID_ARGUMENTS = "invalid_arguments"
    GATE_DENIED = "gate_denied"
    DEFERRED = "deferred"
    TAKEN_OVER = "taken_over"
    TIMEOUT = "timeout"
    ERROR = "error"
    OK = "ok"


class RequestKind(StrEnum):
    """What an open wait is waiting for."""

    WAIT_USER = "wait_user"
    WAIT_APPROVAL = "wait_approval"
    WAIT_EFFECT = "wait_effect"


class RequestStatus(StrEnum):
    """The life of a request: open until exactly one decision closes it."""

    OPEN = "open"
    ANSWERED = "answered"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


def call_digest(tool: str, arguments: dict[str, Any]) -> str:
    """A stable digest of one exact tool invocation (tool name and canonical arguments)."""
    canonical = json.dumps({"tool": tool, "arguments": arguments}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


class Request(Model):
    """An open wait with an exact identity, bound to one call of one run."""

    id: str = Field(default_factory=lambda: new_id("req"))
    run_id: str
    kind: RequestKind
    call_id: str
    tool: str
    arguments: dict[str, Any] = {}
    digest: str = ""
    prompt: str = ""
    options: tuple[str, ...] = ()
    requested_by: str = ""
    approvals_needed: int = 1
    created_at: datetime = Field(default_factory=utcnow)
    deadline: datetime | None = None


class DecisionKind(StrEnum):
    """What a person (or a deadline) said to a request."""

    APPROVE = "approve"
    APPROVE_ALWAYS = "approve_always"
    DENY = "deny"
    ANSWER = "answer"
    RETRY = "retry"
    DONE = "done"
    FAILED = "failed"
    EXPIRED = "expired"


class Decision(Model):
    """One answer to one request, with who gave it."""

    request_id: str
    kind: DecisionKind
    text: str = ""
    by: str = ""
    at: datetime = Field(default_factory=utcnow)


class GrantKind(StrEnum):
    """A one-shot grant covers one call and digest; a standing grant a tool for the run."""

    ONE_SHOT = "one_shot"
    STANDING = "standing"


class Grant(Model):
    """Permission to run a gated call."""

    kind: GrantKind
    tool: str
    call_id: str = ""
    digest: str = ""
    by: str = ""


class TerminalResult(Model):
    """A run's final word: status, reason, the assistant's text and its structured payload."""

    status: RunStatus
    stop_reason: StopReason
    text: str = ""
    payload: dict[str, Any] | None = None
    error: str = ""
    usage: Usage = Usage()
    outcomes: dict[str, int] = {}


class Fingerprint(Model):
    """What a run was started with; resume compares it with the current configuration."""

    provider: str
    model: str
    tools_digest: str
    system_prompt_digest: str


class Budgets(Model):
    """Limits of one run."""

    max_iterations: int = 20
    max_tool_calls: int = 50
    max_tokens: int = 200_000
    deadline_seconds: float = 0
    no_progress_repeats: int = 3


# Journal entries. Each is one append; ``fold`` rebuilds a run from them alone.


class RunStarted(Model):
    """The run's identity and the configuration it started with."""

    kind: Literal["run_started"] = "run_started"
    run_id: str
    session_id: str
    requested_by: str = ""
    system_prompt: str = ""
    fingerprint: Fingerprint
    budgets: Budgets = Budgets()
    has_prompter: bool = False
    history: tuple[tuple[str, str], ...] = ()
    at: datetime = Field(default_factory=utcnow)


class UserMessage(Model):
    """A human message entering the conversation (after hooks and PII)."""

    kind: Literal["user_message"] = "user_message"
    text: str
    by: str = ""


class AssistantTurnEntry(Model):
    """A model reply, journaled before any tool of its batch runs."""

    kind: Literal["assistant_turn"] = "assistant_turn"
    iteration: int
    turn: AssistantTurn


class ToolDispatched(Model):
    """A non-idempotent effect is about to start."""

    kind: Literal["tool_dispatched"] = "tool_dispatched"
    call_id: str
    tool: str


class ProcessStamp(Model):
    """One process group on one host, identified even after its ids are reused."""

    host: str
    host_key: str
    pgid: int
    start_ticks: int


class ToolProcess(Model):
    """Where a dispatched command's processes run, so an owner's successor can find an orphan."""

    kind: Literal["tool_process"] = "tool_process"
    call_id: str
    process: ProcessStamp


class ToolResultEntry(Model):
    """The answer to one call, whatever exit produced it."""

    kind: Literal["tool_result"] = "tool_result"
    call_id: str
    tool: str
    outcome: ToolOutcome
    output: str
    is_error: bool = False


class ToolDeferred(Model):
    """The call will be answered later, through the checkpoint, for this request."""

    kind: Literal["tool_deferred"] = "tool_deferred"
    call_id: str
    tool: str
    request: Request


class GrantWritten(Model):
    """A grant flushed after its triggering call was answered or deferred."""

    kind: Literal["grant_written"] = "grant_written"
    grant: Grant


class AnswerSupplied(Model):
    """A decision for a request, taken from the checkpoint by the run's task."""

    kind: Literal["answer_supplied"] = "answer_supplied"
    decision: Decision


class RunSuspended(Model):
    """The run ended its task; it waits for the listed requests or a resume."""

    kind: Literal["run_suspended"] = "run_suspended"
    reason: StopReason
    request_ids: tuple[str, ...] = ()


class RunResumed(Model):
    """A task picked the run up again."""

    kind: Literal["run_resumed"] = "run_resumed"
    owner: str = ""
    forced: bool = False
    taken_over_from: str = ""


class AdvisoryEntry(Model):
    """Something the operator should know, kept out of the model's context."""

    kind: Literal["advisory"] = "advisory"
    text: str


class RunEnded(Model):
    """The terminal result."""

    kind: Literal["run_ended"] = "run_ended"
    result: TerminalResult
    # The result's text is the run's last model turn, journaled once, with that turn.
    text_is_last_turn: bool = False

    @classmethod
    def of(cls, result: TerminalResult, last_turn_text: str) -> RunEnded:
        """The entry for ``result``, without a second copy of a text the journal holds."""
        if not result.text or result.text != last_turn_text:
            return cls(result=result)
        return cls(
            result=result.model_copy(update={"text": "", "payload": None}), text_is_last_turn=True
        )

    def restored(self, last_turn_text: str) -> TerminalResult:
        """The whole result, given the text of the run's last model turn."""
        if not self.text_is_last_turn:
            return self.result
        completed = self.result.status is RunStatus.COMPLETED
        payload = extract_payload(last_turn_text) if completed else None
        return self.result.model_copy(update={"text": last_turn_text, "payload": payload})


def extract_payload(text: str) -> dict[str, Any] | None:
    """The structured finalized payload: a JSON object that is the answer, or fenced in it."""
    candidates = [text.strip()]
    if "```" in text:
        candidates += [part.removeprefix("json").strip() for part in text.split("```")[1::2]]
    for candidate in candidates:
        if not candidate.startswith("{"):
            continue
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


Entry = Annotated[
    RunStarted
    | UserMessage
    | AssistantTurnEntry
    | ToolDispatched
    | ToolProcess
    | ToolResultEntry
    | ToolDeferred
    | GrantWritten
    | AnswerSupplied
    | RunSuspended
    | RunResumed
    | AdvisoryEntry
    | RunEnded,
    Field(discriminator="kind"),
]


class JournalRecord(Model):
    """One stored entry with its position and the epoch that wrote it."""

    run_id: str
    seq: int
    epoch: int
    entry: Entry


def status_after(entry: Entry) -> RunStatus | None:
    """The run status an entry moves to, if it moves it at all."""
    if isinstance(entry, RunStarted | RunResumed):
        return RunStatus.RUNNING
    if isinstance(entry, RunSuspended):
        return RunStatus.SUSPENDED
    if isinstance(entry, RunEnded):
        return entry.result.status
    return None


class RunRecord(Model):
    """A run's row: identity and the projection of its journal that listings need."""

    id: str
    session_id: str
    prompt: str = ""
    requested_by: str = ""
    status: RunStatus = RunStatus.RUNNING
    stop_reason: str = ""
    owner: str = ""
    epoch: int = 0
    lease_expires: datetime | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class WorkItem(Model):
    """Inbound work any replica may take: ``start`` a turn or ``resume`` a run."""

    id: int
    kind: Literal["start", "resume"]
    payload: dict[str, Any] = {}
    created_at: datetime = Field(default_factory=utcnow)


class Replica(Model):
    """A live Kestrel process sharing the store, and the runs it holds leases on."""

    owner: str
    info: str = ""
    started_at: datetime
    last_seen: datetime
    runs: tuple[tuple[str, datetime | None], ...] = ()


class Session(Model):
    """One conversation: a chat thread, or a console session."""

    id: str
    platform: str = "console"
    channel: str = ""
    thread: str = ""
