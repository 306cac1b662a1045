"""Kestrel's Discord client: mentions, thread replies, clicks and forms.

Every interaction is answered within Discord's 3 s: a decision defers first; Deny and Answer
open their form at once (``buttons``). What a message or a click means is the core's
``Conversation``; who may is decided there, from the store and the policy, with the person
acting from where they clicked (``directory``). A mention, or a thread reply that answers a
question, is held in the store (``Inbound``) before it is handled, so a process that dies while
handling it leaves it to the next to take up.

A replica that is stopping (``drain``) takes no new event: every other connected session got
it too, and one of those handles it. A message is still held in the store if, a moment later,
no other replica has (the work taker of a live replica, or of this one's successor, takes it up
once a lease old); an interaction is left alone (the person sees it failed and clicks again).
What it was handling when it began to stop is finished before the connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any, Literal

import discord
from discord import app_commands

from adapters.discord import ids
from adapters.discord.buttons import (
    FORM,
    AnswerButton,
    AnswerModal,
    ApproveButton,
    ApproveRunButton,
    ArgumentsButton,
    ChooseButton,
    DenyButton,
    EffectButton,
    ReasonModal,
    StepByStepButton,
    form_text,
)
from adapters.discord.catch_up import CatchUp, delivery_key, member_now, said_by_a_person
from adapters.discord.commands import kestrel_commands
from adapters.discord.directory import (
    LOOKUP_FAILED,
    LOOKUP_SECONDS,
    UNANSWERED,
    actor_of,
    interaction_actor,
    not_looked_up,
    seeing_private,
)
from adapters.discord.look import DiscordLook, arguments_messages, note_text, status_text
from adapters.discord.progress import DiscordProgress
from adapters.discord.respond import deferred, in_time, say_store_failed
from adapters.discord.target import DiscordTarget
from adapters.discord.transport import DiscordTransport
from bot.chat.contract import Actor, Outbox, StoreError
from bot.chat.conversation import (
    HELP,
    THREAD_COMMANDS,
    Conversation,
    Outcome,
    asks_help,
    command_word,
    store_note,
)
from bot.chat.inbound import Accepted, Delivery, TryLater
from bot.chat.lifecycle import PlatformLife
from bot.chat.links import RunLink
from bot.chat.outbox import DeliveryFailed
from bot.chat.service import ChatService
from bot.chat.words import NOT_RECORDED
from bot.domain import DecisionKind, Request, Session
from bot.user_agent import USER_AGENT

log = logging.getLogger("kestrel.discord")

NO_PINGS = discord.AllowedMentions.none()
THREAD_ARCHIVE_MINUTES: Literal[1440] = 1440
# A stopping replica holds a message only if no live replica did within this long.
STOPPING_HOLD_SECONDS = 1.0
# A message's channel as it may be a thread: one, or one Discord has not said what it is.
Thread = discord.Thread | discord.PartialMessageable
MAYBE_A_THREAD = (discord.Thread, discord.PartialMessageable)


def intents(message_content: bool) -> discord.Intents:
    """The least Kestrel needs: guilds and their messages; message content only to read plain
    thread replies (mentions and interactions carry their content without it)."""
    wanted = discord.Intents.none()
    wanted.guilds = True
    wanted.guild_messages = True
    wanted.message_content = message_content
    return wanted


# The longest rate limit a request sleeps out in place (discord.py's floor: 30 s).
RATE_LIMIT_WAIT_SECONDS = 30.0


class KestrelDiscord(discord.Client):
    """The client: one per process, serving every guild it is in."""

    def __init__(
        self,
        chat: ChatService,
        outbox: Outbox,
        owner: str,
        *,
        message_content: bool = True,
        guild_ready_timeout: float = 2.0,
        link: RunLink | None = None,
        pings: bool = True,
        claim_seconds: float = 60.0,
        catch_up: timedelta = timedelta(0),
    ) -> None:
        super().__init__(
            intents=intents(message_content),
            allowed_mentions=NO_PINGS,
            guild_ready_timeout=guild_ready_timeout,
            # A longer 429 raises instead of sleeping inside the request: the outbox puts that
            # one message off, and no other thread waits behind it.
            max_ratelimit_timeout=RATE_LIMIT_WAIT_SECONDS,
        )
        # Discord requires its "DiscordBot (url, version)" first; more may follow.
        self.http.user_agent = f"{self.http.user_agent} {USER_AGENT}"
        self.chat = chat
        self.talk = Conversation(chat)
        http = self.http
        self.life = PlatformLife(
            chat,
            outbox,
            DiscordTransport(http, self.seeing, outbox.held_refs),
            owner,
            DiscordLook(link, pings=pings),
            lambda deliveries: DiscordProgress(http, deliveries),
            name="discord",
            claim_seconds=claim_seconds,
        )
        self.deliveries = self.life.deliveries
        self.progress = self.life.progress
        self.renderer = self.life.renderer
        self.tree = app_commands.CommandTree(self)
        self.tree.add_command(kestrel_commands())
        # The messages this process accepted and handles now (others are fetched again).
        self._held: dict[int, tuple[discord.Message, Any]] = {}
        chat.inbound.handle("discord", self.handle_delivery)
        # Every connected replica receives every interaction: only the one that marks it first
        # in the store lets discord.py dispatch it to the buttons, forms and commands.
        parsers = self._connection.parsers
        self._dispatch_interaction: Callable[[dict[str, Any]], None] = parsers["INTERACTION_CREATE"]
        parsers["INTERACTION_CREATE"] = self._interaction_arrived
        self._taking: set[asyncio.Task[None]] = set()
        self.draining = False
        self._handling = 0
        self._idle = asyncio.Event()
        self._idle.set()
        # How far back a fresh gateway session reads for missed mentions, once it may handle
        # them (``serve``), once per session.
        self._catch_up = catch_up
        self._serving = False
        self._read_back_in: str | None = None

    async def seeing(self, guild: str, thread: str, users: list[str]) -> frozenset[str] | None:
        """Which of ``users`` see private thread ``thread`` already (its members, and those who
        manage threads there); None when it is not a private thread (or no longer exists: the
        post says so). Raises ``DeliveryFailed`` when Discord does not tell what the thread is:
        a ping into a private thread adds whoever it notifies, so none is sent blind."""
        if not guild.isdigit() or not thread.isdigit():
            return None
        found = self.get_guild(int(guild))
        if found is None:  # not (yet, or again) in the gateway's cache: a reconnection
            raise DeliveryFailed(f"discord: server {guild} is not known yet")
        where = found.get_channel_or_thread(int(thread))
        if where is None:  # archived threads leave the cache: Discord is asked
            try:
                where = await asyncio.wait_for(found.fetch_channel(int(thread)), LOOKUP_SECONDS)
            except discord.NotFound:
                return None
            except LOOKUP_FAILED as exc:
                raise not_looked_up(thread, exc) from exc
        if not isinstance(where, discord.Thread) or not where.is_private():
            return None
        return await seeing_private(found, where, users)

    def drain(self) -> None:
        """Take no new message or interaction from now on (this replica is stopping)."""
        self.draining = True

    async def handled(self, timeout: float) -> None:
        """Until what this client took (a message, a decision) is handled, or ``timeout``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)

    @contextlib.asynccontextmanager
    async def _busy(self) -> AsyncIterator[None]:
        """Count a handling under way (the connection closes only once none is)."""
        self._handling += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._handling -= 1
            if not self._handling:
                self._idle.set()

    def serve(self) -> None:
        """Rendering and delivering now: handle what this gateway session missed (a run
        started before would show nothing)."""
        self._serving = True
        self._read_back()

    async def on_ready(self) -> None:
        """A fresh gateway session (IDENTIFY; a RESUME dispatches ``resumed``, and Discord
        replays what it missed): nothing said while no session was connected reaches it, so
        read it back."""
        if self._serving:
            self._read_back()

    def _read_back(self) -> None:
        """Read back what this gateway session missed, once (``serve`` and ``on_ready`` both
        ask after the first IDENTIFY)."""
        session = self.ws.session_id if self.ws is not None else None
        if not self._catch_up or self.draining or session in (None, self._read_back_in):
            return
        self._read_back_in = session
        task = asyncio.create_task(self._read_back_now(), name="discord-catch-up")
        self._taking.add(task)
        task.add_done_callback(self._taking.discard)

    async def _read_back_now(self) -> None:
        catch_up = CatchUp(
            self,
            self.chat,
            self._catch_up,
            functools.partial(self.on_message, missed=True),
            lambda: self.draining,
            self.talk.question,
        )
        async with self._busy():
            try:
                handed = await catch_up.run()
            except StoreError as exc:
                log.warning("discord: missed mentions were not read back: %s", exc)
                return
            except Exception:
                log.exception("discord: reading back missed mentions failed")
                return
        log.info("discord: read back after connecting: %d missed message(s) handed on", handed)

    async def setup_hook(self) -> None:
        """Register the buttons' templates (so old cards keep working) and ``/kestrel``."""
        self.add_dynamic_items(
            ApproveButton, ApproveRunButton, StepByStepButton, DenyButton, AnswerButton
        )
        self.add_dynamic_items(ChooseButton, EffectButton, ArgumentsButton)
        try:
            await self.tree.sync()
        except discord.DiscordException as exc:  # refused, or no application id
            log.warning("discord: /kestrel could not be registered: %s", exc)

    # --- messages ---------------------------------------------------------------------

    async def on_message(self, message: discord.Message, *, missed: bool = False) -> None:
        """A mention starts or continues a thread's conversation; a thread reply may answer.
        ``missed``: read back from history after a gap, not just said."""
        if not said_by_a_person(message) or message.guild is None or self.user is None:
            return
        me = self.user.id
        try:
            channel = await self._channel_of(message)
            if any(user.id == me for user in message.mentions):  # @everyone is not a mention
                await self._mentioned(message, channel, missed)
            elif isinstance(channel, MAYBE_A_THREAD):
                await self._replied(message, channel, missed)
        except TryLater as exc:
            log.warning("discord: message %s left to be taken up again: %s", message.id, exc)
        except Exception:
            log.exception("discord: handling message %s failed", message.id)

    async def _channel_of(self, message: discord.Message) -> Any:
        # A thread discord.py has not cached (archived when the bot connected) arrives as a
        # partial channel: ask Discord what it is. Unsaid (a server error, a dropped
        # connection), it stays partial: taken as maybe a thread, and asked again when the
        # message held is handled, not read as a plain channel (no run there).
        channel = message.channel
        if isinstance(channel, discord.PartialMessageable):
            try:
                return await self.fetch_channel(channel.id)
            except LOOKUP_FAILED:
                return channel
        return channel

    async def _mentioned(self, message: discord.Message, channel: Any, missed: bool) -> None:
        # Held with the question its thread waits on now: that is the one it may answer.
        question = None
        if isinstance(channel, MAYBE_A_THREAD):
            question = await self._question(message, channel, missed)
        await self._accept("mention", message, channel, answers=question.id if question else "")

    async def _question(
        self, message: discord.Message, thread: Thread, missed: bool
    ) -> Request | None:
        """The question ``message`` may answer: the one its thread waits on now. Live, that was
        open when it was said; read back after a gap, only one asked before it was said is
        (the store keeps no history of which was open when: a later one is not its question).
        """
        if message.guild is None:  # ``on_message`` takes none: a thread is in a server
            return None
        question = await self.talk.question(_session(message.guild.id, thread))
        if question is not None and missed and question.created_at > message.created_at:
            return None
        return question

    async def _accept(
        self, what: str, message: discord.Message, channel: Any, *, answers: str | None = None
    ) -> None:
        """Hold the message in the store, then handle it here (unless stopping); it holds the
        question it may answer ("" for none), so that handled late or again it answers no
        other."""
        async with self._busy():
            stopping = self.draining
            if stopping:  # the live replicas' sessions got it too: one of them takes it first
                await asyncio.sleep(STOPPING_HOLD_SECONDS)
            delivery = {"what": what, "channel": str(channel.id), "message": str(message.id)}
            if answers is not None:
                delivery["answers"] = answers
            key = delivery_key(message.id)
            accepted = await self.chat.accept_delivery(key, "discord", delivery)
            if accepted is None:
                return
            if stopping:
                log.info("discord: message %s held for another replica's work taker", message.id)
                return
            await self._settle(accepted, message, channel)

    async def _settle(self, accepted: Accepted, message: discord.Message, channel: Any) -> None:
        self._held[message.id] = (message, channel)
        try:
            await self.chat.inbound.settle(accepted)
        finally:
            self._held.pop(message.id, None)

    async def handle_delivery(self, delivery: Delivery) -> None:
        """Handle a message held in the store (by this process, or by one that died); under a
        rate limit longer than the client sleeps out, or when fetching it again met a server
        error or a dropped connection, it is left to be taken up again."""
        try:
            await self._handle_delivery(delivery)
        except discord.RateLimited as exc:
            raise TryLater(f"discord: rate limited for {exc.retry_after:.0f}s") from exc

    async def _handle_delivery(self, delivery: Delivery) -> None:
        held = self._held.get(int(delivery["message"]))
        if held is not None and isinstance(held[1], discord.PartialMessageable):
            held = None  # what its channel is was unsaid when it came: asked again here
        again = held is None
        held = held or await self._taken_up(delivery)
        if held is None:
            return
        message, channel = held
        held_as = Accepted(0, delivery)
        if delivery.get("what") == "reply" and isinstance(channel, discord.Thread):
            await self._answered(message, channel, held_as.answers or "")
        elif delivery.get("what") == "mention":
            await self._on_mention(message, channel, held_as, again)

    async def _taken_up(self, delivery: Delivery) -> tuple[discord.Message, Any] | None:
        """A held message fetched again, its author as a member now; None when it asks nothing
        any more. Raises ``TryLater`` when Discord did not answer (a server error, a dropped
        connection): held still, it is taken up again once its take is a lease old."""
        try:
            message, channel = await self._fetch(delivery)
            return (message, channel) if await self._author_now(message) else None
        except discord.NotFound as exc:
            # Deleted since it was held (by a replica that died before handling it): it asks
            # nothing any more, and there is nothing to reply to.
            log.info(
                "discord: message %s was deleted before it was handled: %s",
                delivery["message"],
                exc.text or exc.code,
            )
            return None
        except discord.RateLimited:
            raise  # said as a wait by ``handle_delivery``
        except UNANSWERED as exc:
            what = f"discord: message {delivery['message']} could not be fetched again"
            raise TryLater(f"{what}: {exc or type(exc).__name__}") from exc
        except discord.HTTPException as exc:
            # Refused (Kestrel lost access to its channel): asking again would be refused too.
            log.warning(
                "discord: message %s could not be fetched again: %s: dropped",
                delivery["message"],
                exc,
            )
            return None

    async def _author_now(self, message: discord.Message) -> bool:
        """Make a message fetched again carry its author as a member of its server now (with
        their roles, which the policy weighs, as a live message's author does); False, said in
        a line, when they are none any more (they left: they ask nothing of its runs)."""
        if message.guild is None or isinstance(message.author, discord.Member):
            return True
        member = await member_now(message.guild, message.author.id)
        if member is None:
            log.info(
                "discord: message %s was held, and its author is no member of the server now:"
                " not acted on",
                message.id,
            )
            return False
        message.author = member
        return True

    async def _fetch(self, delivery: Delivery) -> tuple[discord.Message, Any]:
        channel = await self.fetch_channel(int(delivery["channel"]))
        assert isinstance(channel, discord.abc.Messageable)
        return await channel.fetch_message(int(delivery["message"])), channel

    async def _on_mention(
        self, message: discord.Message, channel: Any, held: Accepted, again: bool
    ) -> None:
        assert self.user is not None and message.guild is not None
        text = re.sub(rf"<@!?{self.user.id}>", "", message.content).strip()
        thread = channel if isinstance(channel, discord.Thread) else None
        if thread is None and again:
            try:
                thread = await self._thread_started_from(message)
            except discord.HTTPException as exc:
                # Refused: a channel with the message's id is there (else "not found"), so a
                # thread would be refused too, and asking again would be refused again.
                log.warning("discord: the thread of message %s: %s: dropped", message.id, exc)
                return
        if thread is None and (asks_help(text) or command_word(text) in THREAD_COMMANDS):
            # No run to act on outside a run's thread: a thread named "status" would be empty.
            await message.reply(note_text(_no_run_here(text)), mention_author=False)
            return
        thread = thread or await self._start_thread(message, text)
        if thread is None:
            return
        session = _session(message.guild.id, thread)
        actor = actor_of(message.author, session.place, message.guild)
        outcome = await self.talk.mention(
            session, actor, text, run_id=held.run_id, answers=held.answers
        )
        if outcome.started:
            self.renderer.expect(outcome.running, session, actor.user)
        await self._show(outcome, thread, message)

    async def _replied(self, message: discord.Message, thread: Thread, missed: bool) -> None:
        assert message.guild is not None
        session = _session(message.guild.id, thread)
        question = await self._question(message, thread, missed)
        if question is None or not message.content:
            return  # not an answer to anything (or no message content intent): ignored
        actor = actor_of(message.author, session.place, message.guild)
        kind, text = DecisionKind.ANSWER, message.content
        refusal = await self.chat.check(question.id, kind, user=actor)  # the person alone
        if not refusal and await self.chat.check(question.id, kind, user=actor, text=text):
            return  # chatter in the thread, not an answer: only a mention gets a reply
        await self._accept("reply", message, thread, answers=question.id)

    async def _answered(
        self, message: discord.Message, thread: discord.Thread, answers: str = ""
    ) -> None:
        assert message.guild is not None
        session = _session(message.guild.id, thread)
        question = await self.talk.answered_by(session, answers)
        if not question:
            return  # answered meanwhile
        # Someone who may not answer is told so in the thread (the refusal is the note), and
        # so is the author of a reply to a question answered meanwhile.
        actor = actor_of(message.author, session.place, message.guild)
        outcome = await self.talk.decide(question, DecisionKind.ANSWER, actor, text=message.content)
        await self._show(outcome, thread, message)

    async def _thread_started_from(self, message: discord.Message) -> discord.Thread | None:
        """The thread an earlier handling of this mention started (it has the message's id);
        None only when Discord says there is none. Raises ``TryLater`` when Discord did not
        answer (read as "none", a second thread would be asked for, and refused), and
        ``HTTPException`` when it refused to say."""
        try:
            found = await self.fetch_channel(message.id)
        except discord.NotFound:
            return None
        except UNANSWERED as exc:
            what = f"discord: the thread of message {message.id} could not be looked up"
            raise TryLater(f"{what}: {exc or type(exc).__name__}") from exc
        return found if isinstance(found, discord.Thread) else None

    async def _start_thread(self, message: discord.Message, text: str) -> discord.Thread | None:
        name = " ".join(text.split())[:90] or "Kestrel"
        try:
            return await message.create_thread(
                name=name, auto_archive_duration=THREAD_ARCHIVE_MINUTES
            )
        except (discord.HTTPException, discord.RateLimited) as exc:
            if isinstance(exc, discord.NotFound) and exc.code == UNKNOWN_MESSAGE:
                # Deleted as it came: it asks nothing any more, and has nothing to reply to.
                log.info("discord: message %s was deleted before its thread started", message.id)
                return None
            log.warning("discord: cannot start a thread in %s: %s", message.channel.id, exc)
            await message.reply(_no_thread(exc), mention_author=False)
            return None

    async def _show(self, outcome: Outcome, thread: Any, message: discord.Message) -> None:
        """Say in ``thread`` how ``message`` was taken. It has acted by now (answered, cancelled,
        started): under a long rate limit the reply waits in the outbox, since handling the
        message again would act again."""
        text = status_text(outcome.status) if outcome.status is not None else outcome.note
        if outcome.status is None and text:
            text = note_text(text)
        if text:
            try:
                await thread.send(text, allowed_mentions=NO_PINGS)
            except discord.RateLimited as exc:
                log.warning("discord: reply to message %s put off: %s", message.id, exc)
                assert message.guild is not None
                where = DiscordTarget(str(message.guild.id), str(thread.id))
                body = {"content": text, "allowed_mentions": {"parse": []}}
                await self.deliveries.put(f"reply:{message.id}", where, body)
        await self.after(outcome)

    async def after(self, outcome: Outcome) -> None:
        """Show that a run goes on here (a decision's card refreshes on its event)."""
        place = await self.renderer.place_of(outcome.running) if outcome.running else None
        if place is not None:
            self.progress.follow(outcome.running, place)
            await self.progress.working(place)

    # --- clicks -----------------------------------------------------------------------

    def _interaction_arrived(self, data: dict[str, Any]) -> None:
        """An interaction from the gateway (a parser must not wait: take it in a task)."""
        if self.draining:
            return  # stopping: a live replica's session takes it
        task = asyncio.create_task(self._take_interaction(data))
        self._taking.add(task)
        task.add_done_callback(self._taking.discard)

    async def _take_interaction(self, data: dict[str, Any]) -> None:
        if await self.first_take(data):
            self._dispatch_interaction(data)

    async def first_take(self, data: dict[str, Any]) -> bool:
        """Whether this replica answers interaction ``data``: the first to mark its id in the
        store (on every session, or also over HTTP) does; the others drop it. A store that
        cannot say leaves it unanswered here (Discord tells the person it failed)."""
        try:
            return await self.chat.first_interaction(f"discord-interaction:{data.get('id')}")
        except StoreError as exc:
            log.warning("discord: interaction %s dropped: %s", data.get("id"), exc)
            return False

    def dispatch_interaction(self, data: dict[str, Any]) -> None:
        """Hand a taken interaction to its button, form or command (as the gateway would)."""
        self._dispatch_interaction(data)

    async def decide(
        self, interaction: discord.Interaction, request_id: str, kind: DecisionKind, text: str = ""
    ) -> None:
        """A click or a form that decides a request: defer, decide, say how it went."""
        async with self._busy():
            await self._decide(interaction, request_id, kind, text)

    async def _decide(
        self, interaction: discord.Interaction, request_id: str, kind: DecisionKind, text: str
    ) -> None:
        if not interaction.response.is_done() and not await deferred(interaction):
            return  # Discord told the clicker it failed: it counts for nothing
        # A form opened from a card carries it, as a click does: one without counts nowhere.
        card = str(interaction.message.id) if interaction.message is not None else ""
        try:
            actor = await self.actor_for(interaction, request_id, kind)
            if actor is None:
                outcome = Outcome(note=NOT_HERE)
            else:
                outcome = await self.talk.decide(request_id, kind, actor, text=text, card=card)
        except StoreError as exc:
            # Deferred already: without a follow-up the clicker sees "thinking…" for ever.
            log.error("discord: the store failed: %s", exc)
            outcome = Outcome(note=store_note(exc, NOT_RECORDED))
        await interaction.followup.send(note_text(outcome.note or "Recorded."), ephemeral=True)
        await self.after(outcome)

    async def ask_first(
        self, interaction: discord.Interaction, request_id: str, kind: DecisionKind
    ) -> None:
        """Deny and Answer: check, then open the form (a modal must be the first response)."""
        try:
            actor = await self.actor_for(interaction, request_id, kind)
            refusal = None
            if actor is not None:  # refused and audited as the decision it would make
                # The form's decision counts only from the card: one opened elsewhere would
                # take words only to refuse them.
                card = str(interaction.message.id) if interaction.message is not None else ""
                refusal = await self.chat.check(request_id, kind, user=actor, asked=True, card=card)
        except StoreError as exc:
            await say_store_failed(interaction, f"{kind.value} form", exc, NOT_RECORDED)
            return
        if actor is None or refusal is not None:
            note = refusal.reason if refusal is not None else NOT_HERE
            await in_time(interaction, interaction.response.send_message(note, ephemeral=True))
            return
        form = ReasonModal if kind is DecisionKind.DENY else AnswerModal
        # A modal is found again by its custom id: one per request and person.
        modal = form(request_id, interaction.user.id)
        await in_time(interaction, interaction.response.send_modal(modal))

    async def show_arguments(self, interaction: discord.Interaction, request_id: str) -> None:
        """A card's Full arguments: the request's exact arguments, to the clicker alone, when
        they may read it from where they clicked (as any read, checked against the place).
        Deferred first, as a decision is: the reads may take longer than Discord waits (over
        HTTP, a response after that would be dropped)."""
        if not interaction.response.is_done() and not await deferred(interaction):
            return
        try:
            actor = await self.actor_for(interaction, request_id, None)
            view = await self.chat.request(request_id, user=actor) if actor else None
        except StoreError as exc:
            await say_store_failed(interaction, "Full arguments", exc)
            return
        if view is None:
            note = NOT_THIS_THREAD if actor else NOT_HERE
            await interaction.followup.send(note, ephemeral=True)
            return
        for part in arguments_messages(view.request):
            await interaction.followup.send(part, ephemeral=True)

    async def actor_for(
        self, interaction: discord.Interaction, request_id: str, kind: DecisionKind | None
    ) -> Actor | None:
        """Who clicked, as the policy sees them, acting from where they clicked; None when the
        request is not one of a Discord run's, the click refused and audited as the decision
        ``kind`` (None: a read, Full arguments) from elsewhere is."""
        actor = interaction_actor(interaction)
        view = await self.chat.request(request_id)
        if view is None or await self.renderer.place_of(view.request.run_id) is not None:
            return actor
        # Another platform's run (or the terminal's) lives nowhere a Discord click comes
        # from: the core refuses it for its place, and keeps the trace.
        if kind is None:
            await self.chat.request(request_id, user=actor)
        else:
            await self.chat.check(request_id, kind, user=actor, asked=True)
        return None

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        """Kestrel's forms, submitted: read from the interaction itself, so that a form opened
        before a restart still counts after it."""
        if interaction.type is not discord.InteractionType.modal_submit:
            return
        data: dict[str, Any] = dict(interaction.data or {})
        match = FORM.fullmatch(str(data.get("custom_id", "")))
        if match is None:
            return
        kind = DecisionKind.DENY if match["form"] == "deny" else DecisionKind.ANSWER
        try:
            await self.decide(interaction, match["req"], kind, form_text(data))
        except Exception:
            log.exception("discord: handling a form failed")


