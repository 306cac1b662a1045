"""Plans on real parts: a gated ``restart_unit`` that counts what it ran, ``propose_plan``, a
run that suspends on its plan, and deciding it through the chat service."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bot.chat.service import ChatService, Decided
from bot.domain import TERMINAL_STATUSES, DecisionKind, Request, RequestKind
from bot.journal.fold import RunState, fold
from bot.people.policy import Actor, Policy, PolicyRules
from bot.prompter import DeferringPrompter, Prompter
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from bot.tools.base import Tool
from bot.tools.propose_plan import propose_plan_tool
from bot.tools.python import function_tool
from tests.fakes.runtime import Recorder, make_runtime
from tests.fakes.waiting import until

REQUESTER = "U0REQ"
APPROVER = "U0APPROVER"


class Unit(BaseModel):
    """A unit to act on."""

    unit: str
    node: str = "node-1"


@dataclass
class Effects:
    """Every effect the plan tools took, in order: (tool, unit)."""

    done: list[tuple[str, str]] = field(default_factory=list)

    def count(self, tool: str = "") -> int:
        """How many effects (of ``tool``, or of any)."""
        return sum(1 for name, _ in self.done if not tool or name == tool)


def plan_tools(effects: Effects) -> list[Tool]:
    """restart_unit and drain_node (gated), failover (two approvers), list_units (not), and
    propose_plan."""

    @function_tool(name="restart_unit", confirm=True, idempotent=False)
    async def restart_unit(args: Unit) -> str:
        """Restart one unit."""
        effects.done.append(("restart_unit", args.unit))
        return f"restarted {args.unit}"

    @function_tool(name="drain_node", confirm=True, idempotent=False)
    async def drain_node(args: Unit) -> str:
        """Drain a node."""
        effects.done.append(("drain_node", args.unit))
        return f"drained {args.unit}"

    @function_tool(name="failover", confirm=True, idempotent=False, approvals=2)
    async def failover(args: Unit) -> str:
        """Fail a unit over (two approvers)."""
        effects.done.append(("failover", args.unit))
        return f"failed over {args.unit}"

    @function_tool(name="list_units", idempotent=True)
    async def list_units(args: Unit) -> str:
        """List units."""
        effects.done.append(("list_units", args.unit))
        return "payments-api payments-db"

    return [restart_unit, drain_node, failover, list_units, propose_plan_tool()]


def step(tool: str, unit: str, why: str = "") -> dict[str, Any]:
    """One step of propose_plan's arguments."""
    return {"tool": tool, "arguments": {"unit": unit}, "why": why}


@dataclass
class PlanWorld:
    """A runtime with the plan tools, its supervisor, and what happened."""

    rt: Runtime
    sup: Supervisor
    effects: Effects
    events: Recorder

    @property
    def chat(self) -> ChatService:
        """The chat service people decide through."""
        return ChatService(self.sup)

    async def start(self, prompter: Prompter | None = None) -> str:
        """Start a run (a deferring prompter unless told); its id."""
        live = await self.sup.start_turn(
            "fix payments", requested_by=REQUESTER, prompter=prompter or DeferringPrompter()
        )
        await self.sup.wait(live)
        return live.run_id

    async def open(self, run_id: str) -> list[Request]:
        """The run's open requests, oldest first."""
        return [r for r, _s, _d in await self.rt.store.list_requests(run_id=run_id)]

    async def plan(self, run_id: str) -> Request:
        """The run's one open plan request."""
        plans = [r for r in await self.open(run_id) if r.kind is RequestKind.WAIT_PLAN]
        assert len(plans) == 1, plans
        return plans[0]

    async def decide(
        self, run_id: str, request: Request, kind: DecisionKind, by: str = APPROVER, text: str = ""
    ) -> Decided:
        """Decide ``request`` as ``by``; waits for the run to stop again if it resumed."""
        decided = await self.chat.decide(run_id, request.id, kind, user=Actor(by), text=text)
        if decided.resumed is not None:
            await self.sup.wait(decided.resumed)
        return decided

    async def state(self, run_id: str) -> RunState:
        """The run as its journal tells it."""
        return fold(await self.rt.store.load(run_id), run_id)

    async def ended(self, run_id: str) -> RunState:
        """The run's state once it ended."""
        await until(lambda: self._ended(run_id))
        return await self.state(run_id)

    async def _ended(self, run_id: str) -> bool:
        return (await self.rt.store.get_run(run_id)).status in TERMINAL_STATUSES

    async def audit_actions(self, run_id: str) -> list[str]:
        """The audit's actions for the run, in order."""
        return [str(row.action) for row in reversed(await self.rt.store.list_audit(run_id=run_id))]


async def plan_world(
    tmp_path: Path,
    replies: Sequence[Mapping[str, Any]],
    approvers: dict[str, list[str]] | None = None,
) -> PlanWorld:
    """A runtime on a fresh SQLite file with the plan tools and ``approvers`` as the policy."""
    effects = Effects()
    rt, events = await make_runtime(tmp_path / "k.db", replies, plan_tools(effects))
    if approvers is not None:
        rt.policy = Policy(PolicyRules(approvers=approvers))
    return PlanWorld(rt, Supervisor(rt), effects, events)
