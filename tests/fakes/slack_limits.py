"""Slack's Block Kit limits, as the fake Web API refuses what breaks them.

Slack answers ``invalid_blocks`` for a message whose blocks break a documented limit (more than
50 blocks, a section's text over 3,000 characters, a button's text over 75…) and
``msg_too_long`` for a ``text`` over 40,000 characters. Only the limits Kestrel's messages can
reach are checked; ``problem`` names the first one broken, or None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

MESSAGE_BLOCKS: Final = 50
VIEW_BLOCKS: Final = 100
SECTION_TEXT: Final = 3000
SECTION_FIELDS: Final = 10
FIELD_TEXT: Final = 2000
HEADER_TEXT: Final = 150
CONTEXT_ELEMENTS: Final = 10
ACTIONS_ELEMENTS: Final = 25
BUTTON_TEXT: Final = 75
BUTTON_VALUE: Final = 2000
ACTION_ID: Final = 255
MARKDOWN_PAYLOAD: Final = 12_000
MESSAGE_TEXT: Final = 40_000


def message_problem(args: Mapping[str, Any]) -> str | None:
    """``msg_too_long``, ``invalid_blocks`` or None for a message's ``text`` and ``blocks``."""
    if len(str(args.get("text") or "")) > MESSAGE_TEXT:
        return "msg_too_long"
    blocks = args.get("blocks")
    if blocks is None:
        return None
    return blocks_problem(blocks, MESSAGE_BLOCKS)


def view_problem(view: Any) -> str | None:
    """``invalid_arguments`` or None for a view's blocks."""
    if not isinstance(view, Mapping):
        return None
    found = blocks_problem(view.get("blocks") or [], VIEW_BLOCKS)
    return "invalid_arguments" if found else None


def blocks_problem(blocks: Any, most: int) -> str | None:
    if not isinstance(blocks, Sequence) or len(blocks) > most:
        return "invalid_blocks"
    markdown = sum(len(str(b.get("text") or "")) for b in blocks if _kind(b) == "markdown")
    if markdown > MARKDOWN_PAYLOAD:
        return "invalid_blocks"
    if any(not _block_fits(block) for block in blocks):
        return "invalid_blocks"
    return None


def _kind(block: Any) -> str:
    return str(block.get("type")) if isinstance(block, Mapping) else ""


def _text(value: Any) -> str:
    return str(value.get("text") or "") if isinstance(value, Mapping) else ""


def _block_fits(block: Any) -> bool:
    kind = _kind(block)
    if kind == "section":
        fields = block.get("fields") or []
        return (
            len(_text(block.get("text"))) <= SECTION_TEXT
            and len(fields) <= SECTION_FIELDS
            and all(len(_text(f)) <= FIELD_TEXT for f in fields)
            and (block.get("accessory") is None or _element_fits(block["accessory"]))
        )
    if kind == "header":
        return len(_text(block.get("text"))) <= HEADER_TEXT
    if kind == "context":
        return len(block.get("elements") or []) <= CONTEXT_ELEMENTS
    if kind == "actions":
        elements = block.get("elements") or []
        return len(elements) <= ACTIONS_ELEMENTS and all(_element_fits(e) for e in elements)
    return True


def _element_fits(element: Any) -> bool:
    if not isinstance(element, Mapping):
        return False
    if len(str(element.get("action_id") or "")) > ACTION_ID:
        return False
    if element.get("type") != "button":
        return True
    return (
        len(_text(element.get("text"))) <= BUTTON_TEXT
        and len(str(element.get("value") or "")) <= BUTTON_VALUE
    )
