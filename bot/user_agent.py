"""What Kestrel calls itself to the services it calls: the model, Slack, Discord, MCP servers."""

from __future__ import annotations

from typing import Final

from bot import DISTRIBUTION, __version__

USER_AGENT: Final = f"{DISTRIBUTION}/{__version__}"
"""The product token each outbound call's User-Agent carries (first, or after what the
platform requires first)."""
