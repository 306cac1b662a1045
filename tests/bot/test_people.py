"""People in the loop: approvals, questions, policy, uncertain effects, deadlines, schedules."""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from msgspec.structs import replace

from bot.config.deadlines import MAX_WAIT_SECONDS
from bot.config.settings import DeadlineSettings, ScheduledPrompt
from bot.domain import (
    AssistantTurn,
    Decision,
    DecisionKind,
    RequestKind,
    RequestStatus,
    RunStatus,
    Session,
    ToolCall,
    utcnow,
)
from bot.errors import StoreError
from bot.events import FanOut
from bot.hooks import Hooks
from bot.journal.entries import (
    AssistantTurnEntry,
    RunStarted,
    ToolDispatched,
    ToolResultEntry,
    UserMessageEntry,
)
from bot.journal.fold import RunState, fold
from bot.journal.writer import RunJournal
from bot.llm.scripted import ScriptedProvider
from bot.people.policy import Actor, Policy, PolicyRules
from bot.prompter import DeferringPrompter
from bot.records import RunRecord
from bot.replica.schedule import PromptIdentity, Scheduler, _job
from bot.replica.work import WorkTaker
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from bot.store import Store
from bot.tools.ask_human import ask_human_tools
from bot.tools.source import ToolSource
from bot.tools.toolset import ToolSet
from storage.postgres import PostgresStore
from tests.fakes.runtime import Counter, call, counting_tools, make_runtime, reply
from tests.fakes.waiting import until

POSTGRES_DSN = os.environ.get("KESTREL_TEST_POSTGRES_DSN", "")

POLICY = PolicyRules(
    approvers={"*": ["U0APPROVER", "group:S0SRE"], "deploy": ["U0DEPLOYER"]},
    oncall=["U0ONCALL"],
)


async def suspended_on_approval(
    tmp_path: Path, *, policy: PolicyRules = POLICY, **deploy_options: Any
) -> tuple[Runtime, Supervisor, Counter, str, Any]:
    """A run that asked for ``deploy`` and suspended waiting for an approval."""
    counter = Counter()
    tools = counting_tools(counter, **deploy_options)
    rt, _ = await make_runtime(
        tmp_path / "k.db", [reply(call("deploy", text="v2")), reply(text="finished")], tools
    )
    rt.policy = Policy(policy)
    sup = Supervisor(rt)
    live = await sup.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    state = await sup.wait(live)
    assert state.status is RunStatus.SUSPENDED
    (request,) = state.open_requests
    assert request.kind is RequestKind.WAIT_APPROVAL
    return rt, sup, counter, live.run_id, request


async def approve_and_finish(
    sup: Supervisor,
    run_id: str,
    request_id: str,
    user: str,
    kind: DecisionKind = DecisionKind.APPROVE,
) -> tuple[bool, str, RunState | None]:
    decision = Decision(request_id=request_id, kind=kind, by=user, text="why not")
    answered = await sup.answer(decision, run_id=run_id)
    if not answered.ready:
        return answered.accepted, answered.message, None
    live = await sup.resume(run_id)
    assert live is not None
    return answered.accepted, answered.message, await sup.wait(live)


async def test_approved_call_runs_once_after_resume(tmp_path: Path) -> None:
    rt, sup, counter, run_id, request = await suspended_on_approval(tmp_path)
    ok, _, state = await approve_and_finish(sup, run_id, request.id, "U0DEPLOYER")
    assert ok and state is not None
    assert state.result is not None and state.result.text == "finished"
    assert counter.calls == {"deploy": 1}
    kinds = [r.entry.kind for r in await rt.store.load(run_id)]
    assert kinds.count("assistant_turn") == 2
    assert "grant_written" in kinds
    await rt.store.close()


async def test_denied_call_never_runs_and_the_model_reads_the_reason(tmp_path: Path) -> None:
    rt, sup, counter, run_id, request = await suspended_on_approval(tmp_path)
    ok, _, state = await approve_and_finish(
        sup, run_id, request.id, "U0APPROVER", DecisionKind.DENY
    )
    assert ok and state is not None and state.result is not None
    assert counter.calls == {}
    result = next(
        r.entry for r in await rt.store.load(run_id) if isinstance(r.entry, ToolResultEntry)
    )
    assert result.outcome.value == "gate_denied"
    assert "denied by U0APPROVER: why not" in result.output
    await rt.store.close()


