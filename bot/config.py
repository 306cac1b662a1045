"""Settings: one YAML file for the shape, the environment and ``.env`` for secrets and overrides."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from bot.cron import parse_cron
from bot.domain import Budgets
from bot.pii import PiiSettings

DEFAULT_CONFIG_NAME = "kestrel.yaml"
DEFAULT_SYSTEM_PROMPT = (
    "You are Kestrel, an on-call assistant in a team chat. Investigate with the tools you "
    "have, prefer read-only tools first, explain what you found and what you changed, and "
    "never claim a fix you have not verified."
)


class ConfigError(Exception):
    """The configuration is unusable; the message names the key or file and the cause."""


class Section(BaseModel):
    """A config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class ModelSettings(Section):
    """Which model answers, and how patiently."""

    provider: Literal["openai", "scripted"] | None = None
    name: str = "gpt-4.1-mini"
    script: str | None = None
    timeout: float = Field(60.0, gt=0)
    max_retries: int = Field(2, ge=0, le=10)


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


class PolicySettings(Section):
    """Who may start runs, approve which tools, and operate runs (platform ids, never names)."""

    requesters: list[str] = ["*"]
    approvers: dict[str, list[str]] = {"*": ["*"]}
    answerers: list[str] = []
    oncall: list[str] = []
    self_approval: bool = False


class DeadlineSettings(Section):
    """How long requests stay open, per kind and per tool, and when on-call is reminded."""

    wait_approval: float = Field(3600, gt=0)
    wait_user: float = Field(3600, gt=0)
    wait_effect: float = Field(86400, gt=0)
    per_tool: dict[str, float] = {}
    remind_before: float = Field(600, ge=0)


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


class Settings(BaseSettings):
    """The whole configuration of one Kestrel process."""

    model_config = SettingsConfigDict(
        env_prefix="KESTREL_",
        env_nested_delimiter="__",
        env_file=".env",
        extra="forbid",
    )

    database: str = Field(
        "kestrel.db", validation_alias=AliasChoices("KESTREL_DATABASE_URL", "database")
    )
    model: ModelSettings = ModelSettings()
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    tools: list[str] = []
    budgets: BudgetSettings = BudgetSettings()
    human_in_the_loop: bool = True
    pii: PiiSettings = PiiSettings()
    policy: PolicySettings = PolicySettings()
    deadlines: DeadlineSettings = DeadlineSettings()
    schedules: list[ScheduledPrompt] = []
    hooks: HookSettings = HookSettings()
    replica: ReplicaSettings = ReplicaSettings()
    mcp_servers: list[McpServerSettings] = []
    openai_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("OPENAI_API_KEY", "openai_api_key")
    )
    openai_base_url: str | None = Field(
        None, validation_alias=AliasChoices("OPENAI_BASE_URL", "openai_base_url")
    )
    base_dir: Path = Path(".")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The environment overrides ``.env``, which overrides the YAML file (passed as init)."""
        return env_settings, dotenv_settings, init_settings

    @property
    def provider(self) -> str:
        """The configured provider, or the demo's scripted one when no endpoint is set."""
        if self.model.provider:
            return self.model.provider
        has_endpoint = self.openai_api_key is not None or self.openai_base_url is not None
        return "openai" if has_endpoint else "scripted"

    def resolve(self, path: str) -> Path:
        """A path from the config file, relative to the file's folder."""
        candidate = Path(os.path.expanduser(path))
        return candidate if candidate.is_absolute() else self.base_dir / candidate

    def tool_patterns(self) -> list[str]:
        """Catalog globs; the shipped example catalog when none is configured."""
        return self.tools or [str(demo_file("tools/ops.yaml"))]

    def script_path(self) -> Path:
        """The scripted provider's replies; the shipped demo when none is configured."""
        return self.resolve(self.model.script) if self.model.script else demo_file("demo.yaml")


def demo_file(name: str) -> Path:
    """A file shipped with the package for the offline demo."""
    return Path(str(resources.files("bot") / "demo" / name))


def config_path(explicit: str | None) -> Path | None:
    """``--config``, else ``KESTREL_CONFIG``, else ``./kestrel.yaml`` if it exists."""
    chosen = explicit or os.environ.get("KESTREL_CONFIG")
    if chosen:
        path = Path(chosen)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        return path
    default = Path(DEFAULT_CONFIG_NAME)
    return default if default.is_file() else None


def load_settings(explicit: str | None = None) -> Settings:
    """Read the YAML file (if any), then the environment; one readable error on failure."""
    path = config_path(explicit)
    data = _read_yaml(path) if path else {}
    base_dir = path.parent.resolve() if path else Path.cwd()
    try:
        return Settings(**data, base_dir=base_dir)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from exc


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of settings")
    return data


def _describe(exc: ValidationError, path: Path | None) -> str:
    where = str(path) if path else "configuration"
    problems = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        problems.append(f"{key}: {message}")
    return f"{where}: " + "; ".join(problems)
