"""How Kestrel's thread messages look in Discord: message JSON as the REST API takes it.

Cards are an embed (what is asked, its exact arguments, why, who asked, who may answer, the
deadline) with a row of buttons whose custom ids carry only the request id. An open card and
a reminder notify exactly the users and roles who may answer (unless pings are off): their
``allowed_mentions`` names those and nothing else, so a mention in any other text (a model's,
a tool's, a person's) pings nobody. Every other message says ``allowed_mentions:
{"parse": []}``. No text from a model, a tool or a person shows a link whose label hides its
target: outside the code blocks Kestrel builds, it goes through ``_shown`` (or ``_plain``),
which shows ``label (target)``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from adapters.discord import ids
from adapters.discord.target import DiscordTarget
from bot.chat.cards import (
    PLAN_BINDING,
    PLAN_BUTTONS,
    closing,
    exact,
    exact_calls,
    listed,
    off_plan_words,
    options_shown,
    plan_steps,
    pretty,
    shorten,
    title,
)
from bot.chat.contract import GROUP_KINDS
from bot.chat.links import RunLink
from bot.chat.service import RequestView, RunView
from bot.chat.threads import Body
from bot.chat.words import (
    ORIGINS_TITLE,
    budget_words,
    origin_lines,
    status_words,
    stop_reason_words,
)
from bot.domain import (
    DecisionKind,
    Request,
    RequestKind,
    RequestStatus,
    RunStatus,
    Session,
    TerminalResult,
)
from bot.text import flattened, printable, unmask_links

CONTENT_LIMIT = 2000
EMBED_LIMIT = 6000
CUT_NOTE = "\n…(the rest is cut: `kestrel runs show` or the run's page has it all)"
FIELD_LIMIT = 1024
DESCRIPTION_LIMIT = 4096
# How much of how a plan differs from the approved one its card shows (the run's page, all).
OFF_PLAN_LIMIT = 1500
VALUE_LIMIT = 200
BUTTONS_PER_ROW = 5
ACTION_ROWS = 5  # a message's rows of buttons or menus, at most
SELECT_LIMIT = 25
# Options five menus hold; past that, four menus hold the first ``IN_MENUS`` and the fifth
# row is the Answer form, where any option can be typed (a sixth row has the card refused).
MENU_ROOM = SELECT_LIMIT * ACTION_ROWS
IN_MENUS = SELECT_LIMIT * (ACTION_ROWS - 1)
MAX_CONTINUATIONS = 10
NO_PINGS: dict[str, list[str]] = {"parse": []}
MORE_NOT_SHOWN = "{dropped} more not shown"
# The ephemeral messages that show a request's exact arguments: the response and follow-ups.
ARGUMENTS_MESSAGES = 5
_BACKTICKS = re.compile(r"`{3,}")
STEPS_NOT_SHOWN = (
    "{dropped} more not shown: too long for one card, so approve step by step"
    " (`kestrel runs show` or the run's page has every step)"
)
MAX_PINGED = 100  # Discord's limit on each of allowed_mentions' users and roles

PRIMARY, SECONDARY, SUCCESS, DANGER, LINK = 1, 2, 3, 4, 5
COLOR_OPEN, COLOR_CLOSED, COLOR_OK, COLOR_FAILED = 0xF2A33A, 0x8A8F98, 0x3BA55D, 0xED4245


class DiscordLook:
    """Message bodies for the outbox; a target is a thread (its channel id) in a guild.

    With ``link``, cards and answers carry a "View run" link button to the run's page. With
    ``pings``, an open card and a reminder notify the users and roles who may answer.
    """

    platform = "discord"

    def __init__(self, link: RunLink | None = None, *, pings: bool = True) -> None:
        self._link = link
        self._pings = pings

    def target(self, session: Session) -> DiscordTarget | None:
        """The thread a Discord session lives in; None for another platform's session."""
        thread = ids.parse_thread_session(session.id)
        if thread is None:
            return None
        return DiscordTarget(thread.guild, thread.thread)

    def card(self, view: RequestView) -> Body:
        """The request's card: open with its buttons, or closed with who decided."""
        request = view.request
        is_open = view.status is RequestStatus.OPEN
        fields = []
        cut = False
        if request.kind not in (RequestKind.WAIT_USER, RequestKind.WAIT_PLAN):
            code, cut = _code(request.arguments)
            fields.append(_field("Arguments", code))
        if request.origins:
            lines = origin_lines(request.origins, _inline, lambda warning: f"**{warning}**")
            fields.append(_field(ORIGINS_TITLE, "\n".join(lines)))
        fields.append(_field("Requested by", person(request.requested_by) or "the run", True))
        if is_open:
            who = ", ".join(principal(p) for p in view.may_answer) or "nobody"
            fields.append(_field("May answer", who, True))
            if request.deadline is not None:
                fields.append(_field("Expires", when(request.deadline), True))
        else:
            fields.append(_field("Outcome", closed_line(view)))
        # A plan's steps last: an embed over Discord's limit loses fields from its end.
        steps, steps_cut = _step_fields(view)
        fields += steps
        head = title(request, open_=is_open)
        embed, dropped = _within_embed_limit(
            {
                "title": _cut(printable(f"{head}: {request.tool}"), 256),
                "description": _cut(_description(view), DESCRIPTION_LIMIT),
                "color": COLOR_OPEN if is_open else COLOR_CLOSED,
                "fields": fields,
            },
            more=STEPS_NOT_SHOWN if request.steps else MORE_NOT_SHOWN,
        )
        # A plan's approval covers its steps as shown: with steps left off, only step by step.
        rows = _buttons(view, whole=not (dropped and request.steps)) if is_open else []
        if rows and (cut or steps_cut or (dropped and request.steps)):
            # What is approved must be readable whole before the click.
            more = _button("Full arguments", ids.custom_id("arguments", request.id), SECONDARY)
            rows[-1] = {**rows[-1], "components": [*rows[-1]["components"], more]}
        body = {"content": "", "embeds": [embed], "components": rows, "allowed_mentions": NO_PINGS}
        if is_open:
            # Mentions in an embed never notify: the people are named in the content.
            body.update(self._calling(view.may_answer, "Waiting on {who}."))
        return self._linked(body, request.run_id, request.created_at)

    def answer(self, result: TerminalResult, run_id: str, at: datetime) -> list[Body]:
        """The answer in as many messages as it takes (up to a limit), the payload as fields."""
        text = result.text.strip()
        if result.status is not RunStatus.COMPLETED:
            text = _ending(result) + (f"\n\n{text}" if text else "")
        text = text or "(no text)"
        parts = _split(_shown(text), CONTENT_LIMIT - len(CUT_NOTE))
        if len(parts) > 1 + MAX_CONTINUATIONS:
            parts = [*parts[:MAX_CONTINUATIONS], parts[MAX_CONTINUATIONS] + CUT_NOTE]
        bodies: list[Body] = [{"content": part, "allowed_mentions": NO_PINGS} for part in parts]
        if result.payload:
            color = COLOR_OK if result.status is RunStatus.COMPLETED else COLOR_FAILED
            items = list(result.payload.items())
            fields = [
                _field(_shown(str(key))[:256], _cut(_shown(_compact(value)), FIELD_LIMIT), True)
                for key, value in items[:24]
            ]
            if len(items) > 24:
                fields.append(_field("…", f"and {len(items) - 24} more (the run's page has all)"))
            embed = {"title": "Result", "color": color, "fields": fields}
            bodies[-1]["embeds"] = [_within_embed_limit(embed)[0]]
        bodies[0] = self._linked(bodies[0], run_id, at)
        return bodies

    def _linked(self, body: Body, run_id: str, issued: datetime) -> Body:
        if self._link is None:
            return body
        url = self._link(run_id, issued)
        button = {"type": 2, "style": LINK, "label": "View run", "url": url}
        rows = list(body.get("components") or [])
        if (
            rows
            and len(rows[-1]["components"]) < BUTTONS_PER_ROW
            and rows[-1]["components"][0]["type"] == 2
        ):
            rows[-1] = {**rows[-1], "components": [*rows[-1]["components"], button]}
        elif len(rows) < ACTION_ROWS:
            rows.append(_row([button]))
        else:
            # Rows full (25 options): a sixth row would have Discord refuse the whole card, so
            # the embed's title links to the run's page instead.
            embeds = list(body.get("embeds") or [])
            if embeds:
                embeds[0] = {**embeds[0], "url": url}
            return {**body, "embeds": embeds} if embeds else body
        return {**body, "components": rows}

    def reminder(self, view: RequestView) -> Body:
        """A reminder naming who may answer, notifying them (with ``pings``)."""
        who = ", ".join(principal(p) for p in view.may_answer) or "someone allowed to answer"
        content = f"Reminder: the request for `{view.request.tool}` above still waits on {who}."
        content = _cut(content, CONTENT_LIMIT)
        body: Body = {"content": content, "allowed_mentions": NO_PINGS}
        if self._pings:
            body["allowed_mentions"] = pinged(view.may_answer)
        return body

    def _calling(self, may_answer: Sequence[str], line: str) -> Body:
        """The content naming who may answer, and the mentions that notify exactly them; nothing
        when pings are off or nobody can be pinged (``*``, a channel, another platform's ids)."""
        allowed = pinged(may_answer)
        if not self._pings or not (allowed["users"] or allowed["roles"]):
            return {}
        who = ", ".join(principal(p) for p in may_answer)
        return {"content": _cut(line.format(who=who), CONTENT_LIMIT), "allowed_mentions": allowed}


