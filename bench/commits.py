"""Durable commits (and reads) of a run that waits for an approval, on SQLite.

Two scenarios, each the real ``kestrel`` command in a fresh process on an existing database
(migrated beforehand, so schema creation is not counted):

* suspend: ``kestrel run --defer``: start, one model turn with one gated call, the approval
  request, suspended (exit status 3);
* resume: ``kestrel runs approve``: the decision, then the run resumed from its journal until it
  completes (the approved call, one more model turn).

The process counting installs a ``sqlite3.Connection`` subclass for every connection it makes
(the store's writer and aiosqlite's reader alike) whose trace callback sees every statement. A
transaction (``BEGIN`` ... ``COMMIT``, or a write statement on its own) is a durable commit when
it changed rows; each is listed with the store calls its statements belong to. Targets (issue
10): at most 3 commits to suspend, at most 4 to approve and resume.

A command still running one event-loop pass after it started has its process stamp journaled
then (``tool_process``: where a successor finds the orphan if this process dies mid-effect).
That commit belongs to running a consequential command safely, not to suspending or resuming,
and whether a command as short as ``echo`` outlives one pass is chance: it is listed apart.

    python -m bench.commits [--json]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
TARGETS: Final = {"suspend": 3, "resume": 4}
EXIT_SUSPENDED: Final = 3

CONFIG: Final = """\
database: kestrel.db
model:
  provider: scripted
  script: script.yaml
tools: [tools.yaml]
human_in_the_loop: false
policy:
  approvers: {"*": [alice]}
"""
SCRIPT: Final = """\
- text: "Restarting checkout."
  calls:
    - name: restart_service
      arguments: {service: checkout}
- text: "Checkout restarted."
"""
CATALOG: Final = """\
tools:
  - name: restart_service
    description: Restart a service
    command: ["/bin/echo", "restarted", "{service}"]
    parameters:
      type: object
      properties:
        service: {type: string, pattern: "^[a-z0-9][a-z0-9-]*$"}
      required: [service]
      additionalProperties: false
    confirm: true
    timeout: 10
"""


def workspace(folder: Path) -> Path:
    """Write a configuration (scripted model, one gated tool) into ``folder``; its path."""
    (folder / "script.yaml").write_text(SCRIPT)
    (folder / "tools.yaml").write_text(CATALOG)
    config = folder / "kestrel.yaml"
    config.write_text(CONFIG)
    return config


def clean_environment() -> dict[str, str]:
    """This environment without model endpoints or Kestrel overrides, with ``bench`` importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "KESTREL_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def kestrel_command() -> list[str]:
    """How to start ``kestrel``: the console script beside this interpreter, when installed."""
    script = Path(sys.executable).parent / "kestrel"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from bot.cli.main import main; main()"]


# -- counting (in the process under measurement) ------------------------------------------------

_WRITES: Final = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER")
# An append's values (run, seq, epoch, kind), in a plain insert or one guarded by a SELECT.
_JOURNAL_VALUES: Final = re.compile(
    r"(?:SELECT\s+|VALUES\s*\()'[^']*',\s*(\d+),\s*\d+,\s*'([^']*)'"
)
_AUDIT_VALUES: Final = re.compile(r"VALUES\s*\('[^']*',\s*'([^']*)',\s*'([^']*)'")
_FROM: Final = re.compile(r"\bFROM\s+(\w+)", re.IGNORECASE)
# The store call a write statement belongs to. The trace shows statements with their values
# bound (``?1`` replaced), so the patterns match the words around them.
_STORE_CALLS: Final = (
    (re.compile(r"^INSERT INTO sessions\b"), "ensure_session"),
    (re.compile(r"^INSERT INTO runs\b"), "create_run"),
    (re.compile(r"^UPDATE runs SET .*\bepoch = epoch \+ 1"), "claim"),
    (re.compile(r"^UPDATE runs SET lease_expires\b"), "renew"),
    (re.compile(r"^UPDATE runs SET owner = '', lease_expires = NULL"), "release"),
    (re.compile(r"^INSERT INTO requests\b"), "open_request"),
    (re.compile(r"^UPDATE requests SET status\b"), "decide"),
    (re.compile(r"^INSERT INTO approvals\b"), "add_approval"),
    (re.compile(r"^INSERT INTO once_keys\b"), "mark_once"),
    (re.compile(r"^INSERT INTO work\b"), "enqueue_work"),
    (re.compile(r"^UPDATE work SET taken_by\b"), "take_work"),
    (re.compile(r"^UPDATE work SET done_at\b"), "finish_work"),
    (re.compile(r"^INSERT INTO replicas\b"), "heartbeat"),
    (re.compile(r"^CREATE TABLE IF NOT EXISTS schema_version\b"), "migrate (version table)"),
)
# An append's read of its fence (the journal's next seq, the run's epoch), part of the append.
_APPEND_FENCE: Final = re.compile(
    r"^\s*SELECT \(SELECT COALESCE\(MAX\(seq\), -1\) \+ 1 FROM journal"
)
# Part of an append (the run's status follows its journal) or of the transaction's machinery.
_NOT_A_CALL: Final = re.compile(
    r"^(UPDATE runs SET status\b|SAVEPOINT|RELEASE|ROLLBACK|PRAGMA|BEGIN|COMMIT|END\b)",
    re.IGNORECASE,
)


