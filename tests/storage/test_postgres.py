"""PostgreSQL-only behaviour: races across pools, migrations, notifications, connection errors."""

from __future__ import annotations

import asyncio
import gc
import ssl
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from bot.domain import (
    Decision,
    DecisionKind,
    Request,
    RequestKind,
    RequestStatus,
    RunStatus,
    Session,
    StopReason,
    TerminalResult,
    ToolOutcome,
)
from bot.errors import StaleEpoch, StoreError, UnknownRun
from bot.journal.entries import RunEnded, ToolResultEntry, UserMessageEntry
from bot.kinds import AuditAction
from bot.records import RunRecord
from bot.store_values import Audited, Settled
from storage.postgres import PostgresStore, _cause, _migration_lock_key, open_postgres
from storage.postgres_schema import CREATE_VERSION_TABLE, SCHEMA_VERSION, migration_script
from tests.fakes.held_backend import HeldBackend
from tests.fakes.serving import free_port
from tests.fakes.tcp_proxy import TcpProxy
from tests.fakes.waiting import until
from tests.storage.conftest import postgres_dsn, postgres_schema

REPO = Path(__file__).resolve().parents[2]
SECRET = "hunter2-s3cret"


@pytest.fixture
def dsn() -> str:
    """The test server; the test skips without ``KESTREL_TEST_POSTGRES_DSN``."""
    return postgres_dsn()


@pytest.fixture
async def schema(dsn: str) -> AsyncIterator[str]:
    """An empty schema of this test alone."""
    async with postgres_schema(dsn) as name:
        yield name


@pytest.fixture
async def missing_schema(dsn: str) -> AsyncIterator[str]:
    """A schema name of this test alone that does not exist yet."""
    async with postgres_schema(dsn, create=False) as name:
        yield name


async def opened(dsn: str, schema: str) -> PostgresStore:
    store = PostgresStore(dsn, schema=schema)
    await store.migrate()
    return store


async def run_1(store: PostgresStore) -> int:
    """Session s1's run ``run_1``, created by w1 with a 30 s lease: its epoch."""
    await store.ensure_session(Session(id="s1"))
    return await store.create_run(RunRecord(id="run_1", session_id="s1"), "w1", 30)


async def requests_of_one_run(store: PostgresStore, count: int) -> list[str]:
    await run_1(store)
    requests = [
        Request(run_id="run_1", kind=RequestKind.WAIT_APPROVAL, call_id=f"call_{i}", tool="t")
        for i in range(count)
    ]
    for request in requests:
        await store.open_request(request)
    return [request.id for request in requests]


def with_credentials(dsn: str, userinfo: str) -> str:
    """The test DSN's server and database with other credentials."""
    parts = urlsplit(dsn)
    return (
        f"postgresql://{userinfo}@{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path}"
    )


# -- races --------------------------------------------------------------------------------------


async def test_two_pools_decide_one_request_once(dsn: str, schema: str) -> None:
    first, second = await opened(dsn, schema), await opened(dsn, schema)
    try:
        (request_id,) = await requests_of_one_run(first, 1)
        decisions = [
            Decision(request_id=request_id, kind=DecisionKind.APPROVE, by=f"user{i}")
            for i in range(40)
        ]

        won = await asyncio.gather(
            *(
                (first if i % 2 else second).decide(d, RequestStatus.ANSWERED)
                for i, d in enumerate(decisions)
            )
        )

        assert won.count(True) == 1
        _, status, decision = await second.get_request(request_id)
        assert status is RequestStatus.ANSWERED
        assert decision == decisions[won.index(True)]
    finally:
        await first.close()
        await second.close()


async def test_the_last_of_racing_approvers_sees_every_approval(dsn: str, schema: str) -> None:
    first, second = await opened(dsn, schema), await opened(dsn, schema)
    try:
        ids = await requests_of_one_run(first, 30)

        for request_id in ids:
            counts = await asyncio.gather(
                *(
                    (first if i % 2 else second).add_approval(request_id, f"user{i}")
                    for i in range(4)
                )
            )
            # Two "last" approvers that both saw one too few would leave the request stuck.
            assert sorted(c.count if c else 0 for c in counts) == [1, 2, 3, 4]
    finally:
        await first.close()
        await second.close()


