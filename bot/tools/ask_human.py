"""The ask_human_* tools: questions to people, answered inline or through ``Decisions``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bot.domain import DecisionKind, RequestKind
from bot.tools.base import Deferral, Tool, ToolContext, ToolFlags, ToolResult

# Operator-paced: a tool timeout would cancel the operator's own question, not a runaway.
_FLAGS = ToolFlags(operator_paced=True, idempotent=True, needs_prompter=True)
_QUESTION = {"type": "string", "description": "The question, in one or two sentences."}
# Shorthands people type for a yes/no question's options.
_ALIASES = {"y": "yes", "n": "no"}


def match_option(answer: str, options: Sequence[str]) -> str | None:
    """The option ``answer`` picks, as the question spells it (any case; y/n for yes/no)."""
    wanted = answer.strip().casefold()
    spelled = {option.strip().casefold(): option for option in options}
    if wanted in spelled:
        return spelled[wanted]
    alias = _ALIASES.get(wanted)
    return spelled.get(alias) if alias else None


def answer_refusal(answer: str, options: Sequence[str]) -> str:
    """Empty when ``answer`` answers a question with these options (any, without); else why."""
    if not options or match_option(answer, options) is not None:
        return ""
    return f"{_quoted(answer)} is not one of the options: answer {_listed(options)}"


def _quoted(text: str, limit: int = 80) -> str:
    """Text in quotation marks for people: one line, cut when long."""
    flat = " ".join(text.split())
    return f"“{flat if len(flat) <= limit else flat[: limit - 1] + '…'}”"


def _listed(options: Sequence[str]) -> str:
    """``“yes” or “no”``; ``“eu”, “us” or “ap”``."""
    quoted = [_quoted(option) for option in options]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


@dataclass(frozen=True)
class AskHumanTool:
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
