"""A folder of files kept between processes (the schema checks' verdicts), trusted only if ours.

The folder is ``$XDG_CACHE_HOME/kestrel/kept/<key>`` (else ``~/.cache/kestrel/kept/<key>``). The
key covers the interpreter's version and the size and modification time of every module of
``bot``: an upgrade or an edited module starts a new folder, and folders no process used for a
week are removed. A folder another user could write to is never read. ``KESTREL_MODEL_CACHE=off``
(its name from when the folder kept models) turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time
from functools import cache
from pathlib import Path
from typing import Final

_PACKAGE: Final = Path(__file__).resolve().parent
_SWITCH: Final = "KESTREL_MODEL_CACHE"
_STALE_SECONDS: Final = 7 * 24 * 3600


def kept_folder(create: bool = False) -> Path | None:
    """The folder this code's kept files go in, if it may be trusted; ``create`` makes it."""
    if not create:
        return _trusted_folder()
    folder = _keyed_folder()
    if folder is None:
        return None
    if not folder.exists():
        try:
            folder.mkdir(mode=0o700, parents=True)
        except OSError:
            return None
        _forget_others(folder)
    return folder if _trusted(folder) and _trusted(folder.parent) else None


@cache
def _trusted_folder() -> Path | None:
    """``_keyed_folder`` if it exists and may be trusted, asked once a process."""
    folder = _keyed_folder()
    if folder is None or not (_trusted(folder) and _trusted(folder.parent)):
        return None
    return folder


def _forget_others(folder: Path) -> None:
    """Remove the folders kept for other code (an upgrade, edited modules) that no process
    added to for a week; another checkout's, in use, stays."""
    import shutil

    week_ago = time.time() - _STALE_SECONDS
    for other in folder.parent.iterdir():
        try:
            stale = other.stat().st_mtime < week_ago
        except OSError:
            continue
        if stale and other != folder and other.is_dir() and _trusted(other):
            shutil.rmtree(other, ignore_errors=True)


@cache
def _keyed_folder() -> Path | None:
    if os.environ.get(_SWITCH, "").lower() in ("off", "0", "false", "no"):
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    if not os.path.isabs(base):
        return None
    key = json.dumps([sys.version, *_stamps(_PACKAGE)]).encode()
    return Path(base) / "kestrel" / "kept" / hashlib.sha256(key).hexdigest()[:24]


def _stamps(folder: Path) -> list[str]:
    """Size and modification time of every module under ``folder``, by path."""
    found: list[str] = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and entry.name != "__pycache__":
                found += _stamps(Path(entry.path))
            elif entry.name.endswith(".py"):
                info = entry.stat()
                found.append(f"{entry.path}:{info.st_size}:{info.st_mtime_ns}")
    return sorted(found)


def _trusted(folder: Path) -> bool:
    try:
        info = folder.stat()
    except OSError:
        return False
    return info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
