"""``fold``: the one way a run's state is rebuilt, from its journal alone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, assert_never

import msgspec

from bot.domain import (
    AssistantTurn,
    Decision,
    Fingerprint,
    Grant,
    GrantKind,
    ProcessStamp,
    Request,
    RunStatus,
    TerminalResult,
    ToolCall,
    Usage,
)
from bot.journal.entries import (
    AssistantTurnEntry,
    Entry,
    RunEnded,
    RunResumed,
    RunStarted,
    ToolDeferred,
    ToolDispatched,
    ToolProcess,
    ToolResultEntry,
)
from bot.journal.log import JournalRecord
from bot.llm.base import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolResultItem,
    ToolResultsMessage,
    UserMessage,
)


class CallState(msgspec.Struct):
    """What the journal says about one call of the current batch."""

    call: ToolCall
    result: ToolResultEntry | None = None
    deferred: Request | None = None
    # An effect started after the call's latest request (or with none): until a result says
    # how it went, running the call again needs a fresh decision by on-call.
    dispatched: bool = False
    # The tool that effect is (its dispatch record's): a PreToolUse hook may have made the
    # call another tool's, and the call's own may be one that is safe to run again.
    effect_tool: str = ""
    process: ProcessStamp | None = None


class RunState(msgspec.Struct):
    """A run as its journal tells it."""

    run_id: str
    started: RunStarted | None = None
    # What a resume compares with: the start's, or the last forced resume's.
    fingerprint: Fingerprint | None = None
    next_seq: int = 0
    messages: list[Message] = msgspec.field(default_factory=list)
    iteration: int = 0
    tool_calls: int = 0
    usage: Usage = msgspec.field(default_factory=Usage)
    batch: list[CallState] = msgspec.field(default_factory=list)
    grants: list[Grant] = msgspec.field(default_factory=list)
    # Each approved plan (its request id): how many of ``messages`` the model had read when it
    # asked for the plan, its reply included. Known from its first step grant; in memory only.
    plans_read: dict[str, int] = msgspec.field(default_factory=dict)
    answers: dict[str, Decision] = msgspec.field(default_factory=dict)
    advisories: list[str] = msgspec.field(default_factory=list)
    signatures: Counter[int] = msgspec.field(default_factory=Counter)
    # The most times one signature was seen: asked after every batch, kept as results land.
    most_repeated: int = 0
    status: RunStatus = RunStatus.RUNNING
    result: TerminalResult | None = None
    last_text: str = ""
    takeovers: list[str] = msgspec.field(default_factory=list)
    outcome_counts: Counter[str] = msgspec.field(default_factory=Counter)

    @property
    def open_batch(self) -> bool:
        """Whether the last assistant turn still has calls without a result."""
        return any(c.result is None for c in self.batch)

    @property
    def open_requests(self) -> list[Request]:
        """Requests of the current batch whose call has no result yet; none once the run
        ended (cancelled while it waited, its requests were closed with it)."""
        if self.result is not None:
            return []
        return [c.deferred for c in self.batch if c.deferred and c.result is None]

    def reason_for(self, call_id: str) -> str:
        """What the model said in the turn that made call ``call_id`` (why it asked)."""
        for message in reversed(self.messages):
            if isinstance(message, AssistantMessage) and any(
                call.id == call_id for call in message.turn.calls
            ):
                return message.turn.text or ""
        return ""

    def outcomes(self) -> dict[str, int]:
        """Calls counted by the exit that answered them (a still-open deferral counts as one)."""
        return {str(kind): n for kind, n in self.outcome_counts.items() if n}


def call_signature(tool: str, arguments: str, output: str) -> int:
    """Identifies 'the same call with the same result' for no-progress detection (in memory)."""
    return hash((tool, arguments, output))


def fold(records: Iterable[JournalRecord], run_id: str = "") -> RunState:
    """Rebuild a run's state from its journal records, in order."""
    state = RunState(run_id=run_id)
    for record in records:
        state.run_id = record.run_id
        state.next_seq = record.seq + 1
        apply(state, record.entry)
    return state


