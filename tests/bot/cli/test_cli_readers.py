"""Inspecting commands read the journal without write access and without the write lock."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import pytest

from storage.postgres_schema import CREATE_VERSION_TABLE, SCHEMA_VERSION, migration_script
from storage.sqlite import SqliteStore
from tests.bot.cli.test_cli import ROOT, kestrel, one_line_error, write_config
from tests.fakes.processes import KESTREL, SETPRIV, clean_env, unprivileged
from tests.storage.conftest import postgres_dsn, postgres_schema


@pytest.fixture
def journal(tmp_path: Path) -> tuple[Path, str]:
    """A folder whose journal holds one suspended run (with an open request) and one ended."""
    deferred = kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json")
    run_id = json.loads(deferred.stdout)["run_id"]
    kestrel(tmp_path, "run", "checkout is failing")
    return tmp_path, run_id


def read_everything(folder: Path, run_id: str) -> None:
    """Every reading command succeeds and sees the journal."""
    outputs = {}
    for args in (
        ("runs", "list", "--json"),
        ("runs", "show", run_id, "--json"),
        ("runs", "pending"),
        ("audit", "--run", run_id),
        ("replicas",),
    ):
        result = kestrel(folder, *args)
        assert result.returncode == 0, (args, result.stderr)
        outputs[args[:2]] = result.stdout
    listed = json.loads(outputs[("runs", "list")])
    assert [r["status"] for r in listed] == ["completed", "suspended"]
    assert json.loads(outputs[("runs", "show")])["status"] == "suspended"
    assert "wait_approval" in outputs[("runs", "pending")]
    assert "request" in outputs[("audit", "--run")]
    assert "no live replicas" in outputs[("replicas",)]


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    path.chmod(0o444)
    try:
        yield
    finally:
        path.chmod(0o644)


def test_readers_work_on_a_read_only_file_and_change_nothing(journal: tuple[Path, str]) -> None:
    folder, run_id = journal
    db = folder / "kestrel.db"
    before = db.read_bytes()
    with read_only(db):
        read_everything(folder, run_id)
        assert "kestrel.db" in one_line_error(kestrel(folder, "run", "again"))  # writers refuse
    assert db.read_bytes() == before
    # Nothing was left behind: no -wal or -shm made with the read-only file's permissions.
    assert sorted(p.name for p in folder.glob("kestrel.db*")) == ["kestrel.db"]


def test_readers_work_on_a_read_only_file_in_a_read_only_folder(
    journal: tuple[Path, str],
) -> None:
    folder, run_id = journal
    db = folder / "kestrel.db"
    with read_only(db):
        folder.chmod(0o555)
        try:
            read_everything(folder, run_id)
        finally:
            folder.chmod(0o755)


needs_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or SETPRIV is None,
    reason="needs root and setpriv (util-linux) to drop the capabilities that pass permissions",
)


def as_another_user(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kestrel`` in ``folder`` as root reads the journal as another user would."""
    return subprocess.run(
        [*unprivileged(), *KESTREL, *args],
        cwd=folder,
        env=clean_env(),
        capture_output=True,
        text=True,
    )


@needs_setpriv
def test_readers_work_in_a_folder_they_cannot_write(journal: tuple[Path, str]) -> None:
    # A journal file they may write in a folder they may not (the service's folder): every
    # reader said "attempt to write a readonly database", making the -shm it does not need.
    folder, run_id = journal
    folder.chmod(0o555)
    try:
        listed = as_another_user(folder, "runs", "list", "--json")
        shown = as_another_user(folder, "runs", "show", run_id, "--json")
        written = as_another_user(folder, "run", "again")
    finally:
        folder.chmod(0o755)
    assert listed.returncode == 0, listed.stderr
    assert [r["status"] for r in json.loads(listed.stdout)] == ["completed", "suspended"]
    assert shown.returncode == 0 and json.loads(shown.stdout)["status"] == "suspended"
    # A writer makes its -wal there: it cannot, and says why.
    assert one_line_error(written).endswith(
        f"(its folder {folder} cannot be written: a read-only file system, or another user's"
        " folder)"
    )


@needs_setpriv
def test_a_journal_that_cannot_be_read_says_why(journal: tuple[Path, str]) -> None:
    # kestrel serve's journal (mode 0600, its own user's) read from on-call's shell said
    # "unable to open database file", and a file of mode 0000 "the file is read-only".
    folder, _run_id = journal
    db = folder / "kestrel.db"
    os.chown(db, 65534, 65534)
    db.chmod(0o600)
    listed = as_another_user(folder, "runs", "list")
    db.chmod(0o000)
    written = as_another_user(folder, "run", "again")
    os.chown(db, 0, 0)
    db.chmod(0o644)
    assert one_line_error(listed).endswith(
        "open failed: unable to open database file (the file cannot be read as root: another"
        " user's file, or its mode)"
    )
    assert one_line_error(written).endswith(
        "cannot open: the file is neither readable nor writable (mode 0000)"
    )


