"""A team upgrades from release 0.2.0 with runs in flight: every run its store holds reads,
resumes and ends as it would have in 0.2.0, and nothing in its journal or audit is lost or
rewritten.

The stores are ``fixtures/store_0_2_0/``, made by commit 00ed9c65 (the last whose
``__version__`` is 0.2.0, which a clone installed then called itself; schema version 7, past
the release's 6, whose runs with a catalog command wait for ``--force`` after an upgrade: the
CHANGELOG's "Upgrading", which ``test_upgrade_0_2_0_release.py`` pins) with its own
``kestrel``, by ``make.py`` there (its docstring says how): ``kestrel.db`` (SQLite) and
``postgres.json`` (the same runs made on PostgreSQL, every table's rows). They hold, by name
(``runs.json``): ``approve`` (waiting on an approval), ``question`` (on
``ask_human_confirm``), ``cancel`` (an approval, to be cancelled), ``plan`` (a plan of two
deploys), ``effect`` (a migration whose process was SIGKILLed, resumed
in 0.2.0: waiting on on-call), ``in_flight`` (the same, never resumed: running, its lease
lapsed, its command's dispatch journaled and no result), ``chat`` (an approval left for later
at ``kestrel chat``), ``finished`` and ``cancelled``. The demo runs replay the offline demo;
the others the fixture's own catalog (``own.kestrel.yaml``).

A run goes on only with the tool set it started with (its fingerprint): a change to what that
holds (a built-in tool added, a demo tool's description) fails here, as a decision then says
"not resumed here: the tool set changed" and waits for ``runs resume --force``. Such a change
says so to teams under "Upgrading" in the CHANGELOG, and this test with it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from storage import sqlite_schema
from storage.postgres_schema import CREATE_VERSION_TABLE, SCHEMA_VERSION, migration_script
from tests.bot.cli.test_cli import kestrel, one_line_error
from tests.storage.conftest import postgres_dsn, postgres_schema

FIXTURE = Path(__file__).parent / "fixtures" / "store_0_2_0"
CONFIGS = ("kestrel.yaml", "own.kestrel.yaml", "own.tools.yaml", "own.script.yaml", "own.sh")
OWN = ("--config", "own.kestrel.yaml")
# The schema version 0.2.0 (00ed9c65) made its stores at.
MADE_AT = 7
# Each named run's status as the fixture's store left it.
AS_LEFT = {
    "approve": "suspended",
    "question": "suspended",
    "cancel": "suspended",
    "plan": "suspended",
    "effect": "suspended",
    "in_flight": "running",
    "chat": "suspended",
    "finished": "completed",
    "cancelled": "cancelled",
}
# A journal or audit row as the test compares them: every column, as the driver reads it.
Rows = list[tuple[Any, ...]]


@dataclass
class Upgrade:
    """A copy of a 0.2.0 store in a folder of its configuration, and how to read its rows."""

    folder: Path
    runs: dict[str, list[str]]
    rows: Callable[[str], Rows]
    made_at: int  # the schema version the store was made at
    current: int  # the one this release migrates it to

    def run(self, *args: str, stdin: str = "") -> Any:
        """This release's ``kestrel`` in the folder."""
        return kestrel(self.folder, *args, stdin=stdin)

    def statuses(self) -> dict[str, str]:
        """Each named run's status."""
        listed = json.loads(self.run("runs", "list", "--json").stdout)
        by_id = {r["run_id"]: r["status"] for r in listed}
        return {name: by_id[run_id] for name, (run_id, _) in self.runs.items()}

    def kinds(self, name: str) -> list[str]:
        """The kinds of the named run's journal entries, in order."""
        run_id = self.runs[name][0]
        return [row[3] for row in self.rows("journal") if row[0] == run_id]


def configured(folder: Path, database: str | None = None, fixture: Path = FIXTURE) -> None:
    """The fixture's configuration in ``folder`` (naming ``database`` if given): ``fixture``'s
    own files, and ``FIXTURE``'s where it has none."""
    for name in CONFIGS:
        shutil.copy(fixture / name if (fixture / name).exists() else FIXTURE / name, folder / name)
    if database is None:
        return
    for name in ("kestrel.yaml", "own.kestrel.yaml"):
        config = folder / name
        text = config.read_text().replace("database: kestrel.db\n", "")
        config.write_text(f"database: {json.dumps(database)}\n{text}")


