"""Latency of the Discord adapter: clicks and mentions, from the gateway event to the REST call.

One Kestrel replica in-process, built as ``kestrel serve discord`` builds it (a kestrel.yaml,
SQLite, the real ``openai`` client against a local fake model answering at once, the real
discord.py client logged in and connected to a local stand-in for Discord's REST API and
gateway, ``tests.fakes.discord_world``). The stand-in stamps each REST call on arrival.
Each scenario is measured from just before ``FakeDiscord.dispatch`` sends the event, so the
event's trip through the fake's gateway (JSON, zlib, the websocket) into discord.py and its
parsing are counted too:

* refused clicks: a user who may not approve clicks Approve on one open card, one at a time,
  to the interaction's callback (a deferred, ephemeral response) and to its follow-up (the
  ephemeral refusal, ``POST /webhooks/…``) reaching the fake;
* approving clicks: one click on each of that many cards of runs waiting for an approval,
  to the callback, to the follow-up ("Recorded.") and to the card's edit
  (``PATCH /channels/{thread}/messages/{card}``); the next once that run has answered;
* mentions, one at a time: ``MESSAGE_CREATE`` to the thread's creation
  (``POST /channels/{c}/messages/{m}/threads``), to the typing indicator and to the thread's
  first message (here the answer, "All good.").

Targets: the interaction callback's p99 under 50 ms (Discord allows 3 s before the click
fails); the thread's creation, the first visible feedback, p50 under 100 ms (the Slack
adapter's first-feedback target). The fakes and the sender share the replica's event loop
(and its garbage collector), so their work is counted too: a max far above its p99 is a
full (generation 2) collection, 40-100 ms on a small machine.

    python -m bench.discord [--clicks N] [--approvals N] [--mentions N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

from bench.latency import SCRIPT, TIMEOUT_S, Figures, Tail, print_table
from bot.collector import settle_for_service
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import Call
from tests.fakes.discord_world import APPROVER, REQUESTER, DiscordWorld, button_id, discord_world

CLICKS: Final = 500
APPROVALS: Final = 100  # p99 of 100 is the second-slowest; of 50 it would be the slowest
MENTIONS: Final = 100
WARMUP: Final = 5  # refused clicks and mentions sent first, not counted
CALLBACK_TARGET_MS: Final = 50.0
FEEDBACK_TARGET_MS: Final = 100.0
DISCORD_CALLBACK_S: Final = 3.0

STRANGER: Final = "1999"  # in the guild, named nowhere in the policy


@asynccontextmanager
async def replica(folder: Path) -> AsyncIterator[DiscordWorld]:
    """The fakes and one replica connected to the fake gateway, as the tests build it."""
    async with discord_world(folder, SCRIPT) as world:
        settle_for_service()  # as ``kestrel serve`` does once started
        yield world


# --------------------------------------------------------------------------- the fake's calls


def content(call: Call) -> str:
    """The text a call posts."""
    return str((call.json or {}).get("content", ""))


def callback_of(interaction: dict[str, Any]) -> Callable[[Call], bool]:
    """Matches the interaction's callback (its first response)."""
    path = f"/interactions/{interaction['id']}/{interaction['token']}/callback"
    return lambda call: call.method == "POST" and call.path == path


def followup_of(interaction: dict[str, Any]) -> Callable[[Call], bool]:
    """Matches a follow-up message of the interaction (``POST /webhooks/{app}/{token}``)."""
    path = f"/webhooks/{interaction['application_id']}/{interaction['token']}"
    return lambda call: call.method == "POST" and call.path == path


def edit_of(channel: str, message: str) -> Callable[[Call], bool]:
    """Matches an edit of the message ``message`` in ``channel``."""
    path = f"/channels/{channel}/messages/{message}"
    return lambda call: call.method == "PATCH" and call.path == path


def post_in(channel: str) -> Callable[[Call], bool]:
    """Matches a message posted in ``channel`` (a thread)."""
    path = f"/channels/{channel}/messages"
    return lambda call: call.method == "POST" and call.path == path


