"""The composition root: concrete store, model and tools built from the settings."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import msgspec

from bot import install_hint
from bot.config.settings import ConfigError
from bot.config.sources import (
    ENV_FILE,
    dotenv,
    pasted_token,
    postgres_target,
    secret_file_paths,
    sqlite_file,
)

# The parts are imported by the builders that need them, not here: ``runs list`` opens the
# store alone and must not pay for the model client, the tool catalogs or the PII scanner.
if TYPE_CHECKING:
    from datetime import datetime

    from bot.config.settings import Settings
    from bot.hooks import Hooks
    from bot.llm.base import ModelProvider
    from bot.people.policy import Policy
    from bot.pii.guard import PiiGuard
    from bot.pii.settings import PiiSettings
    from bot.run.runtime import Runtime
    from bot.store import Store
    from bot.tools.base import ApprovalPolicy, ToolFlags
    from bot.tools.catalog import CatalogError
    from bot.tools.isolation import Isolation
    from bot.tools.source import ToolSource
    from bot.tools.toolset import ToolSet
    from storage.postgres import PostgresStore
    from storage.sqlite import SqliteStore

log = logging.getLogger("kestrel.policy")
tools_log = logging.getLogger("kestrel.tools")
# The variable the demo catalog passes its simulated services (bot/demo/tools/ops.yaml).
DEMO_STATE = "KESTREL_DEMO_STATE"
UNISOLATED = (
    "tool_isolation.mode is none: catalog commands run without isolation and can read "
    "Kestrel's secrets (its environment through /proc, the configuration file, .env)"
)


def build_model(settings: Settings) -> ModelProvider:
    """The configured model provider; the scripted demo when no endpoint is configured.

    The OpenAI client is imported only for the OpenAI provider: it is slow to import.
    """
    if settings.provider == "scripted":
        from bot.llm.scripted import ScriptedProvider, ScriptError, load_script

        try:
            return ScriptedProvider(load_script(settings.script_path()))
        except (OSError, ScriptError) as exc:
            raise ConfigError(f"model.script: {exc}") from exc
    from bot.llm.openai_provider import MISSING_KEY, OpenAIProvider

    if model_key_missing(settings):
        raise ConfigError(f"model.provider is openai but {MISSING_KEY}")
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    if key is not None:
        pasted_token("OPENAI_API_KEY", key)
    return OpenAIProvider(
        settings.model.name,
        api_key=key,
        base_url=settings.openai_base_url or None,
        max_retries=settings.model.max_retries,
        max_reply_bytes=settings.model.max_reply_bytes,
    )


def model_key_missing(settings: Settings) -> bool:
    """Whether the configured model needs a key that is not set (OpenAI's, with no
    OPENAI_BASE_URL for a local server): ``build_model`` refuses it."""
    if settings.provider == "scripted":
        return False
    return settings.openai_api_key is None and not settings.openai_base_url


def uncalled_model(settings: Settings) -> ModelProvider:
    """The model of a command that calls none: named as configured, needing no key."""
    from bot.llm.uncalled import UncalledModel

    return UncalledModel(settings.provider, settings.model.name)


def build_isolation(settings: Settings) -> Isolation | None:
    """How catalog commands are kept from Kestrel's secrets; None when the settings opt out.

    The files to cover are those that exist now: the configuration file, the ``.env`` read
    from this folder, libpq's password file and ``tool_isolation.hide``.
    """
    from bot.tools.isolation import Isolation, secret_files

    section = settings.tool_isolation
    if section.mode == "none":
        return None
    named = [settings.resolve(path) for path in section.hide]
    named += secret_file_paths({**dotenv(), **os.environ})  # Docker and Kubernetes secrets
    return Isolation(secret_files(settings.config_file, Path(ENV_FILE), named))


def checked_isolation(settings: Settings) -> Isolation | None:
    """``build_isolation``, tried: a host where it cannot work refuses to start (one line
    naming the cause), and opting out is said at every start. A probe that passed under the
    same conditions is not run again (``Isolation.check_remembered``)."""
    from bot.tools.isolation import IsolationUnavailable

    isolation = build_isolation(settings)
    if isolation is None:
        tools_log.error("%s", UNISOLATED)
        return None
    if not settings.tool_patterns():
        return None  # no catalog (tools: [], or MCP servers alone): no command to isolate
    try:
        isolation.check_remembered()
    except IsolationUnavailable as exc:
        if settings.uses_demo_catalog():
            # The offline demo's simulated tools are ours and Kestrel holds no secret for them:
            # a newcomer's first run is not refused for want of namespaces.
            tools_log.error("tool_isolation: unavailable here (%s); the demo runs without it", exc)
            return None
        raise ConfigError(
            f"tool_isolation: catalog commands cannot be isolated here ({exc}); run as root or "
            "where user namespaces are allowed, or set tool_isolation.mode: none"
        ) from exc
    return isolation


def build_tools(
    settings: Settings, isolation: Isolation | None, *, checked: bool = True
) -> ToolSet:
    """Catalog tools, then the ask_human tools: one namespace, any collision is an error;
    ``checked``: the names the policy and deadlines give checked against them too."""
    from bot.tools.catalog import CatalogError, load_catalogs
    from bot.tools.propose_plan import human_tools
    from bot.tools.toolset import ToolCollision, ToolSet

    if settings.uses_demo_catalog():
        # A folder given relative is the command line's: the simulated services run in an
        # empty folder of their own, where what they keep would be lost at once.
        given = os.environ.get(DEMO_STATE)
        os.environ[DEMO_STATE] = str(Path(given).resolve() if given else demo_state(settings))
    try:
        catalog = load_catalogs(settings.tool_patterns(), settings.base_dir, isolation=isolation)
        human = human_tools() if settings.human_in_the_loop else []
        tools = ToolSet.assemble(catalog, human)
    except CatalogError as exc:
        raise _unusable_catalogs(exc) from exc
    except ToolCollision as exc:
        raise ConfigError(f"tools: {exc}") from exc
    if checked:
        check_tool_names(settings, tools)
    return tools


def _unusable_catalogs(exc: CatalogError) -> ConfigError:
    """Every problem of the catalogs in one line, "; " between them: the one-line error would
    otherwise run them together with a space (a problem has its own spaces and colons)."""
    return ConfigError("tools: " + "; ".join(exc.problems))


def check_tool_names(settings: Settings, tools: ToolSet) -> None:
    """Refuse a policy or deadline that names a tool, or a tag, the tool set lacks: a typo
    would leave that tool's requests to nobody, or its deadline unused. An MCP server's tools
    (``server__tool``) are the server's to list, so they are not checked here."""
    from bot.tools.base import mcp_tags
    from bot.tools.propose_plan import human_tools

    # A server's name may itself hold "__" or end in "_": its tools are "NAME__TOOL".
    servers = tuple(f"{server.name}__" for server in settings.mcp_servers)
    tags = {f"tag:{tag}" for tool in tools.values() for tag in tool.flags.approval.tags}
    # A server's tools, listed only once it runs, carry its tags (mcp, mcp:SERVER).
    tags |= {f"tag:{tag}" for server in settings.mcp_servers for tag in mcp_tags(server.name)}
    # The ask_human tools are known whether human_in_the_loop turns them on here or not: one
    # kestrel.yaml may serve a replica with them and headless runs without.
    known = {*tools, *(tool.name for tool in human_tools()), *tags}
    named = [("policy.approvers", key) for key in settings.policy.approvers]
    named += [("deadlines.per_tool", key) for key in settings.deadlines.per_tool]
    for section, key in named:
        if key == "*" or key in known or key.startswith(servers):
            continue
        if section == "policy.approvers":
            what, names = "tool or tag", sorted(tools) + sorted(tags)
        else:
            what, names = "tool", sorted(tools)
        raise ConfigError(f"{section}: {key!r} names no {what} here{_nearest(key, names)}")


