"""Slack messages, modals and the App Home view, built from the core's values.

Pure functions: they call nothing, read no clock and decide nothing; the adapter posts what
they return. Every text from a model, a tool or a person is escaped for mrkdwn (``&``, ``<``,
``>``, so it can neither mention nor link) and cut to Slack's limits with a visible marker;
outside code, a link in it whose label hides its target shows the target (``unmask_links``);
buttons carry opaque ids only (``adapters.slack.ids``). Blocks are built with slack_sdk's
classes, whose ``to_dict`` validates them, so a message that breaks a limit fails here and
not in Slack.

Mentions are rendered from principals (``U…`` → ``<@U…>``, ``group:S…`` → ``<!subteam^S…>``,
``channel:C…`` → ``<#C…>``), and a posted mention notifies: post listings of other people's
requests (``runs_message``) as ephemeral replies.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, assert_never

from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    ButtonElement,
    ConfirmObject,
    ContextActionsBlock,
    ContextBlock,
    FeedbackButtonObject,
    FeedbackButtonsElement,
    HeaderBlock,
    InputBlock,
    MarkdownBlock,
    MarkdownTextObject,
    Option,
    PlainTextInputElement,
    PlainTextObject,
    SectionBlock,
    StaticSelectElement,
)
from slack_sdk.models.views import View

from adapters.slack import ids
from adapters.slack.ids import parse_feedback
from bot.chat.cards import closing, pretty, shorten
from bot.chat.service import PendingRequest, RunView
from bot.chat.words import budget_words, number_words, status_words, stop_reason_words
from bot.domain import (
    Decision,
    Request,
    RequestKind,
    RequestStatus,
    RunStatus,
    StopReason,
    TerminalResult,
)
from bot.text import printable, unmask_links

__all__ = [
    "ClosedCard",
    "SlackMessage",
    "answer_continuations",
    "answer_message",
    "answer_modal",
    "arguments_modal",
    "deny_modal",
    "ephemeral_text",
    "escape",
    "home_view",
    "parse_feedback",
    "principal",
    "progress_text",
    "request_card",
    "runs_message",
    "slack_date",
    "status_message",
    "working_message",
]

# Slack's limits (Block Kit reference).
SECTION_TEXT_LIMIT: Final = 3000
FIELD_TEXT_LIMIT: Final = 2000
FIELDS_PER_SECTION: Final = 10
HEADER_LIMIT: Final = 150
BUTTON_TEXT_LIMIT: Final = 75
OPTION_TEXT_LIMIT: Final = 75
SELECT_OPTIONS_LIMIT: Final = 100
BUTTONS_PER_ACTIONS: Final = 25
CONTEXT_ELEMENTS_LIMIT: Final = 10
MESSAGE_BLOCKS_LIMIT: Final = 50
VIEW_BLOCKS_LIMIT: Final = 100
MODAL_TITLE_LIMIT: Final = 24
CONFIRM_TEXT_LIMIT: Final = 300
# One markdown block holds 12,000 characters, and so do all the markdown blocks of one payload
# together ("The cumulative limit for all markdown blocks in a single payload is 12,000
# characters"): a longer answer goes on in further messages (``answer_continuations``).
MARKDOWN_BLOCK_LIMIT: Final = 12_000
MARKDOWN_PAYLOAD_LIMIT: Final = 12_000
MAX_CONTINUATIONS: Final = 10
# Notification (fallback) text: Slack truncates at 40,000; keep it short.
FALLBACK_LIMIT: Final = 300

# How much of a call a card shows; the rest is one click away (SHOW_ARGUMENTS).
CARD_VALUE_LIMIT: Final = 300
CARD_ARGUMENTS_LIMIT: Final = 2400
REASON_LIMIT: Final = 600
PROMPT_LIMIT: Final = 2000
DECISION_TEXT_LIMIT: Final = 300
STEP_LIMIT: Final = 280
WORKING_LINES: Final = 10

TRUNCATED: Final = "…"
ZWSP: Final = "\u200b"


@dataclass(frozen=True)
class SlackMessage:
    """A message to post or update: ``text`` is the notification and fallback text."""

    text: str
    blocks: list[dict[str, Any]]

    def body(self) -> dict[str, Any]:
        """The ``text`` and ``blocks`` arguments of chat.postMessage / chat.update."""
        return {"text": self.text, "blocks": self.blocks}


@dataclass(frozen=True)
class ClosedCard:
    """How a request closed, for the card's final form: its status and the decision, if any."""

    status: RequestStatus
    decision: Decision | None = None


