"""Models' validators kept between processes: built once, read back after.

A ``KeptModel`` (the settings' sections, the catalog's) is built on first use
(``defer_build``): pydantic turns its fields into a core schema (0.3 to 1.5 ms a
model, and its schema machinery the first time, some 15 ms), then pydantic-core compiles that
into a validator and a serializer (about 0.05 ms). A command that loads the settings uses a
dozen models, so building them was much of its start. Here the core schema of
each model is written once, the first time it is built, and every later process compiles it
from that file instead of generating it again.

The files are keyed by everything the schema is made from: the pydantic and pydantic-core
versions, the interpreter's, and the size and modification time of every module of ``bot``
(a model's fields may name types of any of them). Schemas only are kept, with their metadata
(JSON-schema hints, never read by a validator) left out; a file that cannot be read, or a
folder another user could write to, is ignored and the model built as before. The folder is
``$XDG_CACHE_HOME/kestrel/models`` (else ``~/.cache/kestrel/models``); ``KESTREL_MODEL_CACHE=off``
turns it off.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import sys
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import pydantic
import pydantic_core
from pydantic import BaseModel, ConfigDict
from pydantic_core import SchemaSerializer, SchemaValidator

if TYPE_CHECKING:
    from pydantic._internal._mock_val_ser import AttemptRebuild, MockValSer

try:  # private to pydantic: a release that moves it leaves every model built as pydantic does
    from pydantic._internal._mock_val_ser import MockValSer as _Mock
except ImportError:
    _Mock = None  # type: ignore[assignment,misc]

_PACKAGE: Final = Path(__file__).resolve().parent
_SWITCH: Final = "KESTREL_MODEL_CACHE"
_STALE_SECONDS: Final = 7 * 24 * 3600


class KeptModel(BaseModel):
    """A model built on first use, whose schema is kept for later processes."""

    model_config = ConfigDict(defer_build=True)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Each model's first use reads its kept schema back, or builds and keeps it."""
        super().__pydantic_init_subclass__(**kwargs)
        defer_through_cache(cls)


def defer_through_cache(cls: type[BaseModel]) -> None:
    """Make ``cls``'s first use read its schema back from the cache, else build and keep it."""
    if _Mock is None or cls.__pydantic_complete__ or not cls.__module__.startswith("bot."):
        return  # no hook to use, built already, or defined outside the package the key covers
    message = f"{cls.__name__} is not fully defined"
    kinds: tuple[Literal["validator", "serializer"], ...] = ("validator", "serializer")
    try:
        mocks: dict[str, MockValSer[Any]] = {
            f"__pydantic_{kind}__": _Mock(
                message,
                code="class-not-fully-defined",
                val_or_ser=kind,
                attempt_rebuild=_first_use(cls, f"__pydantic_{kind}__"),
            )
            for kind in kinds
        }
    except TypeError:  # a pydantic whose hook takes other arguments: left as pydantic made it
        return
    for attr, mock in mocks.items():
        setattr(cls, attr, mock)


def _first_use(cls: type[BaseModel], attr: str) -> AttemptRebuild[Any]:
    def complete(*, parent_namespace_depth: int = 2) -> Any:  # noqa: ARG001 (asked for by name)
        if not _restore(cls, attr) and cls.model_rebuild(raise_errors=False) is not False:
            _keep(cls)
        found = getattr(cls, attr)
        return None if isinstance(found, _Mock) else found

    return complete


def _restore(cls: type[BaseModel], attr: str) -> bool:
    """Compile ``cls``'s validator or serializer (``attr``) from its kept schema; False if
    none. Each is compiled on its own first use: a model nested in another is validated on
    its own (built in code) but serialized only inside its parent, whose serializer holds its
    schema, so its own serializer is never needed."""
    arguments = _kept_arguments(cls)
    if arguments is None:
        return False
    try:
        if attr == "__pydantic_validator__":
            compiled: Any = SchemaValidator(*arguments)
        else:
            compiled = SchemaSerializer(*arguments[:2])
    except Exception:  # unreadable after all: built instead (and written again)
        return False
    setattr(cls, attr, compiled)
    if not isinstance(getattr(cls, _OTHER[attr]), _Mock):
        _read.pop(cls, None)  # both compiled: the schema is not needed again
    return True


_OTHER: Final = {
    "__pydantic_validator__": "__pydantic_serializer__",
    "__pydantic_serializer__": "__pydantic_validator__",
}
# Schemas read back and not yet compiled into both a validator and a serializer.
_read: dict[type[BaseModel], tuple[Any, ...]] = {}


def _kept_arguments(cls: type[BaseModel]) -> tuple[Any, ...] | None:
    """What ``SchemaValidator()`` takes for ``cls``, read from its file once; None if there
    is no file, or it cannot be read."""
    found = _read.get(cls)
    if found is not None:
        return found
    folder = _folder()
    if folder is None:
        return None
    try:
        arguments: tuple[Any, ...] = pickle.loads((folder / _name(cls)).read_bytes())
    except Exception:  # absent, or unreadable: built instead (and written again)
        return None
    _read[cls] = arguments
    return arguments


def _keep(cls: type[BaseModel]) -> None:
    """Write ``cls``'s freshly built schema for the next processes (best effort)."""
    folder = _folder(create=True)
    validator = cls.__pydantic_validator__
    if folder is None or type(validator) is not SchemaValidator:
        return  # no folder, or a pydantic plugin wraps the validator: nothing to keep
    reduced: Any = validator.__reduce__()
    given: tuple[Any, ...] = reduced[1]  # what SchemaValidator() was given
    schema, *options = given
    import tempfile  # here: only a model's first build writes (shutil likewise, below)

    try:
        data = pickle.dumps((_without_metadata(schema), *options))
        with tempfile.NamedTemporaryFile(dir=folder, delete=False) as out:
            out.write(data)
        os.replace(out.name, folder / _name(cls))
    except Exception:  # a schema holding something pickle cannot name, a full disk
        return


def _without_metadata(value: Any) -> Any:
    """A core schema without its ``metadata`` (JSON-schema hints, local functions)."""
    if isinstance(value, dict):
        return {k: _without_metadata(v) for k, v in value.items() if k != "metadata"}
    if isinstance(value, list):
        return [_without_metadata(item) for item in value]
    return value


def _name(cls: type[BaseModel]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def kept_folder(create: bool = False) -> Path | None:
    """The folder this code's kept files go in, if it may be trusted; ``create`` makes it."""
    return _folder(create)


def _folder(create: bool = False) -> Path | None:
    """This code's folder in the cache, if it may be trusted (ours, no one else may write)."""
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
    parts = [sys.version, pydantic.VERSION, pydantic_core.__version__, *_stamps(_PACKAGE)]
    key = pydantic_core.to_json(parts)
    return Path(base) / "kestrel" / "models" / hashlib.sha256(key).hexdigest()[:24]


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
