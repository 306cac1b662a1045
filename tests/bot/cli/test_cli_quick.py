"""The fast way of ``runs list`` and ``runs pending``: what it reads, when it steps aside, and
that it shows exactly what the full way (validated settings, the async store) shows."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from bot import wire
from bot.cli import quick
from bot.config.settings import load_settings
from bot.domain import Request, RequestKind, RunStatus, Session, new_id, utcnow
from bot.journal.entries import Entry, RunStarted, RunSuspended, ToolDeferred
from bot.kinds import StopReason
from bot.nesting import MAX_DEPTH
from bot.people.policy import PolicyRules
from bot.records import RunRecord
from storage.sql import RUN_COLUMNS
from storage.sqlite import open_sqlite
from storage.sqlite_rows import RunRow
from tests.bot.cli.test_cli import kestrel, one_line_error, write_config
from tests.bot.test_nesting import nested
from tests.storage.test_store_contract import FINGERPRINT, a_request

# A variable that sets a setting: it sends a read-only command the full way.
FULL_WAY = {"KESTREL_MODEL__NAME": "full-way"}
POLICY = {
    "approvers": {"restart_service": ["U0LEAD", "group:S0SRE"], "*": ["U0ANY"]},
    "answerers": ["U0ANSWER"],
    "oncall": ["U0ONCALL"],
}


def requests_of_every_kind(run_id: str) -> list[Request]:
    """An approval with a deadline, a question with options, and an uncertain effect."""
    created = utcnow() - timedelta(hours=3)
    return [
        a_request(run_id, created_at=created, deadline=created + timedelta(hours=5)),
        a_request(
            run_id,
            kind=RequestKind.WAIT_USER,
            call_id="call_2",
            tool="ask_human_confirm",
            arguments={"question": "go on?"},
            options=("yes", "no"),
            created_at=created,
        ),
        a_request(run_id, kind=RequestKind.WAIT_EFFECT, call_id="call_3", created_at=created),
    ]


async def suspend_on(folder: Path, requests: list[Request]) -> None:
    store = await open_sqlite(folder / "kestrel.db")
    try:
        run_id = requests[0].run_id
        entries: list[Entry] = [
            RunStarted(run_id=run_id, session_id=f"sess_{run_id}", fingerprint=FINGERPRINT),
            *(ToolDeferred(call_id=r.call_id, tool=r.tool, request=r) for r in requests),
            RunSuspended(reason=StopReason.WAITING, request_ids=tuple(r.id for r in requests)),
        ]
        run = RunRecord(
            id=run_id, session_id=f"sess_{run_id}", prompt="restart web", requested_by="ann"
        )
        session = Session(id=run.session_id, platform="slack", channel="C1", thread=run_id)
        await store.create_run(run, "w1", 30, session=session, entries=entries)
    finally:
        await store.close()


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    """A folder whose journal holds two runs waiting on requests of every kind."""
    write_config(tmp_path, policy=POLICY)
    for _ in range(2):
        asyncio.run(suspend_on(tmp_path, requests_of_every_kind(new_id("run"))))
    return tmp_path


def modules_imported(folder: Path, *args: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules a command had imported when it exited."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('MODULES', *sorted(sys.modules), file=sys.stderr))\n"
        "from bot.cli.main import main\n"
        "main()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=folder,
        capture_output=True,
        text=True,
        env=_clean(env),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    (line,) = [line for line in out.stderr.splitlines() if line.startswith("MODULES")]
    return set(line.split()[1:])


def _clean(env: dict[str, str] | None) -> dict[str, str]:
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "KESTREL_"))}
    return clean | (env or {})


def without_ages(text: str) -> str:
    """``runs pending``'s text with the ages and times left (two processes see two clocks)."""
    return re.sub(r"(open|expires in) \d+[hms]\d*m?", r"\1 …", text)


@pytest.mark.parametrize(
    "args", [("runs", "list"), ("runs", "pending"), ("runs", "pending", "--json")]
)
def test_the_fast_way_shows_what_the_full_way_shows(journal: Path, args: tuple[str, ...]) -> None:
    fast = kestrel(journal, *args)
    full = kestrel(journal, *args, env=FULL_WAY)
    assert fast.returncode == full.returncode == 0, (fast.stderr, full.stderr)
    assert fast.stdout.count("run_") >= 2  # both runs, or each of their requests
    assert without_ages(fast.stdout) == without_ages(full.stdout)


