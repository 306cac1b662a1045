"""What a JSON Schema check says of one argument, as a line a model or a person reads whole:
the refused value quoted only so far, and a size refused as sizes.

jsonschema's messages quote the whole value (``[{…}, … 200 plan steps] is too long``): a list
or a text past a limit was answered with all of it, and with nothing of the limit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

# A refused value quoted longer than this is cut; a size limit is then said as sizes.
QUOTED: Final = 80
_MOST: Final = frozenset({"maxItems", "maxLength", "maxProperties"})
_LEAST: Final = frozenset({"minItems", "minLength", "minProperties"})


def problem_line(error: ValidationError) -> str:
    """``path: message`` (the message alone at the top), the refused value cut if long."""
    return located(error.absolute_path, _message(error))


def located(path: Iterable[object], message: str) -> str:
    """``message`` placed at ``path`` (``spec.units.1: …``), alone at the top."""
    where = ".".join(str(part) for part in path)
    return f"{where}: {message}" if where else message


def _message(error: ValidationError) -> str:
    quoted = repr(error.instance)
    if len(quoted) <= QUOTED:
        return error.message
    size = _size(error.instance)
    if size and error.validator in _MOST:
        return f"{size}, more than the {error.validator_value} allowed"
    if size and error.validator in _LEAST:
        return f"{size}, fewer than the {error.validator_value} needed"
    return error.message.replace(quoted, quoted[: QUOTED - 1] + "…", 1)


def _size(value: Any) -> str:
    """A list's, a text's or an object's size in words; "" for anything else."""
    units: dict[type, tuple[str, str]] = {
        list: ("item", "items"),
        str: ("character", "characters"),
        dict: ("property", "properties"),
    }
    found = units.get(type(value))
    if found is None:
        return ""
    count = len(value)
    return f"{count} {found[0] if count == 1 else found[1]}"
