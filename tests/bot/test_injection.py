"""The injection suite: a model that follows an instruction hidden in a tool's output never gets
a consequential call run without a person's decision on a request that showed where the value
came from (real SQLite journal, scripted model, the real loop; effects counted as they run).

``CAUGHT`` holds the payloads whose value stands verbatim in the output (the design's claim);
``MISSED`` the ones it does not claim: there the call runs as any call would (unasked when not
gated), which the last test pins down so that the documented limitation stays true.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from bot.domain import DecisionKind, Request
from bot.run.supervisor import Supervisor
from bot.tools.base import Tool
from bot.tools.python import function_tool
from tests.bot.injection_payloads import CAUGHT, MISSED, Payload
from tests.fakes.runtime import Counter, ScriptedPrompter, call, counting_tools, make_runtime, reply

PROMPT = "the api is slow since this morning, please have a look"


class NoArgs(BaseModel):
    """Nothing."""


class Spec(BaseModel):
    """What to scale."""

    target: str = ""
    replicas: int = 1


class ScaleArgs(BaseModel):
    """The scale tool's arguments: one nested spec."""

    spec: Spec


def source(name: str, output: str) -> Tool:
    """An idempotent read whose output is ``output`` (where the payload hides)."""

    @function_tool(name=name, idempotent=True)
    async def read(args: NoArgs) -> str:
        """Read."""
        return output

    return read


def scale(counter: Counter) -> Tool:
    """``scale``: a non-idempotent effect with nested arguments, not gated."""

    @function_tool(name="scale", idempotent=False)
    async def scale_tool(args: ScaleArgs) -> str:
        """Scale something."""
        counter.hit("scale")
        return "scaled"

    return scale_tool


def effect(payload: Payload, index: int) -> tuple[str, dict[str, Any]]:
    """The consequential call the model makes when it follows the payload."""
    if payload.argument == "spec.target":
        return "scale", {"spec": {"target": payload.value, "replicas": 2}}
    if payload.argument == "spec.replicas":
        return "scale", {"spec": {"target": "api", "replicas": payload.value}}
    # Half the text payloads go to a gated tool, half to an ungated effect.
    return ("deploy" if index % 2 == 0 else "write"), {"text": payload.value}


async def follow(
    tmp_path: Path, payload: Payload, index: int, prompter: ScriptedPrompter | None, first: Any = ()
) -> tuple[str, Counter]:
    """Run a model that reads the payload's output, then follows it; the tool it called."""
    tool, arguments = effect(payload, index)
    replies = [
        *first,
        reply(call(payload.source)),
        reply(call(tool, **arguments)),
        reply(text="done"),
    ]
    counter = Counter()
    tools = [*counting_tools(counter), scale(counter), source(payload.source, payload.output)]
    rt, _ = await make_runtime(tmp_path / "k.db", replies, tools)
    sup = Supervisor(rt)
    live = await sup.start_turn(PROMPT, requested_by="U0REQ", prompter=prompter)
    await sup.wait(live)
    await rt.store.close()
    return tool, counter


def saw_it(request: Request, payload: Payload) -> bool:
    """Whether the request showed where the payload's value came from."""
    return any(
        (o.argument, o.value, o.tool, o.line)
        == (payload.argument, str(payload.value), payload.source, payload.line)
        for o in request.origins
    )


CASES = [pytest.param(p, i, id=p.name) for i, p in enumerate(CAUGHT)]


def test_the_suite_holds_at_least_sixty_payloads_the_design_claims() -> None:
    assert len(CAUGHT) >= 60
    assert len({p.name for p in CAUGHT + MISSED}) == len(CAUGHT) + len(MISSED)


@pytest.mark.parametrize(("payload", "index"), CASES)
async def test_it_runs_only_after_a_decision_that_saw_the_origin(
    tmp_path: Path, payload: Payload, index: int
) -> None:
    prompter = ScriptedPrompter([DecisionKind.APPROVE])
    tool, counter = await follow(tmp_path, payload, index, prompter)
    [asked] = prompter.asked
    assert asked.tool == tool and saw_it(asked, payload), asked.origins
    assert counter.calls.get(tool) == 1


@pytest.mark.parametrize(("payload", "index"), CASES)
async def test_with_no_one_to_decide_it_never_runs(
    tmp_path: Path, payload: Payload, index: int
) -> None:
    tool, counter = await follow(tmp_path, payload, index, None)
    assert tool not in counter.calls


@pytest.mark.parametrize(("payload", "index"), CASES)
async def test_a_grant_for_the_run_does_not_cover_it(
    tmp_path: Path, payload: Payload, index: int
) -> None:
    # The run first deploys and writes what the prompt named; the deploy is approved for the
    # whole run. The injected call is asked again, and denied: it never runs.
    clean = [reply(call("deploy", text="the api")), reply(call("write", text="since this"))]
    prompter = ScriptedPrompter([DecisionKind.APPROVE_ALWAYS, DecisionKind.DENY])
    _, counter = await follow(tmp_path, payload, index, prompter, clean)
    [granted, asked] = prompter.asked
    assert not granted.origins and saw_it(asked, payload)
    assert counter.calls == {"deploy": 1, "write": 1}


@pytest.mark.parametrize("payload", [pytest.param(p, id=p.name) for p in MISSED])
async def test_a_value_not_verbatim_in_the_output_is_not_seen(
    tmp_path: Path, payload: Payload
) -> None:
    # Documented limitation: the model decoded, joined, re-cased or paraphrased what it read.
    assert str(payload.value) not in payload.output
    prompter = ScriptedPrompter([])
    tool, counter = await follow(tmp_path, payload, 1, prompter)  # write: not gated
    assert tool == "write"
    assert counter.calls == {"write": 1} and prompter.asked == []
