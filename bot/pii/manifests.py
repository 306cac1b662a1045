"""The data of a Kubernetes Secret, as kubectl get secret -o yaml or -o json and manifests show
it: every value under its ``data:`` or ``stringData:`` is a secret, whatever its key is named
(``api: c2VjcmV0MTIz`` says nothing of a secret but where it stands).

Read by lines from each line that says ``kind: Secret``: the object is the run of lines at that
key's indent or deeper around it, and its ``data:`` block the deeper lines after that key. A
ConfigMap's data, at the same place in its own object, is left.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator

from bot.patterns import finditer_with, on_use
from bot.pii.labelled import stand_in
from bot.pii.scantext import PiiHit, ScanText

_KIND_LINE = on_use(r"[ \t]*(?:-[ \t]+)?[\"']?kind[\"']?[ \t]*:[ \t]*[\"']?Secret[\"']?[ \t]*,?\r?")
_DATA_KEY = on_use(r"[\"']?(?:data|stringData)[\"']?[ \t]*+:[ \t]*+\{?[ \t]*+\r?")
# An entry's key and its colon; the value, the rest of the line, is trimmed in Python (a lazy
# value before trailing blanks would be tried at every blank of a long line).
_ENTRY_KEY = on_use(r"(?P<key>\"[^\"\r\n]*+\"|'[^'\r\n]*+'|[^\s:\"'][^:\r\n]*+):")
_BLOCK_SCALARS = frozenset({"|", ">", "|-", ">-", "|+", ">+"})
_LINE_REACH = 256  # a kind line is short: a "Secret" farther from a line's ends is in prose
_PUBLIC_SUFFIXES = (".crt",)  # a certificate (tls.crt, ca.crt) is public


class _Lines:
    """The text's lines: where each starts and ends, and the column of its key."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def __len__(self) -> int:
        return len(self.starts)

    def index(self, position: int) -> int:
        """The line that holds ``position``."""
        return bisect_right(self.starts, position) - 1

    def span(self, line: int) -> tuple[int, int]:
        """Where the line starts and ends (its line end left out)."""
        start = self.starts[line]
        end = self.starts[line + 1] - 1 if line + 1 < len(self.starts) else len(self.text)
        return start, end

    def key(self, line: int) -> tuple[int, bool] | None:
        """Where the line's key starts and whether a list's "- " stands before it; None for a
        blank line, and -1 for a document's separator ("---"), which ends every object."""
        start, end = self.span(line)
        text = self.text
        column = start
        while column < end and text[column] in " \t":
            column += 1
        marker = text.startswith("- ", column)
        if marker:
            column += 2
            while column < end and text[column] in " \t":
                column += 1
        if text.startswith("---", column):
            return -1, False  # before every column: it ends the object
        if column >= end or text[column] == "\r":
            return None
        return column - start, marker


def _kind_lines(text: str) -> Iterator[int]:
    """The positions of the lines that say ``kind: Secret``."""
    position = text.find("Secret")
    while position >= 0:
        low = text.rfind("\n", max(0, position - _LINE_REACH), position) + 1
        high = text.find("\n", position, position + _LINE_REACH)
        high = len(text) if high < 0 and position + _LINE_REACH >= len(text) else high
        short = (low > 0 or position < _LINE_REACH) and high >= 0
        if short and _KIND_LINE.fullmatch(text, low, high):
            yield low
        position = text.find("Secret", position + len("Secret"))