def _session(guild: int, thread: Thread) -> Session:
    """A thread's session: it lives in the guild, in the channel the thread belongs to (the
    thread itself while Discord has not said which that is)."""
    return Session(
        id=ids.thread_session_id(guild, thread.id),
        platform="discord",
        workspace=str(guild),
        channel=str(getattr(thread, "parent_id", None) or thread.id),
        thread=str(thread.id),
    )


NOT_HERE = "That request is not one of a Discord run's."
NOT_THIS_THREAD = "That request is not one of this thread's."
UNKNOWN_MESSAGE = 10008


def _no_run_here(text: str) -> str:
    """What a bare mention, or a thread command, said in a channel rather than a run's thread
    gets."""
    if asks_help(text):
        return HELP
    word = command_word(text)
    return (
        f"There is no run here: mention me with `{word}` in a run's thread,"
        f" or use `/kestrel {word} RUN`."
    )


def _no_thread(exc: discord.HTTPException | discord.RateLimited) -> str:
    """Why a thread could not be started, for the channel."""
    if isinstance(exc, discord.RateLimited):
        return "Discord is rate-limiting new threads here: mention me again in a few minutes."
    if exc.code in (50013, 50001):
        return "I cannot start a thread here: I need the Create Public Threads permission."
    if exc.code in (50024, 160004):
        return "Threads cannot be started here: mention me in a text channel."
    return f"I could not start a thread here: {exc.text or exc.status}."
