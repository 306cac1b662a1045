"""Text from a model, a tool or a user, made safe to show a person."""

from __future__ import annotations

import re
from typing import Final

# Escape sequences a terminal acts on, 7-bit (ESC ...) and 8-bit (C1) forms: control strings
# (OSC, DCS, SOS, PM, APC) up to their terminator (BEL or ST) or the end of the text, CSI
# sequences, and the two- and three-byte escapes (charset selection, keypad modes, resets).
_ESCAPES: Final = re.compile(
    r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]).*?(?:\x07|\x1b\\|\x9c|$)"
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|\x1b[ -/]*[0-~]?",
    re.DOTALL,
)
# Whatever control characters are left, C0 (but tab and newline), DEL and C1.
_CONTROLS: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Halves of a UTF-16 pair alone (a JSON or YAML escape can make one): no terminal can be sent
# them as UTF-8, so each is shown as the replacement character.
_SURROGATES: Final = re.compile("[\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` safe for a terminal: escape sequences and control characters (but tab and
    newline) removed, so model and tool text cannot retitle, clear or rewrite the screen; a
    lone surrogate is shown as U+FFFD."""
    return _SURROGATES.sub("\ufffd", _CONTROLS.sub("", _ESCAPES.sub("", text)))


__all__ = ["printable"]
