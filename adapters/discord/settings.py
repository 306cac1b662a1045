"""What the Discord adapter reads from the environment, checked before anything connects."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from bot.config import ConfigError, checked_url

DEFAULT_API = "https://discord.com/api/v10"


@dataclass(frozen=True)
class DiscordSettings:
    """The bot token and where the REST API is (the gateway is the one REST hands out); with
    the application's public key, interactions are also taken at ``/discord/interactions``."""

    token: str
    api_url: str = DEFAULT_API
    message_content: bool = True
    public_key: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> DiscordSettings:
        """Read ``DISCORD_*``; a missing or malformed value is a ``ConfigError`` naming it."""
        token = environ.get("DISCORD_TOKEN", "").strip()
        api_url = environ.get("DISCORD_API_URL", "").strip().rstrip("/") or DEFAULT_API
        if not token:
            raise ConfigError("DISCORD_TOKEN is not set: the bot token of the application")
        if token.lower().startswith("bot "):
            raise ConfigError("DISCORD_TOKEN is the token alone, without the 'Bot ' prefix")
        api_url = checked_url("DISCORD_API_URL", api_url)
        content = environ.get("DISCORD_MESSAGE_CONTENT", "true").strip().lower()
        if content not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigError(f"DISCORD_MESSAGE_CONTENT must be true or false, not {content!r}")
        key = environ.get("DISCORD_PUBLIC_KEY", "").strip().lower()
        if key and not re.fullmatch(r"[0-9a-f]{64}", key):
            raise ConfigError(
                "DISCORD_PUBLIC_KEY must be the application's public key (64 hex digits,"
                " General Information in the Developer Portal)"
            )
        return cls(token, api_url, content in ("true", "1", "yes"), key)
