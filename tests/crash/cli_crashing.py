"""The real ``kestrel`` command line with its store killed on cue: right after the N-th durable
append (or decision) of a kind, as ``child.py``'s ``--crash-after`` says it (``kind:N``).
Everything else is the command as a person runs it (``tests.fakes.warm_cli`` runs it so)."""

from __future__ import annotations

from typing import Any

import storage.postgres
import storage.sqlite
from tests.crash.crashing import CrashingPostgres, CrashingSqlite, CrashingStore


def crash_on_cue(crash: str) -> None:
    """Replace the stores where the command line's openers look them up with ones that die
    where ``crash`` (``kind:N``) says; before the command starts."""
    kind, _, nth = crash.partition(":")
    storage.sqlite.SqliteStore = _on_cue(CrashingSqlite, kind, int(nth or 1))  # type: ignore[misc]
    storage.postgres.PostgresStore = _on_cue(CrashingPostgres, kind, int(nth or 1))  # type: ignore[misc]


def _on_cue(store: type[CrashingStore], kind: str, nth: int) -> type[Any]:
    """``store``, each instance set to die after the ``nth`` durable write of ``kind``."""

    class OnCue(store):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.crash_after(kind, nth)

    return OnCue
