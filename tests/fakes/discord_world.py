"""A whole Kestrel in Discord for tests: the real runtime built from a kestrel.yaml (the same
as the Slack world's), the real discord.py client logged in and connected to a local stand-in
for Discord's REST API and gateway, and the real ``openai`` client against a fake model."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import discord
import yarl
from discord.gateway import DiscordWebSocket

from adapters.discord.app import DiscordAdapter
from adapters.discord.settings import DiscordSettings
from bot.chat.links import RunLink
from bot.chat.service import ChatService
from bot.cli import compose
from bot.config.settings import load_settings
from bot.run.runtime import Runtime
from bot.run.supervisor import Supervisor
from tests.fakes import discord_payloads as p
from tests.fakes.clock import MovingClock
from tests.fakes.discord_api import Call, FakeDiscord
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_world import NOTHING, write_config
from tests.fakes.waiting import until

REQUESTER = "1001"
APPROVER = "1002"
ONCALL = "1003"
SRE_ROLE = p.ROLE_ID  # approvers by role: group:300


@dataclass
class DiscordWorld:
    """One Kestrel replica in Discord, and the fakes around it."""

    discord: FakeDiscord
    model: FakeOpenAI
    chat: ChatService
    supervisor: Supervisor
    rt: Runtime
    adapter: DiscordAdapter
    tmp: Path
    # The runtime's and the store's clock: moved past a backoff instead of sleeping through it.
    clock: MovingClock
    # How many times the client's on_message has finished with each message id (ignored too).
    handled: Counter[int]

    @property
    def executions(self) -> list[str]:
        """Each time the consequential command ran, its argument."""
        path = self.tmp / "executions.txt"
        return path.read_text().splitlines() if path.exists() else []

    async def mention(
        self, text: str, *, user: str = REQUESTER, channel: str = p.CHANNEL_ID, **kw: Any
    ) -> dict[str, Any]:
        """Post ``@kestrel text`` as ``user`` in a channel (or a thread); the message sent."""
        data = p.message_create(
            channel=channel, author_id=user, content=f"<@{p.BOT_ID}> {text}", **kw
        )
        await self.discord.dispatch("MESSAGE_CREATE", data)
        return data

    async def reply(self, text: str, *, user: str, thread: str) -> dict[str, Any]:
        """Post a plain message in a thread."""
        data = p.message_create(channel=thread, author_id=user, content=text, mentions=[])
        await self.discord.dispatch("MESSAGE_CREATE", data)
        return data

    async def thread_of(self, message: Mapping[str, Any]) -> str:
        """The thread Kestrel started from ``message``."""
        path = f"/channels/{message['channel_id']}/messages/{message['id']}/threads"
        await self.discord.wait_for(lambda c: c.method == "POST" and c.path == path)
        return str(message["id"])  # a thread started from a message takes its id

    async def card(self, kind: str = "approve", timeout: float = 10.0) -> dict[str, Any]:
        """The first message Kestrel posted (and Discord took) with a ``kestrel:KIND:`` button."""

        def has(call: Call) -> bool:
            return (
                call.method == "POST"
                and call.path.endswith("/messages")
                and f'"kestrel:{kind}:' in json.dumps(call.json or {})
                and call.status == 200
            )

        calls = await self.discord.wait_for(has, timeout=timeout)
        return dict(calls[0].response or {})

    async def click(
        self,
        card: Mapping[str, Any],
        kind: str,
        *,
        user: str,
        roles: Sequence[str] = (),
        guild: str = p.GUILD_ID,
    ) -> dict[str, Any]:
        """Click the card's ``kestrel:KIND:`` button as ``user``; the interaction sent."""
        custom_id = button_id(card, kind)
        data = p.interaction_button(
            guild=guild,
            channel=str(card["channel_id"]),
            user_id=user,
            custom_id=custom_id,
            message=card,
            roles=list(roles),
        )
        await self.discord.dispatch("INTERACTION_CREATE", data)
        return data

    async def fill_form(
        self, card: Mapping[str, Any], kind: str, text: str, *, user: str, channel: str
    ) -> dict[str, Any]:
        """Click the card's ``kind`` button (Deny, Answer) as ``user``, then submit the form it
        opens with ``text`` in its one field, from ``channel``; the submission sent."""
        await self.click(card, kind, user=user)
        await self.discord.wait_for(
            lambda c: "callback" in c.path and (c.json or {}).get("type") == 9
        )
        modal = self.discord.modals[-1]
        submit = p.interaction_modal_submit(
            custom_id=modal["custom_id"],
            message=card,  # a form opened from a card carries it
            components={modal["components"][0]["components"][0]["custom_id"]: text},
            guild=p.GUILD_ID,
            channel=channel,
            user_id=user,
        )
        await self.discord.dispatch("INTERACTION_CREATE", submit)
        return submit

    async def answered(self, interaction: Mapping[str, Any], timeout: float = 10.0) -> str:
        """What the clicker alone was told (the follow-up or the message response)."""
        token = str(interaction["token"])

        def told(call: Call) -> bool:
            ours = token in call.path and call.method in ("POST", "PATCH")
            return ours and "content" in (call.json or {}) and "callback" not in call.path

        calls = await self.discord.wait_for(told, timeout=timeout)
        return str((calls[-1].json or {}).get("content", ""))

    async def answer_posted(self, thread: str, text: str, timeout: float = 10.0) -> Call:
        """The post in ``thread`` whose content holds ``text``."""

        def posted(call: Call) -> bool:
            return (
                call.method == "POST"
                and call.path == f"/channels/{thread}/messages"
                and text in str((call.json or {}).get("content", ""))
            )

        return (await self.discord.wait_for(posted, timeout=timeout))[0]

    async def later(self, seconds: float) -> None:
        """Move the clock ``seconds`` on, then let what fell due be delivered."""
        self.clock.advance(seconds)
        await self.settled()

    async def quiet(self, message: Mapping[str, Any], times: int = 1) -> None:
        """Wait until the client is done with ``message`` (``times`` deliveries of it), then
        settle: what an ignored message would have done is done by then."""
        await until(lambda: self.handled[int(message["id"])] >= times, timeout=10)
        await self.settled()

    async def settled(self) -> None:
        """Let the renderer and the outbox finish what was started."""
        await self.adapter.client.renderer.idle()
        await self.adapter.client.deliveries.idle()  # a round under way shows what it claimed
        await self.adapter.client.deliveries.deliver_due()