def _ending(result: TerminalResult) -> str:
    """How a run that did not complete ended: Kestrel's own words in bold, then its error in a
    code block, as the error may quote a model's or a tool's text (backticks, markdown) that
    would otherwise close the bold line and take over the message's layout."""
    line = f"**{status_words(result.status.value, result.stop_reason)}**"
    error = result.error.strip()
    return f"{line}\n```\n{_fenced(error)}\n```" if error else line


def working(lines: Sequence[str]) -> Body:
    """The status message edited in place while a run works: its last steps."""
    shown = "\n".join(f"• {_shown(line)}" for line in list(lines)[-10:])
    return {
        "content": _cut(f"Working…\n{shown}".strip(), CONTENT_LIMIT),
        "allowed_mentions": NO_PINGS,
    }


def status_text(view: RunView) -> str:
    """A run's status for ``/kestrel status``: state, what it waits on, budgets used."""
    record = view.record
    lines = [f"Run `{record.id}`: **{record.status.value}**"]
    if record.stop_reason:
        lines[0] += f" ({stop_reason_words(record.stop_reason)})"
    lines.append(f"Requested by {person(record.requested_by) or 'nobody recorded'}")
    for request in view.open_requests:
        deadline = f", expires {when(request.deadline)}" if request.deadline else ""
        lines.append(f"Waits on: {request.kind.value} `{request.tool}`{deadline}")
    used = budget_words(view.budgets_used)
    if used:
        lines.append(f"Budgets: {used}")
    return _cut("\n".join(lines), CONTENT_LIMIT)


