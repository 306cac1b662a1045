"""Hostile clicks, selects and forms: forged custom ids, odd payloads, races, restarts."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bot.chat.words import NOT_RECORDED
from bot.domain import RequestStatus, Session
from bot.people.policy import Actor
from bot.prompter import DeferringPrompter
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.discord_world import APPROVER, REQUESTER, SRE_ROLE, DiscordWorld, discord_world
from tests.fakes.slack_world import restart_script
from tests.fakes.waiting import until


def select_script(count: int) -> list[Any]:
    """The model asks to pick one of ``count`` nodes (a select menu above 25), then echoes."""
    options = [f"node-{i}" for i in range(count)]
    return [
        {
            "text": "Which node?",
            "calls": [
                {"name": "ask_human_select", "arguments": {"question": "Pick", "options": options}}
            ],
        },
        {"one_of": [{"match": "(?P<answer>node-[0-9]+)", "text": "Draining {answer}."}]},
    ]


async def responded(world: DiscordWorld, interaction: dict[str, Any], timeout: float = 3.0) -> bool:
    """Whether Discord got an answer to the interaction within ``timeout`` (its 3 s)."""
    record = world.discord.interactions[str(interaction["id"])]
    try:
        await world.discord.wait_until(lambda: record["response_type"] is not None, timeout)
    except AssertionError:
        return False
    return True


async def said(world: DiscordWorld, interaction: dict[str, Any], timeout: float = 5.0) -> str:
    """What the clicker was told: a follow-up, an edited original, or the callback's message."""
    token = str(interaction["token"])

    def told(call: Any) -> bool:
        if token not in call.path or call.method not in ("POST", "PATCH"):
            return False
        body = call.json or {}
        return "content" in body or "content" in (body.get("data") or {})

    calls = await world.discord.wait_for(told, timeout=timeout)
    body = calls[-1].json or {}
    return str(body.get("content", (body.get("data") or {}).get("content", "")))


def _component_id(card: dict[str, Any], prefix: str) -> str:
    for row in card.get("components") or []:
        for component in row.get("components") or []:
            if str(component.get("custom_id", "")).startswith(prefix):
                return str(component["custom_id"])
    raise AssertionError(f"no {prefix} component")


def _request_id(card: dict[str, Any]) -> str:
    """The request an approval card's buttons name: the last part of their custom ids."""
    return _component_id(card, "kestrel:approve:").rsplit(":", 1)[1]


async def _approval_card(world: DiscordWorld) -> tuple[str, dict[str, Any]]:
    """A mention whose run waits on an approval: its thread and the approval card."""
    thread = await world.thread_of(await world.mention("checkout is failing"))
    return thread, await world.card("approve")


async def _select(world: DiscordWorld, card: dict[str, Any], values: list[str]) -> dict[str, Any]:
    data = p.interaction_select(
        custom_id=_component_id(card, "kestrel:choose:"),
        values=values,
        guild=p.GUILD_ID,
        channel=str(card["channel_id"]),
        user_id=REQUESTER,
        message=card,
    )
    await world.discord.dispatch("INTERACTION_CREATE", data)
    return data


async def test_select_values_out_of_range_or_not_numbers_are_refused(tmp_path: Path) -> None:
    async with discord_world(tmp_path, select_script(30)) as world:
        mention = await world.mention("drain a node")
        await world.thread_of(mention)
        card = await world.card("choose")
        for values in (["30"], ["-1"], ["abc"], []):
            forged = await _select(world, card, values)
            assert "not one of the options" in await said(world, forged), values


async def test_select_values_that_int_cannot_read_are_refused_not_crashed(
    tmp_path: Path,
) -> None:
    # "²".isdigit() is True but int("²") raises, as does int() of 5,000 digits: the click is
    # never answered ("This interaction failed"). Discord checks select values against the
    # options, so only a forged payload gets here.
    async with discord_world(tmp_path, select_script(30)) as world:
        mention = await world.mention("drain a node")
        await world.thread_of(mention)
        card = await world.card("choose")
        for value in ("²", "9" * 5000):
            forged = await _select(world, card, [value])
            assert await responded(world, forged), f"{value[:5]!r}: never answered"


