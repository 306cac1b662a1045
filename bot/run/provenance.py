"""Where a call's argument values came from: matched by value against the run's earlier tool
outputs (pure; no I/O).

A string of at least 4 characters, or a number of at least 3 digits, found verbatim in an
earlier output and in no human text (the prompt, the thread's earlier human messages, a
person's answer) counts as taken from tool output. A catalog default or enum value, and a value
from a tool the parameter trusts (``trusted_from``), does not. An output whose own call sent
the value (a tool echoing its input) is no source: the value went from the model to the tool.
A person's text, or a call's arguments, holds a value only whole: "payments-db" is not in
"payments-db-replica", nor "313" in "3131".
What is not verbatim (paraphrased, encoded, split, re-cased) is not seen.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Final

import msgspec

from bot.domain import ArgumentOrigin
from bot.text import instruction_like

MIN_TEXT: Final = 4
MIN_DIGITS: Final = 3
EXCERPT_CHARS: Final = 120
# JSON's scalars, which are no containers: said by their type before ``isinstance(value,
# Mapping)`` is asked, since abc answers that for a new type by walking every Mapping subclass
# the process has imported (65 K instructions a type; 0.18 M of a fresh run's first call).
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


class Output(msgspec.Struct, frozen=True):
    """One earlier tool output of the run, as the model saw it (after the PII guard)."""

    tool: str
    call_id: str
    text: str
    arguments: str = ""  # the raw JSON its call sent


def trace(
    tool: str,
    arguments: Mapping[str, Any],
    outputs: Sequence[Output],
    human_texts: Sequence[str],
    trusted_from: Mapping[str, Collection[str]] | None = None,
    catalog: Collection[str] = (),
) -> tuple[ArgumentOrigin, ...]:
    """The arguments of one call of ``tool`` taken from an earlier output, one origin each.

    ``trusted_from`` maps an argument path (or a prefix of it) to the tools whose output is an
    expected source; ``catalog`` holds the parameters' defaults and enum values.
    """
    del tool  # part of the call's identity; matching needs only its values
    origins: list[ArgumentOrigin] = []
    corpus: _Corpus | None = None
    for path, value in leaves(arguments):
        if value in catalog or any(_holds(text, value) for text in human_texts):
            continue
        corpus = corpus or _Corpus(outputs)
        found = corpus.source(value, _trusted(path, trusted_from or {}))
        if found is not None:
            origins.append(_origin(path, value, found))
    return tuple(origins)


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Each value long enough to match, with its dotted path (``spec.unit``, ``units[1]``)."""
    scalar = type(value) in _SCALARS
    if not scalar and isinstance(value, Mapping):
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}" if path else str(key))
    elif not scalar and isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from leaves(item, f"{path}[{index}]")
    elif isinstance(value, str):
        if len(value) >= MIN_TEXT:
            yield path, value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        # A whole float (31337.0, 3.1337e4) reaches a command as the integer's digits.
        whole = isinstance(value, float) and value.is_integer()
        text = str(int(value)) if whole else str(value)
        if sum(char.isdigit() for char in text) >= MIN_DIGITS:
            yield path, text


def catalog_values(parameters: Mapping[str, Any]) -> frozenset[str]:
    """The defaults, enum and const values a JSON Schema declares, as ``leaves`` spells them."""
    found: set[str] = set()
    _schema_values(parameters, found)
    return frozenset(found)


def _schema_values(schema: Any, found: set[str]) -> None:
    if type(schema) in _SCALARS:
        return
    if isinstance(schema, list):
        for item in schema:
            _schema_values(item, found)
        return
    if not isinstance(schema, Mapping):
        return
    for key, item in schema.items():
        if key in ("default", "const"):
            found.update(text for _, text in leaves([item]))
        elif key == "enum" and isinstance(item, list):
            found.update(text for _, text in leaves(item))
        else:
            _schema_values(item, found)


def _trusted(path: str, trusted_from: Mapping[str, Collection[str]]) -> Collection[str]:
    """The tools ``path`` trusts: named for it or for a parameter it is inside."""
    tools: set[str] = set()
    for prefix, names in trusted_from.items():
        if path == prefix or path.startswith((prefix + ".", prefix + "[")):
            tools.update(names)
    return tools