def closed_line(view: RequestView) -> str:
    """How a closed request ended: "Approved by @x <time>", "Denied by @x: reason"…"""
    end = closing(view.status, view.decision, view.approvers)
    line = end.phrase
    if end.by:
        line += f" by {listed([person(user) for user in end.by])}"
    if end.at is not None:
        line += f" {when(end.at)}"
    if end.said:
        line += f": {_cut(_shown(end.said), 500)}"
    return line


def person(user: str) -> str:
    """A user as Discord shows them (``<@id>``); other names as code."""
    if not user:
        return ""
    return f"<@{user}>" if user.isdigit() else f"`{_plain(user)}`"


def pinged(may_answer: Sequence[str]) -> dict[str, list[str]]:
    """``allowed_mentions`` notifying exactly these principals' Discord users and roles (never
    ``@everyone``, a channel, or anyone a mention elsewhere in the message names)."""
    users: dict[str, None] = {}
    roles: dict[str, None] = {}
    for value in may_answer:
        kind, _, ident = value.partition(":")
        if value.isdigit():
            users[value] = None
        elif kind in GROUP_KINDS and ident.isdigit():
            roles[ident] = None
    return {"parse": [], "users": list(users)[:MAX_PINGED], "roles": list(roles)[:MAX_PINGED]}


