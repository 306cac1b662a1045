"""Settings: one YAML file for the shape, the environment and ``.env`` for secrets and overrides."""

from __future__ import annotations

import dataclasses
import json
import os
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal, NamedTuple, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from bot.config.cron import parse_cron
from bot.config.deadlines import DeadlineSettings as DeadlineSettings
from bot.config.sources import (
    DATABASE_VARIABLE,
    DERIVED_SETTINGS,
    ENV_FILE,
    ENV_PREFIX,
    base_dir_of,
    config_path,
    dataclass_fields,
    dotenv,
    merged,
    names_a_setting,
    read_yaml,
    resolved,
    with_secret_files,
)
from bot.config.sources import ConfigError as ConfigError
from bot.domain import Budgets
from bot.kinds import Provenance
from bot.model_cache import KeptModel
from bot.people.policy import PolicyRules
from bot.pii.settings import FieldProblem, PiiSettings

# Settings whose variable is not KESTREL_<NAME>: the variable's name, by setting.
_VARIABLE_OF: Final = {
    "database": DATABASE_VARIABLE,
    "openai_api_key": "OPENAI_API_KEY",
    "openai_base_url": "OPENAI_BASE_URL",
}
# The setting each of those variables sets.
_SETTING_OF: Final = {variable: setting for setting, variable in _VARIABLE_OF.items()}
# Settings of these types are read from a variable as JSON, as sections are.
_CONTAINERS: Final = (list, tuple, set, frozenset, dict)
# How pydantic names a key no section has: a model's, and a dataclass's (``PolicyRules``).
_UNKNOWN_KEY: Final = frozenset({"extra_forbidden", "unexpected_keyword_argument"})
DEFAULT_SYSTEM_PROMPT = (
    "You are Kestrel, an on-call assistant in a team chat. Investigate with the tools you "
    "have, prefer read-only tools first, explain what you found and what you changed, and "
    "never claim a fix you have not verified."
)


def _as_path(value: Any) -> Path:
    """A path ``load_settings`` derives: a ``Path``, or text naming one."""
    if isinstance(value, Path):
        return value
    if isinstance(value, str):
        return Path(value)
    raise ValueError("must be a path")


# Validated by a named function, not pydantic's own path schema (a local function): the kept
# schema of the settings (bot.model_cache) can name it.
DerivedPath = Annotated[Path, PlainValidator(_as_path), PlainSerializer(str, when_used="json")]


class Section(KeptModel):
    """A config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class ModelSettings(Section):
    """Which model answers, and how patiently."""

    provider: Literal["openai", "scripted"] | None = None
    name: str = "gpt-4.1-mini"
    script: str | None = None
    # The whole call, the client's retries and their backoff included.
    timeout: float = Field(60.0, gt=0)
    max_retries: int = Field(2, ge=0, le=10)
    # A reply body over this many bytes ends the run as a model error (4 MiB: any real reply
    # fits, a runaway server's does not get parsed, journaled and held in memory).
    max_reply_bytes: int = Field(4 * 1024 * 1024, ge=1024)


class BudgetSettings(Section):
    """Limits of each run."""

    max_iterations: int = Field(20, ge=1)
    max_tool_calls: int = Field(50, ge=1)
    max_tokens: int = Field(200_000, ge=0)
    deadline_seconds: float = Field(0, ge=0)
    no_progress_repeats: int = Field(3, ge=0)

    def to_budgets(self) -> Budgets:
        """The run's budgets as journaled with it."""
        return Budgets(**self.model_dump())


class ScheduledPrompt(Section):
    """A prompt started on a cron schedule (UTC; five fields, or six with seconds first)."""

    name: str
    cron: str
    prompt: str

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        parse_cron(value)
        return value


class ReplicaSettings(Section):
    """How a process shares the store with other replicas."""

    lease_seconds: float = Field(30.0, gt=0)
    poll_seconds: float = Field(1.0, gt=0)
    # On SIGTERM a tool under way may finish for this long; then it is killed (on-call decides).
    shutdown_grace_seconds: float = Field(20.0, ge=0)