class _Found(msgspec.Struct, frozen=True):
    output: Output
    at: int


class _Corpus:
    """The outputs joined, so that one search covers them all (a search per output would cost
    its overhead per output), and where each begins."""

    def __init__(self, outputs: Sequence[Output]) -> None:
        self.outputs = outputs
        self.text = _SEPARATOR.join(output.text for output in outputs)
        self.starts: list[int] = []
        at = 0
        for output in outputs:
            self.starts.append(at)
            at += len(output.text) + len(_SEPARATOR)

    def source(self, value: str, trusted: Collection[str]) -> _Found | None:
        """The first output holding ``value`` whose call did not send it; None if a trusted
        tool's output holds it too (the value is one that tool is expected to give)."""
        if not _anywhere(self.text, value):
            return None
        # A number is found only whole: "123" is no source in "51234".
        joins = str.isdigit if _is_number(value) else None
        at = _find(self.text, value, joins, 0)
        found: _Found | None = None
        while at >= 0:
            index = bisect.bisect_right(self.starts, at) - 1
            output = self.outputs[index]
            if not _holds(output.arguments, value):
                if output.tool in trusted:
                    return None
                found = found or _Found(output, at - self.starts[index])
                if not trusted:
                    return found
            next_output = self.starts[index + 1] if index + 1 < len(self.starts) else len(self.text)
            at = _find(self.text, value, joins, next_output)
        return found


# No value is matched across two outputs: a tool cannot put this in its output (the journal
# holds valid text, and the PII guard's output is text).
_SEPARATOR: Final = "\x00"


def _anywhere(text: str, value: str) -> bool:
    """Whether ``value`` stands anywhere in ``text``: most values stand in no output, and a SIMD
    search says so in a tenth of ``str.find``'s time (its offsets count UTF-8 bytes, so the
    exact search below still places what it finds)."""
    import stringzilla  # deferred: only a consequential call after some tool output needs it

    return bool(stringzilla.find(text, value) >= 0)


def _is_number(value: str) -> bool:
    return value.lstrip("-").replace(".", "", 1).isdigit()


def _name_char(char: str) -> bool:
    return char.isalnum() or char in "_-"


def _holds(text: str, value: str) -> bool:
    """Whether ``text`` (a person's, or the arguments a call sent) holds ``value`` whole: "313"
    is not in "3131 errors", nor "payments-db" in "payments-db-replica"."""
    joins = str.isdigit if _is_number(value) else _name_char
    return _find(text, value, joins, 0) >= 0


def _find(text: str, value: str, joins: Callable[[str], bool] | None, start: int) -> int:
    """Where ``value`` next stands in ``text`` from ``start``; with ``joins``, only where no
    character it accepts adjoins it."""
    at = text.find(value, start)
    while joins is not None and at >= 0:
        end = at + len(value)
        if (at == 0 or not joins(text[at - 1])) and (end >= len(text) or not joins(text[end])):
            return at
        at = text.find(value, at + 1)
    return at


def _origin(path: str, value: str, found: _Found) -> ArgumentOrigin:
    text = found.output.text
    start = text.rfind("\n", 0, found.at) + 1
    end = text.find("\n", found.at)
    line = text[start : end if end >= 0 else len(text)]
    return ArgumentOrigin(
        argument=path,
        value=value,
        tool=found.output.tool,
        call_id=found.output.call_id,
        line=text.count("\n", 0, found.at) + 1,
        excerpt=excerpt(line, found.at - start, len(value)),
        instruction_like=instruction_like(text),
    )


def excerpt(line: str, at: int, length: int) -> str:
    """One line around ``line[at:at + length]``, trimmed to ``EXCERPT_CHARS`` with ``…``."""
    if len(line) <= EXCERPT_CHARS:
        return line.strip()
    room = max(0, EXCERPT_CHARS - length) // 2
    begin = max(0, min(at - room, len(line) - EXCERPT_CHARS))
    finish = begin + max(EXCERPT_CHARS, length)
    head = "…" if begin > 0 else ""
    tail = "…" if finish < len(line) else ""
    return f"{head}{line[begin:finish].strip()}{tail}"
