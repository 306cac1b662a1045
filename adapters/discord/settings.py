"""What the Discord adapter reads from the environment, checked before anything connects."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from bot.config.settings import ConfigError, checked_url
from bot.config.sources import pasted_token

DEFAULT_API = "https://discord.com/api/v10"
# How far back a fresh gateway session reads for mentions it missed (minutes; 0: not at all).
DEFAULT_CATCH_UP_MINUTES = 15
MAX_CATCH_UP_MINUTES = 1440
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


@dataclass(frozen=True)
class DiscordSettings:
    """The bot token, where the REST API is (the gateway is the one REST hands out), whether
    cards and reminders notify the people who may answer them, with the application's public
    key interactions taken at ``/discord/interactions`` too, and how many minutes back a fresh
    gateway session handles the mentions it missed."""

    token: str
    api_url: str = DEFAULT_API
    message_content: bool = True
    ping_approvers: bool = True
    public_key: str = ""
    catch_up_minutes: int = DEFAULT_CATCH_UP_MINUTES

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> DiscordSettings:
        """Read ``DISCORD_*``; a missing or malformed value is a ``ConfigError`` naming it."""
        token = environ.get("DISCORD_TOKEN", "").strip()
        api_url = environ.get("DISCORD_API_URL", "").strip().rstrip("/") or DEFAULT_API
        if not token:
            raise ConfigError(
                "DISCORD_TOKEN is not set: the application's bot token (Developer Portal → Bot →"
                " Reset Token; manifests/discord-app.md)"
            )
        if token.lower().startswith("bot "):
            raise ConfigError("DISCORD_TOKEN is the token alone, without the 'Bot ' prefix")
        # Sent in a header: Discord took a pasted quote for "Improper token has been passed".
        pasted_token("DISCORD_TOKEN", token)
        api_url = checked_url("DISCORD_API_URL", api_url)
        content = _flag(environ, "DISCORD_MESSAGE_CONTENT")
        pings = _flag(environ, "DISCORD_PING_APPROVERS")
        key = environ.get("DISCORD_PUBLIC_KEY", "").strip().lower()
        if key and not re.fullmatch(r"[0-9a-f]{64}", key):
            raise ConfigError(
                "DISCORD_PUBLIC_KEY must be the application's public key (64 hex digits,"
                " General Information in the Developer Portal)"
            )
        return cls(token, api_url, content, pings, key, _catch_up_minutes(environ))


def _catch_up_minutes(environ: Mapping[str, str]) -> int:
    """``DISCORD_CATCH_UP_MINUTES``: whole minutes from 0 to a day; else a ``ConfigError``."""
    value = environ.get("DISCORD_CATCH_UP_MINUTES", "").strip()
    if not value:
        return DEFAULT_CATCH_UP_MINUTES
    if not re.fullmatch(r"[0-9]{1,4}", value) or int(value) > MAX_CATCH_UP_MINUTES:
        raise ConfigError(
            f"DISCORD_CATCH_UP_MINUTES must be whole minutes from 0 to {MAX_CATCH_UP_MINUTES},"
            f" not {value!r}"
        )
    return int(value)


def _flag(environ: Mapping[str, str], name: str) -> bool:
    """A true/false variable, true when unset; anything else is a ``ConfigError`` naming it."""
    value = environ.get(name, "true").strip().lower()
    if value not in _TRUE + _FALSE:
        raise ConfigError(f"{name} must be true or false, not {value!r}")
    return value in _TRUE
