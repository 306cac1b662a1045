"""The statements both stores run, each written once, and the dialects that render them.

A statement is written in PostgreSQL's notation: numbered ``$N`` parameters, ``::type`` casts
where PostgreSQL cannot infer a parameter's type or must read ``json`` as text, and
``{insertion}`` for the column that orders rows inserted at the same instant, and
``{json:COLUMN:a.b}`` for the text at path ``a.b`` of a JSON column (NULL where there is none).
A ``Dialect``
renders it for its database (once per statement; the result is cached). Upserts need no
parameter: both databases spell ``ON CONFLICT (...) DO NOTHING / DO UPDATE SET ... = excluded.``
the same way, and both take the current time from the store's clock, never from SQL.
Both refuse alike a database that holds another program's tables and no schema of Kestrel's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from bot.patterns import on_use

RUN_COLUMNS: Final = (
    "id, session_id, prompt, requested_by, status, stop_reason, owner, epoch,"
    " lease_expires, created_at, updated_at"
)

# One statement of a transaction, in this module's notation, and its parameters.
Step = tuple[str, Sequence[Any]]

_LOWER: Final = "abcdefghijklmnopqrstuvwxyz"
_JSON_PATH: Final = on_use(r"\{json:([a-z_]+):([a-z_.]+)\}")


def _path_text(column: str, path: Sequence[str]) -> str:
    """PostgreSQL: the text at ``path`` of a ``json`` column, parsed once."""
    return f"json_extract_path_text({column}, {', '.join(repr(key) for key in path)})"


def _json_extract(column: str, path: Sequence[str]) -> str:
    """SQLite: the value at ``path`` of a text column holding JSON."""
    return f"json_extract({column}, '$.{'.'.join(path)}')"


class Dialect:
    """What one database spells or stores differently; renders the shared statements.

    The defaults are PostgreSQL's notation, which statements are written in.
    """

    def __init__(
        self,
        *,
        insertion: str,
        stamp: Callable[[datetime], Any],
        moment: Callable[[Any], datetime],
        marker: str = "$",
        casts: bool = True,
        row_locks: bool = True,
        json_text: Callable[[str, Sequence[str]], str] = _path_text,
        json_items: str = "json_array_elements_text",
    ) -> None:
        # The column that orders rows of equal timestamps by insertion.
        self.insertion = insertion
        # A timestamp as a parameter, and a stored one read back as an aware datetime.
        self.stamp = stamp
        self.moment = moment
        # The prefix of a numbered parameter: ``$`` (PostgreSQL) or ``?`` (SQLite).
        self.marker = marker
        # False where every value is stored as written (SQLite: JSON and timestamps as text).
        self.casts = casts
        # False where a write transaction excludes every other writer (SQLite's BEGIN
        # IMMEDIATE): a statement then needs no row lock to keep others off its rows.
        self.row_locks = row_locks
        # ``{json:COLUMN:a.b}``: the value at a path of a JSON column.
        self.json_text = json_text
        # ``{json_items}(X)``: the items of JSON array X, as rows of one column, ``value``.
        self.json_items = json_items
        # Bounded: statements are constants, or built from a few filter combinations.
        self._rendered: dict[str, str] = {}

    def sql(self, statement: str) -> str:
        """``statement`` in this dialect."""
        rendered = self._rendered.get(statement)
        if rendered is None:
            rendered = self._render(statement)
            self._rendered[statement] = rendered
        return rendered

    def _render(self, statement: str) -> str:
        # Statements never hold ``$`` or ``::`` in a literal: only parameters (``$1``) and casts
        # do. The JSON paths' regex compiles only for a statement that has one.
        # The markers first: SQLite's JSON paths bring a ``$`` of their own (``'$.key'``).
        text = statement.replace("$", self.marker).replace("{insertion}", self.insertion)
        if "{json:" in text:
            text = _JSON_PATH.sub(lambda m: self.json_text(m[1], m[2].split(".")), text)
        text = text.replace("{json_items}", self.json_items)
        if not self.casts and "::" in text:
            text = _without_casts(text)
        return text


def _without_casts(text: str) -> str:
    """``text`` without its ``::type`` casts (a lowercase type name each): string methods, as a
    regex compiled for it cost a fresh process more than every statement it renders."""
    head, *casts = text.split("::")
    return head + "".join(cast.lstrip(_LOWER) for cast in casts)


def utc(moment: datetime) -> datetime:
    """An aware UTC datetime; naive ones are taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def iso_stamp(moment: datetime) -> str:
    """A UTC timestamp in one fixed format, so that text order is time order in SQL."""
    return utc(moment).isoformat(timespec="microseconds")


