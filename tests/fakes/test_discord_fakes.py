"""Self-tests of the Discord fake: the real discord.py 2.7 client runs against it."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import discord
import pytest
import yarl
from discord import app_commands
from discord.gateway import DiscordWebSocket
from discord.http import Route

from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import Call, FakeDiscord, patched_route_base

G, C, BOT, APP = p.GUILD_ID, p.CHANNEL_ID, p.BOT_ID, p.APP_ID
INTENTS = discord.Intents(guilds=True, guild_messages=True)


# ----------------------------------------------------------------------------- the test bot


class Approve(
    discord.ui.DynamicItem[discord.ui.Button[Any]],
    template=r"kestrel:approve:(?P<req>[a-z0-9_]+)",
):
    """Answers a click with an ephemeral defer and an ephemeral follow-up."""

    def __init__(self, req: str) -> None:
        super().__init__(
            discord.ui.Button(
                label="Approve",
                style=discord.ButtonStyle.success,
                custom_id=f"kestrel:approve:{req}",
            )
        )
        self.req = req

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str]
    ) -> Approve:
        return cls(match["req"])

    async def callback(self, interaction: discord.Interaction) -> None:
        assert isinstance(interaction.client, KestrelBot)
        interaction.client.note("approve", self.req, interaction.user.id)
        await interaction.response.defer(ephemeral=True)
        await interaction.followup.send("ok", ephemeral=True)


class Think(
    discord.ui.DynamicItem[discord.ui.Button[Any]],
    template=r"kestrel:think:(?P<req>[a-z0-9_]+)",
):
    """Defers with a thinking (ephemeral) response, then edits the original response."""

    def __init__(self, req: str) -> None:
        super().__init__(discord.ui.Button(label="Think", custom_id=f"kestrel:think:{req}"))
        self.req = req

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str]
    ) -> Think:
        return cls(match["req"])

    async def callback(self, interaction: discord.Interaction) -> None:
        await interaction.response.defer(ephemeral=True, thinking=True)
        await interaction.edit_original_response(content=f"done {self.req}")
        original = await interaction.original_response()
        assert isinstance(interaction.client, KestrelBot)
        interaction.client.note("think", original.content, original.flags.ephemeral)


class ReasonModal(discord.ui.Modal, title="Why?"):
    reason: discord.ui.TextInput[ReasonModal] = discord.ui.TextInput(
        label="Reason", custom_id="reason"
    )

    def __init__(self, req: str) -> None:
        super().__init__(custom_id=f"kestrel:reason_modal:{req}", timeout=30)
        self.req = req

    async def on_submit(self, interaction: discord.Interaction) -> None:
        assert isinstance(interaction.client, KestrelBot)
        interaction.client.note("reason", self.req, self.reason.value)
        await interaction.response.send_message("thanks", ephemeral=True)


class Reason(
    discord.ui.DynamicItem[discord.ui.Button[Any]],
    template=r"kestrel:reason:(?P<req>[a-z0-9_]+)",
):
    """Opens :class:`ReasonModal`."""

    def __init__(self, req: str) -> None:
        super().__init__(discord.ui.Button(label="Reason", custom_id=f"kestrel:reason:{req}"))
        self.req = req

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str]
    ) -> Reason:
        return cls(match["req"])

    async def callback(self, interaction: discord.Interaction) -> None:
        await interaction.response.send_modal(ReasonModal(self.req))


class KestrelBot(discord.Client):
    def __init__(self) -> None:
        super().__init__(intents=INTENTS, guild_ready_timeout=0.1)
        self.seen: list[tuple[Any, ...]] = []
        self.threads: list[discord.Thread] = []
        self.created_threads: list[int] = []
        self.changed = asyncio.Condition()
        self._pending: set[asyncio.Task[None]] = set()
        self.tree = app_commands.CommandTree(self)
        group = app_commands.Group(name="kestrel", description="Kestrel")

        @group.command(name="status", description="Show status")
        async def status(interaction: discord.Interaction, service: str = "all") -> None:
            self.note("status", service)
            await interaction.response.send_message(f"status of {service}: green")

        self.tree.add_command(group)

    async def setup_hook(self) -> None:
        self.add_dynamic_items(Approve, Think, Reason)

    def note(self, *entry: Any) -> None:
        """Record what a handler saw and wake :meth:`wait`."""
        self.seen.append(entry)
        task = asyncio.get_running_loop().create_task(self._notify())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def wait(self, probe: Any, timeout: float = 5.0) -> Any:
        """Wait (bounded) until ``probe()`` is truthy, re-checking after every note."""
        result = None

        def ready() -> bool:
            nonlocal result
            result = probe()
            return bool(result)

        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(ready)
        return result

    async def on_thread_create(self, thread: discord.Thread) -> None:
        self.created_threads.append(thread.id)
        await self._notify()

    async def on_message(self, message: discord.Message) -> None:
        if message.author == self.user:
            return
        self.note("message", message.id, message.content)
        if self.user in message.mentions:
            thread = await message.create_thread(name=f"kestrel: {message.id}")
            self.threads.append(thread)
            view = discord.ui.View(timeout=None)
            view.add_item(Approve("req_1"))
            await thread.send("hi", view=view)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def no_swallowed_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """discord.py logs (and swallows) exceptions raised in event handlers, views, modals and
    dynamic items; a test that passes while one was logged is no pass."""
    yield
    errors = [
        r
        for phase in ("setup", "call")
        for r in caplog.get_records(phase)
        if r.levelno >= logging.ERROR and r.name.startswith("discord")
    ]
    assert not errors, [r.getMessage() for r in errors]


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval_ms=1000) as fake:
        with patched_route_base(fake):
            yield fake


async def start(client: discord.Client) -> asyncio.Task[None]:
    """Start ``client`` and wait (bounded) until it is ready; fail early if start fails."""
    task = asyncio.create_task(client.start("token"))
    ready = asyncio.create_task(client.wait_until_ready())
    done, _ = await asyncio.wait({task, ready}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if ready not in done:
        ready.cancel()
        if task in done:
            task.result()  # raise the start failure
        raise AssertionError("the client did not become ready within 10s")
    return task


async def stop(client: discord.Client, task: asyncio.Task[None]) -> None:
    await client.close()
    await asyncio.wait_for(task, timeout=5)


@pytest.fixture
async def bot(fake: FakeDiscord) -> AsyncIterator[KestrelBot]:
    client = KestrelBot()
    task = await start(client)
    try:
        yield client
    finally:
        await stop(client, task)


# ----------------------------------------------------------------------------- login + gateway


async def test_login_identify_and_guild_available(fake: FakeDiscord, bot: KestrelBot) -> None:
    assert [c.route for c in fake.calls[:2]] == ["me", "application"]
    assert fake.calls[0].headers["authorization"] == "Bot token"
    assert bot.user is not None and bot.user.id == int(BOT) and bot.user.bot
    assert bot.application_id == int(APP)

    assert fake.gateway_queries == [{"v": "10", "encoding": "json", "compress": "zlib-stream"}]
    assert fake.identifies[0]["intents"] == INTENTS.value
    assert fake.identifies[0]["token"] == "token"
    assert fake.gateway_sent[0]["op"] == 10  # HELLO; then an ACK of the immediate heartbeat
    dispatches = [s["t"] for s in fake.gateway_sent if s["op"] == 0]
    assert dispatches[:2] == ["READY", "GUILD_CREATE"]

    guild = bot.get_guild(int(G))
    assert guild is not None and not guild.unavailable
    assert guild.name == "Kestrel Test"
    channel = guild.get_channel(int(C))
    assert isinstance(channel, discord.TextChannel) and channel.name == "ops"
    assert guild.get_role(int(p.ROLE_ID)).name == "sre"  # type: ignore[union-attr]
    assert guild.me is not None and guild.me.id == int(BOT)
    assert channel.permissions_for(guild.me).send_messages_in_threads


async def test_heartbeats_are_acked(fake: FakeDiscord, bot: KestrelBot) -> None:
    await fake.wait_until(lambda: len(fake.heartbeats) >= 2, timeout=5, describe="2 heartbeats")
    assert fake.heartbeat_acks >= 2
    # the first ACK went out ~1 s before the second heartbeat came in: the client has read it
    assert 0 <= bot.latency < 1
    gap = fake.heartbeats[1] - fake.heartbeats[0]
    assert 0.5 < gap < 2.5  # heartbeat_interval 1000 ms (the first beat is immediate)


async def test_gateway_url_from_rest_and_zlib_frames(fake: FakeDiscord) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{fake.api_url}/gateway/bot") as response:
            assert response.headers["Content-Type"] == "application/json"
            body = await response.json()
        assert body["url"] == fake.gateway_url
        assert body["shards"] == 1 and body["session_start_limit"]["max_concurrency"] == 1

        url = yarl.URL(body["url"]).with_query(v=10, encoding="json", compress="zlib-stream")
        async with session.ws_connect(url) as ws:
            inflate = zlib.decompressobj()
            frame = await ws.receive(timeout=5)
            assert frame.type is aiohttp.WSMsgType.BINARY
            assert frame.data.endswith(b"\x00\x00\xff\xff")
            hello = json.loads(inflate.decompress(frame.data))
            assert hello["op"] == 10 and hello["d"]["heartbeat_interval"] == 1000
            await ws.send_json({"op": 2, "d": {"token": "t", "intents": 1, "properties": {}}})
            ready = json.loads(inflate.decompress((await ws.receive(timeout=5)).data))
            guild = json.loads(inflate.decompress((await ws.receive(timeout=5)).data))
    assert ready["t"] == "READY" and ready["s"] == 1
    assert ready["d"]["guilds"] == [{"id": G, "unavailable": True}]
    assert ready["d"]["resume_gateway_url"] == fake.gateway_url
    assert guild["t"] == "GUILD_CREATE" and guild["s"] == 2
    assert [m["user"]["id"] for m in guild["d"]["members"]] == [BOT]


async def test_plain_text_frames_when_compression_is_off() -> None:
    async with FakeDiscord(gateway_compress=False) as fake:
        with patched_route_base(fake):
            client = KestrelBot()
            task = await start(client)
            assert client.get_guild(int(G)) is not None
            await stop(client, task)


async def test_resume_after_reconnect_request(fake: FakeDiscord, bot: KestrelBot) -> None:
    await fake.reconnect_gateway()
    await fake.wait_until(lambda: fake.resumes, describe="a RESUME")
    await fake.wait_for_gateway(connections=2)
    assert len(fake.identifies) == 1
    ready = next(s for s in fake.gateway_sent if s.get("t") == "READY")
    assert fake.resumes[0]["session_id"] == ready["d"]["session_id"]
    assert fake.resumes[0]["seq"] >= 2  # READY + GUILD_CREATE were seen
    await fake.dispatch("MESSAGE_CREATE", p.message_create(content="after resume", mentions=[]))
    await bot.wait(lambda: any(s[0] == "message" and s[2] == "after resume" for s in bot.seen))


async def test_close_ends_cleanly(fake: FakeDiscord) -> None:
    client = KestrelBot()
    task = await start(client)
    await client.close()
    await asyncio.wait_for(task, timeout=5)
    assert task.exception() is None
    await fake.wait_until(lambda: fake.gateway_closes, describe="the gateway close")
    # client.close() asks for 1000, but discord.py's reader task, woken by the close, sends
    # its own close(4000) first: Discord sees a resumable close code.
    assert fake.gateway_closes == [4000]
    assert client.is_closed()


def test_patched_route_base_restores() -> None:
    fake = FakeDiscord()
    before = (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)
    with patched_route_base(fake):
        assert fake.api_url == Route.BASE
        assert str(DiscordWebSocket.DEFAULT_GATEWAY) == fake.gateway_url
    assert before == (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)


# ----------------------------------------------------------------------------- messages, threads


async def test_mention_starts_thread_and_posts_card(fake: FakeDiscord, bot: KestrelBot) -> None:
    mention = p.message_create(author_id="1000", content=f"<@{BOT}> disk is full")
    await fake.dispatch("MESSAGE_CREATE", mention)

    (post,) = await fake.wait_for(r"POST /channels/\d+/messages", answered=True)
    (start_thread,) = fake.calls_to("POST", rf"/channels/{C}/messages/\d+/threads")
    assert start_thread.path == f"/channels/{C}/messages/{mention['id']}/threads"
    assert start_thread.json["name"] == f"kestrel: {mention['id']}"
    thread_id = mention["id"]  # a thread started from a message takes the message's id
    assert post.path == f"/channels/{thread_id}/messages"
    assert post.json["content"] == "hi"
    button = post.json["components"][0]["components"][0]
    assert button["custom_id"] == "kestrel:approve:req_1"

    thread = fake.channels[thread_id]
    assert thread["type"] == 11 and thread["parent_id"] == C and thread["owner_id"] == BOT
    assert thread["message_count"] == 1
    (card,) = fake.bot_messages(thread_id)
    assert card["components"][0]["components"][0]["id"] == 2  # Discord numbers components
    assert fake.message(C, mention["id"])["thread"]["id"] == thread_id  # type: ignore[index]

    assert bot.threads[0].id == int(thread_id)
    await bot.wait(lambda: bot.created_threads)  # the THREAD_CREATE echo
    assert bot.created_threads == [int(thread_id)]
    cached = bot.get_channel(int(thread_id))
    assert isinstance(cached, discord.Thread) and cached.parent_id == int(C)
    # the bot's own message came back as MESSAGE_CREATE and was ignored by on_message
    await fake.wait_until(
        lambda: any(
            s.get("t") == "MESSAGE_CREATE" and s["d"]["id"] == card["id"] for s in fake.gateway_sent
        ),
        describe="the echo of the card",
    )
    assert [s[0] for s in bot.seen] == ["message"]


async def test_history_edit_delete_and_unknown_message(fake: FakeDiscord, bot: KestrelBot) -> None:
    channel = bot.get_channel(int(C))
    assert isinstance(channel, discord.TextChannel)
    first = await channel.send("one")
    second = await channel.send("two")
    third = await channel.send("three")
    newest_first = [m.content async for m in channel.history(limit=10)]
    assert newest_first == ["three", "two", "one"]
    after = [m.content async for m in channel.history(after=first, oldest_first=True)]
    assert after == ["two", "three"]

    edited = await second.edit(content="two!")
    assert edited.content == "two!" and edited.edited_at is not None
    fetched = await channel.fetch_message(second.id)
    assert fetched.content == "two!"
    await third.delete()
    assert [m["content"] for m in fake.channel_messages(C)] == ["one", "two!"]

    with pytest.raises(discord.NotFound) as missing:
        await channel.get_partial_message(int(p.snowflake())).edit(content="x")
    assert missing.value.code == 10008
    with pytest.raises(discord.HTTPException) as empty:
        await channel.send(content="")
    assert empty.value.code == 50006
    with pytest.raises(discord.HTTPException) as too_long:
        await channel.send("x" * 2001)
    assert too_long.value.code == 50035


async def test_embeds_components_and_names_over_discords_limits_are_refused(
    fake: FakeDiscord, bot: KestrelBot
) -> None:
    channel = bot.get_channel(int(C))
    assert isinstance(channel, discord.TextChannel)
    fields = discord.Embed(title="t")
    for n in range(26):
        fields.add_field(name=f"f{n}", value="v")
    view = discord.ui.View()
    for n in range(6):
        view.add_item(discord.ui.Button(label=str(n), custom_id=f"b{n}", row=0 if n < 5 else 1))
    view.children[0].label = "x" * 81  # type: ignore[attr-defined]
    too_big: list[dict[str, Any]] = [
        {"embed": discord.Embed(description="x" * 4097)},
        {"embed": fields},
        {"embeds": [discord.Embed(description="x" * 4000), discord.Embed(description="y" * 2001)]},
        {"view": view},
    ]
    for kwargs in too_big:
        with pytest.raises(discord.HTTPException) as refused:
            await channel.send("x", **kwargs)
        assert refused.value.code == 50035
    with pytest.raises(discord.HTTPException) as named:
        await channel.create_thread(name="n" * 101, type=discord.ChannelType.public_thread)
    assert named.value.code == 50035
    await channel.create_thread(name="n" * 100, type=discord.ChannelType.public_thread)


async def test_typing_and_thread_without_message(fake: FakeDiscord, bot: KestrelBot) -> None:
    channel = bot.get_channel(int(C))
    assert isinstance(channel, discord.TextChannel)
    await channel.typing()
    assert fake.calls_to("POST", rf"/channels/{C}/typing")[0].status == 204
    thread = await channel.create_thread(name="standalone", type=discord.ChannelType.public_thread)
    assert thread.type is discord.ChannelType.public_thread
    assert fake.channels[str(thread.id)]["name"] == "standalone"
    await thread.send("inside")
    assert fake.channel_messages(str(thread.id))[0]["content"] == "inside"


async def test_archived_thread_fetch_and_unarchive(fake: FakeDiscord, bot: KestrelBot) -> None:
    seeded = fake.add_thread(C, name="old")
    fake.archive(seeded["id"])
    thread = await bot.fetch_channel(int(seeded["id"]))
    assert isinstance(thread, discord.Thread) and thread.archived
    await thread.edit(archived=False)
    (patch,) = fake.calls_to("PATCH", rf"/channels/{seeded['id']}")
    assert patch.json == {"archived": False}
    assert fake.channels[seeded["id"]]["thread_metadata"]["archived"] is False

    fake.archive(seeded["id"], locked=True)
    with pytest.raises(discord.HTTPException) as refused:
        await thread.send("nope")
    assert refused.value.code == 50083


async def test_429_is_waited_out_and_retried_once(fake: FakeDiscord, bot: KestrelBot) -> None:
    channel = bot.get_channel(int(C))
    assert isinstance(channel, discord.TextChannel)
    fake.fail("POST", rf"/channels/{C}/messages", status=429, retry_after=0.3)
    message = await channel.send("after the limit")

    limited, ok = fake.calls_to("POST", rf"/channels/{C}/messages")
    assert (limited.status, ok.status) == (429, 200)
    assert limited.response == {
        "message": "You are being rate limited.",
        "retry_after": 0.3,
        "global": False,
    }
    assert ok.at - limited.at >= 0.29
    assert [m["content"] for m in fake.channel_messages(C)] == ["after the limit"]
    assert message.id == int(fake.channel_messages(C)[0]["id"])


async def test_500_is_retried(fake: FakeDiscord, bot: KestrelBot) -> None:
    channel = bot.get_channel(int(C))
    assert isinstance(channel, discord.TextChannel)
    fake.fail("POST", rf"/channels/{C}/messages", status=500)
    await channel.send("eventually")  # discord.py sleeps 1 s, then retries
    statuses = [c.status for c in fake.calls_to("POST", rf"/channels/{C}/messages")]
    assert statuses == [500, 200]


async def test_rest_answers_are_discord_shaped(fake: FakeDiscord) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{fake.api_url}/nope/123") as response:
            assert response.status == 404
            assert response.headers["Content-Type"] == "application/json"
            assert response.headers["Via"] == "1.1 google"
            assert await response.json() == {"message": "404: Not Found", "code": 0}
        fake.fail("GET", r"/users/@me", status=429, retry_after=1.5, global_=True)
        async with session.get(f"{fake.api_url}/users/@me") as response:
            assert response.status == 429
            assert response.headers["Retry-After"] == "2"
            assert response.headers["X-RateLimit-Remaining"] == "0"
            assert response.headers["X-RateLimit-Reset-After"] == "1.500"
            assert response.headers["X-RateLimit-Scope"] == "global"
            assert response.headers["X-RateLimit-Global"] == "true"
            assert response.headers["X-RateLimit-Bucket"]
            assert (await response.json())["global"] is True
        members_url = f"{fake.api_url}/guilds/{G}/members"
        fake.members[(G, "1000")] = {"roles": [p.ROLE_ID]}
        async with session.get(f"{members_url}/1000") as response:
            member = await response.json()
        assert member["roles"] == [p.ROLE_ID] and member["user"]["id"] == "1000"
        assert member["flags"] == 0
        async with session.get(f"{members_url}/4242") as response:
            assert response.status == 404 and (await response.json())["code"] == 10007
        async with session.get(f"{fake.api_url}/guilds/{G}/roles") as response:
            roles = {r["id"]: r["name"] for r in await response.json()}
        assert roles == {G: "@everyone", p.ROLE_ID: "sre"}
    assert [c.route for c in fake.calls] == [
        "unknown",
        "me",
        "get_member",
        "get_member",
        "get_roles",
    ]


async def test_wait_for_is_bounded_and_counts(fake: FakeDiscord) -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0\.05s"):
        await fake.wait_for(r"POST /channels/\d+/messages", timeout=0.05)
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.get(f"{fake.api_url}/users/@me") as response:
                assert response.status == 200

    def is_me(call: Call) -> bool:
        return call.route == "me"

    assert len(await fake.wait_for(is_me, count=2)) == 2
    assert len(await fake.wait_for("GET /users/@me", count=2, answered=True)) == 2
    assert fake.calls_to("*") == fake.calls


# ----------------------------------------------------------------------------- interactions


async def test_button_click_reaches_dynamic_item(fake: FakeDiscord, bot: KestrelBot) -> None:
    click = p.interaction_button(custom_id="kestrel:approve:req_1", user_id="1000")
    await fake.dispatch("INTERACTION_CREATE", click)

    (followup,) = await fake.wait_for(r"POST /webhooks/\d+/[^/]+", answered=True)
    (callback,) = fake.calls_to("POST", r"/interactions/\d+/[^/]+/callback")
    assert callback.path == f"/interactions/{click['id']}/{click['token']}/callback"
    assert callback.query == {"with_response": "1"}
    # defer(ephemeral=True) on a component = DEFERRED_UPDATE_MESSAGE, and the flag is dropped
    assert callback.json == {"type": 6}
    assert callback.status == 200 and callback.response["interaction"]["id"] == click["id"]
    assert followup.path == f"/webhooks/{APP}/{click['token']}"
    assert followup.query["wait"] == "1"
    assert followup.json["content"] == "ok" and followup.json["flags"] == 64
    assert "authorization" not in followup.headers
    assert bot.seen == [("approve", "req_1", 1000)]
    assert [m["content"] for m in fake.ephemeral] == ["ok"]
    assert fake.channel_messages(C) == []


async def test_thinking_defer_and_edit_original(fake: FakeDiscord, bot: KestrelBot) -> None:
    click = p.interaction_button(custom_id="kestrel:think:req_9")
    await fake.dispatch("INTERACTION_CREATE", click)
    await bot.wait(lambda: bot.seen)
    callback = fake.calls_to("POST", r"/interactions/.*")[0]
    assert callback.json == {"type": 5, "data": {"flags": 64}}
    assert callback.response["interaction"]["response_message_loading"] is True
    (edit,) = fake.calls_to("PATCH", rf"/webhooks/{APP}/[^/]+/messages/@original")
    assert edit.json["content"] == "done req_9"
    assert fake.calls_to("GET", rf"/webhooks/{APP}/[^/]+/messages/@original")
    assert bot.seen == [("think", "done req_9", True)]
    original = fake.interactions[click["id"]]["original"]
    assert original["content"] == "done req_9" and original["flags"] == 64  # loading cleared


@pytest.mark.parametrize("layout", ["action_row", "label"])
async def test_modal_round_trip(fake: FakeDiscord, bot: KestrelBot, layout: str) -> None:
    await fake.dispatch("INTERACTION_CREATE", p.interaction_button(custom_id="kestrel:reason:r2"))
    await fake.wait_until(lambda: fake.modals, describe="the modal")
    modal = fake.modals[0]
    assert modal["custom_id"] == "kestrel:reason_modal:r2" and modal["title"] == "Why?"
    text_input = modal["components"][0]["components"][0]
    assert text_input["type"] == 4 and text_input["custom_id"] == "reason"

    submit = p.interaction_modal_submit(
        custom_id=modal["custom_id"], components={"reason": "disk full"}, layout=layout
    )
    await fake.dispatch("INTERACTION_CREATE", submit)
    await bot.wait(lambda: bot.seen)
    assert bot.seen == [("reason", "r2", "disk full")]
    callback = await fake.wait_for(
        lambda c: c.path.startswith(f"/interactions/{submit['id']}/"), answered=True
    )
    assert callback[0].json == {"type": 4, "data": {"tts": False, "content": "thanks", "flags": 64}}
    assert fake.ephemeral[-1]["content"] == "thanks"


async def test_slash_command_sync_and_call(fake: FakeDiscord, bot: KestrelBot) -> None:
    guild = discord.Object(id=int(G))
    bot.tree.copy_global_to(guild=guild)
    synced = await bot.tree.sync(guild=guild)
    assert [c.name for c in synced] == ["kestrel"]
    (put,) = fake.calls_to("PUT", rf"/applications/{APP}/guilds/{G}/commands")
    assert put.json[0]["options"][0]["name"] == "status"
    command = fake.commands[G][0]
    assert command["id"] == str(synced[0].id) and command["guild_id"] == G

    call = p.interaction_command(
        command_id=command["id"],
        command_guild_id=G,
        options=[
            {
                "name": "status",
                "type": 1,
                "options": [{"name": "service", "type": 3, "value": "api"}],
            }
        ],
    )
    await fake.dispatch("INTERACTION_CREATE", call)
    (callback,) = await fake.wait_for(r"POST /interactions/\d+/[^/]+/callback", answered=True)
    assert callback.json["type"] == 4
    assert callback.json["data"]["content"] == "status of api: green"
    assert bot.seen == [("status", "api")]
    (response,) = fake.channel_messages(C)
    assert response["type"] == 20 and response["interaction_metadata"]["id"] == call["id"]


async def test_interaction_errors_match_discord(fake: FakeDiscord, bot: KestrelBot) -> None:
    unknown = p.interaction_button(custom_id="kestrel:approve:zz")
    async with aiohttp.ClientSession() as session:
        url = f"{fake.api_url}/interactions/{unknown['id']}/{unknown['token']}/callback"
        async with session.post(url, json={"type": 6}) as response:
            assert response.status == 404 and (await response.json())["code"] == 10062
        await fake.dispatch("INTERACTION_CREATE", unknown)
        await fake.wait_for(lambda c: c.path.startswith(f"/webhooks/{APP}/"), answered=True)
        async with session.post(url, json={"type": 6}) as response:
            assert response.status == 400 and (await response.json())["code"] == 40060
        fresh = p.interaction_command()
        # never dispatched, so unknown to the fake: Discord's "Unknown Webhook"
        async with session.post(
            f"{fake.api_url}/webhooks/{APP}/{fresh['token']}", json={"content": "x"}
        ) as response:
            assert response.status == 404 and (await response.json())["code"] == 10015


async def test_enforced_message_content_blanks_unmentioned_messages(
    fake: FakeDiscord, bot: KestrelBot
) -> None:
    fake.enforce_message_content = True
    await fake.dispatch("MESSAGE_CREATE", p.message_create(content="secret", mentions=[]))
    await fake.dispatch("MESSAGE_CREATE", p.message_create(content=f"<@{BOT}> hi"))
    await bot.wait(lambda: len([s for s in bot.seen if s[0] == "message"]) == 2)
    assert [s[2] for s in bot.seen if s[0] == "message"] == ["", f"<@{BOT}> hi"]
    await fake.wait_for(r"POST /channels/\d+/messages", answered=True)  # the mention's card


async def test_payload_builders_parse_in_discord_py(fake: FakeDiscord, bot: KestrelBot) -> None:
    state = bot._connection
    guild = bot.get_guild(int(G))
    assert guild is not None
    thread = discord.Thread(guild=guild, state=state, data=p.thread_channel(name="t"))  # type: ignore[arg-type]
    assert thread.message_count == 0 and not thread.archived
    data = p.interaction_select(custom_id="pick", values=["b"])
    interaction = discord.Interaction(data=data, state=state)  # type: ignore[arg-type]
    assert interaction.data is not None and interaction.data.get("values") == ["b"]
    assert isinstance(interaction.user, discord.Member)
    assert interaction.message is not None and interaction.message.components
    dm = p.message_create(guild=None, content="psst", mentions=[])
    assert "member" not in dm and "guild_id" not in dm
    started = time.monotonic()
    ids = [int(p.snowflake()) for _ in range(100)]
    assert ids == sorted(set(ids))
    assert abs(discord.utils.snowflake_time(ids[0]).timestamp() - time.time()) < 5
    assert time.monotonic() - started < 1


async def test_files_replies_dms_and_custom_handlers(fake: FakeDiscord, bot: KestrelBot) -> None:
    channel = bot.get_channel(int(C))
    assert isinstance(channel, discord.TextChannel)
    upload = await channel.send("report", file=discord.File(io.BytesIO(b"abc"), "report.txt"))
    (post,) = fake.calls_to("POST", rf"/channels/{C}/messages")
    assert post.json["content"] == "report"
    assert [(f["filename"], f["size"], f["data"]) for f in post.files] == [
        ("report.txt", 3, b"abc")
    ]
    assert upload.attachments[0].filename == "report.txt"

    reply = await upload.reply("<@1000> see above")
    stored = fake.message(C, str(reply.id))
    assert stored is not None and stored["type"] == 19
    assert stored["message_reference"]["message_id"] == str(upload.id)
    assert [m["id"] for m in stored["mentions"]] == ["1000"]

    fake.set_handler("GET", r"/users/\d+", lambda call: (200, p.user("77", username="pat")))
    person = await bot.fetch_user(77)
    assert person.name == "pat"
    dm = await person.create_dm()
    await dm.send("hello pat")
    assert fake.channels[str(dm.id)]["type"] == 1
    assert fake.channel_messages(str(dm.id))[0]["content"] == "hello pat"


async def test_followup_429_is_retried(fake: FakeDiscord, bot: KestrelBot) -> None:
    fake.fail("POST", r"/webhooks/\d+/[^/]+", status=429, retry_after=0.2)
    click = p.interaction_button(custom_id="kestrel:approve:req_5")
    await fake.dispatch("INTERACTION_CREATE", click)
    calls = await fake.wait_for(r"POST /webhooks/\d+/[^/]+", count=2, answered=True)
    assert [c.status for c in calls] == [429, 200]
    assert [m["content"] for m in fake.ephemeral] == ["ok"]
