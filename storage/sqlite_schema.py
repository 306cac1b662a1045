"""The SQLite schema as ordered migrations; version N is the first N scripts applied."""

from __future__ import annotations

# Each script runs in its own transaction together with the insert of its version into
# ``schema_version`` (see ``migration_script``). Never edit a released script: append a new one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE sessions (
        id         TEXT PRIMARY KEY,
        platform   TEXT NOT NULL,
        channel    TEXT NOT NULL,
        thread     TEXT NOT NULL,
        created_at TEXT NOT NULL
    );

    CREATE TABLE runs (
        id            TEXT PRIMARY KEY,
        session_id    TEXT NOT NULL REFERENCES sessions(id),
        prompt        TEXT NOT NULL,
        requested_by  TEXT NOT NULL,
        status        TEXT NOT NULL,
        stop_reason   TEXT NOT NULL DEFAULT '',
        owner         TEXT NOT NULL DEFAULT '',
        epoch         INTEGER NOT NULL,
        lease_expires TEXT,
        created_at    TEXT NOT NULL,
        updated_at    TEXT NOT NULL
    );
    CREATE INDEX runs_by_created ON runs(created_at);
    CREATE INDEX runs_by_session ON runs(session_id, created_at);

    CREATE TABLE journal (
        run_id TEXT NOT NULL REFERENCES runs(id),
        seq    INTEGER NOT NULL CHECK (seq >= 0),
        epoch  INTEGER NOT NULL,
        kind   TEXT NOT NULL,
        body   TEXT NOT NULL,
        at     TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    );

    CREATE TABLE requests (
        id         TEXT PRIMARY KEY,
        run_id     TEXT NOT NULL REFERENCES runs(id),
        kind       TEXT NOT NULL,
        call_id    TEXT NOT NULL,
        tool       TEXT NOT NULL,
        body       TEXT NOT NULL,
        status     TEXT NOT NULL,
        decision   TEXT,
        created_at TEXT NOT NULL,
        deadline   TEXT
    );
    CREATE INDEX requests_by_status ON requests(status, created_at);
    CREATE INDEX requests_by_run ON requests(run_id, created_at);

    CREATE TABLE audit (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        at         TEXT NOT NULL,
        actor      TEXT NOT NULL,
        action     TEXT NOT NULL,
        run_id     TEXT NOT NULL DEFAULT '',
        request_id TEXT NOT NULL DEFAULT '',
        detail     TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX audit_by_run ON audit(run_id, id);
    """,
    """
    CREATE TABLE approvals (
        request_id TEXT NOT NULL REFERENCES requests(id),
        approver   TEXT NOT NULL,
        at         TEXT NOT NULL,
        PRIMARY KEY (request_id, approver)
    );
    """,
    """
    CREATE TABLE once_keys (
        key TEXT PRIMARY KEY,
        at  TEXT NOT NULL
    );
    """,
    # Work any replica may take, and the replicas themselves. Only unfinished items are
    # scanned by ``take_work``, hence the partial index; ``list_replicas`` joins runs by owner.
    """
    CREATE TABLE work (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        kind       TEXT NOT NULL,
        payload    TEXT NOT NULL,
        created_at TEXT NOT NULL,
        taken_by   TEXT,
        taken_at   TEXT,
        done_at    TEXT
    );
    CREATE INDEX work_unfinished ON work(id) WHERE done_at IS NULL;

    CREATE TABLE replicas (
        owner      TEXT PRIMARY KEY,
        info       TEXT NOT NULL DEFAULT '',
        started_at TEXT NOT NULL,
        last_seen  TEXT NOT NULL
    );
    CREATE INDEX runs_by_owner ON runs(owner);
    """,
    # Chat messages to show. ``claim_messages`` and ``outbox_backlog`` scan only the messages
    # the platform does not show yet, oldest first, hence the partial index.
    """
    CREATE TABLE outbox (
        key               TEXT PRIMARY KEY,
        platform          TEXT NOT NULL,
        target            TEXT NOT NULL,
        body              TEXT NOT NULL,
        version           INTEGER NOT NULL,
        delivered_version INTEGER NOT NULL DEFAULT 0,
        ref               TEXT NOT NULL DEFAULT '',
        attempts          INTEGER NOT NULL DEFAULT 0,
        next_attempt_at   TEXT NOT NULL,
        claimed_by        TEXT NOT NULL DEFAULT '',
        claim_expires     TEXT,
        error             TEXT NOT NULL DEFAULT '',
        created_at        TEXT NOT NULL,
        updated_at        TEXT NOT NULL
    );
    CREATE INDEX outbox_due ON outbox(created_at) WHERE version > delivered_version;
    """,
    # A session's workspace (Slack team, Discord guild): part of the place a decision or a
    # read about its runs is checked against. Earlier sessions carry it in their ids
    # (``slack:TEAM:…``, ``discord:GUILD:…``).
    """
    ALTER TABLE sessions ADD COLUMN workspace TEXT NOT NULL DEFAULT '';
    UPDATE sessions
       SET workspace = substr(
           substr(id, instr(id, ':') + 1), 1, instr(substr(id, instr(id, ':') + 1), ':') - 1
       )
     WHERE platform IN ('slack', 'discord') AND instr(substr(id, instr(id, ':') + 1), ':') > 1;
    """,
    # No table changes: requests gained plan steps and an off-plan note, which release 0.2.0
    # cannot read. The version alone makes 0.2.0 refuse the store ("schema version 7 is newer
    # than this") instead of opening it and failing on each request written since.
    """
    SELECT 1;
    """,
    # The messages recorded as one of some platform ids: what a post of unknown outcome must
    # not take for its own when it is looked up (``held_refs``).
    """
    CREATE INDEX outbox_by_ref ON outbox(ref) WHERE ref <> '';
    """,
    # No table changes: a forced resume's entry carries the fingerprint it went on with, which
    # a Kestrel before it cannot read. The version alone makes one refuse the store (a
    # rollback) instead of failing on every run resumed since.
    """
    SELECT 1;
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)

# The version applied (0 before any); SQLite says there is no such table before the first.
APPLIED_VERSION = "SELECT COALESCE(MAX(version), 0) FROM schema_version"

CREATE_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER PRIMARY KEY,
    applied_at TEXT NOT NULL
);
"""


def migration_script(version: int) -> str:
    """The script that applies migration ``version`` (1-based) in one transaction."""
    # The version row goes in first: a process racing us to the same migration then fails
    # on its primary key, rolls back and re-reads the version instead of half-applying DDL.
    return (
        "BEGIN IMMEDIATE;\n"
        "INSERT INTO schema_version(version, applied_at)"
        f" VALUES ({version:d}, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));\n"
        f"{MIGRATIONS[version - 1]}\n"
        "COMMIT;\n"
    )
