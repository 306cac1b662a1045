"""``kestrel runs approve`` imports what deciding and finishing a run use, and not what only a
rare case needs: bench.cold times the whole process, and each of these came back unnoticed
once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.cold import PROMPT
from bench.commits import EXIT_SUSPENDED, workspace
from tests.bot.cli.test_cli import kestrel

# The real command, which then writes the modules it imported to the file named by $MODULES,
# and the protocol classes it created. And whether the collector runs again once start-up is
# done (bot.collector).
WATCHED = """
import atexit, gc, json, os, sys, typing
def record():
    protocols = [f"{c.__module__}.{c.__qualname__}" for c in typing.Protocol.__subclasses__()]
    found = {"modules": sorted(sys.modules), "protocols": protocols, "collecting": gc.isenabled()}
    open(os.environ["MODULES"], "w").write(json.dumps(found))
atexit.register(record)
from bot.cli.main import main
main()
"""
# Imported on first need only: a busy database (aiosqlite's thread), no --as nor $KESTREL_USER
# (the login name), a settings key to say "did you mean" of (difflib). Not at all: pydantic
# (the settings and catalogs are structs). Not when `run` read the same files before: PyYAML
# (the documents, and the catalog found clean, are read back from the kept folder). Nor click:
# the script reads the command itself (bot.cli.decisions).
NOT_IMPORTED = ("aiosqlite", "getpass", "difflib", "pydantic", "yaml", "click")
# With bench.cold's catalog (one command whose arguments need no JSON Schema library), not
# these either: tempfile and shutil (a command that writes nothing into its HOME), glob (a
# catalog named plainly), dataclasses (generated methods, 0.8 ms a class) and jsonschema; nor
# hashlib (its OpenSSL look-ups, 6 M instructions: bot.digest takes SHA-256 without it), nor
# copy (its failed search for Jython's module: a tool's schema is copied as JSON).
NOT_IMPORTED_BY_BENCH = (
    "tempfile",
    "shutil",
    "glob",
    "dataclasses",
    "jsonschema",
    "hashlib",
    "copy",
)
# Kestrel's own parts that deciding at the terminal never calls into: chat deliveries (a
# platform's), the run handles' protocols (types only), cron expressions (no schedule is set),
# the SQLite reader connection (every read of the command rides the writer's), the outbox's
# delivering (the store writes only its keys), arguments' provenance (no output precedes
# the run's first batch, the one approved), a run page's reader, the parsers of calls
# written as text (the model's answer holds no markup), the store's roles (protocols,
# for the type checker), and the PII guard's finders that the command's output ("restarted
# checkout", its exit status) holds nothing for: it names no secret and holds no number.
KESTRELS_UNUSED = (
    "bot.chat.inbound",
    "bot.chat.handles",
    "bot.config.cron",
    "storage.sqlite_reader",
    "bot.chat.outbox",
    "bot.run.provenance",
    "bot.chat.run_summary",
    "bot.llm.text_calls",
    "bot.store",
    *("bot.pii.credentials", "bot.pii.encoded", "bot.pii.labelled", "bot.pii.manifests"),
    *("bot.pii.numbers", "bot.pii.shapes", "bot.pii.web"),
)

# Protocols that only annotate, for the type checker: each class costs 0.16 M instructions to
# create (the store's roles are a module, above).
TYPE_CHECKERS_ONLY = (
    "bot.people.policy.Asked",
    "bot.people.policy.AskedStep",
    "bot.people.policy.Directory",
    "bot.cli.render.ShownStep",
    "bot.cli.render.ShownRequest",
    "bot.tools.base.ChecksArguments",
    "bot.tools.base.RunsSomething",
    "bot.chat.service.ChatStore",
    "bot.chat.service.ChatRuntime",
    "bot.chat.service.ReadStore",
    "bot.people.decisions.DecisionsStore",
    "bot.people.decisions.Shared",
    "bot.digest.Hash",
)


def approved_imports(folder: Path, *run: str, approver: str, env: dict[str, str]) -> dict[str, Any]:
    """What ``runs approve`` as ``approver`` imported, on the request that ``kestrel run`` with
    ``run`` left."""
    deferred = kestrel(folder, "run", *run, "--defer", "--json", env=env)
    assert deferred.returncode == EXIT_SUSPENDED, deferred.stderr
    started = json.loads(deferred.stdout)
    modules = folder / "modules.json"
    ids = [started["run_id"], started["requests"][0]["id"]]
    approved = kestrel(
        folder,
        *("runs", "approve", *ids, "--as", approver),
        env={"MODULES": str(modules), **env},
        script=WATCHED,
    )
    assert approved.returncode == 0, approved.stderr
    found: dict[str, Any] = json.loads(modules.read_text())
    assert "bot.run.supervisor" in found["modules"]  # it did decide and resume here
    return found


def test_runs_approve_leaves_the_rare_cases_unimported(tmp_path: Path) -> None:
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    run = ("checkout is failing", "--as", "U0REQ")
    found = approved_imports(tmp_path, *run, approver="U0BOSS", env=cache)
    assert [name for name in NOT_IMPORTED if name in found["modules"]] == []
    assert found["collecting"] is True


def test_runs_approve_of_the_cold_bench_imports_no_general_purpose_extras(tmp_path: Path) -> None:
    workspace(tmp_path)
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    found = approved_imports(tmp_path, PROMPT, "--as", "bob", approver="alice", env=cache)
    imported = set(found["modules"])
    assert [name for name in NOT_IMPORTED + NOT_IMPORTED_BY_BENCH if name in imported] == []


def test_runs_approve_of_the_cold_bench_leaves_kestrels_unused_parts(tmp_path: Path) -> None:
    workspace(tmp_path)
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    found = approved_imports(tmp_path, PROMPT, "--as", "bob", approver="alice", env=cache)
    assert [name for name in KESTRELS_UNUSED if name in found["modules"]] == []


def test_runs_approve_of_the_cold_bench_creates_no_protocol_that_only_annotates(
    tmp_path: Path,
) -> None:
    workspace(tmp_path)
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    found = approved_imports(tmp_path, PROMPT, "--as", "bob", approver="alice", env=cache)
    assert "bot.llm.base.ModelProvider" in found["protocols"]  # the record sees protocols
    assert [name for name in TYPE_CHECKERS_ONLY if name in found["protocols"]] == []
