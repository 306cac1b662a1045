"""One run of the agent loop: iterations, budgets, no-progress, suspend, terminal result."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from bot.domain import (
    AssistantTurn,
    Decision,
    DecisionKind,
    Request,
    RequestKind,
    RequestStatus,
    RunStatus,
    StopReason,
    TerminalResult,
    ToolOutcome,
    extract_payload,
)
from bot.events import (
    AdvisoryEvent,
    AnswerSuppliedEvent,
    ModelTurnEvent,
    RequestOpenedEvent,
    RunResumedEvent,
    RunSuspendedEvent,
)
from bot.journal.entries import (
    AdvisoryEntry,
    AnswerSupplied,
    AssistantTurnEntry,
    GrantWritten,
    RunEnded,
    RunResumed,
    RunSuspended,
    ToolDeferred,
    ToolResultEntry,
)
from bot.journal.fold import CallState, RunState, call_signature
from bot.journal.writer import TakenOver
from bot.llm.base import AssistantMessage, ModelError, ModelProvider, ToolResultsMessage
from bot.llm.reply_words import after_reasoning, shown, words
from bot.nesting import loads
from bot.run.context import RunContext
from bot.run.execute import CallEnv, HookAbort, execute_tool, post_tool, traced_steps
from bot.run.gate import Gate
from bot.run.interrupt import Interrupt, Interrupted
from bot.run.origins import Tracer
from bot.run.plan import needing_approval, plan_answer, plan_off_plan, plan_request
from bot.run.telemetry import span
from bot.tools import orphans
from bot.tools.propose_plan import MAX_STEPS
from bot.tools.toolset import ToolSet

log = logging.getLogger("kestrel.loop")


# What the model reads of an uncertain effect nobody settled before its deadline.
_UNSETTLED = (
    "its outcome is unknown: it was started, the process stopped mid-effect, and nobody said"
    " before the deadline whether it took effect; it may have. Do not run it again unless a"
    " person asks you to"
)

# What a run fails with when the model's first reply has neither text nor a tool call.
_EMPTY = "the model returned an empty reply: no text and no tool call"
# ... and when the server sent its reasoning apart, and nothing else.
_ONLY_REASONING = "the model returned only its reasoning: no answer text and no tool call"
# What a run answers when the model, its calls answered, ends with nothing to add: some models
# say what they do beside their calls and then reply with nothing.
_NOTHING_TO_ADD = "(The model ended without a final answer after its tool calls.)"

# Why a run someone cancelled while it ran ended.
_CANCELLED = "cancelled on request"
# A reply cut at the model's output limit (finish reason "length"): in its words, in a call,
# or before it was done reasoning.
_CUT = "the model's reply was cut at its output limit; no tool was run"
_CUT_CALL = (
    "the model's reply was cut at its output limit while it wrote a tool call; no tool was run"
)
_CUT_THINKING = (
    "the model's reply was cut at its output limit while it was still reasoning; no tool was run"
)

# A reply that ended so is not all the model meant: none of its calls runs.
_CUT_SHORT = frozenset({"length", "content_filter"})


class Signals(msgspec.Struct):
    """The run's inbox: requests from outside, picked up at the loop boundary only."""

    suspend: asyncio.Event = msgspec.field(default_factory=asyncio.Event)
    cancel: asyncio.Event = msgspec.field(default_factory=asyncio.Event)
    # Unlike the others, cuts the model call, prompt or tool under way (shutdown, signals).
    interrupt: Interrupt = msgspec.field(default_factory=Interrupt)

    @property
    def stopping(self) -> bool:
        """Whether someone asked the run to suspend now (a shutdown, a signal, a request),
        rather than it suspending to wait for people."""
        return self.suspend.is_set() or self.interrupt.requested


class LoopDeps(msgspec.Struct):
    """What the loop alone needs from the world (the rest is the run's ``RunContext``)."""

    model: ModelProvider
    tools: Callable[[], ToolSet]
    model_timeout: float = 60.0
    advisories: Callable[[], list[str]] = lambda: []
    lookup_request: Callable[[str], Awaitable[tuple[RequestStatus, Decision | None] | None]] = (
        lambda _id: _no_request()
    )
    clock: Callable[[], float] = time.monotonic


