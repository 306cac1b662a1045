"""Request cards: an approval, a question or an uncertain effect, open or closed, as a
Slack message; pure, like every builder here (see ``adapters.slack.mrkdwn``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, assert_never

from slack_sdk.models.blocks import (
    ConfirmObject,
    MarkdownTextObject,
    Option,
    PlainTextObject,
    StaticSelectElement,
)

from adapters.slack import ids
from adapters.slack.mrkdwn import (
    BUTTONS_PER_ACTIONS,
    CARD_ARGUMENTS_LIMIT,
    CONFIRM_TEXT_LIMIT,
    CONTEXT_ELEMENTS_LIMIT,
    DECISION_TEXT_LIMIT,
    OPTION_TEXT_LIMIT,
    PROMPT_LIMIT,
    REASON_LIMIT,
    SECTION_TEXT_LIMIT,
    SELECT_OPTIONS_LIMIT,
    SlackMessage,
    actions_block,
    arguments_section,
    button_element,
    checked_blocks,
    code_block,
    context_block,
    escape,
    fit_fallback,
    fit_text,
    inline_code,
    person_or,
    plain_text,
    principals_text,
    quoted,
    section_block,
    slack_date,
)
from bot.chat.cards import (
    PLAN_BINDING,
    PLAN_BUTTONS,
    closing,
    listed,
    off_plan_words,
    options_shown,
    plan_steps,
)
from bot.chat.words import ORIGINS_TITLE, Origin, origin_lines
from bot.domain import (
    Decision,
    DecisionKind,
    Request,
    RequestKind,
    RequestStatus,
)
from bot.text import flattened, printable

# A section holds 3,000 characters: this many origins of pieces this long always fit.
ORIGINS_SHOWN: Final = 5
ORIGIN_PIECE_LIMIT: Final = 120


@dataclass(frozen=True)
class ClosedCard:
    """How a request closed, for the card's final form: its status and the decision, if any."""

    status: RequestStatus
    decision: Decision | None = None
    approvers: tuple[str, ...] = ()  # of a request that needed several, in order


def request_card(
    request: Request,
    *,
    reason: str,
    may_answer: Sequence[str],
    closed: ClosedCard | None = None,
) -> SlackMessage:
    """The card of an open request (approval, question, uncertain effect) with its buttons,
    or, given ``closed``, its final form: the same facts, no buttons, and how it closed."""
    match request.kind:
        case RequestKind.WAIT_APPROVAL:
            return _approval_card(request, reason, may_answer, closed)
        case RequestKind.WAIT_USER:
            return _question_card(request, may_answer, closed)
        case RequestKind.WAIT_EFFECT:
            return _effect_card(request, may_answer, closed)
        case RequestKind.WAIT_PLAN:
            return _plan_card(request, may_answer, closed)
        case _:
            assert_never(request.kind)


def _facts(request: Request, who: str, may_answer: Sequence[str], open_: bool) -> list[str]:
    facts = [f"Requested by {person_or(request.requested_by, nobody='the run')}"]
    if request.deadline is not None and open_:
        facts.append(f"Expires {slack_date(request.deadline)}")
    facts.append(f"{who}: {principals_text(may_answer)}")
    return facts


def _approval_card(
    request: Request, reason: str, may_answer: Sequence[str], closed: ClosedCard | None
) -> SlackMessage:
    tool = inline_code(request.tool)
    title = "Approval needed" if closed is None else "Approval requested"
    arguments, cut = arguments_section(request.arguments)
    blocks = [section_block(f"*{title}:* {tool}"), arguments]
    if request.origins:
        blocks.append(_origins_section(request))
    if reason.strip():
        why = quoted(fit_text(reason.strip(), REASON_LIMIT))
        blocks.append(section_block(f"*Why:*\n{why}"))
    if request.off_plan:
        blocks.append(section_block(f":warning: {fit_text(off_plan_words(request), REASON_LIMIT)}"))
    facts = _facts(request, "May approve", may_answer, closed is None)
    if request.approvals_needed > 1:
        facts.append(f"Needs {request.approvals_needed} approvals from different people")
    blocks.append(context_block(facts))
    if closed is None:
        buttons = [button_element("Approve once", ids.APPROVE_ONCE, request.id, "primary")]
        if request.approvals_needed <= 1:  # the policy refuses a standing grant otherwise
            buttons.append(button_element("Approve for this run", ids.APPROVE_RUN, request.id))
        buttons.append(button_element("Deny", ids.DENY, request.id, "danger"))
        if cut:
            buttons.append(button_element("Full arguments", ids.SHOW_ARGUMENTS, request.id))
        blocks.append(actions_block(buttons))
        text = f"Approval needed: {escape(request.tool)}"
    else:
        outcome = _closed_line(closed)
        blocks.append(context_block([outcome]))
        text = f"Approval for {escape(request.tool)}: {outcome}"
    return SlackMessage(fit_fallback(text), checked_blocks(blocks))


