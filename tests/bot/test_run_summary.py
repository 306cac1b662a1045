"""A run page's header: a finished run's comes from its end and the journal's ends, and says
what adding up the whole journal says."""

from __future__ import annotations

from pathlib import Path

from msgspec.structs import replace

from bot.chat.run_summary import RunSummaries
from bot.domain import Decision, DecisionKind
from bot.journal.log import JournalTally
from bot.kinds import RunStatus
from bot.llm.scripted import ScriptedProvider
from bot.prompter import DeferringPrompter
from bot.run.supervisor import Supervisor
from bot.store import Store
from tests.fakes.runtime import Counter, call, counting_tools, make_runtime, reply


class TalliesCounted:
    """The real store, with the journal tallies it is asked for counted."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.tallies = 0

    async def load_range(self, run_id: str, start: int, stop: int) -> list:  # type: ignore[type-arg]
        return await self.store.load_range(run_id, start, stop)

    async def journal_tally(self, run_id: str, start: int, stop: int) -> JournalTally:
        self.tallies += 1
        return await self.store.journal_tally(run_id, start, stop)

    async def journal_landmarks(self, run_id: str, stop: int) -> JournalTally:
        return await self.store.journal_landmarks(run_id, stop)


async def test_a_finished_runs_header_says_what_its_whole_journal_adds_up_to(
    tmp_path: Path,
) -> None:
    usage = {"input_tokens": 120, "output_tokens": 9}
    replies = [
        reply(call("echo", text="a"), call("boom", text="b"), text="looking", usage=usage),
        reply(call("slow", text="c"), call("echo", text="d"), usage=usage),
        reply(text="all done", usage=usage),
    ]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, counting_tools(Counter()))
    try:
        state = await Supervisor(rt).wait(await Supervisor(rt).start_turn("go"))
        assert state.result is not None and state.result.status is RunStatus.COMPLETED
        run = await rt.store.get_run(state.run_id)
        length = await rt.store.journal_length(run.id)

        ended = TalliesCounted(rt.store)
        fast = await RunSummaries(ended).page(run, length)
        added = TalliesCounted(rt.store)
        whole = await RunSummaries(added).page(replace(run, status=RunStatus.RUNNING), length)
    finally:
        await rt.store.close()

    assert (ended.tallies, added.tallies) == (0, 1)
    for name in ("iteration", "tool_calls", "usage", "last_text", "result"):
        assert getattr(fast.state, name) == getattr(whole.state, name), name
    assert fast.state.outcomes() == whole.state.outcomes() == {"ok": 2, "error": 1, "timeout": 1}
    assert fast.state.usage.input_tokens == 360 and fast.state.iteration == 3
    assert fast.state.result is not None and fast.state.result.text == "all done"


async def test_a_header_names_the_model_a_forced_resume_went_on_with(tmp_path: Path) -> None:
    # After `runs resume --force` carried a run on to another model, its page named the
    # start's model to the end: both while it ran (the journal added up) and once it ended
    # (read from its ends).
    db = tmp_path / "k.db"
    first, _ = await make_runtime(db, [reply(call("deploy", text="v2"))], counting_tools(Counter()))
    try:
        started = Supervisor(first)
        live = await started.start_turn("go", prompter=DeferringPrompter())
        await started.wait(live)
    finally:
        await first.store.close()
    later = ScriptedProvider.from_replies([reply(text="done")], name="gpt-new")
    upgraded, _ = await make_runtime(db, later, counting_tools(Counter()))
    try:
        sup = Supervisor(upgraded)
        ((request, _, _),) = await upgraded.store.list_requests(run_id=live.run_id)
        approved = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APPROVER")
        await sup.answer(approved, run_id=live.run_id)
        resumed = await sup.resume(live.run_id, force=True)
        assert resumed is not None
        assert (await sup.wait(resumed)).status is RunStatus.COMPLETED
        run = await upgraded.store.get_run(live.run_id)
        length = await upgraded.store.journal_length(run.id)
        ended = await RunSummaries(TalliesCounted(upgraded.store)).page(run, length)
        running = replace(run, status=RunStatus.RUNNING)
        added = await RunSummaries(TalliesCounted(upgraded.store)).page(running, length)
    finally:
        await upgraded.store.close()

    assert first.fingerprint().model == "test"
    for page in (ended, added):
        assert page.state.fingerprint == upgraded.fingerprint()
