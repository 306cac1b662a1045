"""What the gate lets through to bolt: every shape Slack sends, read the way bolt reads it."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest

from adapters.slack import ids
from adapters.slack.shape import Unreadable, problem, read_body
from tests.fakes.slack_client import (
    FORM,
    app_mention,
    block_actions,
    event_callback,
    message,
    slash_command,
    view_submission,
)

JSON = "application/json"


def _payload(value: object) -> str:
    return urlencode({"payload": json.dumps(value)})


SLACK_SENDS = {
    "mention": (json.dumps(event_callback(app_mention("U1", "hi"))), JSON),
    "reply": (json.dumps(event_callback(message("U1", "hi", thread_ts="1.1"))), JSON),
    "home": (json.dumps(event_callback({"type": "app_home_opened", "user": "U1"})), JSON),
    "handshake": (json.dumps({"type": "url_verification", "challenge": "c", "token": "t"}), JSON),
    "click": (
        _payload(block_actions("U1", ids.APPROVE_ONCE, "v", channel="C1", message_ts="1.2")),
        FORM,
    ),
    "modal": (
        _payload(view_submission("U1", ids.DENY_MODAL, "req", {ids.REASON_BLOCK: {"a": "x"}})),
        FORM,
    ),
    "command": (urlencode(slash_command("U1", "runs")), FORM),
    "ssl check": ("ssl_check=1&token=t", FORM),
}


@pytest.mark.parametrize("name", SLACK_SENDS)
def test_what_slack_sends_passes(name: str) -> None:
    text, content_type = SLACK_SENDS[name]
    assert problem(read_body(text, content_type)) is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[" * 100_000, "nests too deep"),
        ("[" * 65 + "]" * 65, "nests more than 64 levels"),
        ("{'single': 'quotes'}", "not JSON"),
        ("payload=" + "%5B" * 100_000, "the payload nests too deep"),
    ],
)
def test_unreadable_bodies_say_why(text: str, said: str) -> None:
    with pytest.raises(Unreadable, match=said):
        read_body(text, JSON if not text.startswith("payload") else FORM)
