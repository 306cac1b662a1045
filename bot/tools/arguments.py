"""The arguments type of an in-process tool: a msgspec Struct or a pydantic BaseModel."""

from __future__ import annotations

import inspect
import json
import sys
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from bot import wire

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError


class InvalidArguments(ValueError):
    """Arguments their type refuses, as one ``field: message`` line per problem."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


class ArgumentsType(Protocol):
    """What an in-process tool needs of its arguments type."""

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the arguments, an object schema."""
        ...

    def convert(self, arguments: dict[str, Any]) -> object:
        """The arguments as a value of the type; ``InvalidArguments`` if they break it."""
        ...


def arguments_type(annotation: object) -> ArgumentsType | None:
    """The arguments type of a Struct or BaseModel class; ``None`` for anything else."""
    if not inspect.isclass(annotation):
        return None
    if issubclass(annotation, msgspec.Struct):
        return StructArguments(annotation)
    # Only an imported pydantic can have made a BaseModel: asking must not import it (~8 MiB).
    if "pydantic" not in sys.modules:
        return None
    from pydantic import BaseModel

    return ModelArguments(annotation) if issubclass(annotation, BaseModel) else None


class StructArguments:
    """A msgspec Struct: its schema from ``msgspec.json.schema``, checked by ``msgspec.convert``."""

    def __init__(self, struct: type[msgspec.Struct]) -> None:
        self._struct = struct

    def schema(self) -> dict[str, Any]:
        """The Struct's object schema, with ``$defs`` only for the structs it nests."""
        return _inline_top(msgspec.json.schema(self._struct))

    def convert(self, arguments: dict[str, Any]) -> object:
        """The Struct built from ``arguments``; msgspec stops at the first problem."""
        try:
            return msgspec.convert(arguments, self._struct)
        except msgspec.ValidationError as exc:
            place, cause = wire.problem(exc)
            raise InvalidArguments([f"{place or '(arguments)'}: {cause}"]) from exc


class ModelArguments:
    """A pydantic BaseModel: its own schema and validation."""

    def __init__(self, model: type[BaseModel]) -> None:
        self._model = model

    def schema(self) -> dict[str, Any]:
        """The model's JSON Schema."""
        return self._model.model_json_schema()

    def convert(self, arguments: dict[str, Any]) -> object:
        """The model validated from ``arguments``."""
        from pydantic import ValidationError  # imported already: the model is pydantic's

        try:
            return self._model.model_validate(arguments)
        except ValidationError as exc:
            raise InvalidArguments(_model_error_lines(exc)) from exc


def _inline_top(schema: dict[str, Any]) -> dict[str, Any]:
    """msgspec's ``{"$ref": …, "$defs": …}`` for a Struct as the Struct's own object schema."""
    ref = schema["$ref"]
    defs = dict(schema["$defs"])
    top = defs.pop(ref.removeprefix("#/$defs/"))
    # A Struct that nests itself still needs its definition for the inner references.
    if f'"{ref}"' in json.dumps([top, defs]):
        defs = schema["$defs"]
    return {**top, "$defs": defs} if defs else top


def _model_error_lines(exc: ValidationError) -> list[str]:
    """A pydantic validation error as one ``field: message`` line per problem."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(arguments)"
        lines.append(f"{where}: {error['msg']}")
    return lines