async def _no_request() -> None:
    return None


class Stop(Exception):
    """Ends the run with a terminal result."""

    def __init__(
        self, status: RunStatus, reason: StopReason, error: str = "", text: str = ""
    ) -> None:
        super().__init__(error or reason.value)
        self.status = status
        self.reason = reason
        self.error = error
        self.text = text


class Suspend(Exception):
    """Ends the task with the run suspended."""

    def __init__(self, reason: StopReason, requests: Sequence[Request] = ()) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.requests = tuple(requests)


class AgentLoop:
    """Drives one run from its journaled state until it ends or suspends."""

    def __init__(self, run: RunContext, deps: LoopDeps, signals: Signals) -> None:
        self.run_ctx = run
        self.journal = run.journal
        self.run_id = run.run_id  # the run this loop drives
        # The folded state, kept in step by every append (the journal's own, never replaced).
        self.state: RunState = run.journal.state
        self.deps = deps
        self.signals = signals
        started = self.state.started
        assert started is not None, "a run's journal starts with run_started"
        self.started = started
        self.budgets = started.budgets
        seconds = self.budgets.deadline_seconds
        # On the loop's clock; None without a deadline (checked at every boundary, so kept).
        self._deadline_at = deps.clock() + seconds if seconds else None

    async def run(self, resumed: RunResumed | None = None) -> RunState:
        """Iterate until a terminal result or a suspend; journal whichever it is.

        ``resumed`` (a run picked up again) is journaled once the answers the run waits for are
        read, so that it commits with them and with the first effect they allow.
        """
        try:
            await self._iterate(resumed)
        except Interrupted:
            await self._interrupted()
        except Suspend as pause:
            await self._suspend(pause)
        except Stop as stop:
            await self._end(stop.status, stop.reason, stop.error, stop.text)
        return self.state

    async def _iterate(self, resumed: RunResumed | None) -> None:
        ended = self._ended_by_its_reply()
        found = await self._look_up_answers() if self.state.open_batch and ended is None else {}
        if resumed is not None:
            # Still running, not suspended: its owner died mid-run and this process adopts it.
            orphaned = self.state.status is RunStatus.RUNNING
            event = RunResumedEvent(self.run_id, orphaned=orphaned)
            said = functools.partial(self.run_ctx.events.emit, event)
            self.journal.append_soon(resumed, then=said)
        if ended is not None:
            raise ended
        if self.state.open_batch:
            await self._finish_batch(found)
        while True:
            self._poll()
            # Whatever was queued (grants, the run's start) is durable before the model is asked.
            await self.journal.flush()
            tools = self.deps.tools()
            await self._drain_advisories()
            began = self.deps.clock()
            turn = await self._call_model(tools)
            seconds = self.deps.clock() - began
            entry = AssistantTurnEntry(iteration=self.state.iteration, turn=turn)
            if turn.calls and turn.finish_reason not in _CUT_SHORT:
                await self.journal.append(entry)  # durable before any of its tools runs
            else:
                # The run's end comes next: committed with it where a store commits queued
                # entries together (SQLite), and on its own before it elsewhere (PostgreSQL),
                # where whoever takes the run up then ends it so (``_ended_by_its_reply``).
                self.journal.append_soon(entry)
            self.run_ctx.events.announce(
                ModelTurnEvent,
                self.run_id,
                # Its words: its reasoning is its own, and the calls it wrote as text are
                # shown as the calls they are.
                shown(turn),
                len(turn.calls),
                seconds=seconds,
                input_tokens=turn.usage.input_tokens,
                output_tokens=turn.usage.output_tokens,
            )
            stop = self._ends(turn, tools)
            if stop is not None:
                raise stop
            self._check_batch_budgets(len(turn.calls))
            await self._run_batch(tools)

    def _ends(self, turn: AssistantTurn, tools: ToolSet) -> Stop | None:
        """How ``turn`` ends the run, if it does: cut short, withheld, or an answer (no calls)."""
        if turn.finish_reason == "length":
            return _cut(turn, tools)
        if turn.finish_reason == "content_filter":
            return Stop(
                RunStatus.FAILED,
                StopReason.MODEL_ERROR,
                "the model's reply was withheld by the provider's content filter; no tool was run",
                shown(turn),
            )
        if not turn.calls:
            return _answer(turn, worked=self._worked)
        return None

    def _ended_by_its_reply(self) -> Stop | None:
        """How the run's last journaled reply ended it, when its end was not journaled (its
        owner died, or lost its lease, between the two): taken up, it ends so, as it would
        have, rather than ask the model again after its answer."""
        last = self.state.messages[-1] if self.state.messages else None
        if not isinstance(last, AssistantMessage):
            return None
        return self._ends(last.turn, self.deps.tools())

    async def _interrupted(self) -> None:
        """Cut short: a cancel ends the run here, unless the batch opened a request (ended at
        its suspend, by the cancel, which closes it); any other stop suspends it."""
        if self.signals.cancel.is_set() and not self.state.open_requests:
            # A tool a later stop cut (a shutdown's, past its grace) may have half run.
            cause = _CANCELLED + await unsettled(self.state)
            await self._end(RunStatus.CANCELLED, StopReason.CANCELLED, cause, "")
            return
        await self._suspend(Suspend(self.signals.interrupt.reason))

    def _poll(self) -> None:
        """The loop boundary: cancel, suspend and the limits, before an iteration is used."""
        if self.signals.cancel.is_set():
            raise Stop(RunStatus.CANCELLED, StopReason.CANCELLED, _CANCELLED)
        if self.signals.interrupt.requested:
            raise Suspend(self.signals.interrupt.reason)
        if self.signals.suspend.is_set():
            raise Suspend(StopReason.SUSPEND_REQUESTED)
        if self.state.iteration >= self.budgets.max_iterations:
            limit = self.budgets.max_iterations
            # Named by its setting: a looping model's stop tells whoever reads it what to raise.
            used = f"all {limit} model turns used (budgets.max_iterations)"
            raise Stop(RunStatus.FAILED, StopReason.ITERATION_LIMIT, used)
        self._check_deadline()
        if self.state.iteration > 0:
            self._check_tokens()

    @property
    def _worked(self) -> bool:
        """Whether a call of this run did its work: calls refused, unknown or failed did none,
        so an empty reply after only those is no answer."""
        return self.state.outcome_counts[ToolOutcome.OK] > 0

    def _check_batch_budgets(self, calls: int) -> None:
        self._check_tokens()
        self._check_deadline()
        limit = self.budgets.max_tool_calls
        if self.state.tool_calls + calls > limit:
            raise Stop(
                RunStatus.FAILED,
                StopReason.TOOL_CALL_LIMIT,
                f"the model asked for {calls} tool call{'' if calls == 1 else 's'}, past the"
                f" run's {limit} (budgets.max_tool_calls; {self.state.tool_calls} made so far);"
                " none of them was run",
            )

    def _check_tokens(self) -> None:
        used, limit = self.state.usage.total, self.budgets.max_tokens
        if limit and used >= limit:
            spent = f"{used} of {limit} tokens used (budgets.max_tokens)"
            raise Stop(RunStatus.FAILED, StopReason.TOKEN_BUDGET, spent)

    def _remaining(self) -> float | None:
        if self._deadline_at is None:
            return None
        return self._deadline_at - self.deps.clock()

    def _check_deadline(self) -> None:
        if self._deadline_at is not None and self.deps.clock() >= self._deadline_at:
            seconds = f"{self.budgets.deadline_seconds:g}s"
            passed = f"the run's deadline passed ({seconds} of work, budgets.deadline_seconds)"
            raise Stop(RunStatus.FAILED, StopReason.DEADLINE, passed)

    async def _drain_advisories(self) -> None:
        for said in self.deps.advisories():
            # A tool source's own words (an MCP server's error may quote its URL and token):
            # kept and shown as the guard leaves them, as anything a person typed is.
            text = self.run_ctx.redact(said)
            await self.journal.append(AdvisoryEntry(text=text))
            self.run_ctx.events.emit(AdvisoryEvent(self.run_id, text))

    async def _call_model(self, tools: ToolSet) -> AssistantTurn:
        timeout = self.deps.model_timeout
        remaining = self._remaining()
        if remaining is not None:
            timeout = min(timeout, remaining)
        with span("model_call", run_id=self.journal.run_id, iteration=self.state.iteration):
            try:
                async with self.signals.interrupt.guard():
                    return await self.deps.model.complete(
                        self.state.messages, tools.specs(), timeout, notice=self._model_waits
                    )
            except ModelError as exc:
                self._check_deadline()  # a call cut short by the run's deadline stops for it
                raise Stop(RunStatus.FAILED, StopReason.MODEL_ERROR, str(exc)) from exc

    def _model_waits(self, text: str) -> None:
        """What holds the model call up (a retry after a rate limit), for the people watching;
        passing news, so not journaled."""
        self.run_ctx.events.emit(AdvisoryEvent(self.run_id, text, source="model"))

    def _gate(self, tools: ToolSet, answers: dict[str, tuple[Decision, str]] | None = None) -> Gate:
        return Gate(
            new_request=self.run_ctx.request,
            prompter=self.run_ctx.prompter,
            expired=lambda: (self._remaining() or 1) <= 0,
            written=self.state.grants,
            answers=answers,
            definition=tools.definition,
            read_before=self._read_before,
        )

    def _read_before(self, plan: str) -> frozenset[str] | None:
        """The calls whose output the model had read when it asked for ``plan``; None for a
        plan none of whose grants is journaled yet (this batch's)."""
        asked = self.state.plans_read.get(plan)
        if asked is None:
            return None
        before = self.state.messages[:asked]
        return frozenset(
            item.call_id
            for message in before
            if isinstance(message, ToolResultsMessage)
            for item in message.results
        )

    def _env(self, tools: ToolSet, gate: Gate) -> CallEnv:
        tracer = Tracer(self.state, lambda name: _asks_people(tools, name))
        return CallEnv(run=self.run_ctx, tools=tools, gate=gate, trace=tracer.origins)

    async def _run_batch(self, tools: ToolSet) -> None:
        env = self._env(tools, self._gate(tools))
        held = await self._plan_batch(env)
        for call_state in list(self.state.batch):
            if call_state.call.id not in held:
                await self._execute(call_state, env)
                self._stop_if_stuck()
        self._after_batch()

    async def _plan_batch(self, env: CallEnv) -> set[str]:
        """Two or more calls of one reply that will ask a person are asked as one plan: the
        calls it holds until it is decided (none if it was decided at once)."""
        if not env.gate.present or len(self.state.batch) < 2:
            return set()  # a plan takes two calls: one call of a reply asks on its own
        trial = env.gate.trial()
        found = needing_approval((c.call for c in self.state.batch), env.tools, trial.covered)
        steps = found[:MAX_STEPS]  # a card shows so many; the calls past them ask on their own
        if len(steps) < 2:
            return set()
        first = steps[0].call_id
        steps = traced_steps(steps, first, env)
        summary = self.state.reason_for(first) or f"{len(steps)} calls that need approval"
        # Calls off an approved plan are asked together, and the card says how each differs.
        off_plan = plan_off_plan([trial.departures.get(step.call_id) for step in steps])
        request = plan_request(self.run_ctx.request, first, summary, steps, env.tools, off_plan)
        async with self.run_ctx.interrupt.guard():  # a plan asked inline waits on a person
            decision = await env.gate.ask(request)
        if decision is not None:
            env.gate.settle_plan(request, decision)
            return set()
        # Opens the request as it lands, said once durable; the run's suspend commits with it.
        opened = RequestOpenedEvent(self.run_id, request)
        self.journal.append_soon(
            ToolDeferred(call_id=first, tool=request.tool, request=request),
            then=functools.partial(self.run_ctx.events.emit, opened),
        )
        return {step.call_id for step in steps}

    async def _execute(self, call_state: CallState, env: CallEnv) -> None:
        try:
            await execute_tool(call_state.call, env)
        except HookAbort as exc:
            raise Stop(RunStatus.FAILED, StopReason.HOOK_ABORT, str(exc)) from exc

    def _after_batch(self) -> None:
        """Suspend on open requests, or stop when the same call keeps giving the same result."""
        if self.state.open_requests:
            raise Suspend(StopReason.WAITING, self.state.open_requests)
        self._stop_if_stuck()

    def _stop_if_stuck(self) -> None:
        """Stop when the same call gave the same result ``no_progress_repeats`` times, as soon
        as it did: a reply repeating one read hundreds of times runs it no more. A batch with a
        request open goes on to its suspend, the check made again when it is answered."""
        repeats = self.budgets.no_progress_repeats
        if not repeats or self.state.most_repeated < repeats or self.state.open_requests:
            return
        call = self._repeated(repeats)
        evidence = call.result.output[:500] if call.result else ""
        raise Stop(
            RunStatus.FAILED,
            StopReason.NO_PROGRESS,
            f"the same call ({call.call.name} {_one_line(call.call.arguments)}) gave the same"
            f" result {repeats} times; last result: {_one_line(evidence)}",
        )

    def _repeated(self, repeats: int) -> CallState:
        """The call of the batch that gave its result ``repeats`` times (the batch's last if
        none did here: the count was reached before, under another setting)."""
        for call_state in self.state.batch:
            result = call_state.result
            if result is None:
                continue
            signature = call_signature(result.tool, call_state.call.arguments, result.output)
            if self.state.signatures[signature] >= repeats:
                return call_state
        return self.state.batch[-1]

    async def _look_up_answers(self) -> dict[str, Decision | None]:
        """The decision (``Decisions``) for each request the open batch waits on (None while
        open), read before anything is journaled; a request the store lost is opened again."""
        found: dict[str, Decision | None] = {}
        for call_state in self.state.batch:
            request = call_state.deferred
            if call_state.result is not None or request is None:
                continue
            if request.id in self.state.answers:
                continue
            looked_up = await self.deps.lookup_request(request.id)
            if looked_up is None:
                await self.run_ctx.open_request(request)
                continue
            status, decision = looked_up
            if status is not RequestStatus.OPEN:
                found[request.id] = decision
        return found

    async def _finish_batch(self, found: dict[str, Decision | None]) -> None:
        """Answer the calls of a batch interrupted by a suspend or a crash, from the journal."""
        tools = self.deps.tools()
        answers: dict[str, tuple[Decision, str]] = {}
        plans: list[tuple[Request, Decision]] = []
        held: set[str] = set()
        for call_state in self.state.batch:
            request = call_state.deferred
            if request is None:
                continue
            if call_state.result is None:
                decision = self._supplied(request, found.get(request.id))
                if decision is not None and request.kind is RequestKind.WAIT_APPROVAL:
                    answers[call_state.call.id] = (decision, request.digest)
            else:  # answered already: a plan's decision still holds for its other calls
                decision = self.state.answers.get(request.id)
            if request.kind is RequestKind.WAIT_PLAN:
                if decision is None:  # still open: its calls wait for it
                    held.update(step.call_id for step in request.steps)
                else:
                    plans.append((request, decision))
        env = self._env(tools, self._gate(tools, answers))
        for request, decision in plans:
            env.gate.settle_plan(request, decision)
        for call_state in list(self.state.batch):
            if call_state.result is None and call_state.call.id not in held:
                await self._finish_call(call_state, env)
                self._stop_if_stuck()
        self._after_batch()

    async def _finish_call(self, call_state: CallState, env: CallEnv) -> None:
        # Whatever path started it (a first run, an approval, a grant, a retry), an effect
        # journaled as started and never answered is not started again without on-call.
        if call_state.dispatched:
            await self._uncertain(call_state, env)
            return
        request = call_state.deferred
        if request is None:
            await self._execute(call_state, env)
            return
        decision = self.state.answers.get(request.id)
        if decision is None:
            return
        if request.kind is RequestKind.WAIT_APPROVAL:
            await self._execute(call_state, env)
        elif request.kind is RequestKind.WAIT_PLAN:
            await self._plan_decided(call_state, request, env)
        elif request.kind is RequestKind.WAIT_EFFECT:
            await self._settle_effect(call_state, decision, env)
        else:
            await self._answer_question(call_state, decision, env)

    def _supplied(self, request: Request, decision: Decision | None) -> Decision | None:
        """The answer for a request, journaled once (committed with the effect it allows);
        None while it is open."""
        known = self.state.answers.get(request.id)
        if known is not None:
            return known
        if decision is None:
            return None
        waited = max(0.0, (decision.at - request.created_at).total_seconds())
        supplied = AnswerSuppliedEvent(
            self.run_id, request.id, decision.kind, request_kind=request.kind, waited=waited
        )
        # Said once durable: a card never shows an answer the run could still lose.
        said = functools.partial(self.run_ctx.events.emit, supplied)
        self.journal.append_soon(AnswerSupplied(decision=decision), then=said)
        return decision

    async def _uncertain(self, call_state: CallState, env: CallEnv) -> None:
        """A dispatched call with no result: rerun it if idempotent, else ask on-call."""
        # The tool whose effect started, not the one the model named: rerunning a call a hook
        # rewrote would start that effect again.
        name = call_state.effect_tool or call_state.call.name
        tool = env.tools.get(name)
        if tool is not None and tool.flags.traits.idempotent:
            await self._execute(call_state, env)
            return
        found = ""
        if call_state.process is not None:
            # Before anyone can answer "retry", the first attempt must not still be running.
            found = f"; {await orphans.end_orphan(call_state.process)}"
        call = call_state.call
        request = self.run_ctx.request(
            RequestKind.WAIT_EFFECT,
            call.id,
            name,
            _arguments(call.arguments),
            prompt=(
                f"{name} was started but its outcome is unknown "
                f"(the process stopped mid-effect{found}): retry, mark done or mark failed?"
            ),
            options=("retry", "done", "failed"),
        )
        # The entry opens the request as it lands.
        await self.journal.append(
            ToolDeferred(call_id=call_state.call.id, tool=request.tool, request=request)
        )
        self.run_ctx.events.emit(RequestOpenedEvent(self.run_id, request))

    async def _plan_decided(self, call_state: CallState, request: Request, env: CallEnv) -> None:
        """A call a plan stands for runs through the gate, which the decision set up (in
        ``_finish_batch``); the ``propose_plan`` call is answered with the decision."""
        if any(step.call_id == call_state.call.id for step in request.steps):
            await self._execute(call_state, env)
            return
        output, refused = plan_answer(self.state.answers[request.id])
        outcome = ToolOutcome.GATE_DENIED if refused else ToolOutcome.OK
        await self._result(call_state, outcome, output, refused, env)

    async def _settle_effect(self, call_state: CallState, decision: Decision, env: CallEnv) -> None:
        if decision.kind is DecisionKind.RETRY:
            await self._execute(call_state, env)
            return
        if decision.kind is DecisionKind.DONE:
            output = decision.text or f"marked done by {decision.by or 'on-call'}"
            await self._result(call_state, ToolOutcome.OK, output, False, env)
            return
        if decision.kind is DecisionKind.EXPIRED:
            # Nobody said it failed: a model told so would likely run it again, twice in all.
            await self._result(call_state, ToolOutcome.ERROR, _UNSETTLED, True, env)
            return
        output = f"marked failed by {decision.by or 'on-call'}" + (
            f": {decision.text}" if decision.text else ""
        )
        await self._result(call_state, ToolOutcome.ERROR, output, True, env)

    async def _answer_question(
        self, call_state: CallState, decision: Decision, env: CallEnv
    ) -> None:
        if decision.kind is DecisionKind.EXPIRED:
            output = "no answer before the deadline"
        else:
            who = f" (answered by {decision.by})" if decision.by else ""
            output = (decision.text or "") + who
        await self._result(call_state, ToolOutcome.OK, output, False, env)

    async def _result(
        self, call_state: CallState, outcome: ToolOutcome, output: str, err: bool, env: CallEnv
    ) -> None:
        """Journal a result supplied through ``Decisions``, after PostToolUse like any other."""
        call = call_state.call
        output = await post_tool(call, output, env)
        entry = ToolResultEntry(
            call_id=call.id, tool=call.name, outcome=outcome, output=output, is_error=err
        )
        self.journal.append_soon(entry)
        for grant in env.gate.flush():  # a plan's step grants, with the answer that gave them
            self.journal.append_soon(GrantWritten(grant=grant))
        await self.journal.flush()

    async def _suspend(self, pause: Suspend) -> None:
        ids = tuple(r.id for r in pause.requests)
        await self.journal.append(RunSuspended(reason=pause.reason, request_ids=ids))
        # Stopped for another cause with a question open, it waits on people all the same.
        waiting = ids or tuple(r.id for r in self.state.open_requests)
        cut = tuple(
            c.effect_tool or c.call.name
            for c in self.state.batch
            if c.dispatched and c.result is None
        )
        self.run_ctx.events.emit(RunSuspendedEvent(self.run_id, pause.reason, waiting, cut))

    async def _end(self, status: RunStatus, reason: StopReason, error: str, text: str) -> None:
        result = TerminalResult(
            status=status,
            stop_reason=reason,
            text=text,
            payload=extract_payload(text) if status is RunStatus.COMPLETED else None,
            error=error,
            usage=self.state.usage,
            outcomes=self.state.outcomes(),
        )
        await self.journal.append(RunEnded.of(result, last_turn_text=self.state.last_text))


