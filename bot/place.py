"""Where a run lives, and where someone acts from: platform, workspace, channel, thread.

A run lives in one place (its session's thread), and so do its requests and cards. A decision
or a read about a run is checked against the person and against this place: a click, form,
command or reply acts on a run only from the run's own place.
"""

from __future__ import annotations

import msgspec


class Place(msgspec.Struct, frozen=True):
    """A platform, a workspace on it (Slack team, Discord guild), a channel, a thread."""

    platform: str
    workspace: str = ""
    channel: str = ""
    thread: str = ""

    def holds(self, acted_from: Place) -> bool:
        """Whether acting from ``acted_from`` is acting in this place (same platform, workspace
        and channel; the same thread when both name one: a slash command names none)."""
        if (acted_from.platform, acted_from.workspace) != (self.platform, self.workspace):
            return False
        if acted_from.channel != self.channel:
            return False
        return not (acted_from.thread and self.thread) or acted_from.thread == self.thread

    def within(self, acted_from: Place) -> bool:
        """Whether ``acted_from`` is this very place, thread included: a thread may show to
        fewer people than its channel (a Discord private thread), so a slash command in the
        channel has not seen it."""
        return self.holds(acted_from) and acted_from.thread == self.thread

    def describe(self) -> str:
        """The place in a few words, for refusals and the audit."""
        where = [self.platform, self.workspace, self.channel, self.thread]
        return ":".join(part for part in where if part)
