"""Decisions: how answers, decisions and expiries reach suspended runs.

Every decision is checked against the store (the request is open, belongs to the run, has not
expired, the card's digest matches) and the policy (who may decide what), then written by a
conditional update that exactly one caller wins, and audited.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Final, Protocol

import msgspec
from msgspec.structs import replace

from bot.domain import Decision, DecisionKind, Request, RequestKind, RequestStatus
from bot.events import AdvisoryEvent, FanOut, RequestDecidedEvent, RequestExpiredEvent
from bot.journal.fold import RunState
from bot.kinds import TERMINAL_STATUSES, AuditAction
from bot.people.audit import Redact, decision_detail, request_detail
from bot.people.policy import Actor, Policy
from bot.people.refusal import Refusal
from bot.place import Place
from bot.prompter import DeferringPrompter, Prompter
from bot.store_values import Audited, Counted, Settled

if TYPE_CHECKING:
    # Types only: people/ asks nothing of the tools room but the flags the tool set gives,
    # and the store's roles and the runtime's share are protocols, for the type checker.
    from bot.store import AuditLog, Requests, RunRows
    from bot.tools.source import ToolSource

    class DecisionsStore(Requests, AuditLog, RunRows, Protocol):
        """The roles decisions use: requests and their decisions, the audit, where a run lives."""

    class Shared(Protocol):
        """What decisions use of the runtime the runs share (``bot.run.runtime.Runtime`` is one)."""

        @property
        def store(self) -> DecisionsStore:
            """Where requests, decisions and the audit are kept."""

        @property
        def tools(self) -> ToolSource:
            """The tool set, for the flags the policy weighs."""

        @property
        def events(self) -> FanOut:
            """Where advisories and expiries are told."""

        @property
        def policy(self) -> Policy:
            """Who may decide what."""

        @property
        def redact(self) -> Redact:
            """The PII guard as a function of text, for what the audit keeps."""

        @property
        def clock(self) -> Callable[[], datetime]:
            """The one clock: whether a request's deadline has passed."""

        @property
        def owner(self) -> str:
            """This process as a lease owner, for a lease taken with a decision."""

        @property
        def lease_seconds(self) -> float:
            """How long a lease taken with a decision lasts."""


# How many answers closed here wait for their resume at most (one each, read at once).
_CLOSED_HERE_KEPT: Final = 64
# The refusal of a request id the store does not hold, before the id.
NO_REQUEST: Final = "there is no request"


def other_runs(request: Request, run_id: str) -> str:
    """The refusal of ``request`` named with ``run_id``, the id of a run it is not of."""
    return f"request {request.id} is run {request.run_id}'s, not run {run_id}'s"


class Answered(msgspec.Struct, frozen=True):
    """What became of an answer: whether it counted, why, and whether the run can go on."""

    accepted: bool
    message: str
    ready: bool = False
    # The epoch of the run's lease, taken with the decision that closed its last open request:
    # this process resumes the run.
    claimed: int | None = None