def principal(value: str) -> str:
    """A policy principal: a user, ``group:ROLE`` (or ``role:ROLE``), ``channel:ID`` or ``*``."""
    kind, _, ident = value.partition(":")
    if value == "*":
        return "anyone in the server"
    if kind in GROUP_KINDS and ident.isdigit():
        return f"<@&{ident}>"
    if kind == "channel" and ident.isdigit():
        return f"<#{ident}>"
    return person(value)


def when(moment: datetime) -> str:
    """A time each reader sees in their own zone."""
    return f"<t:{int(moment.timestamp())}:f>"


def _description(view: RequestView) -> str:
    request = view.request
    if request.kind is RequestKind.WAIT_USER:
        return _question(view)
    if request.kind is RequestKind.WAIT_PLAN:
        summary = _plain(request.prompt) or "(no summary)"
        # Cut so that what its approval binds, below, always shows.
        off = _cut(_plain(off_plan_words(request)), OFF_PLAN_LIMIT) if request.off_plan else ""
        off = f"\n\n**{off}**" if off else ""
        return f"{summary}{off}\n\n*{PLAN_BINDING}*"
    reason = view.reason.strip()
    why = f"**Why:**\n{_quoted(_plain(reason))}" if reason else ""
    if request.off_plan:
        why += f"\n\n**{_plain(off_plan_words(request))}**"
    return why.strip()


def _question(view: RequestView) -> str:
    """A question, and the options its buttons or menus do not show whole: all of them when
    one is too long for its label, those past the menus when there are more than they hold.
    How to give one of those is said before the list, which Discord's limit may cut."""
    question = _plain(view.request.prompt) or "(no question text)"
    options = options_shown(view.request)
    past_menus = len(options) > MENU_ROOM and view.status is RequestStatus.OPEN
    first = 0 if _numbered(options) else IN_MENUS if past_menus else len(options)
    if first == len(options):
        return question
    how = (
        f"Options {IN_MENUS + 1} to {len(options)} are in no menu: press **Answer** and type"
        " one, or reply in the thread.\n"
        if past_menus
        else ""
    )
    listed = "\n".join(
        f"{n}. {_plain(o.strip()) or '(empty)'}" for n, o in enumerate(options[first:], first + 1)
    )
    return f"{question}\n\n{how}**Options:**\n{listed}"


def _step_fields(view: RequestView) -> tuple[list[dict[str, Any]], bool]:
    """A plan's steps, one field each: the tool, why, the exact arguments, their origins; and
    whether a step's arguments or field was cut."""
    fields = []
    cut = False
    for step in plan_steps(view.request):
        free = " (needs no approval)" if not step.gated else ""
        # On one line: a line break in the model's words would start lines of the field's own.
        lines = [f"*{_plain(flattened(step.why))}*"] if step.why else []
        planned = view.request.steps[step.number - 1]
        code, shortened = _code(planned.arguments)
        lines.append(code)
        lines += origin_lines(planned.origins, _inline, lambda warning: f"**{warning}**")
        name = printable(f"{step.number}. {step.tool}{free}")
        value = "\n".join(lines)
        cut = cut or shortened or len(value) > FIELD_LIMIT
        fields.append(_field(_cut(name, 256), value))
    return fields, cut


# Each plan button's custom id kind and style, by the decision it makes.
_PLAN_BUTTON_IDS = {
    DecisionKind.APPROVE: ("approve", SUCCESS),
    DecisionKind.STEP_BY_STEP: ("step_by_step", PRIMARY),
    DecisionKind.DENY: ("deny", DANGER),
}


