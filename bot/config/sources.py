"""Where the settings come from, before they are validated: the YAML file, ``./.env`` and the
environment, found and read without converting them (``bot.config.settings`` converts them;
``bot.cli.quick`` reads the few that a read-only command needs)."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from bot.patterns import on_use
from bot.text import shell_variable

DEFAULT_CONFIG_NAME = "kestrel.yaml"
# The variable naming the configuration file, when --config does not.
CONFIG_VARIABLE: Final = "KESTREL_CONFIG"
ENV_PREFIX: Final = "KESTREL_"
ENV_FILE: Final = ".env"
# The variable that sets ``database`` (the settings' other variables are KESTREL_<KEY>).
DATABASE_VARIABLE: Final = "KESTREL_DATABASE_URL"
# The setting bounding each PostgreSQL statement (named by the store's timeout errors).
DATABASE_TIMEOUT_SETTING: Final = "database_timeout_seconds"
POSTGRES_SCHEMES: Final = ("postgres://", "postgresql://")
# Settings derived from where the configuration file is, so never read from it or a variable.
DERIVED_SETTINGS: Final = frozenset({"base_dir", "config_file"})
# A key a variable can name (``KESTREL_A__B``): not an index, a tool's name nor ``*``.
_SETTING_NAME: Final = on_use(r"[a-z_][a-z0-9_]*")
# Settings whose variable is not KESTREL_<KEY>: the variable's name, by setting.
SETTING_VARIABLES: Final = {
    "database": DATABASE_VARIABLE,
    "openai_api_key": "OPENAI_API_KEY",
    "openai_base_url": "OPENAI_BASE_URL",
}
# Variables read from the process's environment alone, never from ``.env``: who acts and how it
# logs are known before ``.env`` is read. Given there, each is warned of (``unread_lines``).
ENVIRONMENT_ONLY: Final = frozenset(
    {
        "KESTREL_USER",
        "KESTREL_LOG_LEVEL",
        "KESTREL_LOG_FORMAT",
        "KESTREL_MODEL_CACHE",
        "KESTREL_DEMO_STATE",
    }
)
# Variables with the prefix that the program reads itself and that are not settings: those an
# operator sets (a misspelling of one is named), then the test suite's and benchmarks'.
OPERATOR_VARIABLES: Final = ENVIRONMENT_ONLY | {
    CONFIG_VARIABLE,
    "KESTREL_WEB_TOKEN",
    "KESTREL_WEB_SECRET",
    "KESTREL_WEB_TOKEN_FILE",
    "KESTREL_WEB_SECRET_FILE",
}
NON_SETTING_VARIABLES: Final = OPERATOR_VARIABLES | {
    "KESTREL_TEST_POSTGRES_DSN",
    "KESTREL_BENCH_POSTGRES_DSN",
    "KESTREL_CHROMIUM",
    "KESTREL_UPDATE_SCREENSHOT",
}
# What Kubernetes puts in every pod's environment for a Service named ``kestrel`` (unless the
# pod says ``enableServiceLinks: false``): no setting of ours, and no typo either.
KUBERNETES_SERVICE_LINKS: Final = ("KESTREL_SERVICE_HOST", "KESTREL_SERVICE_PORT", "KESTREL_PORT")
# The secrets that may come from a file instead: NAME_FILE holds the path (Docker and
# Kubernetes secrets are files).
SECRET_FILE_VARIABLES: Final = (
    "SLACK_BOT_TOKEN",
    "SLACK_SIGNING_SECRET",
    "SLACK_APP_TOKEN",
    "DISCORD_TOKEN",
    "OPENAI_API_KEY",
    "KESTREL_WEB_TOKEN",
    "KESTREL_WEB_SECRET",
)
FILE_SUFFIX: Final = "_FILE"


class ConfigError(Exception):
    """The configuration is unusable; the message names the key or file and the cause."""


def names_a_setting(variable: str) -> bool:
    """Whether a ``KESTREL_…`` variable (its name upper-cased) is meant to set a setting."""
    if not variable.startswith(ENV_PREFIX) or variable in NON_SETTING_VARIABLES:
        return False
    return not is_service_link(variable)


def is_service_link(variable: str) -> bool:
    """Whether Kubernetes set ``variable`` for a Service named kestrel (``KESTREL_PORT``,
    ``KESTREL_PORT_3000_TCP_ADDR``, ``KESTREL_SERVICE_PORT_HTTP``, …)."""
    return any(
        variable == name or variable.startswith(name + "_") for name in KUBERNETES_SERVICE_LINKS
    )


# What Kubernetes puts in every pod's environment for another Service whose name starts with
# ``kestrel-`` (``kestrel-postgresql``, say): ``NAME_SERVICE_HOST``, ``NAME_SERVICE_PORT`` and
# ``NAME_SERVICE_PORT_<PORT NAME>``, ``NAME_PORT`` and ``NAME_PORT_<N>_<PROTO>`` with its
# ``_PROTO``, ``_PORT`` and ``_ADDR``. Each name segment is a word (a setting's are joined by
# ``__``), and each value has its own form, so ``KESTREL_WEB_PORT=8080`` is still a typo.
_LINK_NAME: Final = (
    r"KESTREL_(?:[A-Z0-9]+_)+?(?:(?P<host>SERVICE_HOST)|(?P<number>SERVICE_PORT(?:_[A-Z0-9_]+)?"
    r"|PORT_\d+_(?:TCP|UDP|SCTP)_PORT)|(?P<url>PORT(?:_\d+_(?:TCP|UDP|SCTP))?)"
    r"|(?P<proto>PORT_\d+_(?:TCP|UDP|SCTP)_PROTO)|(?P<addr>PORT_\d+_(?:TCP|UDP|SCTP)_ADDR))"
)
_ADDRESS: Final = r"[0-9A-Fa-f.:]+"
_LINK_VALUE: Final = {
    "host": _ADDRESS,
    "addr": _ADDRESS,
    "number": r"\d{1,5}",
    "proto": r"tcp|udp|sctp",
    "url": rf"(?:tcp|udp|sctp)://(?:{_ADDRESS}|\[{_ADDRESS}\]):\d{{1,5}}",
}


def links_another_service(variable: str, value: str) -> bool:
    """Whether Kubernetes set ``variable`` (its name upper-cased) to ``value`` for a Service
    named ``kestrel-…``: told by its name and its value together."""
    # Matched as strings (``re`` keeps what it compiled): only a variable no setting has
    # gets here, and compiling at import cost every command a few milliseconds.
    found = re.fullmatch(_LINK_NAME, variable)
    if found is None or found.lastgroup is None:
        return False
    return re.fullmatch(_LINK_VALUE[found.lastgroup], value.strip()) is not None


def with_secret_files(variables: Mapping[str, str | None]) -> dict[str, str | None]:
    """``variables`` with each secret whose ``NAME_FILE`` is set read from that file, and every
    secret without the blanks around it (a file's trailing newline); ``ConfigError`` in one
    line for a file it cannot read, that holds nothing or more than one line, or for a secret
    given both ways (a blank ``NAME`` is not given)."""
    found = dict(variables)
    for name in SECRET_FILE_VARIABLES:
        path = variables.get(name + FILE_SUFFIX)
        given = variables.get(name)
        if path and (given or "").strip():
            raise ConfigError(f"{name} and {name}{FILE_SUFFIX} are both set: keep one")
        if path:
            found[name] = read_secret_file(name + FILE_SUFFIX, path)
        elif given is not None:
            # A Secret made --from-file keeps its newline in a variable too; no key ends in one.
            found[name] = one_line_secret(name, given.strip())
    return found


def one_line_secret(where: str, secret: str) -> str:
    """``secret`` if it holds no line break or other control character, which no token has
    and no HTTP client sends in a header; else ``ConfigError`` naming ``where``, never it."""
    if secret.isprintable():
        return secret
    if next(c for c in secret if not c.isprintable()).isascii():
        raise ConfigError(
            f"{where} holds a line break or another control character:"
            " the secret alone goes in it, on one line"
        )
    # A space pasted from a document (no-break, zero-width) is no control character.
    return ascii_secret(where, secret)


def pasted_token(where: str, secret: str) -> str:
    """``secret``, a platform's key or token, if it is ASCII and not in quotes (an env file read
    by ``docker run --env-file`` keeps them), as none has them; else ``ConfigError`` naming
    ``where``, never the secret."""
    ascii_secret(where, secret)
    if secret[:1] in ("'", '"') or secret[-1:] in ("'", '"'):
        raise ConfigError(
            f"{where} is in quotes, which are not part of it: remove them (an env file read by"
            " docker run --env-file keeps them)"
        )
    return secret


def ascii_secret(where: str, secret: str) -> str:
    """``secret`` if it is ASCII, as every key and token is (each goes in an HTTP header,
    which takes ASCII alone); else ``ConfigError`` naming ``where`` and the first character
    that is not, never the secret."""
    if secret.isascii():
        return secret
    import unicodedata  # only for the error: a light start

    at, char = next((i, c) for i, c in enumerate(secret) if not c.isascii())
    named = f"U+{ord(char):04X} {unicodedata.name(char, '')}".rstrip()
    raise ConfigError(
        f"{where} holds a character that is not ASCII ({named}, character {at + 1} of"
        f" {len(secret)}), which no key or token has: was it pasted with quotes, an ellipsis"
        " or a no-break space? paste it again"
    )


def read_secret_file(variable: str, path: str) -> str:
    """The secret in the file ``variable`` names, without its trailing newline; a file that
    holds none is an error (a secret mounted empty: read as no secret, it would be taken as
    one never set, and a model key's absence starts the scripted demo)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        from bot.text import not_utf8  # only for the error: a light start

        raise ConfigError(f"{variable}: {path}: {not_utf8(exc)}") from exc
    except OSError as exc:
        raise ConfigError(f"{variable}: cannot read {path}: {exc.strerror or exc}") from exc
    if not text.strip():
        raise ConfigError(f"{variable}: {path} is empty: the secret goes in it")
    return one_line_secret(f"{variable}: {path}", text.strip())


def secret_file_paths(environ: Mapping[str, str | None]) -> list[Path]:
    """The files the secrets were read from (catalog commands must not read them)."""
    return [Path(p) for name in SECRET_FILE_VARIABLES if (p := environ.get(name + FILE_SUFFIX))]


def config_path(explicit: str | None) -> Path | None:
    """``--config``, else ``KESTREL_CONFIG`` (environment or ``.env``), else ``./kestrel.yaml``.
    A file named that is not there is an error naming who named it: a variable set long ago,
    or a line of .env, is not where one looks first."""
    if explicit is not None and not explicit.strip():
        # A script's ``--config "$CONFIG"`` with the variable unset: ./kestrel.yaml would
        # stand in for the file it meant, and its journal for the one it meant.
        raise ConfigError("--config: the path is empty (leave the option out for ./kestrel.yaml)")
    chosen, named_by = explicit, "--config"
    if not chosen:
        chosen, named_by = os.environ.get(CONFIG_VARIABLE), CONFIG_VARIABLE
    if not chosen:
        chosen, named_by = dotenv().get(CONFIG_VARIABLE), f"{ENV_FILE} {CONFIG_VARIABLE}"
    if chosen:
        return _config_file(Path(chosen), named_by)
    default = Path(DEFAULT_CONFIG_NAME)
    # Not there also where the folder may not be searched (``sudo -u kestrel`` from root's
    # home): none of its files can be meant for that user (``_here``).
    if not os.path.lexists(default):
        return None
    # There, but perhaps no file (a folder a container's bind mount made for a file that was
    # missing, a dangling link): never the defaults, the demo's model among them, in its stead.
    return _config_file(default, "read by default")


def _config_file(path: Path, named_by: str) -> Path:
    """``path`` if it is a regular file to read; else ``ConfigError`` saying what it is."""
    if path.is_dir():
        raise ConfigError(f"config file {path} ({named_by}) is a folder, not a file")
    if path.is_symlink() and not path.exists():
        missing = os.readlink(path)
        raise ConfigError(f"config file {path} ({named_by}) links to {missing}: no such file")
    if not path.exists():
        raise ConfigError(f"config file {path} ({named_by}) does not exist")
    if not path.is_file():
        # A device or a pipe (/dev/null, <(…)): its folder would hold the relative paths.
        raise ConfigError(f"config file {path} ({named_by}) is not a regular file")
    return path


def environment() -> dict[str, str]:
    """The process environment over ``./.env``: where platform tokens (``SLACK_*``) are read."""
    variables = {k: v for k, v in with_secret_files(dotenv()).items() if v is not None}
    variables.update({k: v for k, v in with_secret_files(os.environ).items() if v is not None})
    return variables


def _here(name: Path) -> bool:
    """Whether the file ``name`` is in the current folder; not where that folder may not be
    searched (``sudo -u kestrel kestrel runs pending`` from root's home, as deploy.md says to
    run it): none of its files can be meant for that user, and none could be read."""
    try:
        return name.is_file()
    except PermissionError:
        return False


def dotenv() -> dict[str, str | None]:
    """The variables of ``./.env``, which the settings read too; a line that cannot be read is
    left out, and warned of once (``unread_lines``)."""
    env_file = Path(ENV_FILE)
    if not _here(env_file):
        return {}
    # Only when there is a .env to read; its parser, not dotenv_values, which warns of a bad
    # line without naming the file.
    from dotenv.main import resolve_variables
    from dotenv.parser import parse_stream

    try:
        text = env_file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        from bot.text import not_utf8  # only for the error: a light start

        raise ConfigError(f"{ENV_FILE}: {not_utf8(exc)}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {ENV_FILE}: {exc.strerror}") from exc
    bindings = list(parse_stream(io.StringIO(text)))
    unread = {b.original.line: _UNPARSED for b in bindings if b.error}
    unread |= {b.original.line: _ENVIRONMENT_ONLY % b.key for b in bindings if _env_only(b.key)}
    unread_lines(env_file, unread)
    pairs = [(b.key, b.value) for b in bindings if b.key is not None]
    return dict(resolve_variables(pairs, override=True))


# Why a line of .env is skipped: it cannot be parsed, or it names a variable .env does not give.
_UNPARSED: Final = "not NAME=VALUE (a quote left open? a space in the name?)"
_ENVIRONMENT_ONLY: Final = "%s is read from the environment only: export it"
# The .env lines already warned of, by file: each command reads .env more than once.
_UNREAD: set[tuple[Path, int]] = set()


def _env_only(key: str | None) -> bool:
    """Whether ``key``, given in ``.env``, names a variable read from the environment alone."""
    return key is not None and key.upper() in ENVIRONMENT_ONLY


def unread_lines(env_file: Path, lines: Mapping[int, str]) -> None:
    """Warn once of each line of ``env_file`` that is skipped, by its number and why alone: the
    line may hold a secret, and a setting it meant to give is not given."""
    import logging

    from bot.logs import CONFIG

    for line, why in sorted(lines.items()):
        seen = (env_file.resolve(), line)
        if seen in _UNREAD:
            continue
        _UNREAD.add(seen)
        logging.getLogger(CONFIG).warning("%s:%d: skipped: %s", env_file, line, why)


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on it: mappings merge key by key, anything else replaces."""
    layered = dict(base)
    for key, value in over.items():
        below = layered.get(key)
        if isinstance(below, Mapping) and isinstance(value, Mapping):
            value = merged(below, value)
        layered[key] = value
    return layered


def read_yaml(path: Path) -> dict[str, Any]:
    """The settings file's top-level mapping."""
    from bot.yamldoc import NotYaml, safe_load  # here: a runtime composed in code reads no file

    try:
        data = safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        from bot.text import not_utf8  # only for the error: a light start

        raise ConfigError(f"{path}: {not_utf8(exc)}") from exc
    except NotYaml as exc:
        raise ConfigError(exc.located(path)) from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: nested too deeply to be a configuration") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of settings")
    if path.name != DEFAULT_CONFIG_NAME and _is_catalog(data):
        # Named so by the user (--config): a kestrel.yaml of tools is told at each of them.
        raise ConfigError(
            f"{path}: a tool catalog (its tools: lists tools), not a configuration: a"
            f' kestrel.yaml names catalog files, tools: ["{path.name}"]'
        )
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{path}: {key!r}: keys must be names")
        if key in DERIVED_SETTINGS:
            raise ConfigError(
                f"{path}: {key}: not a setting (paths are relative to this file's folder)"
            )
    return data