async def test_wrong_kinds_on_a_request_are_refused(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        thread, card = await _approval_card(world)
        req = _request_id(card)
        for custom_id in (
            f"kestrel:effect:done:{req}",
            f"kestrel:choose:{req}:0",
            f"kestrel:answer:{req}",
        ):
            forged = p.interaction_button(
                custom_id=custom_id, guild=p.GUILD_ID, channel=thread, user_id=APPROVER
            )  # the message shows the forged button (discord.py drops ids not on the message)
            await world.discord.dispatch("INTERACTION_CREATE", forged)
            assert await responded(world, forged), custom_id
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id
        assert [v.status for v in await world.chat.requests_of(run_id)] == [RequestStatus.OPEN]
        assert world.executions == []


async def test_an_unknown_request_id_is_answered(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        for custom_id in ("kestrel:approve:req_doesnotexist", "kestrel:deny:req_nope"):
            forged = p.interaction_button(custom_id=custom_id, user_id=APPROVER)
            await world.discord.dispatch("INTERACTION_CREATE", forged)
            assert await responded(world, forged), custom_id


async def test_a_click_without_member_or_user_changes_nothing_and_is_answered(
    tmp_path: Path,
) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        thread, card = await _approval_card(world)
        forged = p.interaction_button(
            custom_id=_component_id(card, "kestrel:approve:"),
            channel=thread,
            message=card,
            user_id=APPROVER,
        )
        del forged["member"]
        await world.discord.dispatch("INTERACTION_CREATE", forged)
        assert await responded(world, forged)
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id
        assert [v.status for v in await world.chat.requests_of(run_id)] == [RequestStatus.OPEN]


async def test_two_approvers_at_once_run_the_tool_once(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        thread, card = await _approval_card(world)
        one = p.interaction_button(
            custom_id=_component_id(card, "kestrel:approve:"),
            channel=thread,
            message=card,
            user_id=APPROVER,
        )
        two = p.interaction_button(
            custom_id=_component_id(card, "kestrel:approve_run:"),
            channel=thread,
            message=card,
            user_id="1500",
            roles=[p.ROLE_ID],
        )
        await asyncio.gather(
            world.discord.dispatch("INTERACTION_CREATE", one),
            world.discord.dispatch("INTERACTION_CREATE", two),
        )
        told = sorted([await said(world, one), await said(world, two)])
        assert sum("Recorded" in t for t in told) == 1, told
        await world.answer_posted(thread, "healthy again")
        await world.settled()
        assert world.executions == ["checkout"]


async def test_a_deny_form_sent_after_someone_else_approved_is_refused(tmp_path: Path) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        thread, card = await _approval_card(world)
        await world.click(card, "deny", user=APPROVER)
        await world.discord.wait_for(
            lambda c: "callback" in c.path and (c.json or {}).get("type") == 9
        )
        modal = world.discord.modals[-1]
        approve = await world.click(card, "approve", user="1500", roles=[p.ROLE_ID])
        assert "Recorded" in await said(world, approve)
        await world.answer_posted(thread, "healthy again")
        submit = p.interaction_modal_submit(
            custom_id=modal["custom_id"],
            message=card,  # a form opened from a card carries it
            components={modal["components"][0]["components"][0]["custom_id"]: "no"},
            channel=thread,
            user_id=APPROVER,
        )
        await world.discord.dispatch("INTERACTION_CREATE", submit)
        assert "already" in await said(world, submit)


async def test_a_deny_form_opened_before_a_restart_still_works_after(tmp_path: Path) -> None:
    async with FakeDiscord() as fake:
        async with discord_world(tmp_path, restart_script(), fake=fake) as first:
            mention = await first.mention("checkout is failing")
            thread = await first.thread_of(mention)
            card = await first.card("approve")
            await first.click(card, "deny", user=APPROVER)
            await fake.wait_for(lambda c: "callback" in c.path and (c.json or {}).get("type") == 9)
            modal = fake.modals[-1]
            await first.settled()
        async with discord_world(tmp_path, restart_script(), fake=fake) as second:
            submit = p.interaction_modal_submit(
                custom_id=modal["custom_id"],
                message=card,  # a form opened from a card carries it
                components={modal["components"][0]["components"][0]["custom_id"]: "peak"},
                channel=thread,
                user_id=APPROVER,
            )
            await fake.dispatch("INTERACTION_CREATE", submit)
            assert await responded(second, submit), "the reason typed before the restart is lost"
            await second.answer_posted(thread, "denied")


async def test_a_request_of_a_run_outside_discord_cannot_be_decided_from_discord(
    tmp_path: Path,
) -> None:
    # A run of another platform (here: a CLI-like session), its request id forged into a
    # button: the card's "another guild" check does not apply (no Discord place), so any
    # Discord user the policy names (or "*", or a group) decides it.
    async with discord_world(tmp_path, restart_script()) as world:
        session = Session(id="cli:tty", platform="cli", channel="tty", thread="")
        await world.chat.submit_turn(
            "checkout", user=Actor("ops"), session=session, prompter=DeferringPrompter()
        )

        pending = await until(world.chat.pending, timeout=10)
        req = pending[0].request.id
        forged = p.interaction_button(custom_id=f"kestrel:approve:{req}", user_id=APPROVER)
        await world.discord.dispatch("INTERACTION_CREATE", forged)
        told = await said(world, forged)
        await world.settled()
        assert "Recorded" not in told and world.executions == [], told


async def test_a_click_on_a_request_of_a_run_outside_discord_is_audited(tmp_path: Path) -> None:
    # Refused as "not one of a Discord run's" before the run's place is weighed, such a click
    # left no trace: it is audited with where it came from, as one from another server is.
    async with discord_world(tmp_path, restart_script()) as world:
        session = Session(id="cli:tty", platform="cli", channel="tty", thread="")
        await world.chat.submit_turn(
            "checkout", user=Actor("ops"), session=session, prompter=DeferringPrompter()
        )
        request = (await until(world.chat.pending, timeout=10))[0].request
        for kind in ("approve", "deny", "arguments"):
            forged = p.interaction_button(
                custom_id=f"kestrel:{kind}:{request.id}", user_id=APPROVER
            )
            await world.discord.dispatch("INTERACTION_CREATE", forged)
            assert await said(world, forged) == "That request is not one of a Discord run's."
        audit = await world.rt.store.list_audit(request.run_id)
        refused = sorted(str(a.action) for a in audit if a.actor == APPROVER)
        assert refused == ["approve_refused", "deny_refused", "show_refused"], refused
        where = f"(acted from discord:{p.GUILD_ID}:{p.CHANNEL_ID})"
        assert all(a.detail.endswith(where) for a in audit if a.actor == APPROVER), audit
        assert world.executions == []


async def test_a_form_that_carries_no_card_decides_nothing(tmp_path: Path) -> None:
    # Discord sends the message a form was opened from; a submission without it (forged, or
    # from anywhere in the run's channel) is not on the request's card, whoever sends it.
    async with discord_world(tmp_path, restart_script()) as world:
        thread, card = await _approval_card(world)
        request_id = _request_id(card)
        for channel in (thread, p.CHANNEL_ID):
            submit = p.interaction_modal_submit(
                custom_id=f"kestrel:deny_modal:{request_id}:{APPROVER}",
                components={"reason": "no"},
                channel=channel,
                user_id=APPROVER,
            )
            await world.discord.dispatch("INTERACTION_CREATE", submit)
            assert "not on that request's card" in await said(world, submit)
        view = (await world.chat.requests_of((await world.chat.recent(1))[0].id))[0]
        assert view.status is RequestStatus.OPEN
        actions = [a.action for a in await world.rt.store.list_audit(view.request.run_id)]
        assert actions.count("deny_refused") == 2


async def test_deny_pressed_off_the_card_opens_no_form(tmp_path: Path) -> None:
    # The form's decision counts only from the card: opened from another message of the run's
    # thread, it would take a reason only to refuse it on submission.
    async with discord_world(tmp_path, restart_script()) as world:
        thread, card = await _approval_card(world)
        request_id = _request_id(card)
        click = p.interaction_button(
            custom_id=f"kestrel:deny:{request_id}", channel=thread, user_id=APPROVER
        )
        await world.discord.dispatch("INTERACTION_CREATE", click)
        assert await said(world, click) == "this button is not on that request's card"
        assert world.discord.interactions[str(click["id"])]["response_type"] != 9  # a modal
        run_id = (await world.chat.recent(1))[0].id
        audit = await world.rt.store.list_audit(run_id)
        refused = [a.detail for a in audit if a.action == "deny_refused"]
        where = f"acted from discord:{p.GUILD_ID}:{p.CHANNEL_ID}:{thread}"
        assert refused == [f"this button is not on that request's card ({where})"], refused


async def test_an_option_chosen_in_another_channel_is_refused_as_such(tmp_path: Path) -> None:
    async with discord_world(tmp_path, select_script(3)) as world:
        mention = await world.mention("drain a node")
        thread = await world.thread_of(mention)
        card = await world.card("choose")
        elsewhere = p.interaction_button(
            guild=p.GUILD_ID,
            channel="201",  # another channel of the run's guild
            user_id=REQUESTER,
            custom_id=_component_id(card, "kestrel:choose:"),
            message=card,
        )
        await world.discord.dispatch("INTERACTION_CREATE", elsewhere)
        assert "another" in await said(world, elsewhere)
        run_id = (await world.chat.recent(1))[0].id
        assert "answer_refused" in [a.action for a in await world.rt.store.list_audit(run_id)]
        here = await world.click(card, "choose", user=REQUESTER)  # from the run's thread
        assert "Recorded" in await said(world, here)
        await world.answer_posted(thread, "Draining node-0")


async def test_a_click_answered_after_its_token_expired_decides_nothing_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Discord refuses the defer with 10062 once 3 s passed: the clicker was told the click
    # failed, so it must count for nothing, and the log says so in one line (it held a
    # traceback from discord.py's view, per click).
    async with FakeDiscord() as fake, discord_world(tmp_path, restart_script(), fake=fake) as world:
        thread = await world.thread_of(await world.mention("checkout is failing"))
        card = await world.card("approve")
        await world.settled()
        fake.fail(
            "POST",
            r"/interactions/.*/callback",
            status=404,
            code=10062,
            message="Unknown interaction",
        )
        await world.click(card, "approve", user=APPROVER)
        await fake.wait_for(lambda c: "callback" in c.path and c.status == 404)
        await until(lambda: "expired before Kestrel answered it" in caplog.text, timeout=5)
        await world.adapter.client.handled(5)
        await world.settled()
        assert "Traceback" not in caplog.text
        assert world.executions == []
        click = await world.click(card, "approve", user=APPROVER)  # in time: it counts
        assert "Recorded" in await world.answered(click)
        await world.answer_posted(thread, "healthy again")


async def test_full_arguments_are_shown_from_the_run_thread_alone(tmp_path: Path) -> None:
    service = "checkout" + "q" * 400  # cut on the card: it offers Full arguments
    script = restart_script()
    script[0]["calls"][0]["arguments"]["service"] = service
    async with discord_world(tmp_path, script) as world:
        thread, card = await _approval_card(world)
        arguments = _component_id(card, "kestrel:arguments:")
        forged = [
            # another channel of the run's guild, a direct message, an unknown request
            p.interaction_button(custom_id=arguments, channel="201", user_id=APPROVER),
            p.interaction_button(custom_id=arguments, guild=None, channel="9", user_id=APPROVER),
            p.interaction_button(custom_id="kestrel:arguments:req_nope", user_id=APPROVER),
        ]
        for click in forged:
            await world.discord.dispatch("INTERACTION_CREATE", click)
            told = await said(world, click)
            assert "qqqq" not in told, told
        run_id = (await world.chat.recent(1))[0].id
        audit = [a.action for a in await world.rt.store.list_audit(run_id)]
        assert audit.count("show_refused") == 2, audit
        here = await world.click(card, "arguments", user=REQUESTER)  # no approver, yet here
        assert "qqqq" in await said(world, here)
        assert thread


async def test_full_arguments_read_slower_than_the_http_answer_still_reach_the_clicker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Over the HTTP endpoint a handler that has not answered in time is answered with a defer,
    # and its own first response is dropped: the arguments' first message (the only one, for
    # a short call) never reached the clicker when the reads took longer than that.
    from aiohttp import web

    from adapters.discord import interactions
    from tests.fakes.discord_http import InteractionPoster
    from tests.fakes.serving import free_port

    monkeypatch.setattr(interactions, "ANSWER_SECONDS", 0.3)
    service = "checkout" + "q" * 400
    script = restart_script()
    script[0]["calls"][0]["arguments"]["service"] = service
    async with discord_world(tmp_path, script) as world:
        thread, card = await _approval_card(world)
        poster = InteractionPoster(world.discord)
        key = interactions.public_key(poster.public_key)
        application = web.Application()
        interactions.InteractionEndpoint(world.adapter.client, key).add_to(application)
        runner = web.AppRunner(application)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            read = world.chat.request

            async def slow(*args: Any, **kwargs: Any) -> Any:
                await asyncio.sleep(0.4)  # a store under load: longer than the answer waits
                return await read(*args, **kwargs)

            monkeypatch.setattr(world.chat, "request", slow)
            click = p.interaction_button(
                custom_id=_component_id(card, "kestrel:arguments:"),
                channel=thread,
                message=card,
                user_id=APPROVER,
            )
            url = f"http://127.0.0.1:{port}{interactions.INTERACTIONS_PATH}"
            status, _ = await poster.post(url, click)
            assert status == 200
            assert "qqqq" in await said(world, click, timeout=8)
        finally:
            await runner.cleanup()


async def test_a_click_the_store_fails_under_is_answered_not_left_thinking(
    tmp_path: Path,
) -> None:
    """A decision is deferred ("Kestrel is thinking…") before the store is asked: when the
    store fails under it (here the run's journal, cut short on disk, cannot be read to resume
    it), the clicker is told which entry cannot be read (a click again would meet it again),
    instead of the thinking line staying for ever."""
    async with discord_world(tmp_path, restart_script()) as world:
        await world.mention("checkout is failing")
        card = await world.card("approve")
        await world.settled()
        run_id = (await world.chat.recent(1))[0].id
        with sqlite3.connect(tmp_path / "kestrel.db") as conn:
            cut = "UPDATE journal SET body = substr(body, 1, 20) WHERE run_id = ? AND seq = 1"
            conn.execute(cut, (run_id,))
        click = await world.click(card, "approve", user=APPROVER)
        unreadable = f"run '{run_id}': journal entry at seq 1 is unreadable"
        # The click counted: the run waits for the entry's repair, not for another click.
        said = f"recorded; not resumed here: {unreadable}: Input data was truncated"
        assert await world.answered(click) == said
        assert world.executions == []


async def test_full_arguments_the_store_fails_under_are_answered_not_left_thinking(
    tmp_path: Path,
) -> None:
    """Full arguments defers ("thinking…") before it reads the request: with the store failing
    under that read (here the requests' table gone from under it), the clicker is told so
    instead of the thinking line staying for ever."""
    service = "checkout" + "q" * 400  # cut on the card: it offers Full arguments
    script = restart_script()
    script[0]["calls"][0]["arguments"]["service"] = service
    async with discord_world(tmp_path, script) as world:
        _thread, card = await _approval_card(world)
        await world.settled()
        with sqlite3.connect(tmp_path / "kestrel.db") as conn:
            conn.execute("ALTER TABLE requests RENAME TO requests_away")
        try:
            click = await world.click(card, "arguments", user=REQUESTER)
            told = await said(world, click)
        finally:
            with sqlite3.connect(tmp_path / "kestrel.db") as conn:
                conn.execute("ALTER TABLE requests_away RENAME TO requests")
        assert told == "Kestrel's store did not answer: try again in a moment."


@pytest.mark.parametrize("kind", ["deny", "choose"])
async def test_a_form_or_an_option_the_store_fails_under_is_answered_not_failed(
    tmp_path: Path, kind: str
) -> None:
    """Deny (a form to open) and an option (its words to read) read the request before they
    answer Discord: with the store failing under that read (here the requests' table gone
    from under it), the clicker is told so, instead of "This interaction failed" and a
    traceback in the log."""
    script = restart_script() if kind == "deny" else select_script(3)
    async with discord_world(tmp_path, script) as world:
        await world.mention("checkout is failing")
        card = await world.card(kind)
        await world.settled()
        with sqlite3.connect(tmp_path / "kestrel.db") as conn:
            conn.execute("ALTER TABLE requests RENAME TO requests_away")
        try:
            click = await world.click(card, kind, user=REQUESTER)
            told = await said(world, click)
        finally:
            with sqlite3.connect(tmp_path / "kestrel.db") as conn:
                conn.execute("ALTER TABLE requests_away RENAME TO requests")
        assert told == NOT_RECORDED


async def test_a_click_from_another_guild_learns_nothing_of_how_the_request_closed(
    tmp_path: Path,
) -> None:
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        card = await world.card("approve")
        assert "Recorded" in await world.answered(await world.click(card, "approve", user=APPROVER))
        await world.answer_posted(thread, "Restarted checkout")
        guest = await world.click(card, "approve", user="1999", guild="777")
        said = await world.answered(guest)
        assert said.endswith("is in another server: act on it from its run's thread there"), said
        assert APPROVER not in said and "answered" not in said


async def test_a_member_whose_role_was_taken_away_after_the_card_showed_may_not_approve(
    tmp_path: Path,
) -> None:
    # Roles come with each click: the one that opened the Deny form had the SRE role, the
    # Approve click after an admin took it away has not, and approves nothing.
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        await world.thread_of(mention)
        card = await world.card("approve")
        await world.click(card, "deny", user="1500", roles=[SRE_ROLE])
        await world.discord.wait_for(lambda c: "callback" in c.path and "modal" in str(c.json))
        said = await world.answered(await world.click(card, "approve", user="1500"))
        assert said.startswith("1500 may not approve restart_service"), said
        run_id = (await world.chat.recent(1))[0].id
        assert [v.status for v in await world.chat.requests_of(run_id)] == [RequestStatus.OPEN]
        assert world.executions == []


@pytest.mark.parametrize("case", ["form", "refused", "store", "option"])
async def test_a_click_answered_at_once_after_its_token_expired_is_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    # Deny and Answer answer with the form itself (or a refusal, or the store's failure), and
    # an option not offered with a note, not with a defer: past Discord's 3 s (a slow store,
    # or the lookups a refusal makes), its 10062 left a traceback from discord.py's view, per
    # click, as a defer's did.
    script = select_script(30) if case == "option" else restart_script()
    async with FakeDiscord() as fake, discord_world(tmp_path, script, fake=fake) as world:
        await world.mention("checkout is failing")
        card = await world.card("choose" if case == "option" else "approve")
        await world.settled()
        fake.fail(
            "POST",
            r"/interactions/.*/callback",
            status=404,
            code=10062,
            message="Unknown interaction",
        )
        if case == "store":
            with sqlite3.connect(tmp_path / "kestrel.db") as conn:
                conn.execute("ALTER TABLE requests RENAME TO requests_away")
        if case == "option":
            await _select(world, card, ["30"])  # one the menu does not offer
        else:
            await world.click(card, "deny", user=APPROVER if case != "refused" else "1999")
        await fake.wait_for(lambda c: "callback" in c.path and c.status == 404)
        await until(lambda: "expired before Kestrel answered it" in caplog.text, timeout=5)
        await world.adapter.client.handled(5)
        assert "Traceback" not in caplog.text
        assert "Ignoring exception" not in caplog.text
