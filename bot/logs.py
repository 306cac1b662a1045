"""How ``kestrel`` logs: one level and one format (text or JSON lines, a timestamp on each) for
its own loggers and the libraries' (bolt, discord.py, APScheduler, asyncpg, aiohttp), and what
a JSON line says of where it came from (the run, the request, the replica, the platform)."""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable, Mapping
from contextvars import Context, ContextVar, copy_context
from datetime import UTC, datetime
from typing import Final, TextIO

from bot.text import url_passwords_masked

LEVEL_VARIABLE: Final = "KESTREL_LOG_LEVEL"
FORMAT_VARIABLE: Final = "KESTREL_LOG_FORMAT"
LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
FORMATS: Final = ("text", "json")
DEFAULT_LEVEL: Final = "warning"
# Libraries whose loggers go through the same handler, at the same level: none keeps a handler
# or a level of its own.
LIBRARIES: Final = (
    "slack_bolt",
    "slack_sdk",
    "discord",
    "apscheduler",
    "asyncpg",
    "aiohttp",
    "openai",
    "httpx",
    "httpcore",
    "mcp",
)
# Which platform a logger speaks for, by the start of its name.
_PLATFORM_OF: Final = (
    ("kestrel.slack", "slack"),
    ("slack_bolt", "slack"),
    ("slack_sdk", "slack"),
    ("kestrel.discord", "discord"),
    ("discord", "discord"),
)

# Loggers held above debug whatever the level: aiosqlite's debug lines are one per statement,
# with its parameters (journal content), and say nothing an operator can act on.
QUIETER: Final = {"aiosqlite": logging.INFO}
# Loggers whose info lines come with every tick of serve's sweeps (APScheduler's executor:
# "Running job …" and "… executed successfully", four lines a second) and with every job it is
# given (its scheduler: "Added job …" for each request's reminder and deadline, "Scheduler
# started"): heard at debug; at any other level, their warnings and errors only.
TICKING: Final = ("apscheduler",)
# What ``kestrel serve`` says of itself: which replica it is, where it listens, that it stopped.
SERVICE: Final = "kestrel.serve"
# What the configuration warns of: a line of .env it could not read.
CONFIG: Final = "kestrel.config"
# What ``kestrel chat`` says of its stop on stderr: what a stop cut short left.
CHAT: Final = "kestrel.chat"
# What a command that drives runs says on stderr as they go (a model call's wait), as a record
# when the logs are JSON lines.
PROGRESS: Final = "kestrel.progress"
# Loggers heard at a level whatever the level: an operator needs serve's own lines at the
# default (warning) too, and they are a few lines at start and one at stop; a line of .env
# skipped is a setting not given, which a one-shot command (at error by default) says too.
LOUDER: Final = {
    SERVICE: logging.INFO,
    CONFIG: logging.WARNING,
    CHAT: logging.WARNING,
    PROGRESS: logging.WARNING,
}
# discord.py's warnings about voice support a text bot never uses.
_VOICE_NOTICE: Final = "voice will NOT be supported"
# discord.py's line as its gateway drops and it connects again.
_RECONNECT: Final = "Attempting a reconnect in"
RUN_ID: ContextVar[str | None] = ContextVar("kestrel_run_id", default=None)
# The run's session: its id names the platform, workspace, channel and thread (slack:T:C:TS).
SESSION: ContextVar[str | None] = ContextVar("kestrel_session", default=None)
REQUEST_ID: ContextVar[str | None] = ContextVar("kestrel_request_id", default=None)
PLATFORM: ContextVar[str | None] = ContextVar("kestrel_platform", default=None)
_replica: list[str] = []


class LogSetupError(Exception):
    """A log level or format that is not one of the choices; the message names it."""


def chosen(
    option: str | None, environ: Mapping[str, str], default: str = DEFAULT_LEVEL
) -> tuple[int, str]:
    """The level and format: ``--log-level`` over ``KESTREL_LOG_LEVEL`` over ``default``; the
    format from ``KESTREL_LOG_FORMAT`` (text by default)."""
    name = (option or environ.get(LEVEL_VARIABLE, "") or default).strip().lower()
    if name not in LEVELS:
        raise LogSetupError(f"{LEVEL_VARIABLE} must be one of {', '.join(LEVELS)}, not {name!r}")
    form = (environ.get(FORMAT_VARIABLE, "") or "text").strip().lower()
    if form not in FORMATS:
        raise LogSetupError(f"{FORMAT_VARIABLE} must be text or json, not {form!r}")
    return LEVELS[name], form


def configure(level: int, form: str, stream: TextIO | None = None) -> None:
    """Send every record at ``level`` or above to stderr, as text or JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLines() if form == "json" else TextLines())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    known = logging.root.manager.loggerDict
    for name in LIBRARIES:
        if not isinstance(known.get(name), logging.Logger):
            # Not made yet (the library not imported): it will be as this would leave it.
            # Making ten for nothing cost 0.16 M instructions of a ``runs approve``.
            continue
        library = logging.getLogger(name)
        for old in list(library.handlers):
            library.removeHandler(old)
        library.setLevel(logging.NOTSET)
        library.propagate = True
    for name, floor in QUIETER.items():
        logging.getLogger(name).setLevel(max(level, floor))
    for name in TICKING:
        quiet = level if level <= logging.DEBUG else max(level, logging.WARNING)
        logging.getLogger(name).setLevel(quiet)
    for name, ceiling in LOUDER.items():
        logging.getLogger(name).setLevel(min(level, ceiling))
    client = logging.getLogger("discord.client")
    for kind in (_NoVoiceNotice, _ReconnectIsAWarning):
        if not any(isinstance(f, kind) for f in client.filters):
            client.addFilter(kind())


def json_lines() -> bool:
    """Whether the logs were configured as JSON lines (every line on stderr one object)."""
    return any(isinstance(h.formatter, JsonLines) for h in logging.getLogger().handlers)


def failure(message: str) -> None:
    """A command's one-line error as a log record, for logs kept as JSON lines."""
    logging.getLogger("kestrel").error("%s", message)


