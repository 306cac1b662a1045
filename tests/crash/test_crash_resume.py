"""SIGKILL after each kind of journal append, then resume: no model turn asked twice, no
non-idempotent command run twice. Real processes, real SQLite file, real openai client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.fakes.processes import FakeOpenAIProcess

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = [
    {"text": "first", "calls": [{"name": "effect", "arguments": {"name": "a"}}]},
    {
        "text": "two more",
        "calls": [
            {"name": "effect", "arguments": {"name": "b"}},
            {"name": "effect", "arguments": {"name": "c"}},
        ],
    },
    {"text": "all done"},
]

CATALOG = {
    "tools": [
        {
            "name": "effect",
            "description": "Record a side effect (not idempotent)",
            "command": ["/bin/sh", "./effect.sh", "{name}"],
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string", "pattern": "^[a-z]$"}},
                "required": ["name"],
            },
            "idempotent": False,
            "env": ["EFFECTS_FILE"],
        },
        {
            "name": "deploy",
            "description": "Deploy (gated, not idempotent)",
            "command": ["/bin/sh", "./effect.sh", "{name}"],
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string", "pattern": "^[a-z]$"}},
                "required": ["name"],
            },
            "confirm": True,
            "idempotent": False,
            "env": ["EFFECTS_FILE"],
        },
    ]
}

GATED_SCRIPT = [
    {"text": "deploying", "calls": [{"name": "deploy", "arguments": {"name": "d"}}]},
    {"text": "deployed"},
]


@pytest.fixture
def world(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, Path | str]]:
    (tmp_path / "catalog.yaml").write_text(yaml.safe_dump(CATALOG))
    (tmp_path / "effect.sh").write_text('echo "$1" >> "$EFFECTS_FILE"\necho "effect $1 done"\n')
    server = FakeOpenAIProcess(tmp_path, getattr(request, "param", SCRIPT))
    yield {"dir": tmp_path, "base_url": server.base_url}
    server.stop()


def child(world: dict[str, Path | str], *extra: str) -> subprocess.CompletedProcess[str]:
    folder = Path(world["dir"])
    env = dict(os.environ, EFFECTS_FILE=str(folder / "effects.txt"))
    command = [
        sys.executable,
        "-m",
        "tests.crash.child",
        "--db",
        str(folder / "k.db"),
        "--base-url",
        str(world["base_url"]),
        "--catalog",
        str(folder / "catalog.yaml"),
        "--run-id-file",
        str(folder / "run_id"),
        *extra,
    ]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def positions_requested(folder: Path) -> Counter[int]:
    """How often the model was asked at each conversation position (assistant turns so far)."""
    counts: Counter[int] = Counter()
    for line in (folder / "requests.jsonl").read_text().splitlines():
        body = json.loads(line)
        counts[sum(m["role"] == "assistant" for m in body["messages"])] += 1
    return counts


def effects(folder: Path) -> list[str]:
    path = folder / "effects.txt"
    return path.read_text().split() if path.exists() else []


def resume_until_done(world: dict[str, Path | str], run_id: str) -> dict[str, object]:
    out = json.loads(child(world, "--resume", run_id).stdout)
    for _ in range(3):
        if out["status"] != "suspended":
            break
        request = out["requests"][0]
        assert request["kind"] == "wait_effect"
        settled = child(world, "--resume", run_id, "--settle", f"{request['id']}=done")
        assert settled.returncode == 0, settled.stderr
        out = json.loads(settled.stdout)
    return out


@pytest.mark.parametrize(
    ("crash_after", "effects_before"),
    [
        ("assistant_turn:1", 0),  # the first turn journaled, no tool run yet
        ("tool_dispatched:1", 0),  # an effect was about to start: its outcome is uncertain
        ("tool_result:1", 1),  # the first effect answered
        ("tool_result:2", 2),  # mid-batch: between the two calls of the second turn
    ],
)
def test_crash_then_resume_repeats_nothing(
    world: dict[str, Path | str], crash_after: str, effects_before: int
) -> None:
    folder = Path(world["dir"])
    crashed = child(world, "--crash-after", crash_after)
    assert crashed.returncode == -9, crashed.stderr
    assert len(effects(folder)) == effects_before
    run_id = (folder / "run_id").read_text()

    out = resume_until_done(world, run_id)

    assert out["status"] == "completed"
    requested = positions_requested(folder)
    assert all(n == 1 for n in requested.values()), requested
    assert sorted(requested) == [0, 1, 2]
    done = effects(folder)
    assert len(done) == len(set(done)), done
    expected = {"a", "b", "c"} - ({"a"} if crash_after == "tool_dispatched:1" else set())
    assert set(done) == expected


@pytest.mark.parametrize("world", [GATED_SCRIPT], indirect=True)
def test_crash_between_grant_honoured_and_written_asks_again(
    world: dict[str, Path | str],
) -> None:
    folder = Path(world["dir"])
    crashed = child(world, "--approve", "--crash-after", "tool_dispatched:1")
    assert crashed.returncode == -9, crashed.stderr
    run_id = (folder / "run_id").read_text()

    first = json.loads(child(world, "--resume", run_id).stdout)
    assert [r["kind"] for r in first["requests"]] == ["wait_effect"]
    effect = first["requests"][0]["id"]
    retried = child(world, "--resume", run_id, "--settle", f"{effect}=retry")
    out = json.loads(retried.stdout)

    assert out["status"] == "suspended"
    assert [r["kind"] for r in out["requests"]] == ["wait_approval"]
    assert out["requests"][0]["tool"] == "deploy"
    assert effects(folder) == []
