"""Where a run lives, and where someone acts from: platform, workspace, channel, thread.

A run lives in one place (its session's thread), and so do its requests and cards. A decision
or a read about a run is checked against the person and against this place: a click, form,
command or reply acts on a run only from the run's own place.
"""

from __future__ import annotations

import msgspec

from bot.patterns import on_use

_SLACK_ID = on_use(r"[A-Z0-9]{2,32}")
_SLACK_TS = on_use(r"[0-9]{1,12}\.[0-9]{1,9}")
_SNOWFLAKE = on_use(r"[0-9]{1,20}")


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

    def link(self) -> str | None:
        """The address of this place's thread on its platform (a Discord place's channel when
        it names no thread); None for a place with none (the console) or with ids that are
        not the platform's."""
        if self.platform == "slack":
            team, channel, ts = self.workspace, self.channel, self.thread
            if (
                _SLACK_ID.fullmatch(team)
                and _SLACK_ID.fullmatch(channel)
                and _SLACK_TS.fullmatch(ts)
            ):
                return f"https://app.slack.com/client/{team}/{channel}/thread/{channel}-{ts}"
        if self.platform == "discord":
            where = self.thread or self.channel
            if _SNOWFLAKE.fullmatch(self.workspace) and _SNOWFLAKE.fullmatch(where):
                return f"https://discord.com/channels/{self.workspace}/{where}"
        return None

    def describe(self) -> str:
        """The place in a few words, for refusals and the audit."""
        where = [self.platform, self.workspace, self.channel, self.thread]
        return ":".join(part for part in where if part)
