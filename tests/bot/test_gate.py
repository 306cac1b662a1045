"""The confirm gate on its own: small fake tools and prompters, no loop, no store."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from msgspec.structs import replace

from bot.domain import (
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
from bot.run.gate import Gate, GateVerdict
from bot.tools.base import ApprovalPolicy, Tool, ToolContext, ToolFlags, ToolResult

RUN = "run_g"
ARGS = {"svc": "web"}
NO_ONE = "refused: this command needs approval and no one is present"


@dataclass
class FakeTool:
    """A gated tool that must never run here: the gate only decides."""

    name: str = "restart"
    description: str = "Restart a service"
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    flags: ToolFlags = field(default_factory=lambda: ToolFlags(ApprovalPolicy(confirm=True)))

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise AssertionError("the gate never runs a tool")


@dataclass
class FakePrompter:
    """Answers with ``reply(request)`` (``None`` defers) and remembers what it was asked."""

    reply: Callable[[Request], Decision | None] = lambda request: None
    present: bool = True
    asked: list[Request] = field(default_factory=list)

    async def ask(self, request: Request) -> Decision | None:
        self.asked.append(request)
        return self.reply(request)


def answering(kind: DecisionKind, by: str = "ann", text: str = "") -> FakePrompter:
    return FakePrompter(lambda r: Decision(request_id=r.id, kind=kind, by=by, text=text))


def gate(
    prompter: FakePrompter | None = None,
    *,
    expired: bool = False,
    written: tuple[Grant, ...] = (),
    answers: dict[str, Decision] | None = None,
    **kw: Any,
) -> Gate:
    definition = kw.pop("definition", lambda _name: "")
    # Each answer given on the card of FakeTool's call with ARGS.
    shown = {
        call: (answer, call_digest("restart", ARGS)) for call, answer in (answers or {}).items()
    }
    return Gate(
        RequestMaker(RUN, "U0REQ", **kw),
        prompter,
        lambda: expired,
        written,
        shown,
        definition=definition,
    )


async def check(
    g: Gate,
    call_id: str = "c1",
    tool: Tool | None = None,
    arguments: dict[str, Any] | None = None,
    original: Tool | None = None,
) -> GateVerdict:
    effective = tool or FakeTool()
    return await g.check(
        call_id, original or effective, effective, ARGS if arguments is None else arguments
    )


def one_shot(call_id: str = "c1", tool: str = "restart", arguments: dict[str, Any] = ARGS) -> Grant:
    digest = call_digest(tool, arguments)
    return Grant(kind=GrantKind.ONE_SHOT, tool=tool, call_id=call_id, digest=digest, by="ann")


STANDING = Grant(kind=GrantKind.STANDING, tool="restart", by="ann")


# -- refusals before anyone is asked ------------------------------------------------------------


async def test_no_prompter_refuses() -> None:
    assert await check(gate()) == GateVerdict(False, NO_ONE)


async def test_a_prompter_that_is_not_present_refuses_without_being_asked() -> None:
    prompter = answering(DecisionKind.APPROVE)
    prompter.present = False

    assert await check(gate(prompter)) == GateVerdict(False, NO_ONE)
    assert prompter.asked == []


async def test_past_the_deadline_refuses_without_asking() -> None:
    prompter = answering(DecisionKind.APPROVE)

    verdict = await check(gate(prompter, expired=True))

    assert verdict == GateVerdict(False, "refused: the run's deadline has passed")
    assert prompter.asked == []


async def test_the_deadline_is_checked_at_each_call() -> None:
    late = False
    g = Gate(RequestMaker(RUN, "U0REQ"), answering(DecisionKind.APPROVE_ALWAYS), lambda: late)

    assert (await check(g)).allowed
    late = True
    assert not (await check(g)).allowed  # even a standing grant does not outlive the deadline


async def test_a_deny_flag_refuses_even_with_a_standing_grant() -> None:
    prompter = answering(DecisionKind.APPROVE)
    denied = FakeTool(flags=ToolFlags(ApprovalPolicy(confirm=True, deny=True)))

    verdict = await check(gate(prompter, written=(STANDING,)), tool=denied)

    assert verdict == GateVerdict(False, "refused: policy never allows restart")
    assert prompter.asked == []


async def test_a_deny_flag_on_the_original_tool_holds_for_its_effective_form() -> None:
    original = FakeTool(flags=ToolFlags(ApprovalPolicy(confirm=True, deny=True)))
    effective = FakeTool(name="restart_v2")

    verdict = await check(gate(answering(DecisionKind.APPROVE)), tool=effective, original=original)

    assert verdict == GateVerdict(False, "refused: policy never allows restart_v2")


# -- grants -------------------------------------------------------------------------------------


async def test_a_standing_grant_covers_any_arguments_of_its_tool_only() -> None:
    prompter = FakePrompter()
    g = gate(prompter, written=(STANDING,))

    assert await check(g, arguments={"svc": "db"}) == GateVerdict(True)
    assert await check(g, "c2", arguments={}) == GateVerdict(True)
    assert prompter.asked == []

    other = await check(g, "c3", tool=FakeTool(name="drop_table"))
    assert not other.allowed and other.request is not None
    assert [r.tool for r in prompter.asked] == ["drop_table"]


async def test_grants_cover_a_tool_only_as_it_was_defined_when_given() -> None:
    # "Approve always" and a card's approval, given while restart ran one command, cover
    # nothing once it runs another (a catalog edited, the run resumed past the change).
    given = gate(answering(DecisionKind.APPROVE_ALWAYS), definition=lambda _name: "argv-1")
    assert await check(given) == GateVerdict(True)
    approve_always = given.flush()
    on_card = gate(answering(DecisionKind.APPROVE), definition=lambda _name: "argv-1")
    assert await check(on_card, "c9") == GateVerdict(True)
    card = on_card.flush()

    for written, call_id in ((approve_always, "c1"), (card, "c9")):
        prompter = FakePrompter()
        same = gate(prompter, written=tuple(written), definition=lambda _name: "argv-1")
        assert await check(same, call_id) == GateVerdict(True)
        edited = gate(prompter, written=tuple(written), definition=lambda _name: "argv-2")
        verdict = await check(edited, call_id)
        assert not verdict.allowed and verdict.request is not None
        assert [r.call_id for r in prompter.asked] == [call_id]


async def test_a_one_shot_grant_covers_its_call_and_digest_only() -> None:
    prompter = FakePrompter()
    g = gate(prompter, written=(one_shot("c1"),))

    assert await check(g, "c1") == GateVerdict(True)
    assert prompter.asked == []

    changed = await check(g, "c1", arguments={"svc": "db"})  # same call, other arguments
    elsewhere = await check(g, "c2")  # same arguments, other call
    assert changed.request is not None and elsewhere.request is not None
    assert [(r.call_id, r.arguments) for r in prompter.asked] == [
        ("c1", {"svc": "db"}),
        ("c2", ARGS),
    ]


async def test_a_one_shot_grant_is_bound_to_the_effective_tools_digest() -> None:
    # The digest is of the tool that will run: a grant for the original name does not cover it.
    prompter = FakePrompter()
    g = gate(prompter, written=(one_shot("c1", tool="restart"),))

    verdict = await check(g, "c1", tool=FakeTool(name="restart_v2"), original=FakeTool())

    assert verdict.request is not None
    assert verdict.request.digest == call_digest("restart_v2", ARGS)


async def test_restored_grants_never_run_a_gated_call_with_no_prompter() -> None:
    g = gate(None, written=(STANDING, one_shot("c1")))

    assert await check(g, "c1") == GateVerdict(False, NO_ONE)
    assert await check(g, "c2", arguments={"svc": "db"}) == GateVerdict(False, NO_ONE)


async def test_restored_grants_never_run_a_gated_call_when_no_one_is_present() -> None:
    absent = FakePrompter(present=False)
    g = gate(absent, written=(STANDING, one_shot("c1")))

    assert await check(g, "c1") == GateVerdict(False, NO_ONE)
    assert absent.asked == []


async def test_a_restored_grant_is_honoured_once_someone_is_present() -> None:
    prompter = FakePrompter()

    assert await check(gate(prompter, written=(one_shot("c1"),)), "c1") == GateVerdict(True)
    assert prompter.asked == []


# -- asking -------------------------------------------------------------------------------------


async def test_approve_allows_and_stages_a_one_shot_grant_for_that_digest() -> None:
    prompter = answering(DecisionKind.APPROVE, by="ann")
    g = gate(prompter)

    assert await check(g, "c1") == GateVerdict(True)
    assert g.flush() == [one_shot("c1")]

    assert await check(g, "c1") == GateVerdict(True)  # honoured at once, without asking again
    assert len(prompter.asked) == 1
    assert await check(g, "c1", arguments={"svc": "db"}) == GateVerdict(True)
    assert len(prompter.asked) == 2  # other arguments: asked again


async def test_approve_always_allows_and_stages_a_standing_grant() -> None:
    prompter = answering(DecisionKind.APPROVE_ALWAYS, by="bob")
    g = gate(prompter)

    assert await check(g, "c1") == GateVerdict(True)
    assert await check(g, "c2", arguments={"svc": "db"}) == GateVerdict(True)

    assert len(prompter.asked) == 1
    assert g.flush() == [Grant(kind=GrantKind.STANDING, tool="restart", by="bob")]


async def test_deny_refuses_with_who_and_why() -> None:
    prompter = answering(DecisionKind.DENY, by="bob", text="not during the freeze")
    g = gate(prompter)

    verdict = await check(g)

    assert verdict == GateVerdict(False, "denied by bob: not during the freeze")
    assert g.flush() == []
    assert not (await check(g)).allowed and len(prompter.asked) == 2  # a denial is not kept


async def test_a_bare_deny_says_only_denied() -> None:
    assert await check(gate(answering(DecisionKind.DENY, by=""))) == GateVerdict(False, "denied")


async def test_an_expired_request_refuses() -> None:
    verdict = await check(gate(answering(DecisionKind.EXPIRED)))

    assert verdict == GateVerdict(
        False, "refused: the approval request expired before anyone answered"
    )


async def test_no_answer_yet_defers_on_a_request_for_that_exact_call() -> None:
    prompter = FakePrompter()
    tool = FakeTool(description="Restart a service (drains first)")
    g = gate(prompter)

    verdict = await check(g, "c7", tool=tool, arguments={"svc": "web", "force": True})

    assert not verdict.allowed and verdict.reason == "waiting for approval"
    request = verdict.request
    assert request is not None and prompter.asked == [request]
    assert (request.run_id, request.kind, request.call_id, request.tool) == (
        RUN,
        RequestKind.WAIT_APPROVAL,
        "c7",
        "restart",
    )
    assert request.arguments == {"svc": "web", "force": True}
    assert request.digest == call_digest("restart", {"force": True, "svc": "web"})
    assert (request.prompt, request.requested_by, request.approvals_needed) == (
        "Restart a service (drains first)",
        "U0REQ",
        1,
    )
    assert g.flush() == []


async def test_a_request_needs_the_tools_approvals_and_at_least_one() -> None:
    async def needed(approvals: int) -> int:
        tool = FakeTool(flags=ToolFlags(ApprovalPolicy(confirm=True, approvals=approvals)))
        verdict = await check(gate(FakePrompter()), tool=tool)
        assert verdict.request is not None
        return verdict.request.approvals_needed

    assert [await needed(n) for n in (0, 1, 2, 3)] == [1, 1, 2, 3]


async def test_the_request_is_stamped_before_it_is_asked() -> None:
    prompter = FakePrompter()

    def stamp(request: Request) -> Request:
        return replace(request, id="req_stamped", options=("approve", "deny"))

    verdict = await check(gate(prompter, stamp=stamp))

    assert verdict.request is not None and verdict.request.id == "req_stamped"
    assert [r.id for r in prompter.asked] == ["req_stamped"]


# -- answers from ``Decisions`` ----------------------------------------------------------------


async def test_a_supplied_answer_decides_without_a_prompter() -> None:
    answer = Decision(request_id="req_1", kind=DecisionKind.APPROVE, by="ann")
    g = gate(None, answers={"c1": answer})

    assert await check(g, "c1") == GateVerdict(True)
    assert g.flush() == [one_shot("c1")]
    assert await check(g, "c2") == GateVerdict(False, NO_ONE)  # answers are per call


async def test_a_supplied_answer_is_used_instead_of_asking() -> None:
    prompter = answering(DecisionKind.APPROVE)
    answer = Decision(request_id="req_1", kind=DecisionKind.DENY, by="bob", text="no")

    verdict = await check(gate(prompter, answers={"c1": answer}), "c1")

    assert verdict == GateVerdict(False, "denied by bob: no")
    assert prompter.asked == []


async def test_a_supplied_answer_does_not_outlive_the_deadline() -> None:
    answer = Decision(request_id="req_1", kind=DecisionKind.APPROVE)

    verdict = await check(gate(None, expired=True, answers={"c1": answer}), "c1")

    assert verdict == GateVerdict(False, "refused: the run's deadline has passed")


async def test_an_approval_answers_only_the_call_its_card_showed() -> None:
    # A hook that changed the call since, or a tool edited since: the card showed another call.
    approved = Decision(request_id="req_1", kind=DecisionKind.APPROVE, by="ann")
    other = call_digest("restart", {"svc": "payments"})
    prompter = FakePrompter()
    g = Gate(RequestMaker(RUN, "U0REQ"), prompter, lambda: False, answers={"c1": (approved, other)})

    verdict = await check(g, "c1")

    assert not verdict.allowed and verdict.request is not None
    assert verdict.request.off_plan == "asked again: ann approved restart as another card showed it"
    assert g.flush() == []
    denied = Decision(request_id="req_1", kind=DecisionKind.DENY, by="ann")
    g = Gate(RequestMaker(RUN, "U0REQ"), prompter, lambda: False, answers={"c1": (denied, other)})
    assert not (await check(g, "c1")).allowed  # a refusal stands, whatever it was shown


async def test_a_plans_step_covers_its_tool_only_as_it_was_when_approved() -> None:
    definitions = {"restart": "argv-1"}
    prompter = FakePrompter()
    g = gate(prompter, definition=definitions.__getitem__)
    digest = call_digest("restart", ARGS, "argv-1")
    steps = (PlanStep(tool="restart", arguments=ARGS, digest=digest),)
    plan = Request(run_id=RUN, kind=RequestKind.WAIT_PLAN, call_id="c0", tool="propose_plan")
    g.settle_plan(
        replace(plan, steps=steps), Decision(request_id=plan.id, kind=DecisionKind.APPROVE)
    )

    definitions["restart"] = "argv-2"  # the catalog edited, the run resumed past it
    edited = await check(g, "c1")
    assert not edited.allowed and edited.request is not None
    said = "off the approved plan: step 1 was approved for restart as it was then"
    assert edited.request.off_plan == said
    definitions["restart"] = "argv-1"
    assert await check(g, "c2") == GateVerdict(True)  # as approved: the step covers it


# -- flush --------------------------------------------------------------------------------------


async def test_flush_hands_staged_grants_over_once_in_order() -> None:
    decisions = iter([DecisionKind.APPROVE, DecisionKind.APPROVE_ALWAYS])
    prompter = FakePrompter(lambda r: Decision(request_id=r.id, kind=next(decisions), by="ann"))
    g = gate(prompter)
    await check(g, "c1")
    await check(g, "c2", tool=FakeTool(name="deploy"))

    first = g.flush()

    assert first == [one_shot("c1"), Grant(kind=GrantKind.STANDING, tool="deploy", by="ann")]
    assert g.flush() == []
    assert await check(g, "c3", tool=FakeTool(name="deploy")) == GateVerdict(True)  # still honoured


async def test_restored_grants_are_never_flushed_again() -> None:
    g = gate(FakePrompter(), written=(STANDING, one_shot("c9")))

    assert await check(g, "c1") == GateVerdict(True)
    assert g.flush() == []
