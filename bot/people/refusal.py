"""A refusal: why someone may not do what they asked, in one line for them and the audit."""

from __future__ import annotations

import msgspec

from bot.place import Place


class Refusal(msgspec.Struct, frozen=True):
    """Why an action is refused; the callers that allow return None instead of a Refusal.
    ``detail``: what the audit keeps beside the reason (where the person acted from, in the
    store's notation, which is no words for them)."""

    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return self.reason

    @property
    def audited(self) -> str:
        """The refusal as the audit keeps it: its reason, and its detail if any."""
        return f"{self.reason} ({self.detail})" if self.detail else self.reason


def refused(reason: str) -> Refusal | None:
    """A Refusal for a non-empty reason, None for an empty one (a check's text, if any)."""
    return Refusal(reason) if reason else None


def acted_from(place: Place | None) -> str:
    """A refusal's ``detail``: where the person acted from ("" at the terminal)."""
    return f"acted from {place.describe()}" if place is not None else ""
