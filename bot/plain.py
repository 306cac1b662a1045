"""Plain values (a YAML document, variables) into typed structs: one msgspec conversion, and
when it fails, every problem, each at its place.

msgspec stops at the first problem; a person fixing a configuration wants all of them at once.
So only a failed conversion walks the value: each field of a struct, item of a list and value
of a mapping is converted on its own, and the parts that fail are walked further, down to the
one whose own value is wrong. A struct whose fields are all fine broke its own check
(``__post_init__``); a ``FieldProblem`` from it is placed at the field it names. A check of one
field alone (``__field_checks__``, run by ``run_field_checks``) is run in the walk too, so that it
is reported beside whatever else is wrong with its struct.
"""

from __future__ import annotations

import enum
import math
import types
from collections.abc import Callable
from typing import (
    Annotated,
    Any,
    Final,
    Literal,
    TypeVar,
    Union,
    get_args,
    get_origin,
)

import msgspec

from bot.patterns import on_use
from bot.wire import problem

T = TypeVar("T")
Loc = tuple[str | int, ...]
DecHook = Callable[[type, Any], Any]

# ``Expected `int` >= 1``, ``Expected `str`, got `int```: msgspec's words for a wrong value
# (read only to describe a mistake: compiled then).
_EXPECTED: Final = on_use(r"^Expected `([\w |]+)`(?:, got `(\w+)`| (.*))?$")
# msgspec's mark of a mapping's key that is wrong (``bot.wire.problem`` adds it).
_FOR_A_KEY: Final = " (for a key)"
_TYPE_WORDS: Final = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "array": "a list",
    "object": "a mapping",
    "null": "null",
}
_INVALID_CHOICE: Final = on_use(r"^Invalid enum value (.*)$")
# msgspec takes ``.inf`` (and ``nan`` where a number has no bound) as a float: a timeout or a
# lease of ``.inf`` waits forever, or overflows where it is added to a time.
NOT_FINITE: Final = "must be a finite number"


class FieldProblem(ValueError):
    """What is wrong with one field, raised by a struct's ``__post_init__``: the problem is
    placed at that field, not at the struct."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


def run_field_checks(struct: msgspec.Struct) -> None:
    """Run a struct's ``__field_checks__`` (``{field: check}``, each raising ``ValueError``) from
    its ``__post_init__``; a failed one is a ``FieldProblem`` at its field. ``bot.plain`` runs
    them in its walk as well, so a field's check is reported even when another field is wrong."""
    for name, check in getattr(type(struct), "__field_checks__", {}).items():
        try:
            check(getattr(struct, name))
        except ValueError as exc:
            raise FieldProblem(name, str(exc)) from exc


# A struct: a NamedTuple class costs 0.9 M instructions to create, in every process that reads
# settings, and a struct 0.15 M.
class Problem(msgspec.Struct, frozen=True):
    """One thing wrong with a value: where (keys and indexes from the top), and what."""

    loc: Loc
    message: str