class _Objects:
    """Where the objects around kind lines start and end, read once over the text's lines.

    An object's first line follows the nearest line above its kind line with a key less
    indented (or is a list item's "- " at its indent): a stack of the lines whose keys are
    less indented than every line after them finds it for every kind line in one pass, where
    a walk up from each would read the same lines again for each indent (quadratic).
    """

    def __init__(self, lines: _Lines) -> None:
        self.lines = lines
        self.read = 0  # the lines above this one are on the stack
        self.stack: list[tuple[int, int]] = []  # (a line's rank, the line), ranks increasing
        self.data: dict[int, list[int]] = {}  # a data key's column: its lines, in order
        self.keys: list[tuple[int, bool] | None] = []

    def _rank(self, column: int, marker: bool) -> int:
        """How a key ranks for a stop: a list item's "- " stops an object at its column."""
        return 2 * column - (1 if marker else 0)

    def first(self, kind: int, column: int, marker: bool) -> int:
        """The first line of the object whose keys stand at ``column``, around ``kind``."""
        self._read_to(kind)
        if marker:
            return kind  # the "- " of a list's item starts the object
        rank = self._rank(column, False)
        found = bisect_left(self.stack, (rank, -1)) - 1  # the nearest line above, ranked lower
        if found < 0:
            return 0
        line = self.stack[found][1]
        key = self.keys[line]
        return line if key is not None and key[0] == column else line + 1

    def data_lines(self, column: int, first: int, last: int) -> list[int]:
        """The lines in [first, last] whose key, at ``column``, is data: or stringData:."""
        self._read_to(last + 1)
        lines = self.data.get(column, [])
        return lines[bisect_left(lines, first) : bisect_right(lines, last)]

    def _read_to(self, end: int) -> None:
        """Reads the lines up to ``end``: their keys, the stack, the data keys."""
        text = self.lines.text
        while self.read < min(end, len(self.lines)):
            line = self.read
            key = self.lines.key(line)
            self.keys.append(key)
            self.read += 1
            if key is None:
                continue
            rank = self._rank(*key) if key[0] >= 0 else -1
            while self.stack and self.stack[-1][0] >= rank:
                self.stack.pop()
            self.stack.append((rank, line))
            start, stop = self.lines.span(line)
            if key[0] >= 0 and _DATA_KEY.fullmatch(text, start + key[0], stop):
                self.data.setdefault(key[0], []).append(line)


def _last(lines: _Lines, kind: int, column: int) -> int:
    """The last line of the object whose keys stand at ``column``, from ``kind`` on."""
    last = kind
    line = kind + 1
    while line < len(lines):
        key = lines.key(line)
        if key is not None:
            if key[0] < column or (key[0] == column and key[1]):
                break
            last = line
        line += 1
    return last


def _data_values(lines: _Lines, data: int, column: int) -> Iterator[PiiHit]:
    """The values of the entries under the ``data:`` key on line ``data``."""
    text = lines.text
    line = data + 1
    entry_column = -1
    block: list[int] = []  # the first and last line of a block scalar's content
    while line < len(lines):
        key = lines.key(line)
        if key is not None and key[0] <= column:
            break
        if key is None:
            line += 1
            continue
        start, end = lines.span(line)
        if entry_column < 0:
            entry_column = key[0]
        if key[0] > entry_column and block:
            block[1:] = [line]
        else:
            yield from _block_hit(lines, block)
            block = []
            entry = _entry(text, start + key[0], end)
            if entry is not None:
                name, value_start, value_end = entry
                value = text[value_start:value_end]
                if value in _BLOCK_SCALARS:
                    block = [line + 1, line]
                elif not name.endswith(_PUBLIC_SUFFIXES) and value not in ("{}", '""', "''"):
                    if value[0] in "\"'" and value[-1] == value[0] and len(value) > 1:
                        value_start, value_end = value_start + 1, value_end - 1
                    yield PiiHit("GENERIC_SECRET", value_start, value_end)
        line += 1
    yield from _block_hit(lines, block)


def _entry(text: str, start: int, end: int) -> tuple[str, int, int] | None:
    """The key of the entry on [start, end) and where its value starts and ends (blanks and
    JSON's comma after it left out); None if it has no key or no value on its line."""
    key = _ENTRY_KEY.match(text, start, end)
    if key is None:
        return None
    value_start, value_end = key.end(), end
    while value_start < value_end and text[value_start] in " \t":
        value_start += 1
    while value_end > value_start and text[value_end - 1] in " \t\r":
        value_end -= 1
    if value_end > value_start + 1 and text[value_end - 1] == "," and text[value_start] in "\"'":
        value_end -= 1  # pretty JSON's comma between entries
    if value_end == value_start or value_start == key.end():
        return None  # "key:" alone (a nested map), or "key:value", which YAML reads as a key
    return key.group("key").strip().strip("\"'"), value_start, value_end


def _block_hit(lines: _Lines, block: list[int]) -> Iterator[PiiHit]:
    """A hit over a block scalar's content, from its first character to its last."""
    if not block or block[1] < block[0]:
        return
    start, _ = lines.span(block[0])
    _, end = lines.span(block[1])
    text = lines.text
    while start < end and text[start] in " \t":
        start += 1
    while end > start and text[end - 1] in " \t\r":
        end -= 1
    if end > start:
        yield PiiHit("GENERIC_SECRET", start, end)