def refuse_unexpanded(
    path: Path, data: dict[str, Any], is_setting: Callable[[tuple[str, ...]], bool]
) -> None:
    """A ``ConfigError`` naming the first value written as a shell variable, and the variable
    that sets it instead; none under a key that is no setting (``is_setting``), which the
    settings' conversion names (a variable named after a misspelt key would set nothing)."""
    found = unexpanded_variable(data)
    if found is None:
        return
    key, value = found
    variable = setting_variable(key)
    if variable and not is_setting(_setting_names(key)):
        return
    instead = f", or set {variable} in the environment or {ENV_FILE} (it overrides the file)"
    raise ConfigError(
        f"{path}: {'.'.join(key)}: {value!r} is a variable, which {path.name} does not expand:"
        f" write the value itself{instead if variable else ''}"
    )


def unexpanded_variable(
    value: Any, key: tuple[str, ...] = ()
) -> tuple[tuple[str, ...], str] | None:
    """The key and text of the first value under ``value`` written as a shell variable."""
    if isinstance(value, str):
        # The file is read as written: such a value was its own text (a journal file named
        # ``${DATABASE_URL}`` beside the file, where the team meant its PostgreSQL).
        return (key, value) if shell_variable(value) else None
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for name, inner in items:
        found = unexpanded_variable(inner, (*key, str(name)))
        if found is not None:
            return found
    return None


