"""The core's vocabulary: runs, calls, requests, grants, results and journal entries."""

# No ``from __future__ import annotations``: msgspec would evaluate every field's annotation
# text when it first decodes these (13 ms of a fresh resume).

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from bot.digest import sha256

# The vocabularies live apart, importable alone; they are the domain's names too.
from bot.kinds import TERMINAL_STATUSES as TERMINAL_STATUSES
from bot.kinds import DecisionKind as DecisionKind
from bot.kinds import GrantKind as GrantKind
from bot.kinds import RequestKind as RequestKind
from bot.kinds import RequestStatus as RequestStatus
from bot.kinds import RunStatus as RunStatus
from bot.kinds import StopReason as StopReason
from bot.kinds import ToolOutcome as ToolOutcome
from bot.kinds import as_flag as as_flag
from bot.kinds import how_answered as how_answered
from bot.nesting import loads, too_deep
from bot.place import Place


def new_id(prefix: str) -> str:
    """A short unique id with a readable prefix, e.g. ``run_3f9a…``."""
    return f"{prefix}_{os.urandom(8).hex()}"


def request_id() -> str:
    """A new request's id."""
    return new_id("req")


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


class DomainModel(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, gc=False):
    """Base of every domain value: immutable, built by keyword, no unknown fields when read.

    Not tracked by the garbage collector (``gc=False``): a frozen value made of text, numbers,
    JSON data and other such values cannot be part of a reference cycle, and W1's hundred runs
    spent a sixth of their collector's time (1-2% of the whole) passing over them.

    A msgspec struct, not a pydantic model (each subclass says ``kw_only`` again: msgspec
    applies it to the fields a class declares): a run writes and reads these on every step, and a
    fresh process (an adopted run, a CLI approval) must not compile a validator per type first.
    What the code builds is typed (mypy checks it); what is read back from the store is
    validated as it is decoded (``bot.wire``).
    """