class Decisions:
    """Answers in, open requests out: the store and the policy between people and runs."""

    def __init__(self, runtime: Shared) -> None:
        self.rt = runtime
        # Requests this process closed, taking their run's lease, by id: the resume it starts
        # next reads each answer here once, not from the store again (a request closes once).
        self._closed_here: dict[str, Decision] = {}

    async def answer(
        self, decision: Decision, *, run_id: str, actor: Actor | None = None, digest: str = ""
    ) -> Answered:
        """Check a decision against the store and policy, then write it; one winner per request."""
        actor = actor or Actor(decision.by)
        try:
            request, status, winner = await self.rt.store.get_request(decision.request_id)
        except KeyError:
            return Answered(False, f"{NO_REQUEST} {decision.request_id}")
        refusal = await self._refusal(request, status, decision, actor, run_id, digest, winner)
        if not refusal and request.kind is RequestKind.WAIT_USER and not request.options:
            # Checked here, not in ``_refusal``: opening the Answer form checks the person
            # before any words exist. A screenshot alone must not use up the question (one
            # with options takes one of them only, an empty one too).
            from bot.options import wordless  # a question's: an approval never imports it

            refusal = wordless(decision.text)
        # An answer, and an approval of a request that needs more than one, is refused in its
        # own statement once the run ended (then ``_too_late``, which says so and closes it).
        partial = decision.kind is DecisionKind.APPROVE and request.approvals_needed > 1
        if refusal:
            action = AuditAction.refused(decision.kind.value)
            detail = self.audited_refusal(refusal, decision)
            await self.rt.store.audit(actor.user, action, run_id, request.id, detail)
            return Answered(False, refusal.reason)
        if request.options and decision.kind is DecisionKind.ANSWER:
            # The option as the question spells it ("Y" answers "yes"): the model reads that.
            from bot.options import match_option

            picked = match_option(decision.text, request.options) or decision.text
            decision = replace(decision, text=picked)
        decision = self.as_kept(decision)
        if partial:  # a plan too
            audited = Audited(
                actor.user, AuditAction.APPROVE_PARTIAL, decision_detail(request, decision)
            )
            counted = await self.rt.store.add_approval(request.id, actor.user, audited)
            if counted is None:
                return await self._too_late(decision, actor, run_id)
            if counted.count < request.approvals_needed:
                return self._partial(request, decision, counted)
        detail = decision_detail(request, decision, self.rt.redact)
        audit = Audited(actor.user, AuditAction.of(decision.kind), detail)
        settled = await self.rt.store.decide_and_claim(
            decision, RequestStatus.ANSWERED, audit, self.rt.owner, self.rt.lease_seconds
        )
        if not settled.won:
            return await self._too_late(decision, actor, run_id)
        self._decided(request, decision)
        if settled.epoch is not None:
            self._remember(request.id, decision)
            return Answered(True, "recorded", ready=True, claimed=settled.epoch)
        remaining = await self.rt.store.list_requests(run_id=run_id)
        return Answered(True, "recorded", ready=not remaining)

    def _partial(self, request: Request, decision: Decision, counted: Counted) -> Answered:
        """An approval that counted towards several, or a repeat of one that did: said so."""
        left = request.approvals_needed - counted.count
        more = f"{left} more approval" + ("" if left == 1 else "s")
        if not counted.new:
            # Nothing changed: no card to refresh, and the clicker must not think it counted.
            return Answered(
                True, f"You already approved this; it needs {more} (from someone else)."
            )
        self._decided(request, decision)
        return Answered(True, f"approval {counted.count} of {request.approvals_needed} recorded")

    async def _ended(self, request: Request) -> Refusal | None:
        """A request still open on a run that ended: a cancel ends its run before it closes
        the run's requests, and a process killed between the two leaves them open. Nothing
        would act on an answer, so it is refused, and the request closed as the cancel would
        have (a card or the Home tab then stops offering it)."""
        record = await self.rt.store.get_run(request.run_id)
        if record.status not in TERMINAL_STATUSES:
            return None
        closed = Decision(request_id=request.id, kind=DecisionKind.DENY, by="")
        if await self.rt.store.decide(closed, RequestStatus.CANCELLED):
            self._decided(request, closed)
        return Refusal(f"run {request.run_id} was {record.status.value}: nothing waits on this")

    def as_kept(self, decision: Decision) -> Decision:
        """The decision as the store and the journal keep it: its text through the PII guard,
        as the model and the audit read it (the run page, a card and `runs show` read it there)."""
        if not decision.text:
            return decision
        return replace(decision, text=self.rt.redact(decision.text))

    async def _too_late(self, decision: Decision, actor: Actor, run_id: str) -> Answered:
        """A decision that passed every check but found its request closed as it was written
        (another decision, a cancel or the deadline came first): said and audited as the same
        decision a moment later would be, with what closed it."""
        request, status, winner = await self.rt.store.get_request(decision.request_id)
        ended = await self._ended(request) if status is RequestStatus.OPEN else None
        # Still open: its run ended as this was written (a cancel, which closes it next).
        reason = ended.reason if ended else _closed(decision.request_id, status, winner)
        action = AuditAction.refused(decision.kind.value)
        await self.rt.store.audit(actor.user, action, run_id, decision.request_id, reason)
        return Answered(False, reason)

    def _remember(self, request_id: str, decision: Decision) -> None:
        """Keep the answer that closed ``request_id`` for the resume that follows; a resume
        refused never reads it, so the oldest go past a few."""
        if len(self._closed_here) >= _CLOSED_HERE_KEPT:
            del self._closed_here[next(iter(self._closed_here))]
        self._closed_here[request_id] = decision

    def _decided(self, request: Request, decision: Decision) -> None:
        # Told once the decision is durable: every platform's card of it refreshes from this.
        self.rt.events.emit(RequestDecidedEvent(request.run_id, request.id, decision.kind))

    def audited_refusal(self, refusal: Refusal, decision: Decision) -> str:
        """A refusal as the audit keeps it: redacted when it may quote what the person typed."""
        return self.rt.redact(refusal.audited) if decision.text.strip() else refusal.audited

    async def _refusal(
        self,
        request: Request,
        status: RequestStatus,
        decision: Decision,
        actor: Actor,
        run_id: str,
        digest: str,
        winner: Decision | None = None,
    ) -> Refusal | None:
        # Where it came from first: from another place, nothing of the request is said (how
        # it closed and who closed it, when it expired, which run it is of).
        run = await self.place_of(request.run_id) if actor.place is not None else None
        what = f"request {request.id}"
        misplaced = await self.rt.policy.place_refusal(actor, run, what, thread=True)
        if misplaced:
            return misplaced
        if request.run_id != run_id:
            return Refusal(other_runs(request, run_id))
        if status is not RequestStatus.OPEN:
            return Refusal(_closed(request.id, status, winner))
        if request.deadline is not None and request.deadline <= self.rt.clock():
            expired = f"{request.deadline:%Y-%m-%d %H:%M}"
            return Refusal(f"request {request.id} expired at {expired} UTC")
        if digest and digest != request.digest:
            return Refusal("this card is stale: the call it shows is not the one waiting")
        tools = self.rt.tools.current()
        refusal = await self.rt.policy.check_decision(
            actor,
            decision.kind,
            request,
            tools.flags_of(request.tool),
            run=run,
            flags_of=tools.flags_of,
        )
        if refusal or request.kind is not RequestKind.WAIT_USER:
            return refusal
        # A question with options (ask_human_confirm, ask_human_select) takes one of them only.
        from bot.options import answer_refusal

        return answer_refusal(decision.text, request.options)

    async def refusal(self, decision: Decision, *, run_id: str, actor: Actor) -> Refusal | None:
        """Why ``actor`` may not make ``decision`` now (None: they may); writes nothing."""
        try:
            request, status, winner = await self.rt.store.get_request(decision.request_id)
        except KeyError:
            return Refusal(f"{NO_REQUEST} {decision.request_id}")
        return await self._refusal(request, status, decision, actor, run_id, "", winner)

    async def place_of(self, run_id: str) -> Place:
        """Where a run lives (a run whose session the store lost lives nowhere anyone acts)."""
        record = await self.rt.store.get_run(run_id)
        session = await self.rt.store.get_session(record.session_id)
        return session.place if session is not None else Place("", "unknown")

    async def expire(self, request: Request) -> Settled:
        """Close a request whose deadline passed; ``won`` only for the one caller that won,
        which takes the run's lease if that closed its last open request (a decision does the
        same): dying before it resumes the run leaves it to adoption, not stranded."""
        decision = Decision(request_id=request.id, kind=DecisionKind.EXPIRED, by="deadline")
        audit = Audited("deadline", AuditAction.EXPIRE, decision_detail(request, decision))
        settled = await self.rt.store.decide_and_claim(
            decision, RequestStatus.EXPIRED, audit, self.rt.owner, self.rt.lease_seconds
        )
        if settled.won:
            self.rt.events.emit(RequestExpiredEvent(request.run_id, request.id))
        return settled

    async def open_request(self, request: Request) -> None:
        """Record a request as open again, with its audit record: the repair for a request
        the store lost (a deferred call's entry opens its request as it lands)."""
        await self.rt.store.open_request(request)
        await self.rt.store.audit(
            request.requested_by or "run",
            AuditAction.REQUEST,
            request.run_id,
            request.id,
            request_detail(request),
        )

    async def ask_again(self, state: RunState, prompter: Prompter) -> None:
        """Offer the requests a run still waits on to the prompter who resumes it; an answer
        is checked against the policy and audited as an inline one is."""
        checked = CheckedPrompter(prompter, self)
        for request in state.open_requests:
            found = await self.lookup(request.id)
            if found is None or found[0] is not RequestStatus.OPEN:
                continue
            decision = await checked.permitted(request)
            if decision is not None:
                decision = self.as_kept(decision)  # stored as the model reads it
                # Audited by the decision that closes the request only: someone else may win.
                detail = decision_detail(request, decision, self.rt.redact, inline=True)
                audit = Audited(decision.by, AuditAction.of(decision.kind), detail)
                await self.rt.store.decide(decision, RequestStatus.ANSWERED, audit)

    def checked(self, prompter: Prompter | None) -> Prompter | None:
        """``prompter`` with every decision it makes checked and audited (None stays None, and
        a ``DeferringPrompter`` makes none)."""
        if prompter is None or isinstance(prompter, CheckedPrompter):
            return prompter
        if type(prompter) is DeferringPrompter:  # exactly: a subclass might decide
            return prompter
        return CheckedPrompter(prompter, self)

    async def lookup(self, request_id: str) -> tuple[RequestStatus, Decision | None] | None:
        """A request's status and decision; None if the store does not know it."""
        closed_here = self._closed_here.pop(request_id, None)
        if closed_here is not None:
            return RequestStatus.ANSWERED, closed_here
        try:
            _request, status, decision = await self.rt.store.get_request(request_id)
        except KeyError:
            return None
        return status, decision

    async def has_work(self, state: RunState) -> bool:
        """Whether a suspended run can go on: every request it waits on was answered (or one
        is missing from the store, which the run re-opens)."""
        for request in state.open_requests:
            found = await self.lookup(request.id)
            if found is None:
                return True
            if found[0] is RequestStatus.OPEN:
                return False
        return True

    async def close_requests(self, run_id: str, by: str) -> None:
        """Cancel every open request of a run (it was cancelled)."""
        for request, _status, _decision in await self.rt.store.list_requests(run_id=run_id):
            decision = Decision(request_id=request.id, kind=DecisionKind.DENY, by=by)
            await self.rt.store.decide(decision, RequestStatus.CANCELLED)