def setting_variable(key: tuple[str, ...]) -> str:
    """The variable that sets the setting at ``key`` (``database``: KESTREL_DATABASE_URL), or
    the nearest section holding it (a list or a mapping of tool names is set whole, as JSON);
    "" for a key no variable can name."""
    names = _setting_names(key)
    if not names:
        return ""
    if len(names) == 1 and names[0] in SETTING_VARIABLES:
        return SETTING_VARIABLES[names[0]]
    return ENV_PREFIX + "__".join(names).upper()


def _setting_names(key: tuple[str, ...]) -> tuple[str, ...]:
    """The leading parts of ``key`` a variable's name can hold."""
    names: list[str] = []
    for part in key:
        # "__" nests in a variable's name: a key holding it (an MCP tool's SERVER__TOOL under
        # per_tool) is set with its section, whole.
        if not _SETTING_NAME.fullmatch(part) or "__" in part:
            break
        names.append(part)
    return tuple(names)


def _is_catalog(data: Mapping[Any, Any]) -> bool:
    """Whether a document read as settings is a tool catalog: ``tools:`` alone, listing
    tools (mappings), where a configuration lists catalog files."""
    tools = data.get("tools")
    if set(data) != {"tools"} or not isinstance(tools, list) or not tools:
        return False
    return all(isinstance(tool, Mapping) for tool in tools)