# ---------------------------------------------------------------------------------------------
# Text


def escape(text: str) -> str:
    """``text`` safe inside mrkdwn: control characters dropped, a link whose label hides its
    target shown as ``label (target)``, ``& < >`` as entities."""
    return _entities(_prose(text))


def _prose(raw: str) -> str:
    """Model, tool or person text outside code: printable, no link hiding its target."""
    return unmask_links(printable(raw))


def _entities(clean: str) -> str:
    return clean.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def ephemeral_text(message: str) -> str:
    """A one-line reply (an ephemeral refusal, a command's answer) made safe and short."""
    return _fit(message, SECTION_TEXT_LIMIT)


def _fit(raw: str, limit: int, marker: str = TRUNCATED, *, code: bool = False) -> str:
    """``raw`` escaped and within ``limit`` characters, cut (never inside an entity) and
    marked when it is longer."""
    return _fit_flag(raw, limit, marker, code=code)[0]


def _fit_flag(
    raw: str, limit: int, marker: str = TRUNCATED, *, code: bool = False
) -> tuple[str, bool]:
    # Code (a call's arguments, an identifier) is shown exactly: mrkdwn makes no link of it.
    clean = printable(raw) if code else _prose(raw)
    text = _entities(clean)
    if len(text) <= limit:
        return text, False
    return _entities(clean[: _escaped_prefix(clean, max(0, limit - len(marker)))]) + marker, True


_ENTITY_LENGTHS: Final = {"&": 5, "<": 4, ">": 4}


def _escaped_prefix(clean: str, limit: int) -> int:
    """How many characters of ``clean`` (printable already) escape to ``limit`` at most."""
    size = 0
    for i, char in enumerate(clean):
        size += _ENTITY_LENGTHS.get(char, 1)
        if size > limit:
            return i
    return len(clean)


def _plain(raw: str, limit: int, empty: str = "(blank)") -> str:
    """Plain text (buttons, options, titles): not parsed by Slack, so only cut, never empty."""
    text = printable(raw).strip() or empty
    if len(text) <= limit:
        return text
    return text[: limit - len(TRUNCATED)] + TRUNCATED


def _code_safe(raw: str) -> str:
    """Text that cannot close the code block around it."""
    return printable(raw).replace("```", f"``{ZWSP}`")


def _code(raw: str, limit: int, marker: str = f"\n{TRUNCATED} (truncated)") -> tuple[str, bool]:
    """A ```code block``` of ``raw`` within ``limit`` characters; whether it was cut."""
    body, cut = _fit_flag(_code_safe(raw), limit - 6, marker, code=True)
    return f"```{body}```", cut


def _inline(raw: str, limit: int = 80) -> str:
    """`raw` as inline code (an identifier: a tool name, an id, an unknown principal)."""
    text = printable(raw).replace("`", "\u02cb").replace("\n", " ") or " "
    return f"`{_fit(text, limit, code=True)}`"


def slack_date(at: datetime, fmt: str = "{date_short_pretty} at {time}") -> str:
    """``at`` in each reader's own time zone, with a UTC fallback for clients that cannot."""
    moment = at if at.tzinfo else at.replace(tzinfo=UTC)
    fallback = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{int(moment.timestamp())}^{fmt}|{fallback}>"


def _ago(at: datetime) -> str:
    return slack_date(at, "{ago}")


_USER_RE: Final = re.compile(r"[UW][A-Z0-9]{2,31}")
_GROUP_RE: Final = re.compile(r"S[A-Z0-9]{2,31}")
_CHANNEL_RE: Final = re.compile(r"[CG][A-Z0-9]{2,31}")
_URL_RE: Final = re.compile(r"https?://[^\s<>|]{1,2000}")


