"""The `pii:` settings, apart from the guard so that loading a configuration compiles no
recognizer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge, MaxLen, MinLen


class PiiMode(StrEnum):
    """What the guard does with text that holds sensitive data."""

    OFF = "off"
    REDACT = "redact"
    REJECT = "reject"


def unknown_entities(names: Iterable[str]) -> str | None:
    """Why some of ``names`` are not entity types the guard knows; None when all are."""
    from bot.pii.scantext import ENTITY_TYPES  # only when a setting names entities

    unknown = sorted(set(names) - set(ENTITY_TYPES))
    if not unknown:
        return None
    return f"unknown entity type(s) {', '.join(unknown)}; known: {', '.join(ENTITY_TYPES)}"


class FieldProblem(ValueError):
    """What is wrong with one field of a settings dataclass, raised by its ``__post_init__``:
    the settings place it at that field (pydantic places it at the dataclass)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


@dataclass(frozen=True)
class OperatorSpec:
    """How the hits of one entity type are rewritten under redact."""

    # Read by pydantic, which validates this section of the settings: unknown keys are errors.
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    type: Literal["replace", "mask", "hash"] = "replace"
    new_value: str | None = None
    masking_char: Annotated[str, MinLen(1), MaxLen(1)] = "*"
    chars_to_mask: Annotated[int, Ge(0)] = 100
    from_end: bool = False
    salt: str | None = None

    def __post_init__(self) -> None:
        if self.salt is not None and len(self.salt.encode()) < 16:
            raise FieldProblem("salt", "a hash salt must be at least 16 bytes")


@dataclass(frozen=True)
class PiiSettings:
    """The `pii:` section of kestrel.yaml.

    A dataclass, not a model, so that a runtime built in code imports no pydantic; the
    settings validate it as a section, and ``__post_init__`` checks the entity names either way.
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    mode: PiiMode = PiiMode.REDACT
    entities: list[str] | None = None
    operators: dict[str, OperatorSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, entities in (("entities", self.entities or ()), ("operators", self.operators)):
            problem = unknown_entities(entities)
            if problem:
                raise FieldProblem(name, problem)
