"""Where a Discord outbox message goes: a thread, stored as the JSON the outbox has always held."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.chat.outbox import Target


@dataclass(frozen=True)
class DiscordTarget:
    """A Discord thread (a channel id) in a guild."""

    guild: str
    channel: str

    def as_json(self) -> dict[str, Any]:
        """The stored form: ``{"channel", "guild"}``."""
        return {"channel": self.channel, "guild": self.guild}

    @classmethod
    def from_json(cls, stored: dict[str, Any]) -> DiscordTarget:
        """A stored target; one without a guild matches no guild."""
        return cls(str(stored.get("guild") or ""), str(stored["channel"]))

    @classmethod
    def of(cls, target: Target) -> DiscordTarget:
        """The Discord target a core value carries (the core holds it opaque)."""
        return target if isinstance(target, DiscordTarget) else cls.from_json(target.as_json())
