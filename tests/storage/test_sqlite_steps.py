"""run_step: each statement SQLite runs by a route of its own does what the shared one does."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from bot.domain import Decision, DecisionKind, RequestStatus, Session
from bot.kinds import AuditAction
from bot.records import RunRecord
from bot.store_values import Audited
from bot.wire import to_json
from storage import sql
from storage.sql import SQLITE
from storage.sqlite import SqliteStore
from storage.sqlite_steps import run_step
from tests.storage.test_store_contract import AT, LEASE, a_request

STAMP = AT.isoformat()
TABLES = ("requests", "audit", "outbox")


@pytest.fixture
async def database(tmp_path: Path) -> Path:
    """A chat run and a console run, each with an open request; the chat run's card is in the
    outbox, and the console run's second request has a card a renderer put there."""
    path = tmp_path / "kestrel.db"
    store = SqliteStore(path)
    await store.migrate()
    for session, platform in (("chat", "slack"), ("terminal", "console")):
        await store.ensure_session(Session(id=session, platform=platform))
        await store.create_run(RunRecord(id=f"run_{session}", session_id=session), "w1", LEASE)
    for request_id, run_id in (("chat", "run_chat"), ("terminal", "run_terminal")):
        await store.open_request(a_request(run_id, id=f"req_{request_id}"))
    await store.open_request(a_request("run_terminal", id="req_put", call_id="call_2"))
    await store.put_message("slack:card:req_chat", "slack", {}, {"owed": "card"})
    await store.put_message("console:card:req_put", "console", {}, {"text": "Restart?"})
    await store.decide(decision("req_chat"), RequestStatus.ANSWERED)
    await store.decide(
        decision("req_put"), RequestStatus.ANSWERED, Audited("bob", AuditAction.APPROVE, "d1")
    )
    await store.close()
    return path


def decision(request_id: str, by: str = "bob") -> Decision:
    """An approval of ``request_id`` by ``by``, at the same instant each time."""
    return Decision(request_id=request_id, kind=DecisionKind.APPROVE, by=by, at=AT)


@contextlib.contextmanager
def connected(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection inside a committed write transaction, as the store's writer runs steps."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield conn
        conn.execute("COMMIT")
    finally:
        conn.close()


def contents(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the tables these statements write."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return {table: conn.execute(f"SELECT * FROM {table}").fetchall() for table in TABLES}


def both_ways(
    database: Path, tmp_path: Path, statement: str, params: Sequence[Any]
) -> tuple[tuple[list[Any], dict[str, Any]], tuple[list[Any], dict[str, Any]]]:
    """What ``statement`` returns and leaves run as written, and by ``run_step``, each on its
    own copy of ``database``."""
    results = []
    for name in ("shared", "routed"):
        copy = tmp_path / f"{name}.db"
        shutil.copy(database, copy)
        with connected(copy) as conn:
            if name == "shared":
                rows = [tuple(row) for row in conn.execute(SQLITE.sql(statement), params)]
            else:
                rows = [tuple(row) for row in run_step(conn, statement, params)]
        results.append((rows, contents(copy)))
    return results[0], results[1]


OWED: dict[str, Any] = {"owed": "card"}


@pytest.mark.parametrize("run_id", ["run_chat", "run_terminal", "run_unknown"])
async def test_a_message_is_owed_only_to_a_chat_thread(
    database: Path, tmp_path: Path, run_id: str
) -> None:
    params = (run_id, "answer:x", to_json(OWED), STAMP)
    shared, routed = both_ways(database, tmp_path, sql.OWE_MESSAGE, params)
    assert routed == shared


@pytest.mark.parametrize(
    ("request_id", "decided_by"),
    [
        ("req_chat", "bob"),  # the card in the outbox, the decision the request holds
        ("req_chat", "eve"),  # a decision the request does not hold
        ("req_terminal", "bob"),  # no card in the outbox
        ("req_put", "bob"),  # a console card a renderer put there
        ("req_unknown", "bob"),
    ],
)
async def test_a_card_is_owed_again_only_where_the_outbox_holds_it(
    database: Path, tmp_path: Path, request_id: str, decided_by: str
) -> None:
    text = to_json(decision(request_id, decided_by))
    params = (request_id, text, to_json(OWED), f"card:{request_id}", STAMP)
    shared, routed = both_ways(database, tmp_path, sql.OWE_CARD_AGAIN, params)
    assert routed == shared


@pytest.mark.parametrize(
    ("request_id", "decided_by", "detail"),
    [
        ("req_chat", "bob", "d1"),  # the winner's, not audited yet
        ("req_put", "bob", "d1"),  # audited already, byte for byte
        ("req_put", "bob", "d2"),  # the same decision, another detail
        ("req_chat", "eve", "d1"),  # a loser's
        ("req_unknown", "bob", "d1"),
    ],
)
async def test_a_decision_is_audited_as_the_shared_statement_audits_it(
    database: Path, tmp_path: Path, request_id: str, decided_by: str, detail: str
) -> None:
    text = to_json(decision(request_id, decided_by))
    params = (STAMP, decided_by, "approve", detail, request_id, text)
    shared, routed = both_ways(database, tmp_path, sql.AUDIT_DECISION, params)
    assert routed == shared


@pytest.mark.parametrize("statement", [sql.DECIDE, sql.ANSWER])
@pytest.mark.parametrize("request_id", ["req_terminal", "req_chat", "req_unknown"])
async def test_a_decision_closes_an_open_request_once(
    database: Path, tmp_path: Path, statement: str, request_id: str
) -> None:
    params = ("answered", to_json(decision(request_id, "eve")), request_id)
    shared, routed = both_ways(database, tmp_path, statement, params)
    assert routed == shared
    assert bool(routed[0]) == (request_id == "req_terminal")