async def test_stale_append_waits_for_a_claim_in_flight_and_is_refused(
    dsn: str, schema: str
) -> None:
    store = await opened(dsn, schema)
    admin = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        epoch = await run_1(store)
        claim = admin.transaction()
        await claim.start()
        await admin.execute("UPDATE runs SET owner = 'w2', epoch = epoch + 1 WHERE id = 'run_1'")

        append = asyncio.ensure_future(
            store.append("run_1", 0, epoch, UserMessageEntry(text="late"))
        )
        await asyncio.sleep(0.2)
        assert not append.done()  # the append waits on the run's row, it does not slip in
        await claim.commit()

        with pytest.raises(StaleEpoch):
            await asyncio.wait_for(append, 10)
        assert await store.load("run_1") == []
    finally:
        await admin.close()
        await store.close()


async def test_a_hundred_writers_land_every_append_in_order(dsn: str, schema: str) -> None:
    store = PostgresStore(dsn, schema=schema, max_size=20)
    await store.migrate()
    try:
        await store.ensure_session(Session(id="s1"))
        runs = [f"run_{i}" for i in range(100)]
        for run_id in runs:
            await store.create_run(RunRecord(id=run_id, session_id="s1"), "w1", 30)

        async def writer(run_id: str) -> None:
            for seq in range(10):
                await store.append(run_id, seq, 1, UserMessageEntry(text=f"{run_id}:{seq}"))

        await asyncio.gather(*(writer(run_id) for run_id in runs))

        for run_id in runs:
            records = await store.load(run_id)
            assert [r.entry for r in records] == [
                UserMessageEntry(text=f"{run_id}:{seq}") for seq in range(10)
            ]
    finally:
        await store.close()


async def test_submitted_appends_land_in_submission_order(dsn: str, schema: str) -> None:
    store = await opened(dsn, schema)
    try:
        epoch = await run_1(store)

        futures = [
            store.submit("run_1", seq, epoch, UserMessageEntry(text=str(seq))) for seq in range(5)
        ]
        await store.append("run_1", 5, epoch, UserMessageEntry(text="5"))
        await asyncio.gather(*futures)

        records = await store.load("run_1")
        assert [r.entry for r in records] == [UserMessageEntry(text=str(s)) for s in range(6)]
    finally:
        await store.close()


async def test_nul_characters_round_trip(dsn: str, schema: str) -> None:
    store = await opened(dsn, schema)
    try:
        epoch = await run_1(store)
        output = ToolResultEntry(call_id="c1", tool="cat", outcome=ToolOutcome.OK, output="a\x00b")

        await store.append("run_1", 0, epoch, output)
        await store.append("run_1", 0, epoch, output)  # identical: a no-op

        assert [r.entry for r in await store.load("run_1")] == [output]
    finally:
        await store.close()


async def test_schemas_are_isolated(dsn: str, schema: str, missing_schema: str) -> None:
    first, second = await opened(dsn, schema), await opened(dsn, missing_schema)
    try:
        await first.ensure_session(Session(id="s1"))
        await first.create_run(RunRecord(id="run_1", session_id="s1"), "w1", 30)

        assert (await first.get_run("run_1")).id == "run_1"
        with pytest.raises(UnknownRun):
            await second.get_run("run_1")
    finally:
        await first.close()
        await second.close()


async def ends_early(store: PostgresStore, timeout: float) -> bool:
    """Whether a wait for work on ``store`` ends well before ``timeout`` (something woke it)."""
    started = time.monotonic()
    await store.wait_for_work(timeout)
    return time.monotonic() - started < timeout / 2


async def check_work_wakes_only_its_schema(dsn: str, schema: str, other: str) -> None:
    here, elsewhere = await opened(dsn, schema), await opened(dsn, other)
    try:
        for store in (here, elsewhere):
            await store.wait_for_work(0)  # a fresh listener ends its first wait at once
        woken = asyncio.gather(ends_early(here, 10), ends_early(elsewhere, 0.5))
        await asyncio.sleep(0.05)

        await here.enqueue_work("start", {})

        assert list(await asyncio.wait_for(woken, 5)) == [True, False]
        assert await elsewhere.take_work("w2") == []
    finally:
        await here.close()
        await elsewhere.close()