async def test_concurrent_approvals_have_one_winner(tmp_path: Path) -> None:
    rt, sup, counter, run_id, request = await suspended_on_approval(tmp_path)
    decisions = [
        Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APPROVER")
        for _ in range(10)
    ]
    results = await asyncio.gather(*(sup.answer(d, run_id=run_id) for d in decisions))
    assert sum(r.accepted for r in results) == 1
    live = await sup.resume(run_id)
    assert live is not None
    await sup.wait(live)
    assert counter.calls == {"deploy": 1}
    await rt.store.close()


@pytest.mark.parametrize(
    ("user", "kind", "refusal"),
    [
        (
            "U0REQ",
            DecisionKind.APPROVE,
            "you asked for this run: someone else must approve it;"
            " may approve: U0DEPLOYER, U0APPROVER, group:S0SRE",
        ),
        (
            "U0NOBODY",
            DecisionKind.APPROVE,
            "U0NOBODY may not approve deploy: only U0DEPLOYER, U0APPROVER or group:S0SRE may",
        ),
        (
            "U0NOBODY",
            DecisionKind.DENY,
            "U0NOBODY may not deny deploy: only U0REQ, U0DEPLOYER, U0APPROVER or group:S0SRE may",
        ),
        ("U0ONCALL", DecisionKind.ANSWER, "answer is not an answer to a wait_approval request"),
    ],
)
async def test_approval_policy_refusals(
    tmp_path: Path, user: str, kind: DecisionKind, refusal: str
) -> None:
    rt, sup, _counter, run_id, request = await suspended_on_approval(tmp_path)
    decision = Decision(request_id=request.id, kind=kind, by=user)
    answered = await sup.answer(decision, run_id=run_id)
    assert not answered.accepted
    assert answered.message == refusal
    _req, status, _ = await rt.store.get_request(request.id)
    assert status is RequestStatus.OPEN
    await rt.store.close()


async def test_group_membership_comes_from_the_actor_not_the_payload(tmp_path: Path) -> None:
    rt, sup, _counter, run_id, request = await suspended_on_approval(tmp_path)
    decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0SRE")
    answered = await sup.answer(decision, run_id=run_id, actor=Actor("U0SRE", frozenset({"S0SRE"})))
    assert answered.accepted
    await rt.store.close()


async def test_answer_to_the_wrong_run_or_a_stale_card_is_refused(tmp_path: Path) -> None:
    rt, sup, _counter, run_id, request = await suspended_on_approval(tmp_path)
    decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APPROVER")
    wrong_run = await sup.answer(decision, run_id="run_other")
    assert not wrong_run.accepted and "not run run_other's" in wrong_run.message
    stale = await sup.answer(decision, run_id=run_id, digest="0" * 32)
    assert not stale.accepted and "stale" in stale.message
    unknown = await sup.answer(replace(decision, request_id="req_x"), run_id=run_id)
    assert not unknown.accepted
    await rt.store.close()


async def test_two_person_rule(tmp_path: Path) -> None:
    rt, sup, counter, run_id, request = await suspended_on_approval(tmp_path, approvals=2)
    assert request.approvals_needed == 2
    first = await sup.answer(
        Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APPROVER"), run_id=run_id
    )
    assert first.accepted and not first.ready and "1 of 2" in first.message
    again = await sup.answer(
        Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APPROVER"), run_id=run_id
    )
    assert again.accepted and not again.ready  # the same person twice still counts once
    assert (
        again.message == "You already approved this; it needs 1 more approval (from someone else)."
    )
    partial = [r for r in await rt.store.list_audit(run_id) if r.action == "approve_partial"]
    assert [r.actor for r in partial] == ["U0APPROVER"]  # ... and is audited once
    ok, _, state = await approve_and_finish(sup, run_id, request.id, "U0DEPLOYER")
    assert ok and state is not None and counter.calls == {"deploy": 1}
    await rt.store.close()


async def test_an_approval_that_lands_as_the_request_is_denied_says_so(tmp_path: Path) -> None:
    # Two people needed; one denies as another approves: the approval came too late, and the
    # approver must hear that (not "approval 0 of 2 recorded"), with a refusal in the audit.
    rt, sup, _counter, run_id, request = await suspended_on_approval(tmp_path, approvals=2)
    deny = Decision(request_id=request.id, kind=DecisionKind.DENY, by="U0DEPLOYER")
    approve = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APPROVER")
    denied, approved = await asyncio.gather(
        sup.answer(deny, run_id=run_id), sup.answer(approve, run_id=run_id)
    )
    assert denied.accepted
    assert not approved.accepted
    assert approved.message == f"request {request.id} is already answered (deny by U0DEPLOYER)"
    audit = [(r.actor, r.action) for r in await rt.store.list_audit(run_id)]
    assert audit[1:] == [("U0DEPLOYER", "deny"), ("U0APPROVER", "approve_refused")]
    await rt.store.close()