class _NoVoiceNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _VOICE_NOTICE not in str(record.msg)


class _ReconnectIsAWarning(logging.Filter):
    """discord.py's "Attempting a reconnect in …" (an error, with the exception) is a warning:
    the client mends it by itself, and /readyz says the platform is reconnecting meanwhile."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.WARNING or not str(record.msg).startswith(_RECONNECT):
            return True
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        # The logger let the error through; the warning it now is obeys its level too.
        return logging.getLogger(record.name).isEnabledFor(record.levelno)


def set_replica(owner: str) -> None:
    """Name this process's replica on every later line."""
    _replica[:] = [owner]


def run_context(run_id: str, session_id: str = "") -> Context:
    """A copy of the current context in which lines name ``run_id`` and its session (for the
    run's task)."""
    context = copy_context()
    context.run(RUN_ID.set, run_id)
    context.run(SESSION.set, session_id or None)
    return context


def where(record: logging.LogRecord) -> dict[str, str]:
    """What is known of where ``record`` came from: run, session, request, replica,
    platform."""
    found = {"run_id": RUN_ID.get(), "session": SESSION.get(), "request_id": REQUEST_ID.get()}
    found["replica"] = _replica[0] if _replica else None
    found["platform"] = PLATFORM.get() or _platform_of(record.name)
    return {key: value for key, value in found.items() if value}


def _platform_of(logger: str) -> str | None:
    for prefix, platform in _PLATFORM_OF:
        if logger == prefix or logger.startswith(prefix + "."):
            return platform
    return None


def _stamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextLines(logging.Formatter):
    """``2025-05-01T09:30:00.123Z WARNING kestrel.slack: message [run=…]`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record on one line, its exception (if any) after it."""
        known = where(record)
        known.pop("replica", None)  # the same on every line: said once at start
        known.pop("platform", None)  # the logger's name says it
        tail = "".join(f" [{key}={value}]" for key, value in known.items())
        message = record.getMessage()
        if "\n" in message or "\r" in message:  # a library's, the Slack SDK's errors say
            message = " ".join(message.splitlines())  # "…failed.\nThe server responded with: …"
        line = f"{_stamp(record)} {record.levelname} {record.name}: {message}{tail}"
        # URLs' passwords masked whoever logs them: OPENAI_BASE_URL may carry a proxy's, and
        # the HTTP client logs each request's URL at info.
        if not record.exc_info:
            return _masked(line, record)
        if _tracebacks_shown():
            return _masked(line + "\n" + self.formatException(record.exc_info), record)
        # Above debug, a line stays a line: the exception named, no traceback.
        return _masked(f"{line}: {_named(record.exc_info[1])}", record)


class JsonLines(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message`` and what ``where``
    knows; an exception is one more key, never more lines."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON object."""
        obj: dict[str, str] = {
            "ts": _stamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        obj.update(where(record))
        if record.exc_info:  # as TextLines says it: a traceback at debug, else one line
            shown = _tracebacks_shown()
            exc_info = record.exc_info
            obj["exception"] = self.formatException(exc_info) if shown else _named(exc_info[1])
        # Masked before they are JSON strings: a payload's quotes are then still quotes.
        for key in ("message", "exception"):
            if key in obj:
                obj[key] = _masked(obj[key], record)
        return json.dumps(obj, ensure_ascii=False)


def _masked(text: str, record: logging.LogRecord) -> str:
    """``text`` with URLs' passwords and credentials masked, and at debug every secret and
    card or account number the PII guard knows redacted too: there the libraries print whole
    payloads (discord.py's gateway events, Slack's Socket Mode messages: what a person typed, a
    pasted key with it), and kestrel.events a tool's output whatever ``pii.mode`` says."""
    text = url_passwords_masked(text)
    if record.levelno > logging.DEBUG:
        return text
    return _debug_redactor()(text)


# What a debug line keeps of what the PII guard finds: who and where, which debugging reads.
_DEBUGGED: Final = frozenset({"EMAIL_ADDRESS", "IP_ADDRESS", "PHONE_NUMBER"})


@functools.cache
def _debug_redactor() -> Callable[[str], str]:
    """The PII guard over every type but addresses and numbers (keys, tokens, passwords, card
    and account numbers), built when a debug line is first written."""
    from bot.pii.guard import PiiGuard, PiiSettings
    from bot.pii.scantext import ENTITY_TYPES

    guard = PiiGuard(PiiSettings(entities=[t for t in ENTITY_TYPES if t not in _DEBUGGED]))
    return lambda text: guard.scan_output(text).text


def _tracebacks_shown() -> bool:
    """Whether a record's exception is written whole (at debug), not named on one line."""
    return logging.getLogger().isEnabledFor(logging.DEBUG)


def _named(exc: BaseException | None) -> str:
    """An exception on one line: its type and the start of its message (a library's expected
    failure, a gateway that dropped say, is no traceback above debug, in either format)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