@asynccontextmanager
async def sqlite_upgrade(
    tmp_path: Path, fixture: Path = FIXTURE, made_at: int = MADE_AT
) -> AsyncIterator[Upgrade]:
    configured(tmp_path, fixture=fixture)
    shutil.copy(fixture / "kestrel.db", tmp_path / "kestrel.db")

    def rows(table: str) -> Rows:
        with sqlite3.connect(tmp_path / "kestrel.db") as conn:
            found = conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
        conn.close()
        return found

    runs = json.loads((fixture / "runs.json").read_text())
    yield Upgrade(tmp_path, runs, rows, made_at, sqlite_schema.SCHEMA_VERSION)


@asynccontextmanager
async def postgres_upgrade(
    tmp_path: Path, fixture: Path = FIXTURE, made_at: int = MADE_AT
) -> AsyncIterator[Upgrade]:
    dsn = postgres_dsn()
    made = json.loads((fixture / "postgres.json").read_text())
    async with postgres_schema(dsn) as schema:
        admin = await asyncpg.connect(dsn, server_settings={"search_path": schema})
        try:
            await restored(admin, made["rows"], made_at)
            configured(tmp_path, f"{dsn}?schema={schema}", fixture)
            loop = asyncio.get_running_loop()

            def rows(table: str) -> Rows:
                query = f"SELECT * FROM {table} ORDER BY 1, 2"
                fetched = asyncio.run_coroutine_threadsafe(admin.fetch(query), loop).result()
                return [tuple(row) for row in fetched]

            yield Upgrade(tmp_path, made["runs"], rows, made_at, SCHEMA_VERSION)
        finally:
            await admin.close()


async def restored(
    conn: asyncpg.Connection, tables: dict[str, list[dict[str, Any]]], made_at: int
) -> None:
    """0.2.0's schema (migrations 1 to ``made_at``, which this release keeps as they were)
    holding the rows 0.2.0 wrote, its identity columns going on after them."""
    await conn.execute(CREATE_VERSION_TABLE)
    for version in range(1, made_at + 1):
        await conn.execute(migration_script(version))
        await conn.execute("INSERT INTO schema_version(version) VALUES ($1)", version)
    for table, rows in tables.items():  # in the order their foreign keys allow
        await conn.execute(
            f"INSERT INTO {table} OVERRIDING SYSTEM VALUE"
            f" SELECT * FROM json_populate_recordset(NULL::{table}, $1::json)",
            json.dumps(rows),
        )
    identities = await conn.fetch(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND is_identity = 'YES'"
    )
    for table, column in identities:
        await conn.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'),"
            f" COALESCE(MAX({column}), 0) + 1, false) FROM {table}"
        )


UPGRADES = {"sqlite": sqlite_upgrade, "postgres": postgres_upgrade}


@pytest.fixture(params=sorted(UPGRADES))
async def upgrade(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Upgrade]:
    async with UPGRADES[request.param](tmp_path) as made:
        yield made


async def test_a_0_2_0_store_is_read_after_db_migrate_as_0_2_0_left_it(upgrade: Upgrade) -> None:
    await asyncio.to_thread(read_as_left, upgrade)


def read_as_left(upgrade: Upgrade) -> None:
    journal, audit = upgrade.rows("journal"), upgrade.rows("audit")
    migrated(upgrade)
    assert upgrade.statuses() == AS_LEFT
    pending = json.loads(upgrade.run("runs", "pending", "--json").stdout)
    waiting = {(r["run_id"], r["id"]): r["kind"] for r in pending}
    runs = upgrade.runs
    assert waiting == {
        tuple(runs["approve"]): "wait_approval",
        tuple(runs["question"]): "wait_user",
        tuple(runs["cancel"]): "wait_approval",
        tuple(runs["plan"]): "wait_plan",
        tuple(runs["effect"]): "wait_effect",
        tuple(runs["chat"]): "wait_approval",
    }
    for run_id, _ in runs.values():
        shown = upgrade.run("runs", "show", run_id)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    audited = json.loads(upgrade.run("audit", "--limit", "1000", "--json").stdout)
    assert len(audited) == len(audit)
    assert upgrade.rows("journal") == journal and upgrade.rows("audit") == audit


async def test_every_run_0_2_0_left_waiting_goes_on_and_ends_once(upgrade: Upgrade) -> None:
    await asyncio.to_thread(resumed_to_the_end, upgrade)