# ``json`` and ``timestamptz`` columns, and ``pos`` (an identity column) as insertion order.
POSTGRES: Final = Dialect(insertion="pos", stamp=utc, moment=utc)
# ``?N`` parameters; typeless columns (JSON and timestamps are text); the rowid as insertion
# order; the writer's BEGIN IMMEDIATE keeps every other writer out, so no row locks.
SQLITE: Final = Dialect(
    insertion="rowid",
    stamp=iso_stamp,
    moment=datetime.fromisoformat,
    marker="?",
    casts=False,
    row_locks=False,
    json_text=_json_extract,
    json_items="json_each",
)


def equal(first: int = 1, /, **filters: str | None) -> tuple[list[str], tuple[str, ...]]:
    """A ``column = $N`` condition for each given column (parameters from ``$first`` on),
    skipping the filters that are None; and the parameters they take."""
    used = {column: value for column, value in filters.items() if value is not None}
    conditions = [f"{column} = ${n}" for n, column in enumerate(used, start=first)]
    return conditions, tuple(used.values())


def where(**filters: str | None) -> tuple[str, tuple[str, ...]]:
    """A WHERE clause over the given columns (parameters from $1 on), skipping the filters that
    are None; and the parameters it takes."""
    conditions, params = equal(**filters)
    if not conditions:
        return "", ()
    return "WHERE " + " AND ".join(conditions), params


# -- sessions and runs --------------------------------------------------------------------------

ENSURE_SESSION: Final = """
INSERT INTO sessions(id, platform, workspace, channel, thread, created_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (id) DO NOTHING
"""
GET_SESSION: Final = "SELECT id, platform, workspace, channel, thread FROM sessions WHERE id = $1"
# A platform's newest sessions ($1 the platform, $2 how many): where a chat adapter reads back
# what it may have missed while disconnected. Once per connection, so no index of its own.
SESSIONS_ON: Final = """
SELECT id, platform, workspace, channel, thread FROM sessions WHERE platform = $1
ORDER BY created_at DESC, id LIMIT $2
"""
CREATE_RUN: Final = (
    f"INSERT INTO runs({RUN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8, $9, $10)"
)
# A thread's new run, inserted only while no other run of its session is unfinished. With no
# row inserted, the run's first journal entry breaks its foreign key and rolls the whole
# transaction back (``SqlStore.create_run``). PostgreSQL locks the session first
# (``LOCK_SESSION``): each statement reads anew, so a second creator sees the first's run.
CREATE_RUN_ALONE: Final = f"""
INSERT INTO runs({RUN_COLUMNS})
SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, 1,
    $8::timestamptz, $9::timestamptz, $10::timestamptz
WHERE NOT EXISTS (
    SELECT 1 FROM runs WHERE session_id = $2 AND status IN ('running', 'suspended')
)
"""
LOCK_SESSION: Final = "SELECT id FROM sessions WHERE id = $1 FOR NO KEY UPDATE"
GET_RUN: Final = f"SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"
COUNT_RUNS_BY_STATUS: Final = "SELECT status, COUNT(*) FROM runs GROUP BY status"
# Running with no live owner; or suspended with every request answered and nobody to resume
# it: owned, which only a decider that took the lease to resume the run and died before it
# wrote a word leaves behind; or released while waiting and claimed by nobody since its
# suspend (the lease's epoch is its journal's last), which an owner that died as it suspended
# leaves behind when the answers came while it ran (their deciders found the lease taken and
# left the run to it), and a stopping replica leaves ``handed_back`` if it dies before it queues
# the run's resume. A decider, sweep or work item whose resume was refused (it takes --force)
# claimed the run and gave it back: that run waits for a person, not for a sweep that would be
# refused at every pass; running, it is released with an epoch past its journal's last too (a
# run's row comes with its first entries: only a test's has none). A canceller that died
# leaves its requests open or cancelled, and a run a person stopped (Ctrl-C) is suspended
# ``interrupted``: not those.
ORPHANED_RUNS: Final = """
SELECT id FROM runs
WHERE (status = 'running'
       AND ((owner <> '' AND (lease_expires IS NULL OR lease_expires < $1))
            OR (owner = '' AND epoch = (SELECT COALESCE(MAX(j.epoch), runs.epoch)
                                         FROM journal AS j WHERE j.run_id = runs.id))))
   OR (status = 'suspended'
       AND ((owner <> '' AND lease_expires < $1)
            OR (owner = '' AND stop_reason IN ('waiting', 'handed_back')
                AND epoch = (SELECT MAX(j.epoch) FROM journal AS j WHERE j.run_id = runs.id)))
       AND NOT EXISTS (SELECT 1 FROM requests AS r
                       WHERE r.run_id = runs.id AND r.status IN ('open', 'cancelled')))
ORDER BY updated_at LIMIT $2
"""


