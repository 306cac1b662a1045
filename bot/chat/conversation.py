"""What people say to Kestrel in a chat thread, the same on every platform.

A mention starts a turn, runs a thread command (status, cancel, resume), or answers the
question the thread's run waits on; a plain reply in a thread answers that question or is
ignored; a click decides a request. Adapters parse their platform's payloads into these calls
and show the ``Outcome``: a note for its author alone, a status, the run that now goes on.
"""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass, replace
from typing import Final

from bot.chat.service import ChatService, RunView
from bot.chat.words import STORE_DOWN, cancel_not_counted, paused_words, unseen_run
from bot.domain import (
    TERMINAL_STATUSES,
    DecisionKind,
    Request,
    RequestKind,
    RunStatus,
    Session,
)
from bot.errors import ResumeRefused, StoreError, UnknownRun, UnreadableJournal, already_ended
from bot.people.policy import Actor, NotPermitted
from bot.prompter import DeferringPrompter
from bot.records import RunRecord

log = logging.getLogger("kestrel.chat")

THREAD_COMMANDS = ("status", "cancel", "resume")
HELP = (
    "Mention me with what you need and I work on it in the thread. In a thread with a run:"
    " `status`, `cancel`, `resume` (mention me with the word). `/kestrel runs` lists what"
    " waits on people."
)


@dataclass(frozen=True)
class Outcome:
    """What came of a message or a click."""

    note: str = ""  # for its author's eyes only; empty: nothing needs saying
    status: RunView | None = None  # a run's status to show its author
    running: str = ""  # the run that now goes on in this process (started or resumed)
    started: bool = False  # ``running`` is a new run of the thread (its row may not exist yet)