def answer_in(channel: str, text: str) -> Callable[[Call], bool]:
    """Matches a message posted in ``channel`` whose text holds ``text``."""
    posted = post_in(channel)
    return lambda call: posted(call) and text in content(call)


def typing_in(channel: str) -> Callable[[Call], bool]:
    """Matches the typing indicator in ``channel``."""
    path = f"/channels/{channel}/typing"
    return lambda call: call.method == "POST" and call.path == path


def thread_from(message: dict[str, Any]) -> Callable[[Call], bool]:
    """Matches the creation of a thread from ``message``."""
    path = f"/channels/{message['channel_id']}/messages/{message['id']}/threads"
    return lambda call: call.method == "POST" and call.path == path


def is_card(call: Call) -> bool:
    """A card with an Approve button that Discord took."""
    return (
        call.method == "POST"
        and call.path.endswith("/messages")
        and call.status == 200
        and '"kestrel:approve:' in json.dumps(call.json or {})
    )


# --------------------------------------------------------------------------- events


async def mention(world: DiscordWorld, text: str) -> tuple[dict[str, Any], float]:
    """``@kestrel text`` in the channel, from the requester: (the message, when it was sent)."""
    data = p.message_create(
        channel=p.CHANNEL_ID, author_id=REQUESTER, content=f"<@{p.BOT_ID}> {text}"
    )
    started = time.monotonic()
    await world.discord.dispatch("MESSAGE_CREATE", data)
    return data, started


async def click(
    world: DiscordWorld, card: dict[str, Any], user: str
) -> tuple[dict[str, Any], float]:
    """A click on the card's Approve once button: (the interaction, when it was sent)."""
    data = p.interaction_button(
        guild=p.GUILD_ID,
        channel=str(card["channel_id"]),
        user_id=user,
        custom_id=button_id(card, "approve"),
        message=card,
    )
    started = time.monotonic()
    await world.discord.dispatch("INTERACTION_CREATE", data)
    return data, started


# --------------------------------------------------------------------------- scenarios


async def open_cards(world: DiscordWorld, count: int) -> list[dict[str, Any]]:
    """``count`` runs each waiting for an approval, and their cards (as Discord stored them)."""
    start = len(world.discord.calls)
    threads = [
        str((await mention(world, f"restart checkout ({i})"))[0]["id"]) for i in range(count)
    ]
    posts: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + TIMEOUT_S
    while len(posts) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(posts)} of {count} approval cards posted")
        await asyncio.sleep(0.01)
        cards = (dict(c.response) for c in world.discord.calls[start:] if is_card(c))
        posts = {str(card["channel_id"]): card for card in cards}
    await world.settled()
    return [posts[thread] for thread in threads]


async def refused_clicks(
    world: DiscordWorld, card: dict[str, Any], count: int, figures: Figures
) -> None:
    """A user who may not approve clicks Approve, one click at a time."""
    for i in range(WARMUP + count):
        tail = Tail(lambda: world.discord.calls, "Discord")
        interaction, started = await click(world, card, STRANGER)
        callback = await tail.first(callback_of(interaction), "interaction callback")
        note = await tail.first(followup_of(interaction), "ephemeral follow-up")
        if "may not approve" not in content(note):
            raise RuntimeError(f"unexpected reply to a refused click: {content(note)}")
        if i >= WARMUP:
            figures.add("refused.callback", callback.at - started)
            figures.add("refused.followup", note.at - started)


async def approving_clicks(
    world: DiscordWorld, cards: Sequence[dict[str, Any]], figures: Figures
) -> None:
    """One approving click on each card; the next once that run has answered."""
    for card in cards:
        thread, message = str(card["channel_id"]), str(card["id"])
        tail = Tail(lambda: world.discord.calls, "Discord")
        interaction, started = await click(world, card, APPROVER)
        callback = await tail.first(callback_of(interaction), "interaction callback")
        note = await tail.first(followup_of(interaction), "follow-up")
        if "Recorded" not in content(note):
            raise RuntimeError(f"unexpected reply to an approving click: {content(note)}")
        edit = await tail.first(edit_of(thread, message), "card edit")
        figures.add("approve.callback", callback.at - started)
        figures.add("approve.followup", note.at - started)
        figures.add("approve.edit", edit.at - started)
        await tail.first(answer_in(thread, "Restarted"), "answer")