async def test_the_loser_of_two_decisions_at_once_is_told_who_won(tmp_path: Path) -> None:
    rt, sup, _counter, run_id, request = await suspended_on_approval(tmp_path)
    approve = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APPROVER")
    deny = Decision(request_id=request.id, kind=DecisionKind.DENY, by="U0DEPLOYER")
    approved, denied = await asyncio.gather(
        sup.answer(approve, run_id=run_id), sup.answer(deny, run_id=run_id)
    )
    assert approved.accepted and not denied.accepted
    assert denied.message == f"request {request.id} is already answered (approve by U0APPROVER)"
    audit = [(r.actor, r.action) for r in await rt.store.list_audit(run_id)]
    assert audit[1:] == [("U0APPROVER", "approve"), ("U0DEPLOYER", "deny_refused")]
    await rt.store.close()


async def test_a_deny_tool_is_refused_without_asking_anyone(tmp_path: Path) -> None:
    counter = Counter()
    rt, _ = await make_runtime(
        tmp_path / "k.db",
        [reply(call("deploy", text="v2")), reply(text="finished")],
        counting_tools(counter, deny=True),
    )
    sup = Supervisor(rt)
    live = await sup.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    state = await sup.wait(live)
    assert state.result is not None and state.result.outcomes == {"gate_denied": 1}
    assert await rt.store.list_requests(run_id=live.run_id, status=None) == []
    assert counter.calls == {}
    await rt.store.close()


async def test_questions_defer_and_the_answer_becomes_the_result(tmp_path: Path) -> None:
    replies = [
        reply(call("ask_human_select", question="Which region?", options=["eu", "us"])),
        reply(text="ok"),
    ]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, ask_human_tools())
    sup = Supervisor(rt)
    live = await sup.start_turn("go", requested_by="U0REQ", prompter=DeferringPrompter())
    state = await sup.wait(live)
    (request,) = state.open_requests
    assert request.kind is RequestKind.WAIT_USER and request.options == ("eu", "us")
    stranger = await sup.answer(
        Decision(request_id=request.id, kind=DecisionKind.ANSWER, text="us", by="U0X"),
        run_id=live.run_id,
    )
    assert not stranger.accepted
    answered = await sup.answer(
        Decision(request_id=request.id, kind=DecisionKind.ANSWER, text="eu", by="U0REQ"),
        run_id=live.run_id,
    )
    assert answered.ready
    resumed = await sup.resume(live.run_id)
    assert resumed is not None
    state = await sup.wait(resumed)
    assert state.result is not None and state.result.text == "ok"
    result = next(
        r.entry for r in await rt.store.load(live.run_id) if isinstance(r.entry, ToolResultEntry)
    )
    assert result.output.startswith("eu")
    await rt.store.close()


async def test_questions_without_a_prompter_are_refused(tmp_path: Path) -> None:
    replies = [reply(call("ask_human_input", question="Why?")), reply(text="ok")]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, ask_human_tools())
    sup = Supervisor(rt)
    state = await sup.wait(await sup.start_turn("go"))
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    result = next(
        r.entry for r in await rt.store.load(state.run_id) if isinstance(r.entry, ToolResultEntry)
    )
    assert "no one is present" in result.output
    await rt.store.close()


async def orphaned_dispatch(tmp_path: Path) -> tuple[Runtime, Supervisor, Counter, str]:
    """A journal that stops right after a non-idempotent dispatch, as a crash leaves it."""
    counter = Counter()
    rt, _ = await make_runtime(
        tmp_path / "k.db",
        [reply(call("write", text="x")), reply(text="after")],
        counting_tools(counter),
    )
    rt.policy = Policy(POLICY)
    sup = Supervisor(rt)
    await rt.store.ensure_session(Session(id="ses_1"))
    epoch = await rt.store.create_run(RunRecord(id="run_1", session_id="ses_1"), "dead", 0.0)
    journal = RunJournal(rt.store, RunState("run_1"), epoch)
    turn = AssistantTurn(calls=(ToolCall(id="call_1", name="write", arguments='{"text": "x"}'),))
    for entry in (
        RunStarted(run_id="run_1", session_id="ses_1", fingerprint=rt.fingerprint()),
        UserMessageEntry(text="write"),
        AssistantTurnEntry(iteration=0, turn=turn),
        ToolDispatched(call_id="call_1", tool="write"),
    ):
        await journal.append(entry)
    return rt, sup, counter, "run_1"