async def unsettled(state: RunState) -> str:
    """What a run ended with no resume to come leaves unknown, for whoever reads how it ended:
    each effect started (its dispatch journaled) with no result, which on-call would have been
    asked about (``wait_effect``) had the run gone on. A command of a process that died, still
    running on this host, is stopped first, as it is before on-call is asked."""
    started = []
    for call in state.batch:
        if not call.dispatched or call.result is not None:
            continue
        found = f" ({await orphans.end_orphan(call.process)})" if call.process else ""
        started.append(f"{call.effect_tool or call.call.name}{found}")
    if not started:
        return ""
    they = "it" if len(started) == 1 else "they"
    return f"; {' and '.join(started)} had started, and whether {they} took effect is unknown"


def _answer(turn: AssistantTurn, *, worked: bool) -> Stop:
    """How a reply without calls ends the run: answered with what follows its reasoning; if it
    says nothing, answered so after a call did its work (``worked``), else failed, naming
    reasoning alone if that was all it held (the reply is journaled all the same, so the
    model is not asked for that step again)."""
    text = shown(turn)
    if text.strip():
        return Stop(RunStatus.COMPLETED, StopReason.ANSWERED, text=text)
    if worked:
        return Stop(RunStatus.COMPLETED, StopReason.ANSWERED, text=_NOTHING_TO_ADD)
    return Stop(
        RunStatus.FAILED, StopReason.MODEL_ERROR, _ONLY_REASONING if _reasoned(turn) else _EMPTY
    )


