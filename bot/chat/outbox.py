"""Delivering chat messages from the store's outbox: each shown once, none dropped.

An adapter says what a message should show (``Deliveries.put``); the store keeps it, and a
worker in any replica converges the platform to it: it posts a message the platform does not
show yet, edits one whose body changed, and retries with backoff when the platform refuses.
A post whose outcome is unknown (the process died, the connection broke after sending) is
looked up on the platform by its key before it is sent again, so it is never posted twice.

A run's end commits with a message of its thread's platform that says only that the run's
answer is owed (``owed_answer``): the worker that claims it has the platform's renderer fill
it in from the run's journal, so an answer is shown even when the process that ended the run
died before rendering it. A request's opening owes its card the same way (``owed_card``): a
run driven by a process with no renderer of the thread's platform (``kestrel runs approve``
at the terminal) still shows its next card in the thread, and a reminder is owed as it is
claimed (``owed_reminder``): a replica serving no platform of the thread's may claim it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from bot.chat.outbox_keys import owed_of
from bot.records import OutboxMessage
from bot.store import Outbox

log = logging.getLogger("kestrel.outbox")

BACKOFF_SECONDS = (1.0, 5.0, 15.0, 60.0, 300.0)
# A platform's Retry-After is lengthened by up to a tenth of it (at least 1 s, at most 30 s), so
# that the messages one limit put off, in one replica or several, do not all fall due at once.
JITTER_SHARE = 0.1
JITTER_SECONDS = (1.0, 30.0)
# A card not shown after this many tries, or put off this long at once (a refusal only a
# person lifts), is said in an error line: nobody in its thread can decide it.
UNSHOWN_CARD_TRIES = 3
UNSHOWN_CARD_WAIT_SECONDS = 600.0
# A worker shows what it claimed only within this share of the claim's time: past it, the claim
# may run out before the platform answers, and another replica may have claimed the message and
# shown a later version, which an edit from this older one would undo (a decided card shown
# open again). What is left lapses to whoever claims it next.
HOLD_SHARE = 0.5

# Fills in what a placeholder owes (puts the real messages): given what is owed ("answer",
# "card" or "reminder") and whose (the run's or the request's id).
RenderOwed = Callable[[str, str], Awaitable[None]]
# Whether to say now that a request's card (by the request's id) was never shown: it still
# waits on a decision, and nobody said so before (in this process, another, or before a restart).
SayUnshown = Callable[[str], Awaitable[bool]]


def _never_shown(message: OutboxMessage) -> str:
    """Why ``message`` has never been shown: the platform's last refusal, or "given up"; empty
    when it was shown, or nothing refused it."""
    if message.ref:
        return ""
    if message.error:
        return message.error.partition("\n")[0]
    given_up = message.delivered_version >= message.version and owed_of(message.body) is None
    return "given up" if given_up else ""


class DeliveryFailed(Exception):
    """The platform did not take the message; ``retry_after``: when to try again (the
    platform's own ask, or long for a refusal that waits on a person, e.g. a removed bot)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def after_waiting(seconds: float) -> float:
    """When to try again after a platform asked to wait ``seconds`` (its Retry-After): never
    sooner, and up to a small, bounded time later at random."""
    # Imported here: a process that meets no rate limit (every CLI command) does not pay for it.
    import random

    low, high = JITTER_SECONDS
    return seconds + random.uniform(0.0, min(max(seconds * JITTER_SHARE, low), high))


class Undeliverable(DeliveryFailed):
    """The place the message goes is gone for good (a deleted thread): it is given up, with one
    error line, not retried (a later version of it is tried again)."""


class MessageGone(DeliveryFailed):
    """The message to edit no longer exists (someone deleted it): post it again."""


class Target(Protocol):
    """Where a platform's message goes; the core carries it opaque and stores its JSON."""

    def as_json(self) -> dict[str, Any]:
        """The stored form (the platform reads it back)."""
        ...


class Transport(Protocol):
    """One platform's way of showing messages (raises ``DeliveryFailed`` when refused)."""

    platform: str

    async def post(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str:
        """Post a new message marked with ``key``; return the platform's id of it."""
        ...

    async def update(self, ref: str, target: dict[str, Any], body: dict[str, Any]) -> None:
        """Replace what message ``ref`` shows."""
        ...

    async def find(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str | None:
        """The id of a message already posted as ``key`` (showing ``body``), if there is one."""
        ...


class Deliveries:
    """The outbox worker of one platform in one process."""

    def __init__(
        self,
        store: Outbox,
        transport: Transport,
        owner: str,
        *,
        claim_seconds: float = 60.0,
        poll_seconds: float = 2.0,
    ) -> None:
        self._store = store
        self._transport = transport
        self._owner = owner
        self._claim_seconds = claim_seconds
        self._poll_seconds = poll_seconds
        self._wake = asyncio.Event()
        self._resting = asyncio.Event()  # set while ``run`` waits between rounds
        self._resting.set()
        self._stopped = False
        self._held_until = datetime.min.replace(tzinfo=UTC)  # this batch's claims, trusted
        self._render_owed: RenderOwed | None = None
        self._say_unshown: SayUnshown | None = None
        # The cards this process weighed saying were never shown: asked of the store once
        # each (its once-mark keeps them said once in all), forgotten once shown.
        self._said_unshown: set[str] = set()

    def renders_owed(self, render: RenderOwed) -> None:
        """Have ``render`` fill in the answers runs and the cards requests owe (the platform's
        thread renderer)."""
        self._render_owed = render

    def asks_unshown(self, say: SayUnshown) -> None:
        """Have ``say`` tell whether a card never shown is said so now: once in all, whatever
        process or restart takes it up, and only while its request waits (a decided one needs
        nobody)."""
        self._say_unshown = say

    async def put(self, key: str, target: Target, body: dict[str, Any]) -> None:
        """Make message ``key`` show ``body`` (posted or edited soon, by this or any replica)."""
        platform = self._transport.platform
        await self._store.put_message(f"{platform}:{key}", platform, target.as_json(), body)
        self._wake.set()

    async def holds(self, key: str) -> bool:
        """Whether the outbox has message ``key`` already (posted, or due to be)."""
        platform = self._transport.platform
        return await self._store.get_message(f"{platform}:{key}") is not None

    async def unshown(self, keys: Sequence[str]) -> dict[str, str]:
        """Why each message of ``keys`` (cards: ``card_key``) that has never been shown in its
        thread was not: the platform's last refusal, or "given up"; read in one query. A key
        shown, or not refused, is left out."""
        platform = self._transport.platform
        messages = await self._store.get_messages([f"{platform}:{key}" for key in keys])
        found = {message.key.partition(":")[2]: _never_shown(message) for message in messages}
        return {key: why for key, why in found.items() if why}

    async def run(self) -> None:
        """Deliver until ``stop``: at once when woken, else every ``poll_seconds``."""
        while not self._stopped:
            self._wake.clear()
            self._resting.clear()
            try:
                await self.deliver_due()
            except Exception:  # the store failed: try again at the next poll
                log.exception("outbox: delivery round failed")
            finally:
                self._resting.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll_seconds)

    async def idle(self) -> None:
        """Wait until ``run`` finished its round under way, if any (what it claimed is shown)."""
        await self._resting.wait()

    def wake(self) -> None:
        """Look for due messages now (one may have been written with other changes)."""
        self._wake.set()

    def stop(self) -> None:
        """Finish after the current round."""
        self._stopped = True
        self._wake.set()

    async def deliver_due(self) -> int:
        """Deliver every message due now; return how many the platform took."""
        delivered = 0
        while True:
            # Read before claiming: the claims run out no sooner than this.
            held = timedelta(seconds=self._claim_seconds * HOLD_SHARE)
            self._held_until = self._store.now() + held
            claimed = await self._store.claim_messages(
                self._owner, self._claim_seconds, platform=self._transport.platform
            )
            if not claimed:
                return delivered
            for message in claimed:
                if not self._holding():
                    break  # the rest lapse to the next claim, this worker's or another's
                delivered += await self._deliver(message)

    def _holding(self) -> bool:
        """Whether this batch's claims are still safely this worker's to act on."""
        return self._store.now() < self._held_until

    async def _deliver(self, message: OutboxMessage) -> int:
        owed = owed_of(message.body)
        if owed is not None:
            return await self._fill_in(message, *owed)
        try:
            ref = await self._show(message)
        except Undeliverable as exc:
            log.error("outbox: %s given up: %s", message.key, exc)
            await self._unshown(message, str(exc), given_up=True)
            await self._store.message_delivered(message.key, self._owner, message.version, "")
            return 0
        except DeliveryFailed as exc:
            late = exc.retry_after is not None and exc.retry_after >= UNSHOWN_CARD_WAIT_SECONDS
            if late or message.attempts >= UNSHOWN_CARD_TRIES:
                await self._unshown(message, str(exc), given_up=False)
            await self._failed(message, str(exc), exc.retry_after)
            return 0
        except Exception as exc:  # a bug or a broken connection: the post may have landed
            log.exception("outbox: delivering %s failed", message.key)
            await self._failed(message, f"{type(exc).__name__}: {exc}", None)
            return 0
        if ref is None:  # the lookup outlasted the claim: left to whoever claims it next
            return 0
        await self._store.message_delivered(message.key, self._owner, message.version, ref)
        self._said_unshown.discard(message.key)
        return 1

    async def _unshown(self, message: OutboxMessage, error: str, *, given_up: bool) -> None:
        """Say, once, that a request's card has never been shown in its thread: nobody there
        can decide it, so on-call must, and learns here which request and how. A request
        decided meanwhile (at the terminal) is not said: it waits on nobody."""
        _, _, key = message.key.partition(":")
        # Never posted: no ref (a placeholder filled in counts as delivered, yet shows nothing).
        if not key.startswith("card:") or message.ref:
            return
        if message.key in self._said_unshown:
            return
        request = key.removeprefix("card:")
        self._said_unshown.add(message.key)
        if not await self._first_to_say(request):
            return
        what = "given up" if given_up else f"tried {message.attempts} time(s), still trying"
        log.error(
            "outbox: the card of request %s has not reached its thread (%s; %s): nobody there"
            " can decide it; `kestrel runs pending` lists it with its run, and `kestrel runs"
            " approve` or `deny` RUN %s decides it",
            request,
            error.partition("\n")[0],
            what,
            request,
        )

    async def _first_to_say(self, request: str) -> bool:
        """Whether to say that ``request``'s card was never shown; when that cannot be told
        (no renderer here, the store failed), it is said: once too often loses nothing."""
        if self._say_unshown is None:
            return True
        try:
            return await self._say_unshown(request)
        except Exception:
            log.exception("outbox: whether to say request %s unshown could not be read", request)
            return True

    async def _fill_in(self, message: OutboxMessage, kind: str, owner: str) -> int:
        """Render the answer, card or reminder ``owner`` (a run, a request) owes in place of the
        placeholder; nothing is posted yet (the rendered body is the message's next version,
        due at once)."""
        if self._render_owed is None:  # never posted as it is: the platform's renderer fills it
            await self._failed(message, f"no renderer fills in owed {kind}s here", 60.0)
            return 0
        try:
            await self._render_owed(kind, owner)
        except Exception as exc:  # the store failed: the placeholder stays owed
            log.exception("outbox: rendering the %s of %s failed", kind, owner)
            await self._failed(message, f"{type(exc).__name__}: {exc}", None)
            return 0
        # The placeholder's version is done with; its claim goes, and with it its attempts,
        # unless an earlier one may have posted the message unrecorded (a card owed again).
        await self._store.message_delivered(message.key, self._owner, message.version, "")
        self._wake.set()
        return 0

    async def _show(self, message: OutboxMessage) -> str | None:
        """Post or edit ``message``; its ref, or None when a lookup took longer than the claim
        is safely held (nothing was sent)."""
        transport = self._transport
        ref = message.ref
        if not ref and message.attempts > 1:
            # An earlier attempt may have posted it without living to record so.
            ref = await transport.find(message.key, message.target, message.body) or ""
            if not self._holding():
                return None
        if not ref:
            return await transport.post(message.key, message.target, message.body)
        if message.delivered_version < message.version:
            try:
                await transport.update(ref, message.target, message.body)
            except MessageGone:
                log.info("outbox: %s was deleted; posting it again", message.key)
                return await transport.post(message.key, message.target, message.body)
        return ref

    async def _failed(self, message: OutboxMessage, error: str, retry_after: float | None) -> None:
        step = min(message.attempts, len(BACKOFF_SECONDS)) - 1
        delay = retry_after if retry_after is not None else BACKOFF_SECONDS[max(step, 0)]
        log.warning("outbox: %s not delivered (%s); retrying in %.0fs", message.key, error, delay)
        retry_at = self._store.now() + timedelta(seconds=delay)
        await self._store.message_failed(message.key, self._owner, retry_at, error)
