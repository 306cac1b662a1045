"""A card's button pressed from somewhere that is not the card: an ephemeral message in the
run's own thread, a view (the App Home tab, a modal). Slack sends such a click with no
``message`` (an ephemeral's is not sent) or no channel at all; none decides the request, and
each refusal is audited with where it came from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.slack import ids
from bot.domain import RequestStatus
from tests.fakes.slack_client import block_actions
from tests.fakes.slack_world import (
    APPROVER,
    SlackWorld,
    button_value,
    restart_script,
    slack_world,
)


async def _state(world: SlackWorld) -> tuple[list[RequestStatus], list[str]]:
    run_id = (await world.chat.recent(1))[0].id
    statuses = [view.status for view in await world.chat.requests_of(run_id)]
    audit = await world.rt.store.list_audit(run_id, limit=100)
    return statuses, [r.detail for r in audit if str(r.action) == "approve_refused"]


async def test_a_button_on_an_ephemeral_in_the_runs_thread_decides_nothing(tmp_path: Path) -> None:
    async with slack_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        payload: dict[str, Any] = block_actions(
            APPROVER,
            ids.APPROVE_ONCE,
            button_value(card, ids.APPROVE_ONCE),
            channel=card.args["channel"],
            message_ts="1700000099.000001",
            thread_ts=str(mention["ts"]),
        )
        del payload["message"]  # Slack does not send an ephemeral message back
        payload["container"]["is_ephemeral"] = True
        assert (await world.sender.action(payload)).status == 200
        note = await world.ephemeral_to(APPROVER)
        assert note.args["text"] == "this button is not on that request's card", note.args
        statuses, refused = await _state(world)
        assert statuses == [RequestStatus.OPEN] and world.executions == []
        where = f"slack:T0001:{card.args['channel']}:{mention['ts']}"
        assert refused == [f"this button is not on that request's card (acted from {where})"]


async def test_a_button_in_a_view_decides_nothing(tmp_path: Path) -> None:
    # A view (the Home tab, a modal) has no channel and no message: the click comes from
    # nowhere a run lives, whatever request its value names.
    async with slack_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        payload: dict[str, Any] = block_actions(
            APPROVER,
            ids.APPROVE_ONCE,
            button_value(card, ids.APPROVE_ONCE),
            channel="",
            message_ts="",
        )
        for key in ("message", "channel"):
            del payload[key]
        payload["container"] = {"type": "view", "view_id": "V0HOME"}
        payload["view"] = {"id": "V0HOME", "type": "home", "blocks": []}
        assert (await world.sender.action(payload)).status == 200
        await world.settled()
        statuses, refused = await _state(world)
        assert statuses == [RequestStatus.OPEN] and world.executions == []
        assert refused == ["this button is not on that request's card (acted from slack:T0001)"]


async def test_deny_pressed_off_the_card_opens_no_form(tmp_path: Path) -> None:
    # The form's decision counts only from the card: opened from another message of the run's
    # thread (here its mention), it would take a reason only to refuse it on submission.
    async with slack_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        card = await world.card()
        await world.settled()
        payload: dict[str, Any] = block_actions(
            APPROVER,
            ids.DENY,
            button_value(card, ids.DENY),
            channel=card.args["channel"],
            message_ts=str(mention["ts"]),
            thread_ts=str(mention["ts"]),
        )
        assert (await world.sender.action(payload)).status == 200
        note = await world.ephemeral_to(APPROVER)
        assert note.args["text"] == "this button is not on that request's card", note.args
        assert not world.api.calls_to("views.open")
        run_id = (await world.chat.recent(1))[0].id
        audit = await world.rt.store.list_audit(run_id, limit=100)
        where = f"slack:T0001:{card.args['channel']}:{mention['ts']}"
        refused = [r.detail for r in audit if str(r.action) == "deny_refused"]
        assert refused == [f"this button is not on that request's card (acted from {where})"]
