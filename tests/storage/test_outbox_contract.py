"""The ``Outbox`` role of the store, run against every backend of the ``store`` / ``backend``
fixtures: messages put, claimed by one claimer at a time, delivered or failed, never lost."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from bot.chat.outbox import Deliveries
from bot.chat.outbox_keys import owed_card
from bot.domain import Session
from bot.records import OutboxMessage
from bot.store import Store
from storage import postgres_schema, sqlite_schema
from storage.postgres import PostgresStore
from storage.sqlite import SqliteStore
from tests.storage.conftest import Backend, FakeClock, postgres_dsn
from tests.storage.conftest import postgres_schema as a_postgres_schema

LEASE = 30.0
TARGET = {"channel": "C1", "thread_ts": "171.5"}
CARD = {"text": "Restart web?", "blocks": [{"type": "section", "text": "ok ✓ \u0000"}]}
ANSWERED = {"text": "Approved by bob", "blocks": []}


async def put(store: Store, key: str, body: Mapping[str, Any] = CARD, **changes: str) -> int:
    """Put message ``key`` on Slack (or ``platform=``) at ``TARGET``; its version."""
    return await store.put_message(key, changes.get("platform", "slack"), TARGET, dict(body))


async def message(store: Store, key: str) -> OutboxMessage:
    """The stored message ``key``, which must exist."""
    found = await store.get_message(key)
    assert found is not None
    return found


def keys(messages: list[OutboxMessage]) -> list[str]:
    return [m.key for m in messages]


async def claim_all(store: Store, owner: str, limit: int = 3) -> list[str]:
    """Claim batches until none is left (delivering none); the keys claimed, in order."""
    claimed: list[str] = []
    while batch := await store.claim_messages(owner, 3600, limit=limit):
        claimed += keys(batch)
    return claimed


# -- put, claim, deliver ------------------------------------------------------------------------


async def test_messages_are_read_by_their_keys_at_once(store: Store) -> None:
    await put(store, "slack:card:req_1")
    await put(store, "slack:card:req_2", ANSWERED)
    await put(store, "slack:card:req_3")
    found = await store.get_messages(["slack:card:req_2", "slack:card:req_1", "slack:card:nope"])
    assert sorted(keys(found)) == ["slack:card:req_1", "slack:card:req_2"]
    assert {m.key: m.body for m in found}["slack:card:req_2"] == ANSWERED
    assert await store.get_messages([]) == []


async def test_the_ids_messages_are_recorded_as_are_told_by_platform(store: Store) -> None:
    for key, ref in (("slack:a", "111"), ("slack:b", "222"), ("slack:c", "")):
        await put(store, key)
        await store.claim_messages("w1", LEASE, key=key)
        await store.message_delivered(key, "w1", 1, ref)
    await put(store, "discord:a", platform="discord")
    await store.claim_messages("w1", LEASE, key="discord:a")
    await store.message_delivered("discord:a", "w1", 1, "333")
    assert await store.held_refs("slack", ["333", "222", "", "999", "111"]) == {"111", "222"}
    assert await store.held_refs("discord", ["111", "333"]) == {"333"}
    assert await store.held_refs("slack", []) == set()


async def test_a_message_is_put_claimed_and_delivered(store: Store, clock: FakeClock) -> None:
    assert await put(store, "slack:card:req_1") == 1
    put_at = clock.now
    assert await message(store, "slack:card:req_1") == OutboxMessage(
        key="slack:card:req_1",
        platform="slack",
        target=TARGET,
        body=CARD,
        next_attempt_at=put_at,
        created_at=put_at,
        updated_at=put_at,
    )

    clock.advance(1)
    [claimed] = await store.claim_messages("w1", LEASE)

    assert (claimed.key, claimed.body, claimed.target) == ("slack:card:req_1", CARD, TARGET)
    assert (claimed.version, claimed.delivered_version, claimed.attempts) == (1, 0, 1)
    assert claimed.due and claimed.ref == ""
    assert await store.claim_messages("w2", LEASE) == []  # w1 holds it
    assert await store.outbox_backlog() == 1  # claimed, not delivered yet

    clock.advance(1)
    await store.message_delivered("slack:card:req_1", "w1", 1, "ts_1")

    delivered = await message(store, "slack:card:req_1")
    assert (delivered.delivered_version, delivered.ref, delivered.attempts) == (1, "ts_1", 0)
    assert not delivered.due
    assert (delivered.created_at, delivered.updated_at) == (put_at, clock.now)
    assert await store.outbox_backlog() == 0
    clock.advance(3600)
    assert await store.claim_messages("w2", LEASE) == []


async def test_an_identical_put_changes_nothing(store: Store, clock: FakeClock) -> None:
    await put(store, "k1")
    await store.claim_messages("w1", LEASE)
    await store.message_delivered("k1", "w1", 1, "ts_1")
    before = await message(store, "k1")

    clock.advance(60)
    reordered = dict(reversed(list(CARD.items())))  # the same body, keys in another order

    assert await put(store, "k1", reordered) == 1
    assert await message(store, "k1") == before
    assert await store.claim_messages("w1", LEASE) == []


async def test_a_changed_put_is_the_next_version_due_at_once(
    store: Store, clock: FakeClock
) -> None:
    await put(store, "k1")
    await store.claim_messages("w1", LEASE)
    await store.message_delivered("k1", "w1", 1, "ts_1")
    clock.advance(60)

    other_target = {"channel": "C2"}
    version = await store.put_message("k1", "slack", other_target, ANSWERED)

    assert version == 2
    changed = await message(store, "k1")
    assert changed.due and (changed.version, changed.delivered_version) == (2, 1)
    assert (changed.ref, changed.body, changed.target) == ("ts_1", ANSWERED, TARGET)
    assert changed.next_attempt_at == changed.updated_at == clock.now
    [claimed] = await store.claim_messages("w2", LEASE)
    assert (claimed.version, claimed.ref, claimed.body) == (2, "ts_1", ANSWERED)
    await store.message_delivered("k1", "w2", 2, "ts_1")
    assert not (await message(store, "k1")).due
    assert await put(store, "k1", CARD) == 3  # back to the first body: a change again


async def test_concurrent_puts_each_make_their_own_version(backend: Backend) -> None:
    first, second = await backend.open(), await backend.open()
    bodies = [{"n": n} for n in range(6)]

    versions = await asyncio.gather(
        *(put(store, "k1", body) for store, body in zip([first, second] * 3, bodies, strict=True))
    )

    assert sorted(versions) == [1, 2, 3, 4, 5, 6]
    assert (await message(first, "k1")).version == 6


async def test_a_body_that_is_not_json_is_refused(store: Store) -> None:
    with pytest.raises(ValueError):
        await put(store, "k1", {"ratio": float("nan")})
    assert await store.get_message("k1") is None


async def test_an_unknown_message_is_none_and_reports_change_nothing(
    store: Store, clock: FakeClock
) -> None:
    await store.message_delivered("nope", "w1", 1, "ts_1")
    await store.message_failed("nope", "w1", clock.now, "boom")

    assert await store.get_message("nope") is None
    assert await store.outbox_backlog() == 0


# -- claims -------------------------------------------------------------------------------------


async def test_claims_take_the_oldest_first_by_platform_key_and_limit(
    store: Store, clock: FakeClock
) -> None:
    for key in ("a", "b", "c"):
        await put(store, key)
    await put(store, "d", platform="discord")
    clock.advance(1)
    await put(store, "e")  # created later, same platform

    assert keys(await store.claim_messages("w1", LEASE, platform="discord")) == ["d"]
    assert keys(await store.claim_messages("w1", LEASE, key="b")) == ["b"]
    assert keys(await store.claim_messages("w1", LEASE, key="b")) == []  # w1 holds it already
    assert await store.claim_messages("w1", LEASE, limit=0) == []
    assert keys(await store.claim_messages("w1", LEASE, limit=1)) == ["a"]
    assert keys(await store.claim_messages("w2", LEASE, platform="slack")) == ["c", "e"]


async def test_concurrent_claimers_never_get_the_same_message(backend: Backend) -> None:
    first, second = await backend.open(), await backend.open()
    expected = [f"k{n:02d}" for n in range(40)]
    for key in expected:
        await put(first, key)

    claims = await asyncio.gather(
        claim_all(first, "w1a"),
        claim_all(second, "w2a"),
        claim_all(first, "w1b"),
        claim_all(second, "w2b"),
    )

    claimed = [key for claim in claims for key in claim]
    assert sorted(claimed) == expected  # each once: disjoint, and together all of them
    assert all(claim == sorted(claim) for claim in claims)  # each claimer: oldest first
    assert [(await message(first, key)).attempts for key in expected] == [1] * len(expected)


async def test_an_expired_claim_is_claimed_again_and_counts_an_attempt(
    backend: Backend, clock: FakeClock
) -> None:
    first, second = await backend.open(), await backend.open()
    await put(first, "k1")
    assert keys(await first.claim_messages("w1", LEASE)) == ["k1"]

    clock.advance(LEASE - 1)
    assert await second.claim_messages("w2", LEASE) == []
    clock.advance(1)
    [again] = await second.claim_messages("w2", LEASE)

    assert (again.key, again.attempts) == ("k1", 2)
    assert await first.claim_messages("w1", LEASE) == []  # w2 holds it now
    clock.advance(LEASE)
    [third] = await first.claim_messages("w3", LEASE)
    assert third.attempts == 3


async def test_a_lost_claimer_records_its_post_but_not_over_the_holder(
    backend: Backend, clock: FakeClock
) -> None:
    first, second = await backend.open(), await backend.open()
    await put(first, "k1")
    await first.claim_messages("w1", LEASE)
    clock.advance(LEASE)
    await second.claim_messages("w2", LEASE)  # w1's claim ran out: w2 holds the message

    await first.message_failed("k1", "w1", clock.now + timedelta(hours=1), "too late")
    await first.message_delivered("k1", "w1", 1, "ts_w1")  # w1's post landed all the same

    recorded = await message(second, "k1")
    assert (recorded.ref, recorded.delivered_version, recorded.error) == ("ts_w1", 1, "")
    assert recorded.attempts == 2  # w2 still holds its claim: nothing released
    assert recorded.next_attempt_at < clock.now + timedelta(hours=1)
    await put(first, "k1", ANSWERED)
    assert await first.claim_messages("w3", LEASE) == []  # still w2's, though due again

    await second.message_delivered("k1", "w2", 1, "ts_w2")  # the holder's ref stands
    released = await message(second, "k1")
    assert (released.ref, released.attempts, released.delivered_version) == ("ts_w2", 0, 1)
    await first.message_delivered("k1", "w1", 1, "ts_other")  # another post: not recorded
    assert (await message(second, "k1")).ref == "ts_w2"
    assert keys(await first.claim_messages("w3", LEASE)) == ["k1"]  # version 2 is due


async def test_the_delivered_version_only_grows(store: Store) -> None:
    await put(store, "k1")
    await store.claim_messages("w1", LEASE)
    assert await put(store, "k1", ANSWERED) == 2  # changed while being delivered

    await store.message_delivered("k1", "w1", 1, "ts_1")

    after_first = await message(store, "k1")
    assert after_first.due and (after_first.delivered_version, after_first.attempts) == (1, 0)
    [claimed] = await store.claim_messages("w2", LEASE)
    assert (claimed.version, claimed.body, claimed.attempts) == (2, ANSWERED, 1)
    await store.message_delivered("k1", "w2", 2, "ts_1")
    await store.message_delivered("k1", "w1", 1, "ts_1")  # a late report of the older version
    assert (await message(store, "k1")).delivered_version == 2


# -- failures -----------------------------------------------------------------------------------


async def test_a_failed_message_waits_until_its_retry_time(store: Store, clock: FakeClock) -> None:
    await put(store, "k1")
    await store.claim_messages("w1", LEASE)

    await store.message_failed("k1", "w1", clock.now + timedelta(seconds=60), "rate limited")

    failed = await message(store, "k1")
    assert (failed.error, failed.attempts, failed.ref) == ("rate limited", 1, "")
    assert failed.next_attempt_at == clock.now + timedelta(seconds=60)
    assert failed.due and await store.outbox_backlog() == 1
    clock.advance(59)
    assert await store.claim_messages("w2", LEASE) == []
    clock.advance(1)
    [retried] = await store.claim_messages("w2", LEASE)
    assert (retried.attempts, retried.error) == (2, "rate limited")

    await store.message_delivered("k1", "w2", 1, "ts_1")
    delivered = await message(store, "k1")
    assert (delivered.attempts, delivered.error, delivered.ref) == (0, "", "ts_1")


async def test_a_changed_body_after_a_failure_is_due_at_once(
    store: Store, clock: FakeClock
) -> None:
    await put(store, "k1")
    await store.claim_messages("w1", LEASE)
    await store.message_failed("k1", "w1", clock.now + timedelta(hours=1), "boom")

    clock.advance(1)
    await put(store, "k1", ANSWERED)

    [claimed] = await store.claim_messages("w1", LEASE)
    assert (claimed.version, claimed.attempts, claimed.error) == (2, 2, "boom")


# -- backlog ------------------------------------------------------------------------------------


async def test_the_backlog_counts_what_waits_for_delivery(store: Store) -> None:
    assert await store.outbox_backlog() == 0
    for key in ("a", "b", "c"):
        await put(store, key)
    await put(store, "d", platform="discord")
    await store.claim_messages("w1", LEASE, key="a")
    await store.message_delivered("a", "w1", 1, "ts_a")
    await store.claim_messages("w1", LEASE, key="b")  # claimed still waits

    assert await store.outbox_backlog() == 3
    assert await store.outbox_backlog("slack") == 2
    assert await store.outbox_backlog("discord") == 1
    assert await store.outbox_backlog("teams") == 0
    await put(store, "a", ANSWERED)
    assert await store.outbox_backlog("slack") == 3


async def test_messages_outlive_the_store_instance(backend: Backend) -> None:
    store = await backend.open()
    await put(store, "k1")
    await store.claim_messages("w1", LEASE)
    before = await message(store, "k1")
    await store.close()

    reopened = await backend.open()

    assert await reopened.get_message("k1") == before
    assert await reopened.claim_messages("w2", LEASE) == []


# -- migration from the previous schema version -------------------------------------------------

SESSION = Session(id="s1", platform="slack", channel="C1", thread="T1")


async def upgraded(store: SqliteStore | PostgresStore) -> int:
    """Migrate ``store``, on a database of the previous schema version holding ``SESSION``;
    check that its outbox works and the session reads back, close it; the version reached."""
    try:
        version = await store.migrate()
        await put(store, "k1")
        assert keys(await store.claim_messages("w1", LEASE)) == ["k1"]
        assert await store.get_session(SESSION.id) == SESSION
    finally:
        await store.close()
    return version


# The migration that gave sessions their workspace: the rows below are written as before it.
WORKSPACE_MIGRATION = 6


async def test_sqlite_adds_the_outbox_to_the_previous_schema(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    previous = WORKSPACE_MIGRATION - 1
    with sqlite3.connect(path, isolation_level=None) as conn:
        scripts = [sqlite_schema.migration_script(v) for v in range(1, previous + 1)]
        conn.executescript(sqlite_schema.CREATE_VERSION_TABLE + "".join(scripts))
        conn.execute("INSERT INTO sessions VALUES ('s1', 'slack', 'C1', 'T1', '2030')")
    conn.close()

    version = await upgraded(SqliteStore(path))

    with sqlite3.connect(path) as conn:
        applied = [row[0] for row in conn.execute("SELECT version FROM schema_version")]
    conn.close()
    assert version == sqlite_schema.SCHEMA_VERSION
    assert applied == list(range(1, version + 1))


async def test_postgres_adds_the_outbox_to_the_previous_schema() -> None:
    dsn = postgres_dsn()
    previous = WORKSPACE_MIGRATION - 1
    async with a_postgres_schema(dsn) as schema:
        admin = await asyncpg.connect(dsn, server_settings={"search_path": schema})
        try:
            await admin.execute(postgres_schema.CREATE_VERSION_TABLE)
            for version in range(1, previous + 1):
                await admin.execute(postgres_schema.migration_script(version))
                await admin.execute("INSERT INTO schema_version(version) VALUES ($1)", version)
            await admin.execute("INSERT INTO sessions VALUES ('s1', 'slack', 'C1', 'T1', now())")

            version = await upgraded(PostgresStore(dsn, schema=schema))

            applied = await admin.fetch("SELECT version FROM schema_version ORDER BY version")
        finally:
            await admin.close()

    assert version == postgres_schema.SCHEMA_VERSION
    assert [row["version"] for row in applied] == list(range(1, version + 1))


# -- a placeholder filled in --------------------------------------------------------------------


class _CutShort:
    """A platform whose first post lands and is never answered (the worker dies, or the
    connection drops, before it records the post); it finds what it holds by key."""

    platform = "slack"

    def __init__(self) -> None:
        self.posted: list[tuple[str, dict[str, Any]]] = []

    async def post(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str:
        self.posted.append((key, body))
        if len(self.posted) == 1:
            raise ConnectionResetError("the post landed; its answer never came")
        return f"ts_{len(self.posted)}"

    async def update(self, ref: str, target: dict[str, Any], body: dict[str, Any]) -> None:
        pass

    async def find(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str | None:
        held = [n for n, (posted, _) in enumerate(self.posted, 1) if posted == key]
        return f"ts_{held[0]}" if held else None


async def test_a_card_owed_again_after_a_post_that_may_have_landed_is_not_posted_twice(
    store: Store,
) -> None:
    # A card's post landed without its answer; before it is tried again, a decision at the
    # terminal owes the card again (a placeholder the worker fills in). Filling it in must not
    # forget that an earlier attempt may have posted it: it is looked up, not posted again.
    transport = _CutShort()
    deliveries = Deliveries(store, transport, "w1")

    async def render(kind: str, owner: str) -> None:
        assert (kind, owner) == ("card", "req_1")
        await store.put_message("slack:card:req_1", "slack", TARGET, ANSWERED)

    deliveries.renders_owed(render)
    await put(store, "slack:card:req_1")
    assert await deliveries.deliver_due() == 0  # posted; the answer lost
    await put(store, "slack:card:req_1", owed_card("req_1"))  # what OWE_CARD_AGAIN writes

    await deliveries.deliver_due()

    assert [key for key, _ in transport.posted] == ["slack:card:req_1"]
    shown = await message(store, "slack:card:req_1")
    assert (shown.ref, shown.body, shown.due) == ("ts_1", ANSWERED, False)


# -- a claim that runs out ----------------------------------------------------------------------


class _Thread:
    """One thread as the platform shows it, for every worker: each post and edit, by key."""

    platform = "slack"

    def __init__(self) -> None:
        self.posted: list[tuple[str, dict[str, Any]]] = []
        self.edited: list[tuple[str, dict[str, Any]]] = []
        self.meanwhile: list[Any] = []  # run once, as the first post is under way

    async def post(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str:
        self.posted.append((key, body))
        while self.meanwhile:
            await self.meanwhile.pop(0)()
        return f"ts_{len(self.posted)}"

    async def update(self, ref: str, target: dict[str, Any], body: dict[str, Any]) -> None:
        self.edited.append((ref, body))

    async def find(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str | None:
        held = [n for n, (posted, _) in enumerate(self.posted, 1) if posted == key]
        return f"ts_{held[0]}" if held else None


async def _decided_elsewhere(store: Store, clock: FakeClock, other: Deliveries) -> None:
    """Past the first worker's claim, the card decided and shown by ``other``."""
    clock.advance(11)
    await put(store, "slack:card:req_1", ANSWERED)
    await other.deliver_due()


