"""What a chat thread shows of its runs, the same on every platform: which message shows what.

A platform gives its ``Look`` (how a card, an answer and a reminder look, and where a
session's messages go) and its ``LiveProgress`` (what shows while a run works). The
``ThreadRenderer`` receives the core's events and keeps each thread up to date: cards,
reminders and answers through the outbox under stable keys (posted once, then edited in
place, from any replica), progress straight to the platform. Events arrive on the run's task
and must not block it: each run's events are rendered in order by a task of their own.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, Protocol, assert_never

from bot.chat.outbox import Deliveries, Target
from bot.chat.outbox_keys import answer_key, card_key, reminder_key
from bot.chat.service import ChatService, RequestView
from bot.chat.words import suspended_words
from bot.domain import RequestStatus, Session, TerminalResult, ToolOutcome
from bot.errors import UnknownRun
from bot.events import (
    AdvisoryEvent,
    AnswerSuppliedEvent,
    Event,
    JournalFailedEvent,
    ModelTurnEvent,
    PanicEvent,
    RequestDecidedEvent,
    RequestExpiredEvent,
    RequestOpenedEvent,
    RequestReminderEvent,
    RunEndedEvent,
    RunResumedEvent,
    RunStartedEvent,
    RunSuspendedEvent,
    RunTakenOverEvent,
    ToolExitEvent,
    ToolStartedEvent,
)
from bot.tools.base import check_tool_name
from bot.tools.child import ended_badly

log = logging.getLogger("kestrel.threads")

# How many runs' places a renderer remembers, the least recently used forgotten first: more
# than a replica drives at once, never every run (another platform's included) it ever saw.
PLACES_KEPT: Final = 1024

StepStatus = Literal["in_progress", "complete", "error"]
Body = dict[str, Any]


@dataclass(frozen=True)
class RunPlace:
    """Where a run's thread is and who asked for it."""

    session: Session
    target: Target  # where the thread's messages go (the platform's own type)
    requested_by: str


class Look(Protocol):
    """How one platform shows a thread's messages, as outbox bodies."""

    platform: str

    def target(self, session: Session) -> Target | None:
        """Where a session's messages go; None for another platform's session."""
        ...

    def card(self, view: RequestView) -> Body:
        """A request's card, open or closed."""
        ...

    def answer(self, result: TerminalResult, run_id: str, at: datetime) -> list[Body]:
        """A run's answer (ended ``at``): its first message, then any continuations."""
        ...

    def reminder(self, view: RequestView) -> Body:
        """A note that the request still waits, naming who may answer."""
        ...


class LiveProgress(Protocol):
    """What a platform shows while a run works; best effort, never through the outbox."""

    def follow(self, run_id: str, place: RunPlace) -> None:
        """Start tracking a live run (idempotent)."""
        ...

    async def working(self, place: RunPlace, status: str = "") -> None:
        """Show at once that the run works (a mention, a resume)."""
        ...

    async def step(self, run_id: str, call_id: str, title: str, status: StepStatus) -> None:
        """A tool call started or finished."""
        ...

    async def stop(self, run_id: str, note: str = "") -> None:
        """The run suspended or ended in this process."""
        ...