@pytest.mark.parametrize(
    ("choice", "runs", "output"),
    [
        (DecisionKind.RETRY, 1, "wrote x"),
        (DecisionKind.DONE, 0, "it worked"),
        (DecisionKind.FAILED, 0, "marked failed by U0ONCALL"),
    ],
)
async def test_uncertain_effect_waits_for_oncall(
    tmp_path: Path, choice: DecisionKind, runs: int, output: str
) -> None:
    rt, sup, counter, run_id = await orphaned_dispatch(tmp_path)
    live = await sup.resume(run_id)
    assert live is not None
    state = await sup.wait(live)
    (request,) = state.open_requests
    assert request.kind is RequestKind.WAIT_EFFECT
    assert counter.calls == {}
    not_oncall = await sup.answer(
        Decision(request_id=request.id, kind=choice, by="U0APPROVER"), run_id=run_id
    )
    assert not not_oncall.accepted
    decision = Decision(
        request_id=request.id,
        kind=choice,
        by="U0ONCALL",
        text="it worked" if choice is DecisionKind.DONE else "",
    )
    assert (await sup.answer(decision, run_id=run_id)).ready
    live = await sup.resume(run_id)
    assert live is not None
    state = await sup.wait(live)
    assert state.result is not None and state.result.text == "after"
    assert counter.calls.get("write", 0) == runs
    result = next(
        r.entry for r in await rt.store.load(run_id) if isinstance(r.entry, ToolResultEntry)
    )
    assert output in result.output
    await rt.store.close()


async def test_an_uncertain_effect_past_its_deadline_is_still_uncertain_to_the_model(
    tmp_path: Path,
) -> None:
    rt, sup, counter, run_id = await orphaned_dispatch(tmp_path)
    live = await sup.resume(run_id)
    assert live is not None
    (request,) = (await sup.wait(live)).open_requests

    assert await sup.expire(request)  # nobody settled it: the deadline did, and resumed it

    state = await sup.wait(sup.live[run_id])
    assert state.result is not None and state.result.text == "after"
    (result,) = [
        r.entry for r in await rt.store.load(run_id) if isinstance(r.entry, ToolResultEntry)
    ]
    # Not "failed": the model would likely run it again, and it may have taken effect.
    assert "failed" not in result.output
    assert "unknown" in result.output and result.is_error
    assert counter.calls == {}
    await rt.store.close()


async def test_deadline_expires_once_across_a_restart(tmp_path: Path) -> None:
    rt, sup, counter, run_id, request = await suspended_on_approval(tmp_path)
    assert request.deadline is not None
    later = request.deadline + timedelta(seconds=1)
    first = Scheduler(sup, DeadlineSettings(), [], store=rt.store, clock=lambda: later)
    restarted = Scheduler(
        Supervisor(rt), DeadlineSettings(), [], store=rt.store, clock=lambda: later
    )
    expired_a, _ = await first.sweep()
    expired_b, _ = await restarted.sweep()
    assert expired_a == [request.id] and expired_b == []
    for live in list(sup.live.values()):
        await sup.wait(live)
    state = fold(await rt.store.load(run_id), run_id)
    assert state.result is not None
    result = next(
        r.entry for r in await rt.store.load(run_id) if isinstance(r.entry, ToolResultEntry)
    )
    assert "expired" in result.output
    assert counter.calls == {}
    actions = [a.action for a in await rt.store.list_audit(run_id=run_id)]
    assert actions.count("expire") == 1
    await rt.store.close()


async def test_reminder_fires_once_before_the_deadline(tmp_path: Path) -> None:
    rt, sup, _counter, _run_id, request = await suspended_on_approval(tmp_path)
    assert request.deadline is not None
    soon = request.deadline - timedelta(seconds=60)
    scheduler = Scheduler(
        sup, DeadlineSettings(remind_before=600), [], store=rt.store, clock=lambda: soon
    )
    assert (await scheduler.sweep())[1] == [request.id]
    assert (await scheduler.sweep())[1] == []
    await rt.store.close()


