"""Whether a signed body from Slack is one bolt and the listeners can read, before they read it.

Bolt reads a body the way ``read_body`` does (JSON, ``payload=<json>`` or a plain form), then
picks ids out of it assuming Slack's types: a ``team`` that is a number, an ``event`` that is a
string, ``actions`` that are empty make it raise. ``problem`` names the first such field, so
that the request is refused in one line instead of failing inside bolt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import parse_qsl

from bot.nesting import deeper_than

# Slack's own payloads nest about a dozen levels (a rich text block inside a message inside an
# action); far more is not Slack's.
MAX_DEPTH: Final = 64

# Fields bolt's id extraction reads at any level it looks into: an id, or an object with ``id``.
_ID_FIELDS: Final = ("team", "user", "channel", "enterprise")
# Fields it looks into as objects when present.
_INNER_OBJECTS: Final = ("event", "message", "previous_message", "item", "assistant_thread")
# Fields the interactivity listeners read as objects (``body["channel"]["id"]``...).
_ACTION_OBJECTS: Final = ("user", "team", "channel", "container", "message")
# Fields the listeners read as text where present, by the object they are in ("": the body):
# a number or an object there would be taken for an id, a card or a reason in its ``str``.
_CLICK_TEXTS: Final = {
    "": ("trigger_id",),
    "user": ("id", "team_id"),
    "team": ("id",),
    "channel": ("id",),
    "container": ("channel_id", "message_ts", "thread_ts"),
    "message": ("ts", "thread_ts"),
}
_VIEW_TEXTS: Final = {"": ("trigger_id",), "user": ("id", "team_id"), "view": ("private_metadata",)}
_EVENT_TEXTS: Final = {
    "event": ("user", "channel", "ts", "thread_ts", "text", "subtype", "bot_id", "user_team", "tab")
}
# A slash command's fields its listener reads as text.
_COMMAND_TEXTS: Final = (
    "command",
    "text",
    "team_id",
    "channel_id",
    "user_id",
    "user_team_id",
    "response_url",
    "trigger_id",
)
# The events whose fields the listeners read as text (``_EVENT_TEXTS``).
_PEOPLES_EVENTS: Final = frozenset({"app_mention", "message", "app_home_opened"})


class Unreadable(ValueError):
    """The body is not JSON, not a form, or nests too deep; the message says which."""


def read_body(text: str, content_type: str) -> Any:
    """The body as bolt will read it (its ``parse_body``): JSON when declared so or when it
    starts with ``{``, else a form, whose ``payload`` field (if any) is JSON."""
    if content_type == "application/json" or text.startswith("{"):
        return _json(text, "the body")
    if "payload" not in text:
        return dict(parse_qsl(text, keep_blank_values=True))
    payload = dict(parse_qsl(text, keep_blank_values=True)).get("payload")
    return {} if payload is None else _json(payload, "the payload")


def _json(text: str, what: str) -> Any:
    try:
        value = json.loads(text)
    except RecursionError:
        raise Unreadable(f"{what} nests too deep") from None
    except ValueError:
        raise Unreadable(f"{what} is not JSON") from None
    if deeper_than(value, MAX_DEPTH):
        raise Unreadable(f"{what} nests more than {MAX_DEPTH} levels")
    return value


def problem(body: object) -> str | None:
    """What makes ``body`` (from ``read_body``) unfit for bolt, or None when it is fit."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    if "type" not in body:
        # A slash command's form, or the SSL check Slack makes on a command's URL.
        if isinstance(body.get("command"), str):
            return _command_problem(body)
        return None if "ssl_check" in body else "no type and no command"
    kind = body["type"]
    if not isinstance(kind, str):
        return "type is not a string"
    # Bolt reads ``actions[0]`` of any body that has actions (legacy attachments' too).
    found = _ids_problem(body, "") or ("actions" in body and _actions_problem(body)) or None
    if found:
        return found
    check = _BY_TYPE.get(kind)
    return check(body) if check else None


def _ids_problem(body: Mapping[str, Any], where: str) -> str | None:
    for name in _ID_FIELDS:
        if not isinstance(body.get(name), str | dict | None):
            return f"{where}{name} is neither an id nor an object"
    for name in _INNER_OBJECTS:
        inner = body.get(name)
        # Bolt reads ``body.get("event", {})`` as an object: a null there fails too.
        if inner is None and not (name == "event" and name in body):
            continue
        if not isinstance(inner, dict):
            return f"{where}{name} is not an object"
        found = _ids_problem(inner, f"{where}{name}.")
        if found:
            return found
    for name in ("authorizations", "response_urls"):
        if not _objects(body.get(name, [])):
            return f"{where}{name} is not a list of objects"
    return None


def _objects(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _event_callback(body: Mapping[str, Any]) -> str | None:
    event = body.get("event")
    if not isinstance(event, dict):
        return "event is not an object"
    if not isinstance(event.get("type"), str):
        return "event.type is not a string"
    return _texts_problem(body, _EVENT_TEXTS) if event["type"] in _PEOPLES_EVENTS else None


def _command_problem(body: Mapping[str, Any]) -> str | None:
    # The fields the command's listener reads (a form's are all text); others (Socket Mode's
    # JSON may carry more, of other types) are not Kestrel's to refuse.
    for name in _COMMAND_TEXTS:
        if name in body and not isinstance(body[name], str):
            return f"a command's {name} is not a string"
    # What a command is answered through: bolt's ``respond`` fails without it.
    return None if body.get("response_url") else "a command has no response_url"


def _actions_problem(body: Mapping[str, Any]) -> str | None:
    actions = body.get("actions")
    if not _objects(actions):
        return "actions is not a list of objects"
    if not actions:
        return f"{body['type']} has no actions"
    return None


def _block_actions(body: Mapping[str, Any]) -> str | None:
    found = _actions_problem(body)
    if found:
        return found
    for action in body["actions"]:
        found = _action_problem(action)
        if found:
            return found
    return _objects_or_absent(body, _ACTION_OBJECTS) or _texts_problem(body, _CLICK_TEXTS)


def _action_problem(action: Mapping[str, Any]) -> str | None:
    if not isinstance(action.get("action_id"), str):
        return "an action's action_id is not a string"
    if "value" in action and not isinstance(action["value"], str):
        return "an action's value is not a string"
    option = action.get("selected_option")  # a menu's; null when nothing is chosen
    chosen = option.get("value") if isinstance(option, dict) else None
    if option is not None and not isinstance(chosen, str):
        return "an action's selected_option is not an object with a string value"
    return None


def _texts_problem(body: Mapping[str, Any], fields: Mapping[str, tuple[str, ...]]) -> str | None:
    """The first of ``fields`` present and not a string, named; objects absent or null are
    checked (or allowed) as objects elsewhere."""
    for where, names in fields.items():
        inner = body.get(where) if where else body
        if not isinstance(inner, dict):
            continue
        for name in names:
            if name in inner and not isinstance(inner[name], str):
                return f"{where}{'.' if where else ''}{name} is not a string"
    return None


def _view_payload(body: Mapping[str, Any]) -> str | None:
    view = body.get("view")
    if not isinstance(view, dict):
        return "view is not an object"
    if not isinstance(view.get("callback_id"), str):
        return "view.callback_id is not a string"
    state = view.get("state", {})
    values = state.get("values", {}) if isinstance(state, dict) else None
    if not isinstance(values, dict) or not all(
        isinstance(block, dict) and all(isinstance(v, dict) for v in block.values())
        for block in values.values()
    ):
        return "view.state.values is not an object of objects"
    # A text input's value: null when left empty, else what was typed.
    inputs = (state for block in values.values() for state in block.values())
    if not all(isinstance(state.get("value"), str | None) for state in inputs):
        return "a value in view.state.values is not a string"
    return _objects_or_absent(body, ("user", "team")) or _texts_problem(body, _VIEW_TEXTS)


def _objects_or_absent(body: Mapping[str, Any], names: tuple[str, ...]) -> str | None:
    for name in names:
        if not isinstance(body.get(name), dict | None):
            return f"{name} is not an object"
    return None


def _challenge(body: Mapping[str, Any]) -> str | None:
    return None if isinstance(body.get("challenge"), str) else "challenge is not a string"


_BY_TYPE: Final = {
    "event_callback": _event_callback,
    "block_actions": _block_actions,
    "view_submission": _view_payload,
    "view_closed": _view_payload,
    "url_verification": _challenge,
}
