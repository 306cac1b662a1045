"""What a thread shows while its run works.

Slack's AI-app surfaces first: the thread's status line (``assistant.threads.setStatus``) and
one streamed message whose task updates name each tool call (``chat.startStream`` and
friends). Slack clears a status after two minutes without a message and ends a stream left
without updates, so a live run's surfaces are touched again every ``refresh_seconds``. Where
the workspace refuses these methods, one status message is posted and edited in place
through the outbox instead; never a new message per step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from slack_sdk.errors import SlackApiError
from slack_sdk.models.messages.chunk import TaskUpdateChunk
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.look import thread_of
from adapters.slack.status import working_message
from bot.chat.outbox import Deliveries
from bot.chat.outbox_keys import status_key
from bot.chat.threads import RunPlace, StepStatus
from bot.text import unmask_links

log = logging.getLogger("kestrel.slack")

STREAM_ENDED = frozenset({"message_not_in_streaming_state", "message_not_found"})
LOADING = ["Reading the thread…", "Thinking…", "Checking the tools…"]


@dataclass
class _Live:
    """One run's surfaces in one thread."""

    place: RunPlace
    stream_ts: str = ""
    fallback: bool = False  # this run's stream stopped taking steps: its message instead
    steps: list[str] = field(default_factory=list)
    running: dict[str, tuple[str, float]] = field(default_factory=dict)


class Progress:
    """Status line, task stream or fallback message, per live run."""

    def __init__(
        self, client: AsyncWebClient, deliveries: Deliveries, *, refresh_seconds: float = 90.0
    ) -> None:
        self._client = client
        self._deliveries = deliveries
        self._refresh_seconds = refresh_seconds
        self._live: dict[str, _Live] = {}
        # None until the workspace has answered once; False: use the fallback message.
        self._status_ok: bool | None = None
        self._stream_ok: bool | None = None

    async def working(self, place: RunPlace, status: str = "") -> None:
        """Show at once that Kestrel works on this thread (a mention, a resume)."""
        if self._status_ok is False:
            return
        thread = thread_of(place.target)
        try:
            await self._client.assistant_threads_setStatus(
                channel_id=thread.channel,
                thread_ts=thread.thread_ts,
                status=status or "is working…",
                loading_messages=LOADING,
            )
            self._status_ok = True
        except SlackApiError as exc:
            self._status_ok = False
            log.info("slack: no thread status here (%s); using a status message", _error(exc))

    def follow(self, run_id: str, place: RunPlace) -> None:
        """Start tracking a live run's steps (idempotent)."""
        self._live.setdefault(run_id, _Live(place))

    async def step(self, run_id: str, call_id: str, title: str, status: StepStatus) -> None:
        """A tool call started or finished."""
        live = self._live.get(run_id)
        if live is None:
            return
        title = unmask_links(title)  # the status line and the task stream show it as written
        if status == "in_progress":
            live.running[call_id] = (title, time.monotonic())
            live.steps.append(f"{title}…")
        else:
            live.running.pop(call_id, None)
            mark = "done" if status == "complete" else "failed"
            live.steps.append(f"{title}: {mark}")
        if status == "in_progress" and self._status_ok:
            await self.working(live.place, f"is running {title}…")
        await self._show(run_id, live, TaskUpdateChunk(id=call_id, title=title, status=status))

    async def stop(self, run_id: str, note: str = "") -> None:
        """The run suspended or ended here: close its stream; the thread's next message clears
        the status line."""
        live = self._live.pop(run_id, None)
        if live is None:
            return
        if live.stream_ts:
            await self._stop_stream(live, note)
        if (self._stream_ok is False or live.fallback) and live.steps:
            await self._fallback(run_id, live, note or "stopped")

    async def refresh(self) -> None:
        """Touch every live run's surfaces so that Slack does not clear them."""
        now = time.monotonic()
        for run_id, live in list(self._live.items()):
            if self._status_ok:
                await self.working(live.place)
            for call_id, (title, since) in list(live.running.items()):
                details = f"still running after {int(now - since)} s"
                chunk = TaskUpdateChunk(
                    id=call_id, title=title, status="in_progress", details=details
                )
                await self._show(run_id, live, chunk)

    async def keep_alive(self) -> None:
        """``refresh`` every ``refresh_seconds`` until cancelled."""
        while True:
            await asyncio.sleep(self._refresh_seconds)
            try:
                await self.refresh()
            except Exception:
                log.exception("slack: refreshing progress failed")

    async def _show(self, run_id: str, live: _Live, chunk: TaskUpdateChunk) -> None:
        if self._stream_ok is False or live.fallback:
            await self._fallback(run_id, live)
            return
        try:
            await self._stream(live, chunk)
        except SlackApiError as exc:
            error = _error(exc)
            if error == "ratelimited":
                return  # this step is not shown; the stream and the next steps are
            if not live.stream_ts:
                self._stream_ok = False  # the workspace refuses streams: every run falls back
                log.info("slack: no streaming here (%s); using a status message", error)
            else:
                log.info("slack: the stream stopped taking steps (%s); using a message", error)
                await self._stop_stream(live, "")
                live.fallback = True
            await self._fallback(run_id, live)

    async def _stream(self, live: _Live, chunk: TaskUpdateChunk) -> None:
        thread = thread_of(live.place.target)
        if live.stream_ts:
            try:
                await self._client.chat_appendStream(
                    channel=thread.channel, ts=live.stream_ts, chunks=[chunk]
                )
                return
            except SlackApiError as exc:
                if _error(exc) not in STREAM_ENDED:
                    raise
                live.stream_ts = ""  # Slack ended it (left without updates): start another
        reply = await self._client.chat_startStream(
            channel=thread.channel,
            thread_ts=thread.thread_ts,
            recipient_team_id=thread.team,
            recipient_user_id=live.place.requested_by,
            chunks=[chunk],
            task_display_mode="timeline",
        )
        ts = reply.get("ts")
        if not ts:  # answered, but with no message to append the next steps to
            raise SlackApiError("chat.startStream answered without a ts", reply)  # type: ignore[no-untyped-call]
        self._stream_ok = True
        live.stream_ts = str(ts)

    async def _stop_stream(self, live: _Live, note: str) -> None:
        ts, live.stream_ts = live.stream_ts, ""
        try:
            await self._client.chat_stopStream(
                channel=thread_of(live.place.target).channel, ts=ts, markdown_text=note or None
            )
        except SlackApiError as exc:
            log.info("slack: closing a stream failed: %s", _error(exc))

    async def _fallback(self, run_id: str, live: _Live, note: str = "") -> None:
        lines = [*live.steps, note] if note else live.steps
        body = working_message(lines).body()
        await self._deliveries.put(status_key(run_id), live.place.target, body)


def _error(exc: SlackApiError) -> str:
    return str(exc.response.get("error") or exc)