async def test_a_request_a_cut_short_cancel_left_open_is_not_reminded_but_still_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reminded, its thread was told the request of a cancelled run still waited on an approver.
    rt, sup, counter, run_id, request = await suspended_on_approval(tmp_path)
    assert request.deadline is not None

    async def killed(_run_id: str, _by: str) -> None:
        raise SystemExit  # the process dies after the run's end, before closing its requests

    monkeypatch.setattr(sup.decisions, "close_requests", killed)
    with pytest.raises(SystemExit):
        await sup.cancel(run_id, by="U0REQ")
    monkeypatch.undo()
    assert await rt.store.list_requests()  # left open on its cancelled run
    scheduler = Scheduler(sup, DeadlineSettings(), [], store=rt.store)

    assert await scheduler.sweep(request.deadline - timedelta(seconds=60)) == ([], [])
    # Its deadline still closes it, and its card stops offering a decision.
    assert await scheduler.sweep(request.deadline) == ([request.id], [])
    actions = [a.action for a in await rt.store.list_audit(run_id=run_id)]
    assert "remind" not in actions and actions.count("expire") == 1
    assert counter.calls == {}
    await rt.store.close()


async def test_the_longest_deadline_and_reminder_allowed_are_kept_and_fire(tmp_path: Path) -> None:
    # Longer ones are refused by the configuration: they fell past the last date there is.
    longest = DeadlineSettings(wait_approval=MAX_WAIT_SECONDS, remind_before=MAX_WAIT_SECONDS)
    rt, _ = await make_runtime(
        tmp_path / "k.db",
        [reply(call("deploy", text="v2")), reply(text="done")],
        counting_tools(Counter()),
    )
    rt.deadlines = longest
    sup = Supervisor(rt)
    live = await sup.start_turn("ship it", requested_by="U0REQ", prompter=DeferringPrompter())
    (request,) = (await sup.wait(live)).open_requests
    assert request.deadline == request.created_at + timedelta(seconds=MAX_WAIT_SECONDS)
    scheduler = Scheduler(sup, longest, [], store=rt.store)
    assert await scheduler.sweep() == ([], [request.id])  # reminded a century before
    await scheduler.start()  # its jobs scheduled, a century on
    try:
        past = request.deadline + timedelta(seconds=1)
        assert await scheduler.sweep(past) == ([request.id], [])
    finally:
        await scheduler.stop()
    for running in list(sup.live.values()):
        await sup.wait(running)
    await rt.store.close()


async def test_scheduled_prompt_fires_once_and_refuses_gated_calls(tmp_path: Path) -> None:
    counter = Counter()
    rt, _ = await make_runtime(
        tmp_path / "k.db",
        [reply(call("deploy", text="nightly")), reply(text="done")],
        counting_tools(counter),
    )
    sup = Supervisor(rt)
    prompts = [ScheduledPrompt(name="nightly", cron="0 3 * * *", prompt="deploy nightly")]
    scheduler = Scheduler(sup, DeadlineSettings(), prompts, store=rt.store)
    at = utcnow().replace(hour=3, minute=0, second=0, microsecond=0)
    live = await scheduler.fire_prompt("nightly", at)
    assert live is not None
    assert (
        await Scheduler(Supervisor(rt), DeadlineSettings(), prompts, store=rt.store).fire_prompt(
            "nightly", at
        )
        is None
    )
    state = await sup.wait(live)
    assert state.result is not None and state.result.outcomes == {"gate_denied": 1}
    assert counter.calls == {}
    await rt.store.close()


async def test_a_scheduled_prompt_whose_run_the_store_refused_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = Counter()
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(text="done")], counting_tools(counter))
    create_run = rt.store.create_run

    async def away(*_args: Any, **_kwargs: Any) -> int:
        raise StoreError("the store is away")  # for the claimer's create only

    monkeypatch.setattr(rt.store, "create_run", away)
    prompts = [ScheduledPrompt(name="nightly", cron="0 3 * * *", prompt="check nightly")]
    scheduler = Scheduler(Supervisor(rt), DeadlineSettings(), prompts, store=rt.store)
    at = utcnow().replace(hour=3, minute=0, second=0, microsecond=0)
    live = await scheduler.fire_prompt("nightly", at)
    assert live is not None and live.error
    monkeypatch.setattr(rt.store, "create_run", create_run)

    # The occurrence is claimed; its start work is left for a replica to take again.
    (item,) = await rt.store.take_work("w2", retake_after=-1.0)
    assert item.kind == "start" and item.payload["run_id"] == live.run_id
    await WorkTaker(Supervisor(rt), rt.store)._handle(item)

    async def ended() -> bool:
        return (await rt.store.get_run(live.run_id)).status is RunStatus.COMPLETED

    await until(ended)
    assert await rt.store.take_work("w3", retake_after=-1.0) == []  # done: started once
    await rt.store.close()


