"""The modals: deny with a reason, answer a question, and a call's whole arguments."""

from __future__ import annotations

from typing import Any

from slack_sdk.models.blocks import (
    InputBlock,
    PlainTextInputElement,
    PlainTextObject,
)
from slack_sdk.models.views import View

from adapters.slack import ids
from adapters.slack.mrkdwn import (
    DECISION_TEXT_LIMIT,
    MODAL_TITLE_LIMIT,
    PROMPT_LIMIT,
    SECTION_TEXT_LIMIT,
    VIEW_BLOCKS_LIMIT,
    checked_blocks,
    code_safe,
    context_block,
    escape,
    escape_entities,
    escaped_prefix,
    fit_text,
    inline_code,
    plain_text,
    section_block,
)
from bot.chat.cards import exact, exact_calls
from bot.domain import (
    Request,
)


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
        title=PlainTextObject(text=plain_text(title, MODAL_TITLE_LIMIT)),
        submit=PlainTextObject(text=plain_text(submit, MODAL_TITLE_LIMIT)) if submit else None,
        close=PlainTextObject(text=plain_text(close, MODAL_TITLE_LIMIT)),
        blocks=checked_blocks(blocks, VIEW_BLOCKS_LIMIT),
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
    blocks = [section_block(f"Deny {inline_code(request.tool)}?"), reason]
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
    question = fit_text(request.prompt.strip() or "(no question text)", PROMPT_LIMIT)
    hint = None
    if request.options:
        listed = ", ".join(request.options)
        hint = PlainTextObject(text=plain_text(f"Answer with one of: {listed}", 2000))
    answer = InputBlock(
        block_id=ids.ANSWER_BLOCK,
        label=PlainTextObject(text="Your answer"),
        hint=hint,
        element=PlainTextInputElement(action_id=ids.ANSWER_ACTION, multiline=True, max_length=3000),
    ).to_dict()
    return _modal(
        "Answer",
        [section_block(f"*Question:* {question}"), answer],
        callback_id=ids.ANSWER_MODAL,
        private_metadata=metadata or request.id,
        submit="Answer",
    )


def arguments_modal(request: Request) -> dict[str, Any]:
    """A call's exact arguments, pretty JSON in code blocks across as many sections as the
    modal holds; says so when even they cannot hold it all."""
    head = section_block(f"{inline_code(request.tool)} · request {inline_code(request.id)}")
    body = code_safe(exact(exact_calls(request)))
    room = VIEW_BLOCKS_LIMIT - 2
    pieces, rest = _split_escaped(body, SECTION_TEXT_LIMIT - 6, room)
    blocks = [head, *(section_block(f"```{piece}```") for piece in pieces)]
    if rest:
        blocks.append(
            context_block(
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
        take = escaped_prefix(rest, limit)
        if take < len(rest):
            line_end = rest.rfind("\n", take // 2, take)
            if line_end > 0:
                take = line_end
        pieces.append(escape_entities(rest[:take]))
        rest = rest[take:].removeprefix("\n")
    return pieces, len(rest)