class WebSettings(Section):
    """The run pages and metrics ``kestrel serve`` serves, and the links chat messages carry."""

    # Where people reach the pages (https://kestrel.example.com); chat messages then carry
    # "View run" links signed with KESTREL_WEB_SECRET, each for one run.
    public_url: str | None = None
    link_ttl_seconds: float = Field(86400.0, gt=0)
    # /metrics without the operator token (an internal network's scraper).
    metrics_public: bool = False


class HookSettings(Section):
    """Hooks as ``module:function`` references, in the order they run."""

    user_prompt_submit: list[str] = []
    pre_tool_use: list[str] = []
    post_tool_use: list[str] = []
    run_end: list[str] = []
    timeout: float = Field(10.0, gt=0)


class McpServerSettings(Section):
    """One MCP server whose tools join the tool set as ``{name}__{tool}``."""

    name: str = Field(pattern=r"^[a-z0-9_-]{1,24}$")
    transport: Literal["stdio", "http"]
    command: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    confirm: list[str] = []
    timeout: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _transport_fields(self) -> McpServerSettings:
        """Each transport has its own keys; a key of the other one is a mistake, not a no-op."""
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio server needs command")
        if self.transport == "stdio" and self.url is not None:
            raise ValueError("url is for http servers")
        if self.transport == "http" and not self.url:
            raise ValueError("an http server needs url")
        if self.transport == "http" and (self.command or self.env or self.cwd):
            raise ValueError("command, env and cwd are for stdio servers")
        return self


class ToolIsolationSettings(Section):
    """How catalog commands are kept from Kestrel's secrets (``bot/tools/isolation.py``)."""

    # namespaces: their own PID and mount namespaces, secret files covered; none: no isolation
    # (only where namespaces cannot be made; logged as a warning at every start).
    mode: Literal["namespaces", "none"] = "namespaces"
    # More files (or folders) holding secrets, hidden from every command like kestrel.yaml.
    hide: list[str] = []


class Settings(Section):
    """The whole configuration of one Kestrel process.

    ``load_settings`` layers it: the environment over ``./.env`` over the YAML file.
    """

    database: str = "kestrel.db"
    model: ModelSettings = ModelSettings()
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    tools: list[str] = []
    budgets: BudgetSettings = BudgetSettings()
    human_in_the_loop: bool = True
    # A consequential call with an argument taken from tool output: ask a person, log, or off.
    provenance: Provenance = Provenance.ASK
    pii: PiiSettings = Field(default_factory=PiiSettings)
    policy: PolicyRules = Field(default_factory=PolicyRules)
    deadlines: DeadlineSettings = Field(default_factory=DeadlineSettings)
    schedules: list[ScheduledPrompt] = []
    hooks: HookSettings = HookSettings()
    replica: ReplicaSettings = ReplicaSettings()
    web: WebSettings = WebSettings()
    mcp_servers: list[McpServerSettings] = []
    tool_isolation: ToolIsolationSettings = ToolIsolationSettings()
    openai_api_key: SecretStr | None = None
    openai_base_url: str | None = None
    base_dir: DerivedPath = Path(".")
    config_file: DerivedPath | None = None

    @field_validator("pii", mode="before")
    @classmethod
    def _pii_mode_off(cls, value: Any) -> Any:
        """YAML 1.1 reads ``mode: off`` as false: take it as the ``off`` it was written as."""
        if isinstance(value, Mapping) and value.get("mode") is False:
            return {**value, "mode": "off"}
        return value

    @field_validator("provenance", mode="before")
    @classmethod
    def _provenance_off(cls, value: Any) -> Any:
        """YAML 1.1 reads ``provenance: off`` as false: take it as the ``off`` it was written as."""
        return "off" if value is False else value

    @property
    def provider(self) -> str:
        """The configured provider, or the demo's scripted one when no endpoint is set."""
        if self.model.provider:
            return self.model.provider
        has_endpoint = self.openai_api_key is not None or self.openai_base_url is not None
        return "openai" if has_endpoint else "scripted"

    def resolve(self, path: str) -> Path:
        """A path from the config file, relative to the file's folder."""
        return resolved(self.base_dir, path)

    def tool_patterns(self) -> list[str]:
        """Catalog globs; the shipped example catalog when none is configured."""
        return self.tools or [str(demo_file("tools/ops.yaml"))]

    def script_path(self) -> Path:
        """The scripted provider's replies; the shipped demo when none is configured."""
        return self.resolve(self.model.script) if self.model.script else demo_file("demo.yaml")


