"""``kestrel runs approve`` imports what deciding and finishing a run use, and not what only a
rare case needs: bench.cold times the whole process, and each of these came back unnoticed
once."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bot.cli.test_cli import kestrel

# The real command, which then writes the modules it imported to the file named by $MODULES.
# And whether the collector runs again once start-up is done (bot.collector).
WATCHED = """
import atexit, gc, json, os, sys
def record():
    found = {"modules": sorted(sys.modules), "collecting": gc.isenabled()}
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


def test_runs_approve_leaves_the_rare_cases_unimported(tmp_path: Path) -> None:
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    deferred = kestrel(
        tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ", env=cache
    )
    run = json.loads(deferred.stdout)
    modules = tmp_path / "modules.json"
    ids = [run["run_id"], run["requests"][0]["id"]]
    approved = kestrel(
        tmp_path,
        "runs",
        "approve",
        *ids,
        "--as",
        "U0BOSS",
        env={"MODULES": str(modules), **cache},
        script=WATCHED,
    )
    assert approved.returncode == 0, approved.stderr
    found = json.loads(modules.read_text())
    imported = set(found["modules"])
    assert "bot.run.supervisor" in imported  # it did decide and resume here
    assert [name for name in NOT_IMPORTED if name in imported] == []
    assert found["collecting"] is True
