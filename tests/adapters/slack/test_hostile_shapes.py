"""Signed payloads of the wrong shape (a buggy proxy, a change at Slack) against the real app:
each is answered and said in one warning naming the field, never a traceback or an error; it
decides nothing, and the request it aimed at still waits and is decided by a proper click."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adapters.slack import ids
from bot.domain import RequestStatus, RunStatus
from tests.fakes.slack_client import (
    app_mention,
    block_actions,
    event_callback,
    view_submission,
)
from tests.fakes.slack_world import (
    APPROVER,
    REQUESTER,
    SlackWorld,
    button_value,
    posted_ts,
    restart_script,
    slack_world,
)
from tests.fakes.waiting import until

Change = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Bad:
    """What is sent (a click on the card, the Deny form, a mention in the thread, a JSON slash
    command or a revoked token), how it is spoiled, the status it gets and the words the warning
    says ("" for a payload taken as it is, in no warning)."""

    kind: str
    change: Change
    status: int
    said: str


def _set(path: str, value: object) -> Change:
    """Set (or, for ``...``, remove) the field at the dotted ``path``; numbers index lists."""

    def change(body: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = body
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is ...:
            del node[last]
        else:
            node[last] = value

    return change


def _without(*names: str) -> Change:
    def change(body: dict[str, Any]) -> None:
        for name in names:
            del body[name]

    return change


REFUSED = "refused a request"
BAD = {
    "user a string": Bad("click", _set("user", APPROVER), 400, "user is not an object"),
    "no actions": Bad("click", _set("actions", ...), 400, "actions is not a list of objects"),
    "action a string": Bad("click", _set("actions", ["x"]), 400, "actions is not a list of"),
    "value a dict": Bad(
        "click", _set("actions.0.value", {"v": 1}), 400, "an action's value is not a string"
    ),
    "value a number": Bad("click", _set("actions.0.value", 7), 400, "an action's value is not"),
    "selected_option a string": Bad(
        "click",
        _set("actions.0.selected_option", "x"),
        400,
        "an action's selected_option is not an object",
    ),
    "container a string": Bad("click", _set("container", "C1"), 400, "container is not an object"),
    "channel a string": Bad("click", _set("channel", "C1"), 400, "channel is not an object"),
    "channel id a list": Bad("click", _set("channel.id", ["C1"]), 400, "channel.id is not a"),
    "team a number": Bad("click", _set("team", 5), 400, "team is neither an id nor an object"),
    "team id a dict": Bad("click", _set("team.id", {}), 400, "team.id is not a string"),
    "user id a dict": Bad("click", _set("user.id", {"id": APPROVER}), 400, "user.id is not a"),
    "user team a list": Bad("click", _set("user.team_id", ["T0001"]), 400, "user.team_id is not"),
    "message ts a number": Bad("click", _set("message.ts", 1.5), 400, "message.ts is not a"),
    "container ts a dict": Bad(
        "click", _set("container.message_ts", {}), 400, "container.message_ts is not a"
    ),
    "trigger a list": Bad("click", _set("trigger_id", []), 400, "trigger_id is not a string"),
    "no container, no channel, no message": Bad(
        "click",
        _without("container", "channel", "message"),
        200,
        "",
    ),
    "team null": Bad("click", _set("team", None), 200, ""),
    "form user a string": Bad("deny form", _set("user", APPROVER), 400, "user is not an object"),
    "form without metadata": Bad("deny form", _set("view.private_metadata", ...), 200, ""),
    "form metadata a number": Bad(
        "deny form", _set("view.private_metadata", 5), 400, "view.private_metadata is not a"
    ),
    "form reason a dict": Bad(
        "deny form",
        _set(f"view.state.values.{ids.REASON_BLOCK}.{ids.REASON_ACTION}.value", {"x": 1}),
        400,
        "a value in view.state.values is not a string",
    ),
    "form user id a number": Bad("deny form", _set("user.id", 5), 400, "user.id is not a string"),
    "mention user an object": Bad(
        "mention", _set("event.user", {"id": REQUESTER}), 400, "event.user is not a string"
    ),
    "mention text a list": Bad("mention", _set("event.text", ["cancel"]), 400, "event.text is not"),
    "mention ts a number": Bad("mention", _set("event.ts", 5), 400, "event.ts is not a string"),
    "mention thread a dict": Bad("mention", _set("event.thread_ts", {}), 400, "event.thread_ts"),
    "command text a list": Bad("command", _set("text", ["cancel"]), 400, "a command's text is not"),
    "command user an object": Bad("command", _set("user_id", {"id": REQUESTER}), 400, "user_id"),
    "tokens a string": Bad("revoked", _set("event.tokens", "xoxb"), 200, ""),
    "command without response_url": Bad(
        "command", _set("response_url", ...), 400, "a command has no response_url"
    ),
}


async def _deny_metadata(world: SlackWorld, card: Any) -> str:
    """The sealed metadata of a Deny form the approver opened from the card."""
    await world.click(card, ids.DENY, user=APPROVER)
    opened = await world.api.wait_for("views.open")
    return str(opened[0].args["view"]["private_metadata"])


async def _body(world: SlackWorld, kind: str, card: Any, thread: str) -> dict[str, Any]:
    """A well-formed body of ``kind``, aimed at the card's request."""
    if kind == "click":
        value = button_value(card, ids.APPROVE_ONCE)
        ts = posted_ts(world.api, card)
        channel = card.args["channel"]
        thread_ts = card.args.get("thread_ts")
        return block_actions(
            APPROVER, ids.APPROVE_ONCE, value, channel=channel, message_ts=ts, thread_ts=thread_ts
        )
    if kind == "deny form":
        metadata = await _deny_metadata(world, card)
        values = {ids.REASON_BLOCK: {ids.REASON_ACTION: "peak hours"}}
        return view_submission(APPROVER, ids.DENY_MODAL, metadata, values)
    run_id = (await world.chat.recent(1))[0].id
    if kind == "revoked":
        return event_callback({"type": "tokens_revoked", "tokens": {"oauth": [REQUESTER]}})
    if kind == "mention":
        text = f"<@{world.api.bot_user}> cancel"
        return event_callback(app_mention(REQUESTER, text, thread_ts=thread))
    form = {"command": "/kestrel", "text": f"cancel {run_id}", "user_id": REQUESTER}
    where = {"channel_id": card.args["channel"], "team_id": "T0001"}
    return {**form, **where, "response_url": world.api.new_response_url()}


