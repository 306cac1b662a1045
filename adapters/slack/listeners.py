"""What Kestrel does with what Slack sends: mentions, thread replies, clicks, modals, the
slash command and the App Home.

Every listener answers Slack at once: the app runs listeners before it responds (bolt's
``process_before_response``, which spares the 10 ms polls bolt makes for an ``ack`` otherwise),
so each one acknowledges and hands the work to a task of its own. Who is acting goes to the
chat service, which decides whether they may.
Deliveries are taken once: Slack retries, and a mention arrives both as ``app_mention`` and
as ``message``, so each message is claimed by its ts in the store before anything happens.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack import ids
from adapters.slack.blocks import (
    answer_modal,
    arguments_modal,
    deny_modal,
    home_view,
    runs_message,
    status_message,
)
from adapters.slack.identity import Identities
from adapters.slack.ids import SlackThread, thread_session_id
from adapters.slack.progress import Progress
from adapters.slack.renderer import RunThread, SlackRenderer
from bot.chat import ChatService, PendingRequest, RunView
from bot.domain import TERMINAL_STATUSES, DecisionKind, Request, RequestKind, Session
from bot.policy import Actor, NotPermitted
from bot.prompter import DeferringPrompter
from bot.store import StoreError
from bot.supervisor import ResumeRefused

log = logging.getLogger("kestrel.slack")

Ack = Callable[..., Awaitable[None]]

DECISIONS = {
    ids.APPROVE_ONCE: DecisionKind.APPROVE,
    ids.APPROVE_RUN: DecisionKind.APPROVE_ALWAYS,
    ids.EFFECT_RETRY: DecisionKind.RETRY,
    ids.EFFECT_DONE: DecisionKind.DONE,
    ids.EFFECT_FAILED: DecisionKind.FAILED,
}
THREAD_COMMANDS = ("status", "cancel", "resume")
HELP = (
    "Mention me with what you need and I work on it in the thread. In a thread with a run:"
    " `@kestrel status`, `@kestrel cancel`, `@kestrel resume`. `/kestrel runs` lists what"
    " waits on people."
)


@dataclass(frozen=True)
class BotIdentity:
    """Who the bot is in its workspace (from ``auth.test``)."""

    team: str
    user: str
    url: str

    def permalink(self, channel: str, ts: str) -> str:
        """A link to a message, made without an API call."""
        return f"{self.url.rstrip('/')}/archives/{channel}/p{ts.replace('.', '')}"


class SlackListeners:
    """The handlers the app registers; each ends without raising into bolt."""

    def __init__(
        self,
        chat: ChatService,
        client: AsyncWebClient,
        me: BotIdentity,
        identities: Identities,
        progress: Progress,
        renderer: SlackRenderer,
    ) -> None:
        self._chat = chat
        self._client = client
        self._me = me
        self._identities = identities
        self._progress = progress
        self._renderer = renderer
        self._mention = re.compile(rf"<@{re.escape(me.user)}(\|[^>]*)?>")
        self._tasks: set[asyncio.Task[None]] = set()

    async def idle(self, timeout: float | None = None) -> None:
        """Wait (up to ``timeout`` seconds) for the work the listeners handed off."""
        while self._tasks:
            done, _ = await asyncio.wait(list(self._tasks), timeout=timeout)
            if not done:
                return

    # --- messages ---------------------------------------------------------------------

    async def on_app_mention(self, event: dict[str, Any], body: dict[str, Any]) -> None:
        """A message that mentions the bot: a turn, a thread command, or an answer."""
        self._spawn(self._on_mention(event, _team_of(body, event)))

    async def on_message(self, event: dict[str, Any], body: dict[str, Any]) -> None:
        """Any message in a channel the bot is in: thread replies may answer questions."""
        if event.get("subtype") or event.get("bot_id") or event.get("user") == self._me.user:
            return  # edits, joins, and the bot's own messages are never answers
        team = _team_of(body, event)
        if self._mention.search(event.get("text") or ""):
            self._spawn(self._on_mention(event, team))  # the app_mention twin
        elif event.get("thread_ts"):
            self._spawn(self._on_reply(event, team))

    async def _on_mention(self, event: dict[str, Any], team: str) -> None:
        user = event.get("user")
        if not user or event.get("bot_id"):
            return
        channel, ts = event["channel"], event["ts"]
        if not await self._chat.first_delivery(f"slack:{team}:{channel}:{ts}"):
            return
        thread = SlackThread(team, channel, event.get("thread_ts") or ts)
        actor = await self._actor(user, channel, event.get("user_team", ""))
        text = self._mention.sub("", event.get("text") or "").strip()
        session = _session(thread)
        latest = await self._chat.latest(session)
        if text.lower() in THREAD_COMMANDS:
            await self._thread_command(text.lower(), latest, thread, actor)
        elif not text:
            await self._ephemeral(thread, user, HELP)
        elif latest is not None and latest.record.status not in TERMINAL_STATUSES:
            await self._while_running(latest, thread, actor, text)
        else:
            await self._start(text, thread, actor, session)

    async def _start(self, text: str, thread: SlackThread, actor: Actor, session: Session) -> None:
        try:
            live = await self._chat.submit_turn(
                text, user=actor, session=session, prompter=DeferringPrompter()
            )
        except NotPermitted as exc:
            await self._ephemeral(thread, actor.user, str(exc))
            return
        self._progress.follow(live.run_id, thread, actor.user)
        await self._progress.working(thread)

    async def _while_running(
        self, latest: RunView, thread: SlackThread, actor: Actor, text: str
    ) -> None:
        if _question(latest) is not None:
            await self._answer_reply(latest, thread, actor, text)
            return
        await self._ephemeral(
            thread,
            actor.user,
            f"A run is still going in this thread ({latest.record.status.value}). Wait for"
            " it, or `@kestrel cancel` it first.",
        )

    async def _on_reply(self, event: dict[str, Any], team: str) -> None:
        user = event.get("user")
        if not user:
            return
        channel, ts = event["channel"], event["ts"]
        thread = SlackThread(team, channel, event["thread_ts"])
        latest = await self._chat.latest(_session(thread))
        if latest is None or _question(latest) is None:
            return  # not an answer to anything: ignored
        if not await self._chat.first_delivery(f"slack:{team}:{channel}:{ts}"):
            return
        actor = await self._actor(user, channel, event.get("user_team", ""))
        await self._answer_reply(latest, thread, actor, event.get("text") or "")

    async def _answer_reply(
        self, latest: RunView, thread: SlackThread, actor: Actor, text: str
    ) -> None:
        request = _question(latest)
        assert request is not None
        await self._decide(request.id, DecisionKind.ANSWER, actor, thread, text=text)

    # --- on-call in the thread ------------------------------------------------------------

    async def _thread_command(
        self, command: str, latest: RunView | None, thread: SlackThread, actor: Actor
    ) -> None:
        if latest is None:
            await self._ephemeral(thread, actor.user, "There is no run in this thread.")
            return
        run_id = latest.record.id
        if command == "status":
            message = status_message(latest)
            await self._ephemeral(thread, actor.user, message.text, message.blocks)
            return
        try:
            reply = await self._operate(command, run_id, actor, thread)
        except (NotPermitted, ResumeRefused, StoreError) as exc:
            reply = str(exc)
        await self._ephemeral(thread, actor.user, reply)

    async def _operate(self, command: str, run_id: str, actor: Actor, thread: SlackThread) -> str:
        if command == "cancel":
            return await self._chat.cancel(run_id, user=actor)
        live = await self._chat.resume(run_id, user=actor)
        if live is None:
            return f"Run {run_id} has nothing to do yet: it still waits on people, or it ended."
        self._progress.follow(run_id, thread, actor.user)
        await self._progress.working(thread)
        return f"Resuming run {run_id}."

    # --- clicks and modals --------------------------------------------------------------

    async def on_action(self, ack: Ack, body: dict[str, Any], action: dict[str, Any]) -> None:
        """A button or menu on one of Kestrel's messages."""
        await ack()
        self._spawn(self._on_action(body, action))

    async def _on_action(self, body: dict[str, Any], action: dict[str, Any]) -> None:
        action_id = ids.canonical_action(str(action.get("action_id", ""))) or ""
        value = str(action.get("value") or (action.get("selected_option") or {}).get("value", ""))
        user = body.get("user") or {}
        thread = _thread_of_action(body)
        actor = await self._actor(str(user.get("id", "")), thread.channel, user.get("team_id", ""))
        if action_id == ids.FEEDBACK:
            await self._feedback(value, actor, thread)
        elif action_id == ids.CHOOSE:
            await self._choose(value, actor, thread)
        elif action_id in (ids.DENY, ids.ANSWER, ids.SHOW_ARGUMENTS):
            await self._open_modal(action_id, value, actor, thread, body.get("trigger_id", ""))
        elif action_id in DECISIONS:
            request_id = ids.parse_request_value(value)
            if request_id is None:
                await self._ephemeral(thread, actor.user, "This button is not one of mine.")
                return
            await self._decide(request_id, DECISIONS[action_id], actor, thread)

    async def _choose(self, value: str, actor: Actor, thread: SlackThread) -> None:
        choice = ids.parse_choice(value)
        view = await self._chat.request(choice[0]) if choice else None
        if choice is None or view is None or not 0 <= choice[1] < len(view.request.options):
            await self._ephemeral(thread, actor.user, "That choice is not one this question has.")
            return
        option = view.request.options[choice[1]]
        await self._decide(view.request.id, DecisionKind.ANSWER, actor, thread, text=option)

    async def _open_modal(
        self, action_id: str, value: str, actor: Actor, thread: SlackThread, trigger: str
    ) -> None:
        request_id = ids.parse_request_value(value)
        view = await self._chat.request(request_id) if request_id else None
        if view is None:
            await self._ephemeral(thread, actor.user, "That request no longer exists.")
            return
        if action_id == ids.SHOW_ARGUMENTS:
            await self._client.views_open(trigger_id=trigger, view=arguments_modal(view.request))
            return
        kind = DecisionKind.DENY if action_id == ids.DENY else DecisionKind.ANSWER
        refusal = await self._chat.check(view.request.id, kind, user=actor)
        if refusal:
            await self._ephemeral(thread, actor.user, refusal)
            return
        modal = deny_modal if action_id == ids.DENY else answer_modal
        await self._client.views_open(trigger_id=trigger, view=modal(view.request))

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
        # Decided before the modal closes, so that a refusal shows in the modal itself.
        request_id = ids.parse_request_value(str(view.get("private_metadata", "")))
        found = await self._chat.request(request_id) if request_id else None
        if found is None:
            await ack(response_action="errors", errors={block: "That request no longer exists."})
            return
        where = await self._renderer.thread_of(found.request.run_id)
        user = body.get("user") or {}
        channel = where.thread.channel if where else ""
        actor = await self._actor(str(user.get("id", "")), channel, user.get("team_id", ""))
        text = _input_value(view, block, action)
        run_id = found.request.run_id
        decided = await self._chat.decide(run_id, found.request.id, kind, user=actor, text=text)
        if not decided.accepted:
            await ack(response_action="errors", errors={block: decided.message})
            return
        await ack()
        await self._after_decision(found.request.id, decided.resumed is not None, where)

    async def _decide(
        self,
        request_id: str,
        kind: DecisionKind,
        actor: Actor,
        thread: SlackThread,
        *,
        text: str = "",
    ) -> None:
        view = await self._chat.request(request_id)
        if view is None:
            await self._ephemeral(thread, actor.user, "That request no longer exists.")
            return
        decided = await self._chat.decide(
            view.request.run_id, request_id, kind, user=actor, text=text
        )
        if not decided.accepted:
            await self._ephemeral(thread, actor.user, decided.message)
            return
        where = await self._renderer.thread_of(view.request.run_id)
        await self._after_decision(request_id, decided.resumed is not None, where)

    async def _after_decision(
        self, request_id: str, resumed: bool, where: RunThread | None
    ) -> None:
        await self._renderer.refresh_card(request_id)
        if resumed and where is not None:
            await self._progress.working(where.thread)

    async def _feedback(self, value: str, actor: Actor, thread: SlackThread) -> None:
        parsed = ids.parse_feedback(value)
        if parsed is None:
            return
        positive, run_id = parsed
        try:
            await self._chat.feedback(run_id, positive=positive, user=actor)
        except StoreError:
            return
        await self._ephemeral(thread, actor.user, "Thanks for the feedback.")

    # --- the slash command and the App Home ------------------------------------------------

    async def on_command(self, ack: Ack, command: dict[str, Any]) -> None:
        """``/kestrel runs | status RUN | cancel RUN | resume RUN | help``."""
        words = str(command.get("text") or "").split()
        verb = words[0].lower() if words else "runs"
        if verb == "runs":
            message = runs_message(await self._chat.pending(), await self._links())
            await ack(text=message.text, blocks=message.blocks)
            return
        if verb not in THREAD_COMMANDS or len(words) != 2:
            await ack(text=f"Usage: `/kestrel runs`, `/kestrel status|cancel|resume RUN`. {HELP}")
            return
        await ack()
        self._spawn(self._command_on_run(verb, words[1], command))

    async def _command_on_run(self, verb: str, run_id: str, command: dict[str, Any]) -> None:
        channel, user = str(command.get("channel_id", "")), str(command.get("user_id", ""))
        actor = await self._actor(user, channel, str(command.get("user_team_id", "")))
        where = await self._renderer.thread_of(run_id) if ids.is_core_id(run_id) else None
        if where is None:
            reply = f"There is no Slack run {run_id}."
        elif verb == "status":
            message = status_message(await self._chat.status(run_id))
            await self._respond(command, message.text, message.blocks)
            return
        else:
            try:
                reply = await self._operate(verb, run_id, actor, where.thread)
            except (NotPermitted, ResumeRefused, StoreError) as exc:
                reply = str(exc)
        await self._respond(command, reply)

    async def on_home_opened(self, event: dict[str, Any], body: dict[str, Any]) -> None:
        """The App Home tab: what waits on this person."""
        user = str(event.get("user", ""))
        if event.get("tab", "home") == "home" and user:
            self._spawn(self._publish_home(user))

    async def _publish_home(self, user: str) -> None:
        actor = await self._actor(user, "", "")
        waiting = [p for p in await self._chat.pending() if actor.matches(list(p.may_answer))]
        view = home_view(waiting, await self._links(waiting), user)
        await self._client.views_publish(user_id=user, view=view)

    async def _links(self, pending: list[PendingRequest] | None = None) -> dict[str, str]:
        links: dict[str, str] = {}
        for item in pending if pending is not None else await self._chat.pending():
            where = await self._renderer.thread_of(item.request.run_id)
            if where is not None:
                links[item.request.run_id] = self._me.permalink(
                    where.thread.channel, where.thread.thread_ts
                )
        return links

    # --- replies --------------------------------------------------------------------------

    async def _actor(self, user: str, channel: str, team: str) -> Actor:
        return await self._identities.actor(user, channel=channel, team=team)

    async def _ephemeral(
        self, thread: SlackThread, user: str, text: str, blocks: list[Any] | None = None
    ) -> None:
        await self._client.chat_postEphemeral(
            channel=thread.channel,
            user=user,
            thread_ts=thread.thread_ts,
            text=text,
            blocks=blocks or None,
        )

    async def _respond(
        self, command: dict[str, Any], text: str, blocks: list[Any] | None = None
    ) -> None:
        await self._client.chat_postEphemeral(
            channel=str(command.get("channel_id", "")),
            user=str(command.get("user_id", "")),
            text=text,
            blocks=blocks or None,
        )

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(self._guarded(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, work: Coroutine[Any, Any, None]) -> None:
        # A Slack refusal or a store failure is logged in one line; anything else with its
        # traceback, in the log only: Slack's user sees nothing but what we post.
        try:
            await work
        except SlackApiError as exc:
            log.warning("slack: %s", exc.response.get("error") or exc)
        except StoreError as exc:
            log.error("slack: the store failed: %s", exc)
        except Exception:
            log.exception("slack: handling a request failed")


def _session(thread: SlackThread) -> Session:
    session_id = thread_session_id(thread.team, thread.channel, thread.thread_ts)
    return Session(id=session_id, platform="slack", channel=thread.channel, thread=thread.thread_ts)


def _question(view: RunView) -> Request | None:
    """The oldest question the run waits on, if any."""
    for request in view.open_requests:
        if request.kind is RequestKind.WAIT_USER:
            return request
    return None


def _team_of(body: dict[str, Any], event: dict[str, Any]) -> str:
    # The workspace the event was delivered for: where the thread (and so the session) lives.
    return str(body.get("team_id") or event.get("team") or "")


def _thread_of_action(body: dict[str, Any]) -> SlackThread:
    container = body.get("container") or {}
    message = body.get("message") or {}
    channel = str((body.get("channel") or {}).get("id") or container.get("channel_id", ""))
    thread_ts = str(message.get("thread_ts") or container.get("thread_ts") or message.get("ts", ""))
    team = str((body.get("team") or {}).get("id", ""))
    return SlackThread(team, channel, thread_ts)


def _input_value(view: dict[str, Any], block: str, action: str) -> str:
    values = ((view.get("state") or {}).get("values") or {}).get(block) or {}
    return str((values.get(action) or {}).get("value") or "").strip()