def _count_messages(adapter: DiscordAdapter) -> Counter[int]:
    """Count each message the client's ``on_message`` is done with: discord.py looks the
    handler up on the client for each event, so this wraps the real one, not a stand-in."""
    client = adapter.client
    inner = client.on_message
    handled: Counter[int] = Counter()

    async def on_message(message: discord.Message, **options: Any) -> None:
        try:
            await inner(message, **options)
        finally:
            handled[message.id] += 1

    client.on_message = on_message  # type: ignore[method-assign]
    return handled


def button_id(card: Mapping[str, Any], kind: str) -> str:
    """The custom id of the card's ``kestrel:KIND:`` component."""
    for row in card.get("components") or []:
        for component in row.get("components") or []:
            if str(component.get("custom_id", "")).startswith(f"kestrel:{kind}:"):
                return str(component["custom_id"])
    raise AssertionError(f"no kestrel:{kind}: button on the card")


@asynccontextmanager
async def discord_world(
    tmp: Path,
    script: Sequence[Any],
    *,
    fake: FakeDiscord | None = None,
    extra_policy: Mapping[str, Any] = NOTHING,
    link: RunLink | None = None,
    database: str = "",
) -> AsyncIterator[DiscordWorld]:
    """Start everything; stop it all on exit (a given ``fake`` outlives the replica).
    ``link``: the run pages' links its messages carry (none by default); ``database``: its
    store (a SQLite file in ``tmp`` by default)."""
    policy = {"approvers": {"*": [APPROVER, f"group:{SRE_ROLE}"]}, "oncall": [ONCALL]}
    policy.update(extra_policy)
    async with FakeOpenAI(list(script)) as model:
        own = fake is None
        discord_fake = fake or FakeDiscord()
        if own:
            await discord_fake.start()
        saved = discord.http.Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
        try:
            config = write_config(tmp, model.base_url, extra_policy=policy, database=database)
            clock = MovingClock()
            async with compose.runtime(load_settings(str(config)), clock=clock) as rt:
                supervisor = Supervisor(rt)
                chat = ChatService(supervisor)
                settings = DiscordSettings(token="test-token", api_url=discord_fake.api_url)
                adapter = DiscordAdapter(
                    chat, rt.store, rt.owner, settings, guild_ready_timeout=0.1, link=link
                )
                await adapter.start()
                handled = _count_messages(adapter)
                try:
                    yield DiscordWorld(
                        discord_fake, model, chat, supervisor, rt, adapter, tmp, clock, handled
                    )
                finally:
                    await supervisor.shutdown()
                    await adapter.stop()
        finally:
            discord.http.Route.BASE = saved[0]
            DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(str(saved[1]))
            if own:
                await discord_fake.stop()
