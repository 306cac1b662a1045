"""SIGKILL after each kind of journal append, then resume: no model turn asked twice, no
non-idempotent command run twice. Real processes, a real SQLite file or PostgreSQL schema, real
openai client."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.crash.child import run_child
from tests.crash.database import STORES, crash_database, kill_points, rows
from tests.fakes.processes import FakeOpenAIProcess

ROOT = Path(__file__).resolve().parents[2]

SCRIPT: list[dict[str, object]] = [
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

GATED_SCRIPT: list[dict[str, object]] = [
    {"text": "deploying", "calls": [{"name": "deploy", "arguments": {"name": "d"}}]},
    {"text": "deployed"},
]


@pytest.fixture
def store_name() -> str:
    """The store the test's processes share: SQLite, unless the test names it (``STORES``)."""
    return "sqlite"


@pytest.fixture
def world(
    tmp_path: Path, request: pytest.FixtureRequest, store_name: str
) -> Iterator[dict[str, Path | str]]:
    (tmp_path / "catalog.yaml").write_text(yaml.safe_dump(CATALOG))
    # Long enough for its process to be journaled while it runs.
    effect = 'sleep 0.1\necho "$1" >> "$EFFECTS_FILE"\necho "effect $1 done"\n'
    (tmp_path / "effect.sh").write_text(effect)
    with crash_database(tmp_path, store_name) as db:
        server = FakeOpenAIProcess(tmp_path, getattr(request, "param", SCRIPT), forked=True)
        yield {"dir": tmp_path, "base_url": server.base_url, **db}
        server.stop()


def child(world: dict[str, Path | str], *extra: str) -> subprocess.CompletedProcess[str]:
    folder = Path(world["dir"])
    argv = [
        "--db",
        str(world["db"]),
        "--schema",
        str(world["schema"]),
        "--base-url",
        str(world["base_url"]),
        "--catalog",
        str(folder / "catalog.yaml"),
        "--run-id-file",
        str(folder / "run_id"),
        *extra,
    ]
    return run_child(argv, {"EFFECTS_FILE": str(folder / "effects.txt")})


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
    done: dict[str, object] = out
    return done


@pytest.mark.parametrize("store_name", STORES)
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


STANDING_SCRIPT: list[dict[str, object]] = [
    {"text": "deploying", "calls": [{"name": "deploy", "arguments": {"name": "d"}}]},
    {"text": "and the next", "calls": [{"name": "deploy", "arguments": {"name": "e"}}]},
    {"text": "deployed both"},
]

# A gated call and the next, in one batch: the card is out while the second call still runs.
WHILE_LIVE_SCRIPT: list[dict[str, object]] = [
    {
        "text": "deploying, and recording it",
        "calls": [
            {"name": "deploy", "arguments": {"name": "d"}},
            {"name": "effect", "arguments": {"name": "e"}},
        ],
    },
    {"text": "deployed"},
]