async def test_an_orphaned_run_is_adopted_by_exactly_one_replica(tmp_path: Path) -> None:
    rt, sup, counter, run_id = await orphaned_dispatch(tmp_path)
    other_rt, _ = await make_runtime(
        tmp_path / "k.db", [reply(text="x")], counting_tools(Counter())
    )
    other_rt.owner = "replica-b"
    other = Supervisor(other_rt)
    adopted = await asyncio.gather(sup.adopt_orphans(), other.adopt_orphans())
    assert sorted(len(a) for a in adopted) == [0, 1]
    for live in [*sup.live.values(), *other.live.values()]:
        await (sup if live.run_id in sup.live else other).wait(live)
    state = fold(await rt.store.load(run_id), run_id)
    assert [r.kind for r in state.open_requests] == [RequestKind.WAIT_EFFECT]
    assert state.takeovers == ["dead"]
    assert counter.calls == {}
    assert await rt.store.orphaned_runs() == []
    await other_rt.store.close()
    await rt.store.close()


async def test_requests_of_one_batch_are_answered_independently(tmp_path: Path) -> None:
    counter = Counter()
    tools = [*counting_tools(counter), *ask_human_tools()]
    replies = [
        reply(call("deploy", text="v2"), call("ask_human_input", question="Which window?")),
        reply(text="both settled"),
    ]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, tools)
    rt.policy = Policy(POLICY)
    sup = Supervisor(rt)
    live = await sup.start_turn("ship", requested_by="U0REQ", prompter=DeferringPrompter())
    state = await sup.wait(live)
    approval, question = state.open_requests
    assert (approval.kind, question.kind) == (RequestKind.WAIT_APPROVAL, RequestKind.WAIT_USER)
    first = await sup.answer(
        Decision(request_id=question.id, kind=DecisionKind.ANSWER, text="tonight", by="U0REQ"),
        run_id=live.run_id,
    )
    assert first.accepted and not first.ready
    assert await sup.resume(live.run_id) is None  # still waits for the approval
    second = await sup.answer(
        Decision(request_id=approval.id, kind=DecisionKind.APPROVE, by="U0DEPLOYER"),
        run_id=live.run_id,
    )
    assert second.ready
    resumed = await sup.resume(live.run_id)
    assert resumed is not None
    state = await sup.wait(resumed)
    assert state.result is not None and state.result.text == "both settled"
    assert counter.calls == {"deploy": 1}
    outputs = [
        r.entry.output
        for r in await rt.store.load(live.run_id)
        if isinstance(r.entry, ToolResultEntry)
    ]
    assert outputs[0] == "deployed v2" and outputs[1].startswith("tonight")
    await rt.store.close()


async def test_a_job_under_way_at_shutdown_stops_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = asyncio.Event()

    async def sweeping() -> None:
        started.set()
        await asyncio.Event().wait()  # still under way when the scheduler stops

    scheduler = AsyncIOScheduler(timezone="UTC")
    scheduler.start()
    scheduler.add_job(_job(sweeping), "date", run_date=utcnow(), misfire_grace_time=None)
    await asyncio.wait_for(started.wait(), 10)
    with caplog.at_level(logging.DEBUG):
        scheduler.shutdown(wait=False)
        await until(lambda: any("stopped at shutdown" in r.getMessage() for r in caplog.records))
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_job_the_store_failed_says_at_the_same_level_when_it_works_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A sweep on a connection a failover ended: "sweep failed, trying again at its next time"
    # was a warning and "works again" info, which `serve` (at warning) never shows.
    caplog.set_level(logging.WARNING)
    tries: list[int] = []

    async def sweep() -> None:
        tries.append(len(tries))
        if len(tries) == 1:
            raise StoreError("PostgreSQL …: list_requests failed: connection was closed")

    job = _job(sweep)
    await job()
    await job()

    said = [record.getMessage() for record in caplog.records]
    assert said[0].startswith("scheduler: sweep failed, trying again at its next time: ")
    assert said[1:] == ["scheduler: sweep works again"]


