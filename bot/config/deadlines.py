"""How long requests stay open, per kind and per tool, and when on-call is reminded."""

from typing import Annotated

import msgspec

Seconds = Annotated[float, msgspec.Meta(gt=0)]


class DeadlineSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``deadlines:`` in kestrel.yaml, in seconds (the bounds are read from the annotations)."""

    wait_approval: Seconds = 3600
    wait_user: Seconds = 3600
    wait_effect: Seconds = 86400
    wait_plan: Seconds = 3600
    per_tool: dict[str, Seconds] = {}
    remind_before: Annotated[float, msgspec.Meta(ge=0)] = 600
