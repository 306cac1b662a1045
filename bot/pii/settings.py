"""The `pii:` settings, apart from the guard so that loading a configuration compiles no
recognizer."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from bot.model_cache import KeptModel


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


class OperatorSpec(KeptModel):
    """How the hits of one entity type are rewritten under redact."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["replace", "mask", "hash"] = "replace"
    new_value: str | None = None
    masking_char: str = Field(default="*", min_length=1, max_length=1)
    chars_to_mask: int = Field(default=100, ge=0)
    from_end: bool = False
    salt: str | None = None

    @field_validator("salt")
    @classmethod
    def _salt_is_long_enough(cls, salt: str | None) -> str | None:
        if salt is not None and len(salt.encode()) < 16:
            raise ValueError("a hash salt must be at least 16 bytes")
        return salt


class PiiSettings(KeptModel):
    """The `pii:` section of kestrel.yaml."""

    model_config = ConfigDict(extra="forbid")

    mode: PiiMode = PiiMode.REDACT
    entities: list[str] | None = None
    operators: dict[str, OperatorSpec] = {}

    @field_validator("entities")
    @classmethod
    def _entities_are_known(cls, entities: list[str] | None) -> list[str] | None:
        problem = unknown_entities(entities or ())
        if problem:
            raise ValueError(problem)
        return entities

    @field_validator("operators")
    @classmethod
    def _operators_are_known(cls, operators: dict[str, OperatorSpec]) -> dict[str, OperatorSpec]:
        problem = unknown_entities(operators)
        if problem:
            raise ValueError(problem)
        return operators
