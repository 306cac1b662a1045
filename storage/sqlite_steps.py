"""How the SQLite store runs a shared statement: a few by a route cheaper to prepare.

A fresh process prepares every statement it runs once, and a join or a RETURNING clause costs
SQLite several times what a lookup by key does (``bench.cold``: 0.2 M instructions each of a
6 M first suspend). Every step runs inside the writer's BEGIN IMMEDIATE, which no other
writer enters, so a read and then a write are as atomic as the one statement they stand for.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, Final

from storage import sql
from storage.sql import SQLITE
from storage.sql_store import Row

# What a thread whose platform is one of these is owed: nothing (``sql.OWE_MESSAGE``'s filter).
_NO_OUTBOX: Final = frozenset({"", "console"})
_PLATFORM_OF_RUN: Final = """
SELECT platform FROM sessions WHERE id = (SELECT session_id FROM runs WHERE id = ?1)
"""
# The outbox row ``sql.OWE_CARD_AGAIN`` would update: request ?1's card (key ?2, after the
# platform of its run's thread). Where there is none, the update changes nothing.
_CARD_IN_OUTBOX: Final = """
SELECT 1 FROM outbox WHERE key = (
    SELECT platform FROM sessions WHERE id = (
        SELECT session_id FROM runs WHERE id = (SELECT run_id FROM requests WHERE id = ?1)
    )
) || ':' || ?2
"""
# ``sql.AUDIT_DECISION``'s filter, read on its own: the run of request ?5 while it holds
# decision ?6 and no record of actor ?2, action ?3 and detail ?4 stands on it yet. The row is
# then written by ``sql.AUDIT``, which a resume prepares anyway (its own record).
_DECISION_UNAUDITED: Final = """
SELECT run_id FROM requests
WHERE id = ?5 AND decision = ?6
  AND NOT EXISTS (SELECT 1 FROM audit AS a
                  WHERE a.run_id = requests.run_id AND a.request_id = requests.id
                    AND a.actor = ?2 AND a.action = ?3 AND a.detail = ?4)
"""


def _without_returning(statement: str) -> str:
    """``statement`` less its closing ``RETURNING true``: its rowcount says the same."""
    kept, returning, rest = statement.rpartition("RETURNING true")
    if not returning or rest.strip():
        raise ValueError(f"no closing RETURNING true in {statement!r}")
    return SQLITE.sql(kept)


def _owes_message(conn: sqlite3.Connection, params: Sequence[Any]) -> bool:
    """Whether ``sql.OWE_MESSAGE`` for run ``params[0]`` would insert: its thread has a
    platform that keeps an outbox (a run of no known run or session inserts nothing)."""
    found = conn.execute(_PLATFORM_OF_RUN, (params[0],)).fetchone()
    return found is not None and found[0] not in _NO_OUTBOX


def _card_owed_again(conn: sqlite3.Connection, params: Sequence[Any]) -> bool:
    """Whether ``sql.OWE_CARD_AGAIN`` (request ``params[0]``, key ``params[3]``) may update: the
    card it names is in the outbox."""
    return conn.execute(_CARD_IN_OUTBOX, (params[0], params[3])).fetchone() is not None


def _audit_decision(conn: sqlite3.Connection, params: Sequence[Any]) -> list[Row]:
    """``sql.AUDIT_DECISION`` as a read and a plain insert."""
    found = conn.execute(_DECISION_UNAUDITED, params).fetchone()
    if found is not None:
        at, actor, action, detail, request_id, _decision = params
        conn.execute(SQLITE.sql(sql.AUDIT), (at, actor, action, found[0], request_id, detail))
    return []


# Statements run by a route of their own.
_ROUTED: Final[dict[str, Callable[[sqlite3.Connection, Sequence[Any]], list[Row]]]] = {
    sql.AUDIT_DECISION: _audit_decision,
}
# Statements that change nothing unless a cheap read says they may: skipped otherwise.
_GUARDED: Final[dict[str, Callable[[sqlite3.Connection, Sequence[Any]], bool]]] = {
    sql.OWE_MESSAGE: _owes_message,
    sql.OWE_CARD_AGAIN: _card_owed_again,
}
# Statements whose ``RETURNING true`` row is read from the rowcount instead.
_COUNTED: Final = {
    statement: _without_returning(statement) for statement in (sql.DECIDE, sql.ANSWER)
}


def run_step(conn: sqlite3.Connection, statement: str, params: Sequence[Any]) -> list[Row]:
    """The rows ``statement`` (in ``storage.sql``'s notation) returns run with ``params``."""
    routed = _ROUTED.get(statement)
    if routed is not None:
        return routed(conn, params)
    guard = _GUARDED.get(statement)
    if guard is not None and not guard(conn, params):
        return []
    counted = _COUNTED.get(statement)
    if counted is not None:
        return [(1,)] if conn.execute(counted, params).rowcount > 0 else []
    return conn.execute(SQLITE.sql(statement), params).fetchall()
