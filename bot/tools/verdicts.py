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

import hashlib
import json
import os
from functools import cache
from importlib.util import find_spec
from typing import Any, Final

from bot.kept import kept_folder

# The kinds of check: a tool's parameters as a sound JSON Schema (patterns RE2 can run, type
# object), and a call's arguments valid against them.
SOUND_PARAMETERS: Final = "parameters"
VALID_ARGUMENTS: Final = "arguments"
_SUBFOLDER: Final = "verdicts"
# The modules whose code decides a check: a changed one (an upgrade) changes every key.
# (Top-level packages only: finding a submodule would import its package.)
_CHECKERS: Final = ("jsonschema", "re2")


def found_clean(kind: str, *subjects: Any) -> bool:
    """Whether the ``kind`` check of ``subjects`` found nothing wrong before."""
    folder = kept_folder()
    name = _name(kind, subjects)
    return folder is not None and name is not None and (folder / _SUBFOLDER / name).exists()


def keep_clean(kind: str, *subjects: Any) -> None:
    """Keep that the ``kind`` check of ``subjects`` found nothing wrong (best effort)."""
    folder = kept_folder(create=True)
    name = _name(kind, subjects)
    if folder is None or name is None:
        return
    try:
        (folder / _SUBFOLDER).mkdir(mode=0o700, exist_ok=True)
        (folder / _SUBFOLDER / name).touch()
    except OSError:  # a read-only or full disk: checked again next time
        return


def _name(kind: str, subjects: tuple[Any, ...]) -> str | None:
    """The verdict's file name; None if a subject is not plain JSON (never kept)."""
    try:
        if not all(map(_plain, subjects)):
            return None
    except RecursionError:  # nested deeper than a check would go: left to the check to say
        return None
    text = json.dumps([kind, _checker_stamps(), *subjects], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _plain(value: Any) -> bool:
    """Whether ``value`` is JSON that ``json.dumps`` writes as no other value: no tuple (it
    would read as a list, which a schema tells from it) and no key but text (1 would read
    as "1", and a schema's property named 1 matches no argument)."""
    if isinstance(value, dict):
        return all(isinstance(key, str) and _plain(item) for key, item in value.items())
    if isinstance(value, list):
        return all(map(_plain, value))
    return value is None or isinstance(value, str | int | float)


@cache
def _checker_stamps() -> list[str]:
    """Size and modification time of each checking module, found without importing it."""
    stamps = []
    for module in _CHECKERS:
        spec = find_spec(module)
        origin = spec.origin if spec is not None else None
        try:
            info = os.stat(origin) if origin else None
        except OSError:
            info = None
        stamps.append(f"{origin}:{info.st_size}:{info.st_mtime_ns}" if info else f"{module}:?")
    return stamps
