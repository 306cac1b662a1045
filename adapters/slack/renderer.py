"""The core's events as a Slack thread shows them: progress, cards, reminders, the answer.

Events arrive on the run's task and must not block it: each run's events queue up and are
rendered in order by a task of their own. Messages that must not be lost or doubled (cards,
the answer, reminders) go through the outbox; progress is best effort.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import assert_never

from adapters.slack.blocks import (
    ClosedCard,
    answer_continuations,
    answer_message,
    principal,
    request_card,
)
from adapters.slack.ids import (
    SlackThread,
    answer_key,
    card_key,
    notice_key,
    parse_thread_session,
)
from adapters.slack.progress import Progress, StepStatus
from bot.chat import ChatService, RequestView
from bot.domain import RequestStatus, TerminalResult, ToolOutcome
from bot.events import (
    AdvisoryEvent,
    AnswerSuppliedEvent,
    Event,
    JournalFailedEvent,
    ModelTurnEvent,
    PanicEvent,
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
from bot.outbox import Deliveries

log = logging.getLogger("kestrel.slack")


@dataclass(frozen=True)
class RunThread:
    """A Slack run's thread and who asked for it."""

    thread: SlackThread
    requested_by: str

    @property
    def target(self) -> dict[str, str]:
        """Where the outbox posts into this thread."""
        return {"channel": self.thread.channel, "thread_ts": self.thread.thread_ts}


class SlackRenderer:
    """An event sink that keeps each Slack run's thread up to date."""

    def __init__(self, chat: ChatService, deliveries: Deliveries, progress: Progress) -> None:
        self._chat = chat
        self._deliveries = deliveries
        self._progress = progress
        self._threads: dict[str, RunThread | None] = {}
        self._queues: dict[str, asyncio.Queue[Event]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

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

    async def thread_of(self, run_id: str) -> RunThread | None:
        """The run's Slack thread; None for a run of another platform."""
        if run_id in self._threads:
            return self._threads[run_id]
        session = await self._chat.session_of(run_id)
        thread = parse_thread_session(session.id) if session else None
        found = None
        if thread is not None:
            view = await self._chat.status(run_id)
            found = RunThread(thread, view.record.requested_by)
        self._threads[run_id] = found
        return found

    async def show_card(self, view: RequestView) -> None:
        """Post or edit a request's card to show where it stands."""
        where = await self.thread_of(view.request.run_id)
        if where is None:
            return
        closed = None
        if view.status is not RequestStatus.OPEN:
            closed = ClosedCard(status=view.status, decision=view.decision)
        message = request_card(
            view.request, reason=view.reason, may_answer=view.may_answer, closed=closed
        )
        await self._deliveries.put(card_key(view.request.id), where.target, message.body())

    async def refresh_card(self, request_id: str) -> None:
        """Show the request's card as the store has it now."""
        view = await self._chat.request(request_id)
        if view is not None:
            await self.show_card(view)

    async def _drain(self, run_id: str, queue: asyncio.Queue[Event]) -> None:
        try:
            while not queue.empty():
                event = queue.get_nowait()
                try:
                    await self._render(event)
                except Exception:
                    log.exception("slack: rendering %s of %s failed", event.kind, run_id)
        finally:
            if self._queues.get(run_id) is queue:
                del self._queues[run_id]

    async def _render(self, event: Event) -> None:
        where = await self.thread_of(event.run_id)
        if where is None:
            return
        progress = self._progress
        match event:
            case RunStartedEvent() | RunResumedEvent():
                progress.follow(event.run_id, where.thread, where.requested_by)
                if isinstance(event, RunResumedEvent):
                    await progress.working(where.thread)
            case ToolStartedEvent():
                await progress.step(event.run_id, event.call_id, event.tool, "in_progress")
            case ToolExitEvent():
                await self._tool_exit(event)
            case RequestOpenedEvent():
                await self.refresh_card(event.request.id)
            case AnswerSuppliedEvent() | RequestExpiredEvent():
                await self.refresh_card(event.request_id)
            case RequestReminderEvent():
                await self._remind(where, event)
            case RunSuspendedEvent():
                await progress.stop(event.run_id, "Waiting on people.")
            case RunEndedEvent():
                await progress.stop(event.run_id)
                await self._ended(where, event.run_id, event.result)
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
        status: StepStatus = "complete" if event.outcome is ToolOutcome.OK else "error"
        await self._progress.step(event.run_id, event.call_id, event.tool, status)

    async def _remind(self, where: RunThread, event: RequestReminderEvent) -> None:
        view = await self._chat.request(event.request.id)
        if view is None or view.status is not RequestStatus.OPEN:
            return
        who = ", ".join(principal(p) for p in view.may_answer) or "someone allowed to answer"
        text = f"Reminder: the request for `{view.request.tool}` above still waits on {who}."
        key = notice_key(event.run_id, f"remind:{event.request.id}")
        await self._deliveries.put(key, where.target, {"text": text})

    async def _ended(self, where: RunThread, run_id: str, result: TerminalResult) -> None:
        for view in await self._chat.requests_of(run_id):
            await self.show_card(view)
        message = answer_message(result, run_id=run_id)
        await self._deliveries.put(answer_key(run_id), where.target, message.body())
        # An answer longer than one message goes on below it, in order.
        for i, more in enumerate(answer_continuations(result), start=1):
            await self._deliveries.put(notice_key(run_id, f"answer:{i}"), where.target, more.body())