def list_runs(clause: str, limit: int) -> str:
    """The newest runs first, filtered by ``clause``; parameter number ``limit`` caps them."""
    return (
        f"SELECT {RUN_COLUMNS} FROM runs {clause}"
        f" ORDER BY created_at DESC, {{insertion}} DESC LIMIT ${limit}"
    )


# -- leases -------------------------------------------------------------------------------------

CLAIM: Final = """
UPDATE runs SET owner = $1, epoch = epoch + 1, lease_expires = $2, updated_at = $3
WHERE id = $4 AND ($5::boolean OR owner = '' OR owner = $1
                   OR lease_expires IS NULL OR lease_expires <= $3)
RETURNING epoch
"""
RENEW: Final = """
UPDATE runs SET lease_expires = $1, updated_at = $2
WHERE id = $3 AND owner = $4 AND epoch = $5 RETURNING true
"""
RELEASE: Final = """
UPDATE runs SET owner = '', lease_expires = NULL, updated_at = $1
WHERE id = $2 AND owner = $3 AND epoch = $4
"""
CURRENT_EPOCH: Final = "SELECT epoch FROM runs WHERE id = $1"

# -- journal ------------------------------------------------------------------------------------

LOAD: Final = "SELECT seq, epoch, body::text FROM journal WHERE run_id = $1 ORDER BY seq"
# A page of a journal: seqs have no gaps, so a range of them is a page.
LOAD_RANGE: Final = """
SELECT seq, epoch, body::text FROM journal WHERE run_id = $1 AND seq >= $2 AND seq < $3
ORDER BY seq
"""
# The one number a live page's "has it changed" check reads, and the run's epoch; no row for an
# unknown run. SQLite's appends check their fence with it (``storage.sqlite_group_commit``).
JOURNAL_LENGTH: Final = """
SELECT (SELECT COALESCE(MAX(seq), -1) + 1 FROM journal WHERE run_id = $1), epoch
FROM runs WHERE id = $1
"""
# What a run page's header adds up over seqs $2 to $3 (exclusive), by kind and tool outcome:
# how many, tokens, the last iteration, and the seqs of the first start, the last assistant
# turn and the last one with text. Only these few fields of each body are read, in SQL.
JOURNAL_TALLY: Final = """
SELECT kind, outcome, COUNT(*), SUM(input_tokens), SUM(output_tokens), MAX(iteration),
       MIN(CASE WHEN kind = 'run_started' THEN seq END),
       MAX(CASE WHEN kind = 'assistant_turn' THEN seq END),
       MAX(CASE WHEN kind = 'assistant_turn' AND turn_text <> '' THEN seq END),
       MAX(CASE WHEN kind = 'run_resumed' AND changed IS NOT NULL THEN seq END)
FROM (
    SELECT seq, kind,
           CASE WHEN kind = 'tool_result' THEN {json:body:outcome} END AS outcome,
           CASE WHEN kind = 'assistant_turn'
                THEN {json:body:turn.usage.input_tokens}::bigint END AS input_tokens,
           CASE WHEN kind = 'assistant_turn'
                THEN {json:body:turn.usage.output_tokens}::bigint END AS output_tokens,
           CASE WHEN kind = 'assistant_turn' THEN {json:body:iteration}::bigint END AS iteration,
           CASE WHEN kind = 'assistant_turn' THEN {json:body:turn.text} END AS turn_text,
           CASE WHEN kind = 'run_resumed' THEN {json:body:fingerprint.model} END AS changed
    FROM journal WHERE run_id = $1 AND seq >= $2 AND seq < $3
) AS entries
GROUP BY kind, outcome
"""
# The seqs a finished run's header reads itself, before $2: the first start, the last assistant
# turn, the last one with text and the last forced resume that went on with a new fingerprint.
# Each walks the primary key from its end and stops at the first match, so an ended run's page
# reads a few rows, not its whole journal; the last walks only a run that was forced on (its
# audit says so: rare), and then the rows back to that resume.
JOURNAL_LANDMARKS: Final = """
SELECT
    (SELECT seq FROM journal WHERE run_id = $1 AND seq < $2 AND kind = 'run_started'
     ORDER BY seq LIMIT 1),
    (SELECT seq FROM journal WHERE run_id = $1 AND seq < $2 AND kind = 'assistant_turn'
     ORDER BY seq DESC LIMIT 1),
    (SELECT seq FROM journal WHERE run_id = $1 AND seq < $2 AND kind = 'assistant_turn'
         AND {json:body:turn.text} <> ''
     ORDER BY seq DESC LIMIT 1),
    CASE WHEN EXISTS (SELECT 1 FROM audit WHERE run_id = $1 AND action = 'resume'
                      AND detail LIKE '%forced%')
    THEN (SELECT seq FROM journal WHERE run_id = $1 AND seq < $2 AND kind = 'run_resumed'
              AND {json:body:fingerprint.model} IS NOT NULL
          ORDER BY seq DESC LIMIT 1)
    END
"""
# A new run's first entries, written with its row: nobody else can hold the run yet.
INSERT_ENTRY: Final = """
INSERT INTO journal(run_id, seq, epoch, kind, body, at) VALUES ($1, $2, $3, $4, $5::json, $6)
"""
# The status an entry moves its run to; a suspend or an end gives the lease up ($5).
PROJECT_STATUS: Final = """
UPDATE runs SET status = $1, stop_reason = $2, updated_at = $3,
    owner = CASE WHEN $5::boolean THEN '' ELSE owner END,
    lease_expires = CASE WHEN $5::boolean THEN NULL ELSE lease_expires END
WHERE id = $4
"""
# Why an append did not land: the run's epoch, the body at the seq, and the next free seq.
DIAGNOSE_APPEND: Final = """
SELECT epoch,
       (SELECT body::text FROM journal WHERE run_id = $1 AND seq = $2),
       (SELECT COALESCE(MAX(seq), -1) + 1 FROM journal WHERE run_id = $1)
FROM runs WHERE id = $1
"""