def demo_file(name: str) -> Path:
    """A file shipped with the package for the offline demo."""
    from importlib import resources  # only without a configured catalog or script

    return Path(str(resources.files("bot") / "demo" / name))


def load_settings(explicit: str | None = None) -> Settings:
    """Read the YAML file (if any), then ``./.env`` and the environment over it; one readable
    error on failure."""
    path = config_path(explicit)
    data = read_yaml(path) if path else {}
    file_values, file_sources = _setting_variables(with_secret_files(dotenv()), ENV_FILE)
    env_values, env_sources = _setting_variables(with_secret_files(os.environ), "environment")
    variables = {**file_sources, **env_sources}
    base_dir = base_dir_of(path)
    layered = merged(merged(data, file_values), env_values)
    try:
        derived = {"base_dir": base_dir, "config_file": path.resolve() if path else None}
        return Settings.model_validate({**layered, **derived})
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path, variables)) from exc


def checked_url(name: str, url: str) -> str:
    """``url`` if it is an http(s) URL with a host and a valid port; else a ``ConfigError``
    naming the variable ``name``."""
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises for a port out of range
    except ValueError:
        valid = False
    if not valid:
        raise ConfigError(f"{name} must be an http(s) URL with a host, not {url!r}")
    return url


class _Setting(NamedTuple):
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
            setting = _Setting((field,), Settings.model_fields[field].annotation, True)
        elif names_a_setting(upper):
            setting = _setting_of(name, source)
        else:
            continue
        variable = f"{source} {name}"
        found[setting.path] = variable
        raw = environ[name]
        # A bare NAME line in .env is a null: refused where a value is needed, not ignored.
        value = None if raw is None else _decoded(raw, setting, name, variable)
        values.append((setting.path, value))
    nested: dict[str, Any] = {}
    # Shallow first: a section set as JSON, then its keys set one by one over it.
    for path, value in sorted(values, key=lambda item: len(item[0])):
        _assign(nested, path, value)
    return nested, found


def _setting_of(name: str, source: str) -> _Setting:
    """The setting a ``KESTREL_A__B`` variable names; ``ConfigError`` if none."""
    parts = tuple(name[len(ENV_PREFIX) :].lower().split("__"))
    if parts[0] in DERIVED_SETTINGS:
        raise ConfigError(
            f"{source} {name}: {parts[0]} is not a setting (paths are relative to the folder"
            " of the configuration file)"
        )
    found = None if parts[0] in _VARIABLE_OF else _type_of(Settings, parts)
    if found is None:
        hint = f" (did you mean {_VARIABLE_OF[parts[0]]}?)" if parts[0] in _VARIABLE_OF else ""
        raise ConfigError(
            f"{source} {name}: unknown variable{hint}; settings are {ENV_PREFIX}<KEY>,"
            " nested with __ (e.g. KESTREL_MODEL__NAME); see .env.example"
        )
    annotation, is_field = found
    return _Setting(parts, annotation, is_field)


def _type_of(section: type, parts: tuple[str, ...]) -> tuple[Any, bool] | None:
    """The type of the setting ``parts`` names below ``section`` (then its sections,
    recursively) and whether it is a field's; None when it names none."""
    annotation = _field_types(section).get(parts[0])
    if annotation is None or parts[0] in DERIVED_SETTINGS:
        return None
    return _type_below(annotation, parts[1:], is_field=True)