async def test_work_notifications_stay_in_their_schema(
    dsn: str, schema: str, missing_schema: str
) -> None:
    await check_work_wakes_only_its_schema(dsn, schema, missing_schema)


async def test_long_schema_names_that_share_a_prefix_get_channels_of_their_own(dsn: str) -> None:
    # 63 characters, alike but for the last: a channel name cut at 63 bytes would be shared.
    prefix = f"kt_{uuid.uuid4().hex}_".ljust(62, "x")
    first, second = prefix + "a", prefix + "b"
    try:
        await check_work_wakes_only_its_schema(dsn, first, second)
    finally:
        admin = await asyncpg.connect(dsn, timeout=10)
        try:
            for name in (first, second):
                await admin.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        finally:
            await admin.close()


# -- migrations ---------------------------------------------------------------------------------


async def test_replicas_migrating_at_once_apply_each_version_once(
    dsn: str, missing_schema: str
) -> None:
    stores = [PostgresStore(dsn, schema=missing_schema) for _ in range(6)]
    try:
        versions = await asyncio.gather(*(store.migrate() for store in stores))
    finally:
        for store in stores:
            await store.close()

    assert versions == [SCHEMA_VERSION] * len(stores)
    admin = await asyncpg.connect(dsn)
    try:
        applied = await admin.fetch(f"SELECT version FROM {missing_schema}.schema_version")
    finally:
        await admin.close()
    assert sorted(row["version"] for row in applied) == list(range(1, SCHEMA_VERSION + 1))


async def test_upgrades_an_older_schema_in_place(dsn: str, schema: str) -> None:
    admin = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        await admin.execute(CREATE_VERSION_TABLE + migration_script(1))
        await admin.execute("INSERT INTO schema_version(version) VALUES (1)")
        await admin.execute("INSERT INTO sessions VALUES ('s1', 'console', '', '', now())")

        store = await opened(dsn, schema)
        await store.create_run(RunRecord(id="run_1", session_id="s1"), "w1", 30)
        await store.close()

        applied = await admin.fetch("SELECT version FROM schema_version ORDER BY version")
    finally:
        await admin.close()
    assert [row["version"] for row in applied] == list(range(1, SCHEMA_VERSION + 1))


async def test_refuses_a_newer_schema(dsn: str, schema: str) -> None:
    store = await opened(dsn, schema)
    await store.close()
    admin = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        await admin.execute("INSERT INTO schema_version(version) VALUES ($1)", SCHEMA_VERSION + 1)
    finally:
        await admin.close()

    newer = PostgresStore(dsn, schema=schema)
    with pytest.raises(StoreError, match="newer") as caught:
        await newer.migrate()
    await newer.close()

    assert f"schema version {SCHEMA_VERSION + 1}" in str(caught.value)
    assert schema in str(caught.value)


async def test_another_programs_schema_is_refused_and_left_as_it_was(dsn: str, schema: str) -> None:
    admin = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        await admin.execute("CREATE TABLE runs (id int); CREATE TABLE users (name text)")

        store = PostgresStore(dsn, schema=schema)
        with pytest.raises(StoreError, match="not Kestrel's \\(runs, users\\)") as refused:
            await store.migrate()
        with pytest.raises(StoreError, match="not Kestrel's"):
            await store.applied_version()  # kestrel db check
        await store.close()

        tables = await admin.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1", schema
        )
    finally:
        await admin.close()
    assert [row["tablename"] for row in tables] == ["runs", "users"]
    assert "?schema=" in str(refused.value) and "kestrel db migrate" not in str(refused.value)


async def test_needs_migrate_before_use(dsn: str, schema: str) -> None:
    store = PostgresStore(dsn, schema=schema)
    with pytest.raises(StoreError, match="migrate"):
        await store.get_run("run_1")
    with pytest.raises(StoreError, match="migrate"):
        store.submit("run_1", 0, 1, UserMessageEntry(text="hi"))
    await store.close()