def base_dir_of(config: Path | None) -> Path:
    """The folder the settings' paths are relative to: the configuration file's, else here."""
    return config.parent.resolve() if config else Path.cwd()


def resolved(base_dir: Path, path: str) -> Path:
    """A path from the settings (``~`` expanded), relative to the configuration file's folder."""
    candidate = Path(os.path.expanduser(path))
    return candidate if candidate.is_absolute() else base_dir / candidate


def sqlite_file(base_dir: Path, database: str) -> Path | None:
    """The SQLite file the ``database`` setting names; None when it is a PostgreSQL URL."""
    if database.startswith(POSTGRES_SCHEMES):
        return None
    return resolved(base_dir, database.removeprefix("sqlite:///"))


def check_database(database: str) -> None:
    """Refuse a URL of a database Kestrel cannot keep its journal in (``mysql://``, a typo),
    which would otherwise be taken for a SQLite file of that name; a libpq keyword string,
    likewise; a PostgreSQL URL whose password a parser would cut short (and then show); and
    an empty one, which would name the configuration's folder."""
    if not database.strip():
        raise ValueError(
            "empty: give a SQLite file (kestrel.db) or a PostgreSQL URL (postgresql://USER@HOST/DB)"
        )
    if database.startswith(POSTGRES_SCHEMES):
        _check_password(postgres_credentials(database)[1])
        problem = postgres_url_problem(database)
        if problem is not None:
            raise ValueError(f"not a valid PostgreSQL URL: {problem}")
        return
    scheme, sep, _ = database.partition("://")
    if sep and not database.startswith("sqlite:///"):
        raise ValueError(
            f"unsupported URL scheme {scheme!r}: give a SQLite file (kestrel.db,"
            " sqlite:///PATH) or a PostgreSQL URL (postgresql://USER@HOST/DB)"
        )
    key, equals, _ = database.strip().partition("=")
    if equals and key.strip().isidentifier():
        raise ValueError(
            "a libpq keyword string (host=... dbname=...) is not supported: give a PostgreSQL"
            " URL (postgresql://USER@HOST/DB)"
        )


