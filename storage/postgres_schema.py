"""The PostgreSQL schema as ordered migrations; version N is the first N scripts applied."""

from __future__ import annotations

# Each script runs in its own transaction, under the migration advisory lock, together with the
# insert of its version into ``schema_version``. Never edit a released script: append a new one.
#
# Bodies are ``json``, not ``jsonb``: ``json`` keeps the exact text, so an identical re-append
# compares equal byte for byte as in SQLite, and it accepts ``\u0000`` (command output can hold
# NUL characters), which ``jsonb`` refuses. ``pos`` is insertion order, the tiebreak of equal
# timestamps that SQLite gets from its rowid.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE sessions (
        id         text PRIMARY KEY,
        platform   text NOT NULL,
        channel    text NOT NULL,
        thread     text NOT NULL,
        created_at timestamptz NOT NULL
    );

    CREATE TABLE runs (
        id            text PRIMARY KEY,
        pos           bigint GENERATED ALWAYS AS IDENTITY,
        session_id    text NOT NULL REFERENCES sessions(id),
        prompt        text NOT NULL,
        requested_by  text NOT NULL,
        status        text NOT NULL,
        stop_reason   text NOT NULL DEFAULT '',
        owner         text NOT NULL DEFAULT '',
        epoch         bigint NOT NULL,
        lease_expires timestamptz,
        created_at    timestamptz NOT NULL,
        updated_at    timestamptz NOT NULL
    );
    CREATE INDEX runs_by_created ON runs(created_at, pos);
    CREATE INDEX runs_by_session ON runs(session_id, created_at, pos);

    CREATE TABLE journal (
        run_id text NOT NULL REFERENCES runs(id),
        seq    bigint NOT NULL CHECK (seq >= 0),
        epoch  bigint NOT NULL,
        kind   text NOT NULL,
        body   json NOT NULL,
        at     timestamptz NOT NULL,
        PRIMARY KEY (run_id, seq)
    );

    CREATE TABLE requests (
        id         text PRIMARY KEY,
        pos        bigint GENERATED ALWAYS AS IDENTITY,
        run_id     text NOT NULL REFERENCES runs(id),
        kind       text NOT NULL,
        call_id    text NOT NULL,
        tool       text NOT NULL,
        body       json NOT NULL,
        status     text NOT NULL,
        decision   json,
        created_at timestamptz NOT NULL,
        deadline   timestamptz
    );
    CREATE INDEX requests_by_status ON requests(status, created_at, pos);
    CREATE INDEX requests_by_run ON requests(run_id, created_at, pos);

    CREATE TABLE audit (
        id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at         timestamptz NOT NULL,
        actor      text NOT NULL,
        action     text NOT NULL,
        run_id     text NOT NULL DEFAULT '',
        request_id text NOT NULL DEFAULT '',
        detail     text NOT NULL DEFAULT ''
    );
    CREATE INDEX audit_by_run ON audit(run_id, id);
    """,
    """
    CREATE TABLE approvals (
        request_id text NOT NULL REFERENCES requests(id),
        approver   text NOT NULL,
        at         timestamptz NOT NULL,
        PRIMARY KEY (request_id, approver)
    );
    """,
    """
    CREATE TABLE once_keys (
        key text PRIMARY KEY,
        at  timestamptz NOT NULL
    );
    """,
    # Work any replica may take, and the replicas themselves. Only unfinished items are
    # scanned by ``take_work``, hence the partial index; ``list_replicas`` joins runs by owner.
    """
    CREATE TABLE work (
        id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        kind       text NOT NULL,
        payload    json NOT NULL,
        created_at timestamptz NOT NULL,
        taken_by   text,
        taken_at   timestamptz,
        done_at    timestamptz
    );
    CREATE INDEX work_unfinished ON work(id) WHERE done_at IS NULL;

    CREATE TABLE replicas (
        owner      text PRIMARY KEY,
        info       text NOT NULL DEFAULT '',
        started_at timestamptz NOT NULL,
        last_seen  timestamptz NOT NULL
    );
    CREATE INDEX runs_by_owner ON runs(owner);
    """,
    # Chat messages to show. ``claim_messages`` and ``outbox_backlog`` scan only the messages
    # the platform does not show yet, oldest first, hence the partial index.
    """
    CREATE TABLE outbox (
        key               text PRIMARY KEY,
        pos               bigint GENERATED ALWAYS AS IDENTITY,
        platform          text NOT NULL,
        target            json NOT NULL,
        body              json NOT NULL,
        version           bigint NOT NULL,
        delivered_version bigint NOT NULL DEFAULT 0,
        ref               text NOT NULL DEFAULT '',
        attempts          bigint NOT NULL DEFAULT 0,
        next_attempt_at   timestamptz NOT NULL,
        claimed_by        text NOT NULL DEFAULT '',
        claim_expires     timestamptz,
        error             text NOT NULL DEFAULT '',
        created_at        timestamptz NOT NULL,
        updated_at        timestamptz NOT NULL
    );
    CREATE INDEX outbox_due ON outbox(created_at, pos) WHERE version > delivered_version;
    """,
    # A session's workspace (Slack team, Discord guild): part of the place a decision or a
    # read about its runs is checked against. Earlier sessions carry it in their ids.
    """
    ALTER TABLE sessions ADD COLUMN workspace text NOT NULL DEFAULT '';
    UPDATE sessions SET workspace = split_part(id, ':', 2) WHERE platform IN ('slack', 'discord');
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

CREATE_VERSION_TABLE = """
CREATE TABLE schema_version (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""


def migration_script(version: int) -> str:
    """The DDL of migration ``version`` (1-based)."""
    return MIGRATIONS[version - 1]
