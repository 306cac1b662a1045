"""Typed outbox targets store the JSON the outbox always held: existing rows still read."""

from __future__ import annotations

import json

from adapters.discord.look import DiscordLook
from adapters.discord.target import DiscordTarget
from adapters.slack.look import SlackLook, thread_of
from adapters.slack.target import SlackTarget
from bot.domain import Session


def test_a_slack_target_stores_the_json_rows_hold() -> None:
    session = Session(id="slack:T1:C1:171.5", platform="slack", channel="C1", thread="171.5")
    target = SlackLook().target(session)
    assert target == SlackTarget(team="T1", channel="C1", thread_ts="171.5")
    stored = json.dumps(target.as_json())
    assert stored == '{"channel": "C1", "thread_ts": "171.5", "team": "T1"}'
    assert SlackTarget.from_json(json.loads(stored)) == target


def test_a_slack_row_from_before_the_team_was_kept_still_reads() -> None:
    old = {"channel": "C1", "thread_ts": "171.5"}
    assert SlackTarget.from_json(old) == SlackTarget(team="", channel="C1", thread_ts="171.5")
    assert thread_of(SlackTarget.from_json(old)).channel == "C1"


def test_a_discord_target_stores_the_json_rows_hold() -> None:
    session = Session(id="discord:100:5", platform="discord", channel="5", thread="5")
    target = DiscordLook().target(session)
    assert target == DiscordTarget(guild="100", channel="5")
    stored = json.dumps(target.as_json())
    assert stored == '{"channel": "5", "guild": "100"}'
    assert DiscordTarget.from_json(json.loads(stored)) == target
    assert DiscordTarget.from_json({"channel": "5"}).guild == ""  # matches no guild


def test_a_look_gives_no_target_for_another_platform() -> None:
    slack = Session(id="slack:T1:C1:171.5", platform="slack", channel="C1", thread="171.5")
    assert DiscordLook().target(slack) is None
