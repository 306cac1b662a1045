"""How long requests stay open, per kind and per tool, and when on-call is reminded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from annotated_types import Ge, Gt

Seconds = Annotated[float, Gt(0)]


@dataclass(frozen=True)
class DeadlineSettings:
    """``deadlines:`` in kestrel.yaml, in seconds.

    A dataclass, not a model, so that a runtime built in code imports no pydantic; the
    settings validate it as a section (the bounds are read from the annotations).
    """

    # Read by pydantic, which validates this section of the settings: unknown keys are errors.
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    wait_approval: Seconds = 3600
    wait_user: Seconds = 3600
    wait_effect: Seconds = 86400
    wait_plan: Seconds = 3600
    per_tool: dict[str, Seconds] = field(default_factory=dict)
    remind_before: Annotated[float, Ge(0)] = 600