def check_approvable(settings: Settings, tools: ToolSet) -> None:
    """Refuse a policy that names nobody to approve a tool that asks for approval, or fewer
    people than its ``approvals``: its every request would wait until its deadline, each click
    refused. A tool nobody may run says so with ``deny: true`` in its catalog. Asked only by
    the commands that ask people (``chat``, ``serve``, ``run --defer``, ``tools check``): a
    headless run refuses gated calls, and ``runs cancel`` must work under any policy."""
    from bot.people.policy import approval_keys, approvers_of

    for name, approval in [*_gated_by_servers(settings), *_approvals(settings, tools)]:
        if not approval.confirm or approval.deny:
            continue
        who = approvers_of(settings.policy, name, approval.tags)
        keys = [f'"{key}"' if key == "*" else key for key in approval_keys(name, approval.tags)]
        under = f"{', '.join(keys[:-1])} or {keys[-1]}"
        if not who:
            raise ConfigError(
                f"policy.approvers: nobody may approve {name}, which asks for approval"
                f" (confirm: true): name who may under {under}"
                "; a tool nobody may run is deny: true in its catalog"
            )
        few = _too_few(who, approval.approvals)
        if few:
            raise ConfigError(
                f"policy.approvers: {name} needs {approval.approvals} approvers (approvals:"
                f" {approval.approvals}), and only {few} may approve it: name more under"
                f" {under}, or a group"
            )