def resumed_to_the_end(upgrade: Upgrade) -> None:
    assert upgrade.run("db", "migrate").returncode == 0
    journal, audit = upgrade.rows("journal"), upgrade.rows("audit")
    runs = upgrade.runs

    def decided(*args: str) -> str:
        done = upgrade.run(*args)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stderr)
        return str(done.stdout)

    said = decided("runs", "approve", *runs["approve"], "--as", "alice")
    assert "waiting: wait_user" in said  # restarted, then the demo's question
    question = next(r["id"] for r in pending(upgrade) if r["run_id"] == runs["approve"][0])
    decided("runs", "answer", runs["approve"][0], question, "yes", "--as", "bob")
    decided("runs", "answer", *runs["question"], "no", "--as", "bob")
    decided("runs", "cancel", runs["cancel"][0], "--as", "bob")
    decided(*OWN, "runs", "approve", *runs["plan"], "--as", "alice")
    decided(*OWN, "runs", "effect", *runs["effect"], "done", "--as", "bob")
    # The run whose command was in flight: its outcome is asked of on-call, never assumed.
    resumed = upgrade.run(*OWN, "runs", "resume", runs["in_flight"][0], "--as", "bob")
    assert resumed.returncode == 3, resumed.stderr
    (effect,) = [r for r in pending(upgrade) if r["run_id"] == runs["in_flight"][0]]
    assert effect["kind"] == "wait_effect"
    decided(*OWN, "runs", "effect", runs["in_flight"][0], effect["id"], "retry", "--as", "bob")
    (again,) = [r for r in pending(upgrade) if r["run_id"] == runs["in_flight"][0]]
    decided(*OWN, "runs", "approve", runs["in_flight"][0], again["id"], "--as", "alice")
    console = f"/resume {runs['chat'][0]}\na\nyes\n/quit\n"
    chatted = upgrade.run("chat", "--as", "carol", stdin=console)
    assert chatted.returncode == 0 and "Checkout is back up." in chatted.stdout, chatted.stderr

    assert pending(upgrade) == []
    assert upgrade.statuses() == {
        "approve": "completed",
        "question": "completed",
        "cancel": "cancelled",
        "plan": "completed",
        "effect": "completed",
        "in_flight": "completed",
        "chat": "completed",
        "finished": "completed",
        "cancelled": "cancelled",
    }
    # Each command ran as often as people let it: the two restarts approved here (the
    # question's ran in 0.2.0), the plan's deploys, and the in-flight migration once more,
    # retried; the migration settled as done ran nothing.
    restarts = (upgrade.folder / "demo-state" / "restarts.log").read_text().splitlines()
    assert restarts == ["restart checkout"] * 2
    executed = (upgrade.folder / "executions.log").read_text().splitlines()
    assert executed == ["deploy web", "deploy api", "migrate billing"]
    # Nothing 0.2.0 journaled or audited is lost or rewritten; each run goes on after it.
    after = upgrade.rows("journal")
    assert set(journal) <= set(after) and len(after) > len(journal)
    assert set(audit) <= set(upgrade.rows("audit"))
    for name in runs:
        assert upgrade.kinds(name)[-1] == "run_ended", name
    flight = upgrade.kinds("in_flight")
    assert flight.count("tool_dispatched") == 2 and flight.count("tool_result") == 1


def migrated(upgrade: Upgrade) -> None:
    """Each reading command refuses the store in one line, migrating nothing (the store stays
    0.2.0's); ``db migrate`` then brings it to this release's schema, every journal and audit
    row as it was."""
    journal, audit = upgrade.rows("journal"), upgrade.rows("audit")
    run_id = upgrade.runs["approve"][0]
    for reader in (("runs", "list"), ("runs", "pending"), ("runs", "show", run_id), ("audit",)):
        message = one_line_error(upgrade.run(*reader))
        said = f"schema version {upgrade.made_at}, this Kestrel reads {upgrade.current};"
        assert said in message, (reader, message)
        assert message.endswith("run `kestrel db migrate` first"), (reader, message)
    assert upgrade.rows("schema_version")[-1][0] == upgrade.made_at
    done = upgrade.run("db", "migrate")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert upgrade.rows("schema_version")[-1][0] == upgrade.current
    assert upgrade.rows("journal") == journal and upgrade.rows("audit") == audit


def pending(upgrade: Upgrade) -> list[dict[str, Any]]:
    """The open requests, as ``runs pending --json`` lists them."""
    listed: list[dict[str, Any]] = json.loads(upgrade.run("runs", "pending", "--json").stdout)
    return listed
