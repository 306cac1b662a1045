"""What every ``kestrel`` command shares: one-line errors, the settings, a runtime or a reader.

Click is imported only by what reads click's context or declares an option: ``kestrel runs
approve`` and ``deny`` decide without it (``bot.cli.decisions``)."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TextIO, TypeVar

from bot.collector import settle_after_start_up
from bot.text import printable, url_passwords_masked

# Each command imports what it needs when it runs: ``kestrel --help`` needs click alone, and
# the read-only commands (``runs list``, ``runs pending``) the settings and the store, not the
# model client or the code that drives runs. bench/startup.py times them.
if TYPE_CHECKING:
    import click

    from bot.config.settings import Settings
    from bot.run.runtime import Runtime
    from bot.store import Store

P = ParamSpec("P")
R = TypeVar("R")
N = TypeVar("N", "click.IntRange", "click.FloatRange")

# Exit statuses of ``kestrel run`` (see its --help); 2 is also click's for usage errors.
EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SUSPENDED = 3
EXIT_CANCELLED = 4
# sysexits.h's EX_TEMPFAIL: ``serve`` found a dependency (the store) not answering at start, which
# a later start may get past; a service manager restarts on it, and not on 2 (a mistake to fix).
EXIT_TEMPFAIL = 75
_EXIT_BY_STATUS = {"completed": EXIT_COMPLETED, "failed": EXIT_FAILED, "cancelled": EXIT_CANCELLED}


class Failure(Exception):
    """A user-facing error: printed as one line, exit status 2."""


class OutputLost(Exception):
    """Standard output or error could not be written (a full disk): one line, exit status 1,
    never 2, which says nothing was done."""


def exit_status(run_status: str) -> int:
    """The exit status for a run that stopped in ``run_status``; not ended is suspended."""
    return _EXIT_BY_STATUS.get(run_status, EXIT_SUSPENDED)


def echo(text: str, *, err: bool = False) -> None:
    """Print for a terminal: model and tool text never reaches it with control sequences."""
    stream = sys.stderr if err else sys.stdout
    if stream is None:  # closed before the command started: nowhere to say it, as click.echo
        return
    line = printable(text)
    try:
        try:
            stream.write(line + "\n")
        except UnicodeEncodeError:  # a stream that cannot say it (ASCII): click.echo writes UTF-8
            import click

            click.echo(line, err=err)
            return
        stream.flush()
    except OSError as exc:
        output_failed(stream, exc, "stderr" if err else "stdout")


def output_failed(stream: TextIO, exc: OSError, stream_name: str) -> None:
    """After ``exc`` writing to ``stream``: the rest of its output goes nowhere (Python's last
    flush would fail again, in a traceback of its own), and ``OutputLost`` is raised unless
    nobody reads it any more (``unheard``: then the command goes on, saying nothing)."""
    unread(stream)
    if not unheard(exc):
        raise OutputLost(f"cannot write to {stream_name}: {exc.strerror or exc}") from exc


def output_lost(exc: OutputLost) -> NoReturn:
    """End the command on ``exc``: its one line on stderr (which may be as full) and exit 1."""
    with contextlib.suppress(OutputLost):
        fail(str(exc))
    sys.exit(EXIT_FAILED)


def unheard(exc: OSError) -> bool:
    """Whether a write failed because nobody reads the stream any more: its reader left
    (``| head``: EPIPE), or its terminal hung up (closed, an ssh session dropped: EIO)."""
    import errno

    return exc.errno in (errno.EPIPE, errno.EIO)


def unread(stream: TextIO) -> None:
    """Send the rest of ``stream`` nowhere: its reader left (``kestrel runs list | head``).
    That ends the output alone, quietly: the command goes on and exits with its own status,
    and Python's last flush of the stream finds nothing to complain of."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    except (OSError, ValueError):  # no descriptor of its own (a test's capture): nothing to flush
        return


def exit_at_once(status: int) -> NoReturn:
    """Exit with ``status`` once the command is done, skipping the interpreter's teardown (every
    module and object freed one by one: 10 M instructions of a ``runs approve``, for nothing
    the store, the logs or the terminal keep). The exit functions run and the output is
    flushed first, as at any exit. While another thread runs, the exit is an ordinary one, which
    waits for a thread that is not a daemon."""
    import atexit
    import contextlib
    import os
    import threading

    if threading.active_count() > 1:
        sys.exit(status)
    atexit._run_exitfuncs()  # the logs closed, and whatever else asked to run at exit
    for stream in (sys.stdout, sys.stderr):
        # None where the descriptor was closed at start; closed since, or a pipe with nobody
        # reading: nothing more to say.
        with contextlib.suppress(OSError, ValueError):
            if stream is not None:
                stream.flush()
    os._exit(status)


