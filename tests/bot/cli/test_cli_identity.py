"""One identity at the terminal: ``--as``, else ``KESTREL_USER``, else the login name, shown
in the chat banner and used alike by ``chat``, ``run`` and the ``runs`` commands."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

from bot.domain import Session, new_id
from bot.records import REPLICA_STOPPING, RunRecord
from storage.sqlite import open_sqlite
from tests.bot.cli.test_cli import kestrel, one_line_error

PROMPT = "checkout is failing, can you look?"


def requester(folder: Path, run_id: str) -> str:
    shown = json.loads(kestrel(folder, "runs", "show", run_id, "--json").stdout)
    return str(shown["requested_by"])


def deferred(folder: Path, env: dict[str, str], *args: str) -> str:
    result = kestrel(folder, "run", PROMPT, "--defer", "--json", *args, env=env)
    assert result.returncode == 3, result.stderr
    return str(json.loads(result.stdout)["run_id"])


def test_the_login_name_is_the_default_and_kestrel_user_and_as_override_it(
    tmp_path: Path,
) -> None:
    by_login = deferred(tmp_path, {"USER": "erin"})
    by_variable = deferred(tmp_path, {"USER": "erin", "KESTREL_USER": "U0DAVE"})
    by_option = deferred(tmp_path, {"USER": "erin", "KESTREL_USER": "U0DAVE"}, "--as", "U0ANN")

    assert requester(tmp_path, by_login) == "erin"
    assert requester(tmp_path, by_variable) == "U0DAVE"
    assert requester(tmp_path, by_option) == "U0ANN"


def test_a_name_that_could_pass_for_another_is_refused(tmp_path: Path) -> None:
    many = "the policy reads that as many people, not one person"
    for name, why in (
        ("bob\n2026-12-04 16:00:00  alice  approve", "no control or format characters"),
        ("bob\u202e", "no control or format characters"),
        ("group:S0SRE", many),
        ("role:42", many),
        ("channel:C0OPS", many),
        ("*", many),
    ):
        refused = one_line_error(kestrel(tmp_path, "run", PROMPT, "--as", name))
        assert why in refused, refused
    login = one_line_error(kestrel(tmp_path, "run", PROMPT, env={"USER": "", "LOGNAME": "group:x"}))
    assert many in login  # the login name, the last resort, is checked alike
    assert json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout) == []
    assert requester(tmp_path, deferred(tmp_path, {}, "--as", "U0ANN:x")) == "U0ANN:x"
    assert requester(tmp_path, deferred(tmp_path, {"USER": "Ann Lee"})) == "Ann Lee"


def test_audit_rows_are_one_line_whatever_a_platform_sent_as_a_name(tmp_path: Path) -> None:
    run_id = deferred(tmp_path, {"USER": "erin"})
    with sqlite3.connect(tmp_path / "kestrel.db") as conn:
        conn.execute("UPDATE audit SET actor = 'erin\nforged row' WHERE run_id = ?", (run_id,))
    rows = kestrel(tmp_path, "audit", "--run", run_id).stdout.splitlines()
    assert rows and all(" erin forged row " in row for row in rows)


def test_chat_and_the_runs_commands_act_as_the_same_person(tmp_path: Path) -> None:
    me = {"USER": "erin"}
    # A run deferred by `run` is resumed in chat without naming anyone: the approval is asked
    # again inline (as erin), left for later, and the run suspends once more.
    run_id = deferred(tmp_path, me)
    chatted = kestrel(tmp_path, "chat", stdin=f"/resume {run_id}\nl\n", env=me)
    assert chatted.returncode == 0, chatted.stderr
    assert "You are erin (--as or KESTREL_USER to change it)." in chatted.stdout.splitlines()[1]
    assert "approval needed: restart_service" in chatted.stdout
    assert "may not resume" not in chatted.stdout

    # A run started in chat is cancelled from the command line, as the same person.
    kestrel(tmp_path, "chat", stdin=f"{PROMPT}\nl\n", env=me)
    runs = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)
    in_chat = next(run["run_id"] for run in runs if run["run_id"] != run_id)
    cancelled = kestrel(tmp_path, "runs", "cancel", in_chat, env=me)
    assert cancelled.returncode == 0 and cancelled.stdout.strip() == "cancelled", cancelled.stderr
    cancelled = kestrel(tmp_path, "runs", "cancel", run_id, env=me)
    assert cancelled.stdout.strip() == "cancelled", cancelled.stderr

    audit = json.loads(kestrel(tmp_path, "audit", "--json").stdout)
    assert {row["actor"] for row in audit if row["action"] in ("resume", "cancel")} == {"erin"}


async def held_run(db: Path, owner: str, lease: float) -> str:
    """A running run whose lease ``owner`` holds for ``lease`` seconds (its process gone)."""
    store = await open_sqlite(db)
    try:
        await store.migrate()
        session = Session(id=new_id("ses"))
        run = RunRecord(id=new_id("run"), session_id=session.id, requested_by="erin")
        await store.create_run(run, owner, lease, session=session)
        return run.id
    finally:
        await store.close()


def held_by_the_dead(run_id: str) -> str:
    """The start of a refusal naming ``held_run``'s dead owner and its lease (600 s, a second
    or so of it gone), as a pattern."""
    return (
        rf"kestrel: run {run_id} is held by host:42:dead, whose lease expires in (59\d|600) s"
        r" unless host:42:dead is alive and renews it"
    )


async def heartbeat(db: Path, owner: str, info: str = "") -> None:
    store = await open_sqlite(db)
    try:
        await store.heartbeat(owner, info)
    finally:
        await store.close()


async def test_resume_of_a_run_whose_owner_died_says_when_and_what_then(tmp_path: Path) -> None:
    db = tmp_path / "kestrel.db"
    run_id = await held_run(db, "host:42:dead", 600)
    me = {"USER": "erin"}

    refused = one_line_error(kestrel(tmp_path, "runs", "resume", run_id, env=me))
    then = f"; then `kestrel runs resume {run_id}` takes it over"
    assert re.fullmatch(held_by_the_dead(run_id) + re.escape(then), refused), refused

    await heartbeat(db, "host:7:serve")  # a live `kestrel serve` adopts orphans
    refused = one_line_error(kestrel(tmp_path, "runs", "resume", run_id, env=me))
    assert refused.endswith("; then a kestrel serve replica (host:7:serve) adopts it"), refused

    await heartbeat(db, "host:42:dead")  # the owner is a live replica after all
    refused = one_line_error(kestrel(tmp_path, "runs", "resume", run_id, env=me))
    assert refused == f"kestrel: run {run_id} is live on replica host:42:dead, which drives it now"


async def test_a_stopping_replicas_claim_is_shown_running_out_not_driven(tmp_path: Path) -> None:
    # A replica took the run's lease as it began to stop and left it to expire: it drives
    # nothing. A resume and `kestrel replicas` say when the claim runs out, and who then goes on.
    db = tmp_path / "kestrel.db"
    run_id = await held_run(db, "host:42:old", 600)
    await heartbeat(db, "host:42:old")
    await heartbeat(db, "host:42:old", REPLICA_STOPPING)
    await heartbeat(db, "host:42:old")  # a heartbeat taken as it stopped: still stopping
    await heartbeat(db, "host:7:serve")
    me = {"USER": "erin"}

    refused = one_line_error(kestrel(tmp_path, "runs", "resume", run_id, env=me))

    assert re.fullmatch(
        rf"kestrel: run {run_id} is held by host:42:old, which is stopping: its claim expires"
        r" at \d\d:\d\d:\d\d UTC \(in (59\d|600) s\) unless it hands the run back first;"
        r" then a kestrel serve replica \(host:7:serve\) adopts it",
        refused,
    ), refused
    listed = kestrel(tmp_path, "replicas").stdout.splitlines()
    assert re.fullmatch(r"host:42:old  seen \d+s ago  stopping: 1 run\(s\) held", listed[0])
    assert re.fullmatch(
        rf"    {run_id}  stopping, claim expires at \d\d:\d\d:\d\d UTC \(in (59\d|600)s\)",
        listed[1],
    ), listed
    assert re.fullmatch(r"host:7:serve  seen \d+s ago  0 live run\(s\)", listed[2]), listed


async def test_cancel_of_a_held_run_is_asked_of_its_holder_and_of_an_ended_one_refused(
    tmp_path: Path,
) -> None:
    db = tmp_path / "kestrel.db"
    run_id = await held_run(db, "host:42:dead", 600)
    me = {"USER": "erin"}

    # Held elsewhere: asked of the holder through the store (or of whoever takes it up).
    asked = kestrel(tmp_path, "runs", "cancel", run_id, env=me)
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.strip() == (
        "cancelling: host:42:dead holds the run and ends it at its next step, unless it"
        " finishes first (if it died, whoever takes the run up ends it)"
    )
    audit = kestrel(tmp_path, "audit", "--run", run_id, env=me).stdout
    assert " erin " in audit and " cancel " in audit and "asked of host:42:dead" in audit

    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET status = 'completed', owner = '' WHERE id = ?", (run_id,))
    ended = one_line_error(kestrel(tmp_path, "runs", "cancel", run_id, env=me))
    assert ended == f"kestrel: run {run_id} already ended (completed): nothing to cancel"


async def test_resume_of_a_held_run_asked_to_cancel_says_it_ends_cancelled(
    tmp_path: Path,
) -> None:
    db = tmp_path / "kestrel.db"
    run_id = await held_run(db, "host:42:dead", 600)
    me = {"USER": "erin"}
    assert kestrel(tmp_path, "runs", "cancel", run_id, env=me).returncode == 0

    refused = one_line_error(kestrel(tmp_path, "runs", "resume", run_id, env=me))

    # Not as if it would go on once taken over: whoever takes it up ends it, cancelled.
    then = (
        f"; then `kestrel runs resume {run_id}` takes it over;"
        " it was asked to cancel: it ends cancelled wherever it is driven"
    )
    assert re.fullmatch(held_by_the_dead(run_id) + re.escape(then), refused), refused


def test_an_empty_as_is_refused_not_read_as_the_login_name(tmp_path: Path) -> None:
    run_id = deferred(tmp_path, {"USER": "erin"})
    request_id = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)["requests"][
        0
    ]["id"]
    for args in (
        ("run", PROMPT, "--as", ""),
        ("runs", "approve", run_id, request_id, "--as", " "),
        ("runs", "approve", run_id, request_id, "--as="),
        ("runs", "cancel", run_id, "--as", ""),
    ):
        refused = kestrel(tmp_path, *args, env={"USER": "erin", "KESTREL_USER": "U0DAVE"})
        assert refused.returncode == 2, refused.stdout
        assert one_line_error(refused) == "kestrel: --as: the name is empty", args
    audited = json.loads(kestrel(tmp_path, "audit", "--json").stdout)
    assert [row["action"] for row in audited] == ["request"]
    assert len(json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)) == 1
    assert json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)["requests"]
