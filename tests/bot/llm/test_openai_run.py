"""Whole runs on the OpenAI provider against the fake server: what a bad server does to a run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bot.domain import Budgets, Reasoning, RunStatus, StopReason
from bot.events import AdvisoryEvent
from bot.journal.entries import AssistantTurnEntry
from bot.journal.fold import RunState
from bot.journal.log import JournalRecord
from bot.llm.openai_provider import OpenAIProvider
from bot.run.supervisor import Supervisor
from tests.fakes.openai_server import (
    Canned,
    FakeOpenAI,
    account_error,
    chat_completion,
    function_call_completion,
    huge_reply,
    insufficient_quota,
    non_json_200,
)
from tests.fakes.runtime import Counter, Recorder, counting_tools, make_runtime


async def _run(
    tmp_path: Path,
    fake: FakeOpenAI,
    *,
    budgets: Budgets | None = None,
    model_timeout: float = 60.0,
    max_reply_bytes: int = 1 << 20,
) -> tuple[RunState, Counter, list[JournalRecord], Recorder]:
    model = OpenAIProvider(
        "m", api_key="k", base_url=fake.base_url, max_retries=2, max_reply_bytes=max_reply_bytes
    )
    counter = Counter()
    rt, rec = await make_runtime(tmp_path / "k.db", model, counting_tools(counter), budgets=budgets)
    rt.model_timeout = model_timeout
    try:
        sup = Supervisor(rt)
        state = await sup.wait(await sup.start_turn("help", requested_by="U0REQ"))
        records = await rt.store.load(state.run_id)
    finally:
        await rt.store.close()
        await model.aclose()
    return state, counter, records, rec


async def test_a_non_json_200_fails_the_run_as_a_model_error(tmp_path: Path) -> None:
    async with FakeOpenAI([{"text": "unused"}], canned=[non_json_200()]) as fake:
        state, _, _, rec = await _run(tmp_path, fake)

    assert state.result is not None
    assert (state.result.status, state.result.stop_reason) == (
        RunStatus.FAILED,
        StopReason.MODEL_ERROR,
    )
    assert "expected a chat completion" in state.result.error
    assert "panic" not in rec.kinds()


async def test_duplicate_ids_run_each_call_once_and_answer_each(tmp_path: Path) -> None:
    first = chat_completion(
        calls=[("call_0", "echo", '{"text": "a"}'), ("call_0", "echo", '{"text": "b"}')]
    )
    script = [{"text": "unused"}, {"text": "done"}]
    async with FakeOpenAI(script, canned=[Canned(status=200, body=first)]) as fake:
        state, counter, _, _ = await _run(tmp_path, fake)

    assert state.result is not None
    assert state.result.stop_reason is StopReason.ANSWERED
    assert counter.calls == {"echo": 2}
    second = fake.requests[1]["messages"]
    assistant = next(m for m in second if m["role"] == "assistant")
    sent_ids = [c["id"] for c in assistant["tool_calls"]]
    answered = [(m["tool_call_id"], m["content"]) for m in second if m["role"] == "tool"]
    assert len(set(sent_ids)) == 2
    assert answered == [(sent_ids[0], "a"), (sent_ids[1], "b")]


async def test_one_call_sent_twice_with_its_id_runs_once_and_is_answered_once(
    tmp_path: Path,
) -> None:
    # Same id, same tool, same arguments (spaced otherwise): one call, whatever the server did.
    first = chat_completion(
        calls=[("call_0", "echo", '{"text": "a"}'), ("call_0", "echo", '{"text":"a"}')]
    )
    script = [{"text": "unused"}, {"text": "done"}]
    async with FakeOpenAI(script, canned=[Canned(status=200, body=first)]) as fake:
        state, counter, records, _ = await _run(tmp_path, fake)

    assert state.result is not None
    assert state.result.stop_reason is StopReason.ANSWERED
    assert counter.calls == {"echo": 1}
    assert [r.entry.kind for r in records].count("tool_result") == 1
    second = fake.requests[1]["messages"]
    assistant = next(m for m in second if m["role"] == "assistant")
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_0"]
    assert [m["tool_call_id"] for m in second if m["role"] == "tool"] == ["call_0"]


async def test_a_hanging_server_does_not_overrun_the_run_deadline(tmp_path: Path) -> None:
    async with FakeOpenAI(hang=True) as fake:
        started = time.monotonic()
        state, _, _, _ = await _run(tmp_path, fake, budgets=Budgets(deadline_seconds=1.5))
        elapsed = time.monotonic() - started

    assert state.result is not None
    assert state.result.status is RunStatus.FAILED
    # Retried per attempt, this took three timeouts plus backoff (about 5 s).
    assert elapsed < 1.5 + 1.5


async def test_a_reply_over_the_cap_ends_the_run_with_a_clear_error(tmp_path: Path) -> None:
    canned = [huge_reply(2 << 20)]
    async with FakeOpenAI([{"text": "unused"}], canned=canned) as fake:
        state, _, records, _ = await _run(tmp_path, fake, max_reply_bytes=1 << 20)

    assert state.result is not None
    assert state.result.stop_reason is StopReason.MODEL_ERROR
    assert "larger than 1048576 bytes (model.max_reply_bytes)" in state.result.error
    assert "assistant_turn" not in [r.entry.kind for r in records]


async def test_an_undecodable_error_page_fails_the_run_without_a_panic(tmp_path: Path) -> None:
    page = Canned(status=502, raw="<html>Bad Gateway</html>", headers={"content-encoding": "gzip"})
    async with FakeOpenAI([{"text": "unused"}], canned=[page] * 3) as fake:
        state, _, _, rec = await _run(tmp_path, fake)

    assert state.result is not None
    assert state.result.stop_reason is StopReason.MODEL_ERROR
    assert "no usable reply from" in state.result.error
    assert "panic" not in rec.kinds()


async def test_a_retry_is_said_to_the_run_while_it_waits_and_not_journaled(tmp_path: Path) -> None:
    # A rate limit held a run for up to model.timeout with nothing said where people watch
    # (the terminal chat shows a run's advisories); the warning went only to the log.
    limited = Canned(status=429, headers={"retry-after": "0.05"})
    async with FakeOpenAI([{"text": "done"}], canned=[limited]) as fake:
        state, _, records, rec = await _run(tmp_path, fake)

    assert state.result is not None and state.result.text == "done"
    said = [e.text for e in rec.events if isinstance(e, AdvisoryEvent)]
    assert said == [
        f"model call: 429 Too Many Requests from {fake.base_url}: fake server error 429;"
        " trying again in 0.05s (retry 1 of 2)"
    ]
    assert "advisory" not in [r.entry.kind for r in records]


async def test_an_exhausted_quota_fails_the_run_at_once_as_a_model_error(tmp_path: Path) -> None:
    # It was retried as a rate limit, said to the thread as one, and the run failed as one.
    async with FakeOpenAI([{"text": "unused"}], canned=[insufficient_quota()] * 3) as fake:
        state, _, _, rec = await _run(tmp_path, fake)

    assert state.result is not None
    assert (state.result.status, state.result.stop_reason) == (
        RunStatus.FAILED,
        StopReason.MODEL_ERROR,
    )
    assert "the account's quota is used up: check its plan and billing" in state.result.error
    assert fake.count == 1
    assert not [e for e in rec.events if isinstance(e, AdvisoryEvent)]


async def test_credits_used_up_fail_the_run_at_once_naming_the_billing(tmp_path: Path) -> None:
    # Said as a rate limit to the thread twice, retried, and failed naming none of it.
    words = "Your team has used all available credits. Please purchase more credits."
    async with FakeOpenAI([{"text": "unused"}], canned=[account_error(429, words)] * 3) as fake:
        state, _, _, rec = await _run(tmp_path, fake)

    assert state.result is not None
    assert (state.result.status, state.result.stop_reason) == (
        RunStatus.FAILED,
        StopReason.MODEL_ERROR,
    )
    assert words in state.result.error
    assert "the account's quota is used up: check its plan and billing" in state.result.error
    assert fake.count == 1
    assert not [e for e in rec.events if isinstance(e, AdvisoryEvent)]


async def test_a_legacy_function_call_runs_its_tool_and_is_answered(tmp_path: Path) -> None:
    # The run ended "answered" with an empty answer, the tool never run.
    legacy = Canned(status=200, body=function_call_completion("echo", '{"text": "a"}'))
    async with FakeOpenAI([{"text": "unused"}, {"text": "done"}], canned=[legacy]) as fake:
        state, counter, records, _ = await _run(tmp_path, fake)

    assert state.result is not None
    assert (state.result.stop_reason, state.result.text) == (StopReason.ANSWERED, "done")
    assert counter.calls == {"echo": 1}
    assert fake.count == 2
    journaled = [r.entry for r in records if isinstance(r.entry, AssistantTurnEntry)]
    call_id = journaled[0].turn.calls[0].id
    second = fake.requests[1]["messages"]
    assistant = next(m for m in second if m["role"] == "assistant")
    assert [c["id"] for c in assistant["tool_calls"]] == [call_id]
    assert [(m["tool_call_id"], m["content"]) for m in second if m["role"] == "tool"] == [
        (call_id, "a")
    ]


@pytest.mark.parametrize(
    ("field", "other"),
    [
        # DeepSeek (and vLLM before 0.17).
        ("reasoning_content", "reasoning"),
        # vLLM from 0.17, OpenRouter, Groq: a server that does not know the other refuses it.
        ("reasoning", "reasoning_content"),
    ],
)
async def test_the_models_reasoning_beside_its_calls_goes_back_with_them(
    tmp_path: Path, field: str, other: str
) -> None:
    # DeepSeek's thinking mode (on by default) refuses the next request with a 400 ("The
    # reasoning_content in the thinking mode must be passed back to the API") unless a reply's
    # reasoning_content comes back with its tool calls: every run that called a tool failed.
    said = chat_completion("Echoing.", calls=[("c1", "echo", '{"text": "a"}')])
    said["choices"][0]["message"][field] = "The user wants an echo of a."
    async with FakeOpenAI(
        [{"text": "unused"}, {"text": "done"}], canned=[Canned(status=200, body=said)]
    ) as fake:
        state, counter, records, _ = await _run(tmp_path, fake)

    assert state.result is not None and state.result.text == "done"
    assert counter.calls == {"echo": 1}
    (assistant,) = [m for m in fake.requests[1]["messages"] if m["role"] == "assistant"]
    assert assistant[field] == "The user wants an echo of a."
    assert other not in assistant
    assert assistant["content"] == "Echoing."
    # Journaled with the reply: a run resumed elsewhere sends it back too.
    first = next(r.entry.turn for r in records if isinstance(r.entry, AssistantTurnEntry))
    assert first.reasoning == Reasoning(field=field, text="The user wants an echo of a.")


async def test_a_calls_thought_signature_goes_back_with_it(tmp_path: Path) -> None:
    # Gemini 3 through its OpenAI-compatible endpoint signs each call in extra_content and
    # refuses the next request (400) when the call comes back without it.
    said = chat_completion(calls=[("c1", "echo", '{"text": "a"}')])
    signed = {"google": {"thought_signature": "c2lnbmVk"}}
    said["choices"][0]["message"]["tool_calls"][0]["extra_content"] = signed
    async with FakeOpenAI(
        [{"text": "unused"}, {"text": "done"}], canned=[Canned(status=200, body=said)]
    ) as fake:
        state, counter, records, _ = await _run(tmp_path, fake)

    assert state.result is not None and state.result.text == "done"
    assert counter.calls == {"echo": 1}
    (assistant,) = [m for m in fake.requests[1]["messages"] if m["role"] == "assistant"]
    assert assistant["tool_calls"][0]["extra_content"] == signed
    first = next(r.entry.turn for r in records if isinstance(r.entry, AssistantTurnEntry))
    assert json.loads(first.calls[0].extra_content) == signed  # kept for a resume elsewhere


async def test_a_call_without_extra_content_goes_back_without_it(tmp_path: Path) -> None:
    said = chat_completion(calls=[("c1", "echo", '{"text": "a"}')])
    async with FakeOpenAI(
        [{"text": "unused"}, {"text": "done"}], canned=[Canned(status=200, body=said)]
    ) as fake:
        await _run(tmp_path, fake)

    (assistant,) = [m for m in fake.requests[1]["messages"] if m["role"] == "assistant"]
    assert "extra_content" not in assistant["tool_calls"][0]