def principal(value: str) -> str:
    """A policy principal as Slack shows it: a mention of a user, a user group or a channel,
    ``anyone in the workspace`` for ``*``, anything else as code."""
    if value == "*":
        return "anyone in the workspace"
    if _USER_RE.fullmatch(value):
        return f"<@{value}>"
    kind, _, ident = value.partition(":")
    if kind == "group" and _GROUP_RE.fullmatch(ident):
        return f"<!subteam^{ident}>"
    if kind == "channel" and _CHANNEL_RE.fullmatch(ident):
        return f"<#{ident}>"
    return _inline(value)


def _principals(values: Sequence[str], *, most: int = 15, nobody: str = "nobody") -> str:
    unique = list(dict.fromkeys(v for v in values if v))
    if not unique:
        return nobody
    shown = ", ".join(principal(v) for v in unique[:most])
    more = len(unique) - most
    return f"{shown} and {more} more" if more > 0 else shown


def _person(user: str, *, nobody: str = "someone") -> str:
    return principal(user) if user else nobody


def _reason(value: StopReason | str) -> str:
    return escape(stop_reason_words(value))


_KIND_NAMES: Final[dict[RequestKind, str]] = {
    RequestKind.WAIT_APPROVAL: "approval",
    RequestKind.WAIT_USER: "question",
    RequestKind.WAIT_EFFECT: "uncertain effect",
}


def _safe_url(url: str) -> str | None:
    return url if _URL_RE.fullmatch(url) else None


def _link(url: str | None, label: str) -> str:
    """``<url|label>`` for an http(s) URL with nothing that could end the token; else empty."""
    safe = _safe_url(url) if url else None
    return f"<{safe.replace('&', '&amp;')}|{label}>" if safe else ""


# ---------------------------------------------------------------------------------------------
# Blocks


def _section(text: str) -> dict[str, Any]:
    return SectionBlock(text=MarkdownTextObject(text=text, verbatim=True)).to_dict()


def _context(items: Sequence[str]) -> dict[str, Any]:
    elements = [MarkdownTextObject(text=item, verbatim=True) for item in items if item]
    return ContextBlock(elements=elements[:CONTEXT_ELEMENTS_LIMIT]).to_dict()


def _button(
    text: str,
    action_id: str,
    value: str,
    style: str | None = None,
    confirm: ConfirmObject | None = None,
) -> ButtonElement:
    return ButtonElement(
        text=PlainTextObject(text=_plain(text, BUTTON_TEXT_LIMIT), emoji=True),
        action_id=action_id,
        value=value,
        style=style,
        confirm=confirm,
    )


def _actions(elements: Sequence[ButtonElement | StaticSelectElement]) -> dict[str, Any]:
    return ActionsBlock(elements=list(elements)).to_dict()


def _checked(
    blocks: list[dict[str, Any]], limit: int = MESSAGE_BLOCKS_LIMIT
) -> list[dict[str, Any]]:
    """Every block re-validated by slack_sdk, and no more than ``limit`` of them."""
    if len(blocks) > limit:
        raise ValueError(f"{len(blocks)} blocks: Slack takes {limit} at most")
    for block in blocks:
        parsed = Block.parse(block)
        if parsed is not None:
            parsed.validate_json()
    return blocks


