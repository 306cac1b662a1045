"""YAML tool catalogs: validated into ``CommandTool``s, every problem reported as file:line.

An argv element starting with ``./`` (and a relative ``cwd``) is resolved against the catalog
file's directory, so a catalog can ship its own scripts next to it.

Option injection: a value that fills an argv element and starts with ``-`` is refused (the model
gets an error result) unless the element comes after a literal ``"--"`` in ``command`` or the
parameter is listed in the tool's ``allow_leading_dash: [param, ...]``. The list sits beside
``command`` rather than inside ``parameters`` because the parameters are sent to the model as
plain JSON Schema.

Patterns: every ``pattern`` in ``parameters`` is evaluated by RE2 (linear time, so no value can
stall the event loop) with JSON Schema's search semantics: unanchored unless anchored, and ``^``
and ``$`` mean the start and end of the whole value, so ``^[a-z]+$`` refuses ``"abc\n"`` (Python's
``re`` would accept it). A pattern RE2 cannot run (backreferences, lookaround) is an error, not a
warning: the catalog does not load, since the only alternative engine can backtrack for seconds.
``patternProperties`` is an error too: a command uses only arguments declared under
``properties``.

Names are one namespace: a name declared in two files, or one that is a built-in tool's (passed
as ``reserved``), is reported at the line that declares it.

A tool's program that cannot start on this host (a path not there or not executable, a name
not on ``SAFE_PATH``) is a problem of the checks (``kestrel tools check``) and only a warning of
a load: a long-lived replica may see it installed later, and until then its calls fail.

``catalog_flags`` reads the catalogs only for their tools' flags (who may answer a request): it
checks the entries but compiles no JSON Schema and no pattern, so jsonschema and RE2 are not
even imported. Whatever runs the tools loads the catalogs whole (``load_catalogs``).
"""

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Final

import msgspec
from msgspec import Meta

from bot.kept import keep_json, name_of, recall_json
from bot.plain import Invalid, Loc, Problem, convert, dotted, run_field_checks
from bot.text import not_utf8
from bot.tools.base import (
    DEFAULT_MAX_OUTPUT,
    ApprovalPolicy,
    ToolFlags,
    ToolTraits,
    check_tool_name,
)
from bot.tools.command import (
    SAFE_PATH,
    CommandTool,
    check_cwd,
    misspelt_keywords,
    pattern_problems,
    placeholder,
    template_problems,
    undeclared_required,
    unresolved_refs,
)
from bot.tools.isolation import Isolation, is_kestrels_variable, unstartable
from bot.tools.verdicts import CHECKERS, SOUND_PARAMETERS, found_clean, keep_clean
from bot.yamldoc import PARSER, node_and_value, repeated_keys

if TYPE_CHECKING:
    import yaml

log = logging.getLogger("kestrel.tools")

_SUBFOLDER: Final = "catalogs"
# What a file's check depends on besides its text: the parser's code and the checkers'.
_CHECKING: Final = (*PARSER, *CHECKERS)
# ``\Z``, not ``$``: Python's ``$`` also matches before a final newline ("HOME\n").
_EnvName = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*\Z")]


def _no_parameters() -> dict[str, Any]:
    return {"type": "object", "properties": {}}


class CatalogError(Exception):
    """A catalog cannot be loaded; ``problems`` holds one ``file:line: …`` message per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class ToolEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One command tool as declared in a catalog; converted strictly (``true`` is no number,
    ``"30"`` no timeout): a config value of the wrong type is an error, not silently coerced."""

    # Checked on its own (bot.plain): the model APIs' rule, said in words, not as a regex.
    __field_checks__: ClassVar = {"name": check_tool_name, "cwd": check_cwd}

    name: str
    description: Annotated[str, Meta(min_length=1)]
    command: Annotated[list[str], Meta(min_length=1)]
    parameters: dict[str, Any] = msgspec.field(default_factory=_no_parameters)
    confirm: bool = False
    idempotent: bool = False
    timeout: Annotated[float, Meta(ge=0)] = 30
    operator_paced: bool = False
    tags: list[str] = []
    approvals: Annotated[int, Meta(ge=1)] = 1
    deny: bool = False
    env: list[_EnvName] = []
    cwd: str | None = None
    max_output: Annotated[int, Meta(gt=0)] = DEFAULT_MAX_OUTPUT
    allow_leading_dash: list[str] = []
    trusted_from: dict[str, list[str]] = {}

    def __post_init__(self) -> None:
        run_field_checks(self)


