"""How long requests stay open, per kind and per tool, and when on-call is reminded."""

from collections.abc import Sequence
from typing import Annotated

import msgspec

# At most a century: a request's deadline is its opening plus one of these, and its reminder
# that deadline less ``remind_before``; much longer fell past the last date there is, and the
# first gated call of every run failed with an internal error (or every sweep did, expiring
# nothing). A century still reads as "never" to anyone who means it.
MAX_WAIT_SECONDS = 100 * 365.25 * 86400

Seconds = Annotated[float, msgspec.Meta(gt=0, le=MAX_WAIT_SECONDS)]

# ``per_tool``'s key for every tool (as ``policy.approvers``'s).
EVERY_TOOL = "*"


class DeadlineSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``deadlines:`` in kestrel.yaml, in seconds (the bounds are read from the annotations)."""

    wait_approval: Seconds = 3600
    wait_user: Seconds = 3600
    wait_effect: Seconds = 86400
    wait_plan: Seconds = 3600
    per_tool: dict[str, Seconds] = {}
    remind_before: Annotated[float, msgspec.Meta(ge=0, le=MAX_WAIT_SECONDS)] = 600

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