# -- requests -----------------------------------------------------------------------------------

_REQUEST_COLUMNS: Final = "id, body::text, status, decision::text"
OPEN_REQUEST: Final = """
INSERT INTO requests(id, run_id, kind, call_id, tool, body, status, decision, created_at, deadline)
VALUES ($1, $2, $3, $4, $5, $6::json, $7, NULL, $8, $9)
ON CONFLICT (id) DO NOTHING
"""
GET_REQUEST: Final = f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE id = $1"
DECIDE: Final = """
UPDATE requests SET status = $1, decision = $2::json
WHERE id = $3 AND status = 'open' RETURNING true
"""
# A request's run has not ended (a clause on ``requests``): a person's answer or approval
# counts only then, asked by the run's primary key.
_RUN_NOT_ENDED: Final = """NOT EXISTS (
    SELECT 1 FROM runs
    WHERE runs.id = requests.run_id AND runs.status IN ('completed', 'failed', 'cancelled')
  )"""
# A person's answer closes a request only while its run has not ended: a cancel ends the run
# before it closes the run's requests, and an answer written between the two would be
# recorded on a run nothing resumes (the run's row is locked first where rows are locked).
ANSWER: Final = f"""
UPDATE requests SET status = $1, decision = $2::json
WHERE id = $3 AND status = 'open' AND {_RUN_NOT_ENDED}
RETURNING true
"""
# The audit record of a decision, written only where that decision is the one that closed the
# request ($5 the request, $6 the decision's text): a losing decider records nothing. A decision
# is told apart by its text (who made it and when, to the microsecond); a loser whose text is
# the same byte for byte finds the winner's record (the same actor $2, action $3 and detail $4
# on the request), as a request closes once.
AUDIT_DECISION: Final = """
INSERT INTO audit(at, actor, action, run_id, request_id, detail)
SELECT $1::timestamptz, $2::text, $3::text, run_id, id, $4::text FROM requests
WHERE id = $5 AND decision::text = $6
  AND NOT EXISTS (SELECT 1 FROM audit AS a
                  WHERE a.run_id = requests.run_id AND a.request_id = requests.id
                    AND a.actor = $2::text AND a.action = $3::text AND a.detail = $4::text)
"""
# Where rows are locked, deciders of one run's requests take turns, so the one closing the last
# open request sees every other closed and takes the lease (none may miss it).
LOCK_RUN_OF_REQUEST: Final = """
SELECT epoch FROM runs WHERE id = (SELECT run_id FROM requests WHERE id = $1) FOR NO KEY UPDATE
"""
# Takes the free lease of a request's run once this decision ($4 the request, $5 the
# decision's text) closed the run's last open request; never a lease still held, ours included.
# Ours lapsed is still held: this process's task may drive the run yet (its renewal late, the
# process starved), and taken with the decision, the task would be fenced mid-batch, a call's
# result it ran lost and on-call asked about it. The decider resumes it without the claim.
CLAIM_SETTLED: Final = """
UPDATE runs SET owner = $1, epoch = epoch + 1, lease_expires = $2, updated_at = $3
WHERE id = (SELECT run_id FROM requests WHERE id = $4 AND decision::text = $5)
  AND status IN ('running', 'suspended')
  AND (owner = '' OR lease_expires IS NULL OR (lease_expires <= $3 AND owner <> $1))
  AND NOT EXISTS (SELECT 1 FROM requests AS r WHERE r.run_id = runs.id AND r.status = 'open')
RETURNING epoch
"""
# Where rows are locked, concurrent approvers count one after another under this lock, so the
# last of them sees every approval (two racing "last" approvers must not both see one too few).
LOCK_REQUEST: Final = "SELECT status FROM requests WHERE id = $1 FOR NO KEY UPDATE"
# A closed request, or one whose run ended (a cancel ends its run before it closes the run's
# requests), takes no more approvals; the same approver twice counts once. A row comes back
# only for an approval that counted for the first time.
INSERT_APPROVAL: Final = f"""
INSERT INTO approvals(request_id, approver, at)
SELECT $1::text, $2::text, $3::timestamptz
WHERE EXISTS (SELECT 1 FROM requests WHERE id = $1 AND status = 'open' AND {_RUN_NOT_ENDED})
ON CONFLICT (request_id, approver) DO NOTHING
RETURNING true
"""
# Audited once per approver: only while the approval is not there yet (a second click is none).
AUDIT_APPROVAL: Final = f"""
INSERT INTO audit(at, actor, action, run_id, request_id, detail)
SELECT $1::timestamptz, $2::text, $3::text, run_id, id, $4::text FROM requests
WHERE id = $5 AND status = 'open' AND {_RUN_NOT_ENDED}
  AND NOT EXISTS (SELECT 1 FROM approvals WHERE request_id = $5 AND approver = $2::text)
"""
# How many approved it, whether the request exists, and whether it takes approvals: a request
# closed, or whose run ended, before this approval counted none of it (its row and its run's
# locked where rows are, so they stay as read).
COUNT_APPROVALS: Final = f"""
SELECT (SELECT COUNT(*) FROM approvals WHERE request_id = $1),
       EXISTS (SELECT 1 FROM requests WHERE id = $1),
       EXISTS (SELECT 1 FROM requests WHERE id = $1 AND status = 'open' AND {_RUN_NOT_ENDED})
"""
# In the order they approved (the same instant, rare, ordered by name so a card reads the same).
LIST_APPROVERS: Final = "SELECT approver FROM approvals WHERE request_id = $1 ORDER BY at, approver"
MARK_ONCE: Final = """
INSERT INTO once_keys(key, at) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING RETURNING true
"""
MARKED: Final = "SELECT true FROM once_keys WHERE key = $1"
# The keys of the JSON array $1 marked at $2 unless marked before, and when each was. In one
# order whatever the caller's: two transactions inserting keys both hold would each wait on
# the other's (a deadlock on PostgreSQL). ``WHERE true``: SQLite's parser asks for it.
MARK_ALL_ONCE: Final = """
INSERT INTO once_keys(key, at) SELECT value, $2::timestamptz FROM {json_items}($1::json)
WHERE true ORDER BY value ON CONFLICT (key) DO NOTHING
"""
MARKED_AT: Final = (
    "SELECT key, at FROM once_keys WHERE key IN (SELECT value FROM {json_items}($1::json))"
)
# A mark that comes with work (a chat delivery, a scheduled occurrence): a key that stands
# already refuses it (a unique violation), and with it the whole transaction: nothing is queued.
MARK_DELIVERY: Final = "INSERT INTO once_keys(key, at) VALUES ($1, $2)"


