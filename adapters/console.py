"""The embedded default adapter: a terminal chat that asks approvals and questions inline."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import errno
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, TextIO, assert_never

from bot.chat.cards import PLAN_BINDING, off_plan_words, options_shown, plan_steps
from bot.chat.contract import (
    Actor,
    NotPermitted,
    PolicyRules,
    ResumeRefused,
    StoreError,
    already_ended,
    answer_refusal,
    match_option,
    requester_approves,
)
from bot.chat.handles import RunHandle, RunResult
from bot.chat.service import ChatService
from bot.chat.words import origin_lines, stop_reason_words
from bot.domain import (
    Decision,
    DecisionKind,
    Request,
    RequestKind,
    RequestStatus,
    RunStatus,
    Session,
    ToolOutcome,
    as_flag,
    how_answered,
    new_id,
)
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
from bot.text import flattened, printable, unmask_links

# Typed at any prompt, ends the chat as the end of input does (/exit as other REPLs spell it).
QUIT: Final = frozenset({"/quit", "/exit"})
RUNS_LISTED: Final = 10  # what /runs lists when not told how many
RUNS_MOST: Final = 100
HELP = """commands:
  /runs [N]          the N most recent runs (10)
  /resume RUN        resume a suspended run here
  /cancel RUN        cancel a run
  /quit, /exit       leave, at any prompt (Ctrl-D works too); what it asked stays open
