"""Domain values as JSON text and back: how entries, requests and decisions are stored."""

from __future__ import annotations

from functools import cache
from typing import Any, Final, TypeVar

import msgspec

from bot.patterns import on_use

T = TypeVar("T")

Unreadable = msgspec.DecodeError
"""Raised for a text that is not JSON, or not the type asked for (``msgspec.ValidationError``)."""

_ENCODER: Final = msgspec.json.Encoder()
# Where msgspec says a problem is (``$.calls[0]``), and the field a missing or unknown one names.
_PATH_PART: Final = on_use(r"[^.\[\]`]+")
_NAMED_FIELD: Final = on_use(r"^Object (?:contains unknown|missing required) field `([^`]+)`")


def to_json(value: object) -> str:
    """``value`` as compact JSON text (fields in their declared order)."""
    return _ENCODER.encode(value).decode()


def checked_json(value: msgspec.Struct) -> str:
    """``value`` as ``to_json`` writes it, once it reads back as its own type (``Unreadable``
    if it would not; a value that is no JSON at all raises ``TypeError``)."""
    text = _ENCODER.encode(value)
    try:
        _decoder(type(value)).decode(text)
    except RecursionError as exc:
        raise Unreadable("nested too deeply to be read") from exc
    return text.decode()


def to_plain(value: object) -> Any:
    """``value`` as JSON's kinds of Python values: dicts, lists, strings, numbers."""
    return msgspec.to_builtins(value)


def from_json(text: str | bytes, kind: type[T]) -> T:
    """The ``kind`` stored as ``text``; ``Unreadable`` if it is not one."""
    try:
        decoded: T = _decoder(kind).decode(text)  # type: ignore[arg-type]
    except RecursionError as exc:  # nothing Kestrel writes nests this deep (bot.nesting)
        raise Unreadable("nested too deeply to be read") from exc
    return decoded


def from_plain(value: Any, kind: type[T]) -> T:
    """The ``kind`` that ``value`` (JSON's kinds of values) describes; ``Unreadable`` if none."""
    return msgspec.convert(value, kind)


def prepare(kind: Any) -> None:
    """Inspect ``kind``'s types now (its decoder built), not on its first write or read."""
    _decoder(kind)


@cache
def _decoder(kind: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(kind)


def problem(exc: msgspec.ValidationError) -> tuple[str, str]:
    """Where a value broke its type, dotted (``calls.0.name``: a missing or unknown field is
    named last, where people look for it), and why; the place is empty for the whole value."""
    cause, _, at = str(exc).partition(" - at `")
    # A key's problem is ``at `key` in `$.arguments```: the place is what follows the last ``$``.
    parts = _PATH_PART.findall(at.rpartition("$")[2])
    named = _NAMED_FIELD.match(cause)
    if named:
        parts.append(named.group(1))
    if at.startswith("key`"):
        cause += " (for a key)"
    return ".".join(parts), cause