def of_unfinished_runs(clause: str) -> str:
    """``clause`` (a WHERE clause, or none) narrowed to the requests of runs that did not end:
    not one a cancel cut short left open on its ended run (``bot.chat.service.pending_requests``).
    """
    # Asked of each request's run by its primary key: NOT IN read every ended run, a list
    # that grows with the journal, and PostgreSQL hashes it only while it fits in work_mem.
    return f"{clause} AND {_RUN_NOT_ENDED}" if clause else f"WHERE {_RUN_NOT_ENDED}"


def list_requests(clause: str) -> str:
    """Requests filtered by ``clause``, oldest first."""
    return f"SELECT {_REQUEST_COLUMNS} FROM requests {clause} ORDER BY created_at, {{insertion}}"


# -- work and replicas --------------------------------------------------------------------------

ENQUEUE_WORK: Final = """
INSERT INTO work(kind, payload, created_at) VALUES ($1, $2::json, $3) RETURNING id
"""
# Work its enqueuer takes at once ($4 at $3): nobody else takes it unless the enqueuer dies.
ENQUEUE_TAKEN_WORK: Final = """
INSERT INTO work(kind, payload, created_at, taken_by, taken_at) VALUES ($1, $2::json, $3, $4, $3)
RETURNING id
"""
# What a take may pick for $1 at $2: the oldest $4 items untaken, or taken before $3 and never
# finished (their taker died). Each backend keeps two takers off one item in its own way.
UNTAKEN_WORK: Final = """
SELECT id FROM work
WHERE done_at IS NULL AND (taken_at IS NULL OR taken_at < $3)
ORDER BY id LIMIT $4
"""
# The columns ``work_from_row`` reads, as a take's RETURNING clause.
TAKEN_WORK: Final = "id, kind, payload::text, created_at"
FINISH_WORK: Final = "UPDATE work SET done_at = $1 WHERE id = $2 AND done_at IS NULL"
# A replica marked stopping ($4) stays so: a heartbeat already under way as it began to stop
# may land after the mark.
HEARTBEAT: Final = """
INSERT INTO replicas(owner, info, started_at, last_seen) VALUES ($1, $2, $3, $3)
ON CONFLICT (owner) DO UPDATE SET last_seen = excluded.last_seen,
    info = CASE WHEN replicas.info = $4 THEN replicas.info ELSE excluded.info END
"""
FORGET_REPLICA: Final = "DELETE FROM replicas WHERE owner = $1"
# The replicas seen since $1, one row per run each owns (NULLs for none).
LIST_REPLICAS: Final = """
SELECT replicas.owner, replicas.info, replicas.started_at, replicas.last_seen,
       runs.id, runs.lease_expires
FROM replicas LEFT JOIN runs ON runs.owner = replicas.owner
WHERE replicas.last_seen >= $1 ORDER BY replicas.owner, runs.id
"""