def fail(message: str) -> None:
    """The one line a user sees on error, on stderr: a log record when the logs are JSON lines,
    so that a log shipper reads it as it reads every other line."""
    text = " ".join(message.split())
    text = url_passwords_masked(text)  # as the logs mask them
    logs = sys.modules.get("bot.logs")  # not imported yet: no logs were configured
    if logs is not None and logs.json_lines():
        logs.failure(text)
        return
    echo("kestrel: " + text, err=True)


def progress(message: str) -> None:
    """A line on stderr while a command works, ``kestrel: …``: a warning record instead when
    the logs are JSON lines, which every line on stderr then is."""
    text = url_passwords_masked(" ".join(message.split()))
    logs = sys.modules.get("bot.logs")  # not imported yet: no logs were configured
    if logs is not None and logs.json_lines():
        import logging

        logging.getLogger(logs.PROGRESS).warning("%s", text)
        return
    echo("kestrel: " + text, err=True)


def usage_error(exc: click.UsageError) -> None:
    """With JSON logs (configured, or asked for by ``KESTREL_LOG_FORMAT`` before they were), a
    usage error ends as one error record naming it, and exit status 2; else nothing: click
    prints its usage text."""
    from bot import logs

    if not _json_errors_if_asked():
        return
    command = exc.ctx.command_path if exc.ctx is not None else "kestrel"
    logs.failure(f"{exc.format_message()} ({command} --help)")
    sys.exit(exc.exit_code)


def one_line_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Bad configuration, stores and arguments end in one clear line, never a traceback."""
    return _one_line(fn, unreachable_status=EXIT_USAGE)


def service_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """``one_line_errors`` for ``serve``: a dependency that did not answer (the store, Slack,
    Discord) exits ``EXIT_TEMPFAIL``, which a service manager retries; the rest 2, which it
    should not (no restart mends a configuration)."""
    return _one_line(fn, unreachable_status=EXIT_TEMPFAIL)


def _one_line(fn: Callable[P, R], *, unreachable_status: int) -> Callable[P, R]:
    """``fn``, its user errors said in one line: exit ``unreachable_status`` when the error is
    a dependency not answering, else 2."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except OutputLost as exc:
            output_lost(exc)
        except Exception as exc:
            if not _is_user_error(exc):
                raise
            with contextlib.suppress(OutputLost):  # a full stderr: the status still says it
                fail(str(exc))
            sys.exit(unreachable_status if not_answering(exc) else EXIT_USAGE)

    return wrapper


def not_answering(exc: BaseException) -> bool:
    """Whether ``exc`` says a dependency did not answer (refused, reset, timed out, a name not
    resolved now, PostgreSQL starting or full, an HTTP 5xx): what a later try may get past.
    A refusal by one that answered (a token, a password, no such database) and a file of ours
    that cannot be read are mistakes to mend, and say no."""
    cause = exc.__cause__
    if cause is None:
        return False
    # An error that knows it (an MCP server that did not answer at start: ``McpStartError``).
    if getattr(cause, "not_answering", False) is True:
        return True
    if isinstance(cause, ConnectionError | TimeoutError):
        return True
    if isinstance(cause, OSError) and cause.errno in _not_answering_errnos():
        return True  # aiohttp's connector errors carry the socket's errno; gaierror its EAI_*
    sqlstate = getattr(cause, "sqlstate", None)  # asyncpg's, not imported here
    if isinstance(sqlstate, str) and sqlstate.startswith(_POSTGRES_NOT_NOW):
        return True
    # An error reply's HTTP status: aiohttp's and discord.py's on the error, slack_sdk's on
    # its response.
    status = getattr(cause, "status", getattr(getattr(cause, "response", None), "status_code", 0))
    return isinstance(status, int) and 500 <= status <= 599


def _not_answering_errnos() -> frozenset[int]:
    """Socket errors of a peer not reachable now, and the resolver's "no such name" (a
    container's service name not yet in DNS reads as a typo does: restarting is the safe side).
    Imported here: only an error needs them, and ``kestrel runs approve`` starts without."""
    import errno
    import socket

    return frozenset(
        {
            errno.ECONNREFUSED,
            errno.ECONNRESET,
            errno.ECONNABORTED,
            errno.ETIMEDOUT,
            errno.ENETDOWN,
            errno.ENETUNREACH,
            errno.ENETRESET,
            errno.EHOSTDOWN,
            errno.EHOSTUNREACH,
            errno.ENOTCONN,
            socket.EAI_AGAIN,
            socket.EAI_NONAME,
        }
    )