def test_readers_do_not_need_the_write_lock(journal: tuple[Path, str]) -> None:
    folder, run_id = journal
    holder = sqlite3.connect(folder / "kestrel.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # held by another process for as long as the test runs
    holder.execute("UPDATE runs SET prompt = 'uncommitted' WHERE id = ?", (run_id,))
    try:
        read_everything(folder, run_id)
        shown = json.loads(kestrel(folder, "runs", "list", "--json").stdout)
        assert "uncommitted" not in {r["prompt"] for r in shown}
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_missing_journal_reads_as_empty_and_is_not_created(tmp_path: Path) -> None:
    assert kestrel(tmp_path, "runs", "list", "--json").stdout.strip() == "[]"
    assert "no open requests" in kestrel(tmp_path, "runs", "pending").stdout
    assert kestrel(tmp_path, "audit").stdout == "no audit entries\n"
    assert kestrel(tmp_path, "audit", "--json").stdout.strip() == "[]"
    assert "run_nope" in one_line_error(kestrel(tmp_path, "runs", "show", "run_nope"))
    assert not list(tmp_path.glob("kestrel.db*"))


def test_a_reader_does_not_migrate_an_older_schema(tmp_path: Path) -> None:
    db = tmp_path / "kestrel.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT)")
        conn.execute("INSERT INTO schema_version VALUES (1, 'then')")
    conn.close()
    message = one_line_error(kestrel(tmp_path, "runs", "list"))
    assert "schema version 1" in message and "kestrel db migrate" in message
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone() == (1,)
    conn.close()


def test_a_reader_does_not_migrate_an_older_postgres_schema(tmp_path: Path) -> None:
    # A store shared with replicas of the release before, which a migration takes out of
    # service (their /readyz answers 503): reading it with the new release must not migrate.
    dsn = postgres_dsn()
    previous = SCHEMA_VERSION - 1

    async def scenario() -> tuple[list[str], int, str]:
        async with postgres_schema(dsn) as schema:
            admin = await asyncpg.connect(dsn, server_settings={"search_path": schema})
            try:
                await admin.execute(CREATE_VERSION_TABLE)
                for version in range(1, previous + 1):
                    await admin.execute(migration_script(version))
                    await admin.execute("INSERT INTO schema_version(version) VALUES ($1)", version)
                write_config(tmp_path, database=f"{dsn}?schema={schema}")
                said = []
                for args in (("runs", "list"), ("runs", "pending"), ("audit",), ("replicas",)):
                    result = await asyncio.to_thread(kestrel, tmp_path, *args)
                    said.append(one_line_error(result))
                applied = await admin.fetchval("SELECT MAX(version) FROM schema_version")
                await asyncio.to_thread(kestrel, tmp_path, "db", "migrate")
                listed = (await asyncio.to_thread(kestrel, tmp_path, "runs", "list")).stdout
            finally:
                await admin.close()
        return said, applied, listed

    said, applied, listed = asyncio.run(scenario())
    for message in said:
        assert f"schema version {previous}, this Kestrel reads" in message, message
        assert "run `kestrel db migrate` first" in message, message
    assert applied == previous
    assert listed == "no runs\n"


async def test_a_read_only_store_refuses_writes(journal: tuple[Path, str]) -> None:
    folder, run_id = journal
    store = SqliteStore(folder / "kestrel.db", read_only=True)
    try:
        await store.migrate()
        assert (await store.get_run(run_id)).status.value == "suspended"
        with pytest.raises(Exception, match="opened read-only"):
            await store.audit("me", "poke")
    finally:
        await store.close()
    assert os.access(folder / "kestrel.db", os.R_OK)


def test_pending_names_approvers_by_catalog_tag(tmp_path: Path) -> None:
    write_config(tmp_path, policy={"approvers": {"tag:prod": ["U0LEAD"]}})
    deferred = kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json")
    (request,) = json.loads(deferred.stdout)["requests"]
    assert request["tool"] == "restart_service"  # tagged prod in the demo catalog
    assert "may answer: U0LEAD" in kestrel(tmp_path, "runs", "pending").stdout


