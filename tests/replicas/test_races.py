"""Races between replicas on one PostgreSQL database: two sweeps adopting the same orphan, an
approval and a cancel at once, a decision landing while a run is being adopted. Each replica is
a runtime of its own (its own store connections, owner and model) in this process; whichever
way a race goes, each effect runs at most once and nothing is left unowned."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import asyncpg
import pytest

from bot.chat.service import ChatService
from bot.domain import (
    AssistantTurn,
    DecisionKind,
    Request,
    RequestMaker,
    RunStatus,
    Session,
    ToolCall,
)
from bot.errors import CancelRefused
from bot.events import Event, RunSuspendedEvent
from bot.journal.entries import AssistantTurnEntry, RunStarted, ToolDeferred, UserMessageEntry
from bot.journal.fold import RunState, fold
from bot.journal.writer import RunJournal
from bot.kinds import TERMINAL_STATUSES, AuditAction, RequestKind
from bot.llm.scripted import ScriptedProvider
from bot.people.policy import Actor
from bot.prompter import DeferringPrompter
from bot.records import RunRecord
from bot.run.cancel import STOPPING_HERE
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor, cancel_key
from bot.tools.base import Tool
from bot.tools.source import ToolSource
from bot.tools.toolset import ToolSet
from storage.postgres import PostgresStore
from tests.bot.test_supervisor import holding_tool
from tests.fakes.runtime import Counter, ScriptedPrompter, call, counting_tools, reply
from tests.fakes.waiting import until
from tests.storage.conftest import postgres_dsn, postgres_schema

LEASE = 0.5

A = TypeVar("A")
B = TypeVar("B")


class Replicas:
    """Replicas on one schema; each effect counted in one counter, whichever replica ran it."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema
        self.counter = Counter()
        self.runtimes: list[Runtime] = []

    async def replica(self, owner: str, replies: list[dict[str, Any]], *extra: Tool) -> Supervisor:
        """A replica named ``owner`` whose model answers ``replies`` (for each run it drives);
        ``extra``: tools it has besides the counting ones."""
        store = PostgresStore(self.dsn, schema=self.schema)
        await store.migrate()
        rt = Runtime(
            store=store,
            model=ScriptedProvider.from_replies(replies, name="test"),
            tools=ToolSource(ToolSet([*counting_tools(self.counter), *extra])),
            owner=owner,
            lease_seconds=LEASE,
        )
        rt.policy.settings.oncall.append("U0ONCALL")
        self.runtimes.append(rt)
        return Supervisor(rt)

    async def close(self) -> None:
        for rt in self.runtimes:
            await rt.store.close()


@pytest.fixture
async def replicas() -> AsyncIterator[Replicas]:
    dsn = postgres_dsn()
    async with postgres_schema(dsn) as schema:
        made = Replicas(dsn, schema)
        yield made
        await made.close()


async def orphan(
    sup: Supervisor, run_id: str, *calls: ToolCall, deferred: Request | None = None
) -> None:
    """A run whose owner died after its model asked for ``calls`` (``deferred``: the first of
    them waits on that request); its lease gone at once."""
    rt = sup.rt
    session = Session(id=f"ses_{run_id}")
    await rt.store.ensure_session(session)
    epoch = await rt.store.create_run(RunRecord(id=run_id, session_id=session.id), "dead", 0.0)
    journal = RunJournal(rt.store, RunState(run_id), epoch)
    started = RunStarted(
        run_id=run_id, session_id=session.id, requested_by="U0REQ", fingerprint=rt.fingerprint()
    )
    entries: list[Any] = [
        started,
        UserMessageEntry(text="ship it", by="U0REQ"),
        AssistantTurnEntry(iteration=0, turn=AssistantTurn(calls=calls)),
    ]
    if deferred is not None:
        entries.append(ToolDeferred(call_id=deferred.call_id, tool=deferred.tool, request=deferred))
    for entry in entries:
        await journal.append(entry)