# -- bounded statements -------------------------------------------------------------------------

# Short, so that a stuck statement fails in a moment; a test that hangs fails at the guard.
BOUND = 0.5
GUARD = 15.0


def proxied(dsn: str, proxy: TcpProxy) -> str:
    """The test DSN, through ``proxy``."""
    target = urlsplit(dsn)
    return dsn.replace(target.netloc, f"{target.username}@127.0.0.1:{proxy.port}", 1)


@asynccontextmanager
async def proxied_store(
    dsn: str, schema: str, timeout: float
) -> AsyncIterator[tuple[TcpProxy, PostgresStore]]:
    """A migrated store connecting through a proxy of the test server (each statement bounded
    by ``timeout``), closed at the end."""
    async with TcpProxy(urlsplit(dsn).port or 5432) as proxy:
        store = PostgresStore(proxied(dsn, proxy), schema=schema, command_timeout=timeout)
        await store.migrate()
        try:
            yield proxy, store
        finally:
            await store.close()


async def test_an_append_stuck_behind_a_lock_fails_within_the_timeout(
    dsn: str, schema: str
) -> None:
    store = PostgresStore(dsn, schema=schema, command_timeout=BOUND)
    await store.migrate()
    admin = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        epoch = await run_1(store)
        lock = admin.transaction()
        await lock.start()
        await admin.execute("SELECT 1 FROM runs WHERE id = 'run_1' FOR UPDATE")

        started = time.monotonic()
        with pytest.raises(StoreError) as caught:
            await asyncio.wait_for(
                store.append("run_1", 0, epoch, UserMessageEntry(text="x")), GUARD
            )

        assert time.monotonic() - started < GUARD / 2
        message = str(caught.value)
        assert "append failed: no answer within 0.5 s (database_timeout_seconds)" in message
        await lock.rollback()
        # The statement was cancelled on the server: the same store appends once the lock goes.
        await store.append("run_1", 0, epoch, UserMessageEntry(text="x"))
        assert len(await store.load("run_1")) == 1
    finally:
        await admin.close()
        await store.close()


async def test_a_statement_on_a_connection_that_stopped_answering_fails_within_the_timeout(
    dsn: str, schema: str
) -> None:
    async with proxied_store(dsn, schema, BOUND) as (proxy, store):
        proxy.hold()  # open, but nothing comes back: a half-open connection
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"no answer within 0\.5 s"):
            await asyncio.wait_for(store.get_session("s1"), GUARD)
        assert time.monotonic() - started < GUARD / 2

        proxy.restore()
        # The stuck connection was dropped: the next statement gets a working one.
        await until(lambda: answers(store), timeout=GUARD)


async def test_a_caller_stopped_while_its_connection_is_released_leaves_no_error_unretrieved(
    dsn: str, schema: str
) -> None:
    # A stop against a silent server: a statement timed out, and asyncpg waits for its cancel
    # request before the connection goes back to the pool, shielded from the caller. The stop
    # cancelled the caller (the work taker) in that wait, and the release failed later with no
    # one to see it: asyncio logged "Task exception was never retrieved", with a traceback.
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    async with TcpProxy(urlsplit(dsn).port or 5432) as proxy:
        store = PostgresStore(proxied(dsn, proxy), schema=schema, command_timeout=2)
        await store.migrate()
        try:
            proxy.hold()
            connections = proxy.accepted
            caller = asyncio.ensure_future(store.heartbeat("replica-a"))
            # The statement timed out: asyncpg sends its cancel request on a connection of its
            # own, and the caller waits for the release.
            await until(lambda: proxy.accepted > connections, timeout=GUARD)
            caller.cancel()
            await asyncio.wait({caller}, timeout=GUARD)
        finally:
            await store.close()
        others = asyncio.all_tasks() - {asyncio.current_task()} - proxy.tasks
        if others:
            await asyncio.wait(others, timeout=GUARD)  # the release, settled its own way
    del caller, others
    gc.collect()  # a task's unretrieved error is reported as the task is freed
    loop.set_exception_handler(None)
    assert [context["message"] for context in unhandled] == []


