"""Regexes compiled the first time they are used.

Python compiles a regex in Python: the PII guard's 47 took some 12 ms of every process's start
(``kestrel runs approve``, a replica's first run). Each waits for a text that could hold a
match: one read after an anchor was found (a label, a scheme, "ignore", a link's brackets), or
one whose every match holds a literal (``finditer_with``) that the text has. A chat prompt or a
short command output then compiles few of them. Once compiled, a pattern's methods are held as
plain attributes, so a caller looks them up as fast as on ``re.Pattern``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, AnyStr, cast

_METHODS = ("finditer", "search", "match", "fullmatch", "findall", "split", "sub")


class _OnUse:
    """Stands in for a compiled pattern; the first use compiles it (attributes not held yet
    reach ``__getattr__``), its source first written then if it is given as a function."""

    _compiled: re.Pattern[Any] | None = None

    def __init__(self, pattern: str | bytes | Callable[[], str | bytes], flags: int) -> None:
        self._pattern = pattern
        self._flags = flags

    def __getattr__(self, name: str) -> Any:
        compiled = self._compiled
        if compiled is None:
            pattern = self._pattern
            source = pattern() if callable(pattern) else pattern
            compiled = self._compiled = re.compile(source, self._flags)
            for method in _METHODS:
                setattr(self, method, getattr(compiled, method))
        return getattr(compiled, name)


def on_use(pattern: AnyStr, flags: int = 0) -> re.Pattern[AnyStr]:
    """``re.compile(pattern, flags)``, done when the pattern is first used."""
    return cast("re.Pattern[AnyStr]", _OnUse(pattern, flags))


def on_use_written(write: Callable[[], AnyStr], flags: int = 0) -> re.Pattern[AnyStr]:
    """``on_use`` of the pattern ``write()`` returns, written too when it is first used: for a
    source that takes work to write (the PII guard's number families, written as tries)."""
    return cast("re.Pattern[AnyStr]", _OnUse(write, flags))


def finditer_with(
    pattern: re.Pattern[AnyStr], text: AnyStr, *literals: AnyStr
) -> Iterator[re.Match[AnyStr]]:
    """``pattern.finditer(text)`` for a pattern whose every match holds one of ``literals``:
    nothing, and the pattern left uncompiled, when the text holds none (a C search each)."""
    for literal in literals:
        if literal in text:
            return pattern.finditer(text)
    return iter(())