# -- outbox -------------------------------------------------------------------------------------

# The columns ``outbox_from_row`` reads. Who holds a claim (``claimed_by``, '' for nobody) and
# until when (``claim_expires``, NULL for nobody) stay inside the store.
_OUTBOX_COLUMNS: Final = (
    "key, platform, target::text, body::text, version, delivered_version, ref, attempts,"
    " next_attempt_at, error, created_at, updated_at"
)
# Message $1 of platform $2 at $3 showing $4, put at $5: new, it is version 1, due at once; a
# different body replaces the stored one as the next version, due at once (the ref, the target
# and the attempts stay; only an owed answer's empty target takes the one put). An identical
# body returns no row: nothing changed.
PUT_MESSAGE: Final = """
INSERT INTO outbox(key, platform, target, body, version, next_attempt_at, created_at, updated_at)
VALUES ($1, $2, $3::json, $4::json, 1, $5, $5, $5)
ON CONFLICT (key) DO UPDATE
SET body = excluded.body, version = outbox.version + 1,
    target = CASE WHEN outbox.target::text = '{}' THEN excluded.target ELSE outbox.target END,
    next_attempt_at = excluded.next_attempt_at, updated_at = excluded.updated_at
WHERE outbox.body::text <> excluded.body::text
RETURNING version
"""
MESSAGE_VERSION: Final = "SELECT version FROM outbox WHERE key = $1"
# A message due at $2: the platform does not show its version yet, its retry time has come,
# and nobody holds a claim on it (or the claim has run out).
_DUE_MESSAGE: Final = (
    "version > delivered_version",
    "next_attempt_at <= $2",
    "(claim_expires IS NULL OR claim_expires <= $2)",
)


