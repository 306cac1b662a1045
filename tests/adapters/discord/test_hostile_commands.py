"""Hostile ``/kestrel``: other guilds, other platforms, people with no business asking."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bot.domain import Session
from bot.people.policy import Actor
from bot.prompter import DeferringPrompter
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.discord_world import ONCALL, REQUESTER, DiscordWorld, discord_world
from tests.fakes.slack_world import restart_script
from tests.fakes.waiting import until

OTHER_GUILD = "777"
STRANGER = "1999"


async def _command(
    world: DiscordWorld, verb: str, *, guild: str | None, channel: str, user: str, run: str = ""
) -> str:
    options: list[dict[str, Any]] = [{"name": "run", "type": 3, "value": run}] if run else []
    data = p.interaction_command(
        options=[{"name": verb, "type": 1, "options": options}],
        guild=guild,
        channel=channel,
        user_id=user,
    )
    await world.discord.dispatch("INTERACTION_CREATE", data)
    return await world.answered(data)


async def _run_with_a_card(world: DiscordWorld) -> tuple[str, str]:
    mention = await world.mention("checkout is failing")
    thread = await world.thread_of(mention)
    await world.card("approve")
    await world.settled()
    return thread, (await world.chat.recent(1))[0].id


async def test_runs_does_not_list_another_guilds_requests(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        thread, _run = await _run_with_a_card(world)
        listed = await _command(world, "runs", guild=OTHER_GUILD, channel="7770", user=STRANGER)
        assert "restart_service" not in listed and thread not in listed, listed


async def test_status_of_another_guilds_run_is_refused(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        _thread, run = await _run_with_a_card(world)
        shown = await _command(
            world, "status", guild=OTHER_GUILD, channel="7770", user=STRANGER, run=run
        )
        assert "restart_service" not in shown and "<@1001>" not in shown, shown


async def test_runs_lists_only_discord_runs(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        session = Session(id="cli:tty", platform="cli", channel="tty", thread="")
        await world.chat.submit_turn(
            "checkout", user=Actor("ops"), session=session, prompter=DeferringPrompter()
        )
        await until(world.chat.pending, timeout=10)
        listed = await _command(
            world, "runs", guild=p.GUILD_ID, channel=p.CHANNEL_ID, user=STRANGER
        )
        assert "None/None" not in listed, listed


async def test_a_thread_status_whose_journal_cannot_be_read_is_answered(tmp_path: Path) -> None:
    """``/kestrel status`` in a run's thread folds its journal: one cut short on disk is said,
    instead of the "thinking…" line staying for ever."""
    async with discord_world(tmp_path, restart_script()) as world:
        thread, run = await _run_with_a_card(world)
        with sqlite3.connect(tmp_path / "kestrel.db") as conn:
            cut = "UPDATE journal SET body = substr(body, 1, 20) WHERE run_id = ? AND seq = 1"
            conn.execute(cut, (run,))
        shown = await _command(world, "status", guild=p.GUILD_ID, channel=thread, user=ONCALL)
        assert (
            shown == f"run '{run}': journal entry at seq 1 is unreadable: Input data was truncated"
        )


async def test_a_run_id_pasted_with_its_markdown_is_the_run(tmp_path: Path) -> None:
    """A run id copied from a status message comes with its code marks (Discord copies the
    markdown of what is selected): it still names the run."""
    async with discord_world(tmp_path, restart_script()) as world:
        _thread, run = await _run_with_a_card(world)
        shown = await _command(
            world, "status", guild=p.GUILD_ID, channel="200", user=ONCALL, run=f"`{run}`:"
        )
        assert shown.startswith(f"Run `{run}`: **suspended**"), shown


async def test_a_run_named_by_thousands_of_characters_is_answered_in_one_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Discord takes a command's string option of up to 6000 characters, and a message of
    # 2000: the answer quoted the whole "run id", Discord refused it, the person saw
    # "thinking…" for ever and the log a traceback.
    async with discord_world(tmp_path, restart_script()) as world:
        typed = "x" * 5000
        args = {"guild": p.GUILD_ID, "channel": p.CHANNEL_ID, "user": STRANGER}
        with caplog.at_level(logging.WARNING):
            shown = await _command(world, "status", run=typed, **args)
            assert shown.startswith("There is no run xxx") and len(shown) < 300, shown[-80:]
            assert await _command(world, "cancel", run=typed, **args) == shown
        answers = [c for c in world.discord.calls if "/webhooks/" in c.path]
        assert answers and all((c.status or 0) < 400 for c in answers), answers
        assert not [r for r in caplog.records if r.exc_info], caplog.text


async def test_runs_the_store_fails_under_is_answered_not_left_thinking(tmp_path: Path) -> None:
    """``/kestrel runs`` defers ("thinking…") before it lists the open requests: with the
    store failing under that read (here the requests' table gone from under it), the person
    is told so instead of the thinking line staying for ever."""
    async with discord_world(tmp_path, restart_script()) as world:
        thread, _run = await _run_with_a_card(world)
        with sqlite3.connect(tmp_path / "kestrel.db") as conn:
            conn.execute("ALTER TABLE requests RENAME TO requests_away")
        try:
            listed = await _command(world, "runs", guild=p.GUILD_ID, channel=thread, user=ONCALL)
        finally:
            with sqlite3.connect(tmp_path / "kestrel.db") as conn:
                conn.execute("ALTER TABLE requests_away RENAME TO requests")
        assert listed == "Kestrel's store did not answer: try again in a moment."


async def test_a_run_named_by_marks_alone_is_not_the_threads_run(tmp_path: Path) -> None:
    """``/kestrel cancel`` with a run that is only marks (a paste that missed the id) names
    no run: it is refused as such, never taken for the thread's run and cancelled."""
    async with discord_world(tmp_path, restart_script()) as world:
        thread, run = await _run_with_a_card(world)
        shown = await _command(
            world, "cancel", guild=p.GUILD_ID, channel=thread, user=ONCALL, run="`"
        )
        assert shown == "There is no run ` that you can see.", shown
        assert (await world.chat.status(run)).record.status.value == "suspended"


async def test_a_run_of_a_private_thread_is_not_shown_to_those_outside_it(
    tmp_path: Path,
) -> None:
    """A private thread is seen by its members (and moderators) alone, though everyone sees
    the channel it belongs to: its run's status and requests are not shown to someone of
    that channel who is not in it, as its messages are not; inside it, they are."""
    async with FakeDiscord() as fake:
        private = fake.add_thread(owner_id=REQUESTER, type=p.PRIVATE_THREAD, name="incident")
        # Nobody but moderators manages threads there (the fake's @everyone may, elsewhere).
        manage_threads = 1 << 34
        everyone = {"id": p.GUILD_ID, "type": 0, "allow": "0", "deny": str(manage_threads)}
        fake.channels[p.CHANNEL_ID]["permission_overwrites"] = [everyone]
        async with discord_world(tmp_path, restart_script(), fake=fake) as world:
            await world.mention("checkout is failing", channel=private["id"])
            await world.card("approve")
            await world.settled()
            run = (await world.chat.recent(1))[0].id
            args = {"guild": p.GUILD_ID, "user": STRANGER}
            shown = await _command(world, "status", channel=p.CHANNEL_ID, run=run, **args)
            assert "restart_service" not in shown, shown
            listed = await _command(world, "runs", channel=p.CHANNEL_ID, **args)
            assert "restart_service" not in listed, listed
            inside = await _command(world, "status", channel=private["id"], run=run, **args)
            assert "restart_service" in inside, inside


async def test_a_run_of_an_archived_private_thread_is_shown_to_its_owner_only(
    tmp_path: Path,
) -> None:
    """A private thread archived when Kestrel connected is not in its cache: it is asked of
    Discord what the thread is, rather than taken for its (visible) channel."""
    async with FakeDiscord() as fake:
        private = fake.add_thread(owner_id=REQUESTER, type=p.PRIVATE_THREAD, name="incident")
        manage_threads = 1 << 34
        everyone = {"id": p.GUILD_ID, "type": 0, "allow": "0", "deny": str(manage_threads)}
        fake.channels[p.CHANNEL_ID]["permission_overwrites"] = [everyone]
        async with discord_world(tmp_path, restart_script(), fake=fake) as first:
            await first.mention("checkout is failing", channel=private["id"])
            await first.card("approve")
            await first.settled()
            run = (await first.chat.recent(1))[0].id
        fake.archive(private["id"])
        async with discord_world(tmp_path, restart_script(), fake=fake) as second:
            args = {"guild": p.GUILD_ID, "channel": p.CHANNEL_ID, "run": run}
            shown = await _command(second, "status", user=STRANGER, **args)
            assert "restart_service" not in shown, shown
            owner = await _command(second, "status", user=REQUESTER, **args)
            assert "restart_service" in owner, owner


async def test_cancel_and_resume_from_another_guild_that_shares_the_bot_are_refused(
    tmp_path: Path,
) -> None:
    # On-call of the run's server, typing in another server the bot is in: that server's
    # members act on that server's runs only, and learn nothing of this one's.
    async with discord_world(tmp_path, restart_script()) as world:
        _thread, run = await _run_with_a_card(world)
        for verb in ("cancel", "resume"):
            said = await _command(
                world, verb, guild=OTHER_GUILD, channel="7770", user=ONCALL, run=run
            )
            assert said == f"There is no run {run} that you can see.", said
        assert (await world.chat.status(run)).record.status.value == "suspended"
        assert world.executions == []


async def test_another_guilds_run_named_by_a_command_is_refused_and_audited(
    tmp_path: Path,
) -> None:
    # A stranger of another server the bot is in, trying run ids: each is told nothing of the
    # run, and each try leaves a trace naming where it came from, as from another channel.
    async with discord_world(tmp_path, restart_script()) as world:
        _thread, run = await _run_with_a_card(world)
        for verb in ("status", "cancel", "resume"):
            said = await _command(
                world, verb, guild=OTHER_GUILD, channel="7770", user=STRANGER, run=run
            )
            assert said == f"There is no run {run} that you can see.", said
        audit = await world.rt.store.list_audit(run)
        refused = {str(a.action): a.detail for a in audit if str(a.action).endswith("_refused")}
        assert sorted(refused) == ["cancel_refused", "resume_refused", "show_refused"], refused
        assert all(d.endswith(f"(acted from discord:{OTHER_GUILD}:7770)") for d in refused.values())
        assert all(a.actor == STRANGER for a in audit if str(a.action).endswith("_refused"))
        assert (await world.chat.status(run)).record.status.value == "suspended"


@pytest.mark.parametrize("verb", ["runs", "status", "cancel"])
async def test_a_command_answered_after_its_token_expired_is_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, verb: str
) -> None:
    # Past Discord's 3 s (a store slow to say which replica takes the interaction), the defer
    # met 10062 and discord.py logged a traceback per command; nor may the command act, as
    # the person was told it failed.
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        thread, run = await _run_with_a_card(world)
        fake.fail("POST", r"/interactions/.*/callback", status=404, code=10062, message="Unknown")
        options = [] if verb == "runs" else [{"name": "run", "type": 3, "value": run}]
        data = p.interaction_command(
            options=[{"name": verb, "type": 1, "options": options}],
            guild=p.GUILD_ID,
            channel=thread,
            user_id=ONCALL,
        )
        await world.discord.dispatch("INTERACTION_CREATE", data)
        await fake.wait_for(lambda c: "callback" in c.path and c.status == 404)
        await until(lambda: "expired before Kestrel answered it" in caplog.text, timeout=5)
        await world.settled()
        assert "Traceback" not in caplog.text
        assert (await world.chat.status(run)).record.status.value == "suspended"
