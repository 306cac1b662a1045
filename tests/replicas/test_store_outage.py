"""A replica whose PostgreSQL goes away and comes back: a real ``kestrel serve`` behind a TCP
proxy the test cuts, its readiness, and the work it takes once the store is back."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import asyncpg
import msgspec
import pytest

from bot.domain import RunStatus
from bot.journal.fold import fold
from bot.replica.work import WorkTaker
from bot.run.supervisor import Supervisor
from storage.postgres import PostgresStore
from tests.fakes.held_backend import HeldBackend
from tests.fakes.processes import KESTREL
from tests.fakes.runtime import make_runtime
from tests.fakes.serving import free_port
from tests.fakes.tcp_proxy import proxied_dsn
from tests.fakes.waiting import until
from tests.replicas.test_replicas import DSN, ONE_EFFECT, Cluster, statuses, store_of, submit
from tests.replicas.test_replicas import cluster as cluster  # the fixtures
from tests.replicas.test_replicas import pytestmark as pytestmark
from tests.replicas.test_replicas import schema as schema

# The operators' token: with it, /readyz says what exactly is wrong.
TOKEN = "operator-token-3f9a1c7e5b"


def readyz(port: int, token: str = "") -> tuple[int, dict[str, object]] | None:
    """``/readyz``'s status and body (in detail with ``token``), or None while nothing
    listens."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    asked = urllib.request.Request(f"http://127.0.0.1:{port}/readyz", headers=headers)
    try:
        with urllib.request.urlopen(asked, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())
    except OSError:
        return None


