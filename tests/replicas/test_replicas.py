"""Several ``kestrel serve`` replicas on one PostgreSQL database: real processes, real kills.

Each test gets its own schema; the model is the fake OpenAI server in its own process, which
logs every request, and every command writes to a side-effect file, so a step run twice or a
model turn asked twice shows up in the files.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from bot import wire
from bot.domain import (
    Decision,
    DecisionKind,
    RequestKind,
    RequestStatus,
    RunStatus,
    Session,
    new_id,
)
from bot.journal.fold import fold
from storage.postgres import PostgresStore
from tests.fakes.processes import KESTREL, FakeOpenAIProcess, clean_env
from tests.fakes.waiting import until

DSN = os.environ.get("KESTREL_TEST_POSTGRES_DSN", "")
pytestmark = pytest.mark.skipif(
    not DSN, reason="set KESTREL_TEST_POSTGRES_DSN to run the multi-replica tests"
)

LEASE = 2.0
NAME = {"type": "string", "pattern": "^[a-z0-9-]+$"}


def tool(name: str, script: str, **flags: Any) -> dict[str, Any]:
    """A catalog entry running a small sh script that records its effect."""
    return {
        "name": name,
        "description": f"{name} (records an effect)",
        "command": ["/bin/sh", f"./{script}", "{name}"],
        "parameters": {"type": "object", "properties": {"name": NAME}, "required": ["name"]},
        "idempotent": False,
        "env": ["EFFECTS_FILE"],
        **flags,
    }


CATALOG = {
    "tools": [
        tool("effect", "effect.sh"),
        tool("slow_effect", "slow.sh", timeout=30),
        tool("held_effect", "held.sh", timeout=60),
        tool("deploy", "deploy.sh", confirm=True),
    ]
}


class Cluster:
    """A folder with a config, the fake model, and the replicas started on it."""

    def __init__(self, folder: Path, schema: str, script: list[dict[str, Any]], **config: Any):
        self.folder = folder
        self.schema = schema
        self.model = FakeOpenAIProcess(folder, script)
        self.replicas: list[subprocess.Popen[str]] = []
        (folder / "catalog.yaml").write_text(yaml.safe_dump(CATALOG))
        (folder / "effect.sh").write_text('echo "effect $1" >> "$EFFECTS_FILE"\n')
        (folder / "deploy.sh").write_text('echo "deploy $1" >> "$EFFECTS_FILE"\n')
        (folder / "slow.sh").write_text(
            'echo "start $1" >> "$EFFECTS_FILE"\nsleep 3\necho "done $1" >> "$EFFECTS_FILE"\n'
        )
        # Under way until the test lets it finish (``release``), however slow the machine.
        (folder / "held.sh").write_text(
            'echo "start $1" >> "$EFFECTS_FILE"\n'
            'i=0; while [ ! -e "$EFFECTS_FILE.go" ] && [ $i -lt 600 ]; do\n'
            "  sleep 0.1; i=$((i + 1))\n"
            "done\n"
            'echo "done $1" >> "$EFFECTS_FILE"\n'
        )
        settings = {
            "database": f"{DSN}?schema={schema}",
            "model": {"provider": "openai", "name": "fake", "max_retries": 0},
            "tools": ["catalog.yaml"],
            "replica": {"lease_seconds": LEASE, "poll_seconds": 0.2},
            "policy": {"approvers": {"*": ["U0APPROVER"]}, "oncall": ["U0ONCALL"]},
            **config,
        }
        (folder / "kestrel.yaml").write_text(yaml.safe_dump(settings))
        self.env = clean_env(
            OPENAI_BASE_URL=self.model.base_url,
            OPENAI_API_KEY="test",
            EFFECTS_FILE=str(folder / "effects.txt"),
        )

    def start_replica(self) -> subprocess.Popen[str]:
        """One more ``kestrel serve`` process."""
        replica = subprocess.Popen(
            [*KESTREL, "serve", "--port", "0"],
            cwd=self.folder,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.replicas.append(replica)
        return replica

    def kestrel(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A one-shot command against the cluster's store."""
        return subprocess.run(
            [*KESTREL, *args],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def effects(self) -> list[str]:
        path = self.folder / "effects.txt"
        return path.read_text().splitlines() if path.exists() else []

    def release(self) -> None:
        """Let a ``held_effect`` under way finish."""
        (self.folder / "effects.txt.go").touch()

    def model_positions(self) -> Counter[tuple[str, int]]:
        """How often the model was asked, per (first user text, assistant turns so far)."""
        counts: Counter[tuple[str, int]] = Counter()
        for line in self.model.log.read_text().splitlines():
            messages = json.loads(line)["messages"]
            prompt = next(m["content"] for m in messages if m["role"] == "user")
            counts[(prompt, sum(m["role"] == "assistant" for m in messages))] += 1
        return counts

    def stop(self) -> None:
        for replica in self.replicas:
            if replica.poll() is None:
                replica.send_signal(signal.SIGCONT)
                replica.kill()
            replica.wait()
        self.model.stop()


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"kr_{uuid.uuid4().hex[:12]}"
    yield name

    async def drop() -> None:
        conn = await asyncpg.connect(DSN)
        await conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        await conn.close()

    asyncio.run(drop())


@pytest.fixture
def cluster(tmp_path: Path, schema: str) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(script: list[dict[str, Any]], **config: Any) -> Cluster:
        made.append(Cluster(tmp_path, schema, script, **config))
        return made[-1]

    yield make
    for each in made:
        each.stop()


async def store_of(schema: str) -> PostgresStore:
    store = PostgresStore(DSN, schema=schema)
    await store.migrate()
    return store


async def submit(store: PostgresStore, prompt: str) -> str:
    """Queue a turn as a chat adapter on any replica would."""
    run_id = new_id("run")
    session = Session(id=new_id("ses"), platform="test")
    payload = {
        "run_id": run_id,
        "prompt": prompt,
        "session": wire.to_plain(session),
        "requested_by": "U0REQ",
        "prompter": True,
    }
    await store.enqueue_work("start", payload)
    return run_id


def run_together(c: Cluster, command: list[str], copies: int) -> list[int]:
    """Start ``copies`` of a command at once; their exit codes, sorted."""
    started = [
        subprocess.Popen(
            command, cwd=c.folder, env=c.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(copies)
    ]
    return sorted(p.wait(timeout=60) for p in started)


async def statuses(store: PostgresStore, run_ids: list[str]) -> dict[str, RunStatus]:
    found = {r.id: r.status for r in await store.list_runs(limit=10_000)}
    return {run_id: found[run_id] for run_id in run_ids if run_id in found}


ONE_EFFECT = [
    {"text": "on it", "calls": [{"name": "effect", "arguments": {"name": "$PROMPT"}}]},
    {"text": "done"},
]


async def test_two_replicas_run_fifty_runs_each_step_once(cluster: Callable[..., Cluster]) -> None:
    c = cluster(ONE_EFFECT)
    c.start_replica()
    c.start_replica()
    store = await store_of(c.schema)
    run_ids = [await submit(store, f"t{i:02d}") for i in range(50)]

    async def all_done() -> bool:
        done = await statuses(store, run_ids)
        return len(done) == 50 and all(s is RunStatus.COMPLETED for s in done.values())

    await until(all_done, timeout=90)
    effects = c.effects()
    assert sorted(effects) == sorted(f"effect t{i:02d}" for i in range(50))
    positions = c.model_positions()
    assert len(positions) == 100 and set(positions.values()) == {1}
    await store.close()


GATED_AFTER_SLOW = [
    {"text": "slow first", "calls": [{"name": "slow_effect", "arguments": {"name": "$PROMPT"}}]},
    {"text": "now deploy", "calls": [{"name": "deploy", "arguments": {"name": "$PROMPT"}}]},
    {"text": "all done"},
]


async def test_sigkill_a_replica_the_other_adopts_its_runs(cluster: Callable[..., Cluster]) -> None:
    c = cluster(GATED_AFTER_SLOW)
    first = c.start_replica()
    store = await store_of(c.schema)
    waiting = [await submit(store, f"w{i}") for i in range(3)]

    async def suspended() -> bool:
        done = await statuses(store, waiting)
        return len(done) == 3 and all(s is RunStatus.SUSPENDED for s in done.values())

    await until(suspended)
    live = [await submit(store, f"l{i}") for i in range(3)]
    await until(lambda: sum(e.startswith("start l") for e in c.effects()) == 3)
    first.kill()
    first.wait()
    killed_at = time.monotonic()
    c.start_replica()

    async def adopted() -> bool:
        requests = await store.list_requests()
        return sum(r.kind is RequestKind.WAIT_EFFECT for r, _, _ in requests) == 3

    await until(adopted)
    assert time.monotonic() - killed_at >= LEASE * 0.5  # not before the lease could expire
    assert sorted(e for e in c.effects() if e.startswith("start l")) == [
        "start l0",
        "start l1",
        "start l2",
    ]
    for request, _status, _decision in await store.list_requests():
        if request.kind is RequestKind.WAIT_APPROVAL:
            decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0APPROVER")
            assert await store.decide(decision, RequestStatus.ANSWERED)
            await store.enqueue_work("resume", {"run_id": request.run_id})

    async def finished() -> bool:
        done = await statuses(store, waiting)
        return all(s is RunStatus.COMPLETED for s in done.values())

    await until(finished)
    deploys = [e for e in c.effects() if e.startswith("deploy")]
    assert sorted(deploys) == ["deploy w0", "deploy w1", "deploy w2"]
    for run_id in live:
        state = fold(await store.load(run_id), run_id)
        assert [r.kind for r in state.open_requests] == [RequestKind.WAIT_EFFECT]
        assert state.takeovers
    await store.close()


async def test_a_paused_stale_owner_appends_and_executes_nothing(
    cluster: Callable[..., Cluster],
) -> None:
    c = cluster(GATED_AFTER_SLOW)
    first = c.start_replica()
    store = await store_of(c.schema)
    run_id = await submit(store, "s0")
    await until(lambda: "start s0" in c.effects())
    first.send_signal(signal.SIGSTOP)
    c.start_replica()

    async def taken() -> bool:
        state = fold(await store.load(run_id), run_id)
        return bool(state.open_requests)

    await until(taken)
    claimed = await store.current_epoch(run_id)
    first.send_signal(signal.SIGCONT)

    async def stale_owner_stopped() -> bool:
        # Its command finishes, its next append is refused, and its task stops and says so.
        return any(a.action == "taken_over" for a in await store.list_audit(run_id=run_id))

    await until(stale_owner_stopped)
    records = await store.load(run_id)
    resumed_at = max(r.seq for r in records if r.entry.kind == "run_resumed")
    assert all(r.epoch == claimed for r in records if r.seq >= resumed_at)
    assert not any(e.startswith("deploy") for e in c.effects())
    assert first.poll() is None  # the process survives; only the run's task stopped
    await store.close()


async def test_concurrent_approvals_from_two_processes_one_winner(
    cluster: Callable[..., Cluster],
) -> None:
    c = cluster(
        [
            {"text": "deploy", "calls": [{"name": "deploy", "arguments": {"name": "$PROMPT"}}]},
            {"text": "deployed"},
        ]
    )
    c.start_replica()
    store = await store_of(c.schema)
    run_id = await submit(store, "a0")

    async def waiting() -> Any:
        return [r for r, _, _ in await store.list_requests(run_id=run_id)]

    (request,) = await until(waiting)
    command = [*KESTREL, "runs", "approve", run_id, request.id, "--as", "U0APPROVER"]
    codes = await asyncio.to_thread(run_together, c, command, 2)
    assert codes == [0, 2]

    async def completed() -> bool:
        return (await statuses(store, [run_id])).get(run_id) is RunStatus.COMPLETED

    await until(completed)  # once the run is over, nothing can deploy for it again
    assert c.effects().count("deploy a0") == 1
    await store.close()


async def test_two_approvers_at_once_from_three_processes_deploy_once(
    cluster: Callable[..., Cluster],
) -> None:
    c = cluster(
        [
            {"text": "deploy", "calls": [{"name": "deploy2", "arguments": {"name": "$PROMPT"}}]},
            {"text": "deployed"},
        ],
        policy={"approvers": {"*": ["U0APPROVER", "U0SECOND"]}, "oncall": ["U0ONCALL"]},
    )
    two = {**tool("deploy2", "deploy.sh", confirm=True), "approvals": 2}
    (c.folder / "catalog.yaml").write_text(yaml.safe_dump({"tools": [*CATALOG["tools"], two]}))
    c.start_replica()
    store = await store_of(c.schema)
    run_id = await submit(store, "a0")

    async def waiting() -> Any:
        return [r for r, _, _ in await store.list_requests(run_id=run_id)]

    (request,) = await until(waiting)
    approve = [*KESTREL, "runs", "approve", run_id, request.id, "--as"]
    # Both approvers click at once, and one of them twice.
    clicks = [[*approve, "U0APPROVER"], [*approve, "U0SECOND"], [*approve, "U0SECOND"]]
    await asyncio.to_thread(run_each_together, c, clicks)

    async def completed() -> bool:
        return (await statuses(store, [run_id])).get(run_id) is RunStatus.COMPLETED

    await until(completed)
    assert c.effects().count("deploy a0") == 1
    audited = [(a.action, a.actor) for a in await store.list_audit(run_id=run_id)]
    partial = sorted(actor for action, actor in audited if action == "approve_partial")
    assert partial == ["U0APPROVER", "U0SECOND"], audited
    assert [action for action, _ in audited].count("approve") == 1, audited
    await store.close()


def run_each_together(c: Cluster, commands: list[list[str]]) -> list[int]:
    """Start each command at once; their exit codes, in order."""
    started = [
        subprocess.Popen(
            command, cwd=c.folder, env=c.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for command in commands
    ]
    return [p.wait(timeout=60) for p in started]


async def test_a_cancel_at_the_terminal_stops_a_run_a_replica_drives(
    cluster: Callable[..., Cluster],
) -> None:
    batch = [
        {"name": "held_effect", "arguments": {"name": "$PROMPT"}},
        {"name": "effect", "arguments": {"name": "$PROMPT"}},
    ]
    c = cluster([{"text": "two steps", "calls": batch}, {"text": "both done"}])
    c.start_replica()
    store = await store_of(c.schema)
    run_id = await submit(store, "c0")
    await until(lambda: "start c0" in c.effects())

    cancelled = c.kestrel("runs", "cancel", run_id, "--as", "U0ONCALL")
    c.release()  # the step under way ends only once the cancel is asked

    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith("cancelling:"), cancelled.stdout

    async def ended() -> RunStatus | None:
        status = (await statuses(store, [run_id])).get(run_id)
        return status if status in (RunStatus.CANCELLED, RunStatus.COMPLETED) else None

    assert await until(ended) is RunStatus.CANCELLED
    # The step under way finished; the one after it in the batch never started.
    assert c.effects() == ["start c0", "done c0"]
    await store.close()


async def test_a_cancel_asked_of_a_replica_that_dies_is_done_by_the_one_that_adopts(
    cluster: Callable[..., Cluster],
) -> None:
    batch = [
        {"name": "slow_effect", "arguments": {"name": "$PROMPT"}},
        {"name": "effect", "arguments": {"name": "$PROMPT"}},
    ]
    # A lease long enough that the cancel finds it held: the cancel is carried by the store.
    c = cluster(
        [{"text": "two steps", "calls": batch}, {"text": "both done"}],
        replica={"lease_seconds": 8, "poll_seconds": 0.2},
    )
    first = c.start_replica()
    store = await store_of(c.schema)
    run_id = await submit(store, "k0")
    await until(lambda: "start k0" in c.effects())
    first.send_signal(signal.SIGSTOP)  # it reads the cancel at no renewal now

    cancelled = c.kestrel("runs", "cancel", run_id, "--as", "U0ONCALL")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith("cancelling:"), cancelled.stdout
    first.kill()  # died before it read the cancel, its command's outcome unknown
    c.start_replica()

    async def ended() -> RunStatus | None:
        status = (await statuses(store, [run_id])).get(run_id)
        return status if status in (RunStatus.CANCELLED, RunStatus.COMPLETED) else None

    assert await until(ended) is RunStatus.CANCELLED
    state = fold(await store.load(run_id), run_id)
    assert state.result is not None, state
    said = state.result.error
    assert said.startswith("cancelled by U0ONCALL; slow_effect (its process group"), said
    # The step under way was not run again, nor the one after it started.
    assert c.effects().count("start k0") == 1 and "effect k0" not in c.effects(), c.effects()
    await store.close()


async def test_deadline_and_cron_fire_once_with_three_replicas(
    cluster: Callable[..., Cluster],
) -> None:
    script = [
        {"text": "deploy", "calls": [{"name": "deploy", "arguments": {"name": "$PROMPT"}}]},
        {"text": "could not deploy"},
    ]
    c = cluster(
        script,
        deadlines={"wait_approval": 2, "remind_before": 0},
        # On time only: a replica starting would also run, late, the occurrence just before it
        # started (``grace_seconds``), one this count of occurrences since ``began`` leaves out.
        schedules=[{"name": "tick", "cron": "*/2 * * * * *", "prompt": "tick", "grace_seconds": 0}],
    )
    began = time.monotonic()
    for _ in range(3):
        c.start_replica()
    store = await store_of(c.schema)
    run_id = await submit(store, "d0")

    async def ended() -> bool:
        return (await statuses(store, [run_id])).get(run_id) is RunStatus.COMPLETED

    await until(ended, timeout=30)

    async def ticked_three_times() -> Counter[datetime] | None:
        ticks = [r for r in await store.list_runs(limit=1000) if r.requested_by == "schedule:tick"]
        starts = Counter(r.created_at.replace(microsecond=0) for r in ticks)
        return starts if len(starts) >= 3 else None

    # By the third occurrence, every replica has had two chances to start a duplicate.
    starts = await until(ticked_three_times, timeout=30)
    occurrences = (time.monotonic() - began) / 2 + 1  # at most, one every two seconds
    assert sum(starts.values()) <= occurrences  # one run per occurrence, not one per replica
    assert max(starts.values()) == 1
    expiries = [a for a in await store.list_audit(run_id=run_id) if a.action == "expire"]
    assert len(expiries) == 1
    await store.close()


async def test_sigterm_hands_live_runs_back_to_another_replica(
    cluster: Callable[..., Cluster],
) -> None:
    script = [
        {"text": "slow", "calls": [{"name": "slow_effect", "arguments": {"name": "$PROMPT"}}]},
        {"text": "then", "calls": [{"name": "effect", "arguments": {"name": "$PROMPT"}}]},
        {"text": "finished"},
    ]
    c = cluster(script)
    first = c.start_replica()
    store = await store_of(c.schema)
    run_id = await submit(store, "g0")
    await until(lambda: "start g0" in c.effects())
    first.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(first.wait, 30) == 0
    record = (await store.list_runs(limit=10))[0]
    assert record.status is RunStatus.SUSPENDED and record.owner == ""
    assert record.stop_reason == "handed_back"
    c.start_replica()

    async def completed() -> bool:
        return (await statuses(store, [run_id])).get(run_id) is RunStatus.COMPLETED

    await until(completed)
    assert c.effects().count("start g0") == 1 and c.effects().count("effect g0") == 1
    await store.close()
