"""Slack's text and blocks: its limits, mrkdwn escaping and cutting, dates, mentions, links,
and the block builders the messages, cards and modals share.

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
from typing import Any, Final

from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    ButtonElement,
    ConfirmObject,
    ContextBlock,
    MarkdownTextObject,
    PlainTextObject,
    SectionBlock,
    StaticSelectElement,
)

from bot.chat.cards import exact, shorten
from bot.chat.words import stop_reason_words
from bot.domain import (
    RequestKind,
    StopReason,
)
from bot.text import printable, unmask_links

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
_BACKTICKS: Final = re.compile(r"`{3,}")


@dataclass(frozen=True)
class SlackMessage:
    """A message to post or update: ``text`` is the notification and fallback text."""

    text: str
    blocks: list[dict[str, Any]]

    def body(self) -> dict[str, Any]:
        """The ``text`` and ``blocks`` arguments of chat.postMessage / chat.update."""
        return {"text": self.text, "blocks": self.blocks}


def escape(text: str) -> str:
    """``text`` safe inside mrkdwn: control characters dropped, a link whose label hides its
    target shown as ``label (target)``, ``& < >`` as entities."""
    return escape_entities(prose(text))


def prose(raw: str) -> str:
    """Model, tool or person text outside code: printable, no link hiding its target."""
    return unmask_links(printable(raw))


def escape_entities(clean: str) -> str:
    return clean.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def quoted(text: str) -> str:
    """Mrkdwn ``text`` as a block quote, every line of it: words of the model's set apart from
    the card's own lines, which no line of theirs can pass for."""
    return "\n".join(f">{line}" for line in text.split("\n"))


def ephemeral_text(message: str) -> str:
    """A one-line reply (an ephemeral refusal, a command's answer) made safe and short."""
    return fit_text(message, SECTION_TEXT_LIMIT)


def fit_text(raw: str, limit: int, marker: str = TRUNCATED, *, code: bool = False) -> str:
    """``raw`` escaped and within ``limit`` characters, cut (never inside an entity) and
    marked when it is longer."""
    return _fit_flag(raw, limit, marker, code=code)[0]


def _fit_flag(
    raw: str, limit: int, marker: str = TRUNCATED, *, code: bool = False
) -> tuple[str, bool]:
    # Code (a call's arguments, an identifier) is shown exactly: mrkdwn makes no link of it.
    clean = printable(raw) if code else prose(raw)
    text = escape_entities(clean)
    if len(text) <= limit:
        return text, False
    return escape_entities(
        clean[: escaped_prefix(clean, max(0, limit - len(marker)))]
    ) + marker, True


_ENTITY_LENGTHS: Final = {"&": 5, "<": 4, ">": 4}


def escaped_prefix(clean: str, limit: int) -> int:
    """How many characters of ``clean`` (printable already) escape to ``limit`` at most."""
    size = 0
    for i, char in enumerate(clean):
        size += _ENTITY_LENGTHS.get(char, 1)
        if size > limit:
            return i
    return len(clean)


def plain_text(raw: str, limit: int, empty: str = "(blank)") -> str:
    """Plain text (buttons, options, titles): not parsed by Slack, so only cut, never empty."""
    text = printable(raw).strip() or empty
    if len(text) <= limit:
        return text
    return text[: limit - len(TRUNCATED)] + TRUNCATED


def code_safe(raw: str) -> str:
    """Text that cannot close the code block around it."""
    # Every backtick of a run of three or more apart: replacing "```" alone leaves three
    # together in a run of five or more.
    return _BACKTICKS.sub(lambda run: ZWSP.join(run.group()), printable(raw))


def code_block(
    raw: str, limit: int, marker: str = f"\n{TRUNCATED} (truncated)"
) -> tuple[str, bool]:
    """A ```code block``` of ``raw`` within ``limit`` characters; whether it was cut."""
    body, cut = _fit_flag(code_safe(raw), limit - 6, marker, code=True)
    return f"```{body}```", cut


def inline_code(raw: str, limit: int = 80) -> str:
    """`raw` as inline code (an identifier: a tool name, an id, an unknown principal)."""
    text = printable(raw).replace("`", "\u02cb").replace("\n", " ") or " "
    return f"`{fit_text(text, limit, code=True)}`"


def slack_date(at: datetime, fmt: str = "{date_short_pretty} at {time}") -> str:
    """``at`` in each reader's own time zone, with a UTC fallback for clients that cannot."""
    moment = at if at.tzinfo else at.replace(tzinfo=UTC)
    fallback = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{int(moment.timestamp())}^{fmt}|{fallback}>"


def time_ago(at: datetime) -> str:
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
    return inline_code(value)


def principals_text(values: Sequence[str], *, most: int = 15, nobody: str = "nobody") -> str:
    unique = list(dict.fromkeys(v for v in values if v))
    if not unique:
        return nobody
    shown = ", ".join(principal(v) for v in unique[:most])
    more = len(unique) - most
    return f"{shown} and {more} more" if more > 0 else shown


def person_or(user: str, *, nobody: str = "someone") -> str:
    return principal(user) if user else nobody


def reason_words(value: StopReason | str) -> str:
    return escape(stop_reason_words(value))


KIND_NAMES: Final[dict[RequestKind, str]] = {
    RequestKind.WAIT_APPROVAL: "approval",
    RequestKind.WAIT_USER: "question",
    RequestKind.WAIT_EFFECT: "uncertain effect",
    RequestKind.WAIT_PLAN: "plan",
}


def _safe_url(url: str) -> str | None:
    return url if _URL_RE.fullmatch(url) else None


def link_to(url: str | None, label: str) -> str:
    """``<url|label>`` for an http(s) URL with nothing that could end the token; else empty."""
    safe = _safe_url(url) if url else None
    return f"<{safe.replace('&', '&amp;')}|{label}>" if safe else ""


# ---------------------------------------------------------------------------------------------
# Blocks


def section_block(text: str) -> dict[str, Any]:
    return SectionBlock(text=MarkdownTextObject(text=text, verbatim=True)).to_dict()


def context_block(items: Sequence[str]) -> dict[str, Any]:
    elements = [MarkdownTextObject(text=item, verbatim=True) for item in items if item]
    return ContextBlock(elements=elements[:CONTEXT_ELEMENTS_LIMIT]).to_dict()


def button_element(
    text: str,
    action_id: str,
    value: str,
    style: str | None = None,
    confirm: ConfirmObject | None = None,
) -> ButtonElement:
    return ButtonElement(
        text=PlainTextObject(text=plain_text(text, BUTTON_TEXT_LIMIT), emoji=True),
        action_id=action_id,
        value=value,
        style=style,
        confirm=confirm,
    )


def actions_block(elements: Sequence[ButtonElement | StaticSelectElement]) -> dict[str, Any]:
    return ActionsBlock(elements=list(elements)).to_dict()


def checked_blocks(
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


def compact_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def arguments_section(arguments: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The call's arguments as pretty JSON in a code block; whether anything was cut."""
    shortened, cut_values = shorten(dict(arguments), CARD_VALUE_LIMIT)
    code, cut_whole = code_block(exact(shortened), CARD_ARGUMENTS_LIMIT)
    return section_block(code), cut_values or cut_whole


def fit_fallback(text: str) -> str:
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
