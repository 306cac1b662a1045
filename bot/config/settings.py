"""Settings: one YAML file for the shape, the environment and ``.env`` for secrets and overrides."""

import json
import os
import types
from collections.abc import Mapping
from pathlib import Path
from typing import (
    Annotated,
    Any,
    ClassVar,
    Final,
    Literal,
    Union,
    get_args,
    get_origin,
)
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from bot.config.deadlines import DeadlineSettings as DeadlineSettings
from bot.config.sources import (
    DERIVED_SETTINGS,
    ENV_FILE,
    ENV_PREFIX,
    OPERATOR_VARIABLES,
    SETTING_VARIABLES,
    base_dir_of,
    check_database,
    config_path,
    dotenv,
    links_another_service,
    merged,
    names_a_setting,
    read_yaml,
    refuse_unexpanded,
    resolved,
    setting_variable,
    with_secret_files,
)
from bot.config.sources import ConfigError as ConfigError
from bot.domain import Budgets
from bot.kinds import Provenance
from bot.people.policy import PolicyRules, principals_as_written
from bot.pii.settings import PiiSettings
from bot.plain import Invalid, Problem, fields_of, is_struct, run_field_checks
from bot.plain import convert as convert_plain
from bot.text import password_masked

# The setting each variable not named KESTREL_<KEY> sets.
_SETTING_OF: Final = {variable: setting for setting, variable in SETTING_VARIABLES.items()}
# The model endpoint's variables, which a blank value unsets (``OPENAI_API_KEY=`` in .env or a
# compose file): the demo plays without either, and a blank key is no key to send.
_UNSET_WHEN_BLANK: Final = frozenset({"OPENAI_API_KEY", "OPENAI_BASE_URL"})
# Settings of these types are read from a variable as JSON, as sections are.
_CONTAINERS: Final = (list, tuple, set, frozenset, dict)
# How a variable may say yes or no to a yes-or-no setting (``true`` and ``1``, as written in
# YAML, are taken by the conversion).
_BOOLEAN_WORDS: Final = {
    **dict.fromkeys(("yes", "y", "on", "t"), "true"),
    **dict.fromkeys(("no", "n", "off", "f"), "false"),
}
DEFAULT_SYSTEM_PROMPT = (
    "You are Kestrel, an on-call assistant in a team chat. Investigate with the tools you "
    "have, prefer read-only tools first, explain what you found and what you changed, and "
    "never claim a fix you have not verified."
)


