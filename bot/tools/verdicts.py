"""Schema checks found clean, kept between processes so that a later one need not import
jsonschema (some 45 ms, a tenth of a whole ``kestrel runs approve``) to find the same again.

Two checks are kept, and only when they found nothing wrong: a catalog tool's parameters as a
JSON Schema (checked each time a catalog is read), and a gated call's arguments against them
(checked when the call asks for approval, and again when the approved call runs, usually in
another process). A verdict is an empty file named by the SHA-256 of everything the check reads:
the kind, the schema, the arguments, and the size and modification time of the jsonschema and
RE2 modules that do the checking; Kestrel's own modules key the folder (``bot.kept``).
So a verdict found is the one the check would give again, whatever changed meanwhile; the
folder is trusted only if it is ours alone (``bot.kept``), and
``KESTREL_MODEL_CACHE=off`` turns this off too.
"""

from __future__ import annotations

from typing import Any, Final

from bot.kept import keep, name_of, recall

# The kinds of check: a tool's parameters as a sound JSON Schema (patterns RE2 can run, type
# object), and a call's arguments valid against them.
SOUND_PARAMETERS: Final = "parameters"
VALID_ARGUMENTS: Final = "arguments"
_SUBFOLDER: Final = "verdicts"
# The modules whose code decides a check: a changed one (an upgrade) changes every key.
# (Top-level packages only: finding a submodule would import its package.)
CHECKERS: Final = ("jsonschema", "re2")


def found_clean(kind: str, *subjects: Any) -> bool:
    """Whether the ``kind`` check of ``subjects`` found nothing wrong before."""
    return recall(_SUBFOLDER, name_of(kind, *subjects, modules=CHECKERS)) is not None


def keep_clean(kind: str, *subjects: Any) -> None:
    """Keep that the ``kind`` check of ``subjects`` found nothing wrong (best effort)."""
    keep(_SUBFOLDER, name_of(kind, *subjects, modules=CHECKERS))
