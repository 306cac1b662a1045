"""What waits on people: the ephemeral ``/kestrel runs`` listing and the App Home view.
Post the listing ephemerally: it mentions people.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slack_sdk.models.blocks import (
    HeaderBlock,
    PlainTextObject,
)
from slack_sdk.models.views import View

from adapters.slack.mrkdwn import (
    KIND_NAMES,
    MESSAGE_BLOCKS_LIMIT,
    SECTION_TEXT_LIMIT,
    VIEW_BLOCKS_LIMIT,
    SlackMessage,
    checked_blocks,
    context_block,
    fit_text,
    inline_code,
    link_to,
    person_or,
    principal,
    principals_text,
    section_block,
    slack_date,
    time_ago,
)
from bot.chat.service import PendingRequest
from bot.domain import (
    RequestKind,
)


def _item_line(item: PendingRequest, *, with_run: bool, unshown: str = "") -> str:
    request = item.request
    parts = [f"{KIND_NAMES[request.kind]} {inline_code(request.tool)}"]
    if with_run:
        parts.append(f"run {inline_code(request.run_id)}")
    parts.append(f"asked {time_ago(request.created_at)}")
    if request.deadline is not None:
        parts.append(f"expires {slack_date(request.deadline)}")
    parts.append(f"may answer: {principals_text(item.may_answer, most=5)}")
    if item.note:
        parts.append(f"_{fit_text(item.note, 200)}_")
    if unshown:  # nobody in the thread can decide it: the terminal can
        parts.append(
            f"*card not shown* ({inline_code(fit_text(unshown, 200))}): `kestrel runs pending`"
        )
    return " · ".join(parts)


def runs_message(
    pending: Sequence[PendingRequest],
    links: Mapping[str, str],
    unshown: Mapping[str, str] | None = None,
) -> SlackMessage:
    """The workspace's open requests grouped by run, oldest first, each run linked to its
    thread (``links``: run id → permalink), each request whose card was never shown saying so
    (``unshown``: request id → why). Post it ephemerally: it mentions people."""
    unshown = unshown or {}
    if not pending:
        return SlackMessage(
            "Nothing is waiting.", checked_blocks([section_block("Nothing is waiting.")])
        )
    runs: dict[str, list[PendingRequest]] = {}
    for item in pending:
        runs.setdefault(item.request.run_id, []).append(item)
    summary = f"*Open requests:* {len(pending)} in {len(runs)} run(s)"
    blocks = [section_block(summary)]
    room = MESSAGE_BLOCKS_LIMIT - 2  # the summary, and a last line for what does not fit
    for shown, (run_id, items) in enumerate(runs.items()):
        if shown == room:
            rest = sum(len(later) for later in list(runs.values())[room:])
            blocks.append(context_block([f"and {len(runs) - room} more run(s), {rest} request(s)"]))
            break
        head = f"*Run* {inline_code(run_id)}"
        link = link_to(links.get(run_id), "thread")
        if link:
            head += f" · {link}"
        blocks.append(
            section_block(
                _lines_within(
                    head,
                    [
                        _item_line(i, with_run=False, unshown=unshown.get(i.request.id, ""))
                        for i in items
                    ],
                )
            )
        )
    text = f"{len(pending)} open request(s) in {len(runs)} run(s)"
    return SlackMessage(text, checked_blocks(blocks))


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
            section_block(
                f"Nothing is waiting on you, {principal(user)}. :sparkles:\nWhen a run needs"
                " your approval or asks you a question, it shows up here with a link to its"
                " thread."
            )
        )
        blocks.append(
            context_block(
                [
                    "Mention @Kestrel in a channel to start a run · `/kestrel runs` lists every"
                    " open request"
                ]
            )
        )
        return View(type="home", blocks=checked_blocks(blocks, VIEW_BLOCKS_LIMIT)).to_dict()
    groups = [
        (RequestKind.WAIT_APPROVAL, "Approvals you may decide"),
        (RequestKind.WAIT_USER, "Questions for you"),
        (RequestKind.WAIT_EFFECT, "Uncertain effects you may settle"),
        (RequestKind.WAIT_PLAN, "Plans you may decide"),
    ]
    room = VIEW_BLOCKS_LIMIT - len(blocks) - 2 * len(groups) - 2
    for kind, title in groups:
        mine = [item for item in items if item.request.kind is kind]
        if not mine:
            continue
        blocks.append(section_block(f"*{title}* ({len(mine)})"))
        for n, item in enumerate(mine):
            if room <= 0:
                blocks.append(context_block([f"and {len(mine) - n} more"]))
                break
            blocks.append(section_block(_home_item(item, links)))
            room -= 1
    blocks.append(
        context_block(
            ["The card in each thread has the buttons; a question is answered by replying there."]
        )
    )
    return View(type="home", blocks=checked_blocks(blocks, VIEW_BLOCKS_LIMIT)).to_dict()


def _home_item(item: PendingRequest, links: Mapping[str, str]) -> str:
    request = item.request
    by = person_or(request.requested_by, nobody="the run")
    head = f"{inline_code(request.tool)} · requested by {by}"
    link = link_to(links.get(request.run_id), "open the thread")
    if link:
        head += f" · {link}"
    lines = [head]
    if request.kind in (RequestKind.WAIT_USER, RequestKind.WAIT_PLAN) and request.prompt.strip():
        lines.append(f"> {fit_text(' '.join(request.prompt.split()), 500)}")
    if request.steps:
        lines.append(
            f"{len(request.steps)} steps: "
            + ", ".join(inline_code(s.tool) for s in request.steps[:5])
        )
    when = f"asked {time_ago(request.created_at)}"
    if request.deadline is not None:
        when += f" · expires {slack_date(request.deadline)}"
    lines.append(when)
    return "\n".join(lines)