def _closed(request_id: str, status: RequestStatus, decision: Decision | None) -> str:
    """Why a closed request takes no decision, naming what closed it and who, when known."""
    reason = f"request {request_id} is already {status.value}"
    if decision is None or not decision.by or status is RequestStatus.EXPIRED:
        return reason
    if status is RequestStatus.CANCELLED:  # its run was cancelled: its decision says by whom
        return f"{reason} (by {decision.by})"
    return f"{reason} ({decision.kind.value} by {decision.by})"


class CheckedPrompter:
    """A prompter whose decisions are checked against the policy and audited, as the
    ``Decisions`` checks and audits those it is given.

    Inline answers (an approval in ``kestrel chat``, a question answered at the terminal) never
    reach the store's requests, so without this the policy and the audit would miss them. A
    refused answer leaves the request open for someone who may decide it, and says why.
    """

    def __init__(self, prompter: Prompter, decisions: Decisions) -> None:
        self._prompter = prompter
        self._decisions = decisions

    @property
    def present(self) -> bool:
        """Whether the wrapped prompter can ask someone now."""
        return self._prompter.present

    async def ask(self, request: Request) -> Decision | None:
        """Ask the wrapped prompter; a decision counts only if the policy allows it."""
        decision = await self.permitted(request)
        if decision is not None:
            # Asked and decided at once, the request never reached the store's requests (nor
            # their audit): its row is written here, before the decision's.
            store = self._decisions.rt.store
            asker = request.requested_by or "run"
            opened = request_detail(request, inline=True)
            await store.audit(asker, AuditAction.REQUEST, request.run_id, request.id, opened)
            detail = decision_detail(request, decision, self._decisions.rt.redact, inline=True)
            await store.audit(
                decision.by, AuditAction.of(decision.kind), request.run_id, request.id, detail
            )
        return decision

    async def permitted(self, request: Request) -> Decision | None:
        """Ask the wrapped prompter; the decision if the policy allows it (not audited yet),
        else None, the refusal audited and said."""
        decision = await self._prompter.ask(request)
        if decision is None:
            return None
        rt = self._decisions.rt
        tools = rt.tools.current()
        refusal = await rt.policy.check_decision(
            Actor(decision.by),
            decision.kind,
            request,
            tools.flags_of(request.tool),
            inline=True,
            flags_of=tools.flags_of,
        )
        if refusal:
            detail = self._decisions.audited_refusal(refusal, decision)
            await rt.store.audit(
                decision.by, AuditAction.REFUSED, request.run_id, request.id, detail
            )
            text = f"{refusal}; the request stays open for someone who may decide it"
            rt.events.emit(AdvisoryEvent(request.run_id, text))
            return None
        return decision
