"""What a run shows while it works (the progress message) and at a glance (``/kestrel
status``): its status, why it stopped, what it waits on and its budgets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from adapters.slack.mrkdwn import (
    KIND_NAMES,
    STEP_LIMIT,
    WORKING_LINES,
    SlackMessage,
    checked_blocks,
    code_block,
    context_block,
    escape,
    fit_fallback,
    fit_text,
    inline_code,
    person_or,
    reason_words,
    section_block,
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
    return f"Working… • {fit_text(step, STEP_LIMIT)}" if step else "Working…"


def working_message(lines: Sequence[str]) -> SlackMessage:
    """The run's single status message, updated in place: its last steps so far."""
    shown = [line.strip() for line in lines if line.strip()][-WORKING_LINES:]
    earlier = len([line for line in lines if line.strip()]) - len(shown)
    body = "\n".join(f"• {fit_text(line, STEP_LIMIT)}" for line in shown)
    blocks = [section_block("*Working…*" + (f"\n{body}" if body else ""))]
    if earlier > 0:
        blocks.append(context_block([f"{earlier} earlier step(s) not shown"]))
    text = progress_text(shown[-1]) if shown else "Working…"
    return SlackMessage(text, checked_blocks(blocks))


def status_message(view: RunView) -> SlackMessage:
    """A run at a glance: status (and why it stopped), who asked, what it waits on, budgets."""
    record, state = view.record, view.state
    result = state.result
    status = result.status if result is not None else record.status
    line = f"*Run* {inline_code(record.id)} · *{escape(status.value)}*"
    reason: StopReason | str = result.stop_reason if result is not None else record.stop_reason
    if reason and reason_words(reason) != status.value:
        line += f": {reason_words(reason)}"
    blocks = [section_block(line)]
    if record.prompt.strip():
        blocks.append(section_block(f"> {fit_text(' '.join(record.prompt.split()), 500)}"))
    facts = [
        f"Requested by {person_or(record.requested_by, nobody='nobody recorded')}",
        f"Started {slack_date(record.created_at)}",
    ]
    blocks.append(context_block(facts))
    waiting = view.open_requests
    if waiting:
        rows = []
        for request in waiting[:20]:
            row = f"• {KIND_NAMES[request.kind]} {inline_code(request.tool)}"
            if request.deadline is not None:
                row += f" · expires {slack_date(request.deadline)}"
            rows.append(row)
        if len(waiting) > 20:
            rows.append(f"• and {len(waiting) - 20} more")
        blocks.append(section_block("*Waiting on:*\n" + "\n".join(rows)))
    budgets = _budgets(view.budgets_used)
    if budgets:
        blocks.append(context_block([budgets]))
    if result is not None and result.error.strip():
        blocks.append(section_block(code_block(result.error.strip(), 1000)[0]))
    text = f"Run {escape(record.id)}: {escape(status.value)}"
    return SlackMessage(fit_fallback(text), checked_blocks(blocks))


def _budgets(used: Mapping[str, tuple[float, float]]) -> str:
    return escape(budget_words(used))
