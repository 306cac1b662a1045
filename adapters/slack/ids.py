"""The opaque ids Kestrel's Slack messages carry: action and callback ids, button values, the
session id of a thread, and the outbox keys of the messages it posts.

Why opaque: a button's value, a modal's private_metadata and a block id come back from Slack
as the clicking client sent them, so anyone able to craft an interaction payload controls
them. They therefore name *what* is being answered (a request id, an option's index, a run id)
and never *who* may answer it or what was approved: who may decide is checked by the core from
the store and the policy (``ChatService.decide``), and the exact call approved is the one the
store holds for that request id. Parsers here reject anything that is not well formed, so a
crafted value is refused before it reaches the core.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Final

PREFIX: Final = "kestrel_"

# action_id of each interactive element
APPROVE_ONCE: Final = "kestrel_approve_once"
APPROVE_RUN: Final = "kestrel_approve_run"
DENY: Final = "kestrel_deny"
CHOOSE: Final = "kestrel_choose"
EFFECT_RETRY: Final = "kestrel_effect_retry"
EFFECT_DONE: Final = "kestrel_effect_done"
EFFECT_FAILED: Final = "kestrel_effect_failed"
SHOW_ARGUMENTS: Final = "kestrel_show_arguments"
FEEDBACK: Final = "kestrel_feedback"
ANSWER: Final = "kestrel_answer"
APPROVE_PLAN: Final = "kestrel_approve_plan"
STEP_BY_STEP: Final = "kestrel_step_by_step"

# Buttons in one actions block need distinct action ids: a question's option buttons are
# ``kestrel_choose:INDEX`` (the index is for Slack only; the value says which option). The
# static select of a long list of options is ``kestrel_choose`` itself. Match both with
# CHOOSE_PATTERN (e.g. ``app.action(CHOOSE_PATTERN)``).
CHOOSE_PATTERN: Final = re.compile(r"^kestrel_choose(?::[0-9]{1,4})?\Z")

# callback_id of each modal that submits
DENY_MODAL: Final = "kestrel_deny_modal"
ANSWER_MODAL: Final = "kestrel_answer_modal"

# block_id and action_id of the modals' inputs: view.state.values[BLOCK][ACTION].value
REASON_BLOCK: Final = "reason"
REASON_ACTION: Final = "reason"
ANSWER_BLOCK: Final = "answer"
ANSWER_ACTION: Final = "answer"

ACTION_IDS: Final = frozenset(
    {
        APPROVE_ONCE,
        APPROVE_RUN,
        DENY,
        CHOOSE,
        EFFECT_RETRY,
        EFFECT_DONE,
        EFFECT_FAILED,
        SHOW_ARGUMENTS,
        FEEDBACK,
        ANSWER,
        APPROVE_PLAN,
        STEP_BY_STEP,
    }
)
CALLBACK_IDS: Final = frozenset({DENY_MODAL, ANSWER_MODAL})

# Every action id Kestrel's messages carry, option buttons' ``kestrel_choose:INDEX`` included:
# one listener for all of them (``app.action(ACTION_PATTERN)``), then ``canonical_action``.
ACTION_PATTERN: Final = re.compile(
    "^(?:"
    + "|".join(re.escape(a) for a in sorted(ACTION_IDS))
    + f"|{re.escape(CHOOSE)}:[0-9]{{1,4}})\\Z"
)


def canonical_action(action_id: str) -> str | None:
    """The constant an incoming action id stands for (``kestrel_choose:3`` → ``CHOOSE``);
    None when it is none of Kestrel's."""
    if action_id in ACTION_IDS:
        return action_id
    return CHOOSE if CHOOSE_PATTERN.fullmatch(action_id) else None


# The core's ids (``req_3f9a…``, ``run_…``), kept a little looser so that any id the core may
# make passes: letters, digits, ``_ . -``, no colon (the values' separator), no space, and short
# enough for every Slack value field (a select option's value holds 150 characters).
_ID: Final = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}"
_ID_RE: Final = re.compile(_ID)
_CHOICE_RE: Final = re.compile(rf"({_ID}):(0|[1-9][0-9]{{0,3}})")
_FEEDBACK_RE: Final = re.compile(rf"(up|down):({_ID})")
# Slack ids: upper-case letters and digits (T…/E… teams, C…/G…/D… conversations).
_SLACK_ID_RE: Final = re.compile(r"[A-Z0-9]{2,32}")
_TS_RE: Final = re.compile(r"[0-9]{1,12}\.[0-9]{1,9}")


