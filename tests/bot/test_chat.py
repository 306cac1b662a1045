"""The chat-facing service: who may do what is decided inside it, from the store and policy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from bot.chat.conversation import Conversation
from bot.chat.outbox import Deliveries, DeliveryFailed
from bot.chat.service import ChatService, RequestView
from bot.chat.threads import PLACES_KEPT, RunPlace, StepStatus, ThreadRenderer
from bot.domain import (
    DecisionKind,
    RequestKind,
    RequestStatus,
    RunStatus,
    Session,
    TerminalResult,
    new_id,
)
from bot.people.policy import Actor, NotPermitted, Policy, PolicyRules
from bot.prompter import DeferringPrompter
from bot.run.supervisor import Supervisor
from bot.tools.command import CommandTool
from storage.sql_store import SqlStore
from tests.fakes.runtime import (
    Counter,
    ScriptedPrompter,
    call,
    counting_tools,
    make_runtime,
    reply,
)

POLICY = PolicyRules(
    requesters=["U0REQ", "group:S0DEV"],
    approvers={"deploy": ["U0BOSS"]},
    oncall=["group:S0SRE"],
)


@pytest.fixture
async def chat(tmp_path: Path) -> AsyncIterator[tuple[ChatService, Counter]]:
    counter = Counter()
    replies = [reply(call("deploy", text="v2"), text="deploying"), reply(text="done")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, counting_tools(counter))
    rt.policy = Policy(POLICY)
    yield ChatService(Supervisor(rt)), counter
    await rt.store.close()


async def suspended_on_approval(service: ChatService, session: Session) -> tuple[str, str]:
    live = await service.submit_turn(
        "ship it", user=Actor("U0REQ"), session=session, prompter=DeferringPrompter()
    )
    state = await service.wait(live)
    (request,) = state.open_requests
    assert request.kind is RequestKind.WAIT_APPROVAL
    return live.run_id, request.id


def thread() -> Session:
    return Session(id=new_id("ses"), platform="test", channel="C1", thread="1700000000.1")


async def test_only_requesters_may_start_a_run(chat: tuple[ChatService, Counter]) -> None:
    service, _ = chat
    with pytest.raises(NotPermitted, match="U0NEW may not start runs"):
        await service.submit_turn("hi", user=Actor("U0NEW"), session=thread())
    live = await service.submit_turn(
        "hi", user=Actor("U0NEW", groups=frozenset({"S0DEV"})), session=thread()
    )
    assert live.run_id


async def test_a_decision_is_checked_against_the_store_and_policy(
    chat: tuple[ChatService, Counter],
) -> None:
    service, counter = chat
    run_id, request_id = await suspended_on_approval(service, thread())

    mine = await service.decide(run_id, request_id, DecisionKind.APPROVE, user=Actor("U0REQ"))
    stranger = await service.decide(run_id, request_id, DecisionKind.APPROVE, user=Actor("U0X"))
    stale = await service.decide(
        run_id, request_id, DecisionKind.APPROVE, user=Actor("U0BOSS"), digest="0" * 16
    )
    assert not mine.accepted and "someone else must approve" in mine.message
    assert not stranger.accepted and "may not approve deploy" in stranger.message
    assert not stale.accepted and "stale" in stale.message
    assert counter.calls == {}

    approved = await service.decide(run_id, request_id, DecisionKind.APPROVE, user=Actor("U0BOSS"))
    assert approved.accepted and approved.resumed is not None
    await service.wait(approved.resumed)
    again = await service.decide(run_id, request_id, DecisionKind.APPROVE, user=Actor("U0BOSS"))
    assert not again.accepted and "already answered" in again.message
    assert counter.calls == {"deploy": 1}
    assert (await service.status(run_id)).record.status is RunStatus.COMPLETED


async def test_cancel_and_resume_are_for_the_requester_or_on_call(
    chat: tuple[ChatService, Counter],
) -> None:
    service, _ = chat
    run_id, _ = await suspended_on_approval(service, thread())

    for act in (service.cancel, service.resume):
        with pytest.raises(NotPermitted, match="only its requester"):
            await act(run_id, user=Actor("U0X"))
    assert await service.resume(run_id, user=Actor("U0REQ")) is None  # still waits
    sre = Actor("U0Y", groups=frozenset({"S0SRE"}))
    assert await service.cancel(run_id, user=sre) == "cancelled"
    assert (await service.status(run_id)).record.status is RunStatus.CANCELLED


async def test_status_and_pending_say_what_a_thread_waits_on(
    chat: tuple[ChatService, Counter],
) -> None:
    service, _ = chat
    session = thread()
    run_id, request_id = await suspended_on_approval(service, session)

    view = await service.latest(session)
    pending = await service.pending()

    assert view is not None and view.record.id == run_id
    assert [r.id for r in view.open_requests] == [request_id]
    assert view.budgets_used["iterations"] == (1, 20)
    assert view.budgets_used["tool_calls"] == (0, 50)
    assert [(p.request.id, p.may_answer) for p in pending] == [(request_id, ("U0BOSS",))]


async def test_an_inline_answer_counts_only_if_the_policy_allows_it(
    chat: tuple[ChatService, Counter],
) -> None:
    service, counter = chat
    stranger = ScriptedPrompter([DecisionKind.APPROVE], by="U0X")

    live = await service.submit_turn("ship it", user=Actor("U0REQ"), prompter=stranger)
    state = await service.wait(live)

    assert counter.calls == {}
    assert [r.kind for r in state.open_requests] == [RequestKind.WAIT_APPROVAL]
    assert stranger.asked, "the person at the terminal was asked"
    entries = await service._rt.store.list_audit(run_id=live.run_id)
    assert [(e.actor, e.action) for e in entries if e.action == "refused"] == [("U0X", "refused")]


async def test_an_inline_approval_by_the_requester_at_the_terminal_counts(
    chat: tuple[ChatService, Counter], tmp_path: Path
) -> None:
    service, counter = chat
    service._supervisor.rt.policy = Policy(PolicyRules(approvers={"deploy": ["U0REQ"]}))
    own = ScriptedPrompter([DecisionKind.APPROVE], by="U0REQ")

    live = await service.submit_turn("ship it", user=Actor("U0REQ"), prompter=own)
    state = await service.wait(live)

    assert counter.calls == {"deploy": 1}
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    entries = await service._rt.store.list_audit(run_id=live.run_id)
    approvals = [(e.actor, e.detail.endswith("(inline)")) for e in entries if e.action == "approve"]
    assert approvals == [("U0REQ", True)]


async def test_a_click_reads_the_run_journal_once(chat: tuple[ChatService, Counter]) -> None:
    """A click (the request's run looked up, the decision, the resume, the decided card
    refreshed as the renderer does) reads the whole journal once: the resume's read.
    Counted by the SQLite store's own ``loads`` counter."""
    service, counter = chat
    run_id, request_id = await suspended_on_approval(service, thread())
    shown = await service.request(request_id)  # the card shown when the request opened
    store = service._rt.store
    assert isinstance(store, SqlStore)
    before = store.loads

    outcome = await Conversation(service).decide(request_id, DecisionKind.APPROVE, Actor("U0BOSS"))
    assert outcome.running == run_id
    refreshed = await service.request(request_id)
    await service.wait(service._supervisor.live[run_id])

    assert store.loads - before == 1
    assert counter.calls == {"deploy": 1}
    assert shown is not None and refreshed is not None
    assert refreshed.status is RequestStatus.ANSWERED and refreshed.reason == shown.reason


