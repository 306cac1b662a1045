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
        fit = isinstance(body.get("command"), str) or "ssl_check" in body
        return None if fit else "no type and no command"
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
    return None


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
        if not isinstance(action.get("action_id"), str):
            return "an action's action_id is not a string"
    return _objects_or_absent(body, _ACTION_OBJECTS)


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
    return _objects_or_absent(body, ("user", "team"))


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
