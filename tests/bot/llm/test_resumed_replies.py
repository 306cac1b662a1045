"""A run resumed from its journal sends the model the history the live run would have sent:
the same words, reasoning, calls and what a server added to them, through the real ``openai``
client against the fake server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.domain import Decision, DecisionKind
from bot.llm.openai_provider import OpenAIProvider
from bot.run.supervisor import Supervisor
from tests.fakes.openai_server import Canned, FakeOpenAI, chat_completion
from tests.fakes.runtime import Counter, ScriptedPrompter, counting_tools, make_runtime

DEPLOY = '{"text": "v2"}'


def _written() -> dict[str, Any]:
    # A server without a reasoning or tool-call parser: all of it in the text.
    said = (
        "<think>\nThey want v2 out.\n</think>\n\nDeploying v2.\n"
        f'<tool_call>\n{{"name": "deploy", "arguments": {DEPLOY}}}\n</tool_call>'
    )
    return chat_completion(said)


def _parsed() -> dict[str, Any]:
    # Reasoning sent apart (DeepSeek) and a signed call (Gemini 3).
    body = chat_completion("Deploying v2.", calls=[("call_1", "deploy", DEPLOY)])
    message = body["choices"][0]["message"]
    message["reasoning_content"] = "They want v2 out."
    message["tool_calls"][0]["extra_content"] = {"google": {"thought_signature": "c2ln"}}
    return body


async def _live(db: Path, reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages of the second model call of a run whose call is approved at once."""
    canned = [Canned(status=200, body=reply)]
    async with FakeOpenAI([{"text": "unused"}, {"text": "done"}], canned=canned) as fake:
        model = OpenAIProvider("m", api_key="k", base_url=fake.base_url)
        rt, _ = await make_runtime(db, model, counting_tools(Counter()))
        try:
            sup = Supervisor(rt)
            prompter = ScriptedPrompter([DecisionKind.APPROVE])
            await sup.wait(await sup.start_turn("ship", requested_by="U0REQ", prompter=prompter))
        finally:
            await rt.store.close()
            await model.aclose()
    messages: list[dict[str, Any]] = fake.requests[1]["messages"]
    return messages


async def _resumed(db: Path, reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The same, the call approved later and the run resumed by another process."""
    canned = [Canned(status=200, body=reply)]
    async with FakeOpenAI([{"text": "unused"}], canned=canned) as first:
        model = OpenAIProvider("m", api_key="k", base_url=first.base_url)
        rt, _ = await make_runtime(db, model, counting_tools(Counter()))
        try:
            sup = Supervisor(rt)
            run = await sup.start_turn(
                "ship", requested_by="U0REQ", prompter=ScriptedPrompter([None])
            )
            (request,) = (await sup.wait(run)).open_requests
        finally:
            await rt.store.close()
            await model.aclose()
    async with FakeOpenAI([{"text": "done"}]) as second:
        model = OpenAIProvider("m", api_key="k", base_url=second.base_url)
        rt, _ = await make_runtime(db, model, counting_tools(Counter()))
        try:
            sup = Supervisor(rt)
            decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APP")
            answered = await sup.answer(decision, run_id=run.run_id)
            resumed = await sup.resume(run.run_id, claimed=answered.claimed)
            assert resumed is not None
            await sup.wait(resumed)
        finally:
            await rt.store.close()
            await model.aclose()
    messages: list[dict[str, Any]] = second.requests[0]["messages"]
    return messages


@pytest.mark.parametrize("reply", [_written(), _parsed()], ids=["written", "parsed"])
async def test_a_resumed_run_sends_the_history_the_live_run_sends(
    tmp_path: Path, reply: dict[str, Any]
) -> None:
    live = await _live(tmp_path / "live.db", reply)
    resumed = await _resumed(tmp_path / "resumed.db", reply)

    def replayed(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [m for m in messages if m["role"] in ("assistant", "tool")]

    assert replayed(resumed) == replayed(live)
    (assistant,) = [m for m in live if m["role"] == "assistant"]
    assert assistant["tool_calls"][0]["function"] == {"name": "deploy", "arguments": DEPLOY}
    assert "tool_call>" not in (assistant["content"] or "")
