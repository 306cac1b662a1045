"""The origins of one call's arguments in a run, from its folded journal alone: the same on a
resumed run as on the first."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from bot.domain import ArgumentOrigin
from bot.journal.fold import RunState
from bot.llm.base import AssistantMessage, SystemMessage, ToolResultsMessage, UserMessage
from bot.nesting import loads
from bot.tools.base import Tool

# Matching values against outputs is needed from a run's second batch on (no output precedes
# its first): a process that only resumes a run at its first, as ``kestrel runs approve`` on a
# run started so, never imports it.
if TYPE_CHECKING:
    from bot.run.provenance import Output


def consequential(tool: Tool) -> bool:
    """Whether a call of ``tool`` needs its origins known: it is gated, or not idempotent."""
    return tool.flags.approval.confirm or not tool.flags.traits.idempotent


class Tracer(msgspec.Struct):
    """Traces calls of one batch against what the run saw before each of them."""

    state: RunState
    # Whether a tool's output is a person's answer (a question tool), not a tool's.
    answers_people: Callable[[str], bool]
    _catalogs: dict[str, frozenset[str]] = msgspec.field(default_factory=dict)
    # What the run's messages hold (they change only between batches): gathered once.
    _before: tuple[list[Output], list[str]] | None = None

    def origins(
        self, call_id: str, tool: Tool, arguments: dict[str, Any]
    ) -> tuple[ArgumentOrigin, ...]:
        """Where the arguments of call ``call_id`` (to ``tool``) came from, if from tool output."""
        outputs, human = self._sources(call_id)
        if not outputs:
            # No tool has answered yet (a run's first batch): no value can come from one, so
            # the tool's catalog values and the arguments' leaves are never gathered.
            return ()
        from bot.run.provenance import catalog_values, trace

        catalog = self._catalogs.get(tool.name)
        if catalog is None:
            catalog = self._catalogs[tool.name] = catalog_values(tool.parameters)
        trusted = dict(tool.flags.traits.trusted_from)
        return trace(tool.name, arguments, outputs, human, trusted, catalog)

    def _sources(self, call_id: str) -> tuple[list[Output], list[str]]:
        """The outputs and human texts the model had read when it wrote call ``call_id``: the
        run's messages before its reply. The reply's own calls ran after it was written, so
        what they answered steered none of them."""
        del call_id  # every call of one reply was written with the same messages read
        if self._before is None:
            self._before = self._messages()
        return self._before

    def _messages(self) -> tuple[list[Output], list[str]]:
        """The outputs and human texts of the run's messages (earlier batches, the prompt)."""
        outputs: list[Output] = []
        # A person's words reach the run as their question tool's output (below); a decision's
        # own text is not one (a deny reason naming a value must not make it the person's).
        human: list[str] = []
        sent: dict[str, str] = {}
        for message in self.state.messages:
            if isinstance(message, UserMessage | SystemMessage):
                human.append(message.text)
            elif isinstance(message, AssistantMessage):
                sent.update((call.id, call.arguments) for call in message.turn.calls)
            elif isinstance(message, ToolResultsMessage):
                for item in message.results:
                    self._add(outputs, human, item.name, item.call_id, item.output, sent)
        return outputs, human

    def _add(
        self,
        outputs: list[Output],
        human: list[str],
        tool: str,
        call_id: str,
        text: str,
        sent: dict[str, str],
    ) -> None:
        if self.answers_people(tool):
            # A pick among options is the model's words (it may have copied them from a log),
            # chosen by a person who did not see where they came from: not the person's text.
            if not _offers_options(sent.get(call_id, "")):
                human.append(text)
        else:
            from bot.run.provenance import Output

            outputs.append(Output(tool, call_id, text, sent.get(call_id, "")))


def _offers_options(arguments: str) -> bool:
    """Whether a question call (its raw JSON arguments) offered options to pick from."""
    try:
        return bool(loads(arguments).get("options"))
    except (ValueError, AttributeError):
        return False
