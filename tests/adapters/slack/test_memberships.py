"""Who is in a user group or a channel, as Kestrel keeps it, against the real bolt app and the
fake Web API: kept until Slack says it changed (its events, tests/adapters/slack/
test_hostile_authority.py) or ``CACHE_SECONDS`` at most, so that an incident's clicks do not run
into Slack's limit on ``usergroups.users.list`` (Tier 2, about 20 a minute)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack import ids
from adapters.slack.identity import CACHE_SECONDS, Identities
from bot.chat.contract import Place
from tests.fakes.slack_api import FakeSlackApi
from tests.fakes.slack_world import CHANNEL, require_approvals, restart_script, slack_world
from tests.fakes.waiting import until

CLICKERS = 24  # more than Slack answers usergroups.users.list a minute
SRES = [f"U0SRE{n:02d}" for n in range(CLICKERS)]


async def test_an_incidents_clicks_are_decided_while_slack_limits_group_lookups(
    tmp_path: Path,
) -> None:
    # Each click asked Slack who is in the approvers' group: past Slack's 20 a minute, every
    # member was refused "Slack did not say who is in group:S0SRE: try again".
    async with FakeSlackApi() as api:
        api.usergroups["S0SRE"] = list(SRES)
        api.limit("usergroups.users.list", 20)
        async with slack_world(tmp_path, restart_script(), api=api) as world:
            require_approvals(world.rt, tmp_path, CLICKERS)
            await world.mention("checkout is failing")
            card = await world.card()
            await world.settled()
            began = time.monotonic()
            for n, sre in enumerate(SRES, start=1):
                # Someone outside the group clicks too: refused as such, not as untold.
                await world.click(card, ids.APPROVE_ONCE, user=f"U0OUT{n:02d}")
                refused = await world.ephemeral_to(f"U0OUT{n:02d}")
                assert "may not approve" in refused.args["text"], refused.args
                assert "Slack did not say" not in refused.args["text"], refused.args
                await world.click(card, ids.APPROVE_ONCE, user=sre)
                if n < CLICKERS:
                    note = await world.ephemeral_to(sre)
                    assert note.args["text"] == f"approval {n} of {CLICKERS} recorded", note.args
            await world.answer_posted()
            assert world.executions == ["checkout"]
            # Asked once, and once more each CACHE_SECONDS a slow machine spends clicking.
            asked = len(api.calls_to("usergroups.users.list"))
            assert asked <= 1 + (time.monotonic() - began) // CACHE_SECONDS, asked


async def test_what_slack_said_of_a_group_stands_cache_seconds_at_most(tmp_path: Path) -> None:
    # An event lost, or delivered to another replica, leaves a removed member in for
    # CACHE_SECONDS at most; people acting at once while Slack is asked wait on one lookup.
    now = [0.0]
    async with FakeSlackApi() as api:
        api.usergroups["S0SRE"] = [SRES[0], SRES[1]]
        api.delay("usergroups.users.list", 0.2)
        identities = Identities(
            AsyncWebClient(token="xoxb-test", base_url=api.url), "T0001", clock=lambda: now[0]
        )
        place = Place("slack", "T0001", CHANNEL, "1.1")
        actors = [await identities.actor(sre, place, team="T0001") for sre in SRES[:2]]
        assert actors[0].directory is not None and actors[1].directory is not None
        both = await asyncio.gather(
            *(a.directory.in_group(a.user, "S0SRE") for a in actors if a.directory)
        )
        assert both == [True, True]
        assert len(api.calls_to("usergroups.users.list")) == 1
        api.usergroups["S0SRE"] = []
        now[0] += CACHE_SECONDS - 1
        assert await identities.in_group(SRES[0], "S0SRE") is True
        now[0] += 1
        assert await identities.in_group(SRES[0], "S0SRE") is False
        assert len(api.calls_to("usergroups.users.list")) == 2


async def test_a_lookup_slack_hangs_on_is_stopped_with_the_adapter(tmp_path: Path) -> None:
    # A lookup outlives the action that gave up on it (others may wait on it): stopping must
    # not leave it pending past the event loop.
    async with FakeSlackApi() as api:
        api.usergroups["S0SRE"] = [SRES[0]]
        api.delay("usergroups.users.list", 30)
        identities = Identities(
            AsyncWebClient(token="xoxb-test", base_url=api.url), "T0001", timeout=0.2
        )
        assert await identities.in_group(SRES[0], "S0SRE") is None
        lookups = [t for t in asyncio.all_tasks() if "Identities" in repr(t.get_coro())]
        assert lookups and not any(t.done() for t in lookups)
        await identities.close()
        assert all(t.done() for t in lookups)


def _lookups() -> list[asyncio.Task[object]]:
    """The group and channel lookups still under way."""
    return [t for t in asyncio.all_tasks() if "Identities" in repr(t.get_coro()) and not t.done()]


async def test_a_rate_limited_lookup_ends_with_the_time_a_click_may_wait(tmp_path: Path) -> None:
    # Slack's 429 asks for a wait longer than a person waits. The click is refused in time;
    # the lookup it gave up on must not sleep the wait out and ask again for nobody: each such
    # lookup spent a call of Slack's next window, and a click every 2 s left one more behind.
    async with FakeSlackApi() as api:
        api.usergroups["S0SRE"] = [SRES[0]]
        async with slack_world(tmp_path, restart_script(), api=api) as world:
            await world.mention("checkout is failing")
            card = await world.card()
            await world.settled()
            api.fail("usergroups.users.list", status=429, error="ratelimited", retry_after=30)
            await world.click(card, ids.APPROVE_ONCE, user=SRES[0])
            note = await world.ephemeral_to(SRES[0])
            assert "Slack did not say who is in group:S0SRE" in note.args["text"], note.args
            await until(lambda: not _lookups(), timeout=5)
            assert len(api.calls_to("usergroups.users.list")) == 1


async def test_a_lookup_slack_said_changed_while_it_hung_is_stopped_with_the_adapter() -> None:
    # A lookup Slack said was out of date (its members changed) is no longer shared, but it
    # runs on: stopping must end it too, not leave it pending past the event loop.
    async with FakeSlackApi() as api:
        api.usergroups["S0SRE"] = [SRES[0]]
        api.delay("usergroups.users.list", 30)
        identities = Identities(
            AsyncWebClient(token="xoxb-test", base_url=api.url), "T0001", timeout=0.2
        )
        assert await identities.in_group(SRES[0], "S0SRE") is None
        identities.forget(group="S0SRE")
        assert _lookups()
        await identities.close()
        assert not _lookups()


async def test_an_answer_slack_gave_before_it_said_the_group_changed_is_not_kept() -> None:
    # Someone is taken out of the group while a lookup is under way: the answer, asked before,
    # goes to who waited on it, and the next click asks Slack again rather than use it.
    async with FakeSlackApi() as api:
        api.usergroups["S0SRE"] = [SRES[0]]
        api.delay("usergroups.users.list", 0.5)
        identities = Identities(AsyncWebClient(token="xoxb-test", base_url=api.url), "T0001")
        asking = asyncio.create_task(identities.in_group(SRES[0], "S0SRE"))
        await until(lambda: api.calls_to("usergroups.users.list"))
        identities.forget(group="S0SRE")  # subteam_members_changed, while Slack answers
        assert await asking is True  # as Slack said it before
        api.usergroups["S0SRE"] = []
        assert await identities.in_group(SRES[0], "S0SRE") is False
        assert len(api.calls_to("usergroups.users.list")) == 2
