"""The built-in ``propose_plan`` tool: the model shows the calls it means to make before acting,
and people approve them once, each step bound to its tool and exact arguments."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from bot.domain import RequestKind
from bot.tools.base import Deferral, Tool, ToolContext, ToolFlags, ToolResult, ToolTraits

PROPOSE_PLAN: Final = "propose_plan"
# More steps than this is not a plan anyone reads on a card.
MAX_STEPS: Final = 20

_STEP = {
    "type": "object",
    "properties": {
        "tool": {"type": "string", "description": "The tool this step calls."},
        "arguments": {"type": "object", "description": "The exact arguments of the call."},
        "why": {"type": "string", "description": "Why this step, in one sentence."},
    },
    "required": ["tool", "arguments"],
    "additionalProperties": False,
}
PARAMETERS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "description": "What the plan does, in one sentence."},
        "steps": {"type": "array", "items": _STEP, "minItems": 1, "maxItems": MAX_STEPS},
    },
    "required": ["summary", "steps"],
    "additionalProperties": False,
}
# Operator-paced like a question: no tool timeout cancels people reading the plan.
_FLAGS = ToolFlags(traits=ToolTraits(operator_paced=True, idempotent=True, needs_prompter=True))


class ProposePlanTool(msgspec.Struct, frozen=True):
    """Asks people to approve several calls at once; the loop makes and decides the plan."""

    name: str = PROPOSE_PLAN
    description: str = (
        "Before making several calls that need approval, propose them as one plan: people "
        "approve the plan once, and each step then runs exactly as proposed, in order. A call "
        "that differs from every step needs its own approval."
    )
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: PARAMETERS)
    flags: ToolFlags = _FLAGS

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult | Deferral:
        """Defer on a ``wait_plan`` request (the loop checks the steps against its tool set)."""
        if ctx.prompter is None or not ctx.prompter.present:
            return ToolResult("no one is present to approve a plan in this run", is_error=True)
        return Deferral(RequestKind.WAIT_PLAN, str(arguments["summary"]))


def propose_plan_tool() -> ProposePlanTool:
    """The ``propose_plan`` tool, added with the ask_human tools."""
    return ProposePlanTool()


def human_tools() -> list[Tool]:
    """The tools that need people present: the ask_human questions, then ``propose_plan``."""
    from bot.tools.ask_human import ask_human_tools

    return [*ask_human_tools(), propose_plan_tool()]