class Usage(DomainModel, frozen=True, kw_only=True):
    """Tokens spent by model calls."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


class ToolCall(DomainModel, frozen=True, kw_only=True):
    """One tool call proposed by the model; ``arguments`` is the raw JSON text it sent;
    ``extra_content`` what the server added to the call (Gemini 3's thought signature), as
    JSON text, to be sent back with it as it came (empty if it added nothing)."""

    id: str
    name: str
    arguments: str = "{}"
    extra_content: str = ""


class Reasoning(DomainModel, frozen=True, kw_only=True):
    """The reasoning a server sent apart from a reply's text, and the field it sent it in
    (``reasoning_content``: DeepSeek, vLLM before 0.17; ``reasoning``: vLLM since, OpenRouter,
    Groq), which is the one it goes back in: a server may refuse the other."""

    field: str
    text: str


class AssistantTurn(DomainModel, frozen=True, kw_only=True):
    """One model reply: text and/or tool calls, why it finished, what it cost, and the
    reasoning a server sent apart from the text (None if it sent none)."""

    text: str | None = None
    calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    usage: Usage = msgspec.field(default_factory=Usage)
    reasoning: Reasoning | None = None


# ``json.dumps(..., sort_keys=True)``'s text from one encoder, where that call builds one for
# every value it writes (its options leave the shared default one).
_SORTED: Final = json.JSONEncoder(sort_keys=True)


def call_digest(tool: str, arguments: dict[str, Any], definition: str = "") -> str:
    """A stable digest of one exact tool invocation: the tool's name, its canonical arguments
    and, when given, the digest of its definition (``ToolSet.definition``), so that what a
    person approved binds what the call would run, not only its name."""
    shape: dict[str, Any] = {"tool": tool, "arguments": arguments}
    if definition:
        shape["definition"] = definition
    return sha256(_SORTED.encode(shape).encode()).hexdigest()[:32]


class ArgumentOrigin(DomainModel, frozen=True, kw_only=True):
    """Where one argument value of a consequential call was found: an earlier tool's output."""

    argument: str
    value: str
    tool: str
    call_id: str
    line: int
    excerpt: str
    # The output it came from holds instruction-like text ("ignore previous instructions"…).
    instruction_like: bool = False


class PlanStep(DomainModel, frozen=True, kw_only=True):
    """One call a plan asks to make: the tool, its exact arguments and their digest, why, and
    where argument values came from (a plan's approval covers a step only as its card showed
    it)."""

    tool: str
    arguments: dict[str, Any] = {}
    why: str = ""
    digest: str = ""
    # Whether the step's tool needs approval: a plan's approval grants only these steps.
    gated: bool = True
    # The call of the model's reply this step stands for (a plan made of one reply's calls).
    call_id: str = ""
    origins: tuple[ArgumentOrigin, ...] = ()


def plan_digest(steps: tuple[PlanStep, ...]) -> str:
    """A stable digest of a whole plan: its steps' tools and argument digests, in order."""
    canonical = json.dumps([[step.tool, step.digest] for step in steps])
    return sha256(canonical.encode()).hexdigest()[:32]


class Request(DomainModel, frozen=True, kw_only=True):
    """An open wait with an exact identity, bound to one call of one run."""

    id: str = msgspec.field(default_factory=request_id)
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
    origins: tuple[ArgumentOrigin, ...] = ()
    # A plan's steps (``wait_plan``), in the order they run.
    steps: tuple[PlanStep, ...] = ()
    # How a call differs from the nearest step of an approved plan, when it matches none.
    off_plan: str = ""
    created_at: datetime = msgspec.field(default_factory=utcnow)
    deadline: datetime | None = None


def unstamped(request: Request) -> Request:
    """``request`` as it is: the stamp of a run with no deadlines or platform options."""
    return request


class RequestMaker(msgspec.Struct, frozen=True):
    """Makes every request of one run: its id and requester filled in, then stamped (the
    deadline, and the options a platform offers)."""

    run_id: str
    requested_by: str = ""
    stamp: Callable[[Request], Request] = unstamped

    def __call__(
        self, kind: RequestKind, call_id: str, tool: str, arguments: dict[str, Any], **details: Any
    ) -> Request:
        """A new request about one call (prompt, options, digest, approvals and id as
        ``details``)."""
        request = Request(
            run_id=self.run_id,
            # A tool's code may name the kind as text: a struct keeps what it is given.
            kind=RequestKind(kind),
            call_id=call_id,
            tool=tool,
            arguments=arguments,
            requested_by=self.requested_by,
            **details,
        )
        return self.stamp(request)


class Decision(DomainModel, frozen=True, kw_only=True):
    """One answer to one request, with who gave it."""

    request_id: str
    kind: DecisionKind
    text: str = ""
    by: str = ""
    at: datetime = msgspec.field(default_factory=utcnow)


def approved_by_several(request: Request, status: RequestStatus, decision: Decision | None) -> bool:
    """Whether ``request`` closed approved by several people: its decision names the last of
    them only, the store's ``approvers`` every one."""
    approved = decision is not None and decision.kind is DecisionKind.APPROVE
    return approved and request.approvals_needed > 1 and status is RequestStatus.ANSWERED


class Grant(DomainModel, frozen=True, kw_only=True):
    """Permission to run a gated call."""

    kind: GrantKind
    tool: str
    call_id: str = ""
    # The call's digest (a one-shot grant, a plan's step); a standing grant's tool definition.
    digest: str = ""
    by: str = ""
    # A plan step's grant (``plan_step``), or the one-shot grant that used it up: which plan
    # (its request id) and which step (from 0).
    plan: str = ""
    step: int = 0
    # A plan step's exact arguments, to show how a call that matches no step differs.
    arguments: dict[str, Any] = {}


class TerminalResult(DomainModel, frozen=True, kw_only=True):
    """A run's final word: status, reason, the assistant's text and its structured payload."""

    status: RunStatus
    stop_reason: StopReason
    text: str = ""
    payload: dict[str, Any] | None = None
    error: str = ""
    usage: Usage = msgspec.field(default_factory=Usage)
    outcomes: dict[str, int] = {}


class Fingerprint(DomainModel, frozen=True, kw_only=True):
    """What a run was started with; resume compares it with the current configuration."""

    provider: str
    model: str
    tools_digest: str
    system_prompt_digest: str


class Budgets(DomainModel, frozen=True, kw_only=True):
    """Limits of one run."""

    max_iterations: int = 20
    max_tool_calls: int = 50
    max_tokens: int = 200_000
    deadline_seconds: float = 0
    no_progress_repeats: int = 3


class ProcessStamp(DomainModel, frozen=True, kw_only=True):
    """One process group on one host, identified even after its ids are reused."""

    host: str
    host_key: str
    pgid: int
    start_ticks: int


def extract_payload(text: str) -> dict[str, Any] | None:
    """The structured finalized payload: a JSON object that is the answer, or fenced in it
    (none nested deeper than the journal holds)."""
    candidates = [text.strip()]
    if "```" in text:
        candidates += [part.removeprefix("json").strip() for part in text.split("```")[1::2]]
    for candidate in candidates:
        if not candidate.startswith("{"):
            continue
        try:
            value = loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict) and not too_deep(candidate, value):
            return value
    return None


class Session(DomainModel, frozen=True, kw_only=True):
    """One conversation: a chat thread, or a console session."""

    id: str
    platform: str = "console"
    workspace: str = ""  # the Slack team or Discord guild
    channel: str = ""
    thread: str = ""

    @property
    def place(self) -> Place:
        """Where the session's runs live."""
        return Place(self.platform, self.workspace, self.channel, self.thread)