def test_pending_names_who_may_answer_each_kind(journal: Path) -> None:
    lines = kestrel(journal, "runs", "pending").stdout.splitlines()
    assert len(lines) == 6
    approval, question, effect = lines[:3]
    assert "may answer: U0LEAD, group:S0SRE, U0ANY)" in approval and "expires in" in approval
    assert "may answer: ann, U0ONCALL, U0ANSWER)" in question
    assert "may answer: U0ONCALL)" in effect


@pytest.mark.parametrize("args", [("runs", "list"), ("runs", "pending")])
def test_the_fast_way_imports_neither_pydantic_nor_asyncio(
    journal: Path, args: tuple[str, ...]
) -> None:
    fast = modules_imported(journal, *args)
    assert "bot.cli.quick" in fast
    assert not {"pydantic", "asyncio", "aiosqlite", "bot.domain", "bot.config.settings"} & fast
    assert "bot.config.settings" in modules_imported(journal, *args, env=FULL_WAY)


def test_approvers_by_tag_send_pending_the_full_way(tmp_path: Path) -> None:
    write_config(tmp_path, policy={"approvers": {"tag:prod": ["U0LEAD"]}})
    asyncio.run(suspend_on(tmp_path, requests_of_every_kind(new_id("run"))))
    assert "may answer: U0LEAD" in kestrel(tmp_path, "runs", "pending").stdout
    assert "bot.config.settings" in modules_imported(tmp_path, "runs", "pending")


def test_pending_leaves_out_requests_a_cut_short_cancel_left_open(journal: Path) -> None:
    import sqlite3

    # A cancel ends its run, then closes its requests: killed between the two, they stay open.
    with sqlite3.connect(journal / "kestrel.db") as conn:
        (ended,) = conn.execute("SELECT id FROM runs ORDER BY created_at LIMIT 1").fetchone()
        conn.execute("UPDATE runs SET status = 'cancelled' WHERE id = ?", (ended,))
    conn.close()

    fast = kestrel(journal, "runs", "pending")
    full = kestrel(journal, "runs", "pending", env=FULL_WAY)

    for shown in (fast.stdout, full.stdout):
        assert ended not in shown and shown.count("run_") == 3, shown


def test_a_policy_the_full_way_refuses_is_refused_by_name(journal: Path) -> None:
    write_config(journal, policy={"oncall": "U0ONCALL", "approver": {}})
    message = one_line_error(kestrel(journal, "runs", "pending"))
    assert "policy.oncall: expected a list, got a string" in message
    assert "policy.approver: unknown key" in message


def test_an_unreadable_request_body_is_named_not_shown(journal: Path) -> None:
    import sqlite3

    with sqlite3.connect(journal / "kestrel.db") as conn:
        conn.execute("UPDATE requests SET body = '{\"id\": 1}' WHERE kind = 'wait_user'")
    conn.close()
    message = one_line_error(kestrel(journal, "runs", "pending"))
    assert "unreadable" in message and "req_" in message


# -- the settings it reads -----------------------------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder and an environment without settings."""
    monkeypatch.chdir(tmp_path)
    for name in list(__import__("os").environ):
        if name.upper().startswith(("KESTREL_", "OPENAI_")):
            monkeypatch.delenv(name)
    return tmp_path


def test_without_configuration_the_journal_is_here_and_the_policy_the_default(
    folder: Path,
) -> None:
    assert quick.read_settings(None) == quick.ReadSettings(folder / "kestrel.db", PolicyRules())


@pytest.mark.parametrize(
    "database", ["journal.db", "sqlite:///journal.db", "sub/../journal.db", "~/journal.db"]
)
def test_the_journal_is_where_the_validated_settings_put_it(folder: Path, database: str) -> None:
    (folder / "conf").mkdir()
    config = write_config(folder / "conf", database=database, policy=POLICY)
    read = quick.read_settings(str(config))
    settings = load_settings(str(config))
    assert read is not None
    assert read.journal == settings.resolve(settings.database.removeprefix("sqlite:///"))
    assert read.policy == settings.policy == PolicyRules(**POLICY)  # type: ignore[arg-type]