class CatalogFile(msgspec.Struct, forbid_unknown_fields=True):
    """The top level of a catalog file; entries are validated one by one."""

    tools: list[Any]


def _child(node: "yaml.Node", part: str | int, *, key: bool) -> "yaml.Node | None":
    import yaml  # imported already: the node is one of its

    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == str(part):
                return key_node if key else value_node
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int):
        return node.value[part] if 0 <= part < len(node.value) else None
    return None


def _line_of(root: "yaml.Node", loc: Loc) -> int:
    """The 1-based line of the deepest node on ``loc`` (the key itself for a mapping entry)."""
    node = root
    for index, part in enumerate(loc):
        child = _child(node, part, key=index == len(loc) - 1)
        if child is None:
            break
        node = child
    return node.start_mark.line + 1


class _Report(msgspec.Struct):
    """Problems of one file, each placed at the line its path leads to."""

    shown: str
    root: "yaml.Node | None" = None
    problems: list[str] = msgspec.field(default_factory=list)

    def at(self, loc: Loc, message: str, *, line: int | None = None) -> None:
        """Record a problem at ``line``, or else at the node ``loc`` leads to."""
        where = f"{dotted(loc)}: " if loc else ""
        self.problems.append(f"{self.shown}:{line or self.line(loc)}: {where}{message}")

    def line(self, loc: Loc) -> int:
        """The line ``loc`` leads to."""
        return _line_of(self.root, loc) if self.root is not None else 1


def _place(report: _Report, found: list[Problem], prefix: Loc = ()) -> None:
    """Report each problem ``bot.plain`` found below ``prefix`` at its line."""
    for problem in found:
        report.at((*prefix, *problem.loc), problem.message)


def _duplicate_keys(report: _Report, node: "yaml.Node") -> None:
    """Report repeated mapping keys, which YAML would otherwise resolve silently (last wins)."""
    for loc, key, first in repeated_keys(node):
        report.at(loc, f"duplicate key (first at line {first})", line=key.start_mark.line + 1)


def _tool(raw: dict[str, Any]) -> str:
    """``tool 'name': `` for messages that must name the tool, if the entry has a name."""
    name = raw.get("name")
    return f"tool {name!r}: " if isinstance(name, str) else ""


def _schema_problems(report: _Report, raw: dict[str, Any], prefix: Loc) -> None:
    parameters = raw.get("parameters")
    if not isinstance(parameters, dict) or found_clean(SOUND_PARAMETERS, parameters):
        return
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(parameters).check_schema(parameters)
    except SchemaError as exc:
        said = _unknown_type(exc.instance) if exc.path and exc.path[-1] == "type" else None
        report.at((*prefix, *exc.path), f"invalid JSON Schema: {said or exc.message}")
        return
    before = len(report.problems)
    if parameters.get("type") != "object":
        report.at(prefix, "parameters must be a JSON Schema with type: object")
    found = [*misspelt_keywords(parameters), *pattern_problems(parameters)]
    for path, message in [*found, *unresolved_refs(parameters)]:
        report.at((*prefix, *path), _tool(raw) + message)
    if len(report.problems) == before:
        keep_clean(SOUND_PARAMETERS, parameters)


