"""``CommandTool``: runs a declared argv (never a shell) in its own process group.

Substitution rule: an argv element that is exactly ``{param}`` is replaced by that argument's
value as one whole element; an element that is ``{param}`` for an argument absent from the call
is dropped entirely (so optional flags and trailing positionals simply disappear). An element
that contains ``{param}`` among other text is refused when the tool is built: splicing a value
into a larger element would let a caller smuggle extra syntax into it, and so is an element
with a brace without its pair (``{unit``): a placeholder mistyped, which would reach the program
as it is written. The program (the first element) is always literal, so the model never
chooses what runs.

Option rule: a value that starts with ``-`` (``--version``, ``-rf``, ``-``, a negative number) is
refused with an error result, because the program would read it as an option, unless the
parameter is listed in ``allow_leading_dash`` or every element it fills comes after a literal
``--`` element (the conventional end of options).

Patterns: a ``pattern`` keyword in the parameters is evaluated by RE2, which runs in time linear
in the value, so no pattern can stall the event loop. Search semantics as JSON Schema says (a
pattern matches anywhere unless anchored), and ``^`` and ``$`` mean the start and end of the whole
value, never of a line: ``$`` does not match before a trailing newline. A pattern RE2 cannot run
(backreferences, lookaround) is refused when the tool is built, and so is ``patternProperties``
(a command only uses arguments declared under ``properties``).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.patterns import on_use
from bot.text import shell_variable, shell_variable_within
from bot.tools.base import (
    DEFAULT_MAX_OUTPUT,
    ToolContext,
    ToolFlags,
    ToolResult,
    check_tool_name,
)
from bot.tools.child import PIPE_GRACE, Capture, kill_group, spawn, within
from bot.tools.isolation import Isolation, command_message, program_problem, ran_nothing
from bot.tools.schema_words import problem_line
from bot.tools.standby import give, spawn_helper
from bot.tools.verdicts import SOUND_PARAMETERS, VALID_ARGUMENTS, found_clean, keep_clean

# RE2 and jsonschema are imported where a pattern or a schema is first compiled: slow to
# import, and a command that only reads the catalog for its flags needs neither.
if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"

_PLACEHOLDER = on_use(r"\{[A-Za-z_][A-Za-z0-9_-]*\}")
_WHOLE = "a {param} must be a whole argv element"
# After killing the group, how long to collect what the killed processes already wrote.
_DRAIN_AFTER_KILL = 0.2
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
END_OF_OPTIONS = "--"
SchemaPath = tuple[str | int, ...]

# Keywords whose value is a subschema or a list or map of them: where a ``pattern`` can be.
# Instance data (``const``, ``enum``, ``default``, ``examples``) is deliberately not walked.
_SUBSCHEMA_KEYWORDS = frozenset(
    {
        "additionalItems",
        "additionalProperties",
        "allOf",
        "anyOf",
        "contains",
        "contentSchema",
        "else",
        "if",
        "items",
        "not",
        "oneOf",
        "prefixItems",
        "propertyNames",
        "then",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
_SUBSCHEMA_MAPS = frozenset(
    {"$defs", "definitions", "dependencies", "dependentSchemas", "properties"}
)

# Every keyword of JSON Schema (drafts 4 to 2020-12): a key of a schema that is none of them
# but near one is a misspelling, which a validator ignores (``patern`` checks nothing).
_KEYWORDS = frozenset(
    {
        *_SUBSCHEMA_KEYWORDS,
        *_SUBSCHEMA_MAPS,
        *("$anchor", "$comment", "$dynamicAnchor", "$dynamicRef", "$id", "$ref", "$schema"),
        *("$vocabulary", "const", "contentEncoding", "contentMediaType", "default", "deprecated"),
        *("dependentRequired", "description", "enum", "examples", "exclusiveMaximum"),
        *("exclusiveMinimum", "format", "id", "maxContains", "maxItems", "maxLength"),
        *("maxProperties", "maximum", "minContains", "minItems", "minLength", "minProperties"),
        *("minimum", "multipleOf", "pattern", "patternProperties", "readOnly", "required"),
        *("title", "type", "uniqueItems", "writeOnly"),
    }
)
# Near enough to be a misspelling (``tpye``, ``enun``), not a custom annotation (``hint``).
_MISSPELT = 0.75
# Annotations check nothing, spelt right or not: OpenAPI's ``example`` is no misspelt one.
_ANNOTATIONS = frozenset(
    {
        "$comment",
        "default",
        "deprecated",
        "description",
        "examples",
        "readOnly",
        "title",
        "writeOnly",
    }
)
# Never suggested: words so short that annotations are near them (``note``, ``when``, ``pid``),
# and annotations.
_SUGGESTED = sorted(_KEYWORDS - {"id", "if", "not", "then", "else"} - _ANNOTATIONS)
# An extension's key (OpenAPI's ``x-…``), which no validator reads, whatever follows it.
_EXTENSION = "x-"


def placeholder(element: str) -> str | None:
    """The parameter name if the element is exactly ``{param}`` (a letter or ``_``, then
    letters, digits, ``_`` or ``-``), else None."""
    if len(element) < 3 or element[0] != "{" or element[-1] != "}":
        return None
    name = element[1:-1]
    if name[0] == "-" or not name.isascii() or not name.replace("-", "_").isidentifier():
        return None
    return name


def template_problems(
    command: Sequence[str], properties: Mapping[str, Any]
) -> list[tuple[int, str]]:
    """Problems of an argv template as (element index, message); empty if it is sound."""
    if not command:
        return [(0, "command must have at least one element (the program)")]
    problems: list[tuple[int, str]] = []
    for index, element in enumerate(command):
        problem = _element_problem(index, element, properties)
        if problem:
            problems.append((index, problem))
    return problems


def undeclared_required(schema: Mapping[str, Any]) -> list[tuple[int, str]]:
    """Names ``required`` lists that ``properties`` does not declare, as (index in
    ``required``, message): a command fills only declared parameters, so the model would be
    made to send a value nothing uses."""
    required = schema.get("required")
    properties = schema.get("properties") or {}
    if not isinstance(required, list) or not isinstance(properties, Mapping):
        return []  # the schema's own check reports a malformed one
    return [
        (index, f"{name!r} is required but is not a declared parameter")
        for index, name in enumerate(required)
        if isinstance(name, str) and name not in properties
    ]


def _element_problem(index: int, element: str, properties: Mapping[str, Any]) -> str | None:
    name = placeholder(element)
    if name is None:
        return _literal_problem(element)
    if index == 0:
        return "the program (first element) must be literal, not a placeholder"
    if name not in properties:
        return f"placeholder {{{name}}} is not a declared parameter"
    declared = properties[name]
    kind = declared.get("type") if isinstance(declared, Mapping) else None
    if kind in ("object", "array"):
        return f"placeholder {{{name}}} has type {kind}; an argv element needs a scalar"
    return None


def _literal_problem(element: str) -> str | None:
    """Why an element that is no placeholder cannot be literal text: it holds one, or a brace
    without its pair (``{unit``, a placeholder mistyped, would reach the program as it is).
    Paired braces stay literal: ``{}`` for find, ``{print $1}`` for awk, ``{.items}`` for
    kubectl."""
    if shell_variable(element, argv=True):
        return (
            f"{element!r} is a shell variable, which no shell expands here (commands run from"
            " argv): write its value, or a {param} the model fills"
        )
    if "{" in element and _PLACEHOLDER.search(element):
        return f"{element!r} embeds a placeholder in other text; {_WHOLE}"
    if _unpaired(element):
        return f"{element!r} has a brace without its pair; {_WHOLE}"
    return None


def check_cwd(cwd: str | None) -> None:
    """Refuse a ``cwd`` a shell would have expanded (``ValueError``): commands start from argv,
    so ``~/ops`` or ``$HOME/ops`` is a folder of that name beside the catalog, and every call
    would fail to start."""
    if cwd is None:
        return
    if cwd.startswith("~"):
        raise ValueError(
            f"{cwd!r} starts with ~, which no shell expands here (commands run from argv):"
            " write the whole path, or one relative to the catalog's folder"
        )
    variable = shell_variable_within(cwd)
    if variable is not None:
        raise ValueError(
            f"{cwd!r} holds the shell variable {variable}, which no shell expands here"
            " (commands run from argv): write the whole path, or one relative to the catalog's"
            " folder"
        )


def _unpaired(element: str) -> bool:
    """Whether a ``}`` closes no ``{``, or a ``{`` is left open."""
    if "{" not in element and "}" not in element:
        return False
    depth = 0
    for char in element:
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth < 0:
                return True
    return depth != 0


def format_value(value: Any) -> str | None:
    """One argument value as argv text, or None if it cannot be one element."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value
    return None


def dash_guarded(command: Sequence[str], allow_leading_dash: Iterable[str] = ()) -> frozenset[str]:
    """Parameters whose values must not start with ``-`` (see the module docstring)."""
    allowed = set(allow_leading_dash)
    guarded: set[str] = set()
    after_end_of_options = False
    for element in command:
        after_end_of_options = after_end_of_options or element == END_OF_OPTIONS
        name = placeholder(element)
        if name is not None and not after_end_of_options and name not in allowed:
            guarded.add(name)
    return frozenset(guarded)


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2; ValueError with RE2's reason if RE2 cannot run it."""
    import re2

    try:
        return re2.compile(pattern, options=_re2_options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        text = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
        raise ValueError(text) from None


@functools.cache
def _re2_options() -> Any:
    import re2

    # RE2 reports a pattern it cannot run through the exception; left on, it also logs to stderr.
    options = re2.Options()
    options.log_errors = False
    return options


def pattern_problems(schema: Any, path: SchemaPath = ()) -> list[tuple[SchemaPath, str]]:
    """Patterns RE2 cannot run, and ``patternProperties`` (refused), as (schema path, message)."""
    if not isinstance(schema, Mapping):
        return []
    problems: list[tuple[SchemaPath, str]] = []
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            compile_pattern(pattern)
        except ValueError as exc:
            message = (
                f"pattern {_as_written(pattern)} cannot be checked in linear time ({exc}); "
                "RE2 has no backreferences or lookaround"
            )
            problems.append(((*path, "pattern"), message))
    if "patternProperties" in schema:
        message = "patternProperties is not supported: a command uses only declared properties"
        problems.append(((*path, "patternProperties"), message))
    for where, subschema in _subschemas(schema):
        problems += pattern_problems(subschema, (*path, *where))
    return problems


def unresolved_refs(schema: Mapping[str, Any]) -> list[tuple[SchemaPath, str]]:
    """``$ref``s of ``schema`` that point to nothing in it, as (schema path, message): the first
    call checked against it would fail in the validator, not on its arguments. A ``$ref`` out
    of the schema is never fetched. A schema with ``$id``s of its own below the root (each a
    new base for the ``$ref``s under it) is left to the validator."""
    refs = list(_refs(schema))
    if not refs or any(where for where, _, _ in _refs(schema, "$id")):
        return []
    from jsonschema import Draft202012Validator
    from jsonschema.validators import validator_for
    from referencing import Registry
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import specification_with

    dialect = validator_for(schema, default=Draft202012Validator).META_SCHEMA["$schema"]
    root = specification_with(dialect).create_resource(schema)
    resolver = Registry().resolver_with_root(root)
    problems: list[tuple[SchemaPath, str]] = []
    for where, key, ref in refs:
        try:
            resolver.lookup(ref)
        except Unresolvable:
            message = (
                f"{ref!r} points to nothing in this schema (a $ref outside it is never fetched)"
            )
            problems.append(((*where, key), message))
    return problems


def _refs(
    schema: Any, keyword: str = "$ref", path: SchemaPath = ()
) -> Iterator[tuple[SchemaPath, str, str]]:
    """Each string ``keyword`` (``$ref``) of ``schema`` and its subschemas, with where it is."""
    if not isinstance(schema, Mapping):
        return
    value = schema.get(keyword)
    if isinstance(value, str):
        yield path, keyword, value
    for where, subschema in _subschemas(schema):
        yield from _refs(subschema, keyword, (*path, *where))


def misspelt_keywords(schema: Any, path: SchemaPath = ()) -> list[tuple[SchemaPath, str]]:
    """Keys of ``schema`` and its subschemas that are no JSON Schema keyword but near one, as
    (schema path, message): a validator ignores them, so what they meant goes unchecked."""
    from bot.plain import nearest  # only to describe a mistake

    if not isinstance(schema, Mapping):
        return []
    problems: list[tuple[SchemaPath, str]] = []
    for key in schema:
        known = key in _KEYWORDS or str(key).startswith(_EXTENSION)
        near = None if known else nearest(str(key), _SUGGESTED, _MISSPELT)
        if near is not None:
            message = (
                f"not a JSON Schema keyword (did you mean {near}?): a validator ignores it,"
                " and checks nothing"
            )
            problems.append(((*path, key), message))
    for where, subschema in _subschemas(schema):
        problems += misspelt_keywords(subschema, (*path, *where))
    return problems


def _as_written(pattern: str) -> str:
    """A pattern quoted as a YAML single-quoted string: backslashes as written, not doubled."""
    return "'" + pattern.replace("'", "''") + "'"


def _subschemas(schema: Mapping[str, Any]) -> Iterator[tuple[SchemaPath, Any]]:
    for keyword, value in schema.items():
        if keyword in _SUBSCHEMA_MAPS and isinstance(value, Mapping):
            for name, subschema in value.items():
                yield (keyword, name), subschema
        elif keyword in _SUBSCHEMA_KEYWORDS and isinstance(value, list):
            for index, subschema in enumerate(value):
                yield (keyword, index), subschema
        elif keyword in _SUBSCHEMA_KEYWORDS:
            yield (keyword,), value


def _linear_pattern(
    validator: Any,
    pattern: Any,
    instance: Any,
    schema: Any,  # noqa: ARG001
) -> Iterator[ValidationError]:
    """The ``pattern`` keyword on RE2, never on Python's backtracking ``re``."""
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "string") or not isinstance(pattern, str):
        return
    try:
        compiled = compile_pattern(pattern)
    except ValueError as exc:
        yield ValidationError(f"pattern {pattern!r} cannot be checked in linear time ({exc})")
        return
    try:
        found = compiled.search(instance)
    except UnicodeError:
        # A lone surrogate survives json.loads but is not text any program could be given.
        yield ValidationError(f"{instance!r} is not valid Unicode text")
        return
    if found is None:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


@functools.cache
def _linear(base: type[Validator]) -> type[Validator]:
    # One class per draft, so a catalog's ``$schema`` keeps its own draft's other keywords.
    from jsonschema.validators import extend

    extended: type[Validator] = extend(base, {"pattern": _linear_pattern})  # type: ignore[no-untyped-call]
    return extended


def schema_validator(schema: Mapping[str, Any]) -> Validator:
    """A validator of ``schema`` whose ``pattern`` keywords run on RE2 (module docstring)."""
    from jsonschema import Draft202012Validator
    from jsonschema.validators import validator_for

    return _linear(validator_for(schema, default=Draft202012Validator))(schema)


def minimal_env(allow: Sequence[str], home: str) -> dict[str, str]:
    """The child's whole environment: safe defaults plus allowlisted variables that are set."""
    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": home}
    for name in allow:
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _scratch_home() -> str:
    """A new private folder for one call's ``HOME``. ``tempfile`` is imported only where the
    temporary folder cannot take it: with ``shutil`` and the compression modules it brings, it
    cost every ``kestrel runs approve`` some 5 ms."""
    named = (os.environ.get(name) for name in ("TMPDIR", "TEMP", "TMP"))  # as tempfile reads
    under = os.path.abspath(next((path for path in named if path), "/tmp"))
    folder = os.path.join(under, f"kestrel-home-{os.urandom(8).hex()}")
    try:
        os.mkdir(folder, 0o700)
    except OSError:
        import tempfile

        return tempfile.mkdtemp(prefix="kestrel-home-")
    return folder


def _remove_home(folder: str) -> None:
    """Remove a call's ``HOME``; ``shutil`` only for one the command wrote into."""
    try:
        os.rmdir(folder)
    except OSError:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def _first_problem(
    command: Sequence[str], schema: Mapping[str, Any], allow_leading_dash: Sequence[str]
) -> str | None:
    """The first reason the tool cannot be built, as ``where: message``; None if it can."""
    properties = schema.get("properties") or {}
    template = template_problems(command, properties)
    if template:
        index, message = template[0]
        return f"command[{index}]: {message}"
    undeclared = [name for name in allow_leading_dash if name not in properties]
    if undeclared:
        return f"allow_leading_dash: {undeclared[0]!r} is not a declared parameter"
    required = undeclared_required(schema)
    if required:
        index, message = required[0]
        return f"parameters.required[{index}]: {message}"
    patterns = [] if found_clean(SOUND_PARAMETERS, schema) else pattern_problems(schema)
    if patterns:
        path, message = patterns[0]
        return _error_line(("parameters", *path), message)
    return None


def _json_copy(value: Any) -> Any:
    """A deep copy of a JSON value (its dicts and lists new, the rest immutable and shared): the
    tool's schema, out of its caller's reach. ``copy.deepcopy`` did it for 2.5 M instructions of
    every ``kestrel runs approve``, most of them importing ``copy``."""
    if isinstance(value, dict):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_json_copy(item) for item in value)
    return value


def _error_line(path: Iterable[object], message: str) -> str:
    where = ".".join(str(part) for part in path)
    return f"{where}: {message}" if where else message


class CommandTool:
    """A tool that runs one declared argv with whole-element argument substitution."""

    # Attributes, not properties, and never changed after __init__: a run reads them a dozen
    # times per call, and a property is a Python call each time on 3.11.
    name: str  # the unique name in the tool set
    description: str  # one line for the model
    parameters: dict[str, Any]  # the JSON Schema of the arguments
    flags: ToolFlags  # gating, idempotency, pacing and timeout
    # Where the tool was declared (``file:line``), for messages that must point at it.
    origin: str | None

    def __init__(
        self,
        name: str,
        description: str,
        command: Sequence[str],
        *,
        parameters: Mapping[str, Any] | None = None,
        flags: ToolFlags | None = None,
        env: Sequence[str] = (),
        cwd: Path | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
        allow_leading_dash: Sequence[str] = (),
        origin: str | None = None,
        isolation: Isolation | None = None,
        catalog_folder: Path | None = None,
    ) -> None:
        schema = dict(parameters) if parameters is not None else _NO_PARAMETERS
        check_tool_name(name)
        problem = _first_problem(command, schema, allow_leading_dash)
        if problem:
            raise ValueError(f"tool {name!r}: {problem}")
        if max_output <= 0:
            raise ValueError(f"tool {name!r}: max_output must be positive")
        self.name = name
        self.description = description
        self._command = tuple(command)
        self.parameters = _json_copy(schema)
        self.flags = flags or ToolFlags()
        self._env = tuple(env)
        self._cwd = cwd
        self._max_output = max_output
        self._guarded = dash_guarded(self._command, allow_leading_dash)
        self._placeholders = tuple(dict.fromkeys(filter(None, map(placeholder, self._command))))
        self.origin = origin
        self._isolation = isolation
        self._catalog_folder = catalog_folder

    @functools.cached_property
    def _validator(self) -> Validator:
        # Compiled for the first call it checks: the patterns were checked when it was built.
        return schema_validator(self.parameters)

    def definition(self) -> dict[str, Any]:
        """The argv template, its environment, folder and output limit, and whether it is
        isolated; a path in its catalog's folder written as the catalog writes it
        (``./bin/x``), so that replicas of one configuration in other folders agree."""
        return {
            "command": [self._as_declared(element) for element in self._command],
            "env": list(self._env),
            "cwd": self._as_declared(str(self._cwd)) if self._cwd else "",
            "max_output": self._max_output,
            "dash_guarded": sorted(self._guarded),
            "isolated": self._isolation is not None,
        }

    def _as_declared(self, path: str) -> str:
        folder = self._catalog_folder
        if folder is None:
            return path
        if path == str(folder):
            return "."
        inside = f"{folder}/"
        return "./" + path.removeprefix(inside) if path.startswith(inside) else path

    @property
    def command(self) -> tuple[str, ...]:
        """The argv template."""
        return self._command

    def argv(self, arguments: Mapping[str, Any]) -> list[str]:
        """The argv for these arguments; ValueError if an argument cannot be one element."""
        required = set(self.parameters.get("required") or ())
        argv: list[str] = []
        for element in self._command:
            name = placeholder(element)
            if name is None:
                argv.append(element)
                continue
            value = arguments.get(name)
            if value is None:
                if name in required:
                    raise ValueError(f"missing required argument {name!r}")
                continue
            argv.append(self._element(name, value))
        return argv

    def argument_errors(self, arguments: dict[str, Any]) -> list[str]:
        """Every way ``arguments`` are invalid: the schema (patterns on RE2), then argv rules."""
        errors = self._schema_errors(arguments)
        problems = [problem_line(error) for error in errors]
        # One line per argument: one the schema already refused is not judged again.
        refused = {error.absolute_path[0] for error in errors if error.absolute_path}
        for name in self._placeholders:
            value = arguments.get(name)
            if value is None or name in refused:
                continue
            try:
                self._element(name, value)
            except ValueError as exc:
                problems.append(str(exc))
        return problems

    def _schema_errors(self, arguments: dict[str, Any]) -> list[ValidationError]:
        """The schema's complaints. A gated call is checked again when it runs approved, often
        in another process: its arguments found valid are kept as such (``bot.tools.verdicts``)."""
        gated = self.flags.approval.confirm
        if gated and found_clean(VALID_ARGUMENTS, self.parameters, arguments):
            return []
        errors = list(self._validator.iter_errors(arguments))
        if gated and not errors:
            keep_clean(VALID_ARGUMENTS, self.parameters, arguments)
        return errors

    def _element(self, name: str, value: Any) -> str:
        """One argument as one argv element; ValueError naming the argument if it cannot be."""
        text = format_value(value)
        if text is None:
            raise ValueError(f"argument {name!r} must be a string, number or boolean")
        if "\0" in text:
            raise ValueError(f"argument {name!r} contains a NUL byte")
        if text.startswith("-") and name in self._guarded:
            raise ValueError(
                f"argument {name!r} must not start with '-': the program would read it as an option"
            )
        return text

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run once; the caller bounds it with ``asyncio.timeout``; cancelling kills the group."""
        try:
            argv = self.argv(arguments)
        except ValueError as exc:
            return ToolResult(output=str(exc), is_error=True)
        home = _scratch_home()
        try:
            return await self._spawn_and_run(argv, home, ctx)
        finally:
            _remove_home(home)

    async def _spawn_and_run(self, argv: list[str], home: str, ctx: ToolContext) -> ToolResult:
        env = minimal_env(self._env, home)
        cwd = ctx.workdir or self._cwd or Path(home)
        program = argv[0]
        if self._isolation is not None:
            problem = program_problem(program, env["PATH"], cwd)
            if problem:
                return ToolResult(output=problem, is_error=True)
        process = await self._process(argv, env, cwd)
        if isinstance(process, ToolResult):
            return process
        transport, capture = process
        try:
            status = await self._run(transport, capture, ctx)
        finally:
            transport.close()
        return self._result(program, status, capture)

    async def _process(
        self, argv: list[str], env: dict[str, str], cwd: str | Path
    ) -> tuple[asyncio.SubprocessTransport, Capture] | ToolResult:
        """The command's process: isolated, the helper standing by or one started for it; an
        error result if none could start."""
        try:
            if self._isolation is not None:
                return await self._isolated(self._isolation, argv, env, cwd)
            return await self._unisolated(argv, env, cwd)
        except OSError as exc:
            cause = exc.strerror or str(exc)
            where = f" ({exc.filename})" if exc.filename else ""
            return ToolResult(output=f"cannot start {argv[0]!r}: {cause}{where}", is_error=True)

    async def _isolated(
        self, isolation: Isolation, argv: list[str], env: dict[str, str], cwd: str | Path
    ) -> tuple[asyncio.SubprocessTransport, Capture]:
        """The helper that runs the command: the one standing by, else one started now. Either
        is sent the command on stdin: the helper's own interpreter changes its environment
        (the C locale coerced, PEP 538), and enters the folder after the covers."""
        standby = isolation.standby
        standing = standby.take(argv, env, cwd, self._max_output) if standby else None
        if standing is not None:
            return standing
        transport, capture = await spawn_helper(isolation)
        give(transport, capture, command_message(argv, env, cwd), self._max_output)
        return transport, capture

    async def _unisolated(
        self, argv: list[str], env: dict[str, str], cwd: str | Path
    ) -> tuple[asyncio.SubprocessTransport, Capture]:
        """The command started as it is (a catalog loaded without an isolation)."""
        return await spawn(argv, self._max_output, env=env, cwd=cwd)

    def _result(self, program: str, status: int, capture: Capture) -> ToolResult:
        """What the command printed and how it ended; an error if the helper ran nothing (a
        program the check before could not foresee failing: a script's missing interpreter)."""
        said = None if self._isolation is None else ran_nothing(status, capture.kept, program)
        if said is not None:
            return ToolResult(output=said, is_error=True)
        return ToolResult(output=capture.render(status))

    @staticmethod
    async def _run(
        transport: asyncio.SubprocessTransport, capture: Capture, ctx: ToolContext
    ) -> int:
        """The command's exit status, once its processes are gone and its output is read."""
        pgid = transport.get_pid()
        try:
            if ctx.started is not None:
                ctx.started(pgid)
            await within(capture.exited)
            await within(capture.eof, PIPE_GRACE)
        except BaseException:
            # Cancellation is how the caller's timeout arrives: leave nothing running behind,
            # then let the child be reaped before the cancellation goes on.
            kill_group(pgid)
            await within(capture.exited, PIPE_GRACE)
            raise
        # The call's processes do not outlive it: background leftovers and pipe holders go too.
        kill_group(pgid)
        await within(capture.eof, _DRAIN_AFTER_KILL)
        status = transport.get_returncode()
        assert status is not None  # the child has exited
        return status
