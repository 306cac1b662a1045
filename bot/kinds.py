"""The domain's closed vocabularies: statuses, stop reasons, outcomes and kinds, and the command
that answers each kind of request (``kestrel runs approve``, ``kestrel chat`` and the rest say it).

Plain enums without pydantic, so that a command that only reads the journal's rows (``kestrel
runs pending``) can name them without importing the models; ``bot.domain`` offers them too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Final


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
    HANDED_BACK = "handed_back"  # a replica stopped: any other may go on with it
    WAITING = "waiting"


class ToolOutcome(StrEnum):
    """The exit a call took through executeTool; counted per kind."""

    UNKNOWN_TOOL = "unknown_tool"
    HOOK_DENIED = "hook_denied"
    INVALID_ARGUMENTS = "invalid_arguments"
    GATE_DENIED = "gate_denied"
    DEFERRED = "deferred"
    TAKEN_OVER = "taken_over"
    TIMEOUT = "timeout"
    ERROR = "error"  # the tool raised, answered malformed, or answered with ``is_error``
    OK = "ok"


class RequestKind(StrEnum):
    """What an open wait is waiting for."""

    WAIT_USER = "wait_user"
    WAIT_APPROVAL = "wait_approval"
    WAIT_EFFECT = "wait_effect"
    WAIT_PLAN = "wait_plan"


# How each kind of request is answered from a shell: ``how_answered`` fills in the names.
_ANSWER_WITH: Final[Mapping[str, str]] = {
    RequestKind.WAIT_APPROVAL: "kestrel runs approve {run} {id}{someone} (or deny)",
    RequestKind.WAIT_USER: "kestrel runs answer {run} {id} {text}{someone}",
    RequestKind.WAIT_EFFECT: "kestrel runs effect {run} {id} retry|done|failed{someone}",
    RequestKind.WAIT_PLAN: (
        "kestrel runs approve {run} {id}{someone} [--step-by-step] (or deny --reason TEXT)"
    ),
}


def how_answered(
    kind: str,
    run_id: str,
    request_id: str,
    options: Sequence[str],
    *,
    requester: bool = False,
    acting_as: str = "",
) -> str:
    """The command that answers a request of ``kind`` ("" for a kind no command answers).

    ``requester``: said to the run's requester, whose own approval ``runs approve`` refuses
    (the two-person rule): the approval is given ``--as`` someone else. ``acting_as``: the
    person it is said to, when a bare command would act as someone else (they gave ``--as``
    themselves): it names them, so that the command pasted as printed acts as them."""
    text = "|".join(options) or "TEXT"
    someone = _someone(kind, requester, acting_as)
    return _ANSWER_WITH.get(kind, "").format(run=run_id, id=request_id, text=text, someone=someone)


def as_flag(acting_as: str) -> str:
    """`` --as NAME`` for a command printed for ``acting_as`` ("" for nobody), quoted for a
    shell: a name may hold a space (a login name as ``Ann Lee``)."""
    if not acting_as:
        return ""
    import shlex  # only for a name to quote: most commands print no hint

    return f" --as {shlex.quote(acting_as)}"


def _someone(kind: str, requester: bool, acting_as: str) -> str:
    """Who a printed command acts as: someone else, for a requester's own approval."""
    if requester and kind in (RequestKind.WAIT_APPROVAL, RequestKind.WAIT_PLAN):
        return " --as NAME"
    return as_flag(acting_as)


class RequestStatus(StrEnum):
    """The life of a request: open until exactly one decision closes it."""

    OPEN = "open"
    ANSWERED = "answered"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


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
    STEP_BY_STEP = "step_by_step"


class GrantKind(StrEnum):
    """A one-shot grant covers one call and digest; a standing grant a tool for the run; a plan
    step grant the next call of its tool and digest, in its plan's order, once."""

    ONE_SHOT = "one_shot"
    STANDING = "standing"
    PLAN_STEP = "plan_step"


class Provenance(StrEnum):
    """What a consequential call with an argument taken from tool output does (``provenance``
    in kestrel.yaml): wait for a person who sees where it came from, only journal it, or
    nothing."""

    ASK = "ask"
    LOG = "log"
    OFF = "off"


class AuditAction(StrEnum):
    """What an audit row records; the stored text is the value (``kestrel audit`` prints it)."""

    REQUEST = "request"
    APPROVE = "approve"
    APPROVE_ALWAYS = "approve_always"
    APPROVE_PARTIAL = "approve_partial"
    DENY = "deny"
    ANSWER = "answer"
    RETRY = "retry"
    DONE = "done"
    FAILED = "failed"
    EXPIRED = "expired"
    STEP_BY_STEP = "step_by_step"
    EXPIRE = "expire"
    REMIND = "remind"
    REFUSED = "refused"
    RESUME = "resume"
    CANCEL = "cancel"
    TAKEN_OVER = "taken_over"
    FEEDBACK_POSITIVE = "feedback_positive"
    FEEDBACK_NEGATIVE = "feedback_negative"
    START_REFUSED = "start_refused"
    SHOW_REFUSED = "show_refused"
    FEEDBACK_REFUSED = "feedback_refused"
    CANCEL_REFUSED = "cancel_refused"
    RESUME_REFUSED = "resume_refused"
    APPROVE_REFUSED = "approve_refused"
    APPROVE_ALWAYS_REFUSED = "approve_always_refused"
    DENY_REFUSED = "deny_refused"
    ANSWER_REFUSED = "answer_refused"
    RETRY_REFUSED = "retry_refused"
    DONE_REFUSED = "done_refused"
    FAILED_REFUSED = "failed_refused"
    EXPIRED_REFUSED = "expired_refused"
    STEP_BY_STEP_REFUSED = "step_by_step_refused"

    @classmethod
    def of(cls, kind: DecisionKind) -> AuditAction:
        """The action that records a decision of ``kind``."""
        return cls(kind.value)

    @classmethod
    def refused(cls, verb: str) -> AuditAction:
        """The action that records a refused ``verb`` (a decision kind or a thread command)."""
        return cls(f"{verb}_refused")