def write(text: str) -> ToolCall:
    """A call of ``write`` (not idempotent, not gated)."""
    return ToolCall(id=f"call_w_{text}", name="write", arguments=json.dumps({"text": text}))


async def ended(sup: Supervisor, run_id: str) -> RunStatus | None:
    status = (await sup.rt.store.get_run(run_id)).status
    return status if status in TERMINAL_STATUSES else None


async def test_two_sweeps_adopting_the_same_orphans_at_once_run_each_once(
    replicas: Replicas,
) -> None:
    done = [reply(text="written")] * 6
    first = await replicas.replica("replica-a", done)
    second = await replicas.replica("replica-b", done)
    runs = [f"run_orphan_{n}" for n in range(6)]
    for n, run_id in enumerate(runs):
        await orphan(first, run_id, write(str(n)))

    adopted = await asyncio.gather(first.adopt_orphans(), second.adopt_orphans())

    assert sorted(adopted[0] + adopted[1]) == sorted(runs)  # each by one sweep, none twice
    assert await until(lambda: all_ended(first, runs)) == [RunStatus.COMPLETED] * len(runs)
    assert replicas.counter.calls == {"write": len(runs)}


async def all_ended(sup: Supervisor, run_ids: list[str]) -> list[RunStatus] | None:
    """How each run ended, once all have."""
    statuses = [await ended(sup, run_id) for run_id in run_ids]
    return None if None in statuses else statuses  # type: ignore[return-value]


async def waiting_for_approval(sup: Supervisor) -> tuple[str, Request]:
    live = await sup.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    (request,) = (await sup.wait(live)).open_requests
    return live.run_id, request


async def cancel_or_why_not(sup: Supervisor, run_id: str) -> str:
    """Cancel as on-call; what the cancel said, or why it was refused."""
    try:
        return await sup.cancel(run_id, by="U0ONCALL")
    except CancelRefused as exc:
        return str(exc)


async def both(first: Awaitable[A], second: Awaitable[B], second_first: bool) -> tuple[A, B]:
    """``first`` and ``second`` at once, the one said started first (a race both ways)."""
    if not second_first:
        return await asyncio.gather(first, second)
    later, sooner = await asyncio.gather(second, first)
    return sooner, later