async def test_a_caller_stopped_in_a_statement_the_server_does_not_answer_ends_at_once(
    dsn: str, schema: str
) -> None:
    # A stop cancels the work taker in its heartbeat: asyncpg then waits for its cancel
    # request before the connection goes back to the pool, and the taker waited with it (the
    # statement's whole timeout, the stop's bound passed), then ended with the release's
    # timeout as a store failure, logging "trying again every poll" after the replica stopped.
    async with TcpProxy(urlsplit(dsn).port or 5432) as proxy:
        store = PostgresStore(proxied(dsn, proxy), schema=schema, command_timeout=GUARD)
        await store.migrate()
        try:
            proxy.hold()
            caller = asyncio.ensure_future(store.heartbeat("replica-a"))
            await until(lambda: proxy.held > 0, timeout=GUARD)  # the statement went out
            caller.cancel()
            await asyncio.wait({caller}, timeout=GUARD / 3)
            assert caller.cancelled()
        finally:
            proxy.restore()
            await store.close()


async def test_a_connection_that_fails_while_the_store_closes_is_no_outage(
    dsn: str, schema: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stop against a silent server: a connection still being made when the store closed
    # failed later, and the store said "unreachable …; reconnecting in the background until
    # it answers" after the replica had said "stopped", with nothing left to reconnect.
    import storage.postgres

    connect_timeout = 1.0
    # The close waits its bound for the stuck heartbeat: long enough for the connection being
    # made to fail within it, not the 10 s a replica gives a real server.
    monkeypatch.setattr(storage.postgres, "_CLOSE_TIMEOUT", 3 * connect_timeout)
    async with TcpProxy(urlsplit(dsn).port or 5432) as proxy:
        store = PostgresStore(
            proxied(dsn, proxy),
            schema=schema,
            command_timeout=GUARD,
            connect_timeout=connect_timeout,
        )
        await store.migrate()
        proxy.hold()
        connections = proxy.accepted
        # The first takes the pool's one connection, the second makes another.
        callers = [asyncio.ensure_future(store.heartbeat(f"replica-{i}")) for i in "ab"]
        await until(lambda: proxy.accepted > connections, timeout=GUARD)
        await store.close()
        for caller in callers:
            caller.cancel()
        await asyncio.wait(callers, timeout=GUARD)
        proxy.restore()
    assert "unreachable" not in caplog.text, caplog.text


async def test_a_store_closes_its_listener_and_pool_side_by_side_when_the_server_is_silent(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each close waits its bound for a silent server, and one after the other they held a
    # stopping replica 20 s after it said "stopped": with a command under way in its grace, past
    # the pod's (and Compose's, and the unit's) 40 s, and it was killed.
    import storage.postgres

    bound = 2.0
    monkeypatch.setattr(storage.postgres, "_CLOSE_TIMEOUT", bound)
    async with TcpProxy(urlsplit(dsn).port or 5432) as proxy:
        store = PostgresStore(proxied(dsn, proxy), schema=schema, command_timeout=GUARD)
        await store.migrate()
        await store.wait_for_work(0.01)  # the listener opened
        proxy.hold()
        caller = asyncio.ensure_future(store.heartbeat("replica-a"))  # a pooled one, stuck
        await until(lambda: proxy.held > 0, timeout=GUARD)
        started = time.monotonic()
        await store.close()
        took = time.monotonic() - started
        caller.cancel()
        await asyncio.wait({caller}, timeout=GUARD)
        proxy.restore()
    assert bound <= took < 1.75 * bound, took


async def answers(store: PostgresStore) -> bool:
    try:
        await store.get_session("s1")
    except StoreError:
        return False
    return True


async def test_a_migration_waits_for_the_migration_lock_longer_than_a_statement_may(
    dsn: str, schema: str
) -> None:
    admin = await asyncpg.connect(dsn)
    store = PostgresStore(dsn, schema=schema, command_timeout=BOUND)
    try:
        # Another replica migrating: it holds the lock the store's migration waits for.
        await admin.execute("SELECT pg_advisory_lock($1)", _migration_lock_key(schema))
        migrating = asyncio.ensure_future(store.migrate())

        async def waited_past_the_bound() -> bool:
            waited = await admin.fetchval(
                "SELECT max(extract(epoch FROM clock_timestamp() - query_start))"
                " FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%pg_advisory_xact_lock%'"
            )
            return waited is not None and waited > 2 * BOUND

        await until(waited_past_the_bound, timeout=GUARD)
        await admin.execute("SELECT pg_advisory_unlock($1)", _migration_lock_key(schema))

        assert await asyncio.wait_for(migrating, GUARD) == SCHEMA_VERSION
    finally:
        await admin.close()
        await store.close()


async def test_the_server_times_a_statement_out_as_the_store_does(dsn: str, schema: str) -> None:
    # A statement the store gave up on must not keep running (and holding its locks) on a
    # server the cancel request never reached.
    store = PostgresStore(dsn, schema=schema, command_timeout=2.5, min_size=2, max_size=2)
    await store.migrate()
    try:
        pool = store._pool
        assert pool is not None
        async with pool.acquire() as first, pool.acquire() as second:
            # The migration's longer bound was its transaction's alone.
            assert await first.fetchval("SHOW statement_timeout") == "2500ms"
            assert await second.fetchval("SHOW statement_timeout") == "2500ms"
    finally:
        await store.close()


async def test_a_pool_with_no_free_connection_says_so(dsn: str, schema: str) -> None:
    store = PostgresStore(dsn, schema=schema, command_timeout=BOUND, max_size=1)
    await store.migrate()
    try:
        pool = store._pool
        assert pool is not None
        async with pool.acquire():  # the pool's one connection, busy elsewhere
            with pytest.raises(StoreError) as caught:
                await asyncio.wait_for(store.get_session("s1"), GUARD)
        message = str(caught.value)
        assert "no free pooled connection within 0.5 s (all 1 in use;" in message, message
        assert "database_timeout_seconds" in message
        assert "no answer" not in message
        assert await store.get_session("s1") is None
    finally:
        await store.close()


async def test_a_command_timeout_must_be_positive() -> None:
    with pytest.raises(StoreError, match="command_timeout"):
        PostgresStore("postgresql://127.0.0.1/kestrel", command_timeout=0)


# -- connection errors (no server needed) -------------------------------------------------------


async def test_unreachable_server_is_one_line_naming_the_host_not_the_password() -> None:
    port = free_port()
    store = PostgresStore(f"postgresql://kestrel:{SECRET}@127.0.0.1:{port}/kestrel")

    with pytest.raises(StoreError) as caught:
        await store.migrate()
    await store.close()

    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message
    assert "refused" in message.lower()
    assert SECRET not in message
    assert "\n" not in message


async def test_open_postgres_reports_an_unknown_host() -> None:
    with pytest.raises(StoreError) as caught:
        await open_postgres(f"postgresql://kestrel:{SECRET}@db.invalid:5432/kestrel")

    assert "db.invalid" in str(caught.value)
    assert "resolve" in str(caught.value)
    assert SECRET not in str(caught.value)


async def test_bad_dsns_are_refused_without_the_password() -> None:
    with pytest.raises(StoreError, match="postgresql://"):
        PostgresStore(f"mysql://kestrel:{SECRET}@127.0.0.1/kestrel")

    store = PostgresStore(f"postgresql://kestrel:{SECRET}@127.0.0.1:notaport/kestrel")
    with pytest.raises(StoreError) as caught:
        await store.migrate()
    await store.close()

    assert "127.0.0.1:notaport" in str(caught.value)
    assert SECRET not in str(caught.value)
    with pytest.raises(ValueError, match="schema"):
        PostgresStore("postgresql://127.0.0.1/kestrel", schema="x; DROP TABLE runs")


def test_a_refused_certificate_is_said_as_itself() -> None:
    # An SSL error's errno is OpenSSL's, not the OS's: 1 is no "Operation not permitted".
    refused = ssl.SSLCertVerificationError(
        1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: certificate has expired"
    )
    assert "certificate has expired" in _cause(refused)


async def test_a_port_out_of_range_is_the_store_error() -> None:
    store = PostgresStore(f"postgresql://kestrel:{SECRET}@127.0.0.1:99999/kestrel")
    with pytest.raises(StoreError, match="connect failed") as caught:
        await store.migrate()
    await store.close()
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("dsn", "said"),
    [
        (f"postgresql://kestrel:{SECRET}@[::1:5432/kestrel", "invalid DSN: Invalid IPv6 URL"),
        (f"postgresql://kestrel:{SECRET}@::1]:5432/kestrel", "invalid DSN: Invalid IPv6 URL"),
        # urlsplit quotes the whole host part, password and all.
        (f"postgresql://kestrel:{SECRET}\u2100@db/kestrel", "invalid characters under NFKC"),
        (f"postgresql://kestrel:{SECRET}[@db/kestrel", "percent-encode"),
    ],
)
def test_a_dsn_no_url_parser_reads_is_the_store_error_without_the_password(
    dsn: str, said: str
) -> None:
    with pytest.raises(StoreError) as caught:
        PostgresStore(dsn)
    message = str(caught.value)
    assert message.startswith("PostgreSQL: invalid DSN:"), message
    assert said in message
    assert SECRET not in message


@pytest.mark.parametrize("mark", ["#", "?", "/"])
async def test_a_password_not_percent_encoded_shows_no_piece_of_it(mark: str) -> None:
    # asyncpg's parser ends the host part at the mark, and its message quotes a piece of the
    # password (``invalid literal for int(): 'head7x'``), which no scrub of the whole finds.
    head, tail = "head7x", "tail9y"
    store = PostgresStore(f"postgresql://kestrel:{head}{mark}{tail}@127.0.0.1:5432/kestrel")
    with pytest.raises(StoreError) as caught:
        await store.migrate()
    await store.close()

    message = str(caught.value)
    assert head not in message
    assert tail not in message
    assert "percent-encode" in message


async def test_refused_login_names_the_host_and_user_not_the_password(dsn: str) -> None:
    bad = with_credentials(dsn, f"kestrel_nobody:{SECRET}")
    store = PostgresStore(bad)

    with pytest.raises(StoreError) as caught:
        await store.migrate()
    await store.close()

    message = str(caught.value)
    assert "kestrel_nobody@" in message
    assert (urlsplit(dsn).hostname or "localhost") in message
    assert SECRET not in message
    assert "\n" not in message


async def test_an_append_the_server_answered_as_it_closed_the_connection_landed(
    dsn: str, schema: str
) -> None:
    # pg_terminate_backend (a failover, a pooler restarting) right after a statement: its
    # answer arrives, then the connection closes before asyncpg's pool takes it back, and the
    # release failed ("called on a free connection holder"). The append had committed, and was
    # said to have failed: a run stopped as if its journal could not be written, and a command
    # whose dispatch record had landed was taken for one of unknown outcome.
    async with proxied_store(dsn, schema, GUARD) as (proxy, store):
        epoch = await run_1(store)
        proxy.close_after_reply(b"answered-then-closed")
        entry = UserMessageEntry(text="answered-then-closed")
        await store.append("run_1", 0, epoch, entry)

        assert proxy.closed_after_reply == 1
        assert [record.entry for record in await store.load("run_1")] == [entry]


async def test_an_append_whose_backend_was_terminated_under_it_lands_once(
    dsn: str, schema: str
) -> None:
    # pg_terminate_backend (a failover, a pooler restarting, an operator) while an append ran:
    # the store said the append failed, and the run's task stopped, to be adopted a lease later,
    # with the command whose result it was writing left for on-call as one of unknown outcome.
    # The server answers on a new connection, and the same entry at the same seq is the same
    # append, landed or not: it is written again, once.
    app = f"kt_terminated_{uuid.uuid4().hex[:8]}"
    store = PostgresStore(f"{dsn}?application_name={app}", schema=schema, command_timeout=GUARD)
    await store.migrate()
    admin = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        epoch = await run_1(store)
        held = HeldBackend(admin, app)
        await held.hold("journal")
        entry = UserMessageEntry(text="under way")
        appending = asyncio.ensure_future(store.append("run_1", 0, epoch, entry))
        await held.terminate()

        await asyncio.wait_for(appending, GUARD)

        assert [record.entry for record in await store.load("run_1")] == [entry]
    finally:
        await admin.close()
        await store.close()


async def test_an_append_whose_commit_answer_was_lost_is_found_landed_not_written_twice(
    dsn: str, schema: str
) -> None:
    # The other side of writing an append again: its first try had committed.
    async with proxied_store(dsn, schema, GUARD) as (proxy, store):
        epoch = await run_1(store)
        await store.append("run_1", 0, epoch, UserMessageEntry(text="hello"))
        ended = RunEnded(
            result=TerminalResult(status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED)
        )
        proxy.lose_commit_reply(b"run_ended")

        await store.append("run_1", 1, epoch, ended)

        assert proxy.replies_lost == 1
        assert [record.entry for record in await store.load("run_1")][1:] == [ended]


@pytest.mark.parametrize(
    ("lease", "decider", "claimed"),
    [(0.0, "w2", True), (30.0, "w1", False)],
    ids=["lapsed-lease-taken", "own-live-lease-not-taken-again"],
)
async def test_a_decision_whose_commit_answer_was_lost_is_found_recorded(
    dsn: str, schema: str, lease: float, decider: str, claimed: bool
) -> None:
    # It stands, and so does the claim that came with it, and only that claim: w1, whose task
    # holds the run's live lease, does not take it again (a second driver) for a lease it had.
    async with proxied_store(dsn, schema, GUARD) as (proxy, store):
        await store.ensure_session(Session(id="s1"))
        epoch = await store.create_run(RunRecord(id="run_1", session_id="s1"), "w1", lease)
        request = Request(run_id="run_1", kind=RequestKind.WAIT_APPROVAL, call_id="c1", tool="t")
        await store.open_request(request)
        decision = Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="bob")
        proxy.lose_commit_reply(b'"kind":"approve"')

        settled = await store.decide_and_claim(
            decision, RequestStatus.ANSWERED, Audited("bob", AuditAction.APPROVE), decider, 30
        )

        assert proxy.replies_lost == 1
        assert settled == Settled(True, epoch + 1 if claimed else None)
        assert (await store.get_request(request.id))[2] == decision
        record = await store.get_run("run_1")
        assert (record.owner, record.epoch) == (decider, epoch + 1 if claimed else epoch)