def _origins_section(request: Request) -> dict[str, Any]:
    """Where arguments came from, one line each: each piece inline code, escaped."""
    lines = _origin_lines(request.origins)
    shown = lines[:ORIGINS_SHOWN]
    if len(lines) > len(shown):
        shown.append(f"…and {len(lines) - len(shown)} more (see the run's page)")
    return section_block(f"*{ORIGINS_TITLE}:*\n" + "\n".join(f"• {line}" for line in shown))


def _bold(text: str) -> str:
    return f"*{escape(text)}*"


def _origin_lines(origins: Sequence[Origin]) -> list[str]:
    """Where arguments came from, one line each, every piece inline code, escaped."""
    return origin_lines(origins, lambda text: inline_code(text, ORIGIN_PIECE_LIMIT), _bold)


# Each plan button's action id and style, by the decision it makes.
_PLAN_ACTIONS: dict[DecisionKind, tuple[str, str | None]] = {
    DecisionKind.APPROVE: (ids.APPROVE_PLAN, "primary"),
    DecisionKind.STEP_BY_STEP: (ids.STEP_BY_STEP, None),
    DecisionKind.DENY: (ids.DENY, "danger"),
}


def _plan_card(
    request: Request, may_answer: Sequence[str], closed: ClosedCard | None
) -> SlackMessage:
    title = "Plan approval needed" if closed is None else "Plan approval requested"
    summary = fit_text(request.prompt.strip() or "(no summary)", PROMPT_LIMIT)
    blocks = [section_block(f"*{title}:* {summary}")]
    if request.off_plan:
        blocks.append(section_block(f":warning: {fit_text(off_plan_words(request), REASON_LIMIT)}"))
    any_cut = False
    for step, planned in zip(plan_steps(request), request.steps, strict=True):
        free = " _(needs no approval)_" if not step.gated else ""
        why = f" — {fit_text(flattened(step.why), REASON_LIMIT)}" if step.why else ""
        code, cut = code_block(step.arguments, CARD_ARGUMENTS_LIMIT // 4)
        any_cut = any_cut or cut
        blocks.append(
            section_block(f"*{step.number}.* {inline_code(step.tool)}{free}{why}\n{code}")
        )
        if planned.origins:
            lines = _origin_lines(planned.origins)
            blocks.append(context_block(lines[:CONTEXT_ELEMENTS_LIMIT]))
    facts = _facts(request, "May approve", may_answer, closed is None)
    if request.approvals_needed > 1:
        facts.append(f"Needs {request.approvals_needed} approvals from different people")
    blocks.append(context_block([*facts, escape(PLAN_BINDING)]))
    count = len(request.steps)
    if closed is None:
        buttons = [
            button_element(label, _PLAN_ACTIONS[kind][0], request.id, _PLAN_ACTIONS[kind][1])
            for label, kind in PLAN_BUTTONS
        ]
        if any_cut:  # what the plan's approval covers must be readable whole before it
            buttons.append(button_element("Full arguments", ids.SHOW_ARGUMENTS, request.id))
        blocks.append(actions_block(buttons))
        text = f"Plan approval needed: {count} steps"
    else:
        outcome = _closed_line(closed)
        blocks.append(context_block([outcome]))
        text = f"Plan of {count} steps: {outcome}"
    return SlackMessage(fit_fallback(text), checked_blocks(blocks))


def _question_card(
    request: Request, may_answer: Sequence[str], closed: ClosedCard | None
) -> SlackMessage:
    question = fit_text(request.prompt.strip() or "(no question text)", PROMPT_LIMIT)
    blocks = [section_block(f"*Question:* {question}")]
    facts = _facts(request, "May answer", may_answer, closed is None)
    if closed is not None:
        outcome = _closed_line(closed)
        blocks.append(context_block([*facts, outcome]))
        return SlackMessage(
            fit_fallback(f"Question: {escape(request.prompt)} ({outcome})"), checked_blocks(blocks)
        )
    blocks.append(context_block(facts))
    options = options_shown(request)
    labels = _option_labels(options)
    if labels != [plain_text(option, OPTION_TEXT_LIMIT) for option in options]:  # some are cut
        blocks.append(_options_listed(options))
    if not options:
        blocks.append(section_block("_Reply in this thread to answer, or:_"))
        blocks.append(actions_block([button_element("Answer", ids.ANSWER, request.id)]))
    elif len(options) <= BUTTONS_PER_ACTIONS:
        blocks.append(
            actions_block(
                [
                    button_element(label, ids.choice_action_id(i), ids.choice_value(request.id, i))
                    for i, label in enumerate(labels)
                ]
            )
        )
    else:
        shown = options[:SELECT_OPTIONS_LIMIT]
        select = StaticSelectElement(
            action_id=ids.CHOOSE,
            placeholder=PlainTextObject(text="Choose an answer"),
            options=[
                Option(
                    text=PlainTextObject(text=label),
                    value=ids.choice_value(request.id, i),
                )
                for i, label in enumerate(labels[: len(shown)])
            ],
        )
        blocks.append(actions_block([select]))
        if len(options) > len(shown):
            blocks.append(
                context_block(
                    [
                        f"{len(options) - len(shown)} more options do not fit the menu: reply in"
                        " this thread with the option's text."
                    ]
                )
            )
    return SlackMessage(fit_fallback(f"Question: {escape(request.prompt)}"), checked_blocks(blocks))


def _option_labels(options: Sequence[str]) -> list[str]:
    """Each option as its button or menu item shows it; all numbered when one is too long for
    its label, so that options alike but for their ends can be told apart (and found whole in
    the list ``_options_listed`` makes)."""
    if not any(len(printable(option).strip()) > OPTION_TEXT_LIMIT for option in options):
        return [plain_text(option, OPTION_TEXT_LIMIT) for option in options]
    return [
        plain_text(f"{n}. {printable(option).strip() or '(blank)'}", OPTION_TEXT_LIMIT)
        for n, option in enumerate(options, 1)
    ]


def _options_listed(options: Sequence[str]) -> dict[str, Any]:
    """The options whole, numbered as their labels are."""
    lines = "\n".join(f"{n}. {option.strip() or '(blank)'}" for n, option in enumerate(options, 1))
    return section_block("*Options:*\n" + fit_text(lines, SECTION_TEXT_LIMIT - 20))


def _effect_card(
    request: Request, may_answer: Sequence[str], closed: ClosedCard | None
) -> SlackMessage:
    tool = inline_code(request.tool)
    verb = "is" if closed is None else "was"
    blocks = [section_block(f"*The outcome of {tool} {verb} uncertain*")]
    if request.prompt.strip():
        blocks.append(section_block(fit_text(request.prompt.strip(), PROMPT_LIMIT)))
    arguments, cut = arguments_section(request.arguments)
    blocks.append(arguments)
    facts = _facts(request, "May settle", may_answer, closed is None)
    blocks.append(context_block(facts))
    if closed is None:
        retry_warning = ConfirmObject(
            title=PlainTextObject(text="Run it again?"),
            text=MarkdownTextObject(
                text=fit_text(
                    f"{request.tool} may already have taken effect: Retry runs it a second time.",
                    CONFIRM_TEXT_LIMIT,
                )
            ),
            confirm=PlainTextObject(text="Retry"),
            deny=PlainTextObject(text="Cancel"),
        )
        buttons = [
            button_element("Retry", ids.EFFECT_RETRY, request.id, confirm=retry_warning),
            button_element("Mark done", ids.EFFECT_DONE, request.id, "primary"),
            button_element("Mark failed", ids.EFFECT_FAILED, request.id, "danger"),
        ]
        if cut:
            buttons.append(button_element("Full arguments", ids.SHOW_ARGUMENTS, request.id))
        blocks.append(actions_block(buttons))
        text = f"The outcome of {escape(request.tool)} is uncertain"
    else:
        outcome = _closed_line(closed)
        blocks.append(context_block([outcome]))
        text = f"The outcome of {escape(request.tool)} was uncertain: {outcome}"
    return SlackMessage(fit_fallback(text), checked_blocks(blocks))


_EMOJI = {
    "Approved": ":white_check_mark:",
    "Approved for this run": ":white_check_mark:",
    "Approved step by step": ":ballot_box_with_check:",
    "Denied": ":no_entry:",
    "Answered": ":speech_balloon:",
    "Retried": ":repeat:",
    "Marked done": ":white_check_mark:",
    "Marked failed": ":x:",
    "Expired": ":hourglass:",
    "Cancelled": ":heavy_multiplication_x:",
}


def _closed_line(closed: ClosedCard) -> str:
    end = closing(closed.status, closed.decision, closed.approvers)
    line = f"{_EMOJI.get(end.phrase, '')} {escape(end.phrase)}".strip()
    if end.by:
        line += f" by {listed([person_or(user) for user in end.by])}"
    if end.at is not None and not end.said:
        line += f" {slack_date(end.at)}"
    if end.said:
        line += f": {fit_text(end.said, DECISION_TEXT_LIMIT)}"
    return line
