"""The paths to execution test_crash_resume does not take, under SIGKILL after each kind of
journal append: a call made after a person answered a question, a run resumed with --force past
a changed catalog, an in-process function tool and an MCP server's tool. No effect runs again
without a fresh decision by on-call. Real processes, a real SQLite file or PostgreSQL schema,
real openai client (the harness of test_crash_resume)."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.crash.database import kill_points
from tests.crash.test_crash_resume import (
    GATED_SCRIPT,
    assert_finished_each_effect_once,
    child,
    effects,
)

# The model asks a person first, then makes the call the answer allows.
QUESTION_SCRIPT: list[dict[str, object]] = [
    {
        "text": "asking first",
        "calls": [{"name": "ask_human_confirm", "arguments": {"question": "record e?"}}],
    },
    {"text": "recording", "calls": [{"name": "effect", "arguments": {"name": "e"}}]},
    {"text": "done"},
]


def batch_script(tool: str) -> list[dict[str, object]]:
    """One call of ``tool`` (not idempotent), then two in one reply."""
    return [
        {"text": "first", "calls": [{"name": tool, "arguments": {"name": "a"}}]},
        {
            "text": "two more",
            "calls": [
                {"name": tool, "arguments": {"name": "b"}},
                {"name": tool, "arguments": {"name": "c"}},
            ],
        },
        {"text": "all done"},
    ]


# The in-process ``record`` tool, and the fake MCP server's (not gated).
FUNCTION_SCRIPT = batch_script("record")
MCP_SCRIPT = batch_script("srv__record")

# Each path with the append kinds (``kind:N``, the N-th of this process) its deciding process
# makes, so that the kill lands between every two durable steps of it.
PATHS: dict[str, tuple[list[dict[str, object]], list[str]]] = {
    "answered_question": (
        QUESTION_SCRIPT,
        [
            "decided",
            "run_resumed",
            "answer_supplied",
            "tool_result",  # the answer, as the question's result
            "assistant_turn",
            "tool_dispatched",
            "tool_process",
            "tool_result:2",
            "run_ended",
        ],
    ),
    "forced": (
        GATED_SCRIPT,
        [
            "run_resumed",
            "answer_supplied",
            "tool_dispatched",
            "tool_process",
            "tool_result",
            "grant_written",
            "assistant_turn",
            "run_ended",
        ],
    ),
    # The approved tool itself changed: its approval covers it no more, and it asks again.
    "forced_tool_changed": (
        GATED_SCRIPT,
        ["run_resumed", "answer_supplied", "tool_deferred", "run_suspended"],
    ),
    "function_tool": (
        FUNCTION_SCRIPT,
        [
            "assistant_turn",
            "tool_dispatched",
            "tool_result",
            "assistant_turn:2",
            "tool_dispatched:2",
            "tool_result:2",
            "tool_dispatched:3",
            "tool_result:3",
            "run_ended",
        ],
    ),
    "mcp_tool": (
        MCP_SCRIPT,
        [
            "assistant_turn",
            "tool_dispatched",
            "tool_result",
            "assistant_turn:2",
            "tool_dispatched:2",
            "tool_result:2",
            "tool_dispatched:3",
            "tool_result:3",
            "run_ended",
        ],
    ),
}

# What every process of a path is given: the MCP server. Past a changed catalog, none is given
# --force after the crashed one: a forced resume's run_resumed accepts the change for them.
LATER: dict[str, tuple[str, ...]] = {
    "mcp_tool": ("--mcp",),
}


def change_catalog(folder: Path, path: str) -> None:
    """The tool set the run started with is no longer the one: a tool added to the catalog, or
    (``forced_tool_changed``) the approved ``deploy`` described anew."""
    catalog = yaml.safe_load((folder / "catalog.yaml").read_text())
    if path == "forced_tool_changed":
        deploy = next(tool for tool in catalog["tools"] if tool["name"] == "deploy")
        deploy["description"] = "Deploy, as edited since the card"
    else:
        added = {**catalog["tools"][0], "name": "added", "description": "Added since the start"}
        catalog["tools"].append(added)
    (folder / "catalog.yaml").write_text(yaml.safe_dump(catalog))


def deciding_process(
    world: dict[str, Path | str], path: str, crash: str
) -> subprocess.CompletedProcess[str]:
    """Bring the run to where ``path`` reaches execution, in a process that crashes on cue."""
    folder = Path(world["dir"])
    crash_args = ["--crash-after", crash if ":" in crash else f"{crash}:1"]
    if path in ("function_tool", "mcp_tool"):
        return child(world, *LATER.get(path, ()), *crash_args)
    (request,) = json.loads(child(world).stdout)["requests"]
    run_id = (folder / "run_id").read_text()
    if path == "answered_question":
        assert request["kind"] == "wait_user", request
        return child(
            world, "--resume", run_id, "--settle", f"{request['id']}=answer:yes", *crash_args
        )
    assert path in ("forced", "forced_tool_changed")
    change_catalog(folder, path)
    approved = child(world, "--resume", run_id, "--settle", f"{request['id']}=approve")
    # The approval is recorded; the run waits for someone to resume it past the change.
    assert "resume with --force" in json.loads(approved.stdout)["refused"], approved.stdout
    return child(world, "--resume", run_id, "--force", *crash_args)


# The paths on PostgreSQL too, where a replica takes them in a deployment of several, killed
# where a call's fate is decided: as the decision lands, as its effect starts, runs and ends
# (every kind above is killed on SQLite). An MCP server's call journals what a function's
# does, so its transport, slow to start, is killed on SQLite alone.
ON_POSTGRES: dict[str, list[str]] = {
    "answered_question": ["answer_supplied", "tool_dispatched", "tool_process", "tool_result:2"],
    "forced": ["answer_supplied", "tool_dispatched", "tool_process", "tool_result"],
    "forced_tool_changed": ["answer_supplied", "tool_deferred"],
    "function_tool": ["tool_dispatched", "tool_result", "tool_dispatched:3", "tool_result:3"],
}


@pytest.mark.parametrize(
    ("world", "store_name", "path", "crash"),
    kill_points(PATHS, ON_POSTGRES, exactly=True),
    indirect=["world"],
)
def test_no_effect_runs_again_without_a_fresh_decision(
    world: dict[str, Path | str], path: str, crash: str
) -> None:
    folder = Path(world["dir"])
    retries: Counter[str] = Counter()
    crashed = deciding_process(world, path, crash)
    assert crashed.returncode == -9, f"no {crash} append on this path: {crashed.stderr}"
    run_id = (folder / "run_id").read_text()

    assert_finished_each_effect_once(world, run_id, retries, *LATER.get(path, ()))
    # Every effect the model asked for took place: the tool did run, on each path.
    assert set(effects(folder)) == names_recorded(PATHS[path][0])


def names_recorded(script: list[dict[str, Any]]) -> set[str]:
    """The names the script's calls record (a question records none)."""
    calls = [call for reply in script for call in reply.get("calls", [])]
    return {call["arguments"]["name"] for call in calls if "name" in call["arguments"]}
