"""A folder of files kept between processes, trusted only if ours: the schema checks' verdicts,
and the documents (settings, catalogs, scripts) read before, so that a later process reads them
back without importing the parsers and checkers that made them.

The folder is ``$XDG_CACHE_HOME/kestrel/kept/<key>`` (else ``~/.cache/kestrel/kept/<key>``). The
key covers the interpreter's version and the size and modification time of every module of
``bot``: an upgrade or an edited module starts a new folder, and folders no process used for a
week are removed. A folder another user could write to is never read. ``KESTREL_MODEL_CACHE=off``
(its name from when the folder kept models) turns it off.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import time
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Final

from bot.digest import sha256
from bot.nesting import MAX_DEPTH

_PACKAGE: Final = Path(__file__).resolve().parent
_SWITCH: Final = "KESTREL_MODEL_CACHE"
_STALE_SECONDS: Final = 7 * 24 * 3600


def name_of(*parts: Any, modules: tuple[str, ...] = ()) -> str | None:
    """A kept file's name: the SHA-256 of ``parts`` and of the code of ``modules`` (packages
    whose upgrade changes what was kept); None if a part is not plain JSON (never kept)."""
    if not all(map(is_plain, parts)):
        return None
    text = json.dumps([_module_stamps(modules), *parts], sort_keys=True)
    return sha256(text.encode()).hexdigest()


def is_plain(value: Any) -> bool:
    """Whether ``value`` is JSON that ``json.dumps`` writes as no other value and ``json.loads``
    reads back as itself: no tuple (it would read as a list), no key but text (1 would read as
    "1"), no list or mapping in two places (a YAML alias: written out at each place, which an
    alias of aliases makes exponential), no int too long to write as text (Python refuses past
    4,300 digits, where YAML reads a hex one), and nested no deeper than a journal's values."""
    return _plain(value, set(), MAX_DEPTH)


def _plain(value: Any, seen: set[int], depth: int) -> bool:
    if isinstance(value, dict | list):
        if id(value) in seen or depth == 0:
            return False
        seen.add(id(value))
    if isinstance(value, dict):
        return all(
            isinstance(key, str) and _plain(item, seen, depth - 1) for key, item in value.items()
        )
    if isinstance(value, list):
        return all(_plain(item, seen, depth - 1) for item in value)
    if isinstance(value, int):
        return _writable(value)
    return value is None or isinstance(value, str | float)


def _writable(number: int) -> bool:
    """Whether ``str`` writes ``number`` (within ``sys.get_int_max_str_digits``, 0 for none):
    3 bits a digit at most is a bound well within the limit (a digit holds 3.32)."""
    limit = sys.get_int_max_str_digits()
    return limit == 0 or number.bit_length() <= 3 * limit


def recall(subfolder: str, name: str | None) -> bytes | None:
    """What was kept as ``name`` in ``subfolder``; None if nothing was, or no folder is trusted."""
    folder = kept_folder()
    if folder is None or name is None:
        return None
    # Joined as text: a Path's two joins a recall cost 0.18 M instructions of a start.
    path = os.path.join(folder, subfolder, name)
    try:
        # Not blocking, not through a link: a FIFO or a device put there is no kept file, and
        # must not hang or flood the process that reads it.
        found = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    with open(found, "rb") as file:
        try:
            return file.read() if stat.S_ISREG(os.fstat(found).st_mode) else None
        except OSError:
            return None


def recall_json(subfolder: str, name: str | None) -> tuple[bool, Any]:
    """``(True, value)`` for a value ``keep_json`` kept as ``name``; ``(False, None)`` if none
    was, or what was kept is cut short (a full disk: worked out again, and kept again)."""
    kept = recall(subfolder, name)
    if kept is None:
        return False, None
    try:
        return True, json.loads(kept)
    except ValueError:
        return False, None


def keep_json(subfolder: str, name: str | None, value: Any) -> None:
    """Keep ``value`` as JSON if JSON gives it back as it is (``is_plain``); else nothing."""
    if is_plain(value):
        keep(subfolder, name, json.dumps(value).encode())


def keep(subfolder: str, name: str | None, data: bytes = b"") -> None:
    """Keep ``data`` as ``name`` in ``subfolder``, whole or not at all (best effort)."""
    folder = kept_folder(create=True)
    if folder is None or name is None:
        return
    import tempfile  # only to keep: a process that finds everything kept never writes

    try:
        (folder / subfolder).mkdir(mode=0o700, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder / subfolder, delete=False) as out:
            try:
                out.write(data)
                out.close()
                os.replace(out.name, folder / subfolder / name)
            except OSError:  # a full disk: no part of a file left behind, by each process
                os.unlink(out.name)
                raise
    except OSError:  # a read-only or full disk: worked out again next time
        return


def _module_stamps(modules: tuple[str, ...]) -> list[str]:
    """Size and modification time of each module, found without importing it."""
    return [_module_stamp(module) for module in modules]


@cache
def _module_stamp(module: str) -> str:
    """``_module_stamps``' of one module, found once a process: the parser's and the checkers'
    lists share modules (``yaml`` in two, ``jsonschema`` and ``re2`` in two), and finding one
    not imported searches every folder of the path again."""
    spec = find_spec(module)
    origin = spec.origin if spec is not None else None
    try:
        info = os.stat(origin) if origin else None
    except OSError:
        info = None
    return f"{origin}:{info.st_size}:{info.st_mtime_ns}" if info else f"{module}:?"


def kept_folder(create: bool = False) -> Path | None:
    """The folder this code's kept files go in, if it may be trusted; ``create`` makes it."""
    if not create:
        return _trusted_folder()
    folder = _keyed_folder()
    if folder is None:
        return None
    if not folder.exists():
        root(create=True)
        try:
            folder.mkdir(mode=0o700)
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


def root(create: bool = False) -> Path | None:
    """The folder every code's kept folders are in (``~/.cache/kestrel/kept``), whether or not
    keeping is turned off: catalog commands are kept out of it, as it holds the documents read
    (a settings file may hold a secret). ``create`` makes it, for this user only (best effort)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    found = Path(base) / "kestrel" / "kept" if os.path.isabs(base) else None
    if found is not None and create:
        # 0o700, not the umask's mode: a group-writable one (umask 002) is never trusted. A
        # read-only cache home: nothing is kept there either.
        with contextlib.suppress(OSError):
            found.mkdir(mode=0o700, parents=True, exist_ok=True)
    return found


@cache
def _keyed_folder() -> Path | None:
    found = root()
    if found is None or os.environ.get(_SWITCH, "").lower() in ("off", "0", "false", "no"):
        return None
    key = json.dumps([sys.version, *sorted(_stamps(str(_PACKAGE)))]).encode()
    return found / sha256(key).hexdigest()[:24]


def _stamps(folder: str) -> list[str]:
    """Size and modification time of every module under ``folder``, by path (unsorted).

    Paths as text, sorted once by the caller: every process that keeps or recalls walks the
    package's 140 modules, and a ``Path`` per folder and a sort per folder were a fifth of it
    (0.6 M instructions of a ``runs approve``)."""
    found: list[str] = []
    with os.scandir(folder) as entries:
        for entry in entries:
            name = entry.name
            if entry.is_dir(follow_symlinks=False):
                if name != "__pycache__":
                    found += _stamps(entry.path)
            elif name.endswith(".py"):
                info = entry.stat()
                found.append(f"{entry.path}:{info.st_size}:{info.st_mtime_ns}")
    return found


def _trusted(folder: Path) -> bool:
    try:
        info = folder.stat()
    except OSError:
        return False
    return info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
