"""What Kestrel does with what Slack sends: mentions, thread replies, clicks, modals, the
slash command and the App Home.

Every listener answers Slack at once: the app runs listeners before it responds (bolt's
``process_before_response``, which spares the 10 ms polls bolt makes for an ``ack`` otherwise),
so each one acknowledges and hands the work to a task of its own. What a message or a click
means is the core's ``Conversation``; this module reads Slack's payloads into it and shows
the outcome. Deliveries are taken once: Slack retries, and a mention arrives both as
``app_mention`` and as ``message``, so each message is claimed by its ts in the store first,
with the work that stands for it, before Slack is answered (``Inbound``); a click is decided
before it is acknowledged. Whatever instant the process dies after answering Slack, the
message or the click is not lost.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack import ids
from adapters.slack.identity import Identities
from adapters.slack.ids import SlackThread, thread_session_id
from adapters.slack.listings import home_view, runs_message
from adapters.slack.modals import answer_modal, arguments_modal, deny_modal
from adapters.slack.mrkdwn import ephemeral_text
from adapters.slack.progress import Progress
from adapters.slack.status import status_message
from bot.chat.contract import Actor, NotPermitted, Place, StoreError, UnknownRun
from bot.chat.conversation import (
    HELP,
    THREAD_COMMANDS,
    Conversation,
    Outcome,
    run_id_said,
    store_note,
)
from bot.chat.inbound import Accepted, Delivery
from bot.chat.service import ChatService, PendingRequest
from bot.chat.threads import ThreadRenderer
from bot.chat.words import NOT_AN_OPTION, NOT_RECORDED, chosen_option, thread_of, unseen_run
from bot.domain import DecisionKind, Session

log = logging.getLogger("kestrel.slack")

T = TypeVar("T")
Ack = Callable[..., Awaitable[None]]
Respond = Callable[..., Awaitable[Any]]

DECISIONS = {
    ids.APPROVE_ONCE: DecisionKind.APPROVE,
    ids.APPROVE_RUN: DecisionKind.APPROVE_ALWAYS,
    ids.EFFECT_RETRY: DecisionKind.RETRY,
    ids.EFFECT_DONE: DecisionKind.DONE,
    ids.EFFECT_FAILED: DecisionKind.FAILED,
    ids.APPROVE_PLAN: DecisionKind.APPROVE,
    ids.STEP_BY_STEP: DecisionKind.STEP_BY_STEP,
}
# A person's message: plain, also sent to the channel, or with a file attached.
PEOPLE_SUBTYPES = frozenset({None, "thread_broadcast", "file_share"})
MODALS = {
    ids.DENY: (DecisionKind.DENY, deny_modal),
    ids.ANSWER: (DecisionKind.ANSWER, answer_modal),
}


@dataclass(frozen=True)
class BotIdentity:
    """Who the bot is in its workspace (from ``auth.test``): ``org``, the Enterprise Grid
    organisation the workspace is in ("" for none)."""

    team: str
    user: str
    org: str = ""


class SlackListeners:
    """The handlers the app registers. None raises into bolt, except a store failure before
    Slack is answered: the request then fails, and Slack sends it again."""

    def __init__(
        self,
        chat: ChatService,
        client: AsyncWebClient,
        me: BotIdentity,
        identities: Identities,
        progress: Progress,
        renderer: ThreadRenderer,
        modal_key: bytes,
    ) -> None:
        self._chat = chat
        self._modal_key = modal_key
        self._talk = Conversation(chat)
        self._client = client
        self._me = me
        self._identities = identities
        self._progress = progress
        self._renderer = renderer
        self._mention = re.compile(rf"<@{re.escape(me.user)}(\|[^>]*)?>")
        self._tasks: set[asyncio.Task[None]] = set()
        chat.inbound.handle("slack", self.handle_delivery)

    async def idle(self, timeout: float | None = None) -> None:
        """Wait (up to ``timeout`` seconds) for the work the listeners handed off."""
        while self._tasks:
            done, _ = await asyncio.wait(list(self._tasks), timeout=timeout)
            if not done:
                return

    # --- messages ---------------------------------------------------------------------

    async def on_app_mention(self, event: dict[str, Any], body: dict[str, Any]) -> None:
        """A message that mentions the bot: a turn, a thread command, or an answer. Not an
        edit (Slack sends one that mentions the bot as ``app_mention`` too): what a message said
        when it was said stands, and an old message edited would act unseen, high in a thread."""
        if event.get("edited"):
            return
        await self._accept_mention(event, self._workspace(body, event))

    async def _accept_mention(self, event: dict[str, Any], team: str) -> None:
        # Held with the question its thread waits on now: that is the one it may answer.
        question = await self._question_of(event, team) if event.get("thread_ts") else ""
        await self._accept("mention", event, team, answers=question)

    async def on_message(self, event: dict[str, Any], body: dict[str, Any]) -> None:
        """Any message in a channel the bot is in: thread replies may answer questions."""
        if event.get("subtype") not in PEOPLE_SUBTYPES or event.get("bot_id"):
            return  # edits, joins and bots' messages are never answers
        if event.get("user") == self._me.user:
            return
        team = self._workspace(body, event)
        if self._mention.search(str(event.get("text") or "")):
            await self._accept_mention(event, team)  # the app_mention twin
        elif event.get("thread_ts") and (question := await self._question_of(event, team)):
            await self._accept("reply", event, team, answers=question)

    async def _question_of(self, event: dict[str, Any], team: str) -> str:
        """The question a thread reply answers (its request's id), if the thread has one."""
        session = _session(SlackThread(team, str(event.get("channel")), str(event["thread_ts"])))
        question = await self._talk.question(session) if session is not None else None
        return question.id if question is not None else ""

    async def _accept(
        self, what: str, event: dict[str, Any], team: str, *, answers: str | None = None
    ) -> None:
        """Hold a message in the store before Slack is answered, then handle it here; it
        holds the question it may answer ("" for none), so that handled late or again it
        answers no other."""
        user, channel, ts = event.get("user"), event.get("channel"), event.get("ts")
        if not (user and channel and ts) or event.get("bot_id"):
            return
        key, delivery = f"slack:{team}:{channel}:{ts}", {"what": what, "event": event, "team": team}
        if answers is not None:
            delivery["answers"] = answers
        accepted = await self._chat.accept_delivery(key, "slack", delivery)
        if accepted is not None:
            self._spawn(self._chat.inbound.settle(accepted))

    async def handle_delivery(self, delivery: Delivery) -> None:
        """Handle a message held in the store (by this process, or by one that died)."""
        event, team = dict(delivery["event"]), str(delivery["team"])
        held = Accepted(0, delivery)
        if delivery.get("what") == "reply":
            await self._on_reply(event, team, held.answers or "")
        else:
            await self._on_mention(event, team, held.run_id, held.answers)

    async def _on_mention(
        self, event: dict[str, Any], team: str, run_id: str, answers: str | None = None
    ) -> None:
        user, channel, ts = event.get("user"), event.get("channel"), event.get("ts")
        thread = SlackThread(team, str(channel), str(event.get("thread_ts") or ts))
        session = _session(thread)
        if session is None:
            return
        if thread.channel.startswith("D"):
            # A direct message has no one else in it to approve, answer or look on call.
            log.info("slack: ignoring a mention in a direct message (%s)", thread.channel)
            return
        actor = await self._actor(str(user), thread, _user_team(event))
        text = self._mention.sub("", str(event.get("text") or "")).strip()
        outcome = await self._talk.mention(session, actor, text, run_id=run_id, answers=answers)
        if outcome.started:
            self._renderer.expect(outcome.running, session, actor.user)
        await self._show(outcome, thread, actor.user)

    async def _on_reply(self, event: dict[str, Any], team: str, answers: str = "") -> None:
        user, channel, ts = event.get("user"), event.get("channel"), event.get("ts")
        if not (user and channel and ts):
            return
        thread = SlackThread(team, str(channel), str(event["thread_ts"]))
        session = _session(thread)
        question = await self._talk.answered_by(session, answers) if session else ""
        if not question:
            return  # not an answer to anything (any more): ignored
        actor = await self._actor(str(user), thread, _user_team(event))
        text = str(event.get("text") or "")
        outcome = await self._talk.decide(question, DecisionKind.ANSWER, actor, text=text)
        await self._show(outcome, thread, actor.user)

    # --- clicks and modals --------------------------------------------------------------

    async def on_action(self, ack: Ack, body: dict[str, Any], action: dict[str, Any]) -> None:
        """A button or menu on one of Kestrel's messages; a decision is durable before Slack
        is answered (Slack never sends a click again: acknowledged, it must not be lost)."""
        action_id = ids.canonical_action(str(action.get("action_id", ""))) or ""
        if action_id in DECISIONS or action_id == ids.CHOOSE:
            decided = await self._guarded(self._decide_click(action_id, body, action))
            await ack()
            if decided is not None:
                self._spawn(self._show(*decided))
            return
        await ack()
        self._spawn(self._on_action(body, action))

    async def _clicked(self, body: dict[str, Any]) -> tuple[SlackThread, Actor]:
        user = body.get("user") or {}
        thread = _thread_of_action(body)
        actor = await self._actor(str(user.get("id", "")), thread, user.get("team_id", ""))
        return thread, actor

    async def _decide_click(
        self, action_id: str, body: dict[str, Any], action: dict[str, Any]
    ) -> tuple[Outcome, SlackThread, str]:
        thread, actor = await self._clicked(body)
        card = _card_of_action(body)
        outcome = await _said(self._click_outcome(action_id, action, actor, card))
        return outcome, thread, actor.user

    async def _click_outcome(
        self, action_id: str, action: dict[str, Any], actor: Actor, card: str
    ) -> Outcome:
        value = _action_value(action)
        if action_id == ids.CHOOSE:
            return await self._choose(value, actor, card)
        request_id = ids.parse_request_value(value)
        if not request_id:
            return Outcome(note="This button is not one of mine.")
        return await self._talk.decide(request_id, DECISIONS[action_id], actor, card=card)

    async def _on_action(self, body: dict[str, Any], action: dict[str, Any]) -> None:
        action_id = ids.canonical_action(str(action.get("action_id", ""))) or ""
        value = _action_value(action)
        thread, actor = await self._clicked(body)
        if action_id == ids.FEEDBACK:
            await self._feedback(value, actor, thread)
        elif action_id in MODALS or action_id == ids.SHOW_ARGUMENTS:
            request_id = ids.parse_request_value(value) or ""
            origin = ids.ModalOrigin(request_id, thread, _card_of_action(body))
            try:
                await self._open_modal(action_id, origin, actor, body.get("trigger_id", ""))
            except StoreError as exc:
                # Deny or Answer opened no form: the clicker must not wait for one.
                log.error("slack: the store failed: %s", exc)
                await self._ephemeral(thread, actor.user, store_note(exc, NOT_RECORDED))

    async def _choose(self, value: str, actor: Actor, card: str) -> Outcome:
        choice = ids.parse_choice(value)
        # Only the option's text is read here; where the click came from is checked (and a
        # refusal audited) as the answer is decided, as for any button of the card.
        view = await self._chat.request(choice[0]) if choice else None
        option = chosen_option(view.request.options, choice[1]) if choice and view else None
        if view is None or option is None:
            return Outcome(note=NOT_AN_OPTION)
        kind = DecisionKind.ANSWER
        return await self._talk.decide(view.request.id, kind, actor, text=option, card=card)

    async def _open_modal(
        self, action_id: str, origin: ids.ModalOrigin, actor: Actor, trigger: str
    ) -> None:
        thread = origin.thread
        found = origin.request_id
        # A form to decide is refused (and audited) as the decision it would make.
        refusal = None
        if found and action_id != ids.SHOW_ARGUMENTS:
            kind = MODALS[action_id][0]
            refusal = await self._chat.check(found, kind, user=actor, asked=True, card=origin.card)
        view = await self._chat.request(found, user=actor) if found and not refusal else None
        if view is None:
            note = refusal.reason if refusal else "That request is not one of this thread's."
            await self._ephemeral(thread, actor.user, note)
            return
        if action_id == ids.SHOW_ARGUMENTS:
            await self._client.views_open(trigger_id=trigger, view=arguments_modal(view.request))
            return
        modal = MODALS[action_id][1]
        sealed = ids.seal_modal(self._modal_key, origin)
        await self._client.views_open(trigger_id=trigger, view=modal(view.request, sealed))

    async def on_deny_submitted(self, ack: Ack, body: dict[str, Any], view: dict[str, Any]) -> None:
        """The Deny modal: the reason is optional."""
        await self._submitted(
            ack, body, view, DecisionKind.DENY, ids.REASON_BLOCK, ids.REASON_ACTION
        )

    async def on_answer_submitted(
        self, ack: Ack, body: dict[str, Any], view: dict[str, Any]
    ) -> None:
        """The Answer modal of a free-text question."""
        await self._submitted(
            ack, body, view, DecisionKind.ANSWER, ids.ANSWER_BLOCK, ids.ANSWER_ACTION
        )

    async def _submitted(
        self,
        ack: Ack,
        body: dict[str, Any],
        view: dict[str, Any],
        kind: DecisionKind,
        block: str,
        action: str,
    ) -> None:
        # Decided before the modal closes, so that a refusal shows in the modal itself. The
        # form acts from where it was opened, as its sealed metadata says.
        origin = ids.open_modal(self._modal_key, str(view.get("private_metadata", "")))
        if origin is None:
            await ack(response_action="errors", errors={block: "This form is not one of mine."})
            return
        thread = origin.thread
        user = body.get("user") or {}
        actor = await self._actor(str(user.get("id", "")), thread, user.get("team_id", ""))
        text = _input_value(view, block, action)
        deciding = self._talk.decide(origin.request_id, kind, actor, text=text, card=origin.card)
        outcome = await _said(deciding)
        if outcome.note:
            await ack(response_action="errors", errors={block: outcome.note})
            return
        await ack()
        self._spawn(self._show(outcome, thread, actor.user))

    async def _feedback(self, value: str, actor: Actor, thread: SlackThread) -> None:
        parsed = ids.parse_feedback(value)
        if parsed is None:
            return
        positive, run_id = parsed
        try:
            await self._chat.feedback(run_id, positive=positive, user=actor)
        except UnknownRun:
            # Made up, or a run they may not see, acted on from elsewhere: said as status says.
            await self._ephemeral(thread, actor.user, unseen_run(run_id))
            return
        except StoreError:
            return
        except NotPermitted as exc:
            await self._ephemeral(thread, actor.user, str(exc))
            return
        await self._ephemeral(thread, actor.user, "Thanks for the feedback.")

    # --- the slash command and the App Home ------------------------------------------------

    async def on_command(self, ack: Ack, command: dict[str, Any], respond: Respond) -> None:
        """``/kestrel runs | status RUN | cancel RUN | resume RUN | help``; the answers go
        through the command's response URL, which works in DMs and channels the bot is not
        in."""
        words = str(command.get("text") or "").split()
        verb = words[0].lower() if words else "runs"
        if verb == "runs":
            await ack()
            self._spawn(self._answered(self._command_runs(command, respond), respond))
            return
        if verb not in THREAD_COMMANDS or len(words) != 2:
            await ack(text=f"Usage: `/kestrel runs`, `/kestrel status|cancel|resume RUN`. {HELP}")
            return
        await ack()
        work = self._command_on_run(verb, run_id_said(words[1]), command, respond)
        self._spawn(self._answered(work, respond))

    async def _answered(self, work: Coroutine[Any, Any, None], respond: Respond) -> None:
        """A slash command's work; when the store fails under it, the person is told so (it
        was acknowledged already, and Slack sends a command once)."""
        try:
            await work
        except StoreError as exc:
            log.error("slack: the store failed: %s", exc)
            await respond(text=ephemeral_text(store_note(exc)))

    async def _command_runs(self, command: dict[str, Any], respond: Respond) -> None:
        actor = await self._command_actor(command, listing=True)
        pending = await self._chat.pending(user=actor)
        unshown = await self._renderer.cards_unshown([i.request.id for i in pending])
        message = runs_message(pending, await self._links(pending), unshown)
        await respond(text=message.text, blocks=message.blocks)

    async def _command_actor(self, command: dict[str, Any], *, listing: bool = False) -> Actor:
        # A slash command names a channel but no thread: it acts on that channel's runs. Its
        # ``team_id`` is not always ours in a channel shared with another workspace; the
        # channel's runs live in ours, as the events' (``_team_of``) do. Which workspace that
        # ``team_id`` names for a guest Slack does not document: the typist's own is what the
        # payload says it is (``user_team_id``), else what Slack's users.info says, never it.
        team = str(command.get("team_id") or "")
        where = SlackThread(self._me.team or team, str(command.get("channel_id", "")), "")
        own_team = str(command.get("user_team_id") or "")
        return await self._actor(str(command.get("user_id", "")), where, own_team, listing)

    async def _command_on_run(
        self, verb: str, run_id: str, command: dict[str, Any], respond: Respond
    ) -> None:
        actor = await self._command_actor(command)
        place = await self._renderer.place_of(run_id) if ids.is_core_id(run_id) else None
        if place is None:  # made up, or another platform's: said as a run one may not see
            if ids.is_core_id(run_id):  # another platform's is refused and audited, as is
                await self._chat.refuse_unseen(verb, run_id, user=actor)  # one from elsewhere
            await respond(text=ephemeral_text(unseen_run(run_id)))
            return
        outcome = await self._talk.operate(verb, run_id, actor)
        if outcome.status is not None:
            message = status_message(outcome.status)
            await respond(text=message.text, blocks=message.blocks)
            return
        await respond(text=ephemeral_text(outcome.note))
        await self._follow(outcome)

    async def on_home_opened(self, event: dict[str, Any], body: dict[str, Any]) -> None:
        """The App Home tab: what waits on this person."""
        user = str(event.get("user", ""))
        if event.get("tab", "home") == "home" and user:
            self._spawn(self._publish_home(user, self._workspace(body, event)))

    async def _publish_home(self, user: str, team: str) -> None:
        actor = await self._actor(user, SlackThread(team, "", ""), "", listing=True)
        waiting = []
        for item in await self._chat.pending(user=actor):
            run = await self._chat.place_of(item.request.run_id)
            if await actor.admitted(list(item.may_answer), run):
                waiting.append(item)
        view = home_view(waiting, await self._links(waiting), user)
        await self._client.views_publish(user_id=user, view=view)

    async def _links(self, pending: list[PendingRequest] | None = None) -> dict[str, str]:
        links: dict[str, str] = {}
        for item in pending if pending is not None else await self._chat.pending():
            place = await self._renderer.place_of(item.request.run_id)
            url = None if place is None else thread_of(place.session.id).url
            if url is not None:
                links[item.request.run_id] = url
        return links

    # --- who is in a group or a channel ----------------------------------------------------

    async def on_members_changed(self, event: dict[str, Any]) -> None:
        """Slack says who is in a user group (``subteam_members_changed``, ``subteam_updated``)
        or a channel (``member_joined_channel``, ``member_left_channel``) changed: what was kept
        of it is asked again at the next action, so a member removed is refused at once."""
        group = event.get("subteam_id") or _dict(event.get("subteam")).get("id")
        channel = event.get("channel") if str(event.get("type", "")).startswith("member_") else ""
        self._identities.forget(group=str(group or ""), channel=str(channel or ""))

    # --- the app's own installation ------------------------------------------------------------

    async def on_uninstalled(self, event: dict[str, Any], body: dict[str, Any]) -> None:
        """The app was removed from a workspace (``app_uninstalled``), or the bot's token was
        revoked (``tokens_revoked`` naming the bot; a person's own token revoked is nothing to
        Kestrel). Taken, not left unhandled (Slack delivers an unhandled event again, and turns
        an app's events off when too many fail), and said once: nothing can be posted there
        until the app is installed again, so what waits there is decided at the terminal."""
        # The workspace that removed the app is the body's own: ``authorizations`` names an
        # installation Slack delivered the event through, which, for another workspace of an
        # org (whose bot user is the same), is Kestrel's, and says nothing of Kestrel's token.
        team = str(body.get("team_id") or _team_of(body, event))
        if event.get("type") == "tokens_revoked":
            bots = _dict(event.get("tokens")).get("bot")
            if not isinstance(bots, list) or self._me.user not in bots:
                log.info("slack: a token of workspace %s was revoked (not Kestrel's)", team)
                return
            what = "Kestrel's bot token was revoked"
        else:
            what = "Kestrel was uninstalled"
        # Another workspace's only when one is named: an org's own (its ``enterprise_id``) may
        # be Kestrel's installation's too, and a loss not said is worse than one said twice.
        if team and team not in (self._me.team, body.get("enterprise_id")):
            log.info(
                "slack: %s in workspace %s, not the one it serves (%s): nothing changes here",
                what,
                team,
                self._me.team,
            )
            return
        log.error(
            "slack: %s in workspace %s: nothing can be posted there until it is installed again"
            " (its messages are tried again hourly); `kestrel runs pending` lists what waits on"
            " people there, and `kestrel runs approve` or `deny` decides it",
            what,
            team,
        )

    # --- showing outcomes -------------------------------------------------------------------

    async def _show(self, outcome: Outcome, thread: SlackThread, user: str) -> None:
        if outcome.status is not None:
            message = status_message(outcome.status)
            await self._ephemeral(thread, user, message.text, message.blocks)
        elif outcome.note:
            await self._ephemeral(thread, user, outcome.note)
        await self._follow(outcome)

    async def _follow(self, outcome: Outcome) -> None:
        # The run goes on in this process: show at once that it works.
        place = await self._renderer.place_of(outcome.running) if outcome.running else None
        if place is not None:
            self._progress.follow(outcome.running, place)
            await self._progress.working(place)

    def _workspace(self, body: dict[str, Any], event: dict[str, Any]) -> str:
        """The workspace an event's thread lives in: Kestrel's own, the one its token posts
        in. Slack names one installation of the app in ``authorizations``, and in a channel
        shared with another workspace where the app is installed too, that may be the other
        one's: a run taken to live there could be decided from nowhere (a click on its card
        names ours), and the same message delivered once for each was two runs."""
        return self._me.team or _team_of(body, event)

    async def _actor(
        self, user: str, where: SlackThread, team: str, listing: bool = False
    ) -> Actor:
        # ``listing``: only to list what waits; anything else asks Slack of groups afresh.
        place = Place("slack", where.team, where.channel, where.thread_ts)
        return await self._identities.actor(user, place, team=str(team or ""), listing=listing)

    async def _ephemeral(
        self, thread: SlackThread, user: str, text: str, blocks: list[Any] | None = None
    ) -> None:
        await self._client.chat_postEphemeral(
            channel=thread.channel,
            user=user,
            thread_ts=thread.thread_ts,
            text=text if blocks else ephemeral_text(text),
            blocks=blocks or None,
        )

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(self._quietly(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _quietly(self, work: Coroutine[Any, Any, None]) -> None:
        await self._guarded(work)

    async def _guarded(self, work: Coroutine[Any, Any, T]) -> T | None:
        # A Slack refusal or a store failure is logged in one line; anything else with its
        # traceback, in the log only: Slack's user sees nothing but what we post.
        try:
            return await work
        except SlackApiError as exc:
            log.warning("slack: %s", exc.response.get("error") or exc)
        except StoreError as exc:
            log.error("slack: the store failed: %s", exc)
        except Exception:
            log.exception("slack: handling a request failed")
        return None


async def _said(deciding: Awaitable[Outcome]) -> Outcome:
    """A click's or a form's outcome; a store failure under it becomes what its author is told
    (Slack never sends either again: they must not believe it counted, nor see only "trouble
    connecting")."""
    try:
        return await deciding
    except StoreError as exc:
        log.error("slack: the store failed: %s", exc)
        return Outcome(note=store_note(exc, NOT_RECORDED))


def _session(thread: SlackThread) -> Session | None:
    """The thread's session; None for ids that are not Slack's (a malformed payload)."""
    try:
        session_id = thread_session_id(thread.team, thread.channel, thread.thread_ts)
    except ValueError:
        log.info("slack: ignoring a message with malformed ids: %s", thread)
        return None
    return Session(
        id=session_id,
        platform="slack",
        workspace=thread.team,
        channel=thread.channel,
        thread=thread.thread_ts,
    )


def _user_team(event: dict[str, Any]) -> str:
    # The poster's own workspace: ``user_team`` in a shared channel, else the event's ``team``
    # (absent both, identity asks users.info, and a user it cannot place is a guest).
    return str(event.get("user_team") or event.get("team") or "")


def _team_of(body: dict[str, Any], event: dict[str, Any]) -> str:
    # The workspace the event was delivered for: where the thread (and so the session) lives.
    # In a channel another workspace shared with ours, ``team_id`` names that one; the
    # installation's, which clicks on our cards name too, is in ``authorizations``.
    authorizations = body.get("authorizations") or [{}]
    ours = authorizations[0].get("team_id")
    return str(ours or body.get("team_id") or event.get("team") or "")


def _thread_of_action(body: dict[str, Any]) -> SlackThread:
    container = body.get("container") or {}
    message = body.get("message") or {}
    channel = str((body.get("channel") or {}).get("id") or container.get("channel_id", ""))
    thread_ts = str(message.get("thread_ts") or container.get("thread_ts") or message.get("ts", ""))
    team = str((body.get("team") or {}).get("id", ""))
    return SlackThread(team, channel, thread_ts)


def _card_of_action(body: dict[str, Any]) -> str:
    # The message clicked: a decision counts only if it is the request's own card.
    container = body.get("container") or {}
    message = body.get("message") or {}
    return str(message.get("ts") or container.get("message_ts") or "")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _action_value(action: dict[str, Any]) -> str:
    return str(action.get("value") or (action.get("selected_option") or {}).get("value", ""))


def _input_value(view: dict[str, Any], block: str, action: str) -> str:
    values = ((view.get("state") or {}).get("values") or {}).get(block) or {}
    return str((values.get(action) or {}).get("value") or "").strip()