# JSON Schema's types, and what Python and YAML call them.
_TYPES: Final = ("array", "boolean", "integer", "null", "number", "object", "string")
_TYPE_ALIASES: Final = {
    "str": "string",
    "int": "integer",
    "bool": "boolean",
    "float": "number",
    "list": "array",
    "dict": "object",
    "map": "object",
    "none": "null",
}


def _unknown_type(written: Any) -> str | None:
    """What is said of a ``type`` JSON Schema lacks (``str``, or one of a list of types), with
    the type it meant; None for any other problem of a type (a number, a type listed twice),
    which jsonschema's words say."""
    if isinstance(written, list):
        unknown = [each for each in written if isinstance(each, str) and each not in _TYPES]
        return _unknown_type(unknown[0]) if unknown else None
    if not isinstance(written, str) or written in _TYPES:
        return None
    from bot.plain import nearest  # only to describe a mistake

    meant = _TYPE_ALIASES.get(written.lower()) or nearest(written.lower(), list(_TYPES))
    hint = f" (did you mean {meant}?)" if meant else ""
    listed = f"{', '.join(_TYPES[:-1])} and {_TYPES[-1]}"
    return f"{written!r} is not a type{hint}; the types are {listed}"


def _command_problems(report: _Report, raw: dict[str, Any], prefix: Loc) -> None:
    command = raw.get("command")
    parameters = raw.get("parameters", _no_parameters())
    if not isinstance(command, list) or not isinstance(parameters, dict):
        return
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        return
    elements = [element if isinstance(element, str) else str(element) for element in command]
    for index, message in template_problems(elements, properties):
        report.at((*prefix, "command", index), message)
    _dash_problems(report, raw, elements, properties, prefix)


def _argv_hint(problem: Problem, raw: Any) -> Problem:
    """A command written as a shell line shown as the argv it reads as: one element of it, as
    ``bot.plain`` would have it, names a program that is not there."""
    command = raw.get("command") if isinstance(raw, dict) else None
    if problem.loc != ("command",) or not isinstance(command, str):
        return problem
    import json  # only to describe a mistake
    import shlex

    try:
        argv = json.dumps(shlex.split(command))
    except ValueError:  # a quote left open: the elements are not to be guessed
        argv = '["program", "argument", …]'
    return Problem(
        problem.loc,
        f"expected a list (the argv; no shell runs it), got a string: write it as {argv}",
    )


def _dash_problems(
    report: _Report,
    raw: dict[str, Any],
    command: list[str],
    properties: dict[str, Any],
    prefix: Loc,
) -> None:
    """Each ``allow_leading_dash`` name must be a parameter the command uses."""
    allowed = raw.get("allow_leading_dash")
    if not isinstance(allowed, list):
        return
    used = {placeholder(element) for element in command}
    for index, name in enumerate(allowed):
        loc = (*prefix, "allow_leading_dash", index)
        if not isinstance(name, str):
            continue  # the entry's own validation reports it
        if name not in properties:
            report.at(loc, f"{_tool(raw)}{name!r} is not a declared parameter")
        elif name not in used:
            report.at(loc, f"{_tool(raw)}{name!r} is not a placeholder of the command")


def _required_problems(report: _Report, raw: dict[str, Any], prefix: Loc) -> None:
    """Each name ``parameters.required`` lists is a declared parameter."""
    parameters = raw.get("parameters")
    if not isinstance(parameters, dict):
        return
    for index, message in undeclared_required(parameters):
        report.at((*prefix, "parameters", "required", index), _tool(raw) + message)


def _trust_problems(report: _Report, raw: dict[str, Any], prefix: Loc) -> None:
    """Each ``trusted_from`` key is an argument path under a declared parameter."""
    trusted = raw.get("trusted_from")
    parameters = raw.get("parameters", _no_parameters())
    if not isinstance(trusted, dict) or not isinstance(parameters, dict):
        return
    properties = parameters.get("properties", {})
    for path in trusted:
        top = str(path).split(".", 1)[0].split("[", 1)[0]
        if isinstance(properties, dict) and top not in properties:
            message = f"{_tool(raw)}{top!r} is not a declared parameter"
            report.at((*prefix, "trusted_from", str(path)), message)