def _approvals(settings: Settings, tools: ToolSet) -> list[tuple[str, ApprovalPolicy]]:
    """Each catalog tool's name and who must let a call of it run. An MCP server's tools are
    the server's to list (gated by its annotations or its ``confirm:``, which
    ``_gated_by_servers`` reads): ``serve`` passes them, as it runs them, and they are left out."""
    servers = tuple(f"{server.name}__" for server in settings.mcp_servers)
    listed = tools.items()
    return [(name, tool.flags.approval) for name, tool in listed if not name.startswith(servers)]


def _gated_by_servers(settings: Settings) -> list[tuple[str, ApprovalPolicy]]:
    """The MCP tools a server's ``confirm:`` gates, known before it lists them, as the server's
    source offers them (``SERVER__TOOL``); a name it would rewrite to fit is left out."""
    from bot.tools.base import ApprovalPolicy, check_tool_name, mcp_tags

    gated = []
    for server in settings.mcp_servers:
        for tool in server.confirm:
            name = f"{server.name}__{tool}"
            try:
                check_tool_name(name)
            except ValueError:
                continue
            gated.append((name, ApprovalPolicy(confirm=True, tags=mcp_tags(server.name))))
    return gated


def _too_few(who: list[str], needed: int) -> str:
    """The people ``who`` names, when they are fewer than the ``needed`` approvals (each a
    different person's), as "U1, U2"; "" when ``*``, a group or a channel may hold more."""
    people = sorted(set(who))
    if len(people) >= needed or any(p == "*" or ":" in p for p in people):
        return ""
    return ", ".join(people)


def _nearest(name: str, known: list[str]) -> str:
    from bot.plain import nearest

    close = nearest(name, known)
    return f" (did you mean {close!r}?)" if close else f"; known: {', '.join(known)}"


def demo_state(settings: Settings) -> Path:
    """Where the offline demo's simulated services keep their state: beside the journal (or
    the configuration's folder), so that each working folder plays its own incident."""
    journal = sqlite_file(settings.base_dir, settings.database)
    folder = journal.parent if journal is not None else settings.base_dir
    return folder.resolve() / ".kestrel-demo"