async def test_a_decision_that_failed_unrecorded_still_fails(dsn: str, schema: str) -> None:
    async with proxied_store(dsn, schema, GUARD) as (proxy, store):
        (request_id,) = await requests_of_one_run(store, 1)
        decision = Decision(request_id=request_id, kind=DecisionKind.APPROVE, by="bob")
        proxy.cut()

        with pytest.raises(StoreError, match="decide failed"):
            await store.decide(decision, RequestStatus.ANSWERED)

        proxy.restore()
        assert (await store.get_request(request_id))[1] is RequestStatus.OPEN


async def test_a_transaction_whose_backend_was_terminated_says_why(dsn: str, schema: str) -> None:
    # Its end found the connection closed, and asyncpg's words for that replaced the cause:
    # "create_run failed: cannot call Transaction.__aexit__(): the underlying connection is
    # closed", which reads as a bug of Kestrel's, not as an operator ending the session.
    app = f"kt_terminated_{uuid.uuid4().hex[:8]}"
    store = PostgresStore(f"{dsn}?application_name={app}", schema=schema, command_timeout=GUARD)
    await store.migrate()
    admin = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        await store.ensure_session(Session(id="s1"))
        held = HeldBackend(admin, app)
        await held.hold("runs")
        creating = asyncio.ensure_future(
            store.create_run(RunRecord(id="run_1", session_id="s1"), "w1", 30)
        )
        await held.terminate()

        with pytest.raises(StoreError) as caught:
            await asyncio.wait_for(creating, GUARD)

        said = str(caught.value)
        assert "create_run failed: " in said
        assert "terminating connection due to administrator command" in said, said
    finally:
        await admin.close()
        await store.close()