class Secret:
    """A secret setting (an API key): its value only through ``get_secret_value``, so that
    printing the settings, or a log of them, never shows it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        """The secret itself."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    def __len__(self) -> int:
        # As pydantic's SecretStr: an empty secret is false.
        return len(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def _from_text(kind: type, value: Any) -> Any:
    """The settings' own types from what a document or a variable gives: a secret and a path
    from text."""
    if kind is Secret and isinstance(value, str):
        return Secret(value)
    if kind is Path and isinstance(value, str | Path):
        return Path(value)
    raise TypeError(f"expected text, got {type(value).__name__}")


class Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A config section: unknown keys are errors."""


def _model_name(name: str) -> None:
    """Refuse a name no server has: empty, or with spaces around it (it was sent as written,
    and each run failed with the server's 404 for a model named "" or " llama3.2")."""
    if not name.strip():
        raise ValueError(
            "must not be empty: name one of the server's models (gpt-4.1-mini, or one"
            " `ollama list` shows)"
        )
    if name != name.strip():
        raise ValueError(f"{name!r} has spaces around it: write it as {name.strip()!r}")


class ModelSettings(Section):
    """Which model answers, and how patiently."""

    __field_checks__: ClassVar = {"name": _model_name}

    provider: Literal["openai", "scripted"] | None = None
    name: str = "gpt-4.1-mini"
    script: str | None = None
    # The whole call, retries and their waits included; a server asking to wait longer fails it.
    timeout: Annotated[float, Meta(gt=0)] = 60.0
    max_retries: Annotated[int, Meta(ge=0, le=10)] = 2
    # A reply body over this many bytes ends the run as a model error (4 MiB: any real reply
    # fits, a runaway server's does not get parsed, journaled and held in memory).
    max_reply_bytes: Annotated[int, Meta(ge=1024)] = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        run_field_checks(self)


class BudgetSettings(Section):
    """Limits of each run."""

    max_iterations: Annotated[int, Meta(ge=1)] = 20
    max_tool_calls: Annotated[int, Meta(ge=1)] = 50
    max_tokens: Annotated[int, Meta(ge=0)] = 200_000
    deadline_seconds: Annotated[float, Meta(ge=0)] = 0
    no_progress_repeats: Annotated[int, Meta(ge=0)] = 3

    def to_budgets(self) -> Budgets:
        """The run's budgets as journaled with it."""
        return Budgets(**msgspec.structs.asdict(self))


def _storable_text(text: str) -> None:
    """Refuse an empty or blank text (a schedule would start a run on nothing), or one the
    store cannot keep (a NUL character, an unpaired surrogate: YAML's ``\\0``, ``\\ud800``)."""
    if not text.strip():
        raise ValueError("must not be empty")
    if "\0" in text:
        raise ValueError("must not hold a NUL character (\\0)")
    unpaired = next((c for c in text if "\ud800" <= c <= "\udfff"), None)
    if unpaired is not None:
        raise ValueError(f"must not hold an unpaired surrogate (\\u{ord(unpaired):x})")


MAX_GRACE_SECONDS = 366 * 86400.0


def _cron_checked(expression: str) -> object:
    """``parse_cron``, its module imported only where a schedule is set."""
    from bot.config.cron import parse_cron

    return parse_cron(expression)


class ScheduledPrompt(Section):
    """A prompt started on a cron schedule (UTC; five fields, or six with seconds first)."""

    # Checked on its own (bot.plain): a bad expression is reported beside a bad prompt.
    __field_checks__: ClassVar = {
        "name": _storable_text,
        "cron": _cron_checked,
        "prompt": _storable_text,
    }

    name: str
    cron: str
    prompt: str
    # An occurrence that fell while no replica ran (a restart, an upgrade) still starts when
    # one starts this soon after it; 0: never late. At most a year: it is looked back on at
    # every start, and further would pass the first date there is.
    grace_seconds: Annotated[float, Meta(ge=0, le=MAX_GRACE_SECONDS)] = 300.0

    def __post_init__(self) -> None:
        run_field_checks(self)


def _distinct(schedules: list[ScheduledPrompt]) -> None:
    """Refuse two schedules of one name, or of one cron and prompt: a prompt is known by
    either, and the second of two alike would never start (its occurrences claimed by the
    first's), unsaid."""
    names: dict[str, int] = {}
    texts: dict[tuple[str, str], int] = {}
    for number, prompt in enumerate(schedules, 1):
        earlier = names.setdefault(prompt.name, number)
        if earlier != number:
            raise ValueError(
                f"the {_nth(earlier)} and {_nth(number)} schedules are both named"
                f" {prompt.name!r}: give each its own name"
            )
        from bot.config.cron import cron_fields  # here: no schedule set, no import

        earlier = texts.setdefault((cron_fields(prompt.cron), prompt.prompt), number)
        if earlier != number:
            raise ValueError(
                f"the {_nth(earlier)} and {_nth(number)} schedules"
                f" ({schedules[earlier - 1].name!r}, {prompt.name!r}) have the same cron and"
                " prompt, and would start one run: remove one, or tell them apart"
            )


def _nth(number: int) -> str:
    """1st, 2nd, 3rd, 4th, …, 11th, 12th, 13th, …, 21st."""
    suffix = (
        "th" if number % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    )
    return f"{number}{suffix}"


class ReplicaSettings(Section):
    """How a process shares the store with other replicas."""

    lease_seconds: Annotated[float, Meta(gt=0)] = 30.0
    poll_seconds: Annotated[float, Meta(gt=0)] = 1.0
    # On SIGTERM a tool under way may finish for this long; then it is killed (on-call decides).
    shutdown_grace_seconds: Annotated[float, Meta(ge=0)] = 20.0


def _http_url(url: str | None) -> None:
    """Refuse, at start, a URL nothing can be sent to or linked to (no scheme, a port over
    65535, a pasted space): a model endpoint's first call retried it, panicked or raised a
    traceback; a host alone as ``web.public_url`` made every "View run" link a relative path."""
    if url:  # empty is unset, as a blank OPENAI_BASE_URL variable is
        _check_url(url)


class WebSettings(Section):
    """The run pages and metrics ``kestrel serve`` serves, and the links chat messages carry."""

    __field_checks__: ClassVar = {"public_url": _http_url}

    # Where people reach the pages (https://kestrel.example.com); chat messages then carry
    # "View run" links signed with KESTREL_WEB_SECRET, each for one run.
    public_url: str | None = None
    link_ttl_seconds: Annotated[float, Meta(gt=0)] = 86400.0
    # /metrics without the operator token (an internal network's scraper).
    metrics_public: bool = False

    def __post_init__(self) -> None:
        run_field_checks(self)


class HookSettings(Section):
    """Hooks as ``module:function`` references, in the order they run."""

    user_prompt_submit: list[str] = []
    pre_tool_use: list[str] = []
    post_tool_use: list[str] = []
    run_end: list[str] = []
    timeout: Annotated[float, Meta(gt=0)] = 10.0


class McpServerSettings(Section):
    """One MCP server whose tools join the tool set as ``{name}__{tool}``."""

    # ``\Z``, not ``$``: Python's ``$`` also matches before a final newline ("srv\n").
    name: Annotated[str, Meta(pattern=r"^[a-z0-9_-]{1,24}\Z")]
    transport: Literal["stdio", "http"]
    command: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    confirm: list[str] = []
    timeout: Annotated[float, Meta(gt=0)] = 30.0

    def __post_init__(self) -> None:
        """Each transport has its own keys; a key of the other one is a mistake, not a no-op."""
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio server needs command")
        if self.transport == "stdio" and self.url is not None:
            raise ValueError("url is for http servers")
        if self.transport == "http" and not self.url:
            raise ValueError("an http server needs url")
        if self.transport == "http" and (self.command or self.env or self.cwd):
            raise ValueError("command, env and cwd are for stdio servers")


class ToolIsolationSettings(Section):
    """How catalog commands are kept from Kestrel's secrets (``bot/tools/isolation.py``)."""

    # namespaces: their own PID and mount namespaces, secret files covered; none: no isolation
    # (only where namespaces cannot be made; logged as an error at every start).
    mode: Literal["namespaces", "none"] = "namespaces"
    # More files (or folders) holding secrets, hidden from every command like kestrel.yaml.
    hide: list[str] = []


class Settings(Section):
    """The whole configuration of one Kestrel process.

    ``load_settings`` layers it: the environment over ``./.env`` over the YAML file.
    """

    __field_checks__: ClassVar = {
        "database": check_database,
        "openai_base_url": _http_url,
        "schedules": _distinct,
    }

    database: str = "kestrel.db"
    # PostgreSQL: how long one statement, or the wait for a pooled connection, may take before
    # it fails as the store's error (a statement stuck behind a lock or on a dead connection).
    database_timeout_seconds: Annotated[float, Meta(gt=0)] = 30.0
    model: ModelSettings = msgspec.field(default_factory=ModelSettings)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    tools: list[str] | None = None  # unset: the demo catalog, unless MCP servers are set
    budgets: BudgetSettings = msgspec.field(default_factory=BudgetSettings)
    human_in_the_loop: bool = True
    # A consequential call with an argument taken from tool output: ask a person, log, or off.
    provenance: Provenance = Provenance.ASK
    pii: PiiSettings = msgspec.field(default_factory=PiiSettings)
    policy: PolicyRules = msgspec.field(default_factory=PolicyRules)
    deadlines: DeadlineSettings = msgspec.field(default_factory=DeadlineSettings)
    schedules: list[ScheduledPrompt] = []
    hooks: HookSettings = msgspec.field(default_factory=HookSettings)
    replica: ReplicaSettings = msgspec.field(default_factory=ReplicaSettings)
    web: WebSettings = msgspec.field(default_factory=WebSettings)
    mcp_servers: list[McpServerSettings] = []
    tool_isolation: ToolIsolationSettings = msgspec.field(default_factory=ToolIsolationSettings)
    openai_api_key: Secret | None = None
    openai_base_url: str | None = None
    base_dir: Path = msgspec.field(default_factory=lambda: Path("."))
    config_file: Path | None = None

    def __post_init__(self) -> None:
        run_field_checks(self)

    @property
    def provider(self) -> str:
        """The configured provider, or the demo's scripted one when no endpoint is set."""
        if self.model.provider:
            return self.model.provider
        has_endpoint = bool(self.openai_api_key) or bool(self.openai_base_url)
        return "openai" if has_endpoint else "scripted"

    def plays_demo_model(self) -> bool:
        """Whether the demo's script answers because no endpoint is set (no provider named)."""
        return self.model.provider is None and self.provider == "scripted"

    def resolve(self, path: str) -> Path:
        """A path from the config file, relative to the file's folder."""
        return resolved(self.base_dir, path)

    def uses_demo_catalog(self) -> bool:
        """Whether the shipped demo catalog stands in: no ``tools`` set (``tools: []`` is none)
        and no MCP server, so a team's own tools are never joined by simulated ones."""
        return self.tools is None and not self.mcp_servers

    def tool_patterns(self) -> list[str]:
        """Catalog globs; the shipped demo catalog when it stands in."""
        if self.uses_demo_catalog():
            return [str(demo_file("tools/ops.yaml"))]
        return self.tools or []

    def script_path(self) -> Path:
        """The scripted provider's replies; the shipped demo when none is configured."""
        return self.resolve(self.model.script) if self.model.script else demo_file("demo.yaml")


def demo_file(name: str) -> Path:
    """A file shipped with the package for the offline demo (beside the package's modules:
    ``importlib.resources`` would bring ``tempfile`` and its imports to every demo command)."""
    return Path(__file__).resolve().parent.parent / "demo" / name


def load_settings(explicit: str | None = None) -> Settings:
    """Read the YAML file (if any), then ``./.env`` and the environment over it; one readable
    error on failure."""
    settings, _ = load_settings_sparing(explicit, spared="")
    return settings


def load_settings_sparing(explicit: str | None, *, spared: str) -> tuple[Settings, str]:
    """The settings as ``load_settings`` reads them, but with section ``spared`` at its
    defaults when it alone is wrong (a command that does not use it still works), and what
    was wrong with it ("" when nothing was)."""
    path = config_path(explicit)
    data = read_yaml(path) if path else {}
    if path:
        refuse_unexpanded(path, data, lambda names: _type_of(Settings, names) is not None)
    file_values, file_sources = _setting_variables(with_secret_files(dotenv()), ENV_FILE)
    env_values, env_sources = _setting_variables(with_secret_files(os.environ), "environment")
    variables = {**file_sources, **env_sources}
    base_dir = base_dir_of(path)
    layered = _ids_as_written(_offs_as_written(merged(merged(data, file_values), env_values)))
    derived = {"base_dir": base_dir, "config_file": path.resolve() if path else None}
    try:
        return _converted({**layered, **derived}), ""
    except Invalid as exc:
        problems = exc.problems
    said = _describe(problems, path, variables, layered)
    if not spared or any(not problem.loc or problem.loc[0] != spared for problem in problems):
        raise ConfigError(said)
    others = {key: value for key, value in layered.items() if key != spared}
    return _converted({**others, **derived}), said


def _converted(layered: dict[str, Any]) -> Settings:
    """The layered values as settings (``Invalid`` with every problem)."""
    return convert_plain(layered, Settings, strict=False, dec_hook=_from_text)


def _offs_as_written(layered: dict[str, Any]) -> dict[str, Any]:
    """YAML 1.1 reads ``off`` as false: where ``off`` is a choice (``pii.mode``,
    ``provenance``), false is taken as the ``off`` it was written as; where a mode is chosen by
    name (``tool_isolation.mode``), so that its refusal names the choices, not a boolean."""
    for section in ("pii", "tool_isolation"):
        named = layered.get(section)
        if isinstance(named, Mapping) and named.get("mode") is False:
            layered = {**layered, section: {**named, "mode": "off"}}
    if layered.get("provenance") is False:
        layered = {**layered, "provenance": "off"}
    return layered


def _ids_as_written(layered: dict[str, Any]) -> dict[str, Any]:
    """YAML reads a Discord id left unquoted as a number: under ``policy:`` it is taken as the
    id it was written as."""
    policy = layered.get("policy")
    if not isinstance(policy, Mapping):
        return layered
    return {**layered, "policy": principals_as_written(policy)}


def checked_url(name: str, url: str) -> str:
    """``url`` if it is an http(s) URL with a host and a valid port; else a ``ConfigError``
    naming the variable ``name``."""
    try:
        _check_url(url)
    except ValueError as exc:
        raise ConfigError(f"{name} {exc}") from None
    return url


def _check_url(url: str) -> None:
    """A ``ValueError`` unless ``url`` is an http(s) URL with a host and a valid port."""
    try:
        parts = urlsplit(url)
        # urlsplit drops a space pasted before it; the HTTP client would send it.
        valid = url == url.strip() and parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises for a port out of range
    except ValueError:
        valid = False
    shown = password_masked(url, "***")
    if not valid:
        raise ValueError(f"must be an http(s) URL with a host, not {shown!r}")
    if "$" in (parts.hostname or ""):
        # https://${HOST}, a Compose habit: no host holds a $, and nothing here expands it (as
        # web.public_url, every "View run" link went there, and nothing said so).
        raise ValueError(f"{shown!r}: its host is a variable, which nothing expands: write it")


class _Setting(msgspec.Struct, frozen=True):
    """What one variable sets: the settings path, its type, and whether that is a field's (else
    the values' of a mapping: a tool's deadline, an entity type's operator)."""

    path: tuple[str, ...]
    annotation: Any
    is_field: bool


def _setting_variables(
    environ: Mapping[str, str | None], source: str
) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """What the variables of one source set: the values as nested mappings, laid over the file
    by ``load_settings``, and ``{path: "source NAME"}``, which names the variable a bad value
    came from.

    Raises ``ConfigError`` naming the first variable that is no setting (a typo must not be
    silently ignored), or whose value is not the JSON its setting needs.
    """
    found: dict[tuple[str, ...], str] = {}
    values: list[tuple[tuple[str, ...], Any]] = []
    for name in sorted(environ):
        upper = name.upper()
        if upper in _SETTING_OF:
            field = _SETTING_OF[upper]
            setting = _Setting((field,), fields_of(Settings)[field], True)
        elif names_a_setting(upper) and not links_another_service(upper, environ[name] or ""):
            setting = _setting_of(name, source)
        else:
            continue
        variable = f"{source} {name}"
        found[setting.path] = variable
        raw = environ[name]
        if upper in _UNSET_WHEN_BLANK and raw is not None and _blank(raw):
            raw = None
        # A bare NAME line in .env is a null: refused where a value is needed, not ignored.
        value = None if raw is None else _decoded(raw, setting, name, variable)
        values.append((setting.path, value))
    nested: dict[str, Any] = {}
    # Shallow first: a section set as JSON, then its keys set one by one over it.
    for path, value in sorted(values, key=lambda item: len(item[0])):
        _assign(nested, path, value)
    return nested, found


def _blank(raw: str) -> bool:
    """Whether a variable's value is blank, or empty quotes: ``OPENAI_API_KEY=""`` in an env file
    that keeps them (``docker run --env-file``) is written empty, as for a keyless server."""
    text = raw.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1].strip()
    return not text


def _setting_of(name: str, source: str) -> _Setting:
    """The setting a ``KESTREL_A__B`` variable names; ``ConfigError`` if none."""
    parts = tuple(name[len(ENV_PREFIX) :].lower().split("__"))
    if parts[0] in DERIVED_SETTINGS:
        raise ConfigError(
            f"{source} {name}: {parts[0]} is not a setting (paths are relative to the folder"
            " of the configuration file)"
        )
    found = None if parts[0] in SETTING_VARIABLES else _type_of(Settings, parts)
    if found is None:
        near = SETTING_VARIABLES.get(parts[0]) or _near_variable(parts)
        hint = f" (did you mean {near}?)" if near else ""
        raise ConfigError(
            f"{source} {name}: unknown variable{hint}; settings are {ENV_PREFIX}<KEY>,"
            " nested with __ (e.g. KESTREL_MODEL__NAME); see .env.example"
        )
    annotation, is_field = found
    return _Setting(parts, annotation, is_field)


def _near_variable(parts: tuple[str, ...]) -> str | None:
    """The variable ``parts`` likely misspells: one ``_`` where a section's key needs two
    (``KESTREL_MODEL_NAME``), a key misspelt (``KESTREL_MODLE__NAME``: its first unknown key
    made the nearest of its section's, when that names a setting), or a variable read from
    the environment that is no setting (``KESTREL_LOG_LEVL``)."""
    from bot.plain import nearest  # only to describe a mistake

    nested = _as_nested(parts) or _near_key(parts)
    if nested is not None:
        return setting_variable(nested)
    if len(parts) > 1:
        return None
    # Closer than a setting's key must be: these names share words (web_, log_) that alone
    # made a guess (KESTREL_WEB_PORT is not KESTREL_WEB_SECRET).
    others = {name[len(ENV_PREFIX) :].lower(): name for name in OPERATOR_VARIABLES}
    other = nearest(parts[0], sorted(others), cutoff=0.8)
    return others[other] if other else None


# How many single ``_`` of an unknown variable are tried as ``__``: each doubles the guesses.
_GUESSED_CUTS: Final = 8


def _as_nested(parts: tuple[str, ...], start: int = 0) -> tuple[str, ...] | None:
    """``parts`` with some of their single ``_`` read as ``__``, when that names a setting:
    each ``_`` from part ``start`` on cut or not, left to right (a name with more than
    ``_GUESSED_CUTS`` of them is not guessed at)."""
    if _type_of(Settings, parts):
        return parts
    if start == 0 and sum(part.count("_") for part in parts) > _GUESSED_CUTS:
        return None
    for depth in range(start, len(parts)):
        part = parts[depth]
        for cut in (at for at, letter in enumerate(part) if letter == "_"):
            split = (*parts[:depth], part[:cut], part[cut + 1 :], *parts[depth + 1 :])
            if all(split) and (found := _as_nested(split, depth + 1)) is not None:
                return found
    return None


def _near_key(parts: tuple[str, ...]) -> tuple[str, ...] | None:
    """``parts`` with their first unknown key made the nearest of its section's, when that
    names a setting."""
    from bot.plain import nearest  # only to describe a mistake

    section: Any = Settings
    for depth, part in enumerate(parts):
        if not is_struct(section):
            return None
        fields = fields_of(section)
        if part in fields:
            section = fields[part]
            continue
        near = nearest(part, [name for name in fields if name not in DERIVED_SETTINGS])
        if near is None:
            return None
        fixed = (*parts[:depth], near, *parts[depth + 1 :])
        return fixed if _type_of(Settings, fixed) else None
    return None


def _type_of(section: type, parts: tuple[str, ...]) -> tuple[Any, bool] | None:
    """The type of the setting ``parts`` names below ``section`` (then its sections,
    recursively) and whether it is a field's; None when it names none."""
    annotation = fields_of(section).get(parts[0])
    if annotation is None or parts[0] in DERIVED_SETTINGS:
        return None
    return _type_below(annotation, parts[1:], is_field=True)


def _type_below(
    annotation: Any, rest: tuple[str, ...], *, is_field: bool
) -> tuple[Any, bool] | None:
    """``_type_of`` below a value of type ``annotation``."""
    if not rest:
        return annotation, is_field
    if is_struct(annotation):
        return _type_of(annotation, rest)
    if get_origin(annotation) is dict:
        # Below a mapping, keys are data (tool names, entity types), not setting names.
        return _type_below(get_args(annotation)[1], rest[1:], is_field=False)
    return None


def _decoded(raw: str, setting: _Setting, name: str, variable: str) -> Any:
    """A variable's value as the conversion gets it: a section, a list or a mapping is JSON; a
    scalar stays the string, which the conversion reads as its setting's type (and names when
    it will not)."""
    if setting.annotation is bool:
        return _BOOLEAN_WORDS.get(raw.strip().lower(), raw)
    number = _number_type(setting.annotation)
    if number is not None:
        return _as_number(raw, number)
    needs_json = _is_container(setting.annotation)
    if not needs_json and not _may_be_container(setting.annotation):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        if needs_json and setting.is_field:
            raise ConfigError(_not_json(setting, name, variable)) from None
        # A mapping's value, or ``list[str] | None``: the conversion says what it should be.
        return raw


def _number_type(annotation: Any) -> type[int] | type[float] | None:
    """``int`` or ``float`` for a number setting (bounds or not); else None."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation if annotation in (int, float) else None


def _as_number(raw: str, kind: type[int] | type[float]) -> Any:
    """A number variable as Python reads it (around spaces and a final newline, a sign,
    ``1_000``); else its text, which the conversion reads or names (``1e3`` as an integer)."""
    text = raw.strip()
    if text.isascii():
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _is_container(annotation: Any) -> bool:
    """Whether values of ``annotation`` are a section, a list or a mapping."""
    origin = get_origin(annotation) or annotation
    return is_struct(origin) or (isinstance(origin, type) and issubclass(origin, _CONTAINERS))


def _may_be_container(annotation: Any) -> bool:
    """Whether ``annotation`` is a union with a section, a list or a mapping among its types."""
    is_union = get_origin(annotation) in (Union, types.UnionType)
    return is_union and any(_is_container(member) for member in get_args(annotation))


def _not_json(setting: _Setting, name: str, variable: str) -> str:
    """Why a variable's value is refused: its setting needs JSON."""
    key = ".".join(setting.path)
    if get_origin(setting.annotation) in (list, tuple, set, frozenset):
        how = 'set a list as JSON (["a", "b"])'
    else:
        what = "a mapping" if get_origin(setting.annotation) is dict else "a section"
        how = f"set {what} as JSON, or one key at a time as {name.upper()}__KEY"
    return f"{variable}: {key}: not valid JSON; {how}"


def _assign(nested: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Set ``nested[path[0]]...[path[-1]]`` to ``value``, making the mappings above it."""
    *above, last = path
    for key in above:
        below = nested.get(key)
        if not isinstance(below, dict):
            below = nested[key] = {}
        nested = below
    nested[last] = value


def _describe(
    problems: list[Problem],
    path: Path | None,
    variables: Mapping[tuple[str, ...], str],
    layered: Mapping[str, Any],
) -> str:
    """Every problem on one line, each blamed on the variable or the file it came from."""
    said = []
    for problem in problems:
        loc = tuple(str(part) for part in problem.loc)
        key = ".".join(loc) or "(top level)"
        hint = (
            _tools_hint(loc, layered.get("tools"))
            + _model_hint(loc, layered.get("model"))
            + _approvers_hint(loc, layered.get("policy"))
        )
        if problem.message == "unknown key":
            hint += _endpoint_hint(loc)
        message = problem.message + hint
        said.append(f"{_source_of(loc, path, variables)}: {key}: {message}")
    return "; ".join(said)


def _tools_hint(loc: tuple[str, ...], tools: Any) -> str:
    """What ``tools`` holds instead, when a newcomer wrote a tool's definition here, as the
    catalogs' examples show it (one file without a list is ``bot.plain``'s to say)."""
    if loc[:1] != ("tools",):
        return ""
    entry = loc[1:]
    if not (len(entry) == 1 and entry[0].isdigit() and isinstance(tools, list)):
        return ""
    if int(entry[0]) < len(tools) and isinstance(tools[int(entry[0])], Mapping):
        return (
            ': tools lists catalog files ("tools/*.yaml");'
            " a tool's name, command and parameters go in one of them"
        )
    return ""


def _model_hint(loc: tuple[str, ...], model: Any) -> str:
    """How to name the model, when ``model`` was given its name alone (``model: llama3``): the
    README speaks of model.name."""
    if loc != ("model",) or not isinstance(model, str):
        return ""
    return f": the model's name goes under it, model: {{name: {json.dumps(model)}}}"


# Where OpenAI's clients take the server and its key, and where Kestrel does.
_ENDPOINT_KEYS: Final = {
    **dict.fromkeys(
        ("base_url", "api_base", "url", "endpoint", "host"),
        ": the server's address is OPENAI_BASE_URL (the environment or .env), or"
        " openai_base_url: at the top level",
    ),
    **dict.fromkeys(
        ("api_key", "key", "token"),
        ": the key is OPENAI_API_KEY, in the environment or .env (a secret: keep it out of"
        " this file)",
    ),
}


def _endpoint_hint(loc: tuple[str, ...]) -> str:
    """Where the model's server or key goes, for one written under ``model:`` as OpenAI's own
    clients take them (an unknown key there, with no near one)."""
    return _ENDPOINT_KEYS.get(loc[1], "") if len(loc) == 2 and loc[0] == "model" else ""


def _approvers_hint(loc: tuple[str, ...], policy: Any) -> str:
    """How to key approvers written as a list, as ``oncall`` and ``requesters`` are."""
    if loc != ("policy", "approvers") or not isinstance(policy, Mapping):
        return ""
    approvers = policy.get("approvers")
    if not isinstance(approvers, list):
        return ""
    return (
        ": it maps a tool, tag:NAME or * to who approves it,"
        f" {json.dumps({'*': approvers})} for every gated tool"
    )


def _source_of(
    loc: tuple[str, ...], path: Path | None, variables: Mapping[tuple[str, ...], str]
) -> str:
    """The variable that set ``loc`` (or a key above or below it), else the file."""
    lowered = tuple(part.lower() for part in loc)
    for setting, variable in variables.items():
        common = min(len(setting), len(lowered))
        if common and setting[:common] == lowered[:common]:
            return variable
    return str(path) if path else "configuration"
