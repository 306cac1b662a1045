"""What a run shows while it works (the progress message) and at a glance (``/kestrel
status``): its status, why it stopped, what it waits on and its budgets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from adapters.slack.mrkdwn import (
    _KIND_NAMES,
    STEP_LIMIT,
    WORKING_LINES,
    SlackMessage,
    _checked,
    _code,
    _context,
    _fit,
    _fit_fallback,
    _inline,
    _person,
    _reason,
    _section,
    escape,
    slack_date,
)
from bot.chat.service import RunView
from bot.chat.words import budget_words
from bot.domain import (
    StopReason,
)


def progress_text(step: str) -> str:
    """The one-line status while a run works, e.g. ``Working… • calling `restart_service```.
    ``step`` may use mrkdwn (backticks); it is escaped, so it can mention no one."""
    step = step.strip()
    return f"Working… • {_fit(step, STEP_LIMIT)}" if step else "Working…"


def working_message(lines: Sequence[str]) -> SlackMessage:
    """The run's single status message, updated in place: its last steps so far."""
    shown = [line.strip() for line in lines if line.strip()][-WORKING_LINES:]
    earlier = len([line for line in lines if line.strip()]) - len(shown)
    body = "\n".join(f"• {_fit(line, STEP_LIMIT)}" for line in shown)
    blocks = [_section("*Working…*" + (f"\n{body}" if body else ""))]
    if earlier > 0:
        blocks.append(_context([f"{earlier} earlier step(s) not shown"]))
    text = progress_text(shown[-1]) if shown else "Working…"
    return SlackMessage(text, _checked(blocks))


def status_message(view: RunView) -> SlackMessage:
    """A run at a glance: status (and why it stopped), who asked, what it waits on, budgets."""
    record, state = view.record, view.state
    result = state.result
    status = result.status if result is not None else record.status
    line = f"*Run* {_inline(record.id)} · *{escape(status.value)}*"
    reason: StopReason | str = result.stop_reason if result is not None else record.stop_reason
    if reason and _reason(reason) != status.value:
        line += f": {_reason(reason)}"
    blocks = [_section(line)]
    if record.prompt.strip():
        blocks.append(_section(f"> {_fit(' '.join(record.prompt.split()), 500)}"))
    facts = [
        f"Requested by {_person(record.requested_by, nobody='nobody recorded')}",
        f"Started {slack_date(record.created_at)}",
    ]
    blocks.append(_context(facts))
    waiting = view.open_requests
    if waiting:
        rows = []
        for request in waiting[:20]:
            row = f"• {_KIND_NAMES[request.kind]} {_inline(request.tool)}"
            if request.deadline is not None:
                row += f" · expires {slack_date(request.deadline)}"
            rows.append(row)
        if len(waiting) > 20:
            rows.append(f"• and {len(waiting) - 20} more")
        blocks.append(_section("*Waiting on:*\n" + "\n".join(rows)))
    budgets = _budgets(view.budgets_used)
    if budgets:
        blocks.append(_context([budgets]))
    if result is not None and result.error.strip():
        blocks.append(_section(_code(result.error.strip(), 1000)[0]))
    text = f"Run {escape(record.id)}: {escape(status.value)}"
    return SlackMessage(_fit_fallback(text), _checked(blocks))


def _budgets(used: Mapping[str, tuple[float, float]]) -> str:
    return escape(budget_words(used))
