"""How long requests stay open, per kind and per tool, and when on-call is reminded."""

from collections.abc import Sequence
from typing import Annotated

import msgspec

Seconds = Annotated[float, msgspec.Meta(gt=0)]

# ``per_tool``'s key for every tool (as ``policy.approvers``'s).
EVERY_TOOL = "*"


class DeadlineSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``deadlines:`` in kestrel.yaml, in seconds (the bounds are read from the annotations)."""

    wait_approval: Seconds = 3600
    wait_user: Seconds = 3600
    wait_effect: Seconds = 86400
    wait_plan: Seconds = 3600
    per_tool: dict[str, Seconds] = {}
    remind_before: Annotated[float, msgspec.Meta(ge=0)] = 600

    def seconds_for(self, kind: str, tool: str, tags: Sequence[str] = ()) -> float:
        """How long a request of ``kind`` about ``tool`` (carrying ``tags``) stays open: the
        tool's own ``per_tool`` entry, else the shortest of its tags' (``tag:prod``; the
        strictest wins, as no tag outranks another), else ``*``'s, else the kind's."""
        own = self.per_tool.get(tool)
        if own is not None:
            return own
        tagged = [self.per_tool[f"tag:{tag}"] for tag in tags if f"tag:{tag}" in self.per_tool]
        if tagged:
            return min(tagged)
        every = self.per_tool.get(EVERY_TOOL)
        if every is not None:
            return every
        seconds: float = getattr(self, kind)
        return seconds
