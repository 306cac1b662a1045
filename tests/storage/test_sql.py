"""The shared statements: written once in PostgreSQL's notation, rendered for each dialect."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys

import pytest

from storage import sql
from storage.sql import POSTGRES, SQLITE
from storage.sqlite_schema import CREATE_VERSION_TABLE, SCHEMA_VERSION, migration_script

COLUMN_LISTS = {"RUN_COLUMNS", "TAKEN_WORK"}
# Every statement of ``storage.sql``, with filters where it takes them.
STATEMENTS = {
    **{
        name: value
        for name, value in vars(sql).items()
        if re.fullmatch(r"[A-Z][A-Z_]+", name)
        and name not in COLUMN_LISTS
        and isinstance(value, str)
    },
    "list_runs": sql.list_runs("WHERE session_id = $1", 2),
    "list_requests": sql.list_requests("WHERE run_id = $1 AND status = $2"),
    "list_audit": sql.list_audit("", 1),
}


def test_sqlite_takes_numbered_question_marks_and_no_casts() -> None:
    rendered = SQLITE.sql("SELECT body::text FROM t WHERE a = $1 AND b = $12 ORDER BY {insertion}")
    assert rendered == "SELECT body FROM t WHERE a = ?1 AND b = ?12 ORDER BY rowid"


def test_sqlite_drops_every_cast_as_the_notation_writes_them() -> None:
    for text in STATEMENTS.values():
        if "{json:" in text:
            continue
        expected = re.sub(r"::[a-z]+", "", text.replace("$", "?"))
        expected = expected.replace("{insertion}", "rowid").replace("{json_items}", "json_each")
        assert SQLITE.sql(text) == expected


# In a fresh process: whether rendering the statements a suspend runs compiles a regex.
_COMPILES = """
import re, sys
from storage import sql
from storage.sql import SQLITE
seen = []
compile_regex = re.compile
re.compile = lambda *args: seen.append(args) or compile_regex(*args)
for name in ("INSERT_ENTRY", "OPEN_REQUEST", "OWE_MESSAGE", "CREATE_RUN_ALONE", "AUDIT"):
    SQLITE.sql(getattr(sql, name))
print(len(seen))
"""


def test_a_fresh_process_renders_its_statements_without_compiling_a_regex() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _COMPILES], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "0"  # a compile costs more than every statement it renders


def test_postgres_keeps_the_notation_statements_are_written_in() -> None:
    statement = "SELECT body::text FROM t WHERE a = $1 ORDER BY {insertion}"
    assert POSTGRES.sql(statement) == "SELECT body::text FROM t WHERE a = $1 ORDER BY pos"


def test_a_json_path_renders_for_each_database() -> None:
    statement = "SELECT {json:body:turn.usage.input_tokens}::bigint FROM journal WHERE a = $1"
    assert SQLITE.sql(statement) == (
        "SELECT json_extract(body, '$.turn.usage.input_tokens') FROM journal WHERE a = ?1"
    )
    assert POSTGRES.sql(statement) == (
        "SELECT json_extract_path_text(body, 'turn', 'usage', 'input_tokens')::bigint"
        " FROM journal WHERE a = $1"
    )


def test_where_numbers_only_the_filters_given() -> None:
    assert sql.where(run_id=None, status="open") == ("WHERE status = $1", ("open",))
    assert sql.where(run_id=None) == ("", ())


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_every_shared_statement_prepares_in_sqlite(name: str) -> None:
    statement = STATEMENTS[name]
    if "FOR NO KEY UPDATE" in statement:
        pytest.skip("a row lock: SQLite's dialect never runs it (row_locks=False)")
    rendered = SQLITE.sql(statement)
    # A JSON path ('$.a.b') is SQLite's own; no PostgreSQL parameter or cast is left.
    assert not re.search(r"\$\d", rendered) and "::" not in rendered
    conn = sqlite3.connect(":memory:")
    scripts = [migration_script(version) for version in range(1, SCHEMA_VERSION + 1)]
    conn.executescript(CREATE_VERSION_TABLE + "".join(scripts))
    parameters = max(map(int, re.findall(r"\$(\d+)", statement)), default=0)
    # EXPLAIN prepares the statement without running it: a syntax or name error raises.
    conn.execute("EXPLAIN " + rendered, [None] * parameters)