class Conversation:
    """Turns thread messages and clicks into calls on the chat service."""

    def __init__(self, chat: ChatService) -> None:
        self._chat = chat

    async def mention(
        self,
        session: Session,
        actor: Actor,
        text: str,
        *,
        run_id: str = "",
        answers: str | None = None,
    ) -> Outcome:
        """A message that mentions Kestrel (``text`` without the mention); a turn it starts
        is run ``run_id`` when the delivery reserved one. ``answers``: the question the thread
        waited on when the message came ("" for none; None: not known, the one it waits on now).
        """
        try:
            latest = await self._chat.latest(session)
        except UnreadableJournal as exc:
            # Said, not raised: raised, the message would be taken up again, and fail, for ever.
            return Outcome(note=str(exc))
        word = command_word(text)
        if word in THREAD_COMMANDS:
            picked = await self._picked(word, latest, answers, actor)
            if picked is not None:
                return await self._pick(word, *picked, actor)
            if latest is None:
                return Outcome(note="There is no run in this thread.")
            return await self.operate(word, await self._commanded(session, latest), actor)
        if not text.strip():
            return Outcome(note=HELP)
        if asks_help(text) and not answers and (latest is None or waiting_question(latest) is None):
            # "help" or a lone "?" asks how to use Kestrel, not the model: a run for it would
            # spend tokens and, in Discord, open a thread named "help".
            return Outcome(note=HELP)
        if answers:
            # Handled late or again, it answers that question or none, never a later one.
            return await self.decide(answers, DecisionKind.ANSWER, actor, text=text)
        if latest is not None and latest.record.status not in TERMINAL_STATUSES:
            question = waiting_question(latest) if answers is None else None
            if question is not None:
                return await self.decide(question.id, DecisionKind.ANSWER, actor, text=text)
            return Outcome(note=_still_going(latest, shared=self._chat.shared))
        try:
            # One unfinished run per thread, checked again as the run is created: a mention
            # that raced another here (or on another replica) past the look above starts none.
            live = await self._chat.submit_turn(
                text,
                user=actor,
                session=session,
                prompter=DeferringPrompter(),
                run_id=run_id,
                alone=True,
            )
        except NotPermitted as exc:
            return Outcome(note=str(exc))
        if not await self._chat.begun(live):
            return await self._not_begun(session)
        return Outcome(running=live.run_id, started=True)

    async def _picked(
        self, word: str, latest: RunView | None, answers: str | None, actor: Actor
    ) -> tuple[Request, str] | None:
        """The question and its option the command ``word`` picks, when the question a
        mention answers spells it and ``actor`` may answer that question now; else None: the
        word is the command (someone who may not answer, or no longer can, as the question
        expired, means the run)."""
        question = waiting_question(latest) if latest is not None else None
        if question is None or answers not in (None, question.id):
            return None
        option = next((o for o in question.options if command_word(o) == word), None)
        if option is None:
            return None
        refusal = await self._chat.check(question.id, DecisionKind.ANSWER, user=actor, text=option)
        return None if refusal else (question, option)

    async def _pick(self, word: str, question: Request, option: str, actor: Actor) -> Outcome:
        """The question asks "resume or cancel?": the command ``word`` picks that option, as a
        click would; its author is told how to act on the run itself."""
        answered = await self.decide(question.id, DecisionKind.ANSWER, actor, text=option)
        if answered.note:
            return answered
        return replace(answered, note=_taken_as_option(word, option, question.run_id))

    async def _commanded(self, session: Session, latest: RunView) -> str:
        """The run a thread command acts on: the newest, unless it ended while an older one is
        still unfinished (two runs of a store written before runs were created alone). That
        one refuses every new run of the thread, so it is the one to see and to cancel."""
        if latest.record.status not in TERMINAL_STATUSES:
            return latest.record.id
        unfinished = await self._chat.unfinished(session)
        return unfinished.id if unfinished is not None else latest.record.id

    async def _not_begun(self, session: Session) -> Outcome:
        """What to tell the author of a mention whose run was not created: another run of the
        thread came first, or the store failed (logged where it did)."""
        unfinished = await self._chat.unfinished(session)
        if unfinished is not None:
            return Outcome(note=_still_going(unfinished, shared=self._chat.shared))
        return Outcome(note="I could not start a run just now; mention me again in a moment.")

    async def question(self, session: Session) -> Request | None:
        """The question the thread's run waits on, if any: a plain reply answers it. None for
        a run whose journal cannot be read (its thread's replies are then taken as chatter).
        Asked of every message in a thread: the journal is read only when the thread's newest
        run has not ended (one that ended waits on nothing)."""
        unfinished = await self._chat.unfinished(session, look_back=1)
        if unfinished is None:
            return None
        try:
            view = await self._chat.status(unfinished.id)
        except UnreadableJournal as exc:
            log.warning("a reply in %s answers nothing: %s", session.id, exc)
            return None
        return waiting_question(view)

    async def answered_by(self, session: Session, pinned: str = "") -> str:
        """The request a plain thread reply answers: ``pinned``, the question open when the
        reply was taken in (handled late or again, it answers that one or none, never one
        asked after it), else the thread's question now; empty when it answers nothing."""
        if pinned:
            return pinned
        question = await self.question(session)
        return question.id if question is not None else ""

    async def operate(self, verb: str, run_id: str, actor: Actor) -> Outcome:
        """``status``, ``cancel`` or ``resume`` a run, as ``actor``."""
        try:
            if verb == "status":
                return Outcome(status=await self._chat.status(run_id, user=actor))
            if verb == "cancel":
                return Outcome(note=await self._chat.cancel(run_id, user=actor))
            live = await self._chat.resume(run_id, user=actor)
            if live is None:
                return Outcome(note=await self._idle(run_id))
            if live.cancelled_by:
                said = f"Run {run_id} was asked to cancel by {live.cancelled_by}: it ends cancelled"
                return Outcome(note=f"{said}, not resumed.", running=run_id)
        except UnknownRun:
            return Outcome(note=unseen_run(run_id))
        except (NotPermitted, ResumeRefused) as exc:
            return Outcome(note=str(exc))
        except StoreError as exc:
            log.error("%s of run %s: the store failed: %s", verb, run_id, exc)
            down = cancel_not_counted(run_id) if verb == "cancel" else STORE_DOWN
            return Outcome(note=store_note(exc, down))
        return Outcome(note=f"Resuming run {run_id}.", running=run_id)

    async def _idle(self, run_id: str) -> str:
        """Why a resume did nothing: the run ended, or still waits on people."""
        status = await self._chat.ended_as(run_id)
        if status is not None:
            return already_ended(run_id, status, "resume")
        return f"Run {run_id} has nothing to do yet: it still waits on people."

    async def decide(
        self,
        request_id: str,
        kind: DecisionKind,
        actor: Actor,
        *,
        text: str = "",
        card: str | None = None,
    ) -> Outcome:
        """Answer a request (a click, a form, a reply; ``card``: the message clicked); a
        refusal is a note for the actor."""
        # Only the request's run is needed here: the decision reads the journal if it resumes.
        run_id = await self._chat.run_of_request(request_id)
        if run_id is None:
            return Outcome(note="That request no longer exists.")
        decided = await self._chat.decide(
            run_id, request_id, kind, user=actor, text=text, card=card
        )
        if decided.resumed is None:
            # Refused; or recorded, and the run waits on more (a second approver) or could not
            # go on here (its tool set changed): the clicker is told which.
            return Outcome(note=decided.message)
        return Outcome(running=decided.resumed.run_id)


