"""Plans in the loop: the calls of one reply that need approval, the steps a model proposed, the
approved steps a call may use (in their plan's order, each once), and how a call that matches
no step differs from the nearest one."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from bot.domain import (
    Decision,
    DecisionKind,
    Grant,
    GrantKind,
    PlanStep,
    Request,
    RequestKind,
    RequestMaker,
    ToolCall,
    plan_digest,
)
from bot.run.arguments import parse_arguments
from bot.tools.propose_plan import PROPOSE_PLAN
from bot.tools.toolset import ToolSet

# An argument value longer than this is cut where a card says how a call differs: a changed
# one around where it differs from the plan's.
VALUE_SHOWN: Final = 60
# How every card of a call (or a plan) that an approved plan does not cover begins.
OFF_PLAN: Final = "off the approved plan"


class PlanBook:
    """The approved plans' step grants of one run, and which steps are used up.

    A step covers one call of its tool with its exact arguments (same digest), once, and only
    when every earlier gated step of its plan has run: a plan's steps run in its order.
    """

    def __init__(self) -> None:
        self._steps: dict[str, dict[int, Grant]] = {}
        self._used: set[tuple[str, int]] = set()
        # Each plan, with each call that used one of its steps up: one step a plan, at most.
        self._users: set[tuple[str, str]] = set()

    def honour(self, grant: Grant) -> None:
        """Learn a plan step's grant, or that a one-shot grant used one up."""
        if grant.kind is GrantKind.PLAN_STEP:
            self._steps.setdefault(grant.plan, {})[grant.step] = grant
        elif grant.plan:
            self._used.add((grant.plan, grant.step))
            self._users.add((grant.plan, grant.call_id))

    def copy(self) -> PlanBook:
        """A book to try calls against without using anything up in this one."""
        book = PlanBook()
        book._steps = {plan: dict(steps) for plan, steps in self._steps.items()}
        book._used = set(self._used)
        book._users = set(self._users)
        return book

    def step_of(self, call_id: str, tool: str, digest: str) -> Grant | None:
        """The first step not used up, in any order, that is exactly this call, of a plan none
        of whose steps this call used up; None if there is none."""
        left = (g for g in self._all_steps() if (g.plan, g.step) not in self._used)
        exact = (g for g in left if (g.tool, g.digest) == (tool, digest))
        return next((g for g in exact if (g.plan, call_id) not in self._users), None)

    def use(self, step: Grant, call_id: str, digest: str) -> list[Grant]:
        """Use ``step`` up by this call, and in each other approved plan the first step left
        that is exactly it: a call that runs once is each plan's step once, so two plans that
        hold it (one proposed again, one approved to run a card's call) never let it run twice
        unasked. The one-shot grants that say so, to journal before its effect starts."""
        used: list[Grant] = []
        found: Grant | None = step
        while found is not None:
            grant = Grant(
                kind=GrantKind.ONE_SHOT,
                tool=found.tool,
                call_id=call_id,
                digest=digest,
                by=found.by,
                plan=found.plan,
                step=found.step,
            )
            self.honour(grant)
            used.append(grant)
            found = self.step_of(call_id, found.tool, digest)
        return used

    def knows(self, plan: str, step: int) -> bool:
        """Whether step ``step`` of ``plan`` was granted already."""
        return step in self._steps.get(plan, {})

    def cover(self, tool: str, digest: str) -> Grant | None:
        """The next step of an approved plan that this exact call is, if any."""
        return next((g for g in self._next_steps() if (g.tool, g.digest) == (tool, digest)), None)

    def difference(self, tool: str, arguments: dict[str, Any], digest: str) -> str:
        """How a call that no step covers differs from the nearest step left; empty when the
        run has no approved plan."""
        found = self.departure(tool, arguments, digest)
        if found is None:
            return ""
        where, how = found
        return f"{OFF_PLAN} ({where}): {how}" if where else f"{OFF_PLAN}: {how}"

    def departure(
        self, tool: str, arguments: dict[str, Any], digest: str
    ) -> tuple[str, str] | None:
        """``difference`` in its two parts: the step it is held against (``step 2 of T``, or
        "" when none is) and how it differs; None when the run has no approved plan."""
        if not self._steps:
            return None
        left = [g for g in self._all_steps() if (g.plan, g.step) not in self._used]
        if not left:
            return "", "every step of it has run; this call is one more"
        ran = self._ran(tool, digest)
        if ran is not None and not any((g.tool, g.digest) == (tool, digest) for g in left):
            # A step once more, not a step changed: the nearest step left would be no answer.
            return "", (
                f"this is step {ran.step + 1} ({tool}) once more; it has run, and a step"
                " covers one call"
            )
        nearest = min(left, key=lambda g: _distance(g, tool, arguments))
        where = f"step {nearest.step + 1}"
        if nearest.tool != tool:
            shown = _shown(nearest.arguments)
            return (
                "",
                f"no step left calls {tool}; the nearest, {where}, calls {nearest.tool} {shown}",
            )
        changes = _changes(nearest.arguments, arguments)
        if changes:
            return f"{where} of {nearest.tool}", "; ".join(changes)
        if nearest.digest != digest:
            return "", f"{where} was approved for {tool} as it was then"
        first = next(g for g in self._next_steps() if g.plan == nearest.plan)
        return "", (
            f"this is {where}, but the plan's steps run in order and"
            f" step {first.step + 1} ({first.tool}) has not run yet; approved here, it uses"
            f" {where} up"
        )

    def _ran(self, tool: str, digest: str) -> Grant | None:
        """The latest step used up that is exactly this call, if any."""
        ran = [g for g in self._all_steps() if (g.plan, g.step) in self._used]
        return next((g for g in reversed(ran) if (g.tool, g.digest) == (tool, digest)), None)

    def _all_steps(self) -> list[Grant]:
        return [g for steps in self._steps.values() for _, g in sorted(steps.items())]

    def _next_steps(self) -> list[Grant]:
        """Each plan's first step not used up."""
        found = []
        for steps in self._steps.values():
            left = [g for i, g in sorted(steps.items()) if (g.plan, i) not in self._used]
            found.extend(left[:1])
        return found