def store_call(sql: str) -> str | None:
    """The store call a statement of a write transaction stands for; None for a read or for
    bookkeeping (savepoints, the status an append moves)."""
    text = " ".join(sql.split())
    if _NOT_A_CALL.match(text) or text.upper().startswith(("SELECT", "WITH")):
        return None
    if text.startswith("INSERT INTO journal"):
        found = _JOURNAL_VALUES.search(text)
        return f"append {found.group(2)} (seq {found.group(1)})" if found else "append"
    if text.startswith("INSERT INTO audit"):
        found = _AUDIT_VALUES.search(text)
        return f"audit {found.group(2)} by {found.group(1)}" if found else "audit"
    for pattern, name in _STORE_CALLS:
        if pattern.match(text):
            return name
    return text[:60]


def read_target(sql: str) -> str:
    """What a read statement reads: its first table (``schema`` for the version checks)."""
    found = _FROM.search(sql)
    table = found.group(1) if found else sql.split()[0].lower()
    return "schema" if table in ("sqlite_master", "schema_version") else table


@dataclass
class Transaction:
    """One transaction on the writer: its statements' store calls and the rows it changed."""

    calls: list[str] = field(default_factory=list)
    changes_at_begin: int = 0
    changes: int = 0


@dataclass
class Tally:
    """Every transaction and read query of one process."""

    transactions: list[Transaction] = field(default_factory=list)
    reads: Counter[str] = field(default_factory=Counter)
    open: dict[int, Transaction] = field(default_factory=dict)
    # A write statement outside BEGIN ... COMMIT commits on its own once it has run: what it
    # changed is known at the connection's next statement (or at the end).
    autocommits: dict[int, tuple[sqlite3.Connection, Transaction]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def statement(self, conn: sqlite3.Connection, sql: str) -> None:
        """Called before each statement runs (the trace callback)."""
        words = sql.split(None, 1)
        head = words[0].upper().rstrip(";") if words else ""
        with self.lock:
            self._settle(id(conn))
            current = self.open.get(id(conn))
            if head == "BEGIN":
                self.open[id(conn)] = Transaction(changes_at_begin=conn.total_changes)
            elif head in ("COMMIT", "END") and current is not None:
                # Traced before it runs: every change of the transaction is counted by now.
                current.changes = conn.total_changes - current.changes_at_begin
                self.transactions.append(self.open.pop(id(conn)))
            elif head == "ROLLBACK" and not sql.upper().startswith("ROLLBACK TO"):
                self.open.pop(id(conn), None)
            elif current is not None:
                call = store_call(sql)
                if call is not None and call not in current.calls:
                    current.calls.append(call)
                elif call is None and head in ("SELECT", "WITH"):
                    self.reads["(in a write transaction) " + read_target(sql)] += 1
                    if not current.calls and not _APPEND_FENCE.match(sql):
                        current.calls.append("read " + read_target(sql))
            elif head in _WRITES:
                alone = Transaction([store_call(sql) or sql[:60]], conn.total_changes)
                self.autocommits[id(conn)] = (conn, alone)
            elif head in ("SELECT", "WITH"):
                self.reads[read_target(sql)] += 1

    def _settle(self, key: int) -> None:
        if key in self.autocommits:
            conn, alone = self.autocommits.pop(key)
            alone.changes = conn.total_changes - alone.changes_at_begin
            self.transactions.append(alone)

    def report(self) -> dict[str, Any]:
        """The counts as JSON: durable commits with their store calls, empty ones, reads."""
        with self.lock:
            for key in list(self.autocommits):
                self._settle(key)
        durable = [t.calls for t in self.transactions if t.changes > 0]
        empty = [t.calls for t in self.transactions if t.changes == 0]
        return {"commits": durable, "empty_transactions": empty, "reads": dict(self.reads)}


TALLY = Tally()


class CountingConnection(sqlite3.Connection):
    """A connection that reports each statement it runs to ``TALLY``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.set_trace_callback(lambda sql: TALLY.statement(self, sql))


def install_counting() -> None:
    """Make every ``sqlite3.connect`` of this process (aiosqlite's too) a counting one."""
    connect = sqlite3.connect

    def counting_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.setdefault("factory", CountingConnection)
        conn: sqlite3.Connection = connect(*args, **kwargs)
        return conn

    sqlite3.connect = counting_connect  # type: ignore[assignment]


def counted_kestrel(report: Path, args: list[str]) -> int:
    """Run ``kestrel ARGS`` in this process with counting on; the counts go to ``report`` at
    the process's exit, which ``runs approve`` takes at once (``exit_at_once``), never
    returning here."""
    install_counting()
    atexit.register(lambda: report.write_text(json.dumps(TALLY.report())))
    from bot.cli.main import main

    sys.argv = ["kestrel", *args]
    try:
        main()
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    return 0


# -- the scenarios (in the parent process) -----------------------------------------------------


def counted(folder: Path, report: Path, *args: str, expect: int = 0) -> tuple[dict[str, Any], str]:
    """Run one counted ``kestrel`` command in a fresh process; its counts and stdout."""
    command = [sys.executable, "-m", "bench.commits", "--count-into", str(report), "--", *args]
    out = subprocess.run(
        command, cwd=folder, env=clean_environment(), capture_output=True, text=True, check=False
    )
    if out.returncode != expect:
        raise RuntimeError(
            f"kestrel {' '.join(args)}: exit status {out.returncode}, expected {expect}\n"
            f"{out.stdout[-2000:]}{out.stderr[-3000:]}"
        )
    counts: dict[str, Any] = json.loads(report.read_text())
    return counts, out.stdout


def measure() -> dict[str, dict[str, Any]]:
    """Both scenarios on a fresh SQLite database: their counts."""
    with tempfile.TemporaryDirectory(prefix="kestrel-bench-commits-") as tmp:
        folder = Path(tmp)
        workspace(folder)
        migrate = subprocess.run(
            [*kestrel_command(), "db", "migrate"],
            cwd=folder,
            env=clean_environment(),
            capture_output=True,
            text=True,
            check=False,
        )
        if migrate.returncode != 0:
            raise RuntimeError(f"kestrel db migrate failed:\n{migrate.stderr[-3000:]}")
        suspend, out = counted(
            folder,
            folder / "suspend.json",
            *("run", "--defer", "--json", "--as", "bob", "restart checkout"),
            expect=EXIT_SUSPENDED,
        )
        run = json.loads(out)
        (request,) = run["requests"]
        resume, out = counted(
            folder,
            folder / "resume.json",
            *("runs", "approve", run["run_id"], request["id"], "--as", "alice"),
        )
        if "completed" not in out:
            raise RuntimeError(f"the approved run did not complete: {out.strip()}")
    return {"suspend": suspend, "resume": resume}


LABELS: Final = {
    "suspend": "suspend on one approval (kestrel run --defer)",
    "resume": "approve and resume, fresh process (kestrel runs approve)",
}


def report() -> None:
    """Print the commits of both scenarios against the targets, each with its store calls."""
    print("Durable commits on SQLite: the real kestrel command, one process per scenario")
    for name, counts in measure().items():
        target = TARGETS[name]
        commits = [calls for calls in counts["commits"] if not _process_stamp(calls)]
        stamps = len(counts["commits"]) - len(commits)
        verdict = "ok" if len(commits) <= target else "over"
        reads = sum(counts["reads"].values())
        print(
            f"  {LABELS[name]:<58} {len(commits):>2} commits (target <= {target}: {verdict}),"
            f" {reads} reads"
        )
        for number, calls in enumerate(commits, 1):
            print(f"      {number}. {' + '.join(calls)}")
        if stamps:
            print(f"      (+{stamps} while the command ran: its process stamp, apart)")
        for calls in counts["empty_transactions"]:
            print(f"      (no rows changed: {' + '.join(calls) or 'an empty transaction'})")
        print(f"      reads: {_reads(counts['reads'])}")


def _process_stamp(calls: list[str]) -> bool:
    """Whether a commit only journaled a running command's process stamp."""
    return bool(calls) and all(call.startswith("append tool_process") for call in calls)


def _reads(reads: dict[str, int]) -> str:
    inside = "(in a write transaction) "
    alone = [f"{table} {n}" for table, n in sorted(reads.items()) if not table.startswith(inside)]
    within = [
        f"{table.removeprefix(inside)} {n}"
        for table, n in sorted(reads.items())
        if table.startswith(inside)
    ]
    return f"{', '.join(alone) or 'none'}; in write transactions: {', '.join(within) or 'none'}"


def main() -> None:
    """``--count-into FILE -- ARGS``: one counted command (internal); else the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count-into", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="Print the counts as JSON.")
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.count_into is not None:
        sys.exit(counted_kestrel(options.count_into, options.args))
    if options.json:
        print(json.dumps(measure(), indent=2))
    else:
        report()


if __name__ == "__main__":
    main()