def _unknown_sources(parsed: Sequence["_Parsed"], known: set[str]) -> list[str]:
    """``trusted_from`` naming a tool no catalog of the set declares: a typo would
    silently trust nothing (or, renamed later, the wrong tool)."""
    problems: list[str] = []
    for file in parsed:
        report = _Report(shown=str(file.path))
        for entry in file.entries:
            for path, tools in entry.trusted_from.items():
                for name in tools:
                    if name not in known:
                        line = file.trust_lines.get((entry.name, path), file.lines[entry.name])
                        report.at(
                            (),
                            f"tool {entry.name!r}: trusted_from.{path} names unknown tool {name!r}",
                            line=line,
                        )
        problems.extend(report.problems)
    return problems


def _env_problems(report: _Report, raw: dict[str, Any], prefix: Loc) -> None:
    """A command is never given a variable Kestrel reads: its secrets and settings."""
    names = raw.get("env")
    if not isinstance(names, list):
        return
    for index, name in enumerate(names):
        if isinstance(name, str) and is_kestrels_variable(name):
            message = f"{_tool(raw)}{name} holds a secret or a setting of Kestrel's"
            report.at((*prefix, "env", index), message)


def _entry(report: _Report, raw: Any, index: int, *, whole: bool) -> ToolEntry | None:
    """Validate one entry, reporting every problem found; the entry if there were none.

    Not ``whole``: its parameters are not checked as JSON Schema, nor their patterns by RE2.
    """
    prefix: Loc = ("tools", index)
    before = len(report.problems)
    entry: ToolEntry | None = None
    try:
        entry = convert(raw, ToolEntry)
    except Invalid as exc:
        _place(report, [_argv_hint(problem, raw) for problem in exc.problems], prefix)
    if isinstance(raw, dict):
        if whole:
            _schema_problems(report, raw, (*prefix, "parameters"))
        _command_problems(report, raw, prefix)
        _required_problems(report, raw, prefix)
        _trust_problems(report, raw, prefix)
        _env_problems(report, raw, prefix)
    return entry if len(report.problems) == before else None


def _resolve(element: str, folder: Path) -> str:
    return str(folder / element[2:]) if element.startswith("./") else element


def _flags(entry: ToolEntry) -> ToolFlags:
    approval = ApprovalPolicy(
        confirm=entry.confirm, approvals=entry.approvals, deny=entry.deny, tags=tuple(entry.tags)
    )
    traits = ToolTraits(
        idempotent=entry.idempotent,
        operator_paced=entry.operator_paced,
        timeout=entry.timeout,
        trusted_from=tuple((path, tuple(tools)) for path, tools in entry.trusted_from.items()),
    )
    return ToolFlags(approval, traits)


def _build(entry: ToolEntry, folder: Path, origin: str, isolation: Isolation | None) -> CommandTool:
    return CommandTool(
        entry.name,
        entry.description,
        [_resolve(element, folder) for element in entry.command],
        parameters=entry.parameters,
        flags=_flags(entry),
        env=entry.env,
        cwd=folder / entry.cwd if entry.cwd else None,
        max_output=entry.max_output,
        allow_leading_dash=entry.allow_leading_dash,
        origin=origin,
        isolation=isolation,
        catalog_folder=folder,
    )


def _program_problems(files: Iterable["_Parsed"]) -> list[str]:
    """Each tool whose program cannot start on this host, at the line naming the tool: errors
    for ``tools check``, warnings for a load. A few ``stat`` calls a tool, nothing imported."""
    problems: list[str] = []
    for parsed in files:
        folder = parsed.path.resolve().parent
        for entry in parsed.entries:
            where = f"{parsed.path}:{parsed.lines[entry.name]}"
            missing = _missing_cwd(entry, folder)
            if missing is not None:
                problems.append(f"{where}: tool {entry.name!r}: {missing}")
                continue
            reason = _unstartable(entry, folder)
            if reason is not None:
                problems.append(
                    f"{where}: tool {entry.name!r}: program {entry.command[0]!r} {reason}"
                )
    return problems