def serve(c: Cluster, port: int) -> subprocess.Popen[str]:
    """``kestrel serve`` on ``port`` (to ask its ``/readyz``)."""
    command = [*KESTREL, "serve", "--port", str(port)]
    return subprocess.Popen(
        command,
        cwd=c.folder,
        env=c.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


async def ready_says(port: int, status: int, problem: str = "", token: str = "") -> bool:
    """Whether the replica's ``/readyz`` answers ``status``, naming ``problem``."""
    said = await asyncio.to_thread(readyz, port, token)
    return said is not None and said[0] == status and problem in json.dumps(said[1])


async def test_a_replica_takes_work_again_once_the_store_is_back(
    cluster: Callable[..., Cluster], schema: str
) -> None:
    async with proxied_dsn(DSN) as (proxied, proxy):
        c = cluster(ONE_EFFECT, database=f"{proxied}?schema={schema}")
        # JSON lines: a record's exception is its traceback, whatever the level.
        c.env = {**c.env, "KESTREL_LOG_FORMAT": "json"}
        port = free_port()
        c.replicas.append(await asyncio.to_thread(serve, c, port))

        await until(lambda: ready_says(port, 200))
        store = await store_of(c.schema)
        before = await submit(store, "b0")
        await until(lambda: statuses(store, [before]))
        await until(lambda: "effect b0" in c.effects())

        proxy.cut()
        await until(lambda: ready_says(port, 503, "unreachable"))
        # The replica's pool, its heartbeat and its look for work have each met the outage.
        await until(lambda: proxy.refused >= 10, timeout=30)
        proxy.restore()

        await until(lambda: ready_says(port, 200), timeout=30)
        after = await submit(store, "a0")

        async def completed() -> bool:
            return (await statuses(store, [after])).get(after) is RunStatus.COMPLETED

        await until(completed, timeout=30)
        assert c.effects().count("effect a0") == 1
        await store.close()
        # Stopped while the proxy still stands: once it closes, the store is away again.
        replica = c.replicas[0]
        replica.terminate()
        _, said = await asyncio.to_thread(replica.communicate, timeout=30)
    # The outage is said once by each part that met it, not at each of its tries.
    for what in ("heartbeat failed", "orphaned_runs failed", "list_requests failed"):
        assert said.count(what) <= 1, said
    assert "Traceback" not in said
    lines = [json.loads(line) for line in said.splitlines()]
    # The store says when it began and when it ended; asyncpg's pool, retrying, says nothing.
    outage = [line["message"] for line in lines if line["logger"] == "kestrel.store"]
    assert len([line for line in outage if "unreachable" in line]) == 1, said
    assert len([line for line in outage if line.endswith("answers again")]) == 1, said
    assert not [line for line in lines if line["logger"].startswith("asyncpg")], said


async def test_a_replica_whose_store_stops_answering_fails_in_time_and_carries_on(
    cluster: Callable[..., Cluster], schema: str
) -> None:
    async with proxied_dsn(DSN) as (proxied, proxy):
        database = f"{proxied}?schema={schema}"
        c = cluster(ONE_EFFECT, database=database, database_timeout_seconds=0.5)
        c.env = {**c.env, "KESTREL_WEB_TOKEN": TOKEN}
        port = free_port()
        c.replicas.append(await asyncio.to_thread(serve, c, port))

        await until(lambda: ready_says(port, 200))
        # Connections stay open and nothing comes back: without a bound, every statement of
        # the replica (readiness's, the heartbeat's, the work taker's) would wait forever.
        proxy.hold()
        timed_out = "no answer within 0.5 s (database_timeout_seconds)"
        await until(lambda: ready_says(port, 503, timed_out, TOKEN))
        # Anyone else is told which check failed, not the store's error (its host, its user).
        assert await ready_says(port, 503, '"problems": {"store": "unreachable"}')
        proxy.restore()

        await until(lambda: ready_says(port, 200), timeout=30)
        store = await store_of(c.schema)
        run_id = await submit(store, "h0")

        async def completed() -> bool:
            return (await statuses(store, [run_id])).get(run_id) is RunStatus.COMPLETED

        await until(completed, timeout=30)
        await store.close()
        replica = c.replicas[0]
        replica.terminate()
        _, said = await asyncio.to_thread(replica.communicate, timeout=30)
    assert "Traceback" not in said


SKEWED = """
import os
from datetime import timedelta

import bot.domain

_wall = bot.domain.utcnow
bot.domain.utcnow = lambda: _wall() + timedelta(seconds=float(os.environ["SKEW_SECONDS"]))
"""


async def test_a_replica_whose_clock_runs_ahead_takes_no_live_run(
    cluster: Callable[..., Cluster],
) -> None:
    c = cluster(
        [
            {"text": "slow", "calls": [{"name": "slow_effect", "arguments": {"name": "$PROMPT"}}]},
            {"text": "finished"},
        ]
    )
    # Long enough for the skewed replica to look for orphans several times while it runs.
    (c.folder / "slow.sh").write_text(
        'echo "start $1" >> "$EFFECTS_FILE"\nsleep 8\necho "done $1" >> "$EFFECTS_FILE"\n'
    )
    c.start_replica()
    store = await store_of(c.schema)
    run_id = await submit(store, "k0")
    await until(lambda: "start k0" in c.effects())
    # A host whose clock is a minute ahead (a lease is 2 s here): its own clock says every
    # lease the healthy replica wrote ran out long ago.
    skew = c.folder / "skew"
    skew.mkdir()
    (skew / "sitecustomize.py").write_text(SKEWED)
    c.env = {**c.env, "PYTHONPATH": str(skew), "SKEW_SECONDS": "60"}
    c.start_replica()

    async def completed() -> bool:
        return (await statuses(store, [run_id])).get(run_id) is RunStatus.COMPLETED

    await until(completed, timeout=40)
    assert c.effects() == ["start k0", "done k0"]
    state = fold(await store.load(run_id), run_id)
    assert not state.takeovers
    await store.close()


async def test_a_work_taker_stopped_while_the_store_is_silent_says_nothing_of_trying_again(
    schema: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The heartbeat under way when a replica stops fails once the store gives up on it: the
    # taker said "the store failed, trying again every poll" after "stopping on SIGTERM",
    # though it tried nothing again and the replica was gone.
    async with proxied_dsn(DSN) as (proxied, proxy):
        store = PostgresStore(proxied, schema=schema, command_timeout=1)
        await store.migrate()
        rt, _ = await make_runtime(tmp_path / "kestrel.db", [])
        unused, rt = rt.store, msgspec.structs.replace(rt, store=store)
        taker = WorkTaker(Supervisor(rt), store, poll=0.05)
        taking = asyncio.ensure_future(taker.run())
        try:
            await until(lambda: proxy.accepted > 0)  # it heartbeats and looks for work
            proxy.hold()
            await until(lambda: proxy.held > 0)  # a statement under way, unanswered
            taker.stop()
            await asyncio.wait({taking}, timeout=15)
            assert taking.done() and taking.exception() is None
        finally:
            taking.cancel()
            proxy.restore()
            await store.close()
            await unused.close()
    assert "trying again" not in caplog.text, caplog.text


async def test_a_work_taker_whose_heartbeat_was_cut_says_when_the_store_answers_again(
    schema: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A backend terminated under the heartbeat (a failover, PgBouncer restarting): the taker
    # warned "the store failed, trying again every poll", and said the store answered again
    # at info, which `serve` (at warning) never shows: the failure read as never mended.
    caplog.set_level(logging.WARNING)
    app = f"kr_terminated_{uuid.uuid4().hex[:8]}"
    store = PostgresStore(f"{DSN}?application_name={app}", schema=schema)
    await store.migrate()
    admin = await asyncpg.connect(DSN, server_settings={"search_path": schema})
    rt, _ = await make_runtime(tmp_path / "kestrel.db", [])
    unused, rt = rt.store, msgspec.structs.replace(rt, store=store)
    taker = WorkTaker(Supervisor(rt), store, poll=0.05)
    taking = None
    try:
        held = HeldBackend(admin, app)
        await held.hold("replicas")
        taking = asyncio.ensure_future(taker.run())
        await held.terminate()

        await until(lambda: "work: the store answers again" in caplog.text, timeout=10)

        assert caplog.text.count("work: the store failed, trying again every poll") == 1
    finally:
        taker.stop()
        if taking is not None:
            await asyncio.wait({taking}, timeout=15)
        await admin.close()
        await store.close()
        await unused.close()


DEPLOY = [
    {"text": "deploying", "calls": [{"name": "deploy", "arguments": {"name": "$PROMPT"}}]},
    {"text": "deployed"},
]


async def test_an_approval_whose_run_the_store_then_stops_says_so(
    cluster: Callable[..., Cluster],
) -> None:
    # The decision landed, then the run's next append failed (a disk full on the server): the
    # run's task stopped, and `runs approve` said "recorded; run … is now running: deploying",
    # exit 0, of a run nothing drove any more.
    c = cluster(DEPLOY)
    deferred = await asyncio.to_thread(c.kestrel, "run", "--defer", "--json", "a0")
    assert deferred.returncode == 3, deferred.stderr
    run = json.loads(deferred.stdout)
    (request,) = run["requests"]
    conn = await asyncpg.connect(DSN, server_settings={"search_path": c.schema})
    try:
        await conn.execute("""
            CREATE FUNCTION no_space() RETURNS trigger AS $$ BEGIN
              RAISE EXCEPTION USING ERRCODE = 'disk_full',
                MESSAGE = 'could not extend file: No space left on device';
            END $$ LANGUAGE plpgsql;
            CREATE TRIGGER no_space BEFORE INSERT ON journal FOR EACH ROW
              WHEN (NEW.kind = 'answer_supplied') EXECUTE FUNCTION no_space();
        """)
    finally:
        await conn.close()

    approved = await asyncio.to_thread(
        c.kestrel, "runs", "approve", run["run_id"], request["id"], "--as", "U0APPROVER"
    )

    assert approved.returncode == 2, approved.stdout
    said = approved.stderr.strip()
    assert said.startswith(f"kestrel: recorded; run {run['run_id']} stopped here: "), said
    assert "append failed: could not extend file: No space left on device" in said
    assert f"kestrel runs resume {run['run_id']}" in said
    assert approved.stdout == ""
    assert c.effects() == []


async def test_a_backend_terminated_as_a_command_is_dispatched_costs_the_run_nothing(
    cluster: Callable[..., Cluster], schema: str
) -> None:
    # pg_terminate_backend (a failover, PgBouncer restarting) as the replica journaled that it
    # runs the command: the run stopped ("append failed: connection was closed in the middle
    # of operation"), waited to be adopted, and went on under a new claim.
    app = f"kr_terminated_{uuid.uuid4().hex[:8]}"
    c = cluster(ONE_EFFECT, database=f"{DSN}?application_name={app}&schema={schema}")
    c.start_replica()
    store = await store_of(c.schema)
    admin = await asyncpg.connect(DSN, server_settings={"search_path": c.schema})
    try:
        held = HeldBackend(admin, app)
        await held.hold("journal", "NEW.kind = 'tool_dispatched'")
        run_id = await submit(store, "d0")
        await held.terminate()

        async def completed() -> bool:
            return (await statuses(store, [run_id])).get(run_id) is RunStatus.COMPLETED

        await until(completed)
        assert c.effects() == ["effect d0"]
        records = await store.load(run_id)
        assert [r.seq for r in records] == list(range(len(records)))
        assert {r.epoch for r in records} == {1}  # never stopped, never adopted
    finally:
        await admin.close()
        await store.close()


async def test_an_approval_whose_commit_answer_was_lost_stands_and_runs_once(
    cluster: Callable[..., Cluster], schema: str
) -> None:
    # The decision and its claim of the run committed, and the connection dropped before
    # COMMIT's answer came back: `runs approve` said "decide failed: connection was closed in
    # the middle of operation", exit 2, of a decision that stood, with the run claimed by it.
    async with proxied_dsn(DSN) as (proxied, proxy):
        c = cluster(DEPLOY, database=f"{proxied}?schema={schema}")
        deferred = await asyncio.to_thread(c.kestrel, "run", "--defer", "--json", "a0")
        assert deferred.returncode == 3, deferred.stderr
        run = json.loads(deferred.stdout)
        (request,) = run["requests"]
        proxy.lose_commit_reply(b'"kind":"approve"')

        approved = await asyncio.to_thread(
            c.kestrel, "runs", "approve", run["run_id"], request["id"], "--as", "U0APPROVER"
        )

    assert proxy.replies_lost == 1
    assert approved.returncode == 0, approved.stderr
    assert f"run {run['run_id']} is now completed: deployed" in approved.stdout
    assert c.effects() == ["deploy a0"]
    store = await store_of(c.schema)
    try:
        records = await store.load(run["run_id"])
        assert [r.seq for r in records] == list(range(len(records)))
        assert [r.entry.kind for r in records].count("tool_dispatched") == 1
    finally:
        await store.close()