def _distance(step: Grant, tool: str, arguments: dict[str, Any]) -> tuple[int, int, int, int]:
    """Nearest first: the same tool, then the fewest arguments changed, then the values that
    start most alike (`payments-dbx` is nearer `payments-db` than `payments-api`), then the
    earliest."""
    changes = len(_changes(step.arguments, arguments))
    alike = sum(
        _first_difference(_canonical(step.arguments[key]), _canonical(arguments[key]))
        for key in step.arguments.keys() & arguments.keys()
    )
    return (step.tool != tool, changes, -alike, step.step)


def _changes(planned: dict[str, Any], called: dict[str, Any]) -> list[str]:
    """Each argument the call changes, adds or leaves out, against the plan's step."""
    changes = []
    for key in sorted(planned.keys() | called.keys()):
        if key not in planned:
            changes.append(f"extra argument `{key}`: `{_value(called[key])}`")
        elif key not in called:
            changes.append(f"missing argument `{key}` (plan `{_value(planned[key])}`)")
        elif _canonical(planned[key]) != _canonical(called[key]):
            was, now = _text(planned[key]), _text(called[key])
            if _look_alike(was, now):  # 1 vs "1", NFC vs NFD, fullwidth: as escaped JSON
                was, now = _canonical(planned[key]), _canonical(called[key])
            was, now = _around_difference(was, now)
            changes.append(f"changed argument `{key}`: `{now}` vs plan `{was}`")
    return changes