# Characters that end a URL's credentials or host part: a password must percent-encode them.
_URL_DELIMITERS: Final = {
    "/": "%2F",
    "?": "%3F",
    "#": "%23",
    "@": "%40",
    "[": "%5B",
    "]": "%5D",
}


def _check_password(password: str) -> None:
    bad = [f"{char!r} as {code}" for char, code in _URL_DELIMITERS.items() if char in password]
    if bad:
        raise ValueError(f"the URL's password must percent-encode {', '.join(bad)}")


def postgres_credentials(dsn: str) -> tuple[str, str, str]:
    """A PostgreSQL URL's user, password and the rest (hosts, database, query), split at its
    last "@": a password holding "/", "?" or "#" as they are would end the host part for
    ``urlsplit``, and show up as a host."""
    rest = dsn.partition("://")[2]
    userinfo, at, after = rest.rpartition("@")
    if not at:
        return "", "", rest
    user, _, password = userinfo.partition(":")
    return user, password, after


def postgres_url_problem(dsn: str) -> str | None:
    """Why a URL parser cannot read the PostgreSQL URL ``dsn`` (an unclosed IPv6 bracket), in
    words that never quote its password; None when it can."""
    _, password, rest = postgres_credentials(dsn)
    try:
        urlsplit(dsn)
        urlsplit(f"postgresql://{rest}")
    except ValueError as exc:
        # urlsplit may quote the whole host part, the password in it.
        said = str(exc)
        for secret in sorted({password, unquote(password)} - {""}, key=len, reverse=True):
            said = said.replace(secret, "***")
        return said
    return None


def postgres_target(dsn: str, schema: str = "public") -> str:
    """A PostgreSQL server as messages name it: user, hosts, database and a schema other than
    ``public``; never the password, in the user part or the query."""
    user, _, rest = postgres_credentials(dsn)
    parts = urlsplit(f"postgresql://{rest}")
    query = parse_qs(parts.query)
    hosts = parts.netloc or query.get("host", ["localhost"])[0]
    user = unquote(user) or query.get("user", [""])[0]
    database = unquote(parts.path.lstrip("/"))
    target = f"{user}@{hosts}" if user else hosts
    if database:
        target += f"/{database}"
    return target if schema == "public" else f"{target} (schema {schema})"