# PostgreSQL's SQLSTATE classes of a server that cannot take us now: 08 connection exception,
# 53 insufficient resources (too many connections), 57P operator intervention (starting up,
# shutting down).
_POSTGRES_NOT_NOW = ("08", "53", "57P")


# The errors a user sees as one line, by module: configuration, store, resume and policy.
_USER_ERRORS = (
    ("bot.config.sources", "ConfigError"),
    ("bot.errors", "StoreError"),
    ("bot.errors", "ResumeRefused"),
    ("bot.people.policy", "NotPermitted"),
)


def _is_user_error(exc: Exception) -> bool:
    """Whether ``exc`` ends in one line. A module not imported yet raised none of its errors, so
    only the imported ones are checked: this wrapper imports nothing."""
    if isinstance(exc, Failure):
        return True
    for module, name in _USER_ERRORS:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(exc, getattr(loaded, name)):
            return True
    return False


def terminal_user(given: str | None = None) -> str:
    """Who acts at this terminal: ``--as``, else ``KESTREL_USER``, else the login name."""
    import os

    if given is not None and not given.strip():
        # A script's ``--as "$APPROVER"`` with the variable unset: acting as the login name
        # would record someone nobody named.
        raise Failure("--as: the name is empty")
    for name in (given, os.environ.get("KESTREL_USER"), os.environ.get("USER")):
        if name and name.strip():
            return checked_user(name.strip())
    import getpass  # only without a name given (its import loads termios)

    try:
        return checked_user(getpass.getuser())
    except (OSError, KeyError):
        return "terminal"  # no login name at all (a container without one): still one name


def named_in_commands(user: str) -> str:
    """``user`` when a command printed for them to run must say ``--as`` them: a bare one acts
    as ``KESTREL_USER`` or the login name, and they gave ``--as`` someone else; "" when a bare
    command acts as them already."""
    try:
        default = terminal_user()
    except Failure:  # no usable default (a KESTREL_USER of "*"): only --as names them
        return user
    return "" if default == user else user


def checked_user(name: str) -> str:
    """``name`` if it can only be read as one person: no control or format characters (it is
    printed in one line of the audit), not ``*`` nor ``group:``, ``role:`` or ``channel:``
    (the policy's ways to name many, which a name must not pass for); else ``Failure``."""
    from bot.people.policy import EVERYONE, PRINCIPAL_KINDS

    if not name.isprintable():
        raise Failure(f"user {name!r}: a name has no control or format characters")
    kind, colon, _rest = name.partition(":")
    if name == EVERYONE or (colon and kind in PRINCIPAL_KINDS):
        raise Failure(f"user {name!r}: the policy reads that as many people, not one person")
    return name


def checked_text(text: str, what: str) -> str:
    """``text`` given on the command line, if it is UTF-8 with no NUL; else ``Failure`` naming
    ``what`` (the prompt) and the first byte that is not. Python keeps such bytes of an
    argument as lone surrogates, which no journal entry, model request or audit row could
    carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        offset = len(text[: exc.start].encode("utf-8"))
        char = ord(text[exc.start])
        found = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"U+{char:04X}"
        raise Failure(f"{what} is not valid UTF-8 text ({found} at offset {offset})") from None
    if "\x00" in text:  # from stdin (an argument cannot hold one): PostgreSQL's text refuses it
        offset = len(text[: text.index("\x00")].encode("utf-8"))
        raise Failure(f"{what} is not text: it holds a NUL byte (at offset {offset})")
    return text


def configure_logs(
    log_level: str | None, verbose: bool, serving: bool, *, probing: bool = False
) -> None:
    """Log as ``--log-level`` (or ``-v``) and the environment say; a bad value ends in one line,
    and exit 2 unless ``probing`` (``kestrel health``): a probe's status says how the server
    is, never how its own environment is (Docker reserves 2), so it goes on as if unset.

    A service's log shows warnings; a one-shot command's answer stays its one line."""
    import os

    from bot import logs

    default = logs.DEFAULT_LEVEL if serving else "error"
    try:
        level, form = logs.chosen(log_level or ("info" if verbose else None), os.environ, default)
    except logs.LogSetupError as exc:
        json_asked = _json_errors_if_asked()  # a bad level with JSON asked: its line is JSON too
        if not probing:
            fail(str(exc))
            sys.exit(EXIT_USAGE)
        fail(f"{exc} (ignored: the probe goes on)")
        if json_asked:
            return  # configured for errors, as JSON lines, by the check above
        level, form = logs.LEVELS[default], "text"
    logs.configure(level, form)


def _json_errors_if_asked() -> bool:
    """Whether the logs are JSON lines, configured so (errors only) if ``KESTREL_LOG_FORMAT``
    asked for them before they were configured."""
    import logging
    import os

    from bot import logs

    if logs.json_lines():
        return True
    if os.environ.get(logs.FORMAT_VARIABLE, "").strip().lower() != "json":
        return False
    logs.configure(logging.ERROR, "json")
    return True


def as_option(help_text: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``--as USER``: who acts, defaulting to the terminal's one identity (``terminal_user``)."""
    import click

    return click.option(
        "--as",
        "user",
        default=None,
        metavar="USER",
        help=f"{help_text} [default: $KESTREL_USER, else your login name]",
    )