def _missing_cwd(entry: ToolEntry, folder: Path) -> str | None:
    """Why the entry's ``cwd`` cannot be a call's working folder on this host; None if it can."""
    if not entry.cwd:
        return None
    cwd = folder / entry.cwd
    if cwd.is_dir():
        return None
    return f"cwd {entry.cwd!r} is not a folder here ({cwd}): no call can start in it"


def _unstartable(entry: ToolEntry, folder: Path) -> str | None:
    """Why the entry's program cannot start (``_why_unstartable``); a shell line written as
    one element (``["df -h"]``) is shown as the argv it meant."""
    reason = _why_unstartable(entry, folder)
    if reason is None:
        return None
    argv = _meant_argv(entry.command, folder)
    if argv is None:
        return reason
    return (
        f"is a command line, not a program: the command is an argv, one word to an element: {argv}"
    )


def _meant_argv(command: list[str], folder: Path) -> str | None:
    """The argv a program with spaces in it meant, as JSON, when its first word is a program
    here (``df -h``); None otherwise (``/opt/my tools/run`` is a path)."""
    if not any(char.isspace() for char in command[0]):
        return None
    import json  # only to describe a mistake
    import shlex

    try:
        words = shlex.split(command[0])
    except ValueError:  # a quote left open: the words are not to be guessed
        return None
    if not words or unstartable(words[0], SAFE_PATH, folder) is not None:
        return None
    return json.dumps([*words, *command[1:]])


def _why_unstartable(entry: ToolEntry, folder: Path) -> str | None:
    """Why the entry's program cannot start, as a call would start it (on ``SAFE_PATH``, from
    the tool's ``cwd``, else from the call's new and empty ``HOME``); None if it can."""
    program = _resolve(entry.command[0], folder)
    if "/" not in program:
        missing = unstartable(program, SAFE_PATH, folder) is not None
        return f"is not on the PATH commands run with ({SAFE_PATH})" if missing else None
    if not entry.cwd and not os.path.isabs(program):
        return (
            "cannot start: it is relative to the call's new, empty HOME "
            "(./ is the catalog's folder)"
        )
    cwd = folder / entry.cwd if entry.cwd else folder  # an absolute program: any will do
    reason = unstartable(program, SAFE_PATH, cwd)
    if reason is None:
        return None
    resolved = f" ({program})" if program != entry.command[0] else ""
    return f"cannot start: {reason}{resolved}"


def _compose(report: _Report, text: str) -> Any:
    """Parse YAML keeping the node tree for line numbers; syntax errors are reported."""
    import yaml

    try:
        report.root, value = node_and_value(text)
        return value
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        report.problems.append(f"{report.shown}:{line}: YAML error: {exc.problem or exc}")
        return None
    except RecursionError:
        report.problems.append(f"{report.shown}:1: YAML nested too deeply to be a catalog")
        return None


class _Parsed(msgspec.Struct):
    """One file's entries (only if it had no problems), problems, and each valid entry's line."""

    path: Path
    entries: list[ToolEntry] = msgspec.field(default_factory=list)
    problems: list[str] = msgspec.field(default_factory=list)
    lines: dict[str, int] = msgspec.field(default_factory=dict)
    # The line of each (tool, trusted_from key), for a source no catalog declares.
    trust_lines: dict[tuple[str, str], int] = msgspec.field(default_factory=dict)

    def tools(self, isolation: Isolation | None = None) -> list[CommandTool]:
        """The entries as tools: ``./`` paths resolved, each knowing its ``file:line``."""
        folder = self.path.resolve().parent
        return [
            _build(entry, folder, f"{self.path}:{self.lines[entry.name]}", isolation)
            for entry in self.entries
        ]