# ---------------------------------------------------------------------------------------------
# Arguments


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _arguments_section(arguments: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The call's arguments as pretty JSON in a code block; whether anything was cut."""
    shortened, cut_values = shorten(dict(arguments), CARD_VALUE_LIMIT)
    code, cut_whole = _code(pretty(shortened), CARD_ARGUMENTS_LIMIT)
    return _section(code), cut_values or cut_whole


# ---------------------------------------------------------------------------------------------
# Request cards


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
        case _:
            assert_never(request.kind)


def _facts(request: Request, who: str, may_answer: Sequence[str], open_: bool) -> list[str]:
    facts = [f"Requested by {_person(request.requested_by, nobody='the run')}"]
    if request.deadline is not None and open_:
        facts.append(f"Expires {slack_date(request.deadline)}")
    facts.append(f"{who}: {_principals(may_answer)}")
    return facts


def _approval_card(
    request: Request, reason: str, may_answer: Sequence[str], closed: ClosedCard | None
) -> SlackMessage:
    tool = _inline(request.tool)
    title = "Approval needed" if closed is None else "Approval requested"
    arguments, cut = _arguments_section(request.arguments)
    blocks = [_section(f"*{title}:* {tool}"), arguments]
    if reason.strip():
        blocks.append(_section(f"*Why:* {_fit(reason.strip(), REASON_LIMIT)}"))
    facts = _facts(request, "May approve", may_answer, closed is None)
    if request.approvals_needed > 1:
        facts.append(f"Needs {request.approvals_needed} approvals from different people")
    blocks.append(_context(facts))
    if closed is None:
        buttons = [_button("Approve once", ids.APPROVE_ONCE, request.id, "primary")]
        if request.approvals_needed <= 1:  # the policy refuses a standing grant otherwise
            buttons.append(_button("Approve for this run", ids.APPROVE_RUN, request.id))
        buttons.append(_button("Deny", ids.DENY, request.id, "danger"))
        if cut:
            buttons.append(_button("Full arguments", ids.SHOW_ARGUMENTS, request.id))
        blocks.append(_actions(buttons))
        text = f"Approval needed: {escape(request.tool)}"
    else:
        outcome = _closed_line(closed)
        blocks.append(_context([outcome]))
        text = f"Approval for {escape(request.tool)}: {outcome}"
    return SlackMessage(_fit_fallback(text), _checked(blocks))


def _question_card(
    request: Request, may_answer: Sequence[str], closed: ClosedCard | None
) -> SlackMessage:
    question = _fit(request.prompt.strip() or "(no question text)", PROMPT_LIMIT)
    blocks = [_section(f"*Question:* {question}")]
    facts = _facts(request, "May answer", may_answer, closed is None)
    if closed is not None:
        outcome = _closed_line(closed)
        blocks.append(_context([*facts, outcome]))
        return SlackMessage(
            _fit_fallback(f"Question: {escape(request.prompt)} ({outcome})"), _checked(blocks)
        )
    blocks.append(_context(facts))
    options = list(request.options)
    if not options:
        blocks.append(_section("_Reply in this thread to answer, or:_"))
        blocks.append(_actions([_button("Answer", ids.ANSWER, request.id)]))
    elif len(options) <= BUTTONS_PER_ACTIONS:
        blocks.append(
            _actions(
                [
                    _button(option, ids.choice_action_id(i), ids.choice_value(request.id, i))
                    for i, option in enumerate(options)
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
                    text=PlainTextObject(text=_plain(option, OPTION_TEXT_LIMIT)),
                    value=ids.choice_value(request.id, i),
                )
                for i, option in enumerate(shown)
            ],
        )
        blocks.append(_actions([select]))
        if len(options) > len(shown):
            blocks.append(
                _context(
                    [
                        f"{len(options) - len(shown)} more options do not fit the menu: reply in"
                        " this thread with the option's text."
                    ]
                )
            )
    return SlackMessage(_fit_fallback(f"Question: {escape(request.prompt)}"), _checked(blocks))


def _effect_card(
    request: Request, may_answer: Sequence[str], closed: ClosedCard | None
) -> SlackMessage:
    tool = _inline(request.tool)
    verb = "is" if closed is None else "was"
    blocks = [_section(f"*The outcome of {tool} {verb} uncertain*")]
    if request.prompt.strip():
        blocks.append(_section(_fit(request.prompt.strip(), PROMPT_LIMIT)))
    arguments, cut = _arguments_section(request.arguments)
    blocks.append(arguments)
    facts = _facts(request, "May settle", may_answer, closed is None)
    blocks.append(_context(facts))
    if closed is None:
        retry_warning = ConfirmObject(
            title=PlainTextObject(text="Run it again?"),
            text=MarkdownTextObject(
                text=_fit(
                    f"{request.tool} may already have taken effect: Retry runs it a second time.",
                    CONFIRM_TEXT_LIMIT,
                )
            ),
            confirm=PlainTextObject(text="Retry"),
            deny=PlainTextObject(text="Cancel"),
        )
        buttons = [
            _button("Retry", ids.EFFECT_RETRY, request.id, confirm=retry_warning),
            _button("Mark done", ids.EFFECT_DONE, request.id, "primary"),
            _button("Mark failed", ids.EFFECT_FAILED, request.id, "danger"),
        ]
        if cut:
            buttons.append(_button("Full arguments", ids.SHOW_ARGUMENTS, request.id))
        blocks.append(_actions(buttons))
        text = f"The outcome of {escape(request.tool)} is uncertain"
    else:
        outcome = _closed_line(closed)
        blocks.append(_context([outcome]))
        text = f"The outcome of {escape(request.tool)} was uncertain: {outcome}"
    return SlackMessage(_fit_fallback(text), _checked(blocks))


_EMOJI = {
    "Approved": ":white_check_mark:",
    "Approved for this run": ":white_check_mark:",
    "Denied": ":no_entry:",
    "Answered": ":speech_balloon:",
    "Retried": ":repeat:",
    "Marked done": ":white_check_mark:",
    "Marked failed": ":x:",
    "Expired": ":hourglass:",
    "Cancelled": ":heavy_multiplication_x:",
}


def _closed_line(closed: ClosedCard) -> str:
    end = closing(closed.status, closed.decision)
    line = f"{_EMOJI.get(end.phrase, '')} {escape(end.phrase)}".strip()
    if end.by:
        line += f" by {_person(end.by)}"
    if end.at is not None and not end.said:
        line += f" {slack_date(end.at)}"
    if end.said:
        line += f": {_fit(end.said, DECISION_TEXT_LIMIT)}"
    return line


def _fit_fallback(text: str) -> str:
    """Fallback text is built from escaped parts already; only cut it, at a safe place."""
    if len(text) <= FALLBACK_LIMIT:
        return text
    cut = text[: FALLBACK_LIMIT - 1]
    # never leave half an entity or half a <…> token behind
    for opener, closer in (("&", ";"), ("<", ">")):
        start = cut.rfind(opener)
        if start != -1 and cut.find(closer, start) == -1:
            cut = cut[:start]
    return cut + TRUNCATED


# ---------------------------------------------------------------------------------------------
# Answers


def answer_message(result: TerminalResult, *, run_id: str) -> SlackMessage:
    """A run's final word: its text as markdown, its structured payload as fields, a clear line
    when it did not complete, and feedback buttons. Text beyond what one message holds goes on
    in ``answer_continuations(result)``, posted after this."""
    blocks: list[dict[str, Any]] = []
    completed = result.status is RunStatus.COMPLETED
    if not completed:
        blocks.append(_section(_status_line(result)))
        if result.error.strip():
            blocks.append(_section(_code(result.error.strip(), SECTION_TEXT_LIMIT)[0]))
    chunks, _cut = _markdown_chunks(result.text)
    if chunks:
        blocks.append(MarkdownBlock(text=chunks[0]).to_dict())
    elif completed and result.payload is None:
        blocks.append(_section("_(The run finished without an answer text.)_"))
    if len(chunks) > 1:
        blocks.append(_context([f"The answer goes on in the next {len(chunks) - 1} message(s)."]))
    if result.payload:
        blocks.extend(_payload_sections(result.payload))
    usage = result.usage
    facts = [f"Run {_inline(run_id)}"]
    if usage.total:
        facts.append(f"{number_words(usage.total)} tokens")
    blocks.append(_context(facts))
    blocks.append(_feedback(run_id))
    if completed:
        first = result.text.strip() or ("(structured answer)" if result.payload else "(no text)")
        text = _fit(first, FALLBACK_LIMIT)
    else:
        text = _status_line(result, bold=False)
    return SlackMessage(text, _checked(blocks))


def answer_continuations(result: TerminalResult) -> list[SlackMessage]:
    """The rest of an answer too long for one message, one markdown block per message (at most
    ``MAX_CONTINUATIONS``; the last says when even they could not hold it)."""
    all_chunks, cut = _markdown_chunks(result.text)
    chunks = all_chunks[1:]
    messages = []
    for i, chunk in enumerate(chunks):
        blocks = [MarkdownBlock(text=chunk).to_dict()]
        if i == len(chunks) - 1 and cut:
            blocks.append(
                _context(["The answer was longer still: the rest is in the run's journal."])
            )
        messages.append(SlackMessage(f"(answer, part {i + 2})", _checked(blocks)))
    return messages


def _status_line(result: TerminalResult, *, bold: bool = True) -> str:
    line = escape(status_words(result.status.value, result.stop_reason))
    return f":warning: *{line}*" if bold else line


def _feedback(run_id: str) -> dict[str, Any]:
    element = FeedbackButtonsElement(
        action_id=ids.FEEDBACK,
        positive_button=FeedbackButtonObject(
            text=PlainTextObject(text="Good answer"),
            accessibility_label="This answer was helpful",
            value=ids.feedback_value(run_id, positive=True),
        ),
        negative_button=FeedbackButtonObject(
            text=PlainTextObject(text="Bad answer"),
            accessibility_label="This answer was not helpful",
            value=ids.feedback_value(run_id, positive=False),
        ),
    )
    return ContextActionsBlock(elements=[element]).to_dict()


_FENCE: Final = "```"
_SLACK_TOKEN: Final = re.compile(r"<(?=[@#!])")


def _markdown_safe(text: str) -> str:
    """Model text for a markdown block: no link hiding its target, and Slack's own mention
    tokens (``<@U…>``, ``<!here>``, ``<#C…>``) broken with a zero-width space so that an answer
    can ping no one."""
    return _SLACK_TOKEN.sub(f"<{ZWSP}", _prose(text)).strip()


def _markdown_chunks(text: str) -> tuple[list[str], bool]:
    """``text`` in pieces of one markdown block each (at most ``1 + MAX_CONTINUATIONS``), cut
    at paragraph or line breaks where it can be, code fences closed and reopened across a cut;
    and whether even they could not hold it all."""
    rest = _markdown_safe(text)
    limit = min(MARKDOWN_BLOCK_LIMIT, MARKDOWN_PAYLOAD_LIMIT) - 40  # room for fences, marker
    chunks: list[str] = []
    reopen = False
    while rest and len(chunks) <= MAX_CONTINUATIONS:
        prefix = f"{_FENCE}\n" if reopen else ""
        room = limit - len(prefix)
        if len(rest) <= room:
            piece, rest = rest, ""
        else:
            cut = rest.rfind("\n\n", room // 2, room)
            if cut == -1:
                cut = rest.rfind("\n", room // 2, room)
            if cut == -1:
                cut = room
            piece, rest = rest[:cut], rest[cut:].lstrip("\n")
        chunk = prefix + piece
        reopen = chunk.count(_FENCE) % 2 == 1
        if reopen:
            chunk += f"\n{_FENCE}"
        if rest and len(chunks) == MAX_CONTINUATIONS:
            chunk += f"\n\n{TRUNCATED} (truncated)"
        chunks.append(chunk)
    return chunks, bool(rest)


def _payload_sections(payload: Mapping[str, Any], most: int = 40) -> list[dict[str, Any]]:
    fields = []
    for key, value in list(payload.items())[:most]:
        name = _fit(str(key), 100)
        if isinstance(value, str):
            shown = _fit(value, FIELD_TEXT_LIMIT - len(name) - 10) or "_(empty)_"
        else:
            shown = _inline(_compact(value), FIELD_TEXT_LIMIT - len(name) - 10)
        fields.append(MarkdownTextObject(text=f"*{name}*\n{shown}", verbatim=True))
    sections = [
        SectionBlock(fields=fields[i : i + FIELDS_PER_SECTION]).to_dict()
        for i in range(0, len(fields), FIELDS_PER_SECTION)
    ]
    if len(payload) > most:
        sections.append(_context([f"and {len(payload) - most} more fields"]))
    return sections


# ---------------------------------------------------------------------------------------------
# Progress and status


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


# ---------------------------------------------------------------------------------------------
# Listings


def _item_line(item: PendingRequest, *, with_run: bool) -> str:
    request = item.request
    parts = [f"{_KIND_NAMES[request.kind]} {_inline(request.tool)}"]
    if with_run:
        parts.append(f"run {_inline(request.run_id)}")
    parts.append(f"asked {_ago(request.created_at)}")
    if request.deadline is not None:
        parts.append(f"expires {slack_date(request.deadline)}")
    parts.append(f"may answer: {_principals(item.may_answer, most=5)}")
    if item.note:
        parts.append(f"_{_fit(item.note, 200)}_")
    return " · ".join(parts)


def runs_message(pending: Sequence[PendingRequest], links: Mapping[str, str]) -> SlackMessage:
    """The workspace's open requests grouped by run, oldest first, each run linked to its
    thread (``links``: run id → permalink). Post it ephemerally: it mentions people."""
    if not pending:
        return SlackMessage("Nothing is waiting.", _checked([_section("Nothing is waiting.")]))
    runs: dict[str, list[PendingRequest]] = {}
    for item in pending:
        runs.setdefault(item.request.run_id, []).append(item)
    summary = f"*Open requests:* {len(pending)} in {len(runs)} run(s)"
    blocks = [_section(summary)]
    room = MESSAGE_BLOCKS_LIMIT - 2  # the summary, and a last line for what does not fit
    for shown, (run_id, items) in enumerate(runs.items()):
        if shown == room:
            rest = sum(len(later) for later in list(runs.values())[room:])
            blocks.append(_context([f"and {len(runs) - room} more run(s), {rest} request(s)"]))
            break
        head = f"*Run* {_inline(run_id)}"
        link = _link(links.get(run_id), "thread")
        if link:
            head += f" · {link}"
        blocks.append(_section(_lines_within(head, [_item_line(i, with_run=False) for i in items])))
    text = f"{len(pending)} open request(s) in {len(runs)} run(s)"
    return SlackMessage(text, _checked(blocks))


def _lines_within(head: str, rows: Sequence[str], limit: int = SECTION_TEXT_LIMIT) -> str:
    """``head`` and as many ``• row`` lines as fit in one section, then how many did not."""
    text = head
    for i, row in enumerate(rows):
        line = f"\n• {row}"
        tail = f"\n• and {len(rows) - i} more"
        if len(text) + len(line) + len(tail) > limit:
            return text + tail
        text += line
    return text


def home_view(
    items: Sequence[PendingRequest], links: Mapping[str, str], user: str
) -> dict[str, Any]:
    """The App Home of ``user``: what waits on them (``items``: the open requests they may
    answer, as the caller found with the policy), grouped by kind, linked to their threads."""
    blocks: list[dict[str, Any]] = [
        HeaderBlock(text=PlainTextObject(text="Waiting on you")).to_dict()
    ]
    if not items:
        blocks.append(
            _section(
                f"Nothing is waiting on you, {principal(user)}. :sparkles:\nWhen a run needs"
                " your approval or asks you a question, it shows up here with a link to its"
                " thread."
            )
        )
        blocks.append(
            _context(
                [
                    "Mention @Kestrel in a channel to start a run · `/kestrel runs` lists every"
                    " open request"
                ]
            )
        )
        return View(type="home", blocks=_checked(blocks, VIEW_BLOCKS_LIMIT)).to_dict()
    groups = [
        (RequestKind.WAIT_APPROVAL, "Approvals you may decide"),
        (RequestKind.WAIT_USER, "Questions for you"),
        (RequestKind.WAIT_EFFECT, "Uncertain effects you may settle"),
    ]
    room = VIEW_BLOCKS_LIMIT - len(blocks) - 2 * len(groups) - 2
    for kind, title in groups:
        mine = [item for item in items if item.request.kind is kind]
        if not mine:
            continue
        blocks.append(_section(f"*{title}* ({len(mine)})"))
        for n, item in enumerate(mine):
            if room <= 0:
                blocks.append(_context([f"and {len(mine) - n} more"]))
                break
            blocks.append(_section(_home_item(item, links)))
            room -= 1
    blocks.append(
        _context(
            ["The card in each thread has the buttons; a question is answered by replying there."]
        )
    )
    return View(type="home", blocks=_checked(blocks, VIEW_BLOCKS_LIMIT)).to_dict()


def _home_item(item: PendingRequest, links: Mapping[str, str]) -> str:
    request = item.request
    head = (
        f"{_inline(request.tool)} · requested by {_person(request.requested_by, nobody='the run')}"
    )
    link = _link(links.get(request.run_id), "open the thread")
    if link:
        head += f" · {link}"
    lines = [head]
    if request.kind is RequestKind.WAIT_USER and request.prompt.strip():
        lines.append(f"> {_fit(' '.join(request.prompt.split()), 500)}")
    when = f"asked {_ago(request.created_at)}"
    if request.deadline is not None:
        when += f" · expires {slack_date(request.deadline)}"
    lines.append(when)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Modals


def _modal(
    title: str,
    blocks: list[dict[str, Any]],
    *,
    callback_id: str | None = None,
    private_metadata: str | None = None,
    submit: str | None = None,
    close: str = "Cancel",
) -> dict[str, Any]:
    return View(
        type="modal",
        callback_id=callback_id,
        private_metadata=private_metadata,
        title=PlainTextObject(text=_plain(title, MODAL_TITLE_LIMIT)),
        submit=PlainTextObject(text=_plain(submit, MODAL_TITLE_LIMIT)) if submit else None,
        close=PlainTextObject(text=_plain(close, MODAL_TITLE_LIMIT)),
        blocks=_checked(blocks, VIEW_BLOCKS_LIMIT),
    ).to_dict()


def deny_modal(request: Request, metadata: str = "") -> dict[str, Any]:
    """Asks why before denying; submits ``DENY_MODAL`` with ``metadata`` (by default the
    request id) as private_metadata and the reason at ``state.values["reason"]["reason"]``
    (optional)."""
    reason = InputBlock(
        block_id=ids.REASON_BLOCK,
        label=PlainTextObject(text="Reason"),
        optional=True,
        hint=PlainTextObject(text="The requester and the run see it."),
        element=PlainTextInputElement(
            action_id=ids.REASON_ACTION,
            multiline=True,
            max_length=DECISION_TEXT_LIMIT * 3,
            placeholder=PlainTextObject(text="Why not?"),
        ),
    ).to_dict()
    blocks = [_section(f"Deny {_inline(request.tool)}?"), reason]
    return _modal(
        "Deny",
        blocks,
        callback_id=ids.DENY_MODAL,
        private_metadata=metadata or request.id,
        submit="Deny",
    )


def answer_modal(request: Request, metadata: str = "") -> dict[str, Any]:
    """A free-text answer to a question; submits ``ANSWER_MODAL`` with ``metadata`` (by
    default the request id) as private_metadata and the answer at
    ``state.values["answer"]["answer"]``."""
    question = _fit(request.prompt.strip() or "(no question text)", PROMPT_LIMIT)
    hint = None
    if request.options:
        listed = ", ".join(request.options)
        hint = PlainTextObject(text=_plain(f"Answer with one of: {listed}", 2000))
    answer = InputBlock(
        block_id=ids.ANSWER_BLOCK,
        label=PlainTextObject(text="Your answer"),
        hint=hint,
        element=PlainTextInputElement(action_id=ids.ANSWER_ACTION, multiline=True, max_length=3000),
    ).to_dict()
    return _modal(
        "Answer",
        [_section(f"*Question:* {question}"), answer],
        callback_id=ids.ANSWER_MODAL,
        private_metadata=metadata or request.id,
        submit="Answer",
    )


def arguments_modal(request: Request) -> dict[str, Any]:
    """A call's exact arguments, pretty JSON in code blocks across as many sections as the
    modal holds; says so when even they cannot hold it all."""
    head = _section(f"{_inline(request.tool)} · request {_inline(request.id)}")
    body = _code_safe(pretty(request.arguments))
    room = VIEW_BLOCKS_LIMIT - 2
    pieces, rest = _split_escaped(body, SECTION_TEXT_LIMIT - 6, room)
    blocks = [head, *(_section(f"```{piece}```") for piece in pieces)]
    if rest:
        blocks.append(
            _context(
                [
                    f"Truncated: {rest:,} more characters. `kestrel runs show"
                    f" {escape(request.run_id)}` shows the whole call."
                ]
            )
        )
    return _modal("Full arguments", blocks, close="Close")


def _split_escaped(raw: str, limit: int, most: int) -> tuple[list[str], int]:
    """``raw`` (printable already) escaped, in at most ``most`` pieces of at most ``limit``
    characters each, cut at line ends where it can be and never inside an entity; and how many
    characters did not fit."""
    pieces: list[str] = []
    rest = raw
    while rest and len(pieces) < most:
        take = _escaped_prefix(rest, limit)
        if take < len(rest):
            line_end = rest.rfind("\n", take // 2, take)
            if line_end > 0:
                take = line_end
        pieces.append(_entities(rest[:take]))
        rest = rest[take:].removeprefix("\n")
    return pieces, len(rest)
