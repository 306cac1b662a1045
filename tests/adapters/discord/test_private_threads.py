"""A run in a private thread: Discord shows that thread only to its members and to those who
manage threads, so ``/kestrel runs`` and ``/kestrel status`` show its run to no one else, from
its channel or from anywhere else in the server."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from adapters.discord.directory import LOOKUPS_AT_ONCE
from adapters.discord.transport import DiscordTransport
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.discord_world import (
    APPROVER,
    ONCALL,
    REQUESTER,
    SRE_ROLE,
    DiscordWorld,
    button_id,
    discord_world,
)
from tests.fakes.slack_world import restart_script
from tests.fakes.waiting import until

MANAGE_THREADS = 1 << 34
MEMBER = "1004"  # in the private thread
STRANGER = "1999"  # in #ops, not in the private thread


async def _command(
    world: DiscordWorld, verb: str, *, channel: str | dict[str, Any], user: str, run: str = ""
) -> str:
    options: list[dict[str, Any]] = [{"name": "run", "type": 3, "value": run}] if run else []
    data = p.interaction_command(
        options=[{"name": verb, "type": 1, "options": options}], channel=channel, user_id=user
    )
    await world.discord.dispatch("INTERACTION_CREATE", data)
    return await world.answered(data)


def _guild_with_a_private_thread(fake: FakeDiscord) -> tuple[dict[str, Any], dict[str, Any]]:
    """#ops, where nobody manages threads, with a private thread of its own and a public one."""
    deny = {"id": p.GUILD_ID, "type": 0, "allow": "0", "deny": str(MANAGE_THREADS)}
    fake.channels[p.CHANNEL_ID]["permission_overwrites"] = [deny]
    private = fake.add_thread(type=p.PRIVATE_THREAD, owner_id=REQUESTER, name="incident")
    fake.thread_members[private["id"]] = {REQUESTER, MEMBER, p.BOT_ID}
    public = fake.add_thread(name="chatter")
    return private, public


async def test_a_private_threads_run_is_read_only_by_those_who_see_the_thread(
    tmp_path: Path,
) -> None:
    async with FakeDiscord() as fake:
        private, public = _guild_with_a_private_thread(fake)
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            await world.mention("checkout is failing", channel=private["id"])
            await world.card("approve")
            await world.settled()
            run = (await world.chat.recent(1))[0].id

            # Someone of #ops who is not in the thread: from #ops, or from another thread of
            # it, the run is neither listed nor shown.
            for where in (p.CHANNEL_ID, public):
                listed = await _command(world, "runs", channel=where, user=STRANGER)
                assert "restart_service" not in listed and private["id"] not in listed, listed
                shown = await _command(world, "status", channel=where, user=STRANGER, run=run)
                assert "that you can see" in shown and "restart_service" not in shown, shown

            # Archived, the thread leaves the gateway's cache: Discord is asked what it is.
            await fake.dispatch("THREAD_UPDATE", fake.archive(private["id"]))
            listed = await _command(world, "runs", channel=p.CHANNEL_ID, user=STRANGER)
            assert "restart_service" not in listed, listed

            # A member of the thread, and on-call, read it from #ops.
            for reader in (MEMBER, ONCALL):
                listed = await _command(world, "runs", channel=p.CHANNEL_ID, user=reader)
                assert "restart_service" in listed, listed
                shown = await _command(world, "status", channel=p.CHANNEL_ID, user=reader, run=run)
                assert "restart_service" in shown, shown


async def test_a_card_in_a_private_thread_pings_only_approvers_who_see_it(tmp_path: Path) -> None:
    # Discord adds whoever a message in a private thread notifies to the thread: the card's
    # ping added every approver (and asked a role in), who then read the whole incident.
    async with FakeDiscord() as fake:
        private, _ = _guild_with_a_private_thread(fake)
        thread = private["id"]
        fake.members[(p.GUILD_ID, APPROVER)] = {"roles": []}
        fake.members[(p.GUILD_ID, MEMBER)] = {"roles": []}
        policy = {"approvers": {"*": [APPROVER, MEMBER, f"group:{SRE_ROLE}"]}}
        async with discord_world(
            tmp_path, restart_script(), fake=fake, extra_policy=policy
        ) as world:
            await world.mention("checkout is failing", channel=thread)
            await world.card()
            [posted] = [
                c
                for c in fake.calls_to("POST", rf"/channels/{thread}/messages")
                if "kestrel:approve:" in json.dumps(c.json) and c.status == 200
            ]
            body = posted.json or {}
            assert body["allowed_mentions"]["users"] == [MEMBER]
            assert body["allowed_mentions"]["roles"] == []
            assert APPROVER not in fake.thread_members[thread]
            # Those not pinged are named, with how they may still answer.
            content = body["content"]
            assert f"<@{APPROVER}>" in content and f"<@&{SRE_ROLE}>" in content
            assert "not in this private thread" in content