class _Clean(msgspec.Struct, array_like=True):
    """What is kept of a file found clean, in this order: the document's value (its entries
    are converted again when read back, exactly as a fresh read converts them) and the lines
    the node tree gave, which only a parse can tell."""

    data: Any
    lines: dict[str, int]
    trust_lines: list[tuple[str, str, int]]


def _entries(report: _Report, data: Any) -> list[tuple[int, Any]]:
    """The raw entries by index; top-level problems are reported without hiding theirs."""
    if data is None:
        report.problems.append(f"{report.shown}:1: the file is empty; expected 'tools:'")
        return []
    try:
        convert(data, CatalogFile)
    except Invalid as exc:
        # The tools alone, as the docs show one tool's entry: the key they go under.
        hint = ": the tools go under a key of their own, tools:, one item each"
        # An entry's own problems (a value that is not finite) are its check's to report.
        said = [problem for problem in exc.problems if not _in_an_entry(problem.loc)]
        if isinstance(data, list):
            said = [Problem(problem.loc, problem.message + hint) for problem in said]
        _place(report, said)
    tools = data.get("tools") if isinstance(data, dict) else None
    return list(enumerate(tools)) if isinstance(tools, list) else []


def _in_an_entry(loc: Loc) -> bool:
    """Whether ``loc`` lies inside one of the file's tool entries."""
    return len(loc) > 1 and loc[0] == "tools" and isinstance(loc[1], int)


def _valid_entries(report: _Report, data: Any, *, whole: bool) -> dict[int, ToolEntry]:
    """Entries without problems, by index; the others are reported."""
    valid: dict[int, ToolEntry] = {}
    for index, raw in _entries(report, data):
        entry = _entry(report, raw, index, whole=whole)
        if entry is not None:
            valid[index] = entry
    return valid


def _name_lines(report: _Report, entries: dict[int, ToolEntry]) -> dict[str, int]:
    """Each tool name's line; a name declared twice in the file is reported."""
    lines: dict[str, int] = {}
    for index, entry in entries.items():
        loc: Loc = ("tools", index, "name")
        if entry.name in lines:
            report.at(loc, f"duplicate tool name (first at line {lines[entry.name]})")
            continue
        lines[entry.name] = report.line(loc)
    return lines