@pytest.mark.parametrize("cancel_first", [False, True, False, True])
async def test_an_approval_and_a_cancel_at_once_never_both_happen(
    replicas: Replicas, cancel_first: bool
) -> None:
    script = [reply(call("deploy", text="v2")), reply(text="deployed")]
    deciding = await replicas.replica("replica-a", script)
    cancelling = await replicas.replica("replica-b", script)
    run_id, request = await waiting_for_approval(deciding)
    chat = ChatService(deciding)

    decided, cancelled = await both(
        chat.decide(run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")),
        cancel_or_why_not(cancelling, run_id),
        cancel_first,
    )
    if decided.resumed is not None:
        await deciding.wait(decided.resumed)
    status = await until(lambda: ended(deciding, run_id))

    # Never deployed twice. Cancelled while it waited: never deployed. Else the approval took
    # the run first, and the cancel, asked of whoever held it, caught it before the deploy,
    # after it, or not before the run completed, deployed once.
    deploys = replicas.counter.calls.get("deploy", 0)
    assert deploys <= 1, (decided, cancelled)
    if cancelled == "cancelled":
        assert status is RunStatus.CANCELLED and deploys == 0, (decided, cancelled)
    elif status is RunStatus.COMPLETED:
        assert deploys == 1, (decided, cancelled)
    else:
        assert status is RunStatus.CANCELLED, (status, decided, cancelled)
    assert await deciding.rt.store.list_requests(run_id=run_id) == []
    # One cancel asked, one line in the audit: whoever ended the run, it was asked once.
    audited = await deciding.rt.store.list_audit(run_id=run_id)
    cancels = [a for a in audited if a.action in ("cancel", "cancel_refused")]
    assert [a.actor for a in cancels] == ["U0ONCALL"], cancels


@pytest.mark.parametrize("decision_first", [False, True, False, True])
async def test_a_decision_landing_while_its_run_is_adopted_runs_it_once(
    replicas: Replicas, decision_first: bool
) -> None:
    script = [reply(text="deployed and written")]
    adopting = await replicas.replica("replica-a", script)
    deciding = await replicas.replica("replica-b", script)
    run_id = "run_adopted"
    deploy = ToolCall(id="call_deploy", name="deploy", arguments='{"text": "v2"}')
    digest = adopting.rt.tools.current().call_digest("deploy", {"text": "v2"})
    request = RequestMaker(run_id, "U0REQ")(
        RequestKind.WAIT_APPROVAL, deploy.id, "deploy", {"text": "v2"}, digest=digest
    )
    # Its owner died as the batch's next call, a write, was about to start.
    await orphan(adopting, run_id, deploy, write("x"), deferred=request)

    adopted, decided = await both(
        adopting.adopt_orphans(),
        ChatService(deciding).decide(
            run_id, request.id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
        ),
        decision_first,
    )

    assert decided.accepted, decided.message
    status = await until(lambda: ended(adopting, run_id))
    assert status is RunStatus.COMPLETED, fold(await adopting.rt.store.load(run_id), run_id)
    assert replicas.counter.calls == {"deploy": 1, "write": 1}, (adopted, decided)


@pytest.mark.parametrize("answer", [DecisionKind.APPROVE, None])
async def test_a_run_asked_to_cancel_whose_replica_died_is_ended_asking_nobody_again(
    replicas: Replicas, answer: DecisionKind | None
) -> None:
    taking_up = await replicas.replica("replica-a", [reply(text="deployed")])
    run_id = "run_asked"
    deploy = ToolCall(id="call_deploy", name="deploy", arguments='{"text": "v2"}')
    digest = taking_up.rt.tools.current().call_digest("deploy", {"text": "v2"})
    request = RequestMaker(run_id, "U0REQ")(
        RequestKind.WAIT_APPROVAL, deploy.id, "deploy", {"text": "v2"}, digest=digest
    )
    await orphan(taking_up, run_id, deploy, deferred=request)
    # Cancelled at the terminal while its replica held the run; that replica then died.
    store = taking_up.rt.store
    await store.audit("U0ONCALL", AuditAction.CANCEL, run_id=run_id, detail="asked")
    await store.mark_once(cancel_key(run_id))
    console = ScriptedPrompter([answer])  # someone present, who would approve or say later

    live = await taking_up.resume(run_id, prompter=console)
    assert live is not None
    await taking_up.wait(live)

    assert console.asked == []  # its card is put to nobody again
    state = fold(await store.load(run_id), run_id)
    assert state.result is not None and state.result.error == "cancelled by U0ONCALL"
    assert await store.list_requests(run_id=run_id) == []
    assert replicas.counter.calls == {}


async def run_ends_fail(replicas: Replicas, failing: bool = True) -> None:
    """Make the database fail every write of a run's end (an error it raises), or no longer."""
    schema = replicas.schema
    admin = await asyncpg.connect(replicas.dsn)
    try:
        if not failing:
            await admin.execute(f"DROP TRIGGER blip ON {schema}.journal")
            return
        await admin.execute(
            f"CREATE OR REPLACE FUNCTION {schema}.blip() RETURNS trigger LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE EXCEPTION 'the store is away'; END $$"
        )
        await admin.execute(
            f"CREATE TRIGGER blip BEFORE INSERT ON {schema}.journal FOR EACH ROW"
            f" WHEN (NEW.kind = 'run_ended') EXECUTE FUNCTION {schema}.blip()"
        )
    finally:
        await admin.close()


async def test_a_cancel_the_store_failed_at_the_suspend_is_applied_once_it_is_back(
    replicas: Replicas, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kestrel")
    release = asyncio.Event()
    script = [reply(call("deploy", text="v2"), call("hold")), reply(text="deployed")]
    driving = await replicas.replica("replica-a", script, holding_tool(release))
    live = await driving.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    store = driving.rt.store
    await until(lambda: store.list_requests(run_id=live.run_id))  # its card is out
    assert await driving.cancel(live.run_id, by="U0ONCALL") == STOPPING_HERE
    await run_ends_fail(replicas)
    release.set()  # the batch ends waiting on its card: the run suspends, its cancel applied then
    await until(lambda: "the store is away" in caplog.text)

    await run_ends_fail(replicas, failing=False)

    assert await until(lambda: ended(driving, live.run_id)) is RunStatus.CANCELLED
    assert await until(lambda: no_open_requests(driving, live.run_id))  # its card closed
    assert replicas.counter.calls == {}


async def no_open_requests(sup: Supervisor, run_id: str) -> bool:
    """Whether none of the run's requests is open."""
    return not await sup.rt.store.list_requests(run_id=run_id)


class ApprovesElsewhereAtTheSuspend:
    """An event sink of the replica driving a run: as the run suspends, before that replica
    does anything more, another replica (a process of its own: its own thread, event loop and
    store connections) takes an approval of its card and drives the run as far as it goes."""

    def __init__(self, replicas: Replicas, run_id: str, request_id: str) -> None:
        self.replicas, self.run_id, self.request_id = replicas, run_id, request_id
        self.said: list[str] = []

    def emit(self, event: Event) -> None:
        """At the run's suspend, the other replica's approval, start to end."""
        if isinstance(event, RunSuspendedEvent) and event.run_id == self.run_id and not self.said:
            elsewhere = threading.Thread(target=asyncio.run, args=(self._approve(),))
            elsewhere.start()
            elsewhere.join()  # this replica's event loop waits: nothing of it runs meanwhile

    async def _approve(self) -> None:
        store = PostgresStore(self.replicas.dsn, schema=self.replicas.schema)
        await store.migrate()
        tools = [*counting_tools(self.replicas.counter), holding_tool(asyncio.Event())]
        rt = Runtime(
            store=store,
            model=ScriptedProvider.from_replies([reply(text="deployed")], name="test"),
            tools=ToolSource(ToolSet(tools)),
            owner="replica-b",
            lease_seconds=LEASE,
        )
        try:
            sup = Supervisor(rt)
            decided = await ChatService(sup).decide(
                self.run_id, self.request_id, DecisionKind.APPROVE, user=Actor("U0APPROVER")
            )
            self.said.append(decided.message)
            if decided.resumed is not None:
                await sup.wait(decided.resumed)
        finally:
            await store.close()


async def test_a_cancel_taken_as_the_run_ran_holds_against_an_approval_at_its_suspend(
    replicas: Replicas,
) -> None:
    release = asyncio.Event()
    script = [reply(call("deploy", text="v2"), call("hold")), reply(text="deployed")]
    driving = await replicas.replica("replica-a", script, holding_tool(release))
    live = await driving.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    store = driving.rt.store
    await until(lambda: store.list_requests(run_id=live.run_id))  # its card is out
    ((request, _status, _decision),) = await store.list_requests(run_id=live.run_id)
    said = await driving.cancel(live.run_id, by="U0ONCALL")
    assert said == STOPPING_HERE
    approving = ApprovesElsewhereAtTheSuspend(replicas, live.run_id, request.id)
    driving.rt.events.add(approving)

    release.set()  # the batch ends waiting on the card: the run suspends, and is approved then

    assert await until(lambda: ended(driving, live.run_id)) is RunStatus.CANCELLED
    assert approving.said  # the approval came in that moment
    assert replicas.counter.calls == {}  # the deploy the cancel was asked to stop never ran