def tool_flags(settings: Settings) -> Callable[[str], ToolFlags | None]:
    """Each configured tool's flags by name, for commands that read the store (who may answer
    a request). The catalogs' entries are checked, their parameters are not (no schema or
    pattern is compiled: ``build_tools`` checks them whole for a run); no MCP server starts."""
    from bot.tools.catalog import CatalogError, catalog_flags
    from bot.tools.propose_plan import human_tools

    human = human_tools() if settings.human_in_the_loop else []
    try:
        flags = catalog_flags(
            settings.tool_patterns(), settings.base_dir, reserved=[tool.name for tool in human]
        )
    except CatalogError as exc:
        raise _unusable_catalogs(exc) from exc
    flags.update((tool.name, tool.flags) for tool in human)
    return flags.get


def build_guard(settings: Settings, pii: PiiSettings | None = None) -> PiiGuard:
    """The PII guard (of ``pii``, else the settings'); a mode other than off whose scanner
    will not build is an error."""
    from bot.pii.guard import PiiBuildError, PiiGuard

    try:
        return PiiGuard(pii or settings.pii)
    except PiiBuildError as exc:
        raise ConfigError(f"pii: the scanner will not build: {exc}") from exc


def load_scanner(settings: Settings) -> None:
    """For ``serve``, which lives for weeks: the PII scanner's every finder imported at start
    (``load_finders``), so a broken install stops it there in one line, not at the first text
    that reaches the finder (that text withheld), and an upgrade installed under it is never
    half taken up."""
    from bot.pii.recognizers import load_finders
    from bot.pii.settings import PiiMode

    if settings.pii.mode is PiiMode.OFF:
        return

    try:
        load_finders()
    except Exception as exc:
        raise ConfigError(f"pii: the scanner will not build: {type(exc).__name__}: {exc}") from exc


def steady_operators(pii: PiiSettings) -> PiiSettings:
    """``pii`` with each ``hash`` that has no salt of its own replaced by the type's name: the
    process's random salt would make a server's tool descriptions differ between processes,
    and so the tool set's digest, and every resume would be refused as a changed tool set."""
    operators = pii.operators.items()
    steady = {name: spec for name, spec in operators if spec.salt or spec.type != "hash"}
    if len(steady) == len(pii.operators):
        return pii
    import msgspec

    return msgspec.structs.replace(pii, operators=steady)


def build_hooks(settings: Settings) -> Hooks:
    """The caller's hooks named in the settings."""
    from bot.hooks import Hooks

    section = settings.hooks
    try:
        return Hooks.from_references(
            user_prompt_submit=section.user_prompt_submit,
            pre_tool_use=section.pre_tool_use,
            post_tool_use=section.post_tool_use,
            run_end=section.run_end,
            timeout=section.timeout,
        )
    except ValueError as exc:
        raise ConfigError(f"hooks: {exc}") from exc


def policy_notices(settings: Settings, policy: Policy) -> list[str]:
    """What the chat's banner says of the policy; nothing in the offline demo, whose one
    person at a terminal has no on-call to name (a newcomer's first screen says what the demo
    is, not how to staff it). The log says every notice: ``serve`` of the demo's catalog is a
    team's, with people to put on call."""
    return [] if settings.uses_demo_catalog() else policy.notices()


def program_notices(settings: Settings) -> list[str]:
    """What the chat's banner says of the catalogs: each tool whose program cannot start here,
    which a load only warns of (it may be installed later), and the chat's log leaves unsaid."""
    from bot.tools.catalog import unstartable_programs

    found = unstartable_programs(settings.tool_patterns(), settings.base_dir)
    return [f"{problem}; its calls fail until it can start" for problem in found]


def shown_database(settings: Settings) -> str:
    """The journal as the terminal names it: a SQLite file, or a PostgreSQL server without its
    password."""
    path = sqlite_file(settings.base_dir, settings.database)
    return str(path) if path is not None else postgres_target(*postgres_schema(settings.database))