async def mentions(world: DiscordWorld, count: int, figures: Figures) -> None:
    """Mentions one at a time, each starting its own thread, each answered before the next."""
    for i in range(WARMUP + count):
        tail = Tail(lambda: world.discord.calls, "Discord")
        message, started = await mention(world, f"how is checkout? ({i})")
        thread = str(message["id"])  # a thread started from a message takes its id
        created = await tail.first(thread_from(message), "thread creation")
        typing = await tail.first(typing_in(thread), "typing indicator")
        first = await tail.first(post_in(thread), "first message in the thread")
        if "All good." not in content(first):
            raise RuntimeError(f"unexpected first message in the thread: {content(first)}")
        if i >= WARMUP:
            figures.add("mention.thread", created.at - started)
            figures.add("mention.typing", typing.at - started)
            figures.add("mention.first", first.at - started)


async def run_all(clicks: int, approvals: int, count: int) -> Figures:
    """Every scenario on one replica, one after another."""
    figures = Figures()
    with tempfile.TemporaryDirectory(prefix="kestrel-bench-discord-") as tmp:
        async with replica(Path(tmp)) as world:
            cards = await open_cards(world, approvals + 1)
            await refused_clicks(world, cards[-1], clicks, figures)
            await approving_clicks(world, cards[:-1], figures)
            await mentions(world, count, figures)
    return figures


def measure(clicks: int = CLICKS, approvals: int = APPROVALS, count: int = MENTIONS) -> Figures:
    """Run the scenarios with Kestrel's and discord.py's loggers quieted (expected refusals
    log warnings)."""
    for name in ("kestrel", "discord"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return asyncio.run(run_all(clicks, approvals, count))


# --------------------------------------------------------------------------- report


ROWS: Final = (
    ("refused.callback", "refused click -> interaction callback", CALLBACK_TARGET_MS, 99),
    ("refused.followup", "  -> ephemeral follow-up reaches the fake", None, 0),
    ("approve.callback", "approving click -> interaction callback", CALLBACK_TARGET_MS, 99),
    ("approve.followup", "  -> follow-up (Recorded.) reaches the fake", None, 0),
    ("approve.edit", "  -> card's edit (PATCH) reaches the fake", None, 0),
    ("mention.thread", "MESSAGE_CREATE mention -> thread created", FEEDBACK_TARGET_MS, 50),
    ("mention.typing", "  -> typing indicator in the thread", None, 0),
    ("mention.first", "  -> thread's first message (the answer)", None, 0),
)


def report(clicks: int = CLICKS, approvals: int = APPROVALS, count: int = MENTIONS) -> None:
    """Print the adapter's latencies (p50, p99, max)."""
    figures = measure(clicks, approvals, count)
    print(
        "Discord adapter over the gateway: one replica on SQLite, instant fake model, fakes"
        " in-process (python -m bench.discord)"
    )
    print(
        f"  one event at a time ({WARMUP} uncounted refused clicks and mentions first), timed from"
        " just before the fake sends it on its gateway (the websocket trip is counted)"
    )
    print(
        f"  targets: callback p99 < {CALLBACK_TARGET_MS:.0f} ms (Discord allows"
        f" {DISCORD_CALLBACK_S:.0f} s), thread created p50 < {FEEDBACK_TARGET_MS:.0f} ms"
    )
    print_table(figures, ROWS, 46)
    slowest = max(figures.samples["refused.callback"] + figures.samples["approve.callback"])
    within = "within" if slowest <= DISCORD_CALLBACK_S * 1000 else "NOT within"
    print(f"  every interaction answered {within} Discord's {DISCORD_CALLBACK_S:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description="Latency of the Discord adapter.")
    parser.add_argument("--clicks", type=int, default=CLICKS)
    parser.add_argument("--approvals", type=int, default=APPROVALS)
    parser.add_argument("--mentions", type=int, default=MENTIONS)
    options = parser.parse_args()
    report(options.clicks, options.approvals, options.mentions)


if __name__ == "__main__":
    main()
