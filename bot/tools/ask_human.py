"""The ask_human_* tools: questions to people, answered inline or through ``Decisions``."""

from __future__ import annotations

from typing import Any

import msgspec

from bot.domain import DecisionKind, RequestKind
from bot.tools.base import Deferral, Tool, ToolContext, ToolFlags, ToolResult, ToolTraits

# Operator-paced: a tool timeout would cancel the operator's own question, not a runaway.
_FLAGS = ToolFlags(traits=ToolTraits(operator_paced=True, idempotent=True, needs_prompter=True))
_QUESTION = {"type": "string", "description": "The question, in one or two sentences."}


class AskHumanTool(msgspec.Struct, frozen=True):
    """Asks the people in the conversation; operator-paced, so no tool timeout cancels it."""

    name: str
    description: str
    parameters: dict[str, Any]
    flags: ToolFlags = _FLAGS

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult | Deferral:
        """Ask now if someone can answer now; otherwise defer on a ``wait_user`` request."""
        question = str(arguments["question"])
        options = self._options(arguments)
        if ctx.prompter is None or not ctx.prompter.present:
            return ToolResult("no one is present to answer questions in this run", is_error=True)
        request = ctx.request(
            RequestKind.WAIT_USER, self.name, arguments, prompt=question, options=options
        )
        decision = await ctx.prompter.ask(request)
        if decision is None:
            return Deferral(RequestKind.WAIT_USER, question, options, request.id)
        if decision.kind is DecisionKind.EXPIRED:
            return ToolResult("no answer before the deadline")
        if not options:
            return ToolResult(decision.text or "(empty answer)")
        from bot.options import match_option  # answered here: a person is present

        picked = match_option(decision.text, options)
        if picked is None:
            # A question with options takes one of them only: anything else leaves it open,
            # for an answer ``Decisions`` checks (``kestrel runs answer``, a chat button).
            return Deferral(RequestKind.WAIT_USER, question, options, request.id)
        return ToolResult(picked)

    def _options(self, arguments: dict[str, Any]) -> tuple[str, ...]:
        if self.name == "ask_human_confirm":
            return ("yes", "no")
        return tuple(str(option) for option in arguments.get("options", ()))


def ask_human_tools() -> list[Tool]:
    """The three question tools added when human_in_the_loop is on."""
    return [
        AskHumanTool(
            "ask_human_input",
            "Ask the people in this conversation a free-text question and wait for the answer.",
            {"type": "object", "properties": {"question": _QUESTION}, "required": ["question"]},
        ),
        AskHumanTool(
            "ask_human_select",
            "Ask the people in this conversation to pick one of several options.",
            {
                "type": "object",
                "properties": {
                    "question": _QUESTION,
                    "options": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                },
                "required": ["question", "options"],
            },
        ),
        AskHumanTool(
            "ask_human_confirm",
            "Ask the people in this conversation a yes/no question.",
            {"type": "object", "properties": {"question": _QUESTION}, "required": ["question"]},
        ),
    ]
