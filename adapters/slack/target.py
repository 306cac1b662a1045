"""Where a Slack outbox message goes: a thread, stored as the JSON the outbox has always held."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.chat.outbox import Target


@dataclass(frozen=True)
class SlackTarget:
    """A Slack thread: its workspace, channel and root ts (empty: the channel itself)."""

    team: str
    channel: str
    thread_ts: str

    def as_json(self) -> dict[str, Any]:
        """The stored form: ``{"channel", "thread_ts", "team"}``."""
        return {"channel": self.channel, "thread_ts": self.thread_ts, "team": self.team}

    @classmethod
    def from_json(cls, stored: dict[str, Any]) -> SlackTarget:
        """A stored target; rows from before ``team`` was kept read with an empty one."""
        return cls(
            str(stored.get("team") or ""),
            str(stored["channel"]),
            str(stored.get("thread_ts") or ""),
        )

    @classmethod
    def of(cls, target: Target) -> SlackTarget:
        """The Slack target a core value carries (the core holds it opaque)."""
        return target if isinstance(target, SlackTarget) else cls.from_json(target.as_json())
