"""One YAML document read as ``yaml.safe_load`` reads it, parsed by libyaml when it can be; a
key written twice in one mapping, which PyYAML resolves silently (the last wins, a whole section
before it dropped), is an error of the document.

PyYAML's own parser is Python: the settings, a catalog and a script took a fresh command about
1.5 ms to parse, libyaml (``yaml.CSafeLoader``, when PyYAML was built with it) a tenth of that.
Both hand their events to the same Python constructor and resolver, so a document libyaml reads
makes the same values and the same node tree. Whatever it does not read plainly, PyYAML's parser
reads again, so that every problem is reported as before: a document libyaml refuses, and one
nesting deeper than any setting does (PyYAML's parser stops at the interpreter's recursion
limit, some 450 levels down, where libyaml goes on to 1,000).

``yaml`` is imported by the functions, not here: a runtime composed in code reads no YAML. And
a document read once is kept (``bot.kept``) as the JSON of its value, keyed by its text: a later
process that reads the same settings or script, ``kestrel runs approve`` for one, reads that
back and does not import PyYAML (some 90 M instructions, a seventh of that whole command).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from bot.kept import keep_json, name_of, recall_json
from bot.nesting import MAX_DEPTH, deeper_than

if TYPE_CHECKING:
    import yaml

_SUBFOLDER: Final = "documents"
# The parser's code: an upgrade of PyYAML (or its libyaml) changes every key.
PARSER: Final = ("yaml",)


class NotYaml(Exception):
    """A text is not one valid YAML document: PyYAML's error is ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error

    def located(self, path: object) -> str:
        """``path:line: not valid YAML (problem)``, the line where the parser stopped (``path``
        alone when it named none): one form for every file Kestrel reads as YAML."""
        mark = getattr(self.error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(self.error, "problem", None) or self.error
        return f"{where}: not valid YAML ({problem})"


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``: the document's value (None when there is none); ``NotYaml``
    (or ``RecursionError``) when the text is not one."""
    name = name_of(_SUBFOLDER, text, modules=PARSER)
    found, value = recall_json(_SUBFOLDER, name)
    if found:
        return value
    import yaml

    try:
        root, value = node_and_value(text)
    except yaml.YAMLError as exc:
        raise NotYaml(exc) from exc
    for _loc, key, first in repeated_keys(root):
        said = f"duplicate key {key.value!r}, first at line {first}"
        raise NotYaml(yaml.constructor.ConstructorError(problem=said, problem_mark=key.start_mark))
    keep_json(_SUBFOLDER, name, value)
    return value


def repeated_keys(root: yaml.Node | None) -> list[tuple[tuple[str | int, ...], yaml.Node, int]]:
    """Each key written again in its mapping below ``root``: its path, its node (whose mark is
    its line) and the line of its first writing. A node an alias repeats is looked at once."""
    import yaml

    found: list[tuple[tuple[str | int, ...], yaml.Node, int]] = []
    seen: set[int] = set()
    # A stack, not recursion: a document may nest as deep as the parser goes.
    stack: list[tuple[tuple[str | int, ...], yaml.Node]] = [((), root)] if root else []
    while stack:
        loc, node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack += [((*loc, index), item) for index, item in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            for key, value in node.value:
                name = str(key.value)
                if name in first:
                    found.append(((*loc, name), key, first[name]))
                    continue
                first[name] = key.start_mark.line + 1
                stack.append(((*loc, name), value))
    return sorted(found, key=lambda item: item[1].start_mark.index)


def node_and_value(text: str) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (its marks give line numbers) and its value; PyYAML's
    ``YAMLError`` (or ``RecursionError``) as ``yaml.SafeLoader`` raises it."""
    import yaml

    fast = getattr(yaml, "CSafeLoader", None)
    # A byte order mark past the first character: libyaml skips one that opens the document
    # after blank lines, where PyYAML keeps it in the value.
    if fast is not None and text.find("\ufeff", 1) < 0:
        try:
            root, value = _read(fast, text)
        except Exception:  # whatever libyaml's reading raised, PyYAML decides
            # Read again by PyYAML's parser, which says what is wrong as it always did: libyaml
            # accepts some documents PyYAML refuses (a tab after a tag), whose scalar the
            # constructor then fails on with a bare IndexError or ValueError.
            pass
        else:
            if not deeper_than(value, MAX_DEPTH, {}):
                return root, value
    return _read(yaml.SafeLoader, text)


def _read(loader_kind: Any, text: str) -> tuple[yaml.Node | None, Any]:
    loader = loader_kind(text)
    try:
        root = loader.get_single_node()
        return root, loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()