def test_the_database_variable_lies_over_dotenv_over_the_file(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(folder, database="file.db")
    (folder / ".env").write_text("KESTREL_DATABASE_URL=dotenv.db\n")
    assert quick.read_settings(None) == quick.ReadSettings(folder / "dotenv.db", PolicyRules())
    monkeypatch.setenv("KESTREL_DATABASE_URL", "/abs/env.db")
    assert quick.read_settings(None) == quick.ReadSettings(Path("/abs/env.db"), PolicyRules())


@pytest.mark.parametrize(
    "settings",
    [
        {"database": "postgresql://db/kestrel"},
        {"database": 5},
        {"policy": {"oncall": "U1"}},
        {"policy": {"oncall": [1]}},
        {"policy": {"self_approval": "yes"}},
        {"policy": {"approvers": {"*": "U1"}}},
        {"policy": {"approver": {}}},
        {"policy": ["U1"]},
    ],
)
def test_what_validation_would_change_or_refuse_goes_the_full_way(
    folder: Path, settings: dict[str, object]
) -> None:
    write_config(folder, **settings)
    assert quick.read_settings(None) is None


@pytest.mark.parametrize("where", ["environment", ".env"])
def test_a_setting_variable_goes_the_full_way(
    folder: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    if where == ".env":
        (folder / ".env").write_text('KESTREL_POLICY__ONCALL=["U1"]\n')
    else:
        monkeypatch.setenv("KESTREL_POLICY__ONCALL", '["U1"]')
    assert quick.read_settings(None) is None
    monkeypatch.delenv("KESTREL_POLICY__ONCALL", raising=False)
    (folder / ".env").unlink(missing_ok=True)
    monkeypatch.setenv("KESTREL_CONFIG", "")  # not a setting: the program reads it itself
    assert quick.read_settings(None) is not None


# -- the rows it reads ---------------------------------------------------------------------------


def test_a_run_row_has_the_columns_the_store_selects() -> None:
    assert RunRow.__struct_fields__ == tuple(c.strip() for c in RUN_COLUMNS.split(","))


@pytest.mark.parametrize("request_", requests_of_every_kind("run_1"), ids=lambda r: r.kind.value)
def test_a_stored_request_reads_as_the_request_it_was(request_: Request) -> None:
    stored = quick.StoredRequest.from_json(wire.to_json(request_))
    assert stored is not None
    for field in stored.__dataclass_fields__:
        assert getattr(stored, field) == getattr(request_, field), field


@pytest.mark.parametrize("body", ["", "[]", '{"id": "r"}', '{"kind": "nope"}'])
def test_a_body_that_is_no_request_reads_as_none(body: str) -> None:
    assert quick.StoredRequest.from_json(body) is None


def test_a_run_listed_the_fast_way_is_the_stored_run(journal: Path) -> None:
    settings = quick.read_settings(str(journal / "kestrel.yaml"))
    assert settings is not None
    rows = quick.newest_runs(settings, 5)
    assert rows is not None and len(rows) == 2
    assert {row.status for row in rows} == {RunStatus.SUSPENDED.value}


# -- what is not as the store writes it goes the full way, which names it -------------------------


def a_body(**changes: object) -> str:
    """A stored request's body with ``changes`` (None: the key removed)."""
    import json

    body = json.loads(wire.to_json(a_request("run_1")))
    for key, value in changes.items():
        if value is None:
            body.pop(key)
        else:
            body[key] = value
    return json.dumps(body)


@pytest.mark.parametrize(
    "body",
    [
        a_body(call_id=None),
        a_body(extra=1),
        a_body(id=12),
        a_body(prompt=[]),
        a_body(options="ab"),
        a_body(options=["a", 1]),
        a_body(arguments=[["a", 1]]),
        a_body(approvals_needed="2"),
        a_body(approvals_needed=True),
        a_body(kind="wait_nothing"),
        a_body(created_at="20261201T222200Z"),
        a_body(created_at="2026-12-01"),
        a_body(deadline="2026-12-01T22:22:00.5+00"),
        a_body(deadline="2026-12-01T22:22:00-00:00:30"),
        a_body(arguments={"s": "\ud800"}),
        a_body(deadline="2026-12-01T23:33:15+00:60"),
        a_body(arguments={"deep": nested(MAX_DEPTH)}),
        a_body(arguments={"n": 0.5}).replace("0.5", "1" + "0" * 4300 + ".5"),
        a_body(digest="d").replace('"digest": "d"', '"digest": "\\udfff", "digest": "d"'),
        '{"id": 1}',
        "[]",
        "",
    ],
)
def test_a_body_not_as_the_store_writes_it_reads_as_none(body: str) -> None:
    assert quick.StoredRequest.from_json(body) is None


def test_the_fast_way_reads_every_field_of_a_request() -> None:
    assert tuple(quick._REQUEST_FIELDS) == Request.__struct_fields__


def test_the_fast_way_knows_every_setting() -> None:
    from bot.config.settings import Settings
    from bot.config.sources import DERIVED_SETTINGS

    assert set(Settings.__struct_fields__) - DERIVED_SETTINGS == quick.SETTINGS


def test_a_key_no_setting_has_is_named_by_runs_list(journal: Path) -> None:
    (journal / "kestrel.yaml").write_text("databse: other.db\n")
    assert "databse: unknown key" in one_line_error(kestrel(journal, "runs", "list"))


def test_a_journal_written_as_a_variable_is_refused_by_runs_list(journal: Path) -> None:
    (journal / "kestrel.yaml").write_text("database: ${DATABASE_URL}\n")
    said = one_line_error(kestrel(journal, "runs", "list"))
    assert "database: '${DATABASE_URL}' is a variable" in said, said
    assert not (journal / "${DATABASE_URL}").exists()


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("status", "'zombie'"),
        ("created_at", "'yesterday'"),
        ("epoch", "'abc'"),
        ("prompt", "x'00ff'"),
        ("lease_expires", "''"),
    ],
)
def test_a_run_row_not_as_the_store_writes_it_is_named(
    journal: Path, column: str, value: str
) -> None:
    import sqlite3

    with sqlite3.connect(journal / "kestrel.db") as conn:
        conn.execute(f"UPDATE runs SET {column} = {value}")
    conn.close()
    message = one_line_error(kestrel(journal, "runs", "list"))
    assert "unreadable" in message and "run_" in message


