"""What a card says, on every platform: its title, its arguments, how it closed.

Platforms differ in markup (Block Kit, Discord embeds), in how they name a person and a time,
and in their limits; the words and the decisions behind them are the same, and live here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, assert_never

from bot.chat.words import origin_lines
from bot.domain import Decision, DecisionKind, PlanStep, Request, RequestKind, RequestStatus
from bot.text import invisibles_named

TRUNCATED = "…"


def title(request: Request, *, open_: bool) -> str:
    """The card's headline: what the request is."""
    match request.kind:
        case RequestKind.WAIT_APPROVAL:
            return "Approval needed" if open_ else "Approval requested"
        case RequestKind.WAIT_USER:
            return "Question"
        case RequestKind.WAIT_EFFECT:
            return "Outcome uncertain" if open_ else "Outcome was uncertain"
        case RequestKind.WAIT_PLAN:
            return "Plan approval needed" if open_ else "Plan approval requested"
        case _:
            assert_never(request.kind)


# A plan card's buttons, in order, with the decision each makes (Deny asks for a reason).
PLAN_BUTTONS: tuple[tuple[str, DecisionKind], ...] = (
    ("Approve plan", DecisionKind.APPROVE),
    ("Approve step by step", DecisionKind.STEP_BY_STEP),
    ("Deny", DecisionKind.DENY),
)
# What a plan card says its approval does, under its steps.
PLAN_BINDING = (
    "Approve plan lets each step run once, exactly as shown and in this order;"
    " any other call asks again."
)


@dataclass(frozen=True)
class StepView:
    """One step of a plan as a card shows it: number, tool, exact arguments, why, and where
    argument values came from (plain text; an adapter adds its markup)."""

    number: int
    tool: str
    arguments: str
    why: str
    origins: tuple[str, ...]
    gated: bool

    @property
    def headline(self) -> str:
        """``2. restart_unit {"unit": "payments-api"}``, and whether it needs no approval."""
        free = "" if self.gated else " (needs no approval)"
        return f"{self.number}. {self.tool} {self.arguments}{free}"


def plan_steps(request: Request) -> list[StepView]:
    """The steps of a plan request, in order, as every surface shows them."""
    return [_step_view(number, step) for number, step in enumerate(request.steps, 1)]


def _step_view(number: int, step: PlanStep) -> StepView:
    origins = tuple(origin_lines(step.origins))
    arguments = invisibles_named(json.dumps(step.arguments, sort_keys=True, ensure_ascii=False))
    return StepView(number, step.tool, arguments, step.why.strip(), origins, step.gated)


def off_plan_words(request: Request) -> str:
    """How an approval's call differs from the approved plan (``Off the approved plan: …``);
    empty when the run has no plan. Invisible characters in the values it quotes are named."""
    note = invisibles_named(request.off_plan.strip())
    return note[:1].upper() + note[1:]


def shorten(value: Any, limit: int) -> tuple[Any, bool]:
    """``value`` with every string longer than ``limit`` cut and marked; whether any was."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value, False
        return f"{value[:limit]}{TRUNCATED} (+{len(value) - limit:,} characters)", True
    if isinstance(value, Mapping):
        cut = False
        out: dict[str, Any] = {}
        for key, item in value.items():
            out[str(key)], more = shorten(item, limit)
            cut = cut or more
        return out, cut
    if isinstance(value, list | tuple):
        items = [shorten(item, limit) for item in value]
        return [item for item, _ in items], any(more for _, more in items)
    return value, False


def exact_calls(request: Request) -> Any:
    """What the request would run, in full: a plan's steps (each its tool and exact arguments),
    or the one call's arguments."""
    if not request.steps:
        return request.arguments
    return [
        {"step": n, "tool": s.tool, "arguments": s.arguments}
        for n, s in enumerate(request.steps, 1)
    ]


def pretty(value: Any) -> str:
    """JSON for people: indented, keys sorted, unicode as is."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def options_shown(request: Request) -> list[str]:
    """A question's options as a person reads them before picking one, each invisible
    character named (``[U+200B]``): two options alike but for one would read the same, and
    the one picked is what the model reads. In order: a click's index is still its option's."""
    return [invisibles_named(option) for option in request.options]


def exact(value: Any) -> str:
    """A call's arguments as an approver reads them: ``pretty``, with each character that
    shows as nothing or as a space it is not named by its code point (``[U+200B]``)."""
    return invisibles_named(pretty(value))


@dataclass(frozen=True)
class Closing:
    """How a request closed: a verb phrase, by whom (everyone whose approval it took, first
    approver first), when, and what they said."""

    phrase: str  # "Approved", "Approved for this run", "Denied", "Expired", "Cancelled"…
    by: tuple[str, ...] = ()
    at: datetime | None = None
    said: str = ""


def listed(names: Sequence[str]) -> str:
    """Names as a sentence lists them: ``a``, ``a and b``, ``a, b and c``."""
    if len(names) <= 1:
        return "".join(names)
    return f"{', '.join(names[:-1])} and {names[-1]}"


_PHRASES = {
    DecisionKind.APPROVE: "Approved",
    DecisionKind.APPROVE_ALWAYS: "Approved for this run",
    DecisionKind.DENY: "Denied",
    DecisionKind.ANSWER: "Answered",
    DecisionKind.RETRY: "Retried",
    DecisionKind.DONE: "Marked done",
    DecisionKind.FAILED: "Marked failed",
    DecisionKind.EXPIRED: "Expired",
    DecisionKind.STEP_BY_STEP: "Approved step by step",
}


def closing(
    status: RequestStatus, decision: Decision | None, approvers: Sequence[str] = ()
) -> Closing:
    """How a closed request ended, from its status, its decision and, for one that needed
    several approvals, everyone who approved it (the store's, in order)."""
    if status is RequestStatus.CANCELLED:
        return Closing("Cancelled", by=_named(decision.by if decision else ""))
    if decision is None:
        return Closing("Expired" if status is RequestStatus.EXPIRED else f"Closed ({status})")
    by = _named("" if decision.kind is DecisionKind.EXPIRED else decision.by)
    if decision.kind is DecisionKind.APPROVE and approvers:
        # The decision names the last approver only; the others approved before it.
        by = tuple(dict.fromkeys((*approvers, *by)))
    said = (
        decision.text.strip() if decision.kind in (DecisionKind.DENY, DecisionKind.ANSWER) else ""
    )
    return Closing(_PHRASES[decision.kind], by=by, at=decision.at, said=said)


def _named(person: str) -> tuple[str, ...]:
    return (person,) if person else ()