async def _send(world: SlackWorld, kind: str, body: dict[str, Any]) -> int:
    if kind in ("click", "deny form"):
        return (await world.sender.action(body)).status
    if kind in ("mention", "revoked"):
        return (await world.sender.event_body(body)).status
    raw = json.dumps(body).encode()
    return (await world.sender.raw(raw, {"Content-Type": "application/json"})).status


@pytest.mark.parametrize("name", BAD)
async def test_a_payload_of_the_wrong_shape_is_answered_in_one_warning_and_decides_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    bad = BAD[name]
    caplog.set_level(logging.INFO)
    async with slack_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        body = await _body(world, bad.kind, card, str(mention["ts"]))
        bad.change(body)
        caplog.clear()
        assert await _send(world, bad.kind, body) == bad.status
        await world.settled()
        records = list(caplog.records)
        run_id = (await world.chat.recent(1))[0].id
        [view] = await world.chat.requests_of(run_id)
        assert view.status is RequestStatus.OPEN
        assert len(await world.chat.recent(5)) == 1  # no run started by it either
        # Still waiting, and decided by a proper click.
        await world.click(card, ids.APPROVE_ONCE, user=APPROVER)
        await until(lambda: world.executions != [], timeout=10)
    assert not [r for r in records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
    if bad.said:
        said = [r.getMessage() for r in records if r.levelno == logging.WARNING]
        assert [line for line in said if REFUSED in line and bad.said in line], said


async def test_a_command_s_fields_it_does_not_read_may_be_of_any_type(tmp_path: Path) -> None:
    """Socket Mode hands a command over as JSON, which may carry fields Kestrel never reads
    (``is_enterprise_install`` a boolean, ``enterprise_id`` null): the command is taken."""
    async with slack_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        body = await _body(world, "command", card, str(mention["ts"]))
        body |= {"is_enterprise_install": False, "enterprise_id": None, "token": 1}
        assert await _send(world, "command", body) == 200
        cancelled = RunStatus.CANCELLED

        async def ended() -> bool:
            return (await world.chat.recent(1))[0].status is cancelled

        await until(ended, timeout=10)