def _buttons(view: RequestView, *, whole: bool = True) -> list[dict[str, Any]]:
    request = view.request
    match request.kind:
        case RequestKind.WAIT_APPROVAL:
            buttons = [_button("Approve once", ids.custom_id("approve", request.id), SUCCESS)]
            if request.approvals_needed <= 1:
                buttons.append(
                    _button("Approve for this run", ids.custom_id("approve_run", request.id))
                )
            buttons.append(_button("Deny", ids.custom_id("deny", request.id), DANGER))
            return [_row(buttons)]
        case RequestKind.WAIT_EFFECT:
            verbs = [("Retry", "retry", SECONDARY), ("Mark done", "done", SUCCESS)]
            verbs.append(("Mark failed", "failed", DANGER))
            return [
                _row(
                    [
                        _button(label, ids.custom_id("effect", request.id, verb), style)
                        for label, verb, style in verbs
                    ]
                )
            ]
        case RequestKind.WAIT_USER:
            return _question_components(view)
        case RequestKind.WAIT_PLAN:
            plan = []
            for label, kind in PLAN_BUTTONS:
                if kind is DecisionKind.APPROVE and not whole:
                    continue
                id_kind, style = _PLAN_BUTTON_IDS[kind]
                plan.append(_button(label, ids.custom_id(id_kind, request.id), style))
            return [_row(plan)]


def _question_components(view: RequestView) -> list[dict[str, Any]]:
    request = view.request
    options = options_shown(request)
    if not options:
        return [_row([_button("Answer", ids.custom_id("answer", request.id), PRIMARY)])]
    if len(options) <= BUTTONS_PER_ROW * 5:
        labels = _option_labels(options)
        buttons = [
            _button(label, ids.custom_id("choose", request.id, str(i)), SECONDARY)
            for i, label in enumerate(labels)
        ]
        return [_row(buttons[i : i + BUTTONS_PER_ROW]) for i in range(0, len(buttons), 5)]
    labels = _option_labels(options)
    if len(labels) <= MENU_ROOM:
        return _menus(request.id, labels)
    answer = _button("Answer", ids.custom_id("answer", request.id), PRIMARY)
    return [*_menus(request.id, labels[:IN_MENUS]), _row([answer])]


def _menus(request_id: str, labels: Sequence[str]) -> list[dict[str, Any]]:
    """A row with a menu for each ``SELECT_LIMIT`` options; an item's value is its index."""
    rows = []
    for m, first in enumerate(range(0, len(labels), SELECT_LIMIT)):
        chunk = labels[first : first + SELECT_LIMIT]
        select = {
            "type": 3,
            "custom_id": ids.custom_id("choose", request_id, f"m{m}"),
            "placeholder": f"Choose an answer ({first + 1} to {first + len(chunk)})",
            "options": [
                {"label": _label(option, 100), "value": str(first + i)}
                for i, option in enumerate(chunk)
            ],
        }
        rows.append(_row([select]))
    return rows


def _numbered(options: Sequence[str]) -> bool:
    """Whether a question's options are numbered: one is too long for its button or menu item
    (options alike but for their ends would look the same), so all are listed whole."""
    limit = 80 if len(options) <= BUTTONS_PER_ROW * 5 else 100
    return any(len(" ".join(printable(option).split())) > limit for option in options)


def _option_labels(options: Sequence[str]) -> list[str]:
    """The options as their buttons or menu items show them (before cutting)."""
    if not _numbered(options):
        return list(options)
    return [f"{n}. {' '.join(printable(o).split()) or '(empty)'}" for n, o in enumerate(options, 1)]


def _button(label: str, custom_id: str, style: int = PRIMARY) -> dict[str, Any]:
    return {"type": 2, "style": style, "label": _label(label, 80), "custom_id": custom_id}


def _label(text: str, limit: int) -> str:
    """A component label: Discord refuses an empty one."""
    return _cut(" ".join(printable(text).split()) or "(empty)", limit)