async def test_a_worker_whose_claim_ran_out_leaves_the_rest_of_its_batch(
    store: Store, clock: FakeClock
) -> None:
    # A slow platform (a loaded machine) keeps the first worker on its first message past its
    # claim: another worker claims the card meanwhile and shows it decided. The first must not
    # then show the card as it claimed it, open, under the decided one.
    thread = _Thread()
    first = Deliveries(store, thread, "w1", claim_seconds=10)
    second = Deliveries(store, thread, "w2", claim_seconds=10)
    await put(store, "slack:status:run_1", ANSWERED)
    await put(store, "slack:card:req_1", CARD)
    thread.meanwhile.append(functools.partial(_decided_elsewhere, store, clock, second))
    await first.deliver_due()

    assert [body for key, body in thread.posted if key == "slack:card:req_1"] == [ANSWERED]
    shown = await message(store, "slack:card:req_1")
    assert (shown.body, shown.due) == (ANSWERED, False)


class _SlowLookup(_Thread):
    """A thread whose first post lands unanswered, and whose lookup is slow."""

    async def post(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str:
        self.posted.append((key, body))
        if len(self.posted) == 1:
            raise ConnectionResetError("the post landed; its answer never came")
        return f"ts_{len(self.posted)}"

    async def find(self, key: str, target: dict[str, Any], body: dict[str, Any]) -> str | None:
        while self.meanwhile:
            await self.meanwhile.pop(0)()
        return await super().find(key, target, body)


async def test_a_worker_whose_lookup_outlasted_its_claim_edits_nothing(
    store: Store, clock: FakeClock
) -> None:
    # A card posted without its answer is looked up before it is tried again; the lookup
    # outlasts the claim, and another worker shows the card decided meanwhile. The first must
    # not then edit it back to the open card it claimed.
    thread = _SlowLookup()
    first = Deliveries(store, thread, "w1", claim_seconds=10)
    second = Deliveries(store, thread, "w2", claim_seconds=10)
    await put(store, "slack:card:req_1", CARD)
    await first.deliver_due()  # posted; the answer lost
    clock.advance(60)
    thread.meanwhile.append(functools.partial(_decided_elsewhere, store, clock, second))
    await first.deliver_due()

    assert thread.edited == [("ts_1", ANSWERED)]
    shown = await message(store, "slack:card:req_1")
    assert (shown.ref, shown.body, shown.due) == ("ts_1", ANSWERED, False)