def _reasoned(turn: AssistantTurn) -> bool:
    """Whether a reply that shows nothing (``shown``) held reasoning: sent apart from its
    text, or all of its text (an empty one is none)."""
    apart = turn.reasoning is not None and bool(turn.reasoning.text.strip())
    return apart or bool((turn.text or "").strip())


def _cut(turn: AssistantTurn, tools: ToolSet) -> Stop:
    """How a reply cut at the model's output limit ends the run: failed, saying whether it was
    writing a call, its words shown without the markup of one or its reasoning (the journal
    keeps it all)."""
    # A cut reply is rare: the parsers of calls written as text load only for one.
    from bot.llm.text_calls import before_cut_call

    begun = words(turn) if turn.calls else before_cut_call(turn.text or "", tools)
    if begun is not None:
        return Stop(RunStatus.FAILED, StopReason.TRUNCATED, _CUT_CALL, after_reasoning(begun))
    text = shown(turn)
    if not text.strip() and _reasoned(turn):
        return Stop(RunStatus.FAILED, StopReason.TRUNCATED, _CUT_THINKING)
    return Stop(RunStatus.FAILED, StopReason.TRUNCATED, _CUT, text)


def _asks_people(tools: ToolSet, name: str) -> bool:
    """Whether ``name``'s output is a person's answer (a question tool's)."""
    tool = tools.get(name)
    return tool is not None and tool.flags.traits.needs_prompter


def _arguments(raw: str) -> dict[str, Any]:
    try:
        value = loads(raw)
    except ValueError:
        return {"raw": raw}
    return value if isinstance(value, dict) else {"raw": raw}


def _one_line(text: str) -> str:
    """``text`` on one line, its line ends shown: a run's error is said as one line (under
    ``kestrel run``'s status, in a chat's closing message)."""
    return " ⏎ ".join(text.splitlines())


__all__ = ["AgentLoop", "LoopDeps", "Signals", "Stop", "Suspend", "TakenOver"]