async def test_a_partial_approval_that_lands_as_a_cancel_ends_the_run_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cancel ends its run, then closes its requests: the first of two approvals, checked
    # just before the end and written just after it, was recorded on a run nothing will resume,
    # audited as a partial approval and its approver told "approval 1 of 2 recorded".
    rt, sup, _counter, run_id, request = await suspended_on_approval(tmp_path, approvals=2)
    add = rt.store.add_approval

    async def killed(_run_id: str, _by: str) -> None:
        raise SystemExit  # the cancel's close comes after the approval: it never came here

    async def cancelled_meanwhile(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(rt.store, "add_approval", add)
        monkeypatch.setattr(sup.decisions, "close_requests", killed)
        with pytest.raises(SystemExit):
            await sup.cancel(run_id, by="U0REQ")
        return await add(*args, **kwargs)

    monkeypatch.setattr(rt.store, "add_approval", cancelled_meanwhile)
    approve = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APPROVER")
    approved = await sup.answer(approve, run_id=run_id)

    assert not approved.accepted and "cancelled" in approved.message, approved.message
    assert (await rt.store.get_request(request.id))[1] is RequestStatus.CANCELLED
    actions = [(r.actor, r.action) for r in await rt.store.list_audit(run_id)]
    assert ("U0APPROVER", "approve_partial") not in actions, actions
    assert ("U0APPROVER", "approve_refused") in actions, actions
    await rt.store.close()


async def seen_since(store: Store, prompt: ScheduledPrompt, at: datetime) -> None:
    """The store first saw ``prompt`` at ``at`` (a replica knew it then)."""
    await store.first_marked(PromptIdentity.of(prompt).seen(), at)


async def _scheduled_runs(rt: Runtime) -> list[RunRecord]:
    return [r for r in await rt.store.list_runs() if r.requested_by.startswith("schedule:")]


@pytest.mark.parametrize(
    ("minutes_late", "grace", "started"),
    [(2, 300.0, True), (10, 300.0, False), (2, 0.0, False)],
)
async def test_an_occurrence_missed_while_no_replica_ran_starts_within_its_grace(
    tmp_path: Path, minutes_late: int, grace: float, started: bool
) -> None:
    # The 03:00 occurrence fell while no replica ran; one starts at 03:02 (or 03:10).
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(text="done")] * 2)
    at = utcnow().replace(hour=3, minute=0, second=0, microsecond=0)
    now = at + timedelta(minutes=minutes_late)
    prompt = ScheduledPrompt(
        name="nightly", cron="0 3 * * *", prompt="check nightly", grace_seconds=grace
    )

    def replica() -> Scheduler:
        return Scheduler(
            Supervisor(rt), DeadlineSettings(), [prompt], store=rt.store, clock=lambda: now
        )

    # A replica knew the prompt before 03:00 (one added later never starts 03:00 late).
    await seen_since(rt.store, prompt, at - timedelta(minutes=10))
    for scheduler in (replica(), replica()):  # the second starts as the first did
        await scheduler.start()
        await scheduler.stop()
    runs = await _scheduled_runs(rt)
    assert len(runs) == (1 if started else 0)
    for run in runs:

        async def ended(run_id: str = run.id) -> bool:
            return (await rt.store.get_run(run_id)).status is RunStatus.COMPLETED

        await until(ended)
    await rt.store.close()


async def test_the_catch_up_finds_the_latest_occurrence_at_once_however_long_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every second, a 30 days' grace: the missed occurrence is the second before the start,
    # found without stepping through the 2,592,000 before it (a start held for half a minute
    # and more, while nothing else ran).
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(text="done")] * 2)
    now = utcnow().replace(microsecond=0) + timedelta(milliseconds=500)
    prompt = ScheduledPrompt(
        name="tick", cron="* * * * * *", prompt="tick", grace_seconds=30 * 86400.0
    )
    taken: list[str] = []
    take_once = rt.store.take_once

    async def noted(key: str, *args: Any, **kwargs: Any) -> int | None:
        taken.append(key)
        return await take_once(key, *args, **kwargs)

    # Known to the store for ten days of the grace: the search runs over those.
    await seen_since(rt.store, prompt, now - timedelta(days=10))
    monkeypatch.setattr(rt.store, "take_once", noted)
    scheduler = Scheduler(
        Supervisor(rt), DeadlineSettings(), [prompt], store=rt.store, clock=lambda: now
    )
    await asyncio.wait_for(scheduler.start(), timeout=10)
    await scheduler.stop()
    # The first taken is the catch-up's (the scheduler may have fired the next since).
    assert taken[0] == f"cron:tick:{now.replace(microsecond=0).isoformat()}", taken
    runs = await _scheduled_runs(rt)
    for run in runs:

        async def ended(run_id: str = run.id) -> bool:
            return (await rt.store.get_run(run_id)).status is RunStatus.COMPLETED

        await until(ended)
    await rt.store.close()