def _around_difference(was: str, now: str) -> tuple[str, str]:
    """Both values whole when they are short; else each cut to the same window, starting a
    little before the first character where they differ, so that the card shows the
    difference and not only a start they share."""
    if len(was) <= VALUE_SHOWN and len(now) <= VALUE_SHOWN:
        return was, now
    at = _first_difference(was, now)
    start = max(0, at - VALUE_SHOWN // 3)
    return _window(was, start), _window(now, start)


def _first_difference(was: str, now: str) -> int:
    """Where two different texts first differ (the shorter one's length if it starts the
    other)."""
    low, high = 0, min(len(was), len(now))
    while low < high:  # halving: a slice comparison is C, a loop over characters is not
        middle = (low + high + 1) // 2
        if was[:middle] == now[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _window(text: str, start: int) -> str:
    end = start + VALUE_SHOWN
    return ("…" if start else "") + text[start:end] + ("…" if len(text) > end else "")


def _look_alike(shown: str, other: str) -> bool:
    return unicodedata.normalize("NFKC", shown) == unicodedata.normalize("NFKC", other)


def _canonical(value: Any) -> str:
    """A value as the call's digest writes it: 1, 1.0, true and "1" differ, as do NFC and NFD
    (Python's ``==`` holds 1 == 1.0 == True)."""
    return json.dumps(value, sort_keys=True)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _value(value: Any) -> str:
    return _cut(_text(value))


def _cut(text: str) -> str:
    return text if len(text) <= VALUE_SHOWN else text[: VALUE_SHOWN - 1] + "…"


def _shown(arguments: dict[str, Any]) -> str:
    return _value(json.dumps(arguments, sort_keys=True, ensure_ascii=False))


def plan_off_plan(departures: Sequence[tuple[str, str] | None]) -> str:
    """What the card of a plan says of its steps that differ from an approved plan (each its
    ``PlanBook.departure``, None for one that does not): a reply of several calls no approved
    step covers is asked as a plan, whose card says how each differs, as a call's card would."""
    said = []
    for number, found in enumerate(departures, 1):
        if found is not None:
            where, how = found
            against = f" (against the approved {where})" if where else ""
            said.append(f"this plan's step {number}{against}: {how}")
    return f"{OFF_PLAN}: " + "; ".join(said) if said else ""


def needing_approval(
    calls: Iterable[ToolCall],
    tools: ToolSet,
    covered: Callable[[str, str, dict[str, Any], str], bool],
) -> list[PlanStep]:
    """The calls of a reply that will ask a person: gated, valid, not refused by policy
    outright, and not ``covered`` (call id, tool, arguments, digest; asked in the reply's
    order) by a grant."""
    steps = []
    for call in calls:
        tool = tools.get(call.name)
        if tool is None or not tool.flags.approval.confirm or tool.flags.approval.deny:
            continue
        arguments, problems = parse_arguments(call.arguments)
        if problems or tools.validate(call.name, arguments):
            continue
        digest = tools.call_digest(call.name, arguments)
        if not covered(call.id, call.name, arguments, digest):
            steps.append(
                PlanStep(tool=call.name, arguments=arguments, digest=digest, call_id=call.id)
            )
    return steps


def proposed_steps(arguments: dict[str, Any], tools: ToolSet) -> tuple[list[PlanStep], list[str]]:
    """The steps ``propose_plan`` was called with, checked against the tool set; or every way
    they are wrong, one line each, for the model."""
    steps: list[PlanStep] = []
    problems: list[str] = []
    for number, raw in enumerate(arguments["steps"], 1):
        name, step_arguments = raw["tool"], raw["arguments"]
        tool = tools.get(name) if name != PROPOSE_PLAN else None
        if tool is None:
            known = ", ".join(sorted(n for n in tools if n != PROPOSE_PLAN)) or "none"
            problems.append(f"step {number}: unknown tool {name!r}; tools: {known}")
            continue
        if tool.flags.approval.deny:
            problems.append(f"step {number}: policy never allows {name}")
            continue
        invalid = tools.validate(name, step_arguments)
        if invalid:
            problems.append(f"step {number} ({name}): invalid arguments: " + "; ".join(invalid))
            continue
        steps.append(
            PlanStep(
                tool=name,
                arguments=step_arguments,
                why=str(raw.get("why", "")),
                digest=tools.call_digest(name, step_arguments),
                gated=tool.flags.approval.confirm,
            )
        )
    return steps, problems


def plan_request(
    new_request: RequestMaker,
    call_id: str,
    summary: str,
    steps: list[PlanStep],
    tools: ToolSet,
    off_plan: str = "",
) -> Request:
    """The ``wait_plan`` request for ``steps``, bound to the call that asked (``propose_plan``,
    or a reply's first gated call); two approvers if any step needs two; ``off_plan``: how its
    steps differ from an approved plan's (``plan_off_plan``)."""
    needed = [tools[step.tool].flags.approval.approvals for step in steps if step.gated]
    return new_request(
        RequestKind.WAIT_PLAN,
        call_id,
        PROPOSE_PLAN,
        {"summary": summary},
        digest=plan_digest(tuple(steps)),
        prompt=summary,
        steps=tuple(steps),
        approvals_needed=max([1, *needed]),
        off_plan=off_plan,
    )


def plan_answer(decision: Decision) -> tuple[str, bool]:
    """What the model reads of a decision on its plan, and whether it is a refusal."""
    who = f" by {decision.by}" if decision.by else ""
    match decision.kind:
        case DecisionKind.APPROVE:
            return (
                f"plan approved{who}: make its calls in order, each exactly as proposed; any"
                " other call needs its own approval",
                False,
            )
        case DecisionKind.STEP_BY_STEP:
            return (
                f"approve step by step (chosen{who}): each call that needs approval will be"
                " asked for on its own",
                False,
            )
        case DecisionKind.EXPIRED:
            return "refused: the plan's approval request expired before anyone answered", True
        case _:
            why = f": {decision.text}" if decision.text else ""
            return f"denied{who}{why} (the whole plan: none of its steps may run)", True