def is_core_id(value: str) -> bool:
    """Whether ``value`` looks like an id the core made (``req_3f9a…``, ``run_…``)."""
    return _ID_RE.fullmatch(value) is not None


def parse_request_value(value: str) -> str | None:
    """The request id a request's button carries (its value is the id itself), or None."""
    return value if is_core_id(value) else None


def choice_action_id(index: int) -> str:
    """The action id of option ``index``'s button (unique within its actions block)."""
    if not 0 <= index <= 9999:
        raise ValueError(f"no action id for option {index}")
    return f"{CHOOSE}:{index}"


def choice_value(request_id: str, index: int) -> str:
    """The value of the button (or select option) that picks option ``index`` of a question."""
    if not is_core_id(request_id) or not 0 <= index <= 9999:
        raise ValueError(f"no choice value for {request_id!r} option {index}")
    return f"{request_id}:{index}"


def parse_choice(value: str) -> tuple[str, int] | None:
    """``(request_id, option_index)`` from a choice value; None when it is malformed."""
    match = _CHOICE_RE.fullmatch(value)
    if match is None:
        return None
    return match.group(1), int(match.group(2))


def feedback_value(run_id: str, *, positive: bool) -> str:
    """The value of a feedback button on a run's answer: ``up:RUN`` or ``down:RUN``."""
    if not is_core_id(run_id):
        raise ValueError(f"not a run id: {run_id!r}")
    return f"{'up' if positive else 'down'}:{run_id}"


def parse_feedback(value: str) -> tuple[bool, str] | None:
    """``(positive, run_id)`` from a feedback button's value; None when it is malformed."""
    match = _FEEDBACK_RE.fullmatch(value)
    if match is None:
        return None
    return match.group(1) == "up", match.group(2)


@dataclass(frozen=True)
class SlackThread:
    """Where a Slack session lives: a workspace, a channel and the thread's root ts."""

    team: str
    channel: str
    thread_ts: str


def _is_thread(team: str, channel: str, thread_ts: str) -> bool:
    return bool(
        _SLACK_ID_RE.fullmatch(team)
        and _SLACK_ID_RE.fullmatch(channel)
        and _TS_RE.fullmatch(thread_ts)
    )


def thread_session_id(team: str, channel: str, thread_ts: str) -> str:
    """The session id of a Slack thread: ``slack:TEAM:CHANNEL:THREAD_TS``."""
    if not _is_thread(team, channel, thread_ts):
        raise ValueError(f"not a Slack thread: {team!r} {channel!r} {thread_ts!r}")
    return f"slack:{team}:{channel}:{thread_ts}"


def parse_thread_session(session_id: str) -> SlackThread | None:
    """The thread a session id names; None for another platform's session or a malformed id."""
    parts = session_id.split(":")
    if len(parts) != 4 or parts[0] != "slack" or not _is_thread(*parts[1:]):
        return None
    return SlackThread(parts[1], parts[2], parts[3])


@dataclass(frozen=True)
class ModalOrigin:
    """Where a form was opened: the request it answers, its thread, and the card clicked."""

    request_id: str
    thread: SlackThread
    card: str


def seal_modal(key: bytes, origin: ModalOrigin) -> str:
    """A form's private_metadata: its origin, with a MAC so that a submission cannot claim to
    come from another thread or card than the one the form was opened from."""
    thread = origin.thread
    parts = [origin.request_id, thread.team, thread.channel, thread.thread_ts, origin.card]
    fields = "|".join(parts)
    return f"{fields}|{_mac(key, fields)}"


def open_modal(key: bytes, metadata: str) -> ModalOrigin | None:
    """The origin a form's private_metadata seals; None if it is not one Kestrel sealed."""
    fields, _, mac = metadata.rpartition("|")
    parts = fields.split("|")
    if len(parts) != 5 or not hmac.compare_digest(mac, _mac(key, fields)):
        return None
    request_id, team, channel, thread_ts, card = parts
    return ModalOrigin(request_id, SlackThread(team, channel, thread_ts), card)


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:32]