class _Target:
    def as_json(self) -> dict[str, Any]:
        return {"channel": "C1"}


class _Look:
    """A look for platform ``test`` that only says where a session's messages go."""

    platform = "test"

    def target(self, session: Session) -> _Target | None:
        return _Target() if session.platform == self.platform else None

    def card(self, view: RequestView) -> dict[str, Any]:
        raise AssertionError("no card is drawn")

    def answer(self, result: TerminalResult, run_id: str, at: datetime) -> list[dict[str, Any]]:
        raise AssertionError("no answer is drawn")

    def reminder(self, view: RequestView) -> dict[str, Any]:
        raise AssertionError("no reminder is drawn")


class _Silent:
    def follow(self, run_id: str, place: RunPlace) -> None: ...

    async def working(self, place: RunPlace, status: str = "") -> None: ...

    async def step(self, run_id: str, call_id: str, title: str, status: StepStatus) -> None: ...

    async def stop(self, run_id: str, note: str = "") -> None: ...


class _Steps(_Silent):
    """Progress that keeps each call's latest step."""

    def __init__(self) -> None:
        self.shown: dict[str, StepStatus] = {}

    async def step(self, run_id: str, call_id: str, title: str, status: StepStatus) -> None:
        self.shown[call_id] = status


class _NoTransport:
    platform = "test"

    async def post(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str:
        raise AssertionError("nothing is posted")

    async def update(self, ref: str, target: dict[str, Any], body: dict[str, Any]) -> None:
        raise AssertionError("nothing is edited")

    async def find(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str | None:
        raise AssertionError("nothing is looked for")


async def test_a_renderer_finds_a_run_s_place_without_reading_its_journal(
    chat: tuple[ChatService, Counter],
) -> None:
    """A run this renderer did not start (another replica's) is placed from its row: who
    asked, where its thread is; its journal is not loaded (``SqlStore.loads``)."""
    service, _ = chat
    run_id, _request_id = await suspended_on_approval(service, thread())
    store = service._supervisor.rt.store
    assert isinstance(store, SqlStore)
    deliveries = Deliveries(store, _NoTransport(), "test-owner")
    renderer = ThreadRenderer(service, deliveries, _Look(), _Silent())
    before = store.loads

    place = await renderer.place_of(run_id)

    assert place is not None and place.requested_by == "U0REQ"
    assert place.session.channel == "C1"
    assert store.loads == before
    assert await renderer.place_of("run_made_up") is None


async def test_the_places_a_renderer_keeps_are_bounded(chat: tuple[ChatService, Counter]) -> None:
    # Every run of another platform was remembered as None, and never forgotten: a replica
    # serving two platforms grew by one entry per run of the other for as long as it lived.
    service, _ = chat
    run_id, _request_id = await suspended_on_approval(service, thread())
    store = service._supervisor.rt.store
    renderer = ThreadRenderer(service, Deliveries(store, _NoTransport(), "o"), _Look(), _Silent())
    other = Session(id="ses_console", platform="console")
    assert await renderer.place_of(run_id) is not None

    for n in range(3 * PLACES_KEPT):
        assert renderer.expect(f"run_other_{n}", other, "U0REQ") is None
        if n % 100 == 0:
            assert await renderer.place_of(run_id) is not None  # in use: kept

    assert len(renderer._places) == PLACES_KEPT
    assert run_id in renderer._places
    assert "run_other_0" not in renderer._places  # the least recently used went first
    assert renderer.expect("run_other_0", other, "U0REQ") is None


async def test_a_call_that_failed_shows_as_failed_in_the_thread_s_progress(tmp_path: Path) -> None:
    missing = CommandTool("probe", "Probe", ["/nonexistent/prog"])
    replies = [reply(call("probe"), call("echo", text="hi")), reply(text="done")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, [missing, *counting_tools(Counter())])
    service = ChatService(Supervisor(rt))
    steps = _Steps()
    deliveries = Deliveries(rt.store, _NoTransport(), "test-owner")
    renderer = ThreadRenderer(service, deliveries, _Look(), steps)
    rt.events.add(renderer)

    live = await service.submit_turn("probe", user=Actor("U0REQ"), session=thread())
    await service.wait(live)
    await renderer.idle()
    await rt.store.close()

    assert steps.shown == {"call_1": "error", "call_2": "complete"}


async def test_a_request_left_open_by_a_cut_short_cancel_shows_closed_and_takes_no_click(
    chat: tuple[ChatService, Counter], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, counter = chat
    run_id, request_id = await suspended_on_approval(service, thread())
    decisions = service._supervisor.decisions

    async def killed(_run_id: str, _by: str) -> None:
        raise SystemExit  # the process dies after the run's end, before closing its requests

    monkeypatch.setattr(decisions, "close_requests", killed)
    sre = Actor("U0Y", groups=frozenset({"S0SRE"}))
    with pytest.raises(SystemExit):
        await service.cancel(run_id, user=sre)
    monkeypatch.undo()
    assert (await service.status(run_id)).record.status is RunStatus.CANCELLED

    # The card a renderer draws once the run ended, the Home tab, and a click on the card.
    shown = await service.request(request_id)
    drawn = await service.requests_of(run_id)
    assert shown is not None and shown.status is not RequestStatus.OPEN
    assert [view.status for view in drawn] == [shown.status]
    assert await service.pending() == []
    clicked = await service.decide(run_id, request_id, DecisionKind.APPROVE, user=Actor("U0BOSS"))
    assert not clicked.accepted and "cancelled" in clicked.message, clicked.message
    assert (await service._rt.store.get_request(request_id))[1] is RequestStatus.CANCELLED
    assert counter.calls == {}


async def test_a_thread_command_acts_on_the_thread_s_unfinished_run_not_its_newest(
    chat: tuple[ChatService, Counter],
) -> None:
    # A thread a store written before runs were created alone left with two runs: the older
    # still suspended, the newer ended. A mention is refused for the older ("cancel it
    # first"), so the thread's cancel must reach it, or the thread never starts a run again.
    service, _counter = chat
    session = thread()
    older, _request_id = await suspended_on_approval(service, session)
    newer, _ = await suspended_on_approval(service, session)
    await service.cancel(newer, user=Actor("U0REQ"))
    talk = Conversation(service)

    refused = await talk.mention(session, Actor("U0REQ"), "do more")
    assert refused.note is not None and "still going in this thread (suspended)" in refused.note
    status = await talk.mention(session, Actor("U0REQ"), "status")
    assert status.status is not None and status.status.record.id == older
    await talk.mention(session, Actor("U0REQ"), "cancel")
    assert (await service.status(older)).record.status is RunStatus.CANCELLED


async def test_listing_the_open_requests_reads_no_run_per_request(
    chat: tuple[ChatService, Counter], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Home tab, /pending and the web page list every open request: leaving out those of
    # runs that ended is part of the one read, not a read of each request's run.
    service, _counter = chat
    for _ in range(3):
        await suspended_on_approval(service, thread())
    store = service._rt.store
    runs_read = 0
    get_run = store.get_run

    async def counted(run_id: str) -> Any:
        nonlocal runs_read
        runs_read += 1
        return await get_run(run_id)

    monkeypatch.setattr(store, "get_run", counted)
    assert len(await service.pending()) == 3
    assert runs_read == 0


async def test_a_click_that_lands_as_a_cancel_ends_the_run_is_refused(
    chat: tuple[ChatService, Counter], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cancel ends its run, then closes its requests: an approval checked just before the end
    # and written just after it found the request still open, was recorded on a run nothing
    # will resume, and its approver told it was recorded.
    service, counter = chat
    run_id, request_id = await suspended_on_approval(service, thread())
    decisions = service._supervisor.decisions
    store = service._rt.store
    write = store.decide_and_claim
    sre = Actor("U0Y", groups=frozenset({"S0SRE"}))

    async def killed(_run_id: str, _by: str) -> None:
        raise SystemExit  # the cancel's close comes after the click: it never came here

    async def cancelled_meanwhile(*args: Any, **kwargs: Any) -> Any:
        # Every check passed: the cancel ends the run just before the approval is written.
        monkeypatch.setattr(store, "decide_and_claim", write)
        monkeypatch.setattr(decisions, "close_requests", killed)
        with pytest.raises(SystemExit):
            await service.cancel(run_id, user=sre)
        return await write(*args, **kwargs)

    monkeypatch.setattr(store, "decide_and_claim", cancelled_meanwhile)
    clicked = await service.decide(run_id, request_id, DecisionKind.APPROVE, user=Actor("U0BOSS"))

    assert not clicked.accepted and "cancelled" in clicked.message, clicked.message
    assert (await service._rt.store.get_request(request_id))[1] is RequestStatus.CANCELLED
    assert counter.calls == {}


class _CardLook(_Look):
    """A look for platform ``test`` that draws a card as its request's id."""

    def card(self, view: RequestView) -> dict[str, Any]:
        return {"text": view.request.id}


class _NoAccess(_NoTransport):
    """A platform that refuses every post until a person lets Kestrel in."""

    async def post(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str:
        raise DeliveryFailed("test: no access", 3600.0)


async def test_a_card_filled_in_from_its_placeholder_and_refused_is_said_unshown(
    chat: tuple[ChatService, Counter], caplog: pytest.LogCaptureFixture
) -> None:
    # A request's opening owes its card; the worker filled the placeholder in before any
    # renderer put the card, so the placeholder's version counted as delivered, and the card,
    # refused ever after, was never said to be missing from its thread.
    service, _ = chat
    _run_id, request_id = await suspended_on_approval(service, thread())
    store = service._supervisor.rt.store
    deliveries = Deliveries(store, _NoAccess(), "test-owner")
    renderer = ThreadRenderer(service, deliveries, _CardLook(), _Silent())

    await deliveries.deliver_due()

    said = [
        r.getMessage() for r in caplog.records if "has not reached its thread" in r.getMessage()
    ]
    assert len(said) == 1 and f"request {request_id}" in said[0], said
    assert "no access" in (await renderer.cards_unshown([request_id]))[request_id]
