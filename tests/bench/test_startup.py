"""The command line imports what a command needs when it runs (bench/startup.py times it)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bench.commits import Tally, clean_environment, store_call, workspace

# What the read-only commands must not import: the model client, the PII engine, MCP, PostgreSQL.
NEVER_READING: tuple[str, ...] = (
    "openai",
    "aiohttp",
    "presidio_anonymizer",
    "mcp",
    "asyncpg",
    "bot.llm.openai_provider",
    "bot.pii.hooks",
    "pydantic_settings",
)
# Nor the code that drives runs.
DRIVING: tuple[str, ...] = (
    "bot.run.supervisor",
    "bot.run.loop",
    "bot.run.execute",
    "bot.run.runtime",
)
MODULES_AFTER = """
import json, sys
sys.argv = ["kestrel", *sys.argv[1:]]
from bot.cli.main import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def imported_by(folder: Path, *args: str) -> set[str]:
    """The modules a kestrel command has imported by its end (its output's last line)."""
    out = subprocess.run(
        [sys.executable, "-c", MODULES_AFTER, *args],
        cwd=folder,
        env=clean_environment(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def top_level(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules} | modules


def test_help_imports_click_and_no_part_of_the_bot(tmp_path: Path) -> None:
    modules = imported_by(tmp_path, "--help")
    assert "click" in modules
    assert {m for m in modules if m.startswith(("bot.", "storage"))} <= {
        "bot.cli",
        "bot.cli.main",
        "bot.cli.commands",
        "bot.cli.common",
        "bot.cli.decisions",  # the script's own reading of runs approve and deny
        "bot.cli.driving",
        "bot.cli.placing",  # the groups' hint for an option given before its command
        "bot.collector",
        *(f"bot.cli.{name}_cmd" for name in ("audit", "chat", "run", "runs", "store", "tools")),
        "bot.cli.render",
        "bot.text",
        "bot.patterns",  # what bot.text compiles on first use, by bot.patterns.on_use
    }
    assert not {"asyncio", "pydantic", "yaml"} & modules


@pytest.mark.parametrize("command", [("runs", "list"), ("runs", "pending")])
def test_read_only_commands_import_no_model_client_or_pii_engine(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    workspace(tmp_path)
    modules = top_level(imported_by(tmp_path, *command))
    assert {"storage.sqlite", "storage.sqlite_rows"} & modules  # the command read the store
    assert not set(NEVER_READING) & modules


def test_list_runs_reads_the_store_without_the_tool_catalog(tmp_path: Path) -> None:
    workspace(tmp_path)
    modules = top_level(imported_by(tmp_path, "runs", "list"))
    assert not {"jsonschema", "re2", "bot.tools.catalog", *DRIVING} & modules


def test_pending_requests_do_not_load_the_code_that_drives_runs(tmp_path: Path) -> None:
    workspace(tmp_path)
    assert not set(DRIVING) & imported_by(tmp_path, "runs", "pending")


def test_pending_requests_read_the_catalog_flags_without_compiling_schemas(
    tmp_path: Path,
) -> None:
    config = workspace(tmp_path)
    # Approvers by tag: only the catalogs know which tools bear it (the fast way steps aside).
    tagged = config.read_text().replace('"*": [alice]', '"tag:ops": [alice]')
    assert tagged != config.read_text()
    config.write_text(tagged)
    modules = top_level(imported_by(tmp_path, "runs", "pending"))
    assert "bot.tools.catalog" in modules  # the flags were read
    assert not {"jsonschema", "re2", "bot.tools.toolset"} & modules


@pytest.mark.parametrize(
    ("sql", "call"),
    [
        (
            "INSERT INTO journal(run_id, seq, epoch, kind, body, at)\n"
            "SELECT 'run_1', 3, 1, 'tool_deferred', '{}', 't'\nWHERE 1",
            "append tool_deferred (seq 3)",
        ),
        (
            "INSERT INTO journal(run_id, seq, epoch, kind, body, at)"
            " VALUES ('run_1', 4, 1, 'tool_process', '{}', 't')",
            "append tool_process (seq 4)",
        ),
        (
            "INSERT INTO audit(at, actor, action, run_id, request_id, detail)"
            " VALUES ('t', 'alice', 'approve', 'run_1', 'req_1', '')",
            "audit approve by alice",
        ),
        ("UPDATE runs SET owner = 'me', epoch = epoch + 1, lease_expires = 'x'", "claim"),
        ("UPDATE runs SET owner = '', lease_expires = NULL, updated_at = 'x'", "release"),
        ("UPDATE runs SET status = 'suspended'", None),
        ("SAVEPOINT write", None),
        ("SELECT 1", None),
    ],
)
def test_commit_counting_names_the_store_call(sql: str, call: str | None) -> None:
    assert store_call(sql) == call


def test_an_appends_fence_read_is_part_of_its_append() -> None:
    tally = Tally()
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.executescript(
        "CREATE TABLE runs (id, epoch); CREATE TABLE journal (run_id, seq, epoch, kind, body, at);"
    )
    conn.set_trace_callback(lambda sql: tally.statement(conn, sql))
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "SELECT (SELECT COALESCE(MAX(seq), -1) + 1 FROM journal WHERE run_id = 'r'), epoch"
        " FROM runs WHERE id = 'r'"
    )
    conn.execute("INSERT INTO journal VALUES ('r', 8, 1, 'tool_process', '{}', 't')")
    conn.execute("COMMIT")
    conn.close()
    # Named by its append alone, as a process stamp's commit is told apart by.
    assert tally.report()["commits"] == [["append tool_process (seq 8)"]]