# JSON on one line (kubectl apply's last-applied-configuration annotation, jq -c), its quotes
# escaped once more inside a JSON string: a data object, its string values, and the kind.
_JSON_DATA = on_use(r"\"(?:data|stringData)\\*\"[ \t]*:[ \t]*\{(?P<body>[^{}\r\n]*+)\}")
_JSON_VALUE = on_use(r"\\*\"[ \t]*:[ \t]*\\*\"(?P<value>(?:[^\"\\\r\n]|\\[^\"\r\n])*+)\\*\"")
_JSON_KIND = on_use(r"kind\\*\"[ \t]*:[ \t]*\\*\"Secret\\*\"")


def _json_data(text: str) -> Iterator[PiiHit]:
    """The string values of a data object on a line that says its kind is Secret."""
    line = (-1, -1, False)  # the last line read: its start, its end, whether it says Secret
    for data in finditer_with(_JSON_DATA, text, '"data', '"stringData'):
        if not line[0] <= data.start() < line[1]:
            start = text.rfind("\n", 0, data.start()) + 1
            end = text.find("\n", data.end())
            end = len(text) if end < 0 else end
            line = (start, end, _JSON_KIND.search(text, start, end) is not None)
        if not line[2]:
            continue
        for value in _JSON_VALUE.finditer(text, *data.span("body")):
            if value.group("value"):
                yield PiiHit("GENERIC_SECRET", *value.span("value"))


# kubectl create secret generic NAME --from-literal=KEY=VALUE: every value is the secret's.
_FROM_LITERAL = on_use(
    r"--from-literal(?:=|[ \t]+)(?:\\*(?P<q>[\"']))?[^=\s\"']{1,253}="
    r"(?P<value>(?(q)[^\"'\r\n]+|[^\s\"']+))"
)


# kubectl create configmap (or cm) takes --from-literal too: its values are no secret. The
# nearest create before an option is its command's, read over a few continued lines.
_CREATE_REACH = 1024
_CREATE_CONFIGMAP = on_use(r"create[ \t]+(?:configmap|cm)(?![A-Za-z0-9_-])")
_CREATE_SECRET = on_use(r"create[ \t]+secret(?![A-Za-z0-9_-])")


def _config_map_literal(text: str, option: int) -> bool:
    """Whether the --from-literal at ``option`` is kubectl create configmap's."""
    low = max(0, option - _CREATE_REACH)
    create = text.rfind("create", low, option)
    while create >= 0:
        if _CREATE_SECRET.match(text, create, option):
            return False
        if _CREATE_CONFIGMAP.match(text, create, option):
            return True
        create = text.rfind("create", low, create)
    return False  # no command in sight: the values are taken for a Secret's


def _from_literals(text: str) -> Iterator[PiiHit]:
    """The values of kubectl create secret's --from-literal options."""
    for match in finditer_with(_FROM_LITERAL, text, "--from-literal"):
        if not stand_in(match.group("value")) and not _config_map_literal(text, match.start()):
            yield PiiHit("GENERIC_SECRET", *match.span("value"))


def find_secret_data(src: ScanText) -> Iterator[PiiHit]:
    """Every value under a Kubernetes Secret's ``data:`` or ``stringData:``, and of kubectl
    create secret's ``--from-literal``."""
    text = src.text
    yield from _from_literals(text)
    if "Secret" not in text or "ata" not in text:  # C searches: most outputs hold neither
        return
    if '"' in text:
        yield from _json_data(text)
    lines: _Lines | None = None
    objects: _Objects | None = None
    covered = -1  # the last line of the last object read: a kind line in it is its own
    for kind_start in _kind_lines(text):
        lines = lines or _Lines(text)
        objects = objects or _Objects(lines)
        kind = lines.index(kind_start)
        key = lines.key(kind)
        if kind <= covered or key is None or key[0] < 0:
            continue
        column = key[0]
        first = objects.first(kind, column, key[1])
        covered = last = _last(lines, kind, column)
        for line in objects.data_lines(column, first, last):
            yield from _data_values(lines, line, column)