async def test_a_card_in_a_public_thread_still_pings_every_approver(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card()
        posted = [
            c
            for c in world.discord.calls_to("POST", rf"/channels/{card['channel_id']}/messages")
            if "kestrel:approve:" in json.dumps(c.json)
        ]
        mentions = (posted[0].json or {})["allowed_mentions"]
        assert mentions["users"] == [APPROVER] and mentions["roles"] == [SRE_ROLE]


async def test_a_card_in_a_private_thread_pings_an_approver_who_manages_threads(
    tmp_path: Path,
) -> None:
    async with FakeDiscord() as fake:
        private, _ = _guild_with_a_private_thread(fake)
        manages = {"id": SRE_ROLE, "type": 0, "allow": str(MANAGE_THREADS), "deny": "0"}
        fake.channels[p.CHANNEL_ID]["permission_overwrites"].append(manages)
        fake.members[(p.GUILD_ID, APPROVER)] = {"roles": []}
        fake.members[(p.GUILD_ID, ONCALL)] = {"roles": [SRE_ROLE]}
        policy = {"approvers": {"*": [APPROVER, ONCALL]}}
        async with discord_world(
            tmp_path, restart_script(), fake=fake, extra_policy=policy
        ) as world:
            await world.mention("checkout is failing", channel=private["id"])
            await world.card()
            [posted] = [
                c
                for c in fake.calls_to("POST", rf"/channels/{private['id']}/messages")
                if "kestrel:approve:" in json.dumps(c.json) and c.status == 200
            ]
            assert (posted.json or {})["allowed_mentions"]["users"] == [ONCALL]


async def test_a_card_for_a_private_thread_discord_cannot_look_up_adds_nobody_to_it(
    tmp_path: Path,
) -> None:
    # Archived, a private thread leaves the gateway's cache; when Discord then did not say what
    # the thread is (rate-limited, down), the card was taken for a public thread's and notified
    # every approver, whom Discord added to the private thread.
    async with FakeDiscord() as fake:
        private, _ = _guild_with_a_private_thread(fake)
        thread = private["id"]
        fake.members[(p.GUILD_ID, APPROVER)] = {"roles": []}
        fake.members[(p.GUILD_ID, MEMBER)] = {"roles": []}
        policy = {"approvers": {"*": [APPROVER, MEMBER]}}
        async with discord_world(
            tmp_path, restart_script(), fake=fake, extra_policy=policy
        ) as world:
            posts = rf"/channels/{thread}/messages"
            fake.fail("POST", posts, status=403, code=50013, times=None)  # not shown at first
            await world.mention("checkout is failing", channel=thread)

            def tried() -> list[Any]:
                calls = fake.calls_to("POST", posts)
                return [c for c in calls if "kestrel:approve:" in json.dumps(c.json)]

            await until(tried, timeout=10)
            await world.settled()
            fake.clear_faults()
            await fake.dispatch("THREAD_UPDATE", fake.archive(thread))
            fake.fail("GET", rf"/channels/{thread}", retry_after=600, times=None)

            await world.later(3700)  # the card is tried again, its thread not looked up
            assert APPROVER not in fake.thread_members[thread]
            for call in tried():
                mentions = (call.json or {}).get("allowed_mentions") or {}
                assert APPROVER not in (mentions.get("users") or []), call.json

            fake.clear_faults()  # Discord answers again: the card is shown, as in a private one
            await world.later(3700)
            [shown] = [c for c in tried() if c.status == 200]
            assert (shown.json or {})["allowed_mentions"]["users"] == [MEMBER]
            assert APPROVER not in fake.thread_members[thread]


async def test_a_card_of_unknown_outcome_is_found_after_the_thread_let_an_approver_in(
    tmp_path: Path,
) -> None:
    # The card landed naming the approver not in the private thread, unnotified; its answer
    # was lost. A member then added the approver, as the card suggests. Sent again, the card
    # looked different (nobody left to name), so it was neither found nor deduplicated by its
    # nonce: a second card, notifying the approver this time.
    async with FakeDiscord() as fake:
        private, _ = _guild_with_a_private_thread(fake)
        thread = private["id"]
        fake.members[(p.GUILD_ID, APPROVER)] = {"roles": []}
        fake.members[(p.GUILD_ID, MEMBER)] = {"roles": []}
        policy = {"approvers": {"*": [APPROVER, MEMBER]}}
        async with discord_world(
            tmp_path, restart_script(), fake=fake, extra_policy=policy
        ) as world:
            await world.mention("checkout is failing", channel=thread)
            card = await world.card()
            await world.settled()
            [(request, _, _)] = await world.rt.store.list_requests()
            stored = await world.rt.store.get_message(f"discord:card:{request.id}")
            assert stored is not None
            client = world.adapter.client
            transport = DiscordTransport(client.http, client.seeing)

            fake.thread_members[thread].add(APPROVER)  # let in by a member
            found = await transport.find(stored.key, stored.target, stored.body)
            assert found == card["id"]
            again = await transport.post(stored.key, stored.target, stored.body)
            assert again == card["id"]  # within minutes, Discord answers with the first one
            cards = [m for m in fake.bot_messages(thread) if "kestrel:approve:" in json.dumps(m)]
            assert len(cards) == 1, cards


async def test_a_card_whose_approvers_are_a_role_says_in_a_private_thread_who_may_answer(
    tmp_path: Path,
) -> None:
    # Approvers named only as a role: the role is not pinged in a private thread (Discord
    # would add its members), so nobody was notified, and the card said the role was "not in
    # this private thread", though members of it may well be, and may click.
    async with FakeDiscord() as fake:
        private, _ = _guild_with_a_private_thread(fake)
        thread = private["id"]
        async with discord_world(
            tmp_path,
            restart_script(),
            fake=fake,
            extra_policy={"approvers": {"*": [f"group:{SRE_ROLE}"]}},
        ) as world:
            await world.mention("checkout is failing", channel=thread)
            await world.card()
            [posted] = [
                c
                for c in fake.calls_to("POST", rf"/channels/{thread}/messages")
                if "kestrel:approve:" in json.dumps(c.json) and c.status == 200
            ]
            body = posted.json or {}
            assert body["allowed_mentions"]["users"] == []
            assert body["allowed_mentions"]["roles"] == []
            content = body["content"]
            assert "Nobody was notified" in content, content
            assert f"<@&{SRE_ROLE}>" in content and "Roles are not pinged" in content, content
            assert "already in this thread may answer here" in content, content
            assert "not in this private thread (a ping" not in content, content


async def test_who_sees_a_private_thread_is_asked_a_few_at_a_time(tmp_path: Path) -> None:
    # Eight approvers not in the thread: each was asked of Discord in turn, two requests
    # each, so a card waited sixteen round trips before it was posted.
    approvers = [str(2001 + n) for n in range(8)]
    in_flight = {"now": 0, "most": 0}

    async def slowly(call: Any) -> tuple[int, Any]:
        in_flight["now"] += 1
        in_flight["most"] = max(in_flight["most"], in_flight["now"])
        try:
            await asyncio.sleep(0.2)  # Discord's round trip
        finally:
            in_flight["now"] -= 1
        return 404, {"message": "Unknown Member", "code": 10007}

    async with FakeDiscord() as fake:
        private, _ = _guild_with_a_private_thread(fake)
        thread = private["id"]
        for user in approvers:
            fake.members[(p.GUILD_ID, user)] = {"roles": []}
        fake.set_handler("GET", rf"/channels/{thread}/thread-members/\d+", slowly)
        async with discord_world(
            tmp_path, restart_script(), fake=fake, extra_policy={"approvers": {"*": approvers}}
        ) as world:
            await world.mention("checkout is failing", channel=thread)
            await world.card()
            asked = fake.calls_to("GET", rf"/channels/{thread}/thread-members/\d+")
            assert sorted(c.path.rsplit("/", 1)[1] for c in asked) == approvers
            assert 1 < in_flight["most"] <= LOOKUPS_AT_ONCE, in_flight


async def test_who_sees_a_private_thread_is_asked_no_more_once_discord_limits_it(
    tmp_path: Path,
) -> None:
    # Rate-limited for ten minutes on the first lookup, the card still asked about every other
    # approver, each refused in turn: a burst into a limit Discord had already set.
    approvers = [str(2001 + n) for n in range(12)]
    async with FakeDiscord() as fake:
        private, _ = _guild_with_a_private_thread(fake)
        thread = private["id"]
        for user in approvers:
            fake.members[(p.GUILD_ID, user)] = {"roles": []}
        lookups = rf"/channels/{thread}/thread-members/\d+"
        fake.fail("GET", lookups, retry_after=600, times=None)
        async with discord_world(
            tmp_path, restart_script(), fake=fake, extra_policy={"approvers": {"*": approvers}}
        ) as world:
            await world.mention("checkout is failing", channel=thread)
            await world.card()  # posted at once, notifying nobody it could not ask about
            assert len(fake.calls_to("GET", lookups)) <= LOOKUPS_AT_ONCE
            assert not set(approvers) & fake.thread_members[thread]


async def test_a_refusal_whose_thread_lookup_the_network_drops_is_still_said_and_audited(
    tmp_path: Path,
) -> None:
    # Whether the person sees the run's private thread (for its link) was asked of Discord,
    # and a dropped connection (not a Discord error) escaped the refusal: `/kestrel cancel`
    # from another thread stayed "thinking…" for ever, and the refusal was not audited.
    async with FakeDiscord() as fake:
        private, public = _guild_with_a_private_thread(fake)
        thread = private["id"]
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            await world.mention("checkout is failing", channel=thread)
            await world.card("approve")
            await world.settled()
            run = (await world.chat.recent(1))[0].id

            async def dropped(call: Any) -> Any:
                raise asyncio.CancelledError  # the connection closes with no answer

            fake.set_handler("GET", rf"/channels/{thread}/thread-members/\d+", dropped)
            told = await _command(world, "cancel", channel=public, user=MEMBER, run=run)
            # Not known to see it: told what a stranger is told, as `status` would.
            assert told == f"There is no run {run} that you can see.", told
            assert thread not in told, told  # not told it sees the thread: no link
            refused = await world.rt.store.list_audit(run_id=run, action="cancel_refused")
            assert [a.actor for a in refused] == [MEMBER], refused
            assert (await world.chat.recent(1))[0].status.value == "suspended"


async def test_a_deny_from_outside_the_thread_is_refused_within_discords_3_s_however_slow_it_is(
    tmp_path: Path,
) -> None:
    # Whether the clicker sees the run's archived private thread takes two lookups (the
    # thread, then its members). Each was given 2 s of its own: a slow Discord made the
    # refusal take up to 4 s, and Discord told the clicker "This interaction failed".
    async with FakeDiscord() as fake:
        private, public = _guild_with_a_private_thread(fake)
        thread = private["id"]
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            await world.mention("checkout is failing", channel=thread)
            card = await world.card("approve")
            await world.settled()
            await fake.dispatch("THREAD_UPDATE", fake.archive(thread))
            fake.delay("GET", rf"/channels/{thread}", 1.5)
            fake.delay("GET", rf"/channels/{thread}/thread-members/\d+", 1.5)
            click = p.interaction_button(
                channel=public["id"],
                user_id=MEMBER,
                custom_id=button_id(card, "deny"),
                message=card,
            )
            started = time.monotonic()
            await fake.dispatch("INTERACTION_CREATE", click)
            answers = await fake.wait_for(
                lambda c: str(click["token"]) in c.path and c.route == "interaction_callback"
            )
            assert answers[0].at - started < 3.0, answers[0].at - started
            assert answers[0].status == 200, answers[0]
            assert "modal" not in json.dumps(answers[0].json or {}), answers[0].json


async def test_a_made_up_run_is_told_in_the_words_of_a_run_one_may_not_see(
    tmp_path: Path,
) -> None:
    # Which runs exist is no stranger's business: a made-up id and the run of a private thread
    # they are not in are answered alike, from the thread's channel too (whose slash command
    # acts on its runs: a refusal there named the run's requester and on-call).
    async with FakeDiscord() as fake:
        private, _public = _guild_with_a_private_thread(fake)
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            await world.mention("checkout is failing", channel=private["id"])
            await world.card("approve")
            await world.settled()
            run = (await world.chat.recent(1))[0].id
            made_up = "run_00000000deadbeef"
            for verb in ("status", "cancel", "resume"):
                for named in (run, made_up):
                    said = await _command(
                        world, verb, channel=p.CHANNEL_ID, user=STRANGER, run=named
                    )
                    assert said == f"There is no run {named} that you can see.", (verb, said)


async def test_full_arguments_asked_from_a_private_threads_channel_show_nothing(
    tmp_path: Path,
) -> None:
    # A card's buttons are in its run's thread: Full arguments asked from the thread's own
    # channel (a custom id sent from a message there) counted as from the run's place, and
    # showed a private thread's exact arguments to someone of #ops who is not in it.
    script = restart_script()
    script[0]["calls"][0]["arguments"]["service"] = "checkout" + "q" * 400  # cut on the card
    async with FakeDiscord() as fake:
        private, _public = _guild_with_a_private_thread(fake)
        async with discord_world(tmp_path, script, fake=fake) as world:
            await world.mention("checkout is failing", channel=private["id"])
            card = await world.card("approve")
            await world.settled()
            arguments = next(
                str(c["custom_id"])
                for row in card["components"]
                for c in row["components"]
                if str(c.get("custom_id", "")).startswith("kestrel:arguments:")
            )
            click = p.interaction_button(
                custom_id=arguments, channel=p.CHANNEL_ID, user_id=STRANGER
            )
            await world.discord.dispatch("INTERACTION_CREATE", click)
            told = await world.answered(click)
            assert "qqqq" not in told and "not one of this thread" in told, told
            run = (await world.chat.recent(1))[0].id
            refused = await world.rt.store.list_audit(run_id=run, action="show_refused")
            assert [a.actor for a in refused] == [STRANGER], refused
            here = await world.click(card, "arguments", user=MEMBER)  # in the thread: shown
            assert "qqqq" in await world.answered(here)
