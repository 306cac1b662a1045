"""Every call off an approved plan is refused the plan's grant: 44 variants of a 4-step plan.

The plan: drain node-1, then restart payments-api, payments-db and payments-worker, approved
once. Order matters, always: a plan's steps run in its order, so a call is covered only by the
first step of its plan not yet used, with exactly its tool and arguments (the same digest).
Each variant makes the first ``done`` steps as planned, then one call that is off the plan; it
must not run, and a normal approval card must open for it, saying how it differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.domain import DecisionKind, RequestKind
from tests.fakes.plans import plan_world, step
from tests.fakes.runtime import call, reply

PLAN = [
    ("drain_node", "node-1"),
    ("restart_unit", "payments-api"),
    ("restart_unit", "payments-db"),
    ("restart_unit", "payments-worker"),
]
OTHER_TOOL = {"drain_node": "restart_unit", "restart_unit": "drain_node"}


@dataclass(frozen=True)
class Variant:
    """The first ``done`` steps as planned, then ``tool`` with ``arguments``."""

    name: str
    done: int
    tool: str
    arguments: dict[str, Any]


def _variants() -> list[Variant]:
    found = []
    for k, (tool, unit) in enumerate(PLAN):
        # The same tool with another value of an argument.
        for other in ("payments-dbx", unit.upper(), f"{unit} ", "x", f"{unit};rm -rf /"):
            found.append(Variant(f"changed-{k}-{other!r}", k, tool, {"unit": other}))
        # An extra argument, even one that says what the default would.
        for node in ("node-2", "node-1"):
            found.append(Variant(f"extra-{k}-{node}", k, tool, {"unit": unit, "node": node}))
        # Another gated tool with the step's arguments.
        found.append(Variant(f"other-tool-{k}", k, OTHER_TOOL[tool], {"unit": unit}))
        # A later step before its turn.
        for j in range(k + 1, len(PLAN)):
            later_tool, later_unit = PLAN[j]
            found.append(Variant(f"reordered-{k}-{j}", k, later_tool, {"unit": later_unit}))
        # The step just used, once more.
        if k:
            last_tool, last_unit = PLAN[k - 1]
            found.append(Variant(f"repeated-{k}", k, last_tool, {"unit": last_unit}))
    # One more call after every step ran.
    for tool, unit in PLAN[:3]:
        found.append(Variant(f"after-all-{tool}-{unit}", 4, tool, {"unit": unit}))
    return found


VARIANTS = _variants()


def test_there_are_at_least_forty_variants() -> None:
    assert len(VARIANTS) >= 40
    assert len({v.name for v in VARIANTS}) == len(VARIANTS)


def script(variant: Variant) -> list[dict[str, Any]]:
    """Propose the plan; then, approved, make ``done`` steps and the variant's call at once."""
    steps = [step(tool, unit) for tool, unit in PLAN]
    planned = [call(tool, unit=unit) for tool, unit in PLAN[: variant.done]]
    return [
        reply(call("propose_plan", summary="drain then restart", steps=steps)),
        reply(*planned, call(variant.tool, **variant.arguments)),
        reply(text="done"),
    ]


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
async def test_an_off_plan_call_is_never_covered(tmp_path: Path, variant: Variant) -> None:
    world = await plan_world(tmp_path, script(variant))
    run_id = await world.start()
    await world.decide(run_id, await world.plan(run_id), DecisionKind.APPROVE)

    # The planned steps ran; the variant's call did not run under the plan's grant...
    assert world.effects.done == PLAN[: variant.done]
    # ...and waits on a normal card of its own, which says how it differs from the plan.
    (card,) = await world.open(run_id)
    assert card.kind is RequestKind.WAIT_APPROVAL
    assert (card.tool, card.arguments) == (variant.tool, variant.arguments)
    assert card.off_plan.startswith("off the approved plan"), card.off_plan
    await world.rt.store.close()


async def test_the_plan_itself_runs_under_one_decision(tmp_path: Path) -> None:
    steps = [step(tool, unit) for tool, unit in PLAN]
    replies = [
        reply(call("propose_plan", summary="drain then restart", steps=steps)),
        reply(*[call(tool, unit=unit) for tool, unit in PLAN]),
        reply(text="done"),
    ]
    world = await plan_world(tmp_path, replies)
    run_id = await world.start()

    await world.decide(run_id, await world.plan(run_id), DecisionKind.APPROVE)

    await world.ended(run_id)
    assert world.effects.done == PLAN
    requests = await world.rt.store.list_requests(run_id=run_id, status=None)
    assert len(requests) == 1
    await world.rt.store.close()


@pytest.mark.parametrize(
    ("variant", "words"),
    [
        (Variant("changed", 1, "restart_unit", {"unit": "payments-dbx"}), "`payments-dbx` vs plan"),
        (Variant("reordered", 0, "restart_unit", {"unit": "payments-api"}), "run in order"),
        (Variant("after", 4, "drain_node", {"unit": "node-1"}), "every step of it has run"),
        (Variant("other", 1, "drain_node", {"unit": "node-2"}), "no step left calls drain_node"),
        (
            Variant("repeated", 2, "restart_unit", {"unit": "payments-api"}),
            "this is step 2 (restart_unit) once more; it has run",
        ),
    ],
    ids=["changed", "reordered", "after", "other", "repeated"],
)
async def test_the_card_says_how_the_call_differs(
    tmp_path: Path, variant: Variant, words: str
) -> None:
    world = await plan_world(tmp_path, script(variant))
    run_id = await world.start()
    await world.decide(run_id, await world.plan(run_id), DecisionKind.APPROVE)

    (card,) = await world.open(run_id)

    assert words in card.off_plan, card.off_plan
    await world.rt.store.close()