# What people put around a one-word command in chat: "cancel!", "`status`", ", resume."
COMMAND_MARKS = ".,:;!?*_~`'\"\u201c\u201d\u2018\u2019"


# No command with its marks is longer: a longer text is a request, read no further here.
COMMAND_ROOM = 64


def command_word(text: str) -> str:
    """The thread command ``text`` says, as a lowercase word, if it is one word with its
    punctuation, markup or invisible characters; else a word that is no command."""
    if len(text) > COMMAND_ROOM:
        return ""
    # A pasted word may carry a zero-width space or joiner (format characters) that no
    # one sees and ``strip`` keeps.
    visible = "".join(char for char in text if unicodedata.category(char) != "Cf")
    return visible.strip().strip(COMMAND_MARKS).strip().lower()


def asks_help(text: str) -> bool:
    """Whether a mention's ``text`` asks how to use Kestrel: nothing, ``help``, or marks alone
    (``?``), with the punctuation and markup a thread command may carry."""
    if not text.strip():
        return True
    return len(text) <= COMMAND_ROOM and command_word(text) in ("", "help")


def _taken_as_option(word: str, option: str, run_id: str) -> str:
    """What the author of a thread command that picked its question's option is told: how to
    act on the run itself, should they have meant that."""
    return (
        f'Taken as your answer to the question: "{option}". To {word} the run itself:'
        f" `/kestrel {word} {run_id}`."
    )


def run_id_said(text: str) -> str:
    """A run id as typed after a command: without the code marks and punctuation a pasted id
    comes with (a backquoted id and a colon); the core's ids hold none at their ends."""
    return text.strip().strip(COMMAND_MARKS)


def store_note(exc: StoreError, down: str = STORE_DOWN) -> str:
    """What to tell a person of a store failure: a journal no process can read is named (on-call
    repairs it; a click again would meet it again); anything else only as ``down`` says (for
    a click, ``NOT_RECORDED``), as the store's error names the database's host, user and
    schema."""
    return str(exc) if isinstance(exc, UnreadableJournal) else down


# What a run's open request waits on, as a mention that cannot start a run is told.
_WAITS_ON: Final = {
    RequestKind.WAIT_APPROVAL: "an approval of `{tool}`",
    RequestKind.WAIT_PLAN: "the approval of a plan",
    RequestKind.WAIT_EFFECT: "on-call to settle whether `{tool}` took effect",
    RequestKind.WAIT_USER: "an answer to its question",
}


def _still_going(view: RunView | RunRecord, *, shared: bool) -> str:
    """Why a mention starts no run: the thread's run is not done. A run that waits on people
    says on what: "suspended, wait for it" sent an approver who wrote "approve" to wait on
    themselves, when only the card's buttons decide it."""
    record = view.record if isinstance(view, RunView) else view
    requests = view.open_requests if isinstance(view, RunView) else []
    if requests:
        waits = dict.fromkeys(_WAITS_ON[r.kind].format(tool=r.tool) for r in requests)
        return (
            f"A run is still going in this thread: it waits on {', '.join(waits)}, decided with"
            " the buttons of its card above. Mention me again once it has answered, or cancel"
            " it first."
        )
    suspended = record.status is RunStatus.SUSPENDED
    paused = paused_words(record.stop_reason, shared=shared) if suspended else ""
    if paused:
        # Stopped where it ran (not waiting on anyone): waiting for it would wait for ever.
        return f"A run is still going in this thread. {paused}"
    return (
        f"A run is still going in this thread ({record.status.value})."
        " Wait for it, or cancel it first."
    )


def waiting_question(view: RunView) -> Request | None:
    """The oldest question the run waits on, if any."""
    for request in view.open_requests:
        if request.kind is RequestKind.WAIT_USER:
            return request
    return None
