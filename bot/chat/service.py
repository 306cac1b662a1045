"""The chat-facing service: the one interface chat adapters and the command line drive runs by.

An adapter passes who is acting (an ``Actor``: user id, groups, channel) and what they asked
for; whether they may is decided here, from the store and the policy, never from anything
else the adapter passes. What happens in runs comes back as typed events (``subscribe``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

import msgspec
from msgspec.structs import replace

from bot.chat.outbox_keys import card_key
from bot.chat.refusals import RefusalLog
from bot.domain import (
    TERMINAL_STATUSES,
    Decision,
    DecisionKind,
    Request,
    RequestStatus,
    RunStatus,
    Session,
    approved_by_several,
)
from bot.errors import StoreError, UnknownRun, unanswered
from bot.events import EventSink, FanOut
from bot.journal.fold import RunState, fold
from bot.journal.log import JournalLog, JournalRecord
from bot.kinds import AuditAction
from bot.logs import REQUEST_ID
from bot.people.policy import Actor, NotPermitted, Policy
from bot.people.refusal import Refusal, acted_from
from bot.place import Place
from bot.prompter import Prompter
from bot.records import RunRecord
from bot.store_values import AuditRecord
from bot.tools.base import ToolFlags

# The read-only commands import this module without starting any run; a command at the
# terminal takes no chat delivery, and one that decides reads no run's page; the run handles
# and the store's roles are protocols, for the type checker.
if TYPE_CHECKING:
    from datetime import datetime

    from bot.chat.handles import RunHandle, RunResult
    from bot.chat.inbound import Accepted, Delivery, Inbound
    from bot.chat.run_summary import RunSummaries
    from bot.run.supervisor import LiveRun, Supervisor
    from bot.store import AuditLog, OnceMarks, Outbox, Requests, RunRows, SessionPlaces
    from bot.tools.source import ToolSource

    class ChatStore(
        RunRows, SessionPlaces, JournalLog, Requests, AuditLog, OnceMarks, Outbox, Protocol
    ):
        """The roles the chat service reads and writes: runs and where their sessions live,
        journals, requests, the audit, interactions marked once, and the outbox (which message
        shows a request's card)."""

    class ChatRuntime(Protocol):
        """What the chat service uses of the runtime the runs share (``Runtime`` is one)."""

        @property
        def store(self) -> ChatStore:
            """The roles above."""

        @property
        def events(self) -> FanOut:
            """Where every run's events are told."""

        @property
        def policy(self) -> Policy:
            """Who may do what."""

        @property
        def tools(self) -> ToolSource:
            """The tool set, for the flags the policy weighs."""

        @property
        def shared(self) -> bool:
            """Whether other replicas share the store (and go on with a run handed back)."""

        @property
        def clock(self) -> Callable[[], datetime]:
            """The runtime's one clock (the refusals' log counts its minutes on it)."""

        @property
        def redact(self) -> Callable[[str], str]:
            """The PII guard as a function of text."""

    class ReadStore(RunRows, JournalLog, Requests, AuditLog, Protocol):
        """The roles a run's page is read through: runs, journals, requests and the audit."""


class PendingRequest(msgspec.Struct, frozen=True):
    """An open request with the principals who may answer it (and why, when not obvious), and
    who that is in words (``Policy.may_answer_phrase``: every surface says it alike)."""

    request: Request
    may_answer: tuple[str, ...]
    note: str = ""
    phrase: str = ""


class RunView(msgspec.Struct, frozen=True):
    """A run as a thread or a terminal shows it: where it stands, what it waits on, its budgets."""

    record: RunRecord
    state: RunState
    # Requests the store closed that the journal still holds open: decided while the run
    # stayed suspended (it could not go on here), until it resumes and journals the answers.
    closed: frozenset[str] = frozenset()

    @property
    def open_requests(self) -> list[Request]:
        """The requests the run waits on."""
        return [request for request in self.state.open_requests if request.id not in self.closed]

    @property
    def budgets_used(self) -> dict[str, tuple[int | float, int | float]]:
        """Each budget as (used, limit); a limit of 0 means none."""
        started = self.state.started
        if started is None:
            return {}
        budgets = started.budgets
        return {
            "iterations": (self.state.iteration, budgets.max_iterations),
            "tool_calls": (self.state.tool_calls, budgets.max_tool_calls),
            "tokens": (self.state.usage.total, budgets.max_tokens),
        }


REASONS_KEPT = 4096


def _closed_ids(found: list[tuple[Request, RequestStatus, Decision | None]]) -> frozenset[str]:
    """The ids of the requests among ``found`` (the store's rows) that are no longer open."""
    return frozenset(request.id for request, status, _ in found if status is not RequestStatus.OPEN)


class RequestView(msgspec.Struct, frozen=True):
    """A request as a card shows it: where it stands, who may answer, why the model asked."""

    request: Request
    status: RequestStatus
    decision: Decision | None
    may_answer: tuple[str, ...]
    reason: str
    # Everyone who approved a request that needed several approvals, first approver first.
    approvers: tuple[str, ...] = ()
    # Who may answer in words, as ``PendingRequest.phrase``.
    phrase: str = ""


class RunInspection(msgspec.Struct, frozen=True):
    """Everything a run's page shows: the run, one page of its journal (the whole journal
    when ``length`` is None), its audit and its requests."""

    view: RunView
    journal: list[JournalRecord]
    audit: list[AuditRecord]
    requests: list[RequestView]
    length: int | None = None  # entries in the whole journal


class RunMark(msgspec.Struct, frozen=True):
    """What a live page compares to tell whether its run changed, read without its journal:
    the run's row, how many entries its journal holds, its latest audited fact."""

    record: RunRecord
    length: int
    last_audit: AuditRecord | None


class Decided(msgspec.Struct, frozen=True):
    """What became of a decision: whether it counted, why, and the run it resumed, if any."""

    accepted: bool
    message: str
    resumed: LiveRun | None = None


class RunReads:
    """A run's page read from the store alone: its record, a page of its journal, its audit
    and its requests, each with who may answer it (``who_may_answer``, and in words
    ``phrase_of``). Needs no model, no tool and no write: ``kestrel runs export`` reads through
    it with nothing else open."""

    def __init__(
        self,
        store: ReadStore,
        who_may_answer: Callable[[Request], tuple[str, ...]],
        phrase_of: Callable[[Request], str],
    ) -> None:
        self._store = store
        self._who_may_answer = who_may_answer
        self._phrase_of = phrase_of

    @functools.cached_property
    def _summaries(self) -> RunSummaries:
        """The pages' reader, made at the first page read: a command that only decides reads
        none, and need not import it."""
        from bot.chat.run_summary import RunSummaries

        return RunSummaries(self._store)

    async def inspect(
        self, run_id: str, *, before: int | None = None, size: int | None = None
    ) -> RunInspection:
        """A run's record, one page of its journal (the ``size`` entries before ``before``, a
        page's worth without ``size``; the newest without ``before``), its audit and its
        requests (``UnknownRun`` for an unknown id). The whole journal is never loaded: see
        ``bot.chat.run_summary``."""
        store = self._store
        record = await store.get_run(run_id)
        length = await store.journal_length(run_id)
        page = await self._summaries.page(record, length, before=before, size=size)
        audit = await store.list_audit(run_id, limit=1000)
        found = await store.list_requests(run_id=run_id, status=None)
        # Why the model asked is known for the current batch's requests (earlier: "").
        requests = [await self.approved(self.view(*row, page.state)) for row in found]
        closed = _closed_ids(found)
        view = RunView(record, page.state, closed)
        return RunInspection(view, page.records, audit, requests, length)

    async def entries(self, run_id: str, start: int, stop: int) -> list[JournalRecord]:
        """A run's journal entries with ``start <= seq < stop`` (``UnknownRun``)."""
        return await self._store.load_range(run_id, start, stop)

    def view(
        self, request: Request, status: RequestStatus, decision: Decision | None, state: RunState
    ) -> RequestView:
        """A request of the run ``state`` folds, as a card shows it."""
        if status is RequestStatus.OPEN and state.result is not None:
            # Left open by a cancel that ended its run and died before closing it: nothing
            # waits on it, and a click on it is refused (``Decisions``), so no card offers it.
            status = RequestStatus.CANCELLED
        return self.shown(request, status, decision, state.reason_for(request.call_id))

    def shown(
        self, request: Request, status: RequestStatus, decision: Decision | None, reason: str
    ) -> RequestView:
        """A request as a card shows it, why the model asked being known."""
        who = self._who_may_answer(request)
        phrase = self._phrase_of(request)
        return RequestView(request, status, decision, who, reason, phrase=phrase)

    async def approved(self, view: RequestView) -> RequestView:
        """``view`` with everyone who approved it, when it was approved by several: its
        decision names only the last of them (the store is read for these alone)."""
        if not approved_by_several(view.request, view.status, view.decision):
            return view
        approvers = tuple(await self._store.approvers(view.request.id))
        return replace(view, approvers=approvers)


async def pending_requests(
    requests: Requests, policy: Policy, flags_of: Callable[[str], ToolFlags | None]
) -> list[PendingRequest]:
    """Every open request in the store, oldest first, with who may answer it; not one left
    open on a run that ended (by a cancel killed before it closed it: nothing waits on it).

    A function of its own so that read-only commands can list them without a runtime.
    """
    pending = []
    # In the same read: one per run made the Home tab, /pending and the web page read as
    # many runs as there are open requests.
    for request, _status, _decision in await requests.list_requests(unfinished_runs=True):
        flags = flags_of(request.tool)
        who = policy.who_may_answer(request, flags, flags_of)
        phrase = policy.may_answer_phrase(request, flags, flags_of)
        pending.append(PendingRequest(request, tuple(who), policy.answer_note(request), phrase))
    return pending


class ChatService:
    """Submit turns, decide requests, cancel, resume, and read runs, as a given person."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor
        # The runtime typed as what this service uses of it: only the store roles it needs.
        self._rt: ChatRuntime = supervisor.rt
        self._reads = RunReads(self._rt.store, self._who_may_answer, self._may_answer_phrase)
        self.duplicates_dropped = 0
        # Whether another replica goes on with a run this one hands back (PostgreSQL), or a
        # restart does (SQLite): what a thread paused by a stop is told.
        self.shared = self._rt.shared
        # Each refusal audited is said at info too, bounded: the operator's log shows it.
        self.refusals = RefusalLog(self._rt.clock, self._rt.redact)
        # Why the model asked, by request: it never changes, so a card refreshed after a
        # decision needs no journal read (oldest forgotten first).
        self._reasons: dict[str, str] = {}

    @functools.cached_property
    def inbound(self) -> Inbound:
        """Chat deliveries taken into the store, built the first time one comes (a command at
        the terminal takes none, and need not import them)."""
        from bot.chat.inbound import Inbound

        return Inbound(self._supervisor)

    def subscribe(self, sink: EventSink) -> None:
        """Receive every event of every run this process drives."""
        self._rt.events.add(sink)

    async def submit_turn(
        self,
        text: str,
        *,
        user: Actor,
        session: Session | None = None,
        prompter: Prompter | None = None,
        run_id: str = "",
        alone: bool = False,
    ) -> RunHandle:
        """Start a run for one message in a session (a thread; None: a new one of its own);
        it runs in the background (as ``run_id``, when the delivery reserved one). ``alone``:
        only if no other run of the session is unfinished (``begun`` tells)."""
        place = session.place if session is not None else None
        refusal = await self._rt.policy.place_refusal(user, place, "this thread")
        if refusal is None and not await self._rt.policy.may_start(user, place):
            refusal = self._rt.policy.start_refusal(user)
        if refusal is not None:
            await self._rt.store.audit(user.user, AuditAction.START_REFUSED, detail=refusal.audited)
            self.refusals.refused(user.user, "start", user.place or place, refusal.reason)
            raise NotPermitted(refusal.reason)
        return await self._supervisor.start_turn(
            text,
            session=session,
            requested_by=user.user,
            prompter=prompter,
            run_id=run_id,
            alone=alone,
        )

    async def begun(self, run: RunHandle) -> bool:
        """Wait until a run this service just started exists; False if it never will (an
        ``alone`` run whose thread had another unfinished run; ``run.error`` says why)."""
        return await self._supervisor.begun(cast("LiveRun", run))

    async def decide(
        self,
        run_id: str,
        request_id: str,
        kind: DecisionKind,
        *,
        user: Actor,
        text: str = "",
        digest: str = "",
        card: str | None = None,
    ) -> Decided:
        """Answer a request as ``user`` (checked against the store and policy); once the run
        waits on nothing more, it resumes in this process. ``card``: the platform's id of the
        message clicked, which must be the request's own card."""
        REQUEST_ID.set(request_id)  # this task's log lines name the request
        off_card = await self._off_card(user, kind, run_id, request_id, card)
        if off_card:
            return Decided(False, off_card.reason)
        decision = Decision(request_id=request_id, kind=kind, text=text, by=user.user)
        answered = await self._supervisor.answer(decision, run_id=run_id, actor=user, digest=digest)
        if not answered.accepted:  # refused (and audited) by the decisions' checks
            self._said_refused(user, kind.value, answered.message, run_id, request_id)
        if not answered.accepted or not answered.ready:
            return Decided(answered.accepted, answered.message)
        from bot.errors import ResumeRefused, UnreadableJournal

        try:
            live = await self._supervisor.resume(run_id, claimed=answered.claimed, by=user.user)
        except (ResumeRefused, UnreadableJournal) as exc:
            # The decision stands: the run is live elsewhere (its task goes on with the answer
            # once it suspends), needs someone to resume it with --force, or waits for its
            # journal to be repaired.
            return Decided(True, f"{answered.message}; not resumed here: {exc}")
        return Decided(True, answered.message, live)

    async def check(
        self,
        request_id: str,
        kind: DecisionKind,
        *,
        user: Actor,
        text: str | None = None,
        asked: bool = False,
        card: str | None = None,
    ) -> Refusal | None:
        """Why ``user`` may not decide ``kind`` (with ``text``, when given) on the request now
        (None: they may), before asking them for more (a reason); decides nothing. ``asked``:
        the person asked for it (a Deny or Answer form), so a refusal is audited as the
        decision's would be; a look at whether a reply is an answer is not. ``card``: the
        platform's id of the message clicked, which must be the request's own card, as the
        decision will check (a form opened elsewhere would take words only to refuse them)."""
        found = await self.request(request_id)
        if found is None:
            return Refusal(f"there is no request {request_id}")
        run_id = found.request.run_id
        # Asked from another place: refused and audited, as a decision from there would be.
        misplaced = await self._misplaced(user, run_id, kind.value, request_id)
        if misplaced:
            return misplaced
        off_card = await self._off_card(user, kind, run_id, request_id, card)
        if off_card:
            return off_card
        if text is None and kind is DecisionKind.ANSWER and found.request.options:
            text = found.request.options[0]  # the person, not the answer, is checked here
        decision = Decision(request_id=request_id, kind=kind, by=user.user, text=text or "")
        decisions = self._supervisor.decisions
        refusal = await decisions.refusal(decision, run_id=run_id, actor=user)
        if refusal is not None and asked:
            audited = decisions.audited_refusal(refusal, decision)
            action = AuditAction.refused(kind.value)
            await self._refused(user, action, kind.value, refusal, run_id, request_id, audited)
        return refusal

    async def run_of_request(self, request_id: str) -> str | None:
        """The run a request belongs to (None: no such request), from its row alone."""
        try:
            request, _, _ = await self._rt.store.get_request(request_id)
        except KeyError:
            return None
        return request.run_id

    async def request(self, request_id: str, *, user: Actor | None = None) -> RequestView | None:
        """A request with its status, decision, who may answer it and why it was asked;
        with ``user``, only when they act from its run's place (else None, audited)."""
        try:
            found = await self._rt.store.get_request(request_id)
        except KeyError:
            return None
        run_id = found[0].run_id
        if user is not None and await self._misplaced(user, run_id, "show", request_id):
            return None
        reason = self._reasons.get(request_id)
        if reason is not None:  # why the model asked never changes: no journal to read
            if found[1] is RequestStatus.OPEN and await self.ended(run_id):
                found = (found[0], RequestStatus.CANCELLED, found[2])  # see ``RunReads.view``
            return await self._reads.approved(self._reads.shown(*found, reason))
        view = self._reads.view(*found, fold(await self._rt.store.load(run_id), run_id))
        self._remember(request_id, view.reason)  # from the whole journal: final
        return await self._reads.approved(view)

    async def requests_of(self, run_id: str) -> list[RequestView]:
        """Every request a run made, open or closed, oldest first."""
        found = await self._rt.store.list_requests(run_id=run_id, status=None)
        if not found:
            return []
        state = fold(await self._rt.store.load(run_id), run_id)
        return [await self._reads.approved(self._reads.view(*row, state)) for row in found]

    def _who_may_answer(self, request: Request) -> tuple[str, ...]:
        # The policy and tool set of now: both may be replaced while the service lives.
        flags_of = self._rt.tools.current().flags_of
        return tuple(self._rt.policy.who_may_answer(request, flags_of(request.tool), flags_of))

    def _may_answer_phrase(self, request: Request) -> str:
        flags_of = self._rt.tools.current().flags_of
        return self._rt.policy.may_answer_phrase(request, flags_of(request.tool), flags_of)

    def _remember(self, request_id: str, reason: str) -> None:
        self._reasons[request_id] = reason
        while len(self._reasons) > REASONS_KEPT:
            del self._reasons[next(iter(self._reasons))]

    async def inspect(
        self, run_id: str, *, before: int | None = None, size: int | None = None
    ) -> RunInspection:
        """A run's page as ``RunReads.inspect`` reads it (``UnknownRun``)."""
        return await self._reads.inspect(run_id, before=before, size=size)

    async def entries(self, run_id: str, start: int, stop: int) -> list[JournalRecord]:
        """A run's journal entries with ``start <= seq < stop`` (``UnknownRun``)."""
        return await self._reads.entries(run_id, start, stop)

    async def mark(self, run_id: str) -> RunMark:
        """What a live page compares (``UnknownRun`` for an unknown id): three indexed reads."""
        store = self._rt.store
        record = await store.get_run(run_id)
        length = await store.journal_length(run_id)
        audit = await store.list_audit(run_id, limit=1)
        return RunMark(record, length, audit[-1] if audit else None)

    async def record_and_session(self, run_id: str) -> tuple[RunRecord, Session | None]:
        """A run's row and the session (thread) it belongs to, read without its journal
        (``UnknownRun`` for an unknown id)."""
        record = await self._rt.store.get_run(run_id)
        return record, await self._rt.store.get_session(record.session_id)

    async def feedback(self, run_id: str, *, positive: bool, user: Actor) -> None:
        """Record a person's 👍 or 👎 on a run's answer (audited), from the run's place only
        (``NotPermitted`` otherwise)."""
        refusal = await self._misplaced(user, run_id, "feedback")  # UnknownRun if made up
        if refusal:
            raise NotPermitted(refusal.reason)
        verdict = AuditAction.FEEDBACK_POSITIVE if positive else AuditAction.FEEDBACK_NEGATIVE
        await self._rt.store.audit(user.user, verdict, run_id=run_id)

    async def accept_delivery(self, key: str, platform: str, delivery: Delivery) -> Accepted | None:
        """Hold an inbound chat delivery in the store before it is acknowledged (``Inbound``);
        None for a repeat, which is counted and should be dropped."""
        accepted = await self.inbound.accept(key, platform, delivery)
        if accepted is None:
            self.duplicates_dropped += 1
        return accepted

    async def pass_over(self, key: str) -> bool:
        """Mark inbound delivery ``key`` seen without handling it (found too late to act on);
        True only for the first to mark it: nobody accepted it, nor passed it over, before."""
        return await self.inbound.pass_over(key)

    async def sessions_on(self, platform: str, limit: int) -> list[Session]:
        """The platform's newest ``limit`` sessions, newest first (where it reads back)."""
        return await self._rt.store.sessions_on(platform, limit)

    async def first_interaction(self, key: str) -> bool:
        """Whether this replica is the first to take interaction ``key`` (a platform that sends
        each interaction to every connected replica); a repeat is counted and should be dropped."""
        first = await self._rt.store.mark_once(key)
        if not first:
            self.duplicates_dropped += 1
        return first

    async def first_to_say(self, key: str) -> bool:
        """Whether this process is the first, of any replica and since any restart, to say what
        ``key`` names (a card that never reached its thread): True once."""
        return await self._rt.store.mark_once(key)

    async def cancel(self, run_id: str, *, user: Actor) -> str:
        """Cancel a run (its requester or on-call may, from its place); what happened, in a
        sentence."""
        try:
            refusal = await self._misplaced(user, run_id, "cancel")
            if refusal:
                raise NotPermitted(refusal.reason)
            try:
                return await self._supervisor.cancel(run_id, actor=user)
            except NotPermitted as exc:  # audited by the cancel
                self._said_refused(user, "cancel", str(exc), run_id)
                await self._unseen(user, run_id)
                raise
        except StoreError as exc:
            if not unanswered(exc):
                raise  # what the store answered: no such run, a journal it cannot read
            # Said wherever it is shown (the console, the terminal); a chat thread shows the
            # plain part alone (``store_note``): the store's error names its host. Imported
            # here: the chat's words (and ``dataclasses``) would cost every command's start.
            from bot.chat.words import cancel_not_counted

            raise StoreError(f"{exc}. {cancel_not_counted(run_id)}") from exc

    async def resume(
        self,
        run_id: str,
        *,
        user: Actor,
        force: bool = False,
        prompter: Prompter | None = None,
    ) -> RunHandle | None:
        """Continue a suspended run (its requester or on-call may, from its place); None if it
        still waits."""
        record = await self._rt.store.get_run(run_id)
        misplaced = await self._misplaced(user, run_id, "resume")
        if misplaced:
            raise NotPermitted(misplaced.reason)
        run = await self._place(run_id) if user.place is not None else None
        policy = self._rt.policy
        refusal = await policy.check_operate(user, "resume", run_id, record.requested_by, run)
        if refusal:
            await self._refused(user, AuditAction.RESUME_REFUSED, "resume", refusal, run_id)
            await self._unseen(user, run_id, run)
            raise NotPermitted(refusal.reason)
        claimed = await self._supervisor.expire_overdue(run_id)
        return await self._supervisor.resume(
            run_id, claimed=claimed, prompter=prompter, force=force, by=user.user
        )

    async def wait(self, run: RunHandle) -> RunResult:
        """Wait until a run this process drives suspends or ends."""
        # Every handle this service hands out is the supervisor's own.
        return await self._supervisor.wait(cast("LiveRun", run))

    def interrupt(self, run: RunHandle) -> None:
        """Stop a run this process drives now (Ctrl-C): it suspends at once, its journal whole."""
        cast("LiveRun", run).signals.interrupt.request()

    async def status(self, run_id: str, *, user: Actor | None = None) -> RunView:
        """One run as its journal tells it; with ``user``, only if they may see it (else
        ``UnknownRun``, as for a run that does not exist: a read tells nothing of others)."""
        record = await self._rt.store.get_run(run_id)
        if user is not None and not await self._rt.policy.may_see(user, await self._place(run_id)):
            # Audited as a refused cancel or Full arguments is: a stranger reading runs by id
            # from elsewhere leaves a trace, with where they read from.
            refusal = Refusal(f"{user.user} may not see run {run_id}", acted_from(user.place))
            await self._refused(user, AuditAction.SHOW_REFUSED, "show", refusal, run_id)
            raise UnknownRun(run_id)
        state = fold(await self._rt.store.load(run_id), run_id)
        if not state.open_requests:
            return RunView(record, state)
        found = await self._rt.store.list_requests(run_id=run_id, status=None)
        closed = _closed_ids(found)
        return RunView(record, state, closed)

    async def refuse_unseen(self, verb: str, run_id: str, *, user: Actor) -> None:
        """Audit ``verb`` (status, cancel, resume) of a run that ``user`` named where it is
        never shown (another platform's, another Discord server's): refused as one they may
        not see, or one acted on from elsewhere, is, with where they asked from. Nothing for
        a run that does not exist; the adapter says ``words.unseen_run`` either way."""
        try:
            place = await self._place(run_id)
        except UnknownRun:
            return  # made up: nobody's run to keep a trace on
        what = f"run {run_id}"
        # Naming such a run decides nothing and shows nothing, wherever it came from.
        seen = Refusal(f"{user.user} may not see {what}", acted_from(user.place))
        if verb == "status":
            await self._refused(user, AuditAction.SHOW_REFUSED, "show", seen, run_id)
            return
        refusal = await self._rt.policy.place_refusal(user, place, what) or seen
        await self._refused(user, AuditAction.refused(verb), verb, refusal, run_id)

    async def latest(self, session: Session) -> RunView | None:
        """The newest run of a session (a thread), if it has one."""
        records = await self._rt.store.list_runs(limit=1, session_id=session.id)
        return await self.status(records[0].id) if records else None

    async def unfinished(self, session: Session, look_back: int = 20) -> RunRecord | None:
        """The newest run of a session (a thread) that is still running or suspended, among
        its last ``look_back``; None if all of those ended."""
        records = await self._rt.store.list_runs(limit=look_back, session_id=session.id)
        return next((r for r in records if r.status not in TERMINAL_STATUSES), None)

    async def recent(self, limit: int = 10) -> list[RunRecord]:
        """The newest runs, newest first."""
        return await self._rt.store.list_runs(limit=limit)

    async def pending(self, *, user: Actor | None = None) -> list[PendingRequest]:
        """Every open request, oldest first, with who may answer it; with ``user``, only those
        of runs they may see (on their platform, in a channel they see, or as on-call)."""
        flags_of = self._rt.tools.current().flags_of
        pending = await pending_requests(self._rt.store, self._rt.policy, flags_of)
        if user is None:
            return pending
        places: dict[str, bool] = {}
        for item in pending:
            run_id = item.request.run_id
            if run_id not in places:
                places[run_id] = await self._rt.policy.may_see(user, await self._place(run_id))
        return [item for item in pending if places[item.request.run_id]]

    async def place_of(self, run_id: str) -> Place:
        """Where a run lives (``UnknownRun`` for an unknown id)."""
        return await self._place(run_id)

    async def _place(self, run_id: str) -> Place:
        return await self._supervisor.decisions.place_of(run_id)

    async def _misplaced(
        self, user: Actor, run_id: str, verb: str, request_id: str = ""
    ) -> Refusal | None:
        """Why ``user`` may not act on the run from where they are (audited); None if they
        may: on a request (``request_id``), from its run's thread, where its card is; on the
        run, from its channel too (a slash command names no thread). ``UnknownRun`` for an
        unknown id, and for a run acted on from elsewhere by someone who may not see it
        (``status`` says as much: a refusal tells nothing of others)."""
        if user.place is None:
            await self._rt.store.get_run(run_id)
            return None
        what = f"request {request_id}" if request_id else f"run {run_id}"
        place = await self._place(run_id)
        policy = self._rt.policy
        refusal = await policy.place_refusal(user, place, what, thread=bool(request_id))
        if refusal:
            await self._refused(user, AuditAction.refused(verb), verb, refusal, run_id, request_id)
            if not request_id:
                await self._unseen(user, run_id, place)
        return refusal

    async def _refused(
        self,
        user: Actor,
        action: AuditAction,
        verb: str,
        refusal: Refusal,
        run_id: str,
        request_id: str = "",
        audited: str | None = None,
    ) -> None:
        """A refusal audited as ``action`` (``audited``: its text there, by default the
        refusal's own) and said in the operator's log too."""
        text = refusal.audited if audited is None else audited
        await self._rt.store.audit(user.user, action, run_id, request_id, text)
        self._said_refused(user, verb, refusal.reason, run_id, request_id)

    def _said_refused(
        self, user: Actor, verb: str, reason: str, run_id: str, request_id: str = ""
    ) -> None:
        """A refusal audited, said in the operator's log too (bounded: ``RefusalLog``)."""
        self.refusals.refused(
            user.user, verb, user.place, reason, run_id=run_id, request_id=request_id
        )

    async def _unseen(self, user: Actor, run_id: str, place: Place | None = None) -> None:
        """``UnknownRun`` when ``user`` may not see the run they were refused (``status`` says
        as much): from a Discord channel outside the run's private thread, a refusal naming
        its requester and on-call told a stranger the run exists and who asked for it."""
        if user.place is None:
            return
        if not await self._rt.policy.may_see(user, place or await self._place(run_id)):
            raise UnknownRun(run_id)

    async def _off_card(
        self, user: Actor, kind: DecisionKind, run_id: str, request_id: str, card: str | None
    ) -> Refusal | None:
        """Why a click on message ``card`` does not count for the request (audited): it is
        not the request's own card; None when it is, or when no message was clicked (a reply)."""
        if card is None or await self._shows(user, card_key(request_id), card):
            return None
        # Audited with where the click came from, as a refusal of its place is: a click off
        # the card may come from anywhere.
        refusal = Refusal("this button is not on that request's card", acted_from(user.place))
        action = AuditAction.refused(kind.value)
        await self._refused(user, action, kind.value, refusal, run_id, request_id)
        return refusal

    async def _shows(self, user: Actor, key: str, ref: str) -> bool:
        """Whether the platform message ``ref`` may be the one the outbox shows under ``key``:
        it is, or the card was posted by a replica that died before it recorded which message
        it is (the place check still holds, and a later delivery records it)."""
        if user.place is None:
            return False
        shown = await self._rt.store.get_message(f"{user.place.platform}:{key}")
        return shown is not None and shown.ref in ("", ref)

    async def ended(self, run_id: str) -> bool:
        """Whether the run has a terminal result."""
        return await self.ended_as(run_id) is not None

    async def ended_as(self, run_id: str) -> RunStatus | None:
        """How the run ended (completed, failed, cancelled); None while it has not."""
        record = await self._rt.store.get_run(run_id)
        return record.status if record.status in TERMINAL_STATUSES else None