def _field_types(section: type) -> dict[str, Any]:
    """The fields of a section (a model, or a dataclass such as ``PolicyRules``) and their types."""
    if issubclass(section, BaseModel):
        return {name: field.annotation for name, field in section.model_fields.items()}
    return dataclass_fields(section)


def _type_below(
    annotation: Any, rest: tuple[str, ...], *, is_field: bool
) -> tuple[Any, bool] | None:
    """``_type_of`` below a value of type ``annotation``."""
    if not rest:
        return annotation, is_field
    if _is_section(annotation):
        return _type_of(annotation, rest)
    if get_origin(annotation) is dict:
        # Below a mapping, keys are data (tool names, entity types), not setting names.
        return _type_below(get_args(annotation)[1], rest[1:], is_field=False)
    return None


def _decoded(raw: str, setting: _Setting, name: str, variable: str) -> Any:
    """A variable's value as pydantic gets it: a section, a list or a mapping is JSON; a scalar
    stays the string, which pydantic converts (and names when it will not)."""
    needs_json = _is_container(setting.annotation)
    if not needs_json and not _may_be_container(setting.annotation):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        if needs_json and setting.is_field:
            raise ConfigError(_not_json(setting, name, variable)) from None
        # A mapping's value, or ``list[str] | None``: pydantic says what it should be.
        return raw


def _is_section(annotation: Any) -> bool:
    """Whether values of ``annotation`` are a section: a model, or a dataclass of settings."""
    if not isinstance(annotation, type):
        return False
    return issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)


def _is_container(annotation: Any) -> bool:
    """Whether values of ``annotation`` are a section, a list or a mapping."""
    origin = get_origin(annotation) or annotation
    return _is_section(origin) or (isinstance(origin, type) and issubclass(origin, _CONTAINERS))


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
    exc: ValidationError, path: Path | None, variables: Mapping[tuple[str, ...], str]
) -> str:
    """Every problem on one line, each blamed on the variable or the file it came from."""
    problems = []
    for error in exc.errors():
        loc = tuple(str(part) for part in error["loc"])
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, FieldProblem):  # a dataclass section's check of one of its fields
            loc = (*loc, cause.field)
        key = ".".join(loc) or "(top level)"
        message = _unknown(loc) if error["type"] in _UNKNOWN_KEY else error["msg"]
        problems.append(f"{_source_of(loc, path, variables)}: {key}: {message}")
    return "; ".join(problems)


def _unknown(loc: tuple[str, ...]) -> str:
    """What is said of a key no section has: the key it is nearest, if one is near."""
    if not loc:
        return "unknown key"
    import difflib  # only to describe a mistake

    near = difflib.get_close_matches(loc[-1], _keys_at(loc[:-1]), n=1, cutoff=0.6)
    return f"unknown key (did you mean {near[0]}?)" if near else "unknown key"


def _keys_at(loc: tuple[str, ...]) -> list[str]:
    """The keys the section at ``loc`` has (none where ``loc`` leads to no section); list
    indexes and mapping keys on the way are data, passed over."""
    annotation: Any = Settings
    for part in loc:
        annotation = _section_or_container(annotation)
        if _is_section(annotation):
            annotation = _field_types(annotation).get(part)
        elif get_origin(annotation) in (list, dict):
            annotation = get_args(annotation)[-1]
        else:
            return []
    annotation = _section_or_container(annotation)
    if not _is_section(annotation):
        return []
    return [name for name in _field_types(annotation) if name not in DERIVED_SETTINGS]


def _section_or_container(annotation: Any) -> Any:
    """Of a union (``X | None``), its member that is a section or a container; else itself."""
    if get_origin(annotation) not in (Union, types.UnionType):
        return annotation
    members = [member for member in get_args(annotation) if _is_container(member)]
    return members[0] if members else annotation


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