@pytest.mark.parametrize("failing", ["take_once", "first_marked"])
async def test_a_store_failure_in_the_catch_up_leaves_the_replica_scheduling(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    failing: str,
) -> None:
    # The late start is one occurrence (or, asking when the prompts were first seen, all of
    # them); a store that fails it must not keep the replica from starting, nor its prompts
    # and sweeps from being scheduled.
    rt, _ = await make_runtime(tmp_path / "k.db", [reply(text="done")] * 2)
    at = utcnow().replace(hour=3, minute=0, second=0, microsecond=0)
    now = at + timedelta(minutes=2)

    async def away(*_args: Any, **_kwargs: Any) -> int | None:
        raise StoreError("the store is away")

    prompts = [
        ScheduledPrompt(name="nightly", cron="0 3 * * *", prompt="check nightly"),
        ScheduledPrompt(name="later", cron="0 4 * * *", prompt="check later"),
    ]
    for seen in prompts:  # a replica knew them before 03:00
        await seen_since(rt.store, seen, at - timedelta(minutes=10))
    monkeypatch.setattr(rt.store, failing, away)
    scheduler = Scheduler(
        Supervisor(rt), DeadlineSettings(), prompts, store=rt.store, clock=lambda: now
    )
    with caplog.at_level(logging.WARNING, logger="kestrel.schedule"):
        await scheduler.start()
    assert scheduler._aps is not None
    jobs = {job.id for job in scheduler._aps.get_jobs()}
    await scheduler.stop()
    assert {"cron:nightly", "cron:later", "sweep", "adopt"} <= jobs, jobs
    assert "started late" in caplog.text, caplog.text
    assert caplog.text.count("the store is away") == 1, caplog.text
    await rt.store.close()


@pytest.mark.skipif(not POSTGRES_DSN, reason="set KESTREL_TEST_POSTGRES_DSN")
async def test_two_replicas_starting_together_on_postgres_start_the_missed_one_once() -> None:
    # A rolling restart: both replicas start at 03:02 and both look back on 03:00.
    schema = f"kt_{os.urandom(6).hex()}"
    stores = [PostgresStore(POSTGRES_DSN, schema=schema) for _ in range(2)]
    await stores[0].migrate()
    await stores[1].migrate()
    at = utcnow().replace(hour=3, minute=0, second=0, microsecond=0)
    now = at + timedelta(minutes=2)
    prompt = ScheduledPrompt(name="nightly", cron="0 3 * * *", prompt="check nightly")
    schedulers = []
    for number, store in enumerate(stores):
        rt = Runtime(
            store=store,
            model=ScriptedProvider.from_replies([reply(text="done")] * 2, name="test"),
            tools=ToolSource(ToolSet([])),
            hooks=Hooks(),
            events=FanOut(),
            owner=f"replica-{number}",
        )
        schedulers.append(
            Scheduler(Supervisor(rt), DeadlineSettings(), [prompt], store=store, clock=lambda: now)
        )
    try:
        # A replica knew the prompt before 03:00 (one added later never starts 03:00 late).
        await seen_since(stores[0], prompt, at - timedelta(minutes=10))
        await asyncio.gather(*(scheduler.start() for scheduler in schedulers))
        for scheduler in schedulers:
            await scheduler.stop()
        runs = [r for r in await stores[0].list_runs() if r.requested_by == "schedule:nightly"]
        assert len(runs) == 1, runs

        async def ended() -> bool:
            return (await stores[0].get_run(runs[0].id)).status is RunStatus.COMPLETED

        await until(ended)
    finally:
        for store in stores:
            await store.close()
        conn = await asyncpg.connect(POSTGRES_DSN)
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()