def postgres_schema(url: str) -> tuple[str, str]:
    """Split an optional ``?schema=NAME`` (Kestrel's, not libpq's) off a PostgreSQL URL."""
    parts = urlsplit(url)  # ``check_database`` refused a URL it cannot read
    pairs = parse_qsl(parts.query)
    query = [(k, v) for k, v in pairs if k != "schema"]
    if len(query) == len(pairs):
        return url, "public"
    schema = dict(pairs).get("schema", "public")
    rebuilt = urlunsplit(parts._replace(query=urlencode(query)))
    if not parts.netloc:
        # urlunsplit drops an empty host's "//" (libpq's postgresql:///DB?host=/run/postgresql
        # for a socket), and "postgresql:/DB" is a path to URL parsers.
        rebuilt = rebuilt.replace(f"{parts.scheme}:", f"{parts.scheme}://", 1)
    return rebuilt, schema


async def open_store(
    settings: Settings, *, read_only: bool = False, clock: Callable[[], datetime] | None = None
) -> Store:
    """The store named by ``database``: a SQLite file, or a PostgreSQL URL.

    ``read_only``: no migration and no write (SQLite: no write access and no write lock
    needed either). ``clock``: the runtime's (the store's own, the wall clock, by default).
    """
    path = sqlite_file(settings.base_dir, settings.database)
    if path is not None:
        from storage.sqlite import open_sqlite

        if clock is None:
            return await open_sqlite(path, read_only=read_only)
        return await open_sqlite(path, read_only=read_only, clock=clock)
    try:
        from storage.postgres import open_postgres
    except ImportError as exc:
        raise ConfigError(
            f"database: PostgreSQL needs asyncpg: {install_hint('postgres')}"
        ) from exc
    dsn, schema = postgres_schema(settings.database)
    timeout = settings.database_timeout_seconds
    if clock is None:
        return await open_postgres(dsn, schema=schema, command_timeout=timeout, read_only=read_only)
    return await open_postgres(
        dsn, schema=schema, clock=clock, command_timeout=timeout, read_only=read_only
    )


class SchemaCheck(msgspec.Struct, frozen=True):
    """What ``db check`` found: the schema applied, the one this Kestrel needs, and (when they
    match) how many runs and open requests the store holds."""

    applied: int
    current: int
    runs: int = 0
    open_requests: int = 0


async def check_schema(settings: Settings) -> SchemaCheck:
    """The store's schema version and counts, read without writing or creating anything (no
    database file, no schema, no table)."""
    store = _unopened_store(settings)
    try:
        applied = await store.applied_version()
        if applied != store.current_schema:
            return SchemaCheck(applied, store.current_schema)
        await store.migrate()  # at the current version: opens for reading, applies nothing
        runs = sum((await store.count_runs_by_status()).values())
        return SchemaCheck(applied, store.current_schema, runs, len(await store.list_requests()))
    finally:
        await store.close()


def _unopened_store(settings: Settings) -> SqliteStore | PostgresStore:
    """The store ``database`` names, constructed but not connected (SQLite: read-only)."""
    path = sqlite_file(settings.base_dir, settings.database)
    if path is not None:
        from storage.sqlite import SqliteStore

        return SqliteStore(path, read_only=True)
    try:
        from storage.postgres import PostgresStore
    except ImportError as exc:
        raise ConfigError(
            f"database: PostgreSQL needs asyncpg: {install_hint('postgres')}"
        ) from exc
    dsn, schema = postgres_schema(settings.database)
    timeout = settings.database_timeout_seconds
    return PostgresStore(dsn, schema=schema, command_timeout=timeout, read_only=True)


