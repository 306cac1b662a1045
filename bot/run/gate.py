"""The confirm gate and its grants: default-deny in front of every gated call."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import msgspec

from bot.domain import (
    ArgumentOrigin,
    Decision,
    DecisionKind,
    Grant,
    GrantKind,
    PlanStep,
    Request,
    RequestKind,
    RequestMaker,
    call_digest,
)
from bot.prompter import Prompter
from bot.run.plan import PlanBook, plan_answer
from bot.tools.base import Tool


class GateVerdict(msgspec.Struct, frozen=True):
    """Allowed, refused with a reason the model can read, or deferred on a request."""

    allowed: bool
    reason: str = ""
    request: Request | None = None


_UNSEEN = (
    "refused: an argument of this command was taken from a tool's output, and no one is "
    "present to see where it came from and approve it"
)


class Gate:
    """Decides whether a gated call may run now, asking the prompter when no grant covers it.

    A grant is honoured from the moment it is given but only staged; ``flush`` hands the
    staged grants over to be journaled after the triggering call is answered or deferred.
    """

    def __init__(
        self,
        new_request: RequestMaker,
        prompter: Prompter | None,
        expired: Callable[[], bool],
        written: Iterable[Grant] = (),
        answers: Mapping[str, tuple[Decision, str]] | None = None,
        definition: Callable[[str], str] = lambda _name: "",
        read_before: Callable[[str], Collection[str] | None] = lambda _plan: None,
    ) -> None:
        self._new_request = new_request
        self._prompter = prompter
        self._expired = expired
        # Each call's decision, with the digest of the call its card showed.
        self._answers = dict(answers or {})
        # Each tool's definition now (``ToolSet.definition``): a grant or a card covers the
        # definition it was given for, so a tool edited since asks again.
        self._definition = definition
        # The calls whose output the model had read when it asked for an approved plan (its
        # request id); None for a plan of this batch, asked with everything read so far.
        self._read_before = read_before
        # A standing grant's tool, with the definition it was given for (its ``digest``).
        self._standing: dict[str, str] = {}
        self._one_shot: set[tuple[str, str]] = set()
        self._plans = PlanBook()
        # Calls whose plan was denied or expired: refused with the plan's reason.
        self._refused: dict[str, str] = {}
        self._staged: list[Grant] = []
        self._used: list[Grant] = []
        for grant in written:
            self._honour(grant)

    async def check(
        self,
        call_id: str,
        original: Tool,
        effective: Tool,
        arguments: dict[str, Any],
        origins: tuple[ArgumentOrigin, ...] = (),
        *,
        must_see: bool = False,
    ) -> GateVerdict:
        """The gate's verdict for one call; the caller has established that it is gated.

        ``origins`` (arguments taken from tool output) go on the request; ``must_see``: only a
        decision on this very call, made on a card that showed them, lets it run (a standing
        grant does not).
        """
        tool = effective
        digest = call_digest(tool.name, arguments, self._definition(tool.name))
        if call_id in self._refused:
            return GateVerdict(False, self._refused[call_id])
        answer, again = self._answer(call_id, tool.name, digest)
        if answer is None and (self._prompter is None or not self._prompter.present):
            if must_see:
                return GateVerdict(False, _UNSEEN)
            return GateVerdict(False, "refused: this command needs approval and no one is present")
        if self._expired():
            return GateVerdict(False, "refused: the run's deadline has passed")
        if original.flags.approval.deny or tool.flags.approval.deny:
            return GateVerdict(False, f"refused: policy never allows {tool.name}")
        if self.covers(call_id, tool.name, digest, must_see):
            return GateVerdict(True)
        step = self._plans.cover(tool.name, digest) if answer is None else None
        if step is not None and must_see:
            unseen = self._unseen(step.plan, origins)
            if unseen:
                step, again = None, unseen
        if step is not None:
            self._use(step, call_id, digest)
            return GateVerdict(True)
        request = self._request(call_id, tool, arguments, digest, origins, again)
        decision = answer if answer is not None else await self.ask(request)
        if decision is None:
            return GateVerdict(False, "waiting for approval", request)
        verdict = self._decide(decision, tool.name, call_id, digest)
        exact = self._plans.step_of(call_id, tool.name, digest) if verdict.allowed else None
        if exact is not None:
            # Approved on its own card (out of order, say), it is that step run: the plan
            # covers each step once in all, so no later call runs as it unasked.
            self._use(exact, call_id, digest)
        return verdict

    def _use(self, step: Grant, call_id: str, digest: str) -> None:
        """Use ``step`` up by this call (``PlanBook.use``), journaled before its effect starts
        (``used``): a step never covers a second call, even when the first one's outcome is
        lost in a crash."""
        for used in self._plans.use(step, call_id, digest):
            self._honour(used)
            self._used.append(used)

    def _answer(self, call_id: str, tool: str, digest: str) -> tuple[Decision | None, str]:
        """The decision on this call, if it answers the call as it would run now; else why the
        call asks again. An approval covers the call its card showed: a tool edited since (a
        resume forced past the change) or a hook that changed the call makes it no answer."""
        found = self._answers.get(call_id)
        if found is None:
            return None, ""
        decision, shown = found
        approved = decision.kind in (DecisionKind.APPROVE, DecisionKind.APPROVE_ALWAYS)
        if not approved or shown == digest:
            return decision, ""
        by = decision.by or "someone"
        return None, f"asked again: {by} approved {tool} as another card showed it"

    def _unseen(self, plan: str, origins: tuple[ArgumentOrigin, ...]) -> str:
        """Why the card of ``plan`` did not show where this call's values came from: an output
        the model read only after it asked for the plan (its steps were traced then)."""
        read = self._read_before(plan)
        if read is None:
            return ""
        late = [o for o in origins if o.call_id not in read]
        if not late:
            return ""
        shown = ", ".join(f"`{o.argument}` from {o.tool} (call {o.call_id})" for o in late)
        return f"asked again: the approved plan's card did not show where {shown} came from"

    def decided(self, call_id: str) -> bool:
        """Whether a person already decided on call ``call_id``: that decision stands, even if
        the call would not be asked about now (the configuration or its origins changed)."""
        return call_id in self._answers

    def covers(self, call_id: str, tool: str, digest: str, must_see: bool = False) -> bool:
        """Whether a standing or one-shot grant lets this exact call run (``must_see``: a
        call whose values came from tool output, which no standing grant covers)."""
        standing = self._standing.get(tool) == self._definition(tool) and not must_see
        return standing or (call_id, digest) in self._one_shot

    def trial(self) -> Trial:
        """The calls of a reply, tried in order against the grants and the approved plans'
        steps (used up as they are tried; this gate's steps are not)."""
        return Trial(self.covers, self._plans.copy())

    async def ask(self, request: Request) -> Decision | None:
        """Ask the prompter about ``request`` now; None when it is answered later (or nobody
        is present)."""
        if self._prompter is None or not self._prompter.present:
            return None
        return await self._prompter.ask(request)

    def _approve_plan(self, plan: str, steps: tuple[PlanStep, ...], by: str) -> None:
        """Grant each gated step of an approved plan, once (a decision read again after a
        crash grants nothing twice)."""
        for number, step in enumerate(steps):
            if not step.gated or self._plans.knows(plan, number):
                continue
            grant = Grant(
                kind=GrantKind.PLAN_STEP,
                tool=step.tool,
                digest=step.digest,
                by=by,
                plan=plan,
                step=number,
                arguments=step.arguments,
            )
            self._stage(grant)

    @property
    def present(self) -> bool:
        """Whether someone can be asked (now, or later through a request)."""
        return self._prompter is not None and self._prompter.present

    def settle_plan(self, request: Request, decision: Decision) -> tuple[str, bool]:
        """Apply a decision on a plan: grant its steps, refuse the calls it stands for, or
        neither (step by step); what the model reads of it, and whether it is a refusal."""
        output, refused = plan_answer(decision)
        if decision.kind is DecisionKind.APPROVE:
            self._approve_plan(request.id, request.steps, decision.by)
        elif refused:
            for step in request.steps:
                if step.call_id:
                    self._refused[step.call_id] = output
        return output, refused

    def used(self) -> list[Grant]:
        """Hand over the plan steps used up since asked (to be journaled before the effect)."""
        used, self._used = self._used, []
        return used

    def flush(self) -> list[Grant]:
        """Hand over the staged grants (to be journaled) and forget them."""
        staged, self._staged = self._staged, []
        return staged

    def _request(
        self,
        call_id: str,
        tool: Tool,
        arguments: dict[str, Any],
        digest: str,
        origins: tuple[ArgumentOrigin, ...],
        again: str = "",
    ) -> Request:
        return self._new_request(
            RequestKind.WAIT_APPROVAL,
            call_id,
            tool.name,
            arguments,
            digest=digest,
            prompt=tool.description,
            approvals_needed=max(1, tool.flags.approval.approvals),
            origins=origins,
            off_plan=again or self._plans.difference(tool.name, arguments, digest),
        )

    def _decide(self, decision: Decision, tool: str, call_id: str, digest: str) -> GateVerdict:
        if decision.kind is DecisionKind.APPROVE:
            self._stage(
                Grant(
                    kind=GrantKind.ONE_SHOT,
                    tool=tool,
                    call_id=call_id,
                    digest=digest,
                    by=decision.by,
                )
            )
            return GateVerdict(True)
        if decision.kind is DecisionKind.APPROVE_ALWAYS:
            definition = self._definition(tool)
            self._stage(
                Grant(kind=GrantKind.STANDING, tool=tool, digest=definition, by=decision.by)
            )
            return GateVerdict(True)
        if decision.kind is DecisionKind.EXPIRED:
            return GateVerdict(
                False, "refused: the approval request expired before anyone answered"
            )
        who = f" by {decision.by}" if decision.by else ""
        why = f": {decision.text}" if decision.text else ""
        return GateVerdict(False, f"denied{who}{why}")

    def _stage(self, grant: Grant) -> None:
        self._honour(grant)
        self._staged.append(grant)

    def _honour(self, grant: Grant) -> None:
        self._plans.honour(grant)
        if grant.kind is GrantKind.STANDING:
            self._standing[grant.tool] = grant.digest
        elif grant.kind is GrantKind.ONE_SHOT:
            self._one_shot.add((grant.call_id, grant.digest))


class Trial:
    """Whether each call of a reply, tried in order, would be let run by a grant or an approved
    plan's step; and, for each that would not, how it differs from the steps left then."""

    def __init__(self, covers: Callable[[str, str, str], bool], book: PlanBook) -> None:
        self._covers = covers
        self._book = book
        # Each call no grant covers, by id: ``PlanBook.departure`` as it was tried.
        self.departures: dict[str, tuple[str, str] | None] = {}

    def covered(self, call_id: str, tool: str, arguments: dict[str, Any], digest: str) -> bool:
        """Whether this call would run without asking (a step that covers it is used up)."""
        if self._covers(call_id, tool, digest):
            return True
        step = self._book.cover(tool, digest)
        if step is None:
            self.departures[call_id] = self._book.departure(tool, arguments, digest)
            return False
        self._book.use(step, call_id, digest)
        return True