class Invalid(Exception):
    """A value is not the type asked for; ``problems`` holds every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__(
            "; ".join(f"{dotted(p.loc) or '(top level)'}: {p.message}" for p in problems)
        )


def convert(
    value: Any, kind: type[T], *, strict: bool = True, dec_hook: DecHook | None = None
) -> T:
    """``value`` as a ``kind``; ``Invalid`` with every problem when it is not one.

    ``strict=False`` takes text for numbers and booleans (``"30"``, ``"true"``), as variables
    give them.
    """
    try:
        converted = msgspec.convert(value, kind, strict=strict, dec_hook=dec_hook)
    except msgspec.ValidationError:
        raise Invalid(problems(value, kind, strict=strict, dec_hook=dec_hook)) from None
    infinite = non_finite(converted)
    if infinite:
        raise Invalid(infinite)
    return converted


def problems(
    value: Any, kind: Any, *, strict: bool = True, dec_hook: DecHook | None = None, loc: Loc = ()
) -> list[Problem]:
    """Every problem of ``value`` as a ``kind``, each at its place below ``loc``; none if it
    is one."""
    try:
        converted = msgspec.convert(value, kind, strict=strict, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        first = exc
    else:
        return non_finite(converted, loc)
    found = _parts_problems(value, _container(kind), strict, dec_hook, loc)
    if found:
        return found
    if isinstance(value, float) and not math.isfinite(value):
        # NaN fails a bound as any number would: say what is wrong with it.
        return [Problem(loc, NOT_FINITE)]
    placed = _placed(first, loc, kind)
    if placed.loc != loc:
        return [placed]
    if isinstance(value, str) and _list_of(kind) is str:
        # One item where a list goes (``oncall: U0ONCALL``): the list it surely meant.
        return [Problem(loc, f"{placed.message}: write it as a list, [{_quoted(value)}]")]
    if isinstance(value, dict) and (_list_of(kind) is Any or is_struct(_list_of(kind))):
        # One entry written as the mapping itself (a schedule, a server, a catalog's tool):
        # an item of a list.
        return [Problem(loc, f"{placed.message}: {ONE_ENTRY}")]
    return [placed]


ONE_ENTRY = (
    "write it as a list of one, with - before its first key and its other keys under that one"
)


def _list_of(kind: Any) -> Any:
    """What ``kind`` is a list of (None when it is no list)."""
    container = _container(kind)
    args = get_args(container)
    return _container(args[0]) if get_origin(container) is list and args else None


def _quoted(text: str) -> str:
    """``text`` as a YAML flow list's item: JSON's string, which YAML reads the same."""
    import json  # only to describe a mistake

    return json.dumps(text)


def non_finite(value: Any, loc: Loc = ()) -> list[Problem]:
    """Every float below a converted ``value`` (its structs' fields, lists and mappings) that
    is infinite or NaN, each at its place below ``loc``."""
    found: list[Problem] = []
    # One pass over a stack, not a call per value: every command converts its settings.
    stack: list[tuple[Loc, Any]] = [(loc, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                found.append(Problem(where, NOT_FINITE))
        elif isinstance(item, msgspec.Struct):
            names = zip(item.__struct_encode_fields__, item.__struct_fields__, strict=True)
            stack += [((*where, encoded), getattr(item, name)) for encoded, name in names]
        elif isinstance(item, dict):
            stack += [((*where, str(key)), part) for key, part in item.items()]
        elif isinstance(item, list | tuple):
            stack += [((*where, index), part) for index, part in enumerate(item)]
    return found[::-1]


def dotted(loc: Loc) -> str:
    """``('tools', 2, 'timeout')`` as ``tools[2].timeout``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def fields_of(struct: type[msgspec.Struct]) -> dict[str, Any]:
    """A struct's fields by the name a document gives them, and their types."""
    return {field.encode_name: field.type for field in msgspec.structs.fields(struct)}


def is_struct(kind: Any) -> bool:
    """Whether ``kind`` is a struct type."""
    return isinstance(kind, type) and issubclass(kind, msgspec.Struct)


def _container(kind: Any) -> Any:
    """``kind`` without ``Annotated`` and, of a union with None, its other member."""
    if get_origin(kind) is Annotated:
        return _container(get_args(kind)[0])
    if get_origin(kind) in (Union, types.UnionType):
        members = [m for m in get_args(kind) if m is not type(None)]
        return _container(members[0]) if len(members) == 1 else kind
    return kind


def _parts_problems(
    value: Any, kind: Any, strict: bool, dec_hook: DecHook | None, loc: Loc
) -> list[Problem]:
    """The problems of ``value``'s parts, when ``kind`` has parts and ``value`` is shaped like
    it; none otherwise (the value is wrong as a whole)."""
    if is_struct(kind) and isinstance(value, dict):
        return _struct_problems(value, kind, strict, dec_hook, loc)
    origin, args = get_origin(kind), get_args(kind)
    if origin is list and isinstance(value, list) and args:
        parts: list[tuple[str | int, Any]] = list(enumerate(value))
    elif origin is dict and isinstance(value, dict) and len(args) == 2:
        parts = [(str(key), item) for key, item in value.items()]
    else:
        return []
    found: list[Problem] = []
    if origin is dict:
        for key in value:
            found += [
                Problem(problem.loc, problem.message + _FOR_A_KEY)
                for problem in problems(
                    key, args[0], strict=strict, dec_hook=dec_hook, loc=(*loc, str(key))
                )
            ]
    for part, item in parts:
        found += problems(item, args[-1], strict=strict, dec_hook=dec_hook, loc=(*loc, part))
    return found


def _struct_problems(
    value: dict[Any, Any],
    struct: type[msgspec.Struct],
    strict: bool,
    dec_hook: DecHook | None,
    loc: Loc,
) -> list[Problem]:
    """Unknown keys, missing ones and each field's problems; the struct's own check when its
    fields are fine."""
    found: list[Problem] = []
    fields = {field.encode_name: field for field in msgspec.structs.fields(struct)}
    checks = getattr(struct, "__field_checks__", {})
    for key in value:
        if key not in fields:
            found.append(Problem((*loc, str(key)), _unknown(str(key), list(fields))))
    for name, field in fields.items():
        if name in value:
            own = problems(
                value[name], field.type, strict=strict, dec_hook=dec_hook, loc=(*loc, name)
            )
            if not own and field.name in checks:
                said = _checked(checks[field.name], value[name], field.type, strict, dec_hook)
                own = [Problem((*loc, name), message) for message in said]
            found += own
        elif field.required:
            found.append(Problem((*loc, name), "required key is missing"))
    if found:
        return found
    try:
        msgspec.convert(value, struct, strict=strict, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        return [_placed(exc, loc, struct)]
    return []


def _checked(
    check: Callable[[Any], None], value: Any, kind: Any, strict: bool, dec_hook: DecHook | None
) -> list[str]:
    """What a field's own check says of ``value`` (already found to be a ``kind``)."""
    try:
        check(msgspec.convert(value, kind, strict=strict, dec_hook=dec_hook))
    except ValueError as exc:
        return [str(exc)]
    return []


def nearest(name: str, known: list[str], cutoff: float = 0.6) -> str | None:
    """The one of ``known`` that ``name`` is likely a misspelling of, if any is near (as
    ``difflib`` measures it: ``cutoff`` and closer)."""
    import difflib  # only to describe a mistake

    near = difflib.get_close_matches(name, known, n=1, cutoff=cutoff)
    return near[0] if near else None


def _unknown(key: str, known: list[str]) -> str:
    """What is said of a key no field has: the field it is nearest, if one is near."""
    near = nearest(key, known)
    return f"unknown key (did you mean {near}?)" if near else "unknown key"


def _placed(exc: msgspec.ValidationError, loc: Loc, kind: Any) -> Problem:
    """msgspec's one problem, at its place below ``loc``, in words."""
    cause = exc.__cause__
    if isinstance(cause, FieldProblem):
        return Problem((*loc, cause.field), str(cause))
    if isinstance(cause, ValueError | TypeError):
        return Problem(loc, str(cause))
    where, message = problem(exc)
    parts = tuple(int(p) if p.isdigit() else p for p in where.split(".") if p and p != "...")
    return Problem((*loc, *parts), _in_words(message, _container(kind)))


def _choices(kind: Any) -> list[str]:
    """The values a ``Literal`` or an enum allows, as written in a document."""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return [str(member.value) for member in kind]
    if get_origin(kind) is Literal:
        return [str(value) for value in get_args(kind)]
    return []


def _in_words(message: str, kind: Any) -> str:
    """msgspec's message as a person reads it: ``Expected `int` >= 1`` is ``must be an
    integer >= 1``; ``Expected `str`, got `int``` is ``expected a string, got an integer``."""
    if message.endswith(_FOR_A_KEY):
        return _in_words(message.removesuffix(_FOR_A_KEY), kind) + _FOR_A_KEY
    choice = _INVALID_CHOICE.match(message)
    if choice:
        allowed = ", ".join(_choices(kind))
        return f"{choice.group(1)} is not one of {allowed}" if allowed else message
    expected = _EXPECTED.match(message)
    if expected is None:
        return message
    wanted, got, bound = expected.groups()
    words = " or ".join(_TYPE_WORDS.get(one, one) for one in wanted.split(" | "))
    if got:
        return f"expected {words}, got {_TYPE_WORDS.get(got, got)}"
    if bound:
        # msgspec shows a pattern as its repr, each backslash doubled: shown as written instead.
        written = bound.replace("\\\\", "\\")
        return f"must be {words} {written}"
    return f"expected {words}"
