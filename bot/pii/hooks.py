"""The PII guard as hooks: UserPromptSubmit and PostToolUse, composed after the caller's."""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict

from bot.domain import ToolCall
from bot.events import AdvisoryEvent, EventSink
from bot.hooks import HookContext, Hooks, PromptVerdict
from bot.pii.guard import PiiGuard, PiiMode, ScanOutcome

log = logging.getLogger("kestrel.pii")

# What each guard has warned each run about: "hit" (sensitive data found) and "failure" (a scan
# failed), each at most once per run. A run builds fresh hooks whenever its task starts (start,
# every resume, a cancel or panic report), so the memory cannot live in the hooks; it is kept
# per guard, for the most recently warned runs, within this process.
_WARNED: weakref.WeakKeyDictionary[PiiGuard, OrderedDict[tuple[str, str], None]] = (
    weakref.WeakKeyDictionary()
)
_WARNED_KEPT = 4096


def _first_warning(guard: PiiGuard, run_id: str, about: str) -> bool:
    """Whether this run has not been warned ``about`` this yet (and note that it now is)."""
    warned = _WARNED.setdefault(guard, OrderedDict())
    key = (run_id, about)
    if key in warned:
        warned.move_to_end(key)
        return False
    warned[key] = None
    if len(warned) > _WARNED_KEPT:
        warned.popitem(last=False)
    return True


class _RunGuard:
    """One run's view of the guard: it warns the operator once per run, not once per hit."""

    def __init__(self, guard: PiiGuard, events: EventSink) -> None:
        self._guard = guard
        self._events = events

    async def prompt(self, text: str, ctx: HookContext) -> PromptVerdict:
        outcome = self._guard.scan_prompt(text)
        self._report(outcome, ctx, "the prompt")
        if not outcome.allowed:
            return PromptVerdict(allow=False, reason="it contains sensitive data")
        return PromptVerdict(text=outcome.text)

    async def output(self, call: ToolCall, output: str, ctx: HookContext) -> str:
        outcome = self._guard.scan_output(output)
        self._report(outcome, ctx, f"the output of {call.name}")
        return outcome.text

    def _report(self, outcome: ScanOutcome, ctx: HookContext, what: str) -> None:
        if outcome.error:
            # Every failure is logged; the operator is told the first cause, once per run.
            log.warning("run %s: PII scan of %s failed: %s", ctx.run_id, what, outcome.error)
            if _first_warning(self._guard, ctx.run_id, "failure"):
                self._advise(
                    ctx, f"the PII scan of {what} failed ({outcome.error}); it was withheld"
                )
            return
        if outcome.hits and _first_warning(self._guard, ctx.run_id, "hit"):
            kinds = sorted({hit.entity_type for hit in outcome.hits})
            verb = "redacted" if self._guard.mode is PiiMode.REDACT else "withheld"
            self._advise(ctx, f"sensitive data ({', '.join(kinds)}) in {what} was {verb}")

    def _advise(self, ctx: HookContext, text: str) -> None:
        self._events.emit(AdvisoryEvent(ctx.run_id, text, source="pii"))


def pii_hooks(guard: PiiGuard, events: EventSink) -> Hooks:
    """Fresh guard hooks for one run; none at all when the mode is off."""
    if guard.mode is PiiMode.OFF:
        return Hooks()
    run_guard = _RunGuard(guard, events)
    return Hooks(user_prompt_submit=[run_guard.prompt], post_tool_use=[run_guard.output])