def _row(components: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": 1, "components": components}


def _field(name: str, value: str, inline: bool = False) -> dict[str, Any]:
    # Discord refuses an empty name or value.
    return {"name": name.strip() or "-", "value": _cut(value or "-", FIELD_LIMIT), "inline": inline}


def _within_embed_limit(
    embed: dict[str, Any], more: str = MORE_NOT_SHOWN
) -> tuple[dict[str, Any], int]:
    """The embed cut to Discord's 6,000 characters in all: fields dropped from the end (and
    said so, in ``more``), then the description shortened; and how many fields were dropped."""
    fields = list(embed.get("fields") or [])

    def size() -> int:
        texts = [embed.get("title", ""), embed.get("description", "")]
        texts += [part for f in fields for part in (f["name"], f["value"])]
        return sum(len(t) for t in texts)

    dropped = 0
    while size() > EMBED_LIMIT - len(more) - 20 and len(fields) > 1:
        fields.pop()
        dropped += 1
    if dropped:
        fields.append(_field("…", more.format(dropped=dropped)))
    embed = {**embed, "fields": fields}
    excess = size() - EMBED_LIMIT
    if excess > 0:
        embed["description"] = _cut(
            embed.get("description", ""), max(1, len(embed.get("description", "")) - excess)
        )
    return embed, dropped


def _code(arguments: dict[str, Any]) -> tuple[str, bool]:
    """The arguments as a code block for a field, each long value cut; whether any was cut."""
    shortened, cut = shorten(arguments, VALUE_LIMIT)
    body = _fenced(exact(shortened))
    fence = "```json\n{}\n```"
    room = FIELD_LIMIT - len(fence) + 2
    if len(body) <= room:
        return fence.format(body), cut
    return fence.format(body[: room - 1] + "…"), True


def _fenced(code: str) -> str:
    """Code to show inside a fence: printable, and no backticks that would close it."""
    # Every backtick of a run of three or more apart: replacing "```" alone leaves three
    # together in a run of four or more, and Discord ends the block at any three.
    return _BACKTICKS.sub(lambda run: "\u200b".join(run.group()), printable(code))


def arguments_messages(request: Request) -> list[str]:
    """A request's exact arguments (a plan's steps: each its tool and arguments), pretty JSON
    in a code block over at most ``ARGUMENTS_MESSAGES`` messages; the last says so when even
    they cannot hold it all."""
    head = f"Full arguments of {_inline(request.tool)} (request {_inline(request.id)}):"
    text = f"{head}\n```json\n{_fenced(exact(exact_calls(request)))}\n```"
    parts = _split(text, CONTENT_LIMIT - len(CUT_NOTE))
    if len(parts) <= ARGUMENTS_MESSAGES:
        return parts
    return [*parts[: ARGUMENTS_MESSAGES - 1], parts[ARGUMENTS_MESSAGES - 1] + CUT_NOTE]


def _inline(text: str) -> str:
    """``text`` as inline code on one line (a backtick in it would end the span)."""
    return "`" + (printable(text).replace("`", "\u02cb").replace("\n", " ") or " ") + "`"


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else pretty(value)


def _quoted(text: str) -> str:
    """``text`` as a block quote, every line of it: the model's words set apart from the
    card's own lines, which no line of theirs can pass for."""
    return "\n".join(f"> {line}" for line in text.split("\n"))


def _plain(text: str) -> str:
    """Text as written, with Discord's mentions defused (no ping, no fake link)."""
    return _shown(text).replace("@", "@\u200b").replace("<#", "<\u200b#")


def _shown(text: str) -> str:
    """Model, tool or person text outside code: printable (no direction override reorders
    it), no masked link hides its target."""
    return unmask_links(printable(text))


def runs_listing(lines: list[str]) -> str:
    """``/kestrel runs`` in one message: as many whole lines as fit (a link cut in the middle
    leads nowhere), then how many were left out."""
    if not lines:
        return "Nothing is waiting."
    shown = list(lines)
    while True:
        left = len(lines) - len(shown)
        rest = [f"… and {left} more: `kestrel runs pending` lists them all"] if left else []
        text = "\n".join(shown + rest)
        if len(text) <= CONTENT_LIMIT:
            return text
        shown.pop()


def note_text(text: str) -> str:
    """A note for one person (a refusal, a command's answer), as safe as any other text."""
    return _cut(_shown(text), CONTENT_LIMIT)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _split(text: str, limit: int) -> list[str]:
    """Parts of at most ``limit`` characters, cut at lines where possible; a code block cut in
    two is closed at the end of one part and opened again at the start of the next."""
    parts = []
    room = limit - 8  # for a fence closed and opened again
    while len(text) > limit:
        cut = text.rfind("\n", 0, room)
        cut = cut if cut > room // 2 else room
        part, text = text[:cut], text[cut:].lstrip("\n")
        if part.count("```") % 2:
            part, text = part + "\n```", "```\n" + text
        parts.append(part)
    return [*parts, text]
