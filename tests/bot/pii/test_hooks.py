"""The PII guard through the real loop: prompts, tool outputs, composition, failures, warnings."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from bot import wire
from bot.config.settings import ConfigError, Settings
from bot.domain import Decision, DecisionKind, RunStatus, StopReason, ToolCall
from bot.hooks import HookContext, Hooks, PromptVerdict
from bot.pii.guard import WITHHELD_MESSAGE, PiiBuildError, PiiGuard, PiiHit, PiiMode, PiiSettings
from bot.prompter import DeferringPrompter
from bot.tools.ask_human import ask_human_tools
from bot.tools.propose_plan import propose_plan_tool
from bot.tools.python import function_tool
from tests.bot.cli.test_cli import kestrel, one_line_error, write_config
from tests.fakes.kit import Kit, build_kit, results, user_messages
from tests.fakes.runtime import (
    Counter,
    ScriptedPrompter,
    TextArgs,
    call,
    counting_tools,
    reply,
)

EMAIL = "alice@example.com"
AWS_KEY = "AKIAZ4XQ7PLM3RT5VW2N"
LEAKY = f"owner {EMAIL}, key {AWS_KEY}"
REDACTED = "owner <EMAIL_ADDRESS>, key <AWS_ACCESS_KEY>"

Build = Callable[..., Awaitable[Kit]]


@pytest.fixture
async def kit(tmp_path: Path) -> AsyncIterator[Build]:
    made: list[Kit] = []

    async def build(
        replies: Sequence[Mapping[str, Any]], mode: PiiMode = PiiMode.REDACT, **options: Any
    ) -> Kit:
        options.setdefault("pii", PiiGuard(PiiSettings(mode=mode)))
        made.append(await build_kit(tmp_path / f"k{len(made)}.db", replies, **options))
        return made[-1]

    yield build
    for done in made:
        await done.rt.store.close()


def exploding_scanner(text: str) -> list[PiiHit]:
    """Scans fine, except text that says 'explode'."""
    if "explode" in text:
        raise RuntimeError("scanner exploded on a bad regex")
    return []


# --- prompts ---------------------------------------------------------------------------------


async def test_redact_rewrites_the_prompt_before_it_is_journaled_or_sent(kit: Build) -> None:
    k = await kit([reply(text="ok")])
    state, records = await k.run(f"mail {EMAIL} the report")
    assert user_messages(records) == ["mail <EMAIL_ADDRESS> the report"]
    assert EMAIL not in k.seen_by_model()
    assert EMAIL not in (await k.rt.store.get_run(state.run_id)).prompt
    (advisory,) = k.advisories(state.run_id, source="pii")
    assert "EMAIL_ADDRESS" in advisory and "redacted" in advisory and EMAIL not in advisory


async def test_reject_refuses_the_prompt_and_nothing_reaches_the_model(kit: Build) -> None:
    k = await kit([reply(text="never")], PiiMode.REJECT)
    state, records = await k.run(f"mail {EMAIL} the report")
    assert state.result is not None
    assert state.result.status is RunStatus.FAILED
    assert state.result.stop_reason is StopReason.POLICY
    assert k.model.calls == []
    assert user_messages(records) == []
    assert EMAIL not in (await k.rt.store.get_run(state.run_id)).prompt
    assert EMAIL not in state.result.error
    assert len(k.advisories(state.run_id, source="pii")) == 1
    assert len(k.ends.of(state.run_id)) == 1


# --- tool outputs ----------------------------------------------------------------------------


async def test_redact_rewrites_a_tool_output_for_journal_and_model(kit: Build) -> None:
    k = await kit([reply(call("echo", text=LEAKY)), reply(text="ok")])
    state, records = await k.run()
    (result,) = results(records)
    assert result.output == REDACTED
    assert k.tool_outputs_seen() == [REDACTED]
    (advisory,) = k.advisories(state.run_id, source="pii")
    assert "AWS_ACCESS_KEY" in advisory and "EMAIL_ADDRESS" in advisory
    assert "echo" in advisory
    assert AWS_KEY not in advisory


async def test_reject_withholds_a_tool_output(kit: Build) -> None:
    k = await kit([reply(call("echo", text=LEAKY)), reply(text="ok")], PiiMode.REJECT)
    state, records = await k.run()
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    (result,) = results(records)
    assert result.output == WITHHELD_MESSAGE
    assert k.tool_outputs_seen() == [WITHHELD_MESSAGE]
    assert k.counter.calls == {"echo": 1}
    (advisory,) = k.advisories(state.run_id, source="pii")
    assert "withheld" in advisory


async def test_clean_output_passes_untouched_without_an_advisory(kit: Build) -> None:
    k = await kit([reply(call("echo", text="all 3 pods healthy")), reply(text="ok")])
    state, records = await k.run()
    assert [r.output for r in results(records)] == ["all 3 pods healthy"]
    assert k.advisories(state.run_id, source="pii") == []


# --- composition with the caller's hooks -----------------------------------------------------


async def test_the_scan_reads_what_a_caller_post_tool_hook_added(kit: Build) -> None:
    async def annotate(tool_call: ToolCall, output: str, ctx: HookContext) -> str:
        return f"{output} (rotated {AWS_KEY})"

    k = await kit(
        [reply(call("echo", text="rotation done")), reply(text="ok")],
        hooks=Hooks(post_tool_use=[annotate]),
    )
    state, records = await k.run()
    assert [r.output for r in results(records)] == ["rotation done (rotated <AWS_ACCESS_KEY>)"]
    assert AWS_KEY not in k.seen_by_model()
    assert len(k.advisories(state.run_id, source="pii")) == 1


async def test_the_scan_reads_what_a_caller_post_tool_hook_removed(kit: Build) -> None:
    async def scrub(tool_call: ToolCall, output: str, ctx: HookContext) -> str:
        return output.replace(EMAIL, "[owner]")

    k = await kit(
        [reply(call("echo", text=f"owner {EMAIL}")), reply(text="ok")],
        hooks=Hooks(post_tool_use=[scrub]),
    )
    state, records = await k.run()
    assert [r.output for r in results(records)] == ["owner [owner]"]
    assert k.advisories(state.run_id, source="pii") == []


async def test_the_scan_reads_a_caller_prompt_rewrite(kit: Build) -> None:
    async def sign(text: str, ctx: HookContext) -> PromptVerdict:
        return PromptVerdict(text=f"{text} -- reply to {EMAIL}")

    k = await kit([reply(text="ok")], hooks=Hooks(user_prompt_submit=[sign]))
    _state, records = await k.run("status?")
    assert user_messages(records) == ["status? -- reply to <EMAIL_ADDRESS>"]


async def test_a_caller_prompt_deny_comes_before_the_scan(kit: Build) -> None:
    async def deny(text: str, ctx: HookContext) -> PromptVerdict:
        return PromptVerdict(allow=False, reason="off hours")

    k = await kit([reply(text="never")], hooks=Hooks(user_prompt_submit=[deny]))
    state, _ = await k.run(f"mail {EMAIL}")
    assert state.result is not None and "off hours" in state.result.error
    assert k.advisories(state.run_id, source="pii") == []


# --- a scan that fails counts as a hit -------------------------------------------------------


@pytest.mark.parametrize("mode", [PiiMode.REDACT, PiiMode.REJECT])
async def test_a_failed_output_scan_withholds_and_tells_only_the_operator(
    kit: Build, mode: PiiMode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    guard = PiiGuard(PiiSettings(mode=mode), scanner=exploding_scanner)
    k = await kit([reply(call("echo", text="please explode")), reply(text="ok")], pii=guard)
    state, records = await k.run()
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    (result,) = results(records)
    assert result.output == WITHHELD_MESSAGE
    assert k.tool_outputs_seen() == [WITHHELD_MESSAGE]
    (advisory,) = k.advisories(state.run_id, source="pii")
    assert "RuntimeError: scanner exploded on a bad regex" in advisory
    assert "scanner exploded" in caplog.text
    assert "scanner exploded" not in k.seen_by_model()
    assert "panic" not in k.rec.kinds()


async def test_a_failed_prompt_scan_under_reject_refuses_the_prompt(kit: Build) -> None:
    guard = PiiGuard(PiiSettings(mode=PiiMode.REJECT), scanner=exploding_scanner)
    k = await kit([reply(text="never")], pii=guard)
    state, records = await k.run("explode the cluster")
    assert state.result is not None and state.result.stop_reason is StopReason.POLICY
    assert k.model.calls == []
    assert user_messages(records) == []
    (advisory,) = k.advisories(state.run_id, source="pii")
    assert "scanner exploded" in advisory


async def test_a_failed_prompt_scan_under_redact_sends_no_unscanned_text(kit: Build) -> None:
    guard = PiiGuard(PiiSettings(mode=PiiMode.REDACT), scanner=exploding_scanner)
    k = await kit([reply(text="ok")], pii=guard)
    state, records = await k.run(f"explode {EMAIL}")
    assert user_messages(records) == [WITHHELD_MESSAGE]
    assert EMAIL not in k.seen_by_model()
    assert EMAIL not in (await k.rt.store.get_run(state.run_id)).prompt
    assert len(k.advisories(state.run_id, source="pii")) == 1


# --- the operator warning: once per run ------------------------------------------------------


async def test_forty_hits_raise_one_warning(kit: Build) -> None:
    batches = [
        reply(*(call("echo", text=f"user{20 * b + i}@example.com {AWS_KEY}") for i in range(20)))
        for b in range(2)
    ]
    k = await kit([*batches, reply(text="done")])
    state, records = await k.run(f"start with {EMAIL}")
    assert state.result is not None and state.result.status is RunStatus.COMPLETED
    outputs = [r.output for r in results(records)]
    assert len(outputs) == 40
    assert all(o == "<EMAIL_ADDRESS> <AWS_ACCESS_KEY>" for o in outputs)
    assert len(k.advisories(state.run_id, source="pii")) == 1


async def test_forty_failed_scans_raise_one_warning_and_forty_log_lines(
    kit: Build, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kestrel.pii")
    guard = PiiGuard(PiiSettings(), scanner=exploding_scanner)
    batch = reply(*(call("echo", text=f"explode {i}") for i in range(40)))
    k = await kit([batch, reply(text="done")], pii=guard)
    state, records = await k.run()
    assert [r.output for r in results(records)] == [WITHHELD_MESSAGE] * 40
    (advisory,) = k.advisories(state.run_id, source="pii")
    assert "scanner exploded" in advisory
    assert caplog.text.count("scanner exploded") == 40


async def test_each_run_gets_its_own_single_warning(kit: Build) -> None:
    k = await kit([reply(call("echo", text=LEAKY), call("echo", text=LEAKY)), reply(text="ok")])
    first = await k.sup.start_turn("one")
    second = await k.sup.start_turn("two")
    await asyncio.gather(k.sup.wait(first), k.sup.wait(second))
    assert len(k.advisories(first.run_id, source="pii")) == 1
    assert len(k.advisories(second.run_id, source="pii")) == 1


async def test_one_warning_across_a_suspend_and_resume(kit: Build) -> None:
    k = await kit(
        [
            reply(call("echo", text=LEAKY), call("deploy", text="v2")),
            reply(call("echo", text=LEAKY)),
            reply(text="done"),
        ]
    )
    state, _ = await k.run(prompter=DeferringPrompter())
    assert state.status is RunStatus.SUSPENDED
    (request,) = state.open_requests
    decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0BOSS")
    await k.sup.answer(decision, run_id=state.run_id)
    resumed = await k.sup.resume(state.run_id)
    assert resumed is not None
    await k.sup.wait(resumed)
    records = await k.rt.store.load(state.run_id)
    assert [r.output for r in results(records)] == [REDACTED, "deployed v2", REDACTED]
    assert len(k.advisories(state.run_id, source="pii")) == 1


# --- every path into the loop ----------------------------------------------------------------


async def test_a_deferred_answer_is_scanned_like_any_tool_output(kit: Build) -> None:
    counter = Counter()
    tools = [*counting_tools(counter), *ask_human_tools()]
    ask = call("ask_human_input", question="who owns checkout?")
    k = await kit([reply(ask), reply(text="thanks")], tools=tools)
    state, _ = await k.run(prompter=DeferringPrompter())
    (request,) = state.open_requests
    answer = Decision(request_id=request.id, kind=DecisionKind.ANSWER, text=LEAKY, by="U0REQ")
    assert (await k.sup.answer(answer, run_id=state.run_id)).ready
    resumed = await k.sup.resume(state.run_id)
    assert resumed is not None
    await k.sup.wait(resumed)
    assert EMAIL not in k.seen_by_model()
    assert AWS_KEY not in k.seen_by_model()


async def test_a_deny_reason_decided_later_is_scanned_before_the_model(kit: Build) -> None:
    k = await kit([reply(call("deploy", text="v2")), reply(text="ok")])
    state, _ = await k.run(prompter=DeferringPrompter())
    (request,) = state.open_requests
    deny = Decision(request_id=request.id, kind=DecisionKind.DENY, text=LEAKY, by="U0BOSS")
    assert (await k.sup.answer(deny, run_id=state.run_id)).ready
    resumed = await k.sup.resume(state.run_id)
    assert resumed is not None
    await k.sup.wait(resumed)
    records = await k.rt.store.load(state.run_id)
    assert [r.output for r in results(records)] == [f"denied by U0BOSS: {REDACTED}"]
    assert EMAIL not in k.seen_by_model() and AWS_KEY not in k.seen_by_model()
    assert k.counter.calls == {}


@pytest.mark.parametrize("kind", [DecisionKind.DENY, DecisionKind.ANSWER])
async def test_what_a_person_typed_is_kept_as_the_model_reads_it(
    kit: Build, kind: DecisionKind
) -> None:
    # The run page, its export, `runs show --json` and the card read the stored decision and
    # the journal: they must not show what the model and the audit never see.
    counter = Counter()
    tools = [*counting_tools(counter), *ask_human_tools()]
    first = (
        call("deploy", text="v2")
        if kind is DecisionKind.DENY
        else call("ask_human_input", question="who owns checkout?")
    )
    k = await kit([reply(first), reply(text="ok")], tools=tools)
    state, _ = await k.run(prompter=DeferringPrompter())
    (request,) = state.open_requests
    by = "U0BOSS" if kind is DecisionKind.DENY else "U0REQ"
    said = Decision(request_id=request.id, kind=kind, text=LEAKY, by=by)
    assert (await k.sup.answer(said, run_id=state.run_id)).ready
    _request, _status, stored = await k.rt.store.get_request(request.id)
    assert stored is not None and stored.text == REDACTED
    resumed = await k.sup.resume(state.run_id)
    assert resumed is not None
    await k.sup.wait(resumed)
    journal = wire.to_json([r.entry for r in await k.rt.store.load(state.run_id)])
    assert EMAIL not in journal and AWS_KEY not in journal


async def test_a_deny_reason_typed_at_once_is_scanned_before_the_model(kit: Build) -> None:
    k = await kit([reply(call("deploy", text="v2")), reply(text="ok")])
    _state, records = await k.run(prompter=ScriptedPrompter([DecisionKind.DENY], text=LEAKY))
    assert [r.output for r in results(records)] == [f"denied by U0APPROVER: {REDACTED}"]
    assert EMAIL not in k.seen_by_model() and AWS_KEY not in k.seen_by_model()


async def test_a_plan_deny_reason_typed_at_once_is_scanned_before_the_model(kit: Build) -> None:
    counter = Counter()
    tools = [*counting_tools(counter), propose_plan_tool()]
    steps = [{"tool": "deploy", "arguments": {"text": "v2"}, "why": "ship"}]
    plan = call("propose_plan", summary="ship v2", steps=steps)
    k = await kit([reply(plan), reply(text="ok")], tools=tools)
    _state, records = await k.run(prompter=ScriptedPrompter([DecisionKind.DENY], text=LEAKY))
    (result,) = results(records)
    assert REDACTED in result.output
    assert EMAIL not in k.seen_by_model() and AWS_KEY not in k.seen_by_model()


async def test_a_tool_s_exception_is_logged_with_its_text_redacted(
    kit: Build, caplog: pytest.LogCaptureFixture
) -> None:
    @function_tool(name="login", idempotent=True)
    async def login(args: TextArgs) -> str:
        """Log in somewhere, and fail saying what it was given."""
        raise PermissionError(f"login for {EMAIL} refused with key {AWS_KEY}")

    caplog.set_level(logging.WARNING)
    k = await kit([reply(call("login", text="x")), reply(text="ok")], tools=[login])
    await k.run()
    assert "tool login raised" in caplog.text
    assert "PermissionError: login for <EMAIL_ADDRESS> refused" in caplog.text
    assert "in login" in caplog.text  # the traceback's frames are still there
    assert EMAIL not in caplog.text and AWS_KEY not in caplog.text
    assert EMAIL not in k.seen_by_model()


# --- a scanner that will not build -----------------------------------------------------------


def test_a_scanner_that_will_not_build_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.cli import compose

    def broken(entities: object) -> Any:
        raise PiiBuildError("recognizers cannot load")

    monkeypatch.setattr("bot.pii.guard._build_scanner", broken)
    with pytest.raises(ConfigError, match="pii: the scanner will not build: recognizers"):
        compose.build_guard(Settings(pii=PiiSettings(mode=PiiMode.REDACT)))
    assert compose.build_guard(Settings(pii=PiiSettings(mode=PiiMode.OFF))).mode is PiiMode.OFF


def test_run_with_an_unknown_pii_entity_is_one_line(tmp_path: Path) -> None:
    write_config(tmp_path, pii={"mode": "redact", "entities": ["EMAIL_ADDRESS", "SHOE_SIZE"]})
    message = one_line_error(kestrel(tmp_path, "run", "checkout is failing"))
    assert "pii.entities: unknown entity type(s) SHOE_SIZE" in message
    assert not (tmp_path / "kestrel.db").exists()


def test_run_whose_scanner_will_not_build_is_one_line(tmp_path: Path) -> None:
    patched = (
        "import bot.pii.guard\n"
        "def broken(entities):\n"
        "    raise bot.pii.guard.PiiBuildError('recognizers cannot load')\n"
        "bot.pii.guard._build_scanner = broken\n"
        "from bot.cli.main import main\n"
        "main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", patched, "run", "checkout is failing"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "KESTREL_"))},
        timeout=60,
        check=False,
    )
    message = one_line_error(result)
    assert "pii: the scanner will not build: recognizers cannot load" in message
    assert not (tmp_path / "kestrel.db").exists()
