"""The `pii:` settings, apart from the guard so that loading a configuration compiles no
recognizer."""

from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Literal

import msgspec

from bot.plain import FieldProblem


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


class OperatorSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How the hits of one entity type are rewritten under redact."""

    type: Literal["replace", "mask", "hash"] = "replace"
    new_value: str | None = None
    masking_char: Annotated[str, msgspec.Meta(min_length=1, max_length=1)] = "*"
    chars_to_mask: Annotated[int, msgspec.Meta(ge=0)] = 100
    from_end: bool = False
    salt: str | None = None

    def __post_init__(self) -> None:
        if self.salt is not None and len(self.salt.encode()) < 16:
            raise FieldProblem("salt", "a hash salt must be at least 16 bytes")


class PiiSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The `pii:` section of kestrel.yaml; ``__post_init__`` checks the entity names, read
    from a file or made in code."""

    mode: PiiMode = PiiMode.REDACT
    entities: list[str] | None = None
    operators: dict[str, OperatorSpec] = {}

    def __post_init__(self) -> None:
        for name, entities in (("entities", self.entities or ()), ("operators", self.operators)):
            problem = unknown_entities(entities)
            if problem:
                raise FieldProblem(name, problem)