def claim_messages(filters: Sequence[str], limit: int, row_locks: bool) -> str:
    """Claims for $1 at $2 until $3 of the oldest due messages that also meet ``filters``
    (conditions on the parameters after ``limit``), at most parameter number ``limit`` of
    them, each counting one attempt; returns ``{insertion}`` and ``_OUTBOX_COLUMNS``.

    Where rows are locked, concurrent claimers pass over each other's rows (SKIP LOCKED), so
    each row goes to one claimer; elsewhere the write transaction runs alone (SQLite's BEGIN
    IMMEDIATE), so no other claimer can take the rows between the select and the update.
    MATERIALIZED keeps the locking LIMIT subquery from being evaluated more than once.
    """
    due = " AND ".join((*_DUE_MESSAGE, *filters))
    lock = " FOR UPDATE SKIP LOCKED" if row_locks else ""
    return f"""
WITH picked AS MATERIALIZED (
    SELECT key FROM outbox WHERE {due}
    ORDER BY created_at, {{insertion}} LIMIT ${limit}{lock}
)
UPDATE outbox SET claimed_by = $1, claim_expires = $3, attempts = attempts + 1, updated_at = $2
WHERE key IN (SELECT key FROM picked)
RETURNING {{insertion}}, {_OUTBOX_COLUMNS}
"""