A message that starts with / is sent as written after a second /: //var/log is full.
Ctrl-C while a run works stops its model call or command and suspends it; a second Ctrl-C
leaves the chat. At an approval or a question, Ctrl-C leaves it for later, as l does.
SIGTERM, or the terminal closing, suspends the run and leaves."""


class ConsoleIO:
    """Lines in from a reader thread (so a blocked read never holds the event loop), text out."""

    def __init__(self, stdin: TextIO | None = sys.stdin, stdout: TextIO = sys.stdout) -> None:
        self._stdin = stdin  # None: closed before the chat started (``kestrel chat <&-``)
        self._stdout = stdout
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._started = False
        self._ended = False  # end of input, or /quit: every prompt after it ends too
        self.lost: OSError | None = None  # why stdout could not be written, if it could not

    def _start(self) -> None:
        loop = asyncio.get_running_loop()

        def pump() -> None:
            try:
                for line in _lines_of(self._stdin):
                    loop.call_soon_threadsafe(self._lines.put_nowait, line)
                loop.call_soon_threadsafe(self._lines.put_nowait, None)
            except RuntimeError:
                return  # the chat ended and its loop closed first: nobody reads these lines

        threading.Thread(target=pump, name="console-stdin", daemon=True).start()
        self._started = True

    async def readline(self, prompt: str) -> str | None:
        """Show ``prompt`` and wait for one line; None at end of input, and from ``/quit`` on,
        typed at any prompt (an approval's or a question's too: it is left open, as Ctrl-D
        leaves it, and the chat ends): then the prompt is not shown, nobody being there to
        answer it."""
        if self._ended:
            return None
        if not self._started:
            self._start()
        self.write(prompt, end="")
        if self._ended:  # the prompt could not be shown (``lost``): nobody is asked
            return None
        line = await self._lines.get()
        if line is not None and self._stdin is not None and not self._stdin.isatty():
            self.write(line)
        if line is None or line.strip() in QUIT:
            if line is None:
                self.write("")  # the line the terminal's Ctrl-D did not end
            self._ended = True
            return None
        return line

    def write(self, text: str, end: str = "\n", *, exact: bool = False) -> None:
        """Print and flush; model and tool text never reaches the terminal as control codes,
        nor, unless ``exact`` (a call's arguments, shown as they are), as a link whose label
        hides its target."""
        shown = printable(text)
        try:
            self._stdout.write((shown if exact else unmask_links(shown)) + end)
            self._stdout.flush()
        except OSError as exc:
            # Nothing more can be shown: the rest goes nowhere.
            _to_nowhere(self._stdout)
            if exc.errno == errno.EIO:
                return  # the terminal hung up: SIGHUP stops the chat, its run suspends
            # Its reader left (``| head``), or the disk is full: nothing more is asked either,
            # every prompt ending as at the end of input (what it asked stays open, its run
            # suspended), and the chat ends saying why (``lost``).
            self.lost = exc
            self._ended = True


def _to_nowhere(stream: TextIO) -> None:
    """Send the rest of ``stream`` to /dev/null: Python's last flush of what a failed write
    left in its buffer would fail again, and end the process with status 120."""
    with contextlib.suppress(OSError, ValueError):  # no descriptor of its own: nothing flushes
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def _lines_of(stdin: TextIO | None) -> Iterator[str]:
    """The lines of ``stdin``, read from its file descriptor when it has one; none when there
    is no stdin at all.

    A thread blocked in ``readline`` holds the stream's lock, and Python's exit waits for that
    lock to close the stream: leaving on Ctrl-C would hang until the next line was typed.
    """
    if stdin is None:
        return
    try:
        fd = stdin.fileno()
    except (AttributeError, OSError, ValueError):
        yield from (_text(line.rstrip("\n")) for line in iter(stdin.readline, ""))
        return
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    while chunk := _read(fd):
        *lines, pending = (pending + decoder.decode(chunk)).split("\n")
        yield from map(_text, lines)
    pending += decoder.decode(b"", final=True)
    if pending:
        yield _text(pending)


def _read(fd: int) -> bytes:
    """The next bytes typed; none once the terminal hung up (EIO), as at the end of input."""
    try:
        return os.read(fd, 65536)
    except OSError as exc:
        if exc.errno != errno.EIO:
            raise
        return b""


def _text(line: str) -> str:
    """A line as text: a NUL, which no PostgreSQL text column keeps, read as a byte that is not
    UTF-8 is (U+FFFD)."""
    return line.replace("\x00", "\ufffd")


# Each prompt's choices: the letter it shows, and the word that letter stands for.
_APPROVAL_WORDS: Final = {"a": "approve", "r": "run", "d": "deny", "l": "later"}
_PLAN_WORDS: Final = {"a": "approve", "s": "step", "d": "deny", "l": "later"}
_EFFECT_WORDS: Final = {"r": "retry", "d": "done", "f": "failed", "l": "later"}


class _Later(Exception):
    """Ctrl-C at a prompt: the request it asks is left for later, as ``l`` leaves it."""


class ConsolePrompter:
    """The person at the terminal: answers approvals and questions inline, or says later."""

    def __init__(self, io: ConsoleIO, user: str) -> None:
        self._io = io
        self._user = user
        self._reading: asyncio.Future[str | None] | None = None  # a prompt waiting for a line

    @property
    def present(self) -> bool:
        """Someone is at the terminal."""
        return True

    async def ask(self, request: Request) -> Decision | None:
        """Ask inline; None (defer, the run suspends) on "later", at end of input, or when
        ``later`` cut the prompt short."""
        try:
            return await self._asked(request)
        except _Later:
            self._io.write("\n  (left for later)")
            return None

    def later(self) -> bool:
        """Leave the request being asked for later (Ctrl-C at its prompt): its run suspends on
        it, written down under the id its card showed; False when no prompt is waiting."""
        if self._reading is None or self._reading.done():
            return False
        self._reading.cancel()
        return True

    async def _asked(self, request: Request) -> Decision | None:
        if request.kind is RequestKind.WAIT_APPROVAL:
            return await self._approval(request)
        if request.kind is RequestKind.WAIT_EFFECT:
            return await self._effect(request)
        if request.kind is RequestKind.WAIT_PLAN:
            return await self._plan(request)
        return await self._question(request)

    async def _readline(self, prompt: str) -> str | None:
        """The line typed at ``prompt``; raises ``_Later`` when ``later`` cut it short."""
        reading = asyncio.ensure_future(self._io.readline(prompt))
        self._reading = reading
        try:
            return await reading
        except asyncio.CancelledError:
            if not reading.cancelled() or asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise  # the run itself was cancelled: not a Ctrl-C at this prompt
            raise _Later from None
        finally:
            self._reading = None

    async def _approval(self, request: Request) -> Decision | None:
        args = json.dumps(request.arguments, sort_keys=True)
        self._io.write(f"  ┌ approval needed: {request.tool} {args}", exact=True)
        if request.off_plan:
            self._io.write(f"  │ {off_plan_words(request)}")
        for said in origin_lines(request.origins):
            self._io.write(f"  │ {said}", exact=True)
        self._asked_by(request)
        choices = {"a": DecisionKind.APPROVE, "r": DecisionKind.APPROVE_ALWAYS}
        choice = await self._chosen(
            "  └ [a]pprove once, approve for this [r]un, [d]eny, [l]ater? ", _APPROVAL_WORDS
        )
        if choice in choices:
            return self._decide(request, choices[choice])
        if choice == "d":
            return await self._denied(request, "    reason (optional): ")
        return None

    async def _denied(self, request: Request, prompt: str) -> Decision | None:
        """A denial, with the reason typed at ``prompt``; None (later) on ``/quit`` or the end
        of input there, which leave what was asked open, at this prompt as at every other."""
        reason = await self._readline(prompt)
        if reason is None:
            return None
        return self._decide(request, DecisionKind.DENY, reason)

    async def _chosen(self, prompt: str, words: Mapping[str, str]) -> str:
        """The letter of the choice typed at ``prompt``, asked until one is: its letter or its
        word (``a``, ``approve``); an empty line or the end of input is later (``l``).
        Never a word's first letter: "reject" would approve for the run, "abort" approve."""
        while True:
            line = await self._readline(prompt)
            said = (line or "l").strip().lower() or "l"
            for letter, word in words.items():
                if said in (letter, word):
                    return letter
            *others, last = words
            listed = f"{', '.join(others)} or {last}"
            self._io.write(f"    ! “{said}” is not one of the choices: answer {listed}")

    def _asked_by(self, request: Request) -> None:
        self._io.write(f"  │ asked by {request.requested_by or 'the run'}; request {request.id}")
        if request.deadline:
            self._io.write(f"  │ expires {request.deadline:%Y-%m-%d %H:%M UTC}")

    async def _plan(self, request: Request) -> Decision | None:
        self._io.write(f"  ┌ plan approval needed: {request.prompt}")
        if request.off_plan:
            self._io.write(f"  │ {off_plan_words(request)}")
        for step in plan_steps(request):
            self._io.write(f"  │ {step.headline}", exact=True)
            if step.why:
                self._io.write(f"  │    {step.why}")
            for origin in step.origins:
                self._io.write(f"  │    {origin}", exact=True)
        self._io.write(f"  │ {PLAN_BINDING}")
        self._asked_by(request)
        choice = await self._chosen(
            "  └ [a]pprove plan, approve [s]tep by step, [d]eny, [l]ater? ", _PLAN_WORDS
        )
        if choice == "a":
            return self._decide(request, DecisionKind.APPROVE)
        if choice == "s":
            return self._decide(request, DecisionKind.STEP_BY_STEP)
        if choice == "d":
            return await self._denied(request, "    reason: ")
        return None

    async def _effect(self, request: Request) -> Decision | None:
        self._io.write(f"  ? {request.prompt}")
        kinds = {"r": DecisionKind.RETRY, "d": DecisionKind.DONE, "f": DecisionKind.FAILED}
        choice = await self._chosen(
            "    [r]etry, mark [d]one, mark [f]ailed, [l]ater? ", _EFFECT_WORDS
        )
        kind = kinds.get(choice)
        return self._decide(request, kind) if kind else None

    async def _question(self, request: Request) -> Decision | None:
        self._io.write(f"  ? {request.prompt}")
        if request.options:
            return await self._choice(request)
        line = await self._readline("    answer (empty = later): ")
        if not line or not line.strip():
            return None
        return self._decide(request, DecisionKind.ANSWER, line.strip())

    async def _choice(self, request: Request) -> Decision | None:
        """One of the question's options, asked until given; None on later or end of input."""
        options = " / ".join(options_shown(request))
        while True:
            line = await self._readline(f"    answer {options}, or [l]ater: ")
            if line is None or not line.strip():
                return None
            picked = match_option(line, request.options)
            if picked is not None:
                return self._decide(request, DecisionKind.ANSWER, picked)
            # An option spelled "l" wins over later: the question's options come first.
            if line.strip().lower() == "l":
                return None
            refusal = answer_refusal(line, request.options)
            self._io.write(f"    ! {refusal.reason if refusal else line}")

    def _decide(self, request: Request, kind: DecisionKind, text: str = "") -> Decision:
        return Decision(request_id=request.id, kind=kind, text=text, by=self._user)


# How many lines of a tool's output the chat shows, and how much of each.
EXCERPT_LINES = 3
EXCERPT_WIDTH = 100
# A command's last line says how it exited; the chat says so only when it failed.
_EXIT_OK = "[exit status 0]"
# What the chat says of a call that did not run, by its exit, in plain words.
_NOT_RUN = {
    ToolOutcome.UNKNOWN_TOOL: "no such tool",
    ToolOutcome.HOOK_DENIED: "blocked",
    ToolOutcome.INVALID_ARGUMENTS: "refused its arguments",
    ToolOutcome.TIMEOUT: "timed out",
    ToolOutcome.ERROR: "failed",
}


def excerpt(output: str) -> list[str]:
    """The first lines of a tool's output, each cut short, and how many more there are."""
    lines = output.rstrip("\n").split("\n") if output.strip() else []
    if lines and lines[-1] == _EXIT_OK:
        lines.pop()
    shown = [line if len(line) <= EXCERPT_WIDTH else line[:EXCERPT_WIDTH] + "…" for line in lines]
    more = len(lines) - EXCERPT_LINES
    return shown[:EXCERPT_LINES] + ([f"… {more} more line(s)"] if more > 0 else [])


class ConsoleRenderer:
    """Shows a run's progress as it happens, in plain words."""

    def __init__(self, io: ConsoleIO, user: str = "console") -> None:
        self._io = io
        self._user = user

    def emit(self, event: Event) -> None:
        """Render the events a person at the terminal wants to see."""
        match event:
            case ToolStartedEvent(tool=tool, arguments=arguments):
                self._io.write(f"  ⚙ {tool} {json.dumps(arguments, sort_keys=True)}", exact=True)
            case ToolExitEvent():
                self._exit(event)
            case ModelTurnEvent(text=text, calls=calls) if calls and text:
                self._io.write(f"  … {text}")
            case AdvisoryEvent(text=text):
                self._io.write(f"  ! {text}")
            case (
                ModelTurnEvent()
                | RunStartedEvent()
                | RunResumedEvent()
                | RequestOpenedEvent()
                | AnswerSuppliedEvent()
                | RequestReminderEvent()
                | RequestDecidedEvent()
                | RequestExpiredEvent()
                | RunSuspendedEvent()
                | RunEndedEvent()
                | RunTakenOverEvent()
                | JournalFailedEvent()
                | PanicEvent()
            ):
                pass  # the prompter asks requests inline; the chat reports how the run ended
            case _:
                assert_never(event)

    def _exit(self, event: ToolExitEvent) -> None:
        """How a call ended: a short excerpt of what it printed, or why it did not run."""
        outcome, tool = event.outcome, event.tool
        if outcome is ToolOutcome.OK:
            for line in excerpt(event.output):
                self._io.write(f"    │ {line}")
        elif outcome is ToolOutcome.DEFERRED:
            waiting = "an answer" if tool.startswith("ask_human") else "approval"
            self._io.write(f"  … {tool}: waiting for {waiting}")
        elif outcome is ToolOutcome.GATE_DENIED:
            self._io.write(f"  ✗ {tool}: {self._denial(event.output)}")
        elif outcome is ToolOutcome.TAKEN_OVER:
            self._io.write(f"  … {tool}: another replica took the run over")
        else:
            self._io.write(f"  ✗ {tool}: {_NOT_RUN.get(outcome, 'not run')}")
            for line in excerpt(event.output):
                self._io.write(f"    │ {line}")

    def _denial(self, output: str) -> str:
        """The gate's word, with the person at this terminal called "you"."""
        mine = f"denied by {self._user}"
        if output == mine or output.startswith(mine + ":"):
            return "denied by you" + output[len(mine) :]
        return output


def _waiting_for(request: Request) -> str:
    """What a suspended run waits for, in plain words, with the request's id."""
    what = {
        RequestKind.WAIT_APPROVAL: f"waiting for approval of {request.tool}",
        RequestKind.WAIT_USER: "waiting for an answer",
        RequestKind.WAIT_EFFECT: f"waiting for on-call to settle {request.tool}",
        RequestKind.WAIT_PLAN: f"waiting for approval of a plan of {len(request.steps)} steps",
    }[request.kind]
    return f"{what} ({request.id})"


def _elsewhere(
    run_id: str, open_requests: list[Request], user: str, rules: PolicyRules, acting_as: str
) -> str:
    """How a suspended run is moved on from another shell by ``user`` (an approval of their own
    run: as someone else, unless ``rules`` let them approve it): the command answering each
    request it waits on (a resume would find it still waiting), else ``kestrel runs resume``.
    ``acting_as``: ``user``, when a bare command there would act as someone else."""
    hows = [
        how_answered(
            r.kind,
            r.run_id,
            r.id,
            r.options,
            requester=_as_someone_else(r, user, rules),
            acting_as=acting_as,
        )
        for r in open_requests
    ]
    if not hows:
        return f", or `kestrel runs resume {run_id}{as_flag(acting_as)}`"
    return ", or from another shell: " + "; ".join(hows)


def _as_someone_else(request: Request, user: str, rules: PolicyRules) -> bool:
    """Whether ``user``, the run's requester, approves ``request`` only as someone else."""
    return request.requested_by == user and not requester_approves(rules, request.approvals_needed)


class ConsoleChat:
    """The terminal chat: one session, turns one after another."""

    def __init__(
        self,
        chat: ChatService,
        io: ConsoleIO,
        user: str = "console",
        on_stop: Callable[[int], object] | None = None,
        rules: PolicyRules | None = None,
        acting_as: str = "",
    ) -> None:
        self.chat = chat
        self.io = io
        self.user = user
        # The user, when a command pasted in another shell would act as someone else (they
        # gave --as): the commands the chat prints name them.
        self.acting_as = acting_as
        # The policy's rules: whether the user may approve their own run from another shell.
        self.rules = rules or PolicyRules()
        self.actor = Actor(user)
        self.prompter = ConsolePrompter(io, user)
        self.session = Session(id=new_id("ses"), platform="console")
        self._live: RunHandle | None = None
        self._asking: asyncio.Future[RunHandle | None] | None = None  # a resume asking here
        self._interrupts = 0
        # SIGTERM or SIGHUP (the terminal closed) arrived: leave once the run under way has
        # suspended, and exit as that signal says.
        self.terminated: signal.Signals | None = None
        self.suspended: str | None = None  # the run under way when it came, if any
        self._leaving = False
        # Told of each signal that stops the chat (a SIGTERM, the Ctrl-C that leaves, any once
        # leaving): the command's stop deadline, which a later one ends at once.
        self._on_stop = on_stop or (lambda _signum: None)
        chat.subscribe(ConsoleRenderer(io, user))

    def under_way(self) -> str | None:
        """The run this chat follows now, if any."""
        return None if self._live is None else self._live.run_id

    async def run(self, banner: str) -> None:
        """Read messages until end of input or /quit."""
        self.io.write(banner)
        with self._signals():
            try:
                await self._read_turns()
            except asyncio.CancelledError:
                if not self.terminated:
                    raise  # a second Ctrl-C: leave; the caller's shutdown suspends the run
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    async def _read_turns(self) -> None:
        while not self.terminated:
            line = await self.io.readline("you> ")
            if line is None:
                return
            if line.strip():
                await self._handle(line.strip())

    async def _handle(self, line: str) -> None:
        if line.startswith("//"):
            line = line[1:]
        elif line.startswith("/"):
            await self._command(line)
            return
        try:
            live = await self.chat.submit_turn(
                line, user=self.actor, session=self.session, prompter=self.prompter
            )
        except NotPermitted as exc:
            self.io.write(f"  ! {exc}")
            return
        await self._follow(live)

    async def _follow(self, live: RunHandle) -> None:
        self._live, self._interrupts = live, 0
        try:
            state = await self.chat.wait(live)
        finally:
            self._live = None
        self._report(state)

    def _report(self, state: RunResult) -> None:
        result = state.result
        if result is None:
            self._suspended(state.run_id, state.open_requests)
            return
        if result.status is RunStatus.COMPLETED:
            self.io.write(f"kestrel> {result.text}")
            return
        reason = stop_reason_words(result.stop_reason)
        self.io.write(f"kestrel> (the run {result.status.value}: {reason}) {result.error}")

    def _suspended(self, run_id: str, open_requests: list[Request]) -> None:
        """Say that run ``run_id`` is suspended, what it waits on, and how it goes on."""
        waiting = "; ".join(_waiting_for(request) for request in open_requests)
        self.io.write(f"kestrel> (run {run_id} suspended{': ' + waiting if waiting else ''})")
        elsewhere = _elsewhere(run_id, open_requests, self.user, self.rules, self.acting_as)
        self.io.write(f"         resume it with /resume {run_id}{elsewhere}")

    async def _command(self, line: str) -> None:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        try:
            await self._dispatch(name, arg)
        except (ResumeRefused, StoreError, NotPermitted) as exc:
            self.io.write(f"  ! {exc}")

    async def _dispatch(self, name: str, arg: str) -> None:
        if name == "/runs":
            await self._runs(arg)
        elif name == "/resume" and arg:
            live = await self._resuming(arg)
            if live is None:
                status = await self.chat.ended_as(arg)
                if status is not None:
                    self.io.write(f"  ! {already_ended(arg, status, 'resume')}")
                else:  # left for later here, or someone else's to answer: as it suspended
                    views = await self.chat.requests_of(arg)
                    opened = [v.request for v in views if v.status is RequestStatus.OPEN]
                    self._suspended(arg, opened)
                return
            await self._follow(live)
        elif name == "/cancel" and arg:
            self.io.write("  " + await self.chat.cancel(arg, user=self.actor))
        elif name in ("/resume", "/cancel"):
            self.io.write(f"  ! {name} needs a RUN (/runs lists them)")
        elif name == "/help":
            self.io.write(HELP)
        else:
            self.io.write(f"  ! unknown command {name}: /help lists them; //… sends a message")

    async def _runs(self, count: str) -> None:
        """The ``count`` most recent runs (10 when none is given), a line each."""
        if count and not (count.isascii() and count.isdigit() and 1 <= int(count) <= RUNS_MOST):
            self.io.write(f"  ! /runs lists the N most recent runs: N from 1 to {RUNS_MOST}")
            return
        for record in await self.chat.recent(limit=int(count or RUNS_LISTED)):
            prompt = flattened(record.prompt)[:60]  # a prompt of several lines, on one
            self.io.write(f"  {record.id}  {record.status.value:<10} {prompt}")

    async def _resuming(self, run_id: str) -> RunHandle | None:
        """Resume a run, answering here what it still waits on: a Ctrl-C at one of those
        questions leaves it open (the run stays suspended), as one at a run's own does."""
        asking = asyncio.ensure_future(
            self.chat.resume(run_id, user=self.actor, prompter=self.prompter)
        )
        self._asking = asking
        try:
            return await asking
        except asyncio.CancelledError:
            if not asking.cancelled() or asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise  # this task was cancelled (a second Ctrl-C, SIGTERM): leave
            self.io.write(f"  (left open: run {run_id} stays suspended)")
            return None
        finally:
            self._asking = None

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        # Event-loop signal handlers exist on POSIX only; elsewhere Ctrl-C stays Python's own.
        if sys.platform == "win32":
            yield
            return
        loop = asyncio.get_running_loop()
        main = asyncio.current_task()
        loop.add_signal_handler(signal.SIGINT, self._interrupt, main)
        loop.add_signal_handler(signal.SIGTERM, self._terminate, main, signal.SIGTERM)
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # nohup keeps its hang-ups
            loop.add_signal_handler(signal.SIGHUP, self._terminate, main, signal.SIGHUP)
        try:
            yield
        finally:
            # The handlers stay (the loop removes them when it closes) but only tell the stop:
            # Python's own Ctrl-C would raise in the middle of closing the journal.
            self._leaving = True

    def _terminate(self, main: asyncio.Task[Any] | None, signum: signal.Signals) -> None:
        self._on_stop(signum)
        if self._leaving or self.terminated:
            return
        self.terminated = signum
        self.suspended = self.under_way()
        if self._live is not None:
            self.chat.interrupt(self._live)
        elif main is not None:
            main.cancel()

    def _interrupt(self, main: asyncio.Task[Any] | None) -> None:
        if self._leaving or self.terminated:
            self._on_stop(signal.SIGINT)
            return
        self._interrupts += 1
        if self._asking is not None:
            self._asking.cancel()
            return
        if self._live is not None and self._interrupts == 1:
            if self.prompter.later():
                self._interrupts = 0  # not a stop: each prompt it reaches is one's own
                return
            self.chat.interrupt(self._live)
            self.io.write("\n  (stopping: the run suspends now; Ctrl-C again leaves the chat)")
            return
        self._on_stop(signal.SIGINT)
        if main is not None:
            main.cancel()
