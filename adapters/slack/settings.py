"""What the Slack adapter reads from the environment, checked before anything connects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bot.config.settings import ConfigError, checked_url
from bot.config.sources import pasted_token


@dataclass(frozen=True)
class SlackSettings:
    """Tokens, the signing secret and where the Web API is."""

    bot_token: str
    signing_secret: str
    app_token: str = ""
    api_url: str = ""

    @property
    def socket_mode(self) -> bool:
        """Whether to connect out over Socket Mode (an app-level token is set) instead of HTTP."""
        return bool(self.app_token)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SlackSettings:
        """Read ``SLACK_*``; a missing or malformed value is a ``ConfigError`` naming it."""
        bot_token = environ.get("SLACK_BOT_TOKEN", "").strip()
        secret = environ.get("SLACK_SIGNING_SECRET", "").strip()
        app_token = environ.get("SLACK_APP_TOKEN", "").strip()
        api_url = environ.get("SLACK_API_URL", "").strip()
        if not bot_token:
            raise ConfigError(
                "SLACK_BOT_TOKEN is not set: the app's bot token, xoxb-… (OAuth & Permissions →"
                " Bot User OAuth Token; docs/slack.md)"
            )
        # Each goes in a header or keys a signature: a pasted quote would be refused by
        # Slack (invalid_auth) or refuse every request Slack signs. Checked before the kind
        # of token, which a quote before it would misname.
        for name, value in (
            ("SLACK_BOT_TOKEN", bot_token),
            ("SLACK_APP_TOKEN", app_token),
            ("SLACK_SIGNING_SECRET", secret),
        ):
            pasted_token(name, value)
        if not bot_token.startswith("xoxb-"):
            raise ConfigError("SLACK_BOT_TOKEN must be a bot token (it starts with xoxb-)")
        if app_token and not app_token.startswith("xapp-"):
            raise ConfigError("SLACK_APP_TOKEN must be an app-level token (it starts with xapp-)")
        if not secret and not app_token:
            raise ConfigError(
                "SLACK_SIGNING_SECRET is not set: HTTP mode verifies every request with it"
                " (Basic Information → App Credentials → Signing Secret), or set SLACK_APP_TOKEN"
                " for Socket Mode"
            )
        if api_url:
            api_url = checked_url("SLACK_API_URL", api_url)
            api_url += "" if api_url.endswith("/") else "/"
        return cls(bot_token, secret, app_token, api_url)