# Claimer $2 says message $1 shows version $3 as ref $4, at $5. Its claim, if it still holds it,
# is released, and attempts and error start afresh (also when nobody holds a claim). A claimer
# that lost its claim may have posted all the same: it records its ref where none is recorded
# yet (or its version on the ref recorded) and leaves the claim to its holder. The version
# recorded only ever grows; a ref is never cleared. Done with no ref known (a placeholder filled
# in, a message given up) after an earlier attempt, whose post may have landed unrecorded, the
# attempts stand: the next version is looked up on the platform before it is posted.
MESSAGE_DELIVERED: Final = """
UPDATE outbox SET
    delivered_version = CASE WHEN $3 > delivered_version THEN $3 ELSE delivered_version END,
    ref = CASE WHEN $4::text <> '' AND (claimed_by = $2 OR ref = '') THEN $4 ELSE ref END,
    attempts = CASE
        WHEN claimed_by IN ($2, '') AND ($4::text <> '' OR ref <> '' OR attempts <= 1) THEN 0
        ELSE attempts
    END,
    error = CASE WHEN claimed_by IN ($2, '') THEN '' ELSE error END,
    claimed_by = CASE WHEN claimed_by = $2 THEN '' ELSE claimed_by END,
    claim_expires = CASE WHEN claimed_by = $2 THEN NULL ELSE claim_expires END,
    updated_at = $5
WHERE key = $1 AND (claimed_by = $2 OR ref = '' OR ref = $4)
"""
# Claimer $2 of message $1 gives its claim up after error $4 (at $5); due again at $3.
MESSAGE_FAILED: Final = """
UPDATE outbox SET claimed_by = '', claim_expires = NULL, next_attempt_at = $3, error = $4,
    updated_at = $5
WHERE key = $1 AND claimed_by = $2
"""
GET_MESSAGE: Final = f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE key = $1"
# The messages whose keys are in the JSON array $1 (a page's cards, read at once).
GET_MESSAGES: Final = (
    f"SELECT {_OUTBOX_COLUMNS} FROM outbox"
    " WHERE key IN (SELECT value FROM {json_items}($1::json))"
)
# Which of the ids $2 (a JSON array) a message of platform $1 is recorded as; ``ref <> ''``
# lets the partial index ``outbox_by_ref`` answer it.
HELD_REFS: Final = (
    "SELECT ref FROM outbox WHERE ref <> '' AND platform = $1"
    " AND ref IN (SELECT value FROM {json_items}($2::json))"
)
# Written with a run's end (its answer) or a request's opening (its card): what is owed to run
# $1's thread, as message $2 (prefixed by the session's platform) showing the platform-neutral
# body $3 until a renderer of that platform replaces it (at $4); a message already there (a
# card a renderer put first) stays. A run of no chat platform (the console's, a bare
# ``kestrel run``) owes nothing to any outbox.
OWE_MESSAGE: Final = """
INSERT INTO outbox(key, platform, target, body, version, next_attempt_at, created_at, updated_at)
SELECT sessions.platform || ':' || $2::text, sessions.platform, '{}'::json, $3::json, 1, $4, $4, $4
FROM runs JOIN sessions ON sessions.id = runs.session_id
WHERE runs.id = $1 AND sessions.platform NOT IN ('', 'console')
ON CONFLICT (key) DO NOTHING
"""


# Written with the decision that closed request $1 (its text $2): the card that shows it is owed
# again (body $3, key $4, at $5), so that a decision made where no renderer of the thread's
# platform is (the terminal) still closes the card; a renderer that is there puts the card
# itself at once. A card never put in the outbox is left to the request's opening.
OWE_CARD_AGAIN: Final = """
UPDATE outbox SET body = $3::json, version = version + 1, next_attempt_at = $5, updated_at = $5
WHERE key = (
    SELECT sessions.platform || ':' || $4::text
    FROM requests JOIN runs ON runs.id = requests.run_id
    JOIN sessions ON sessions.id = runs.session_id
    WHERE requests.id = $1 AND requests.decision::text = $2
)
"""


def outbox_backlog(filters: Sequence[str]) -> str:
    """How many messages the platform does not show yet, of those meeting ``filters``."""
    return "SELECT COUNT(*) FROM outbox WHERE " + " AND ".join(
        ("version > delivered_version", *filters)
    )


# -- audit --------------------------------------------------------------------------------------

AUDIT: Final = """
INSERT INTO audit(at, actor, action, run_id, request_id, detail) VALUES ($1, $2, $3, $4, $5, $6)
"""


def list_audit(clause: str, limit: int) -> str:
    """The newest audited facts matching ``clause``, oldest first; parameter number ``limit``
    caps them."""
    return (
        "SELECT at, actor, action, run_id, request_id, detail FROM ("
        f" SELECT id, at, actor, action, run_id, request_id, detail FROM audit {clause}"
        f" ORDER BY id DESC LIMIT ${limit}) AS newest ORDER BY id"
    )


def version_problem(version: int, current: int) -> str:
    """Why a store opened for reading refuses schema ``version`` (this Kestrel's is
    ``current``), and what to do: a reader migrates nothing, so an older replica still
    serving the store goes on unhindered."""
    fix = "upgrade Kestrel to read it" if version > current else "run `kestrel db migrate` first"
    return f"schema version {version}, this Kestrel reads {current}; {fix}"


def foreign_problem(tables: Sequence[str], remedy: str) -> str:
    """Why a database holding ``tables`` and no Kestrel schema is no journal for Kestrel: they
    are another program's; ``remedy`` says what to name instead."""
    return (
        f"holds tables that are not Kestrel's ({', '.join(tables)}): another program's;"
        f" {remedy}; nothing was written to it"
    )