def apply(state: RunState, entry: Entry) -> None:
    """Apply one entry to a state; the loop uses it after each append to stay in step.

    Every ``Entry`` type has a case, matched on its ``kind`` (the discriminator it is stored
    under; mypy narrows ``entry`` by it): a missing case fails mypy at ``assert_never``, and
    anything else at run time is a ``TypeError``, never skipped. Commonest first: the cases are
    tried in order after every append. (Class patterns read the same but cost an
    ``isinstance`` per case tried, which is slow for pydantic models when it fails.)
    """
    if not hasattr(entry, "kind"):
        raise TypeError(f"not a journal entry: {type(entry).__qualname__}")
    match entry.kind:
        case "tool_result":
            _result(state, entry)
        case "assistant_turn":
            _assistant(state, entry)
        case "tool_dispatched":
            _dispatched(state, entry)
        case "tool_process":
            _process(state, entry)
        case "tool_deferred":
            _deferred(state, entry)
        case "grant_written":
            _grant(state, entry.grant)
        case "answer_supplied":
            state.answers[entry.decision.request_id] = entry.decision
        case "user_message":
            state.messages.append(UserMessage(entry.text))
        case "advisory":
            state.advisories.append(entry.text)
        case "run_started":
            _started(state, entry)
        case "run_suspended":
            state.status = RunStatus.SUSPENDED
        case "run_resumed":
            _resumed(state, entry)
        case "run_ended":
            _ended(state, entry)
        case _:
            if TYPE_CHECKING:
                assert_never(entry)  # mypy: some ``Entry`` type has no case above
            raise TypeError(f"not a journal entry: {type(entry).__qualname__} {entry.kind!r}")


def _started(state: RunState, entry: RunStarted) -> None:
    state.started = entry
    state.fingerprint = entry.fingerprint
    state.run_id = entry.run_id
    if entry.system_prompt:
        state.messages.append(SystemMessage(entry.system_prompt))
    for role, text in entry.history:
        turn = AssistantTurn(text=text)
        state.messages.append(UserMessage(text) if role == "user" else AssistantMessage(turn))


def _assistant(state: RunState, entry: AssistantTurnEntry) -> None:
    turn: AssistantTurn = entry.turn
    state.iteration = entry.iteration + 1
    state.usage = state.usage + turn.usage
    state.messages.append(AssistantMessage(turn))
    state.batch = [CallState(call) for call in turn.calls]
    if turn.text:
        state.last_text = turn.text


def _grant(state: RunState, grant: Grant) -> None:
    state.grants.append(grant)
    if grant.kind is GrantKind.PLAN_STEP and grant.plan not in state.plans_read:
        # A plan's grants are written within the batch of the reply that asked for it (with
        # the answer that gave them), so that reply is the run's latest.
        messages = state.messages
        replies = (
            i for i in reversed(range(len(messages))) if isinstance(messages[i], AssistantMessage)
        )
        state.plans_read[grant.plan] = next(replies, -1) + 1


def _find(state: RunState, call_id: str) -> CallState | None:
    for call in state.batch:
        if call.call.id == call_id:
            return call
    return None


def _dispatched(state: RunState, entry: ToolDispatched) -> None:
    call = _find(state, entry.call_id)
    if call is not None:
        call.dispatched, call.effect_tool, call.process = True, entry.tool, None


def _process(state: RunState, entry: ToolProcess) -> None:
    call = _find(state, entry.call_id)
    if call is not None:
        call.process = entry.process


def _deferred(state: RunState, entry: ToolDeferred) -> None:
    call = _find(state, entry.call_id)
    if call is None:
        return
    if call.deferred is None:
        state.outcome_counts["deferred"] += 1
    # The request answers for any effect started before it: its decision settles the call.
    call.deferred, call.dispatched, call.process = entry.request, False, None


def _result(state: RunState, entry: ToolResultEntry) -> None:
    call = _find(state, entry.call_id)
    if call is None or call.result is not None:
        return
    if call.deferred is not None:
        state.outcome_counts["deferred"] -= 1
    call.result = entry
    state.outcome_counts[entry.outcome] += 1  # a StrEnum: counted under its value
    state.tool_calls += 1
    signature = call_signature(entry.tool, call.call.arguments, entry.output)
    seen = state.signatures[signature] = state.signatures[signature] + 1
    state.most_repeated = max(state.most_repeated, seen)
    if not state.open_batch:
        items = tuple(
            ToolResultItem(c.call.id, c.call.name, c.result.output if c.result else "")
            for c in state.batch
        )
        state.messages.append(ToolResultsMessage(items))


def _resumed(state: RunState, entry: RunResumed) -> None:
    state.status = RunStatus.RUNNING
    if entry.taken_over_from:
        state.takeovers.append(entry.taken_over_from)
    if entry.fingerprint is not None:
        state.fingerprint = entry.fingerprint


def _ended(state: RunState, entry: RunEnded) -> None:
    state.status = entry.result.status
    state.result = entry.restored(state.last_text)