class ThreadRenderer:
    """An event sink that keeps each of a platform's threads up to date."""

    def __init__(
        self, chat: ChatService, deliveries: Deliveries, look: Look, progress: LiveProgress
    ) -> None:
        self._chat = chat
        self._deliveries = deliveries
        self._look = look
        self._progress = progress
        self._places: OrderedDict[str, RunPlace | None] = OrderedDict()
        self._queues: dict[str, asyncio.Queue[Event]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        deliveries.renders_owed(self.render_owed)
        deliveries.asks_unshown(self.say_unshown)

    def emit(self, event: Event) -> None:
        """Queue the event behind the run's earlier ones."""
        queue = self._queues.get(event.run_id)
        if queue is None:
            queue = self._queues[event.run_id] = asyncio.Queue()
            task = asyncio.create_task(self._drain(event.run_id, queue))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        queue.put_nowait(event)

    async def idle(self) -> None:
        """Wait until every queued event is rendered."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self, timeout: float = 5.0) -> None:
        """Render what is queued for up to ``timeout`` seconds, then stop."""
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def expect(self, run_id: str, session: Session, requested_by: str) -> RunPlace | None:
        """Know where a run this process just started lives, before its row is written."""
        target = self._look.target(session)
        place = RunPlace(session, target, requested_by) if target is not None else None
        self._remember(run_id, place)
        return place

    def _remember(self, run_id: str, place: RunPlace | None) -> None:
        self._places[run_id] = place
        self._places.move_to_end(run_id)
        if len(self._places) > PLACES_KEPT:
            self._places.popitem(last=False)

    async def place_of(self, run_id: str) -> RunPlace | None:
        """The run's thread on this platform; None for a run of another platform."""
        if run_id in self._places:
            self._places.move_to_end(run_id)
            return self._places[run_id]
        try:
            # The run's row names who asked: no journal is read (a status would fold it whole).
            record, session = await self._chat.record_and_session(run_id)
        except UnknownRun:
            return None
        target = self._look.target(session) if session is not None else None
        found = None
        if session is not None and target is not None:
            found = RunPlace(session, target, record.requested_by)
        self._remember(run_id, found)
        return found

    async def show_card(self, view: RequestView) -> None:
        """Post or edit a request's card to show where it stands."""
        place = await self.place_of(view.request.run_id)
        if place is not None:
            body = self._look.card(view)
            await self._deliveries.put(card_key(view.request.id), place.target, body)

    async def refresh_card(self, request_id: str) -> None:
        """Show the request's card as the store has it now."""
        view = await self._chat.request(request_id)
        if view is not None:
            await self.show_card(view)

    async def say_unshown(self, request_id: str) -> bool:
        """Whether to say now that the request's card was never shown: it is still open, and
        no process said so before."""
        view = await self._chat.request(request_id)
        if view is None or view.status is not RequestStatus.OPEN:
            return False
        return await self._chat.first_to_say(f"unshown:{request_id}")

    async def cards_unshown(self, request_ids: Sequence[str]) -> dict[str, str]:
        """Why each of these requests' cards that has never been shown in its thread was not
        (the platform's last refusal, or "given up"), read at once; one shown, or that nothing
        refused, is left out."""
        keys = {card_key(request_id): request_id for request_id in request_ids}
        unshown = await self._deliveries.unshown(list(keys))
        return {keys[key]: why for key, why in unshown.items()}

    async def show_open_cards(self) -> None:
        """The card of every open request that the outbox does not hold yet, so that a card no
        process lived to put there appears. One it holds is left alone: it is delivered anyway,
        and putting it again from a read that a decision overtakes would show it open again."""
        for item in await self._chat.pending():
            if not await self._deliveries.holds(card_key(item.request.id)):
                await self.refresh_card(item.request.id)

    async def _drain(self, run_id: str, queue: asyncio.Queue[Event]) -> None:
        try:
            while not queue.empty():
                event = queue.get_nowait()
                try:
                    await self._render(event)
                except Exception:
                    log.exception("rendering %s of %s failed", event.kind, run_id)
        finally:
            if self._queues.get(run_id) is queue:
                del self._queues[run_id]

    async def _render(self, event: Event) -> None:
        place = await self.place_of(event.run_id)
        if place is None:
            return
        progress = self._progress
        match event:
            case RunStartedEvent():
                progress.follow(event.run_id, place)
            case RunResumedEvent():
                progress.follow(event.run_id, place)
                await progress.working(place)
            case ToolStartedEvent():
                title = step_title(event.tool)
                await progress.step(event.run_id, event.call_id, title, "in_progress")
            case ToolExitEvent():
                await self._tool_exit(event)
            case RequestOpenedEvent():
                await self.refresh_card(event.request.id)
            case AnswerSuppliedEvent() | RequestDecidedEvent() | RequestExpiredEvent():
                await self.refresh_card(event.request_id)
            case RequestReminderEvent():
                await self._remind(place, event.request.id)
            case RunSuspendedEvent():
                note = suspended_words(
                    event.reason,
                    waiting=bool(event.request_ids),
                    shared=self._chat.shared,
                    cut=event.uncertain,
                )
                await progress.stop(event.run_id, note)
            case RunEndedEvent():
                await progress.stop(event.run_id)
                # The run's end committed with its answer owed to the thread: the outbox
                # worker fills it in (``render_owed``), here or in any replica, after a crash too.
                self._deliveries.wake()
                self._places.pop(event.run_id, None)  # looked up again if ever needed
            case (
                ModelTurnEvent()
                | AdvisoryEvent()
                | RunTakenOverEvent()
                | JournalFailedEvent()
                | PanicEvent()
            ):
                pass  # the answer or the next step says what matters to the thread
            case _:
                assert_never(event)

    async def _tool_exit(self, event: ToolExitEvent) -> None:
        if event.outcome is ToolOutcome.DEFERRED:
            return  # the card shows what it waits on
        # A command that exited non-zero answered the model, but did not do its work: the
        # thread shows it failed, not done.
        done = event.outcome is ToolOutcome.OK and not ended_badly(event.output)
        status: StepStatus = "complete" if done else "error"
        await self._progress.step(event.run_id, event.call_id, step_title(event.tool), status)

    async def _remind(self, place: RunPlace, request_id: str) -> None:
        view = await self._chat.request(request_id)
        if view is not None:
            await self._show_reminder(place, view)

    async def _show_reminder(self, place: RunPlace, view: RequestView) -> None:
        """Put the request's reminder in its thread, unless it no longer waits."""
        if view.status is RequestStatus.OPEN:
            body = self._look.reminder(view)
            await self._deliveries.put(reminder_key(view.request.id), place.target, body)

    async def render_owed(self, kind: str, owner: str) -> None:
        """Fill in what the outbox holds as owed: a run's answer, a request's card or its
        reminder."""
        if kind == "card":
            await self.render_owed_card(owner)
        elif kind == "reminder":
            await self.render_owed_reminder(owner)
        else:
            await self.render_owed_answer(owner)

    async def render_owed_reminder(self, request_id: str) -> None:
        """Fill in the reminder a replica owed to the request's thread (one serving no platform
        of it, or one that died after reminding): shown only while the request still waits."""
        view = await self._chat.request(request_id)
        if view is None:
            return
        place = await self.place_of(view.request.run_id)
        if place is not None:
            await self._show_reminder(place, view)

    async def render_owed_card(self, request_id: str) -> None:
        """Fill in the card a request's opening left owed (whichever process drove its run:
        one with no renderer of this platform, too), and refresh the run's other cards, which
        that process decided without showing it here."""
        found = await self._chat.request(request_id)
        if found is None:
            return
        run_id = found.request.run_id
        shown = {}
        for view in await self._chat.requests_of(run_id):
            await self.show_card(view)
            shown[view.request.id] = view.status
        # A decision that landed as these were read was shown by its own renderer, perhaps
        # before a put here overwrote it: show what the store holds now, once more.
        for view in await self._chat.requests_of(run_id):
            if shown.get(view.request.id) is not view.status:
                await self.show_card(view)

    async def render_owed_answer(self, run_id: str) -> None:
        """Fill in the answer a run's end left owed to its thread (whichever process ended it:
        one that died before rendering it, too), from the run's journal."""
        place = await self.place_of(run_id)
        if place is None:
            return
        view = await self._chat.status(run_id)
        result = view.state.result
        if result is None:
            return
        for request in await self._chat.requests_of(run_id):
            await self.show_card(request)
        parts = list(enumerate(self._look.answer(result, run_id, view.record.updated_at)))
        # The first part replaces what the run's end owes: the continuations go in before it,
        # so that none is left out once nothing is owed any more.
        for part, body in reversed(parts):
            await self._deliveries.put(answer_key(run_id, part), place.target, body)
        self._places.pop(run_id, None)


# How progress names a call whose name no tool can have.
UNKNOWN_TOOL_TITLE: Final = "an unknown tool"


def step_title(tool: str) -> str:
    """A call's name as the thread's progress shows it: a tool's name as its catalog spells
    it; a name no tool can have was made up by the model (backticks, new lines, thousands of
    characters) and, written into Kestrel's own status lines, would lay them out as it
    likes, so it shows as ``UNKNOWN_TOOL_TITLE`` (the run's page has it exactly)."""
    try:
        check_tool_name(tool)
    except ValueError:
        return UNKNOWN_TOOL_TITLE
    return tool