def test_pending_reads_flags_of_a_catalog_only_a_run_refuses(tmp_path: Path) -> None:
    write_config(tmp_path, policy={"approvers": {"tag:prod": ["U0LEAD"]}})
    kestrel(tmp_path, "run", "checkout is failing", "--defer")  # on the demo catalog
    catalog = (ROOT / "bot/demo/tools/ops.yaml").read_text()
    broken = catalog.replace('"^[a-z0-9][a-z0-9@._-]*$"', '"^(?!-)[a-z0-9]+$"')
    assert broken != catalog
    (tmp_path / "ops.yaml").write_text(broken)
    write_config(tmp_path, tools=["ops.yaml"], policy={"approvers": {"tag:prod": ["U0LEAD"]}})
    # Reading the store needs only the tools' flags.
    assert "may answer: U0LEAD" in kestrel(tmp_path, "runs", "pending").stdout
    # The catalog as a whole is refused where tools run or are checked: the pattern needs
    # lookahead, which RE2 cannot run.
    assert "linear time" in one_line_error(kestrel(tmp_path, "run", "checkout is failing"))
    assert "linear time" in kestrel(tmp_path, "tools", "check", "ops.yaml").stderr


def test_an_export_where_no_file_can_be_made_is_one_line(journal: tuple[Path, str]) -> None:
    # A path under a file (or on a read-only file system): the half-written file it never
    # made could not be removed either, and that failure was a traceback over the one line.
    folder, run_id = journal
    (folder / "notes.txt").write_text("a file, not a folder\n")

    exported = kestrel(folder, "runs", "export", run_id, "--html", "notes.txt/incident.html")

    assert exported.returncode == 2
    said = one_line_error(exported)
    assert said == "kestrel: cannot write notes.txt/incident.html: Not a directory"


def test_an_export_to_a_pipe_or_a_link_writes_through_it(journal: tuple[Path, str]) -> None:
    # The page was written beside the path and renamed over it: a FIFO (or, as root, a device
    # such as /dev/stdout or /dev/full) was replaced by a regular file, and a link by a copy.
    folder, run_id = journal
    fifo = folder / "page.fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    try:
        exported = kestrel(folder, "runs", "export", run_id, "--html", str(fifo))
        piped, _ = reader.communicate(timeout=10)
    finally:
        reader.kill()
    assert exported.returncode == 0, exported.stderr
    assert fifo.is_fifo() and run_id in piped and piped.rstrip().endswith("</html>")
    (folder / "pages").mkdir()
    link = folder / "latest.html"
    link.symlink_to(folder / "pages" / "incident.html")

    linked = kestrel(folder, "runs", "export", run_id, "--html", str(link))

    assert linked.returncode == 0, linked.stderr
    assert link.is_symlink() and run_id in (folder / "pages" / "incident.html").read_text()
    assert sorted(p.name for p in (folder / "pages").iterdir()) == ["incident.html"]


def test_an_export_to_a_dash_writes_to_stdout(journal: tuple[Path, str]) -> None:
    # `--html -` wrote a file named "-" into the folder and said "wrote -": `run -` reads
    # stdin, and a newcomer reads a dash as stdout here too.
    folder, run_id = journal
    exported = kestrel(folder, "runs", "export", run_id, "--html", "-")
    assert exported.returncode == 0, exported.stderr
    assert run_id in exported.stdout and exported.stdout.rstrip().endswith("</html>")
    assert not (folder / "-").exists()


def test_an_export_through_a_pipe_nobody_reads_says_nothing(journal: tuple[Path, str]) -> None:
    # ``runs export RUN --html /dev/stdout | head``: the reader left; as ``runs list | head``
    # the command stops without a word (it said "cannot write /dev/stdout: Broken pipe").
    folder, run_id = journal
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        argv = [*KESTREL, "runs", "export", run_id, "--html", "/dev/stdout"]
        exported = subprocess.run(
            argv, cwd=folder, env=clean_env(), stdout=write_end, stderr=subprocess.PIPE, text=True
        )
    finally:
        os.close(write_end)
    assert (exported.returncode, exported.stderr) == (0, "")


def test_export_reads_the_store_only_and_needs_no_model_key(journal: tuple[Path, str]) -> None:
    # A folder configured for a real provider, at a desk with no OPENAI_API_KEY, offline: the
    # export reads the journal alone, as `runs show` does, and changes nothing in it.
    folder, run_id = journal
    write_config(
        folder, database="kestrel.db", model={"provider": "openai", "name": "gpt-4.1-mini"}
    )
    db = folder / "kestrel.db"
    before = db.read_bytes()
    page = folder / "out" / "incident.html"
    page.parent.mkdir()

    with read_only(db):
        exported = kestrel(folder, "runs", "export", run_id, "--html", str(page))

    assert exported.returncode == 0, exported.stderr
    assert exported.stderr.startswith(f"wrote {page} (")
    html = page.read_text()
    assert run_id in html and "wait_approval" in html and html.rstrip().endswith("</html>")
    assert db.read_bytes() == before
    refused = one_line_error(kestrel(folder, "run", "again"))
    assert "OPENAI_API_KEY is not set" in refused  # what runs a model still needs it