@asynccontextmanager
async def reader(settings: Settings) -> AsyncIterator[Store]:
    """The store alone, opened for reading: what inspecting commands need, no model or tools."""
    store = await open_store(settings, read_only=True)
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def tool_source(
    settings: Settings, *, checked: bool = True, standby: bool = False
) -> AsyncIterator[ToolSource]:
    """The tool set; with MCP servers configured, their sessions live as long as the block.
    ``checked``: isolation is tried first (``checked_isolation``), as before running a command.
    ``standby``: the first catalog command's helper starts now (``bot.tools.standby``), for a
    process that is about to run one (an approval at the command line).
    """
    isolation = checked_isolation(settings) if checked else build_isolation(settings)
    if not standby or isolation is None:
        async with _tool_source(settings, isolation) as source:
            yield source
        return
    from bot.tools.standby import Standby

    standing = Standby(isolation)
    await standing.start()
    try:
        standing_by = msgspec.structs.replace(isolation, standby=standing)
        async with _tool_source(settings, standing_by) as source:
            yield source
    finally:
        await standing.close()


@asynccontextmanager
async def _tool_source(
    settings: Settings, isolation: Isolation | None
) -> AsyncIterator[ToolSource]:
    """``tool_source`` with its isolation chosen. The ``mcp`` package is imported only with
    MCP servers: it is an optional extra and slow to import."""
    from bot.tools.source import ToolSource
    from bot.tools.toolset import ToolCollision

    builtin = build_tools(settings, isolation)
    if not settings.mcp_servers:
        yield ToolSource(builtin)
        return
    try:
        from bot.tools.mcp import McpStartError, mcp_tools
    except ImportError as exc:
        raise ConfigError(
            f"mcp_servers: the mcp package is missing: {install_hint('mcp')}"
        ) from exc
    # A server's stderr is logged, and its tools are described to the model, as the guard
    # leaves them; a description must read the same in every process (``steady_operators``).
    guard = build_guard(settings, steady_operators(settings.pii))
    tools = mcp_tools(settings, builtin.values(), lambda text: guard.scan_output(text).text)
    try:
        source = await tools.start()
    except (McpStartError, ToolCollision) as exc:
        await tools.close()
        raise ConfigError(f"mcp_servers: {exc}") from exc
    try:
        yield source
    finally:
        await tools.close()


@asynccontextmanager
async def runtime(
    settings: Settings,
    *,
    clock: Callable[[], datetime] | None = None,
    standby: bool = False,
    calls_model: bool = True,
) -> AsyncIterator[Runtime]:
    """A runtime for one process; its MCP sessions and store are closed on exit. ``clock``:
    the one clock of the runtime and its store (the wall clock by default; tests move it);
    ``standby``: as ``tool_source``'s; without ``calls_model`` (a cancel), the model is a
    stand-in that needs no key.

    The tools come first: a helper standing by then starts while the rest is imported and
    built."""
    async with tool_source(settings, standby=standby) as tools:
        from bot.events import FanOut, LogSink
        from bot.people.policy import Policy
        from bot.pii.hooks import pii_hooks
        from bot.run.runtime import Runtime

        model = build_model(settings) if calls_model else uncalled_model(settings)
        guard = build_guard(settings)
        hooks = build_hooks(settings)
        events = FanOut(LogSink())
        policy = Policy(settings.policy)
        for notice in policy.notices():
            log.warning("%s", notice)
        store = await open_store(settings, clock=clock)
        try:
            yield Runtime(
                # The store's clock by default: PostgreSQL's, shared by every replica.
                clock=clock or store.now,
                store=store,
                model=model,
                tools=tools,
                hooks=hooks,
                events=events,
                system_prompt=settings.system_prompt,
                budgets=settings.budgets.to_budgets(),
                model_timeout=settings.model.timeout,
                guard_hooks=lambda: pii_hooks(guard, events),
                redact=lambda text: guard.scan_output(text).text,
                policy=policy,
                deadlines=settings.deadlines,
                provenance=settings.provenance,
                lease_seconds=settings.replica.lease_seconds,
                shared=sqlite_file(settings.base_dir, settings.database) is None,
            )
        finally:
            await store.close()
            close = getattr(model, "aclose", None)
            if close is not None:  # the OpenAI client's connections, before the loop ends
                await close()