def limit_option(default: int) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``--limit N``: at most N rows, the newest. N is 1 or more (0 would list nothing whatever
    there is, and SQLite reads a negative limit as none); past what a database integer holds,
    it is every row."""
    import click

    return click.option(
        "--limit",
        default=default,
        show_default=True,
        metavar="N",
        type=plain_range(click.IntRange(min=1)),
        callback=lambda _ctx, _param, n: min(n, _MOST_ROWS),
        help="At most N rows, the newest.",
    )


def plain_range(numbers: N) -> N:
    """``numbers`` (click's IntRange or FloatRange), whose error for a value that is no number
    names the number it wants (``'abc' is not a valid integer``), not click's "integer range"."""
    numbers.name = numbers.name.removesuffix(" range")
    return numbers


# The largest limit a database takes (a signed 64-bit integer): more rows than any store holds.
_MOST_ROWS = 2**63 - 1


def config_option() -> str | None:
    """The ``--config`` given, if any."""
    import click

    obj: dict[str, Any] = click.get_current_context().ensure_object(dict)
    return obj.get("config")


def current_settings() -> Settings:
    """The settings of the command click runs, loaded once per invocation."""
    import click

    return settings_of(click.get_current_context())


def settings_of(ctx: click.Context) -> Settings:
    """The settings, loaded once per invocation."""
    obj: dict[str, Any] = ctx.ensure_object(dict)
    if "settings" not in obj:
        from bot.config.settings import load_settings

        obj["settings"] = load_settings(obj.get("config"))
    settings: Settings = obj["settings"]
    return settings


def with_runtime(
    work: Callable[[Runtime], Awaitable[R]],
    settings: Settings | None = None,
    *,
    standby: bool = False,
    calls_model: bool = True,
) -> R:
    """Run ``work`` with a runtime built from ``settings`` (the command's by default);
    ``standby`` and ``calls_model``: as ``compose.runtime``'s."""
    import asyncio

    settings = settings or current_settings()
    return asyncio.run(in_runtime(work, settings, standby=standby, calls_model=calls_model))


async def in_runtime(
    work: Callable[[Runtime], Awaitable[R]],
    settings: Settings,
    *,
    standby: bool = False,
    calls_model: bool = True,
) -> R:
    """``work`` with a runtime built from ``settings``, on the running event loop."""
    from bot.cli import compose

    async with compose.runtime(settings, standby=standby, calls_model=calls_model) as rt:
        # What start-up built (modules, settings, the catalog) outlives the work: kept out
        # of the collector's passes while it runs, as ``serve`` keeps it. A gen-1 pass over
        # the last imports' objects otherwise fell in a fresh run's suspend or resume
        # (0.5 ms, 1.6 M instructions of about 12 M: bench.cold), for nothing it could free.
        settle_after_start_up()
        return await work(rt)


def known_before_the_key(settings: Settings, run_id: str, request_id: str | None = None) -> None:
    """Without the model's key, a run (and its request) that does not exist is said first, as
    with the key: a mistyped id is no missing key. The runtime of a command that goes on with
    the run is refused for the key before its store is opened; with the key, nothing is read
    twice here."""
    import asyncio

    from bot.cli import compose

    if not compose.model_key_missing(settings):
        return

    async def main() -> None:
        async with compose.reader(settings) as store:
            if request_id is None:
                await store.get_run(run_id)  # UnknownRun: "unknown run 'run_…'"
                return
            from bot.people.decisions import NO_REQUEST, other_runs

            # In the order a decision checks them (bot.people.decisions, bot.cli.decisions).
            try:
                request, _status, _winner = await store.get_request(request_id)
            except KeyError:
                await store.get_run(run_id)
                raise Failure(f"{NO_REQUEST} {request_id}") from None
            if request.run_id != run_id:
                raise Failure(other_runs(request, run_id))

    asyncio.run(main())


def with_reader(work: Callable[[Store], Awaitable[R]]) -> R:
    """Run ``work`` with the store opened for reading only (no migration, no write lock)."""
    import asyncio

    from bot.cli import compose

    settings = current_settings()

    async def main() -> R:
        async with compose.reader(settings) as store:
            settle_after_start_up()
            return await work(store)

    return asyncio.run(main())
