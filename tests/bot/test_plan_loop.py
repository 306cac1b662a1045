"""Plans in the loop, on real parts: one decision for a reply's gated calls, propose_plan, the
three decisions, the policy per step, and calls that match no step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.domain import DecisionKind, GrantKind, RequestKind, RunStatus, ToolOutcome
from bot.journal.entries import GrantWritten, ToolResultEntry
from bot.run.plan import PlanBook
from tests.fakes.plans import APPROVER, REQUESTER, plan_world, step
from tests.fakes.runtime import ScriptedPrompter, call, reply

FOUR = [
    call("drain_node", unit="node-1"),
    call("restart_unit", unit="payments-api"),
    call("restart_unit", unit="payments-db"),
    call("restart_unit", unit="payments-worker"),
]


async def test_four_gated_calls_of_one_reply_need_one_decision(tmp_path: Path) -> None:
    world = await plan_world(tmp_path, [reply(*FOUR, text="drain, then restart"), reply(text="ok")])
    run_id = await world.start()

    plan = await world.plan(run_id)
    assert len(await world.open(run_id)) == 1  # one card, not four
    assert [s.tool for s in plan.steps] == ["drain_node", *["restart_unit"] * 3]
    assert plan.prompt == "drain, then restart"
    assert world.effects.count() == 0

    decided = await world.decide(run_id, plan, DecisionKind.APPROVE)

    assert decided.accepted
    state = await world.ended(run_id)
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    assert world.effects.done == [
        ("drain_node", "node-1"),
        ("restart_unit", "payments-api"),
        ("restart_unit", "payments-db"),
        ("restart_unit", "payments-worker"),
    ]
    requests = [r for r, _s, _d in await world.rt.store.list_requests(run_id=run_id, status=None)]
    assert len(requests) == 1
    actions = await world.audit_actions(run_id)
    assert actions.count("approve") == 1 and actions.count("request") == 1
    (approval,) = [a for a in await world.rt.store.list_audit(run_id) if a.action == "approve"]
    assert approval.actor == APPROVER
    assert approval.detail.startswith('plan of 4 steps: drain_node {"unit": "node-1"};')
    assert approval.detail.endswith(f"(plan digest {plan.digest})")


async def test_a_denied_plan_runs_no_step_and_tells_the_model_why(tmp_path: Path) -> None:
    world = await plan_world(tmp_path, [reply(*FOUR), reply(text="understood")])
    run_id = await world.start()
    plan = await world.plan(run_id)

    await world.decide(run_id, plan, DecisionKind.DENY, text="not during the freeze")

    state = await world.ended(run_id)
    assert world.effects.count() == 0
    results = [e.entry for e in await world.rt.store.load(run_id)]
    refused = [e for e in results if isinstance(e, ToolResultEntry)]
    assert len(refused) == 4
    assert all(r.outcome is ToolOutcome.GATE_DENIED for r in refused)
    assert all("not during the freeze" in r.output for r in refused)
    assert state.result is not None and state.result.status is RunStatus.COMPLETED


async def test_step_by_step_opens_one_card_per_call(tmp_path: Path) -> None:
    world = await plan_world(tmp_path, [reply(*FOUR), reply(text="ok")])
    run_id = await world.start()
    plan = await world.plan(run_id)

    await world.decide(run_id, plan, DecisionKind.STEP_BY_STEP)

    cards = await world.open(run_id)
    assert [r.kind for r in cards] == [RequestKind.WAIT_APPROVAL] * 4
    assert world.effects.count() == 0
    for card in cards:
        await world.decide(run_id, card, DecisionKind.APPROVE)
    await world.ended(run_id)
    assert world.effects.count() == 4


async def test_one_gated_call_still_gets_a_normal_card(tmp_path: Path) -> None:
    replies = [reply(call("restart_unit", unit="a"), call("list_units", unit="x")), reply(text="k")]
    world = await plan_world(tmp_path, replies)
    run_id = await world.start()

    assert [r.kind for r in await world.open(run_id)] == [RequestKind.WAIT_APPROVAL]
    assert world.effects.done == [("list_units", "x")]


async def test_ungated_calls_of_a_planned_reply_run_before_the_decision(tmp_path: Path) -> None:
    calls = [call("list_units", unit="x"), *FOUR[:2]]
    world = await plan_world(tmp_path, [reply(*calls), reply(text="ok")])
    run_id = await world.start()

    assert world.effects.done == [("list_units", "x")]
    await world.decide(run_id, await world.plan(run_id), DecisionKind.APPROVE)
    await world.ended(run_id)
    assert world.effects.count() == 3


async def test_a_proposed_plan_covers_its_steps_in_later_replies(tmp_path: Path) -> None:
    steps = [step("drain_node", "node-1", "move traffic"), step("restart_unit", "payments-api")]
    replies = [
        reply(call("propose_plan", summary="drain then restart", steps=steps)),
        reply(call("drain_node", unit="node-1")),
        reply(call("restart_unit", unit="payments-api")),
        reply(text="done"),
    ]
    world = await plan_world(tmp_path, replies)
    run_id = await world.start()
    plan = await world.plan(run_id)
    assert plan.prompt == "drain then restart"
    assert plan.steps[0].why == "move traffic"

    await world.decide(run_id, plan, DecisionKind.APPROVE)

    state = await world.ended(run_id)
    assert world.effects.count() == 2
    assert state.result is not None and state.result.text == "done"
    grants = [
        e.entry.grant
        for e in await world.rt.store.load(run_id)
        if isinstance(e.entry, GrantWritten)
    ]
    assert [g.kind for g in grants].count(GrantKind.PLAN_STEP) == 2
    assert [g.plan for g in grants if g.kind is GrantKind.ONE_SHOT] == [plan.id, plan.id]


async def test_an_off_plan_call_gets_a_normal_card_saying_how_it_differs(tmp_path: Path) -> None:
    replies = [
        reply(
            call(
                "propose_plan", summary="restart api", steps=[step("restart_unit", "payments-api")]
            )
        ),
        reply(call("restart_unit", unit="payments-db")),
        reply(text="done"),
    ]
    world = await plan_world(tmp_path, replies)
    run_id = await world.start()
    await world.decide(run_id, await world.plan(run_id), DecisionKind.APPROVE)

    (card,) = await world.open(run_id)
    assert card.kind is RequestKind.WAIT_APPROVAL
    assert "changed argument `unit`: `payments-db` vs plan `payments-api`" in card.off_plan
    assert world.effects.count() == 0


async def test_an_off_plan_card_shows_where_a_long_value_differs(tmp_path: Path) -> None:
    # The same for 81 characters, then not: the first 60 of each would read the same.
    same = "payments-" + "x" * 71
    replies = [
        reply(call("propose_plan", summary="restart", steps=[step("restart_unit", same + "-api")])),
        reply(call("restart_unit", unit=same + "-evil;rm -rf /")),
        reply(text="done"),
    ]
    world = await plan_world(tmp_path, replies)
    run_id = await world.start()
    await world.decide(run_id, await world.plan(run_id), DecisionKind.APPROVE)

    (card,) = await world.open(run_id)
    was, now = "…" + "x" * 19 + "-api", "…" + "x" * 19 + "-evil;rm -rf /"
    assert f"changed argument `unit`: `{now}` vs plan `{was}`" in card.off_plan, card.off_plan
    assert world.effects.count() == 0


async def test_propose_plan_with_an_unknown_tool_is_a_tool_error(tmp_path: Path) -> None:
    replies = [
        reply(call("propose_plan", summary="x", steps=[step("reboot_world", "a")])),
        reply(call("propose_plan", summary="x", steps=[{"tool": "restart_unit"}])),
        reply(text="sorry"),
    ]
    world = await plan_world(tmp_path, replies)
    run_id = await world.start()

    state = await world.ended(run_id)
    results = [
        e.entry for e in await world.rt.store.load(run_id) if isinstance(e.entry, ToolResultEntry)
    ]
    assert "step 1: unknown tool 'reboot_world'" in results[0].output
    assert results[1].outcome is ToolOutcome.INVALID_ARGUMENTS
    assert "arguments" in results[1].output
    assert await world.open(run_id) == []
    assert state.result is not None and state.result.text == "sorry"


async def test_only_someone_who_may_approve_every_step_approves_the_plan(tmp_path: Path) -> None:
    approvers = {"drain_node": ["U0LEAD"], "restart_unit": ["U0LEAD", APPROVER]}
    world = await plan_world(tmp_path, [reply(*FOUR), reply(text="ok")], approvers=approvers)
    run_id = await world.start()
    plan = await world.plan(run_id)

    refused = await world.decide(run_id, plan, DecisionKind.APPROVE, by=APPROVER)

    assert not refused.accepted
    assert "step 1 (drain_node)" in refused.message
    assert "step 2" not in refused.message
    assert world.effects.count() == 0
    assert (await world.decide(run_id, plan, DecisionKind.APPROVE, by="U0LEAD")).accepted
    await world.ended(run_id)
    assert world.effects.count() == 4


async def test_the_requester_may_not_approve_their_own_plan(tmp_path: Path) -> None:
    world = await plan_world(tmp_path, [reply(*FOUR), reply(text="ok")])
    run_id = await world.start()

    refused = await world.decide(
        run_id, await world.plan(run_id), DecisionKind.APPROVE, by=REQUESTER
    )

    assert not refused.accepted and "someone else must approve" in refused.message


async def test_a_plan_answered_at_the_keyboard_runs_its_steps(tmp_path: Path) -> None:
    world = await plan_world(tmp_path, [reply(*FOUR), reply(text="ok")])
    prompter = ScriptedPrompter([DecisionKind.APPROVE])

    run_id = await world.start(prompter)

    await world.ended(run_id)
    assert len(prompter.asked) == 1 and prompter.asked[0].kind is RequestKind.WAIT_PLAN
    assert world.effects.count() == 4


def test_the_plan_book_covers_steps_in_order_and_once() -> None:
    from bot.domain import Grant

    book = PlanBook()
    for number, unit in enumerate(["a", "b"]):
        book.honour(
            Grant(kind=GrantKind.PLAN_STEP, tool="restart_unit", digest=unit, plan="p", step=number)
        )
    assert book.cover("restart_unit", "b") is None  # step 2 waits for step 1
    first = book.cover("restart_unit", "a")
    assert first is not None and first.step == 0
    book.honour(Grant(kind=GrantKind.ONE_SHOT, tool="restart_unit", plan="p", step=0))
    assert book.cover("restart_unit", "a") is None  # used up
    assert book.cover("restart_unit", "b") is not None


async def test_a_reply_of_more_calls_than_a_card_shows_plans_the_first_twenty(
    tmp_path: Path,
) -> None:
    calls = [call("restart_unit", unit=f"u{n}") for n in range(22)]
    world = await plan_world(tmp_path, [reply(*calls), reply(text="ok")])
    run_id = await world.start()

    opened = await world.open(run_id)

    # The first twenty on one card; the two past them ask on cards of their own.
    assert sorted(r.kind for r in opened) == sorted(
        [RequestKind.WAIT_PLAN, RequestKind.WAIT_APPROVAL, RequestKind.WAIT_APPROVAL]
    )
    assert len((await world.plan(run_id)).steps) == 20
    for request in opened:  # the run goes on once everything it waits on is decided
        await world.decide(run_id, request, DecisionKind.APPROVE)
    await world.ended(run_id)
    assert world.effects.count() == 22


async def test_an_expired_plan_refuses_its_steps(tmp_path: Path) -> None:
    world = await plan_world(tmp_path, [reply(*FOUR), reply(text="ok")])
    run_id = await world.start()

    settled = await world.sup.decisions.expire(await world.plan(run_id))
    live = await world.sup.resume(run_id, claimed=settled.epoch)
    assert live is not None
    await world.sup.wait(live)

    assert world.effects.count() == 0
    results = [e.entry for e in await world.rt.store.load(run_id)]
    refused = [e for e in results if isinstance(e, ToolResultEntry)]
    assert len(refused) == 4 and all("expired" in r.output for r in refused)


async def test_a_plan_needs_two_approvers_if_any_step_does(tmp_path: Path) -> None:
    replies = [reply(call("failover", unit="db"), call("restart_unit", unit="a")), reply(text="k")]
    world = await plan_world(tmp_path, replies)
    run_id = await world.start()
    plan = await world.plan(run_id)
    assert plan.approvals_needed == 2

    first = await world.decide(run_id, plan, DecisionKind.APPROVE, by="U0ONE")

    assert first.accepted and "approval 1 of 2" in first.message
    assert world.effects.count() == 0
    assert (await world.decide(run_id, plan, DecisionKind.APPROVE, by="U0TWO")).accepted
    await world.ended(run_id)
    assert world.effects.done == [("failover", "db"), ("restart_unit", "a")]


async def test_a_plan_shows_where_its_steps_values_came_from_and_covers_them(
    tmp_path: Path,
) -> None:
    # payments-db is in list_units' output: the plan's card carries that origin, so approving
    # the plan is a decision that saw it, and the step runs once without a card of its own.
    calls = [call("restart_unit", unit="payments-db"), call("drain_node", unit="node-1")]
    replies = [reply(call("list_units", unit="all")), reply(*calls), reply(text="ok")]
    world = await plan_world(tmp_path, replies)
    run_id = await world.start()
    plan = await world.plan(run_id)
    [origin] = plan.steps[0].origins
    assert (origin.argument, origin.value, origin.tool) == ("unit", "payments-db", "list_units")
    assert plan.steps[1].origins == ()

    await world.decide(run_id, plan, DecisionKind.APPROVE)

    await world.ended(run_id)
    assert world.effects.count("restart_unit") == world.effects.count("drain_node") == 1
    asked = await world.rt.store.list_requests(run_id=run_id, status=None)
    assert [request.kind for request, _status, _decision in asked] == [RequestKind.WAIT_PLAN]


async def test_a_proposed_plans_steps_are_traced_before_they_are_shown(tmp_path: Path) -> None:
    steps = [step("restart_unit", "payments-api"), step("drain_node", "node-1")]
    replies = [
        reply(call("list_units", unit="all")),
        reply(call("propose_plan", summary="restart what the listing shows", steps=steps)),
        reply(text="done"),
    ]
    world = await plan_world(tmp_path, replies)
    run_id = await world.start()
    plan = await world.plan(run_id)
    assert [o.value for o in plan.steps[0].origins] == ["payments-api"]
    assert plan.steps[1].origins == ()


async def test_a_step_shown_without_origins_does_not_cover_a_value_read_since(
    tmp_path: Path,
) -> None:
    # The plan's card showed restart_unit payments-db with no origin: nothing had been read.
    # list_units then prints payments-db; the call copying it asks on a card that says where
    # the value came from, since the plan's approval never saw that.
    steps = [step("restart_unit", "payments-db"), step("drain_node", "node-9")]
    replies = [
        reply(call("propose_plan", summary="restart the db", steps=steps)),
        reply(call("list_units", unit="all")),
        reply(call("restart_unit", unit="payments-db")),
        reply(text="done"),
    ]
    world = await plan_world(tmp_path, replies)
    run_id = await world.start()
    plan = await world.plan(run_id)
    assert plan.steps[0].origins == ()

    await world.decide(run_id, plan, DecisionKind.APPROVE)

    assert world.effects.count("restart_unit") == 0
    (card,) = await world.open(run_id)
    assert card.kind is RequestKind.WAIT_APPROVAL
    assert [(o.value, o.tool) for o in card.origins] == [("payments-db", "list_units")]
    assert "did not show" in card.off_plan
    await world.decide(run_id, card, DecisionKind.APPROVE)
    await world.ended(run_id)
    assert world.effects.count("restart_unit") == 1


async def test_a_proposed_step_shown_with_its_origin_covers_the_later_call(
    tmp_path: Path,
) -> None:
    steps = [step("restart_unit", "payments-api"), step("drain_node", "node-1")]
    replies = [
        reply(call("list_units", unit="all")),
        reply(call("propose_plan", summary="restart what the listing shows", steps=steps)),
        reply(call("restart_unit", unit="payments-api")),
        reply(call("drain_node", unit="node-1")),
        reply(text="done"),
    ]
    world = await plan_world(tmp_path, replies)
    run_id = await world.start()
    await world.decide(run_id, await world.plan(run_id), DecisionKind.APPROVE)

    await world.ended(run_id)
    assert world.effects.count("restart_unit") == world.effects.count("drain_node") == 1
    asked = await world.rt.store.list_requests(run_id=run_id, status=None)
    assert [request.kind for request, _status, _decision in asked] == [RequestKind.WAIT_PLAN]


def test_the_plan_book_says_how_a_look_alike_argument_differs() -> None:
    from bot.domain import Grant, call_digest

    planned = {"unit": "caf\u00e9", "count": 1}
    book = PlanBook()
    digest = call_digest("scale", planned)
    book.honour(
        Grant(
            kind=GrantKind.PLAN_STEP,
            tool="scale",
            digest=digest,
            plan="p",
            step=0,
            arguments=planned,
        )
    )
    # Each differs from the step only in how a value is written; the card says which.
    variants: list[tuple[dict[str, Any], str]] = [
        ({"unit": "caf\u00e9", "count": 1.0}, "`count`: `1.0` vs plan `1`"),
        ({"unit": "caf\u00e9", "count": True}, "`count`: `true` vs plan `1`"),
        ({"unit": "caf\u00e9", "count": "1"}, '`count`: `"1"` vs plan `1`'),
        ({"unit": "cafe\u0301", "count": 1}, '`unit`: `"cafe\\u0301"` vs plan `"caf\\u00e9"`'),
        ({"unit": "\uff43af\u00e9", "count": 1}, '`unit`: `"\\uff43af\\u00e9"` vs plan'),
    ]
    for called, said in variants:
        assert book.cover("scale", call_digest("scale", called)) is None
        assert said in book.difference("scale", called, call_digest("scale", called)), called
