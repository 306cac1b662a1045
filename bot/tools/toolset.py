"""An immutable set of tools in one flat namespace, replaced whole, never changed in place."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar, overload

from bot.digest import sha256
from bot.domain import call_digest
from bot.llm.base import ToolSpec
from bot.tools.base import Tool, ToolFlags, checks_arguments, runs_something
from bot.tools.schema_words import problem_line

if TYPE_CHECKING:
    from jsonschema.protocols import Validator


_T = TypeVar("_T")


class ToolCollision(Exception):
    """Two tools claim one name; assembly aborts rather than shadow one (and maybe its gate)."""


class ToolSet(Mapping[str, Tool]):
    """Tools by name, frozen at construction."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        by_name: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in by_name:
                raise ToolCollision(_collision(by_name[tool.name], tool))
            by_name[tool.name] = tool
        self._tools = MappingProxyType(by_name)
        # Each tool's check, made when it first checks a call: a set assembled only to be
        # listed or asked for flags compiles no schema.
        self._checks: dict[str, Callable[[dict[str, Any]], list[str]]] = {}
        self._definitions: dict[str, str] = {}
        # Built on first use, once (the set never changes). Plain attributes, not
        # ``functools.cached_property``, whose first read takes a lock in Python 3.11.
        self._specs: tuple[ToolSpec, ...] | None = None
        self._shapes: dict[str, str] | None = None
        self._digest: str | None = None

    @classmethod
    def assemble(cls, *sources: Iterable[Tool]) -> ToolSet:
        """Join sources in the order given into one namespace; any collision raises."""
        return cls(tool for source in sources for tool in source)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    @overload
    def get(self, name: str, /) -> Tool | None: ...

    @overload
    def get(self, name: str, default: Tool | _T, /) -> Tool | _T: ...

    def get(self, name: str, default: object = None, /) -> object:
        """The tool called ``name``, else ``default``: one lookup, where ``Mapping.get`` makes
        two calls (a run asks twice for every call)."""
        return self._tools.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def flags_of(self, name: str) -> ToolFlags | None:
        """The flags of the tool called ``name``; None if the set has no such tool."""
        tool = self._tools.get(name)
        return tool.flags if tool else None

    def validate(self, name: str, arguments: dict[str, Any]) -> list[str]:
        """Every way ``arguments`` are invalid for the tool, as readable lines."""
        check = self._checks.get(name)
        if check is None:
            check = self._checks[name] = _check(self._tools[name])
        return check(arguments)

    def specs(self) -> tuple[ToolSpec, ...]:
        """What the model is told, in assembly order."""
        specs = self._specs
        if specs is None:
            # Asked before every model call: the set never changes, so built once.
            tools = self._tools.values()
            specs = tuple(ToolSpec(t.name, t.description, t.parameters) for t in tools)
            self._specs = specs
        return specs

    def digest(self) -> str:
        """A digest of names, schemas, flags and what each tool runs: part of a run's
        configuration fingerprint."""
        digest = self._digest
        if digest is None:
            # Every run started on the set shares one computation. The text is json.dumps of
            # the list of shapes, as fingerprints kept in journals were made.
            digest = self._digest = _hashed("[" + ", ".join(self._shaped().values()) + "]")
        return digest

    def definition(self, name: str) -> str:
        """A digest of one tool's name, schema, flags and what it runs; empty for a name the
        set does not hold."""
        found = self._definitions.get(name)
        if found is None:
            shape = self._shaped().get(name)
            if shape is None:
                return ""
            found = self._definitions[name] = _hashed(shape)
        return found

    def call_digest(self, name: str, arguments: dict[str, Any]) -> str:
        """``call_digest`` of a call to tool ``name``, bound to the tool's definition here."""
        return call_digest(name, arguments, self.definition(name))

    def _shaped(self) -> dict[str, str]:
        """Each tool's shape as JSON, written once for the set's digest and for its own."""
        shapes = self._shapes
        if shapes is None:
            sorted_json = json.JSONEncoder(sort_keys=True).encode  # json.dumps's, built once
            tools = self._tools.items()
            shapes = self._shapes = {name: sorted_json(_shape(tool)) for name, tool in tools}
        return shapes


def _hashed(text: str) -> str:
    return sha256(text.encode()).hexdigest()[:16]


def _shape(tool: Tool) -> list[Any]:
    shape = [tool.name, tool.description, tool.parameters, repr(tool.flags)]
    return [*shape, tool.definition()] if runs_something(tool) else shape


def _collision(first: Tool, second: Tool) -> str:
    """One line naming both claims, each at its ``file:line`` if it came from a catalog."""
    # Catalog tools know their file:line; MCP clashes are caught before, so the rest are built in.
    places = [getattr(tool, "origin", None) or "a built-in tool" for tool in (first, second)]
    return f"tool name collision: {first.name!r} is declared twice ({places[0]} and {places[1]})"


def _check(tool: Tool) -> Callable[[dict[str, Any]], list[str]]:
    """The tool's own check if it has one (in-process tools), else its JSON Schema."""
    if checks_arguments(tool):
        return tool.argument_errors
    from jsonschema import Draft202012Validator
    from jsonschema.validators import validator_for

    validator: Validator = validator_for(tool.parameters, default=Draft202012Validator)(
        tool.parameters
    )

    def check(arguments: dict[str, Any]) -> list[str]:
        return [problem_line(error) for error in validator.iter_errors(arguments)]

    return check