# Every way a call reaches execution, with the append kinds its deciding process makes.
PATHS: dict[str, tuple[list[dict[str, object]], list[str]]] = {
    "first_run": (
        SCRIPT,
        [
            "run_started",
            "user_message",
            "assistant_turn",
            "tool_dispatched",
            "tool_process",
            "tool_result",
            # the second reply's two calls, one after the other
            "tool_dispatched:2",
            "tool_process:2",
            "tool_result:2",
            "tool_dispatched:3",
            "tool_process:3",
            "tool_result:3",
            "run_ended",
        ],
    ),
    "chat_inline_approval": (
        GATED_SCRIPT,
        [
            "run_started",
            "user_message",
            "assistant_turn",
            "tool_dispatched",
            "tool_process",
            "tool_result",
            "grant_written",
            "run_ended",
        ],
    ),
    "approved_once": (
        GATED_SCRIPT,
        [
            "decided",
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
    "standing_grant": (
        STANDING_SCRIPT,
        [
            "decided",
            "run_resumed",
            "answer_supplied",
            "tool_dispatched",
            "tool_process",
            "tool_result",
            "grant_written",
            "assistant_turn",
            "tool_dispatched:2",
            "tool_process:2",
            "tool_result:2",
            "run_ended",
        ],
    ),
    "retry": (
        SCRIPT,
        [
            "decided",
            "run_resumed",
            "answer_supplied",
            "tool_dispatched",
            "tool_process",
            "tool_result",
            "assistant_turn",
            "run_ended",
        ],
    ),
    "approved_while_live": (
        WHILE_LIVE_SCRIPT,
        [
            "tool_dispatched",
            "tool_process",
            "tool_result",
            "run_suspended",
            "decided",
            "run_resumed",
            "answer_supplied",
            "tool_dispatched:2",
            "tool_process:2",
            "tool_result:2",
            "grant_written",
            "assistant_turn:2",
            "run_ended",
        ],
    ),
    "adoption": (
        SCRIPT,
        [
            "run_resumed",
            "assistant_turn",
            "tool_dispatched",
            "tool_process",
            "tool_result",
            "run_ended",
        ],
    ),
}


def settle_args(requests: list[dict[str, Any]], retries: Counter[str]) -> list[str]:
    """Approve what waits for approval; answer ``retry`` to every uncertain effect and ``yes``
    to every question."""
    args: list[str] = []
    for request in requests:
        if request["kind"] == "wait_effect":
            retries[request["arguments"]["name"]] += 1
            args += ["--settle", f"{request['id']}=retry"]
        elif request["kind"] == "wait_user":
            args += ["--settle", f"{request['id']}=answer:yes"]
        else:
            args += ["--settle", f"{request['id']}=approve"]
    return args


def deciding_process(
    world: dict[str, Path | str], path: str, crash: str, retries: Counter[str]
) -> subprocess.CompletedProcess[str]:
    """Bring the run to where ``path`` reaches execution, in a process that crashes on cue."""
    folder = Path(world["dir"])
    crash_args = ["--crash-after", crash if ":" in crash else f"{crash}:1"]
    if path == "first_run":
        return child(world, *crash_args)
    if path == "approved_while_live":
        return child(world, "--approve-while-live", *crash_args)  # a click in the thread
    if path == "chat_inline_approval":
        return child(world, "--approve", *crash_args)  # as `kestrel chat`'s prompter does
    if path in ("approved_once", "standing_grant"):
        started = json.loads(child(world).stdout)
        (request,) = started["requests"]
        kind = "approve" if path == "approved_once" else "approve_always"
        run_id = (folder / "run_id").read_text()
        return child(world, "--resume", run_id, "--settle", f"{request['id']}={kind}", *crash_args)
    if path == "retry":
        assert child(world, "--crash-after", "tool_dispatched:1").returncode == -9
        run_id = (folder / "run_id").read_text()
        asked = json.loads(child(world, "--resume", run_id).stdout)
        return child(
            world, "--resume", run_id, *settle_args(asked["requests"], retries), *crash_args
        )
    assert path == "adoption"
    assert child(world, "--crash-after", "tool_result:1").returncode == -9
    run_id = (folder / "run_id").read_text()
    return child(world, "--resume", run_id, "--adopt", *crash_args)


def finish(
    world: dict[str, Path | str], run_id: str, retries: Counter[str], *extra: str
) -> dict[str, Any]:
    """Resume after the crash (each process given ``extra``), deciding every request as people
    would, until the run ends."""
    out: dict[str, Any] = json.loads(child(world, "--resume", run_id, *extra).stdout)
    for _ in range(6):
        if out["status"] != "suspended":
            return out
        settling = settle_args(out["requests"], retries)
        settled = child(world, "--resume", run_id, *settling, *extra)
        assert settled.returncode == 0, settled.stderr
        out = json.loads(settled.stdout)
    return out


def assert_finished_each_effect_once(
    world: dict[str, Path | str], run_id: str, retries: Counter[str], *extra: str
) -> None:
    """Finish the run after the crash (``extra``: every later process's own arguments), then:
    it completed, the model was asked once for each of its scripted replies and never past the
    last (its answer), no effect ran more often than on-call chose to retry it, and its journal
    holds each answer and the end once."""
    folder = Path(world["dir"])
    out = finish(world, run_id, retries, *extra)

    assert out["status"] == "completed", out
    requested = positions_requested(folder)
    assert all(n == 1 for n in requested.values()), requested
    replies = len(yaml.safe_load((folder / "script.yaml").read_text()))
    assert sorted(requested) == list(range(replies)), requested
    runs = Counter(effects(folder))
    assert all(runs[name] <= 1 + retries[name] for name in runs), (runs, retries)
    assert_journal_whole(world, run_id)


def assert_journal_whole(world: dict[str, Path | str], run_id: str) -> None:
    """The run's journal as it must read after any crash: no gap, one result per call, one
    end, and nothing after it."""
    journal = rows(
        world, "SELECT seq, kind, body FROM journal WHERE run_id = ? ORDER BY seq", run_id
    )
    assert [seq for seq, _, _ in journal] == list(range(len(journal)))
    kinds = [kind for _, kind, _ in journal]
    assert kinds.count("run_ended") == 1 and kinds[-1] == "run_ended", kinds
    results = [json.loads(body)["call_id"] for _, kind, body in journal if kind == "tool_result"]
    assert len(results) == len(set(results)), kinds


# The paths killed on PostgreSQL too, with the appends it commits apart from the one before
# (the last reply and the run's end): an approval once, and for the rest of the run.
ON_POSTGRES: dict[str, list[str]] = {
    "approved_once": [],
    "standing_grant": ["assistant_turn:2"],
    # on-call's retry, and a run adopted by another replica: a replica's paths, which run on
    # PostgreSQL in a deployment of several
    "retry": [],
    "adoption": [],
    "approved_while_live": [],
}


@pytest.mark.parametrize(
    ("world", "store_name", "path", "crash"), kill_points(PATHS, ON_POSTGRES), indirect=["world"]
)
def test_no_effect_runs_again_without_a_fresh_decision(
    world: dict[str, Path | str], path: str, crash: str
) -> None:
    folder = Path(world["dir"])
    retries: Counter[str] = Counter()
    crashed = deciding_process(world, path, crash, retries)
    assert crashed.returncode == -9, f"no {crash} append on this path: {crashed.stderr}"
    run_id = (folder / "run_id").read_text()

    assert_finished_each_effect_once(world, run_id, retries)


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("world", [GATED_SCRIPT], indirect=True)
def test_a_run_whose_decider_died_is_adopted_and_runs_once(
    world: dict[str, Path | str],
) -> None:
    folder = Path(world["dir"])
    (request,) = json.loads(child(world).stdout)["requests"]
    run_id = (folder / "run_id").read_text()
    # The approval took the run's lease to resume it; the process died before a word more.
    crashed = child(
        world,
        "--resume",
        run_id,
        "--settle",
        f"{request['id']}=approve",
        "--crash-after",
        "decided:1",
    )
    assert crashed.returncode == -9, crashed.stderr

    out = json.loads(child(world, "--resume", run_id, "--adopt").stdout)

    assert out["status"] == "completed", out
    assert effects(folder) == ["d"]


SLOW_SCRIPT = [
    {"text": "slowly", "calls": [{"name": "slow", "arguments": {"name": "s"}}]},
    {"text": "done"},
]


@pytest.mark.parametrize("world", [SLOW_SCRIPT], indirect=True)
def test_an_orphaned_command_is_stopped_before_on_call_is_asked(
    world: dict[str, Path | str],
) -> None:
    folder = Path(world["dir"])
    (folder / "slow.sh").write_text('sleep 2\necho "late $1" >> "$EFFECTS_FILE"\n')
    catalog = yaml.safe_load((folder / "catalog.yaml").read_text())
    slow = {**catalog["tools"][0], "name": "slow", "command": ["/bin/sh", "./slow.sh", "{name}"]}
    catalog["tools"].append(slow)
    (folder / "catalog.yaml").write_text(yaml.safe_dump(catalog))

    crashed = child(world, "--crash-after", "tool_process:1")
    assert crashed.returncode == -9
    run_id = (folder / "run_id").read_text()
    asked = json.loads(child(world, "--resume", run_id).stdout)

    (request,) = asked["requests"]
    assert request["kind"] == "wait_effect"
    assert "was still running and was stopped" in request["prompt"], request["prompt"]
    time.sleep(2.5)  # past the moment the orphan would have written its effect
    assert effects(folder) == []


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("world", [WHILE_LIVE_SCRIPT], indirect=True)
def test_a_run_answered_while_live_and_killed_as_it_suspended_is_adopted(
    world: dict[str, Path | str],
) -> None:
    folder = Path(world["dir"])
    # The click lands while the batch still runs; the process dies as the run suspends, before
    # it goes on with the answer it already has.
    crashed = child(world, "--approve-while-live", "--crash-after", "run_suspended:1")
    assert crashed.returncode == -9, crashed.stderr
    run_id = (folder / "run_id").read_text()

    out = json.loads(child(world, "--resume", run_id, "--adopt").stdout)

    assert out["status"] == "completed", out
    assert sorted(effects(folder)) == ["d", "e"]


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("world", [GATED_SCRIPT], indirect=True)
@pytest.mark.parametrize("crash", ["tool_deferred:1", "run_suspended:1"])
def test_a_run_killed_as_it_suspends_is_approved_and_runs_once(
    world: dict[str, Path | str], crash: str
) -> None:
    folder = Path(world["dir"])
    # On PostgreSQL the request may be durable while the run is not yet suspended.
    crashed = child(world, "--crash-after", crash)
    assert crashed.returncode == -9, crashed.stderr
    run_id = (folder / "run_id").read_text()

    assert_finished_each_effect_once(world, run_id, Counter())
    assert effects(folder) == ["d"]