def test_an_answered_request_row_still_marked_open_is_named(journal: Path) -> None:
    import sqlite3

    with sqlite3.connect(journal / "kestrel.db") as conn:
        conn.execute("UPDATE requests SET decision = 'garbage' WHERE kind = 'wait_effect'")
    conn.close()
    assert "unreadable" in one_line_error(kestrel(journal, "runs", "pending"))


def test_of_two_spellings_of_the_database_variable_both_ways_take_the_same(journal: Path) -> None:
    (journal / ".env").write_text(
        "kestrel_database_url=empty.db\nKESTREL_DATABASE_URL=kestrel.db\n"
    )
    fast = kestrel(journal, "runs", "list")
    assert (
        fast.returncode == 0
        and fast.stdout == kestrel(journal, "runs", "list", env=FULL_WAY).stdout
    )
    assert fast.stdout == "no runs\n"  # the lowercase spelling sorts last: empty.db, not made yet


@pytest.mark.parametrize("name", ["kestrel.yaml", ".env"])
def test_a_settings_file_that_is_not_utf8_is_one_line(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"database: caf\xe9.db\n")
    assert "not UTF-8" in one_line_error(kestrel(tmp_path, "runs", "list"))


def test_a_schema_version_that_is_no_number_is_one_line(tmp_path: Path) -> None:
    import sqlite3

    with sqlite3.connect(tmp_path / "kestrel.db") as conn:
        conn.execute("CREATE TABLE schema_version (version, applied_at TEXT)")
        conn.execute("INSERT INTO schema_version VALUES ('abc', 'then')")
    conn.close()
    assert "not a version" in one_line_error(kestrel(tmp_path, "runs", "list"))


@pytest.mark.parametrize("command", [("runs", "list"), ("audit",)])
@pytest.mark.parametrize("limit", ["0", "-1"])
def test_a_limit_below_one_is_a_usage_error_naming_the_range(
    tmp_path: Path, command: tuple[str, ...], limit: str
) -> None:
    result = kestrel(tmp_path, *command, "--limit", limit)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    said = f"Error: Invalid value for '--limit': {limit} is not in the range x>=1."
    assert result.stderr.splitlines()[-1] == said


@pytest.mark.parametrize("command", [("runs", "list"), ("audit",)])
def test_the_help_of_limit_says_what_it_is_in_plain_numbers(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    # It showed ``1<=x<=9223372036854775807``: a database's integer, not a count anyone means.
    shown = kestrel(tmp_path, *command, "--help").stdout
    (line,) = [line for line in shown.splitlines() if "--limit" in line]
    assert "At most N rows, the newest." in line and "x>=1" in line
    assert str(2**63 - 1) not in shown


def test_a_limit_past_any_count_lists_every_row(tmp_path: Path) -> None:
    # Refused before as past a database integer; a limit larger than there are rows is all.
    for _ in range(2):
        assert kestrel(tmp_path, "run", "checkout is failing", "--defer").returncode == 3
    huge = "9" * 30
    listed = kestrel(tmp_path, "runs", "list", "--limit", huge)
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == 1 + 2  # the heading and both runs
    audited = kestrel(tmp_path, "audit", "--limit", huge)
    assert audited.returncode == 0, audited.stderr
    assert audited.stdout.count("wait_approval restart_service") == 2


def test_the_fast_way_reads_every_field_of_a_plan_step() -> None:
    from bot.domain import PlanStep

    assert tuple(quick._STEP_FIELDS) == PlanStep.__struct_fields__
