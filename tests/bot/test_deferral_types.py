"""A Python tool's Deferral with loose types: the kind as text, options as a list."""

from __future__ import annotations

from pathlib import Path

from bot.domain import RequestKind, RunStatus
from bot.journal.entries import ToolDeferred, ToolResultEntry
from bot.run.supervisor import Supervisor
from bot.tools.base import Deferral
from bot.tools.python import function_tool
from tests.fakes.runtime import TextArgs, call, make_runtime, one_call, reply


async def test_a_deferral_with_text_kind_and_list_options_suspends(tmp_path: Path) -> None:
    @function_tool
    async def ask(args: TextArgs) -> Deferral:
        """Ask a person later."""
        return Deferral(kind="wait_user", prompt="which?", options=["a", "b"])  # type: ignore[arg-type]

    rt, _ = await make_runtime(tmp_path / "k.db", [reply(call("ask", text="x"))], [ask])
    sup = Supervisor(rt)
    state = await sup.wait(await sup.start_turn("help"))
    records = await rt.store.load(state.run_id)
    await rt.store.close()
    (deferred,) = [r.entry for r in records if isinstance(r.entry, ToolDeferred)]
    assert deferred.request.kind is RequestKind.WAIT_USER
    assert deferred.request.options == ("a", "b")
    assert state.status is RunStatus.SUSPENDED


async def test_a_deferral_of_no_known_kind_fails_the_call_not_the_run(tmp_path: Path) -> None:
    @function_tool
    async def ask(args: TextArgs) -> Deferral:
        """Ask a person later."""
        return Deferral(kind="wait_usr", prompt="which?")  # type: ignore[arg-type]

    state, records = await one_call(tmp_path / "k.db", ask, text="x")
    assert state.status is RunStatus.COMPLETED
    (answer,) = [r.entry for r in records if isinstance(r.entry, ToolResultEntry)]
    assert answer.is_error
    assert answer.output.startswith("the tool deferred with kind 'wait_usr'")
