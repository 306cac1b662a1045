"""False positives: the demo's and the test catalogs' normal flows, where the values come from
the prompt, never ask a decision for provenance (and no card shows an origin)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bot.config.settings import demo_file
from bot.domain import Decision, DecisionKind, Request, RequestKind
from bot.journal.entries import AssistantTurnEntry
from bot.llm.scripted import ScriptedProvider, load_script
from bot.run.origins import consequential
from bot.run.supervisor import Supervisor
from bot.tools.ask_human import ask_human_tools
from bot.tools.base import Tool
from bot.tools.catalog import load_catalog
from tests.fakes.runtime import Counter, counting_tools, make_runtime
from tests.fakes.slack_world import drain_script, question_script, restart_script, write_config


class Approver:
    """Approves every approval and answers every question, keeping what it was asked."""

    present = True

    def __init__(self) -> None:
        self.asked: list[Request] = []

    async def ask(self, request: Request) -> Decision | None:
        self.asked.append(request)
        kind = (
            DecisionKind.APPROVE
            if request.kind is RequestKind.WAIT_APPROVAL
            else DecisionKind.ANSWER
        )
        return Decision(request_id=request.id, kind=kind, text="yes", by="U0REQ")


async def flow(
    tmp_path: Path, prompt: str, model: ScriptedProvider, tools: Sequence[Tool]
) -> tuple[int, list[Request]]:
    """Run one flow: how many consequential calls it made, and what it asked."""
    rt, _ = await make_runtime(tmp_path / "k.db", model, [*tools, *ask_human_tools()])
    approver = Approver()
    sup = Supervisor(rt)
    live = await sup.start_turn(prompt, requested_by="U0REQ", prompter=approver)
    state = await sup.wait(live)
    assert state.result is not None, "the flow did not finish"
    by_name = {tool.name: tool for tool in rt.tools.current().values()}
    turns = [
        r.entry.turn
        for r in await rt.store.load(live.run_id)
        if isinstance(r.entry, AssistantTurnEntry)
    ]
    await rt.store.close()
    calls = [c for turn in turns for c in turn.calls if consequential(by_name[c.name])]
    return len(calls), approver.asked


def catalog_tools(tmp_path: Path) -> list[Tool]:
    """The chat platforms' test catalog (restart_service, read_log, drain_node)."""
    write_config(tmp_path, "http://127.0.0.1:9")
    return list(load_catalog(tmp_path / "catalog.yaml"))


def scripted(replies: list[Any]) -> ScriptedProvider:
    return ScriptedProvider.from_replies(replies)


FLOWS = {
    "restart": ("checkout is failing, can you look?", restart_script()),
    "drain": ("drain node-3", drain_script(0)),
    "question": ("which region is slow?", question_script()),
}


async def test_the_demo_flow_asks_nothing_for_provenance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KESTREL_DEMO_STATE", str(tmp_path / "state"))
    tools = load_catalog(demo_file("tools/ops.yaml"))
    model = ScriptedProvider(load_script(demo_file("demo.yaml")))
    calls, asked = await flow(tmp_path, "checkout is failing, can you look?", model, tools)
    assert calls == 1  # the restart
    assert [r.tool for r in asked] == ["restart_service", "ask_human_confirm"]
    assert [r for r in asked if r.origins] == []


@pytest.mark.parametrize("name", FLOWS)
async def test_the_test_catalogs_flows_ask_nothing_for_provenance(
    tmp_path: Path, name: str
) -> None:
    prompt, replies = FLOWS[name]
    calls, asked = await flow(tmp_path, prompt, scripted(replies), catalog_tools(tmp_path))
    assert [r for r in asked if r.origins] == []
    # Only what is gated asks: the drain (an ungated effect) runs unasked.
    assert [r.tool for r in asked if r.kind is RequestKind.WAIT_APPROVAL] == (
        ["restart_service"] if name == "restart" else []
    )
    assert calls == (1 if name in ("restart", "drain") else 0)


async def test_the_in_process_test_tools_flows_ask_nothing_for_provenance(tmp_path: Path) -> None:
    replies = [
        {"calls": [{"name": "echo", "arguments": {"text": "checkout v2"}}]},
        {"calls": [{"name": "deploy", "arguments": {"text": "checkout v2"}}]},
        {"calls": [{"name": "write", "arguments": {"text": "release notes for v2"}}]},
        {"text": "done"},
    ]
    prompt = "ship checkout v2 and write release notes for v2"
    calls, asked = await flow(tmp_path, prompt, scripted(replies), counting_tools(Counter()))
    assert calls == 2
    assert [(r.tool, r.origins) for r in asked] == [("deploy", ())]