def _parse(path: Path, *, whole: bool = True) -> _Parsed:
    """One file read and checked (its parameters too when ``whole``); one found clean before
    is read back from the kept folder (``_Clean``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return _Parsed(path, problems=[f"{path}: cannot read catalog: {_unread(exc)}"])
    name = name_of(_SUBFOLDER, whole, text, modules=_CHECKING)
    recalled = _recalled(path, name, whole=whole)
    if recalled is not None:
        return recalled
    parsed, data = _checked(path, text, whole=whole)
    if not parsed.problems:
        trust = [[tool, key, line] for (tool, key), line in parsed.trust_lines.items()]
        keep_json(_SUBFOLDER, name, [data, parsed.lines, trust])  # a _Clean, as JSON writes it
    return parsed


def _unread(exc: OSError | UnicodeDecodeError) -> str:
    """Why a file could not be read, in words (not an errno, nor a codec's jargon)."""
    if isinstance(exc, UnicodeDecodeError):
        return not_utf8(exc)
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return "a folder, not a file"
    return exc.strerror or str(exc)


def _checked(path: Path, text: str, *, whole: bool) -> tuple[_Parsed, Any]:
    """One file's text parsed and checked, and the document's value."""
    report = _Report(shown=str(path))
    data = _compose(report, text)
    if report.problems:
        return _Parsed(path, problems=report.problems), data
    if report.root is not None:
        _duplicate_keys(report, report.root)
    entries = _valid_entries(report, data, whole=whole)
    lines = _name_lines(report, entries)
    if report.problems:
        # The lines still let names clash across files while this file is being fixed.
        return _Parsed(path, problems=report.problems, lines=lines), data
    trust_lines = {
        (entry.name, key): report.line(("tools", index, "trusted_from", key))
        for index, entry in entries.items()
        for key in entry.trusted_from
    }
    return _Parsed(path, list(entries.values()), lines=lines, trust_lines=trust_lines), data


def _recalled(path: Path, name: str | None, *, whole: bool) -> _Parsed | None:
    """A file found clean before, from what was kept of it: its entries converted again from
    its value, as a fresh read converts them; None if nothing (readable) was kept."""
    found, kept = recall_json(_SUBFOLDER, name)
    if not found:
        return None
    try:
        clean = msgspec.convert(kept, _Clean)
    except msgspec.ValidationError:
        return None
    report = _Report(shown=str(path))
    entries = _valid_entries(report, clean.data, whole=whole)
    if report.problems:
        return None
    trust_lines = {(tool, key): line for tool, key, line in clean.trust_lines}
    return _Parsed(path, list(entries.values()), lines=clean.lines, trust_lines=trust_lines)


def check_catalog(path: Path | str) -> list[str]:
    """Every problem of one catalog file, ``file:line: …`` each, a program that cannot start
    here included; empty if it is fine."""
    parsed = _parse(Path(path))
    return parsed.problems + _program_problems([parsed])


def check_catalogs(paths: Iterable[Path | str], reserved: Iterable[str] = ()) -> list[str]:
    """Every problem of the files as one set: each file's, clashes, ``reserved`` names, and
    programs that cannot start here."""
    files, problems = _collect(_unique(Path(path) for path in paths), set(reserved))
    return problems + _program_problems(files)


def check_configured(
    patterns: Sequence[str], base_dir: Path, reserved: Iterable[str] = ()
) -> tuple[list[Path], list[str]]:
    """The files the glob patterns match (relative to ``base_dir``) and every problem of them
    as one set (``check_catalogs``), a pattern that matches nothing included."""
    problems: list[str] = []
    paths = _expand(patterns, base_dir, problems)
    files, found = _collect(paths, set(reserved))
    return paths, problems + found + _program_problems(files)


def load_catalog(path: Path | str, isolation: Isolation | None = None) -> list[CommandTool]:
    """The tools of one catalog file; ``CatalogError`` listing every problem otherwise, a
    program that cannot start here only warned of (``load_catalogs``).

    ``isolation``: how its commands are kept from Kestrel's secrets (None: not at all).
    """
    parsed = _parse(Path(path))
    if parsed.problems:
        raise CatalogError(parsed.problems)
    _warn_of_programs([parsed])
    return parsed.tools(isolation)


def _warn_of_programs(files: Iterable["_Parsed"]) -> None:
    """A program missing when a catalog loads is warned of, not refused: it may be installed
    after a long-lived replica starts, and until then its calls fail as errors."""
    for problem in _program_problems(files):
        log.warning("%s; loaded all the same, its calls fail until it can start", problem)


def _matching(pattern: str, base_dir: Path) -> list[Path]:
    """The paths a pattern names: a plain name itself if something is there, as glob says
    (``glob``, which compiles its regexes on import, is left for the patterns that need it;
    ``lexists`` on the joined text, not on a ``Path``, so that ``file.yaml/`` names nothing),
    else a glob's matches in order."""
    if not any(magic in pattern for magic in "*?["):
        plain = os.path.join(base_dir, pattern)
        return [Path(plain)] if os.path.lexists(plain) else []
    import glob

    full = os.path.join(glob.escape(str(base_dir)), pattern)
    return [Path(m) for m in sorted(glob.glob(full, recursive=True))]


def _expand(patterns: Sequence[str], base_dir: Path, problems: list[str]) -> list[Path]:
    """Files matched by the patterns (relative to ``base_dir``), in order, each once."""
    files: list[Path] = []
    seen: set[Path] = set()
    for pattern in patterns:
        found = _matching(pattern, base_dir)
        matches = [path for path in found if path.is_file()]
        if found == [base_dir / pattern] and not matches and found[0].is_dir():
            # A folder named as a whole: the catalogs in it are named by a pattern.
            inside = pattern.rstrip("/") + "/*.yaml"
            problems.append(f"{pattern}: a folder, not a catalog file: name its files ({inside})")
        elif not matches:
            problems.append(f"{pattern}: catalog pattern matches no file (in {base_dir})")
        for match in matches:
            if match.resolve() not in seen:
                seen.add(match.resolve())
                files.append(match)
    return files


def _unique(paths: Iterable[Path]) -> list[Path]:
    """Each file once, in order: a file named twice must not clash with itself."""
    seen: set[Path] = set()
    files: list[Path] = []
    for path in paths:
        if path.resolve() not in seen:
            seen.add(path.resolve())
            files.append(path)
    return files


def _collect(
    paths: Sequence[Path], reserved: set[str], *, whole: bool = True
) -> tuple[list[_Parsed], list[str]]:
    """The files as one namespace, and every problem of any file or of the set."""
    problems: list[str] = []
    files: list[_Parsed] = []
    declared: dict[str, str] = {}
    for path in paths:
        parsed = _parse(path, whole=whole)
        problems.extend(parsed.problems)
        problems.extend(_clashes(path, parsed.lines, declared, reserved))
        files.append(parsed)
    problems.extend(_unknown_sources(files, set(declared)))
    return files, problems


def _clashes(
    path: Path, lines: dict[str, int], declared: dict[str, str], reserved: set[str]
) -> list[str]:
    """Names of one file taken already, by a built-in or an earlier file; the rest are claimed."""
    problems: list[str] = []
    for name, line in lines.items():
        where = f"{path}:{line}"
        if name in reserved:
            problems.append(f"{where}: tool {name!r} shadows the built-in tool of that name")
        elif name in declared:
            problems.append(f"{where}: tool {name!r} is also declared at {declared[name]}")
        else:
            declared[name] = where
    return problems


def load_catalogs(
    patterns: Sequence[str],
    base_dir: Path,
    reserved: Iterable[str] = (),
    isolation: Isolation | None = None,
) -> list[CommandTool]:
    """The tools of every file the glob patterns match; one ``CatalogError`` for all problems.

    ``isolation``: how their commands are kept from Kestrel's secrets (None: not at all).
    """
    files = _read(patterns, base_dir, reserved, whole=True)
    _warn_of_programs(files)
    return [tool for parsed in files for tool in parsed.tools(isolation)]


def unstartable_programs(patterns: Sequence[str], base_dir: Path) -> list[str]:
    """What a load of these catalogs warns of: each tool whose program cannot start on this
    host (``file:line: tool …``), for a surface whose log does not show warnings."""
    files, _problems = _collect(_expand(patterns, base_dir, []), set(), whole=False)
    return _program_problems(files)


def catalog_flags(
    patterns: Sequence[str], base_dir: Path, reserved: Iterable[str] = ()
) -> dict[str, ToolFlags]:
    """The flags of every tool of the files the glob patterns match, by name; ``CatalogError``
    as ``load_catalogs``, but parameters are not checked (module docstring)."""
    files = _read(patterns, base_dir, reserved, whole=False)
    return {entry.name: _flags(entry) for parsed in files for entry in parsed.entries}


def _read(
    patterns: Sequence[str], base_dir: Path, reserved: Iterable[str], *, whole: bool
) -> list[_Parsed]:
    """The files the patterns match, read and checked; one ``CatalogError`` for all problems."""
    problems: list[str] = []
    files, found = _collect(_expand(patterns, base_dir, problems), set(reserved), whole=whole)
    problems.extend(found)
    if problems:
        raise CatalogError(problems)
    return files
