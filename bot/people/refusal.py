"""A refusal: why someone may not do what they asked, in one line for them and the audit."""

from __future__ import annotations

import msgspec


class Refusal(msgspec.Struct, frozen=True):
    """Why an action is refused; the callers that allow return None instead of a Refusal."""

    reason: str

    def __str__(self) -> str:
        return self.reason


def refused(reason: str) -> Refusal | None:
    """A Refusal for a non-empty reason, None for an empty one (a check's text, if any)."""
    return Refusal(reason) if reason else None
