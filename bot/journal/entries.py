"""Journal entries: each is one append; ``fold`` rebuilds a run from them alone."""

# No ``from __future__ import annotations``: msgspec would evaluate every field's annotation
# text when it first decodes these (13 ms of a fresh resume).

from datetime import datetime
from typing import ClassVar, Literal

import msgspec

from bot.domain import (
    AssistantTurn,
    Budgets,
    Decision,
    DomainModel,
    Fingerprint,
    Grant,
    ProcessStamp,
    Request,
    RunStatus,
    StopReason,
    TerminalResult,
    ToolOutcome,
    extract_payload,
    utcnow,
)


class JournalEntry(DomainModel, frozen=True, tag_field="kind"):
    """Base of every entry: stored with its ``kind`` first, which names the entry's type."""


class RunStarted(JournalEntry, frozen=True, kw_only=True, tag="run_started"):
    """The run's identity and the configuration it started with."""

    kind: ClassVar[Literal["run_started"]] = "run_started"
    run_id: str
    session_id: str
    requested_by: str = ""
    system_prompt: str = ""
    fingerprint: Fingerprint
    budgets: Budgets = msgspec.field(default_factory=Budgets)
    has_prompter: bool = False
    history: tuple[tuple[str, str], ...] = ()
    at: datetime = msgspec.field(default_factory=utcnow)


class UserMessageEntry(
    DomainModel, frozen=True, kw_only=True, tag_field="kind", tag="user_message"
):
    """A human message entering the conversation (after hooks and PII)."""

    kind: ClassVar[Literal["user_message"]] = "user_message"
    text: str
    by: str = ""


class AssistantTurnEntry(
    DomainModel, frozen=True, kw_only=True, tag_field="kind", tag="assistant_turn"
):
    """A model reply, journaled before any tool of its batch runs."""

    kind: ClassVar[Literal["assistant_turn"]] = "assistant_turn"
    iteration: int
    turn: AssistantTurn


class ToolDispatched(
    DomainModel, frozen=True, kw_only=True, tag_field="kind", tag="tool_dispatched"
):
    """A non-idempotent effect is about to start."""

    kind: ClassVar[Literal["tool_dispatched"]] = "tool_dispatched"
    call_id: str
    tool: str


class ToolProcess(JournalEntry, frozen=True, kw_only=True, tag="tool_process"):
    """Where a dispatched command's processes run, so an owner's successor can find an orphan."""

    kind: ClassVar[Literal["tool_process"]] = "tool_process"
    call_id: str
    process: ProcessStamp


class ToolResultEntry(JournalEntry, frozen=True, kw_only=True, tag="tool_result"):
    """The answer to one call, whatever exit produced it."""

    kind: ClassVar[Literal["tool_result"]] = "tool_result"
    call_id: str
    tool: str
    outcome: ToolOutcome
    output: str
    is_error: bool = False
    # How long the call took from entering executeTool; None for an answer given later
    # through ``Decisions`` (a question's, an uncertain effect's).
    seconds: float | None = None


class ToolDeferred(JournalEntry, frozen=True, kw_only=True, tag="tool_deferred"):
    """The call will be answered later, through ``Decisions``, for this request."""

    kind: ClassVar[Literal["tool_deferred"]] = "tool_deferred"
    call_id: str
    tool: str
    request: Request


class GrantWritten(JournalEntry, frozen=True, kw_only=True, tag="grant_written"):
    """A grant flushed after its triggering call was answered or deferred."""

    kind: ClassVar[Literal["grant_written"]] = "grant_written"
    grant: Grant


class AnswerSupplied(
    DomainModel, frozen=True, kw_only=True, tag_field="kind", tag="answer_supplied"
):
    """A decision for a request, taken from ``Decisions`` by the run's task."""

    kind: ClassVar[Literal["answer_supplied"]] = "answer_supplied"
    decision: Decision


class RunSuspended(JournalEntry, frozen=True, kw_only=True, tag="run_suspended"):
    """The run ended its task; it waits for the listed requests or a resume."""

    kind: ClassVar[Literal["run_suspended"]] = "run_suspended"
    reason: StopReason
    request_ids: tuple[str, ...] = ()


class RunResumed(JournalEntry, frozen=True, kw_only=True, tag="run_resumed"):
    """A task picked the run up again."""

    kind: ClassVar[Literal["run_resumed"]] = "run_resumed"
    owner: str = ""
    forced: bool = False
    taken_over_from: str = ""
    # Who resumed it (a person, ``deadline``); empty: the owner, on its own (adoption, work).
    by: str = ""
    # What a forced resume went on with: later resumes compare with it, not with the start's
    # (the change was accepted once; each decision since was asked under it).
    fingerprint: Fingerprint | None = None


class AdvisoryEntry(JournalEntry, frozen=True, kw_only=True, tag="advisory"):
    """Something the operator should know, kept out of the model's context."""

    kind: ClassVar[Literal["advisory"]] = "advisory"
    text: str


class RunEnded(JournalEntry, frozen=True, kw_only=True, tag="run_ended"):
    """The terminal result."""

    kind: ClassVar[Literal["run_ended"]] = "run_ended"
    result: TerminalResult
    # The result's text is the run's last model turn, journaled once, with that turn.
    text_is_last_turn: bool = False

    @classmethod
    def of(cls, result: TerminalResult, last_turn_text: str) -> "RunEnded":
        """The entry for ``result``, without a second copy of a text the journal holds."""
        if not result.text or result.text != last_turn_text:
            return cls(result=result)
        return cls(
            result=msgspec.structs.replace(result, text="", payload=None), text_is_last_turn=True
        )

    def restored(self, last_turn_text: str) -> TerminalResult:
        """The whole result, given the text of the run's last model turn."""
        if not self.text_is_last_turn:
            return self.result
        completed = self.result.status is RunStatus.COMPLETED
        payload = extract_payload(last_turn_text) if completed else None
        return msgspec.structs.replace(self.result, text=last_turn_text, payload=payload)


Entry = (
    RunStarted
    | UserMessageEntry
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
    | RunEnded
)


def status_after(entry: Entry) -> RunStatus | None:
    """The run status an entry moves to, if it moves it at all.

    Read from ``kind``: it runs on every append, and one comparison beats an ``isinstance``
    per kind."""
    kind = entry.kind
    if kind not in _MOVES_STATUS:
        return None
    if entry.kind == "run_ended":
        return entry.result.status
    return RunStatus.SUSPENDED if kind == "run_suspended" else RunStatus.RUNNING


_MOVES_STATUS = frozenset({"run_started", "run_resumed", "run_suspended", "run_ended"})
