"""The real ``kestrel`` command line with its store killed on cue: right after the N-th durable
append (or decision) of a kind, as ``child.py``'s ``--crash-after`` says it, read from
``CRASH_AFTER`` (``kind:N``). Everything else is the command as a person runs it."""

from __future__ import annotations

import os
from typing import Any

import storage.postgres
import storage.sqlite
from bot.cli.main import main
from tests.crash.crashing import CrashingPostgres, CrashingSqlite, CrashingStore

CRASH_VAR = "CRASH_AFTER"


def on_cue(store: type[CrashingStore]) -> type[Any]:
    """``store``, each instance set to die where ``CRASH_AFTER`` says."""
    kind, _, nth = os.environ[CRASH_VAR].partition(":")

    class OnCue(store):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.crash_after(kind, int(nth or 1))

    return OnCue


if __name__ == "__main__":
    # Replaced where the command line's openers look them up, as the process starts.
    storage.sqlite.SqliteStore = on_cue(CrashingSqlite)  # type: ignore[misc]
    storage.postgres.PostgresStore = on_cue(CrashingPostgres)  # type: ignore[misc]
    main()
