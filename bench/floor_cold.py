"""The floor of ``bench.cold``: the same suspend and resume as a plain program, no validation.

A run that asks for one gated call suspends on its approval, and a fresh process approves it,
runs the call, takes one more model turn and finishes the run. Plain ``sqlite3`` on the event
loop's thread (WAL, ``synchronous=FULL``, as Kestrel's store), ``json`` for the entries, a
scripted model in a list, and nothing checked that this program wrote itself. Commits: three to
suspend (the run started, the model's turn, the request with the suspension), three to approve
and finish (the decision with its audit row, the call's result, the answer with the end).

It imports nothing of Kestrel, so its whole process is the floor of ``kestrel runs approve``:

    python -m bench.floor_cold migrate DB
    python -m bench.floor_cold suspend DB             # prints {"ms", "run_id", "request_id"}
    python -m bench.floor_cold resume DB RUN REQUEST  # the call in-process
    python -m bench.floor_cold approve DB RUN REQUEST # the call as /bin/echo, as the catalog's
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, status TEXT NOT NULL, prompt TEXT NOT NULL,
    owner TEXT NOT NULL DEFAULT '', epoch INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS journal (run_id TEXT NOT NULL, seq INTEGER NOT NULL,
    kind TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (run_id, seq));
CREATE TABLE IF NOT EXISTS requests (id TEXT PRIMARY KEY, run_id TEXT NOT NULL,
    status TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS audit (at TEXT NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,
    run_id TEXT NOT NULL, request_id TEXT NOT NULL);
"""
REPLIES: list[dict[str, Any]] = [
    {
        "text": "Restarting checkout.",
        "calls": [{"id": "c1", "name": "restart_service", "arguments": {"service": "checkout"}}],
    },
    {"text": "Checkout restarted.", "calls": []},
]
GATED = frozenset({"restart_service"})
APPROVERS = frozenset({"alice"})


def now() -> str:
    """The time now, as the journal keeps it."""
    return datetime.now(UTC).isoformat()


def connect(path: str) -> sqlite3.Connection:
    """A connection with Kestrel's settings: WAL, full sync, explicit transactions."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 5000;"
    )
    return conn


class Journal:
    """One run's journal on one connection."""

    def __init__(self, conn: sqlite3.Connection, run_id: str, seq: int = 0) -> None:
        self.conn, self.run_id, self.seq = conn, run_id, seq

    def add(self, kind: str, body: dict[str, Any]) -> None:
        """Append an entry inside the caller's transaction."""
        self.seq += 1
        self.conn.execute(
            "INSERT INTO journal VALUES (?, ?, ?, ?)",
            (self.run_id, self.seq, kind, json.dumps(body | {"at": now()})),
        )

    def commit(self, *statements: tuple[str, tuple[Any, ...]], **entries: dict[str, Any]) -> None:
        """One durable transaction: ``statements``, then ``entries`` appended in order."""
        self.conn.execute("BEGIN IMMEDIATE")
        for sql, args in statements:
            self.conn.execute(sql, args)
        for kind, body in entries.items():
            self.add(kind, body)
        self.conn.execute("COMMIT")


async def model(turn: int) -> dict[str, Any]:
    """The scripted model's reply for ``turn`` (0-based)."""
    return REPLIES[turn]


async def restart_in_process(service: str) -> str:
    """The gated tool, in this process."""
    return f"restarted {service}"


async def restart_command(service: str) -> str:
    """The gated tool as a command, as the catalog runs it (/bin/echo)."""
    child = await asyncio.create_subprocess_exec(
        "/bin/echo", "restarted", service, stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    out, _ = await child.communicate()
    return out.decode()


async def suspend(path: str) -> dict[str, Any]:
    """Start a run; its one call is gated: journal the request and suspend."""
    conn = connect(path)
    run_id, request_id = f"run_{uuid.uuid4().hex[:16]}", f"req_{uuid.uuid4().hex[:16]}"
    journal = Journal(conn, run_id)
    prompt = "restart checkout"
    journal.commit(
        ("INSERT INTO runs VALUES (?, 'running', ?, 'floor', 1, ?)", (run_id, prompt, now())),
        run_started={"prompt": prompt},
    )
    reply = await model(0)
    journal.commit(assistant_turn=reply)
    (call,) = [c for c in reply["calls"] if c["name"] in GATED]
    text = json.dumps({"id": request_id, "kind": "wait_approval", "call": call})
    journal.commit(
        (
            "INSERT INTO requests VALUES (?, ?, 'open', ?)",
            (request_id, run_id, text),
        ),
        ("UPDATE runs SET status = 'suspended', owner = '' WHERE id = ?", (run_id,)),
        suspended={"requests": [request_id]},
    )
    conn.close()
    return {"run_id": run_id, "request_id": request_id}


async def resume(path: str, run_id: str, request_id: str, command: bool) -> dict[str, Any]:
    """Approve the request, run the call, one more model turn, finish the run."""
    conn = connect(path)
    rows = conn.execute(
        "SELECT kind, body FROM journal WHERE run_id = ? ORDER BY seq", (run_id,)
    ).fetchall()
    entries = [(kind, json.loads(body)) for kind, body in rows]
    status, body = conn.execute(
        "SELECT status, body FROM requests WHERE id = ? AND run_id = ?", (request_id, run_id)
    ).fetchone()
    if status != "open" or "alice" not in APPROVERS:
        raise SystemExit(f"request {request_id} is {status}")
    call = json.loads(body)["call"]
    journal = Journal(conn, run_id, len(entries))
    journal.commit(
        ("UPDATE requests SET status = 'approved' WHERE id = ?", (request_id,)),
        (
            "UPDATE runs SET status = 'running', owner = 'floor', epoch = epoch + 1 WHERE id = ?",
            (run_id,),
        ),
        ("INSERT INTO audit VALUES (?, 'alice', 'approve', ?, ?)", (now(), run_id, request_id)),
        decided={"request_id": request_id, "kind": "approve", "by": "alice"},
    )
    tool = restart_command if command else restart_in_process
    output = await tool(call["arguments"]["service"])
    journal.commit(tool_result={"call_id": call["id"], "output": output})
    reply = await model(1)
    journal.commit(
        ("UPDATE runs SET status = 'completed', owner = '' WHERE id = ?", (run_id,)),
        assistant_turn=reply,
        run_ended={"status": "completed", "text": reply["text"]},
    )
    conn.close()
    return {"status": "completed", "text": reply["text"]}


def timed(work: Any) -> dict[str, Any]:
    """Run ``work`` on a fresh event loop; its result with the milliseconds it took."""
    started = time.perf_counter()
    result: dict[str, Any] = asyncio.run(work)
    return result | {"ms": (time.perf_counter() - started) * 1000}


def main(args: list[str]) -> None:
    """``migrate DB``, ``suspend DB``, ``resume DB RUN REQUEST`` or ``approve DB RUN REQUEST``;
    ``setup DB`` imports what they import, and stops (counted to subtract it)."""
    phase, path, *ids = args
    if phase == "setup":
        return
    if phase == "migrate":
        connect(path).executescript(SCHEMA)
    elif phase == "suspend":
        print(json.dumps(timed(suspend(path))))
    elif phase == "resume":
        print(json.dumps(timed(resume(path, ids[0], ids[1], command=False))))
    elif phase == "approve":
        said = asyncio.run(resume(path, ids[0], ids[1], command=True))
        print(f"recorded; run {ids[0]} is now {said['status']}: {said['text']}")
    else:
        raise SystemExit(f"unknown phase {phase!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
