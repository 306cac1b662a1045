"""SqliteStore: the embedded default ``Store`` (WAL).

Reads run inline on the reader connection (``SqliteReader``; aiosqlite's thread only while the
database is busy), opened on the first read that needs it: a point read (a run, a request) runs
on the writer connection while that is idle, and so does a run's journal until the reader is open.
Every write joins a ``GroupCommit``: one transaction per pass of the event loop, through
``SqliteWriter``, which commits inline while SQLite's write lock is free.
A store opened ``read_only`` has no writer at all: it neither migrates nor needs write access.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import stat
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

from bot.domain import utcnow
from bot.errors import StoreError
from bot.journal.entries import Entry
from storage import sql
from storage.common import (
    Refusal,
    Violation,
    beside_entry,
    entry_body,
    projection,
    wait_for_event,
    work_payload,
)
from storage.sql import SQLITE, Step
from storage.sql_store import Params, Row, SqlStore, migrated
from storage.sqlite_group_commit import GroupCommit, PendingAppend
from storage.sqlite_rows import (
    FOREIGN_TABLES,
    Unreadable,
    applied_version,
    checked_version,
    foreign_tables,
    has_write_bits,
    in_wal_mode,
    no_version_table,
    path_problem,
    reader_uri,
)
from storage.sqlite_schema import (
    APPLIED_VERSION,
    CREATE_VERSION_TABLE,
    SCHEMA_VERSION,
    migration_script,
)
from storage.sqlite_steps import run_step
from storage.sqlite_writer import SqliteWriter

# The reader is opened beside the writer on first need: a command whose reads all ride the
# writer (``kestrel runs approve``) never imports it.
if TYPE_CHECKING:
    from storage.sqlite_reader import SqliteReader

_T = TypeVar("_T")

_SYNCHRONOUS_MODES: Final = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
# What to name instead of another program's database file.
_OWN_FILE: Final = "name a file of Kestrel's own (database:, KESTREL_DATABASE_URL)"
# The WAL is checkpointed (and then rewritten from its start) at about 1 MiB, not SQLite's
# 4 MiB: a commit that grows the file pays for a second sync of its size, so a process
# reaches cheap commits after a few hundred writes instead of a few thousand.
_WAL_PAGES: Final = 256
# A file mode's read permission bits, for its owner, group and others.
_READ_BITS: Final = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
# The writer mostly appends: the pages it reads again are the few a new row's index path
# crosses, so a quarter of SQLite's 2 MiB default costs it no work (bench.instructions) and
# leaves a process up to 1.5 MiB less resident. The reader keeps the default.
_WRITER_CACHE_KIB: Final = 512
# Runs inside the writer's BEGIN IMMEDIATE: no other connection, in any process, can take the
# same rows between the select and the update.
_TAKE_WORK: Final = f"""
UPDATE work SET taken_by = $1, taken_at = $2 WHERE id IN ({sql.UNTAKEN_WORK})
RETURNING {sql.TAKEN_WORK}
"""
# SQLite cannot wake other processes: a waiter polls at this interval for their work.
_WORK_POLL: Final = 0.2
# Reads of a row or two by key, which the idle writer answers inline: it holds those pages (it
# wrote them), and a fresh process that suspends a run reads nothing else, so it opens no
# second connection (its schema parsed again: 0.9 M instructions of a 10 M first suspend).
# Listings stay on the reader, whose cache is SQLite's default, four times the writer's.
_POINT_READS: Final = frozenset(
    {
        "read",
        "get_run",
        "get_request",
        "approvers",
        "get_session",
        "current_epoch",
        "get_message",
        "put_message",
        "marked",
    }
)
# A run's journal and requests ride the idle writer too until the reader is open: a process
# that resumes one run and exits (``kestrel runs approve``, a fresh resume) reads them and no
# listing, and opening the reader for them cost 0.93 M instructions of a 8.75 M resume. Once
# a listing opened the reader, they are read there, in its larger cache.
_RUN_READS: Final = frozenset({"load", "list_run_requests"})


class SqliteStore(SqlStore):
    """The journal, runs, requests and audit in one SQLite file (WAL, one writer connection)."""

    _dialect = SQLITE
    _take_work = _TAKE_WORK
    _refusals = (sqlite3.IntegrityError,)
    _failures = (sqlite3.Error,)

    current_schema: ClassVar[int] = SCHEMA_VERSION  # the version this Kestrel reads and writes

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "FULL",
        clock: Callable[[], datetime] = utcnow,
        busy_timeout: float = 5.0,
        read_only: bool = False,
    ) -> None:
        # The reader is a second connection: an in-memory database would be a different one.
        if str(path) == ":memory:":
            raise StoreError("SqliteStore needs a database file; ':memory:' is not shared")
        if synchronous.upper() not in _SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {sorted(_SYNCHRONOUS_MODES)}")
        self._path = Path(path)
        super().__init__(clock, f"SQLite database {self._path}")
        self._synchronous = synchronous.upper()
        self._busy_timeout = busy_timeout
        self._read_only = read_only
        self._wconn: SqliteWriter | None = None
        self._rconn: SqliteReader | None = None
        self._group: GroupCommit | None = None
        self._file: tuple[int, int] | None = None  # (device, inode) of the file the writer has
        self._wal: tuple[int, int] | None = None  # and of its write-ahead log

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    # -- lifecycle ---------------------------------------------------------------------------

    async def migrate(self) -> int:
        """Open the connections if needed and bring the schema to the current version.

        Read-only, open the reader alone and check the schema instead: nothing is written.
        """
        if self._closed:
            raise self._closed_error()
        self._refuse_no_place()
        if self._read_only:
            return await self._open_read_only()
        try:
            if self._wconn is None:
                self._wconn = await self._connect_writer()
                self._group = GroupCommit(self._wconn, self._now, self._append_failure)
                self._file = _identity(self._path)
            version = await self._apply_migrations(self._wconn)
            # There while a connection is open: SQLite removes it only as the last one closes.
            self._wal = self._wal or _identity(self._wal_path())
        except BaseException:
            await self._disconnect()
            raise
        return version

    async def applied_version(self) -> int:
        """The schema version the file holds, read without writing or creating anything: 0
        when there is no file yet, or no schema in it."""
        if self._closed:
            raise self._closed_error()
        self._refuse_no_place()
        if not self._path.is_file():
            return 0
        if self._rconn is None:
            self._rconn = self._connect_reader()
        version = await self._read_schema_version()
        if version == 0:
            await self._refuse_foreign_on_reader()
        return version

    async def schema_version(self) -> int:
        """The schema version applied now; a ``StoreError`` when the file at the path is no
        longer the one this store writes (deleted, moved or replaced under it): what it commits
        then goes to a file no restart reads, and readiness must say so."""
        if self._file is not None and self._moved(self._path, self._file):
            raise StoreError(
                f"{self._label}: the file this replica writes is no longer at that path"
                " (deleted, moved or replaced): restart it to open the one there"
            )
        wal = self._wal_path()
        if self._wal is not None and self._moved(wal, self._wal):
            # Its commits since go to a log no other process and no restart reads.
            raise StoreError(
                f"{self._label}: its write-ahead log {wal} was deleted or replaced under this"
                " replica: what it wrote since is lost at its next start; restart it now"
            )
        return await super().schema_version()

    def _wal_path(self) -> Path:
        """The write-ahead log SQLite keeps beside the file in WAL mode."""
        return self._path.with_name(self._path.name + "-wal")

    def _moved(self, path: Path, identity: tuple[int, int]) -> bool:
        """Whether ``path`` is no longer the file of ``identity`` (gone, or another one)."""
        try:
            return _identity(path) != identity
        except OSError as exc:
            raise StoreError(f"{self._label}: cannot see {path}: {exc.strerror}") from exc

    async def _shut_down(self) -> None:
        """Write what is queued and close both connections."""
        if self._group is not None:
            await self._group.drain()
        await self._disconnect()

    # -- journal: the write path -------------------------------------------------------------

    def submit(self, run_id: str, seq: int, epoch: int, entry: Entry) -> asyncio.Future[None]:
        """Queue an append now (written in submission order); the future settles after commit."""
        self._writer()  # fail fast when closed or not migrated
        assert self._group is not None
        item = PendingAppend(
            run_id=run_id,
            seq=seq,
            epoch=epoch,
            kind=entry.kind,
            body=entry_body(entry),
            projection=projection(entry),
            beside=beside_entry(run_id, entry, self._now, self._stamp),
            done=asyncio.get_running_loop().create_future(),
        )
        self._group.append(item)
        return item.done

    # -- work: wake-ups ----------------------------------------------------------------------

    async def enqueue_work(self, kind: str, payload: dict[str, Any]) -> int:
        """Add inbound work and wake this instance's waiters (other processes poll); its id."""
        params = (kind, work_payload(kind, payload), self._now())
        rows = await self._write("enqueue_work", sql.ENQUEUE_WORK, params)
        self._work_added.set()
        return int(rows[0][0])

    async def wait_for_work(self, timeout: float) -> None:
        """Return once this instance enqueued work, or after ``timeout`` (0.2 s at most)."""
        self._opened(self._wconn or self._rconn)  # fail fast when closed or not migrated
        await wait_for_event(self._work_added, min(timeout, _WORK_POLL))

    # -- connections and helpers -------------------------------------------------------------

    async def _connect_writer(self) -> SqliteWriter:
        """Open the writer: WAL, durable commits, enforced foreign keys."""
        self._refuse_read_only_file()

        def wal(conn: sqlite3.Connection) -> None:
            if _unversioned(conn):  # switched, another program's would not be as it was
                self._refuse_foreign(foreign_tables(conn))
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self._label}: cannot switch to WAL mode")

        pragmas = (
            self._connection_pragmas()
            + f"PRAGMA wal_autocheckpoint = {_WAL_PAGES};PRAGMA cache_size = -{_WRITER_CACHE_KIB};"
        )
        # WAL is the file's own setting, kept in its header: a file already in WAL mode opens
        # in it, so only a new (or another program's) file is switched.
        switch = _keep if in_wal_mode(self._path) else wal
        with self._errors("open"):
            return await SqliteWriter.open(self._path, pragmas, self._busy_timeout, setup=switch)

    def _connect_reader(self) -> SqliteReader:
        """Open the reader: autocommit, so every query sees the latest commit."""
        from storage.sqlite_reader import SqliteReader

        target: str | Path = reader_uri(self._path) if self._read_only else self._path
        with self._errors("open"):
            return SqliteReader.open(
                target,
                uri=self._read_only,
                busy_timeout=self._busy_timeout,
                setup=self._connection_pragmas() + "PRAGMA query_only = ON;",
            )

    async def _open_read_only(self) -> int:
        """Open the reader on a database whose schema this Kestrel can read.

        A database that does not exist yet reads as an empty journal; no file is created.
        """
        try:
            if self._rconn is None:
                exists = self._path.is_file()
                self._rconn = self._connect_reader() if exists else self._connect_empty()
            version = await self._read_schema_version()
        except BaseException:
            await self._disconnect()
            raise
        if version == 0:
            await self._refuse_foreign_on_reader()
        if version != SCHEMA_VERSION:
            raise StoreError(f"{self._label}: {sql.version_problem(version, SCHEMA_VERSION)}")
        return version

    def _connect_empty(self) -> SqliteReader:
        """An empty journal in memory, with the current schema, for a database not made yet."""
        from storage.sqlite_reader import SqliteReader

        scripts = [migration_script(version) for version in range(1, SCHEMA_VERSION + 1)]
        with self._errors("open"):
            return SqliteReader.open(
                ":memory:",
                uri=False,
                busy_timeout=self._busy_timeout,
                setup=CREATE_VERSION_TABLE + "".join(scripts) + "PRAGMA query_only = ON;",
            )

    async def _read_schema_version(self) -> int:
        """The applied version as the reader sees it; 0 without a version table."""
        try:
            rows = await self._read("read", APPLIED_VERSION, ())
        except StoreError as exc:
            if no_version_table(exc.__cause__):
                return 0
            raise
        try:
            return checked_version(rows[0][0])
        except Unreadable as exc:
            raise StoreError(f"{self._label}: {exc}") from exc

    def _connection_pragmas(self) -> str:
        # Not the busy timeout: each connection sets its own as it connects, with no statement.
        return f"PRAGMA foreign_keys = ON;PRAGMA synchronous = {self._synchronous};"

    def _refuse_no_place(self) -> None:
        """Refuse a path no journal can be at (a folder, a folder that does not exist), where
        SQLite would only say it cannot open it."""
        problem = path_problem(self._path)
        if problem:
            raise StoreError(f"{self._label}: {problem}")

    async def _refuse_foreign_on_reader(self) -> None:
        """Refuse, through the reader, a database with no schema that is another program's:
        `kestrel db migrate` would not make it Kestrel's own."""
        rows = await self._read("read", FOREIGN_TABLES, ())
        self._refuse_foreign([str(name) for (name,) in rows])

    def _refuse_foreign(self, tables: list[str]) -> None:
        if tables:
            raise StoreError(f"{self._label}: {sql.foreign_problem(tables, _OWN_FILE)}")

    def _refuse_read_only_file(self) -> None:
        """Refuse a file without write permission bits, even for root, whom SQLite lets write."""
        try:
            mode = self._path.stat().st_mode
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreError(f"{self._label}: cannot open: {exc.strerror}") from exc
        if stat.S_ISREG(mode) and not has_write_bits(mode):
            # A file nobody may read either (0000) is not "read-only": the mode says which.
            what = "read-only" if mode & _READ_BITS else "neither readable nor writable"
            raise StoreError(
                f"{self._label}: cannot open: the file is {what} (mode {stat.S_IMODE(mode):04o})"
            )

    async def _apply_migrations(self, writer: SqliteWriter) -> int:
        """Apply the missing migrations, one transaction each; refuse a newer schema."""
        if self._schema_is_current(writer):
            return SCHEMA_VERSION
        version = await self._schema_version(writer)
        if version == 0:
            with self._errors("migrate"):
                tables = await writer.transact(foreign_tables)
            self._refuse_foreign(tables)
        if version < SCHEMA_VERSION:
            with self._errors("migrate"):
                await writer.script(CREATE_VERSION_TABLE)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self._label}: schema version {version} is newer than this"
                f" Kestrel supports ({SCHEMA_VERSION}); upgrade Kestrel to open it"
            )
        while version < SCHEMA_VERSION:
            await self._apply_migration(writer, version + 1)
            version = await self._schema_version(writer)
        return version

    async def _apply_migration(self, writer: SqliteWriter, version: int) -> None:
        try:
            await writer.script(migration_script(version))
        except sqlite3.IntegrityError:
            pass  # another process applied this version first; the caller re-reads the version
        except sqlite3.Error as exc:
            raise self._failure(f"migration {version}", exc) from exc

    def _schema_is_current(self, writer: SqliteWriter) -> bool:
        """Whether the schema is this Kestrel's, read without the write lock: a version is only
        ever committed whole, so a current one needs no wait for a migration under way (any
        other answer, or a busy database, is checked again under the lock)."""
        try:
            with self._errors("migrate"):
                return writer.try_reading(applied_version) == SCHEMA_VERSION
        except Unreadable:
            return False  # said under the lock, as every version read is

    async def _schema_version(self, writer: SqliteWriter) -> int:
        try:
            with self._errors("migrate"):
                return await writer.transact(applied_version)
        except Unreadable as exc:
            raise StoreError(f"{self._label}: {exc}") from exc

    async def _disconnect(self) -> None:
        wconn, rconn = self._wconn, self._rconn
        self._wconn = self._rconn = None
        self._wal = None  # the last connection's close may remove it; the next open makes one
        if wconn is not None:
            with contextlib.suppress(sqlite3.Error):
                await wconn.close()
        if rconn is not None:
            await rconn.close()

    async def _read(self, action: str, statement: str, params: Params) -> list[Row]:
        """One query: inline on the idle writer when it ``_rides_writer``, else on the reader
        connection; a failure names its action."""
        text = SQLITE.sql(statement)
        with self._errors(action):
            if self._wconn is not None and self._rides_writer(action):
                rows = self._wconn.try_read(text, params)
                if rows is not None:
                    return rows
            return await self._reader().fetchall(text, params)

    def _rides_writer(self, action: str) -> bool:
        """Whether a read of kind ``action`` may run on the writer while it is idle."""
        if self._closed:
            return False
        return action in _POINT_READS or (action in _RUN_READS and self._rconn is None)

    async def _write(
        self, action: str, statement: str, params: Params, refused: Refusal | None = None
    ) -> list[Row]:
        """One statement in the next group commit; the rows it returned, once durable."""
        return (await self._transaction(action, [(statement, params)], refused))[0]

    async def _transaction(
        self, action: str, steps: Sequence[Step], refused: Refusal | None = None
    ) -> list[list[Row]]:
        """Statements run together in the next group commit; the rows of each."""

        def run(conn: sqlite3.Connection) -> list[list[Row]]:
            return [run_step(conn, statement, params) for statement, params in steps]

        return await self._transact(action, run, refused)

    async def _transact(
        self, action: str, body: Callable[[sqlite3.Connection], _T], refused: Refusal | None
    ) -> _T:
        """Run ``body`` in the next group commit (its own savepoint); its result once durable."""
        self._writer()  # fail fast when closed or not migrated
        assert self._group is not None
        with self._errors(action, refused):
            return await self._group.write(body)

    def _writer(self) -> SqliteWriter:
        if self._read_only and not self._closed:
            raise StoreError(f"{self._label}: opened read-only; cannot write")
        return self._opened(self._wconn)

    def _reader(self) -> SqliteReader:
        """The reader, opened on first need beside a migrated writer (a read-only store opens
        it in ``migrate``)."""
        if self._rconn is None and self._wconn is not None and not self._closed:
            self._rconn = self._connect_reader()
        return self._opened(self._rconn)

    def _violation(self, exc: Exception) -> Violation:
        """SQLite names the broken constraint only in its message."""
        return Violation.FOREIGN_KEY if "FOREIGN KEY" in str(exc) else Violation.OTHER

    def _append_failure(self, exc: Exception) -> StoreError:
        if isinstance(exc, sqlite3.Error):
            return self._failure("append", exc)
        return StoreError(f"{self._label}: append failed: {exc!r}")

    def _failure(self, action: str, exc: Exception) -> StoreError:
        """A sqlite3 error as a ``StoreError`` naming the file, the action and the cause."""
        cause = " ".join(str(exc).split()) or type(exc).__name__
        if "locked" in cause or "busy" in cause:
            cause += f" (still busy after the {self._busy_timeout:g} s busy timeout)"
        elif _cannot_open(cause) and not os.access(self._path.parent, os.W_OK):
            # SQLite does not say why: it makes the file, its -wal and -shm in that folder.
            cause += (
                f" (its folder {self._path.parent} cannot be written: a read-only file system,"
                " or another user's folder)"
            )
        elif _cannot_open(cause) and self._path.exists() and not os.access(self._path, os.R_OK):
            # Nor here: another user's file (kestrel serve's, mode 0600), read from on-call's shell.
            cause += f" (the file cannot be read as {_user()}: another user's file, or its mode)"
        return StoreError(f"{self._label}: {action} failed: {cause}")


def _cannot_open(cause: str) -> bool:
    """Whether SQLite's ``cause`` says it could not open (or make) the file or its -wal."""
    return "unable to open" in cause or "readonly database" in cause


def _user() -> str:
    """Who this process is, as a person reads it: the login name, else the uid."""
    import pwd

    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _unversioned(conn: sqlite3.Connection) -> bool:
    """Whether ``conn``'s database holds no schema version (one that is no version is refused
    by the migrations' own read, which says what stands there)."""
    try:
        return applied_version(conn) == 0
    except Unreadable:
        return False


def _keep(_conn: sqlite3.Connection) -> None:
    """A connection's setup that changes nothing."""


def _identity(path: Path) -> tuple[int, int] | None:
    """A file's (device, inode), the same file whatever its name; None when there is none."""
    try:
        found = path.stat()
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


async def open_sqlite(
    path: str | Path,
    *,
    synchronous: str = "FULL",
    read_only: bool = False,
    clock: Callable[[], datetime] = utcnow,
) -> SqliteStore:
    """Open the SQLite store at ``path`` and bring its schema up to date (read-only: check it)."""
    store = SqliteStore(path, synchronous=synchronous, read_only=read_only, clock=clock)
    return await migrated(store)
