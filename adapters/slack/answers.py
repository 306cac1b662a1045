"""A run's answer as Slack messages: the status line, the text in markdown blocks (further
messages past Slack's payload limit), the payload as fields and the feedback buttons.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from slack_sdk.models.blocks import (
    ContextActionsBlock,
    FeedbackButtonObject,
    FeedbackButtonsElement,
    MarkdownBlock,
    MarkdownTextObject,
    PlainTextObject,
    SectionBlock,
)

from adapters.slack import ids
from adapters.slack.mrkdwn import (
    FALLBACK_LIMIT,
    FIELD_TEXT_LIMIT,
    FIELDS_PER_SECTION,
    MARKDOWN_BLOCK_LIMIT,
    MARKDOWN_PAYLOAD_LIMIT,
    MAX_CONTINUATIONS,
    SECTION_TEXT_LIMIT,
    TRUNCATED,
    ZWSP,
    SlackMessage,
    checked_blocks,
    code_block,
    compact_json,
    context_block,
    escape,
    fit_text,
    inline_code,
    prose,
    section_block,
)
from bot.chat.words import number_words, status_words
from bot.domain import (
    RunStatus,
    TerminalResult,
)


def answer_message(result: TerminalResult, *, run_id: str) -> SlackMessage:
    """A run's final word: its text as markdown, its structured payload as fields, a clear line
    when it did not complete, and feedback buttons. Text beyond what one message holds goes on
    in ``answer_continuations(result)``, posted after this."""
    blocks: list[dict[str, Any]] = []
    completed = result.status is RunStatus.COMPLETED
    if not completed:
        blocks.append(section_block(_status_line(result)))
        if result.error.strip():
            blocks.append(section_block(code_block(result.error.strip(), SECTION_TEXT_LIMIT)[0]))
    chunks, _cut = _markdown_chunks(result.text)
    if chunks:
        blocks.append(MarkdownBlock(text=chunks[0]).to_dict())
    elif completed and result.payload is None:
        blocks.append(section_block("_(The run finished without an answer text.)_"))
    if len(chunks) > 1:
        blocks.append(
            context_block([f"The answer goes on in the next {len(chunks) - 1} message(s)."])
        )
    if result.payload:
        blocks.extend(_payload_sections(result.payload))
    usage = result.usage
    facts = [f"Run {inline_code(run_id)}"]
    if usage.total:
        facts.append(f"{number_words(usage.total)} tokens")
    blocks.append(context_block(facts))
    blocks.append(_feedback(run_id))
    if completed:
        first = result.text.strip() or ("(structured answer)" if result.payload else "(no text)")
        text = fit_text(first, FALLBACK_LIMIT)
    else:
        text = _status_line(result, bold=False)
    return SlackMessage(text, checked_blocks(blocks))


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
                context_block(["The answer was longer still: the rest is in the run's journal."])
            )
        messages.append(SlackMessage(f"(answer, part {i + 2})", checked_blocks(blocks)))
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
    return _SLACK_TOKEN.sub(f"<{ZWSP}", prose(text)).strip()


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
        name = fit_text(str(key), 100)
        if isinstance(value, str):
            shown = fit_text(value, FIELD_TEXT_LIMIT - len(name) - 10) or "_(empty)_"
        else:
            shown = inline_code(compact_json(value), FIELD_TEXT_LIMIT - len(name) - 10)
        fields.append(MarkdownTextObject(text=f"*{name}*\n{shown}", verbatim=True))
    sections = [
        SectionBlock(fields=fields[i : i + FIELDS_PER_SECTION]).to_dict()
        for i in range(0, len(fields), FIELDS_PER_SECTION)
    ]
    if len(payload) > most:
        sections.append(context_block([f"and {len(payload) - most} more fields"]))
    return sections
