"""MCP servers as tool sources: one open session per server, its tools in the one flat set.

Naming: a server's tool ``T`` is offered to the model as ``{server}__{T}``. OpenAI tool names
allow only ``[a-zA-Z0-9_-]{1,64}``; a name that would break that (MCP also allows ``.`` and
longer names) has each other character replaced by ``_``, is cut to fit, and ends in ``_``
and 8 hex digits of the SHA-256 of the original tool name, so two tools never map to one name
and a name stays the same across re-listings. The call goes out under the server's own name.

Flags: ``readOnlyHint`` or ``idempotentHint`` makes a tool idempotent (safe to rerun after a
crash); a tool that is not read-only and is destructive (MCP's default when the server says
nothing) is confirm-gated, and so is every tool named in the server's ``confirm:`` list.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2
import mcp_types as types
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client import IncomingMessage, Transport
from mcp.client.streamable_http import streamable_http_client
from pydantic import ValidationError

from bot import DISTRIBUTION, __version__
from bot.digest import sha256
from bot.tools.base import (
    ApprovalPolicy,
    Tool,
    ToolContext,
    ToolFlags,
    ToolResult,
    ToolTraits,
    capped,
    mcp_tags,
)
from bot.tools.mcp_stderr import MAX_LINE, Redact, ServerStderr, unchanged
from bot.tools.source import ToolSource
from bot.tools.toolset import ToolCollision, ToolSet

if TYPE_CHECKING:
    # Types only: the settings are the composition root's; this room does not import config's.
    from bot.config.settings import McpServerSettings, Settings

log = logging.getLogger("kestrel.mcp")

SEPARATOR = "__"
MAX_NAME = 64
CLIENT_INFO = types.Implementation(name=DISTRIBUTION, version=__version__)
# How long a finished call waits for a tool re-listing its own call set off.
SETTLE_SECONDS = 2.0
CLOSE_SECONDS = 10.0
# Waits before connecting again to a server whose session ended, the last one repeated: a
# server that crashed comes back without a restart of Kestrel, one that keeps crashing is not
# started in a tight loop.
RECONNECT_SECONDS = (1.0, 2.0, 5.0, 15.0, 30.0)
# How long a session must have lasted for its end to start the waits over: a server that dies
# soon after each start keeps failing, though each start succeeded.
STEADY_SECONDS = RECONNECT_SECONDS[-1]
MAX_PAGES = 100
# The SDK's own client's: a server may hold a response stream open for minutes.
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
# The most characters of a tool's description and input schema (as JSON) taken from a server:
# each request to the model carries every tool's, a run's token budget pays for them at every
# turn, and checking a schema of megabytes held the event loop for seconds (3 MB: 20 s).
MAX_DEFINITION = 32 * 1024
BUILTIN_OWNER = "the built-in tools (catalog and ask_human)"

_INVALID = re.compile(r"[^a-zA-Z0-9_-]")

# What the SDK logs, as an error of its own, of each line a stdio server writes on its stdout
# that is no JSON-RPC message: raw (a key or an address it holds included), a traceback with
# it, and no server named. ``McpSource`` says it instead, named and through the PII guard.
_STRAY_SAID = "Failed to parse JSONRPC message from server"


class _StrayLinesSaidByUs(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_STRAY_SAID)


logging.getLogger("mcp.client.stdio").addFilter(_StrayLinesSaidByUs())


class McpStartError(Exception):
    """The servers cannot be started as configured; the message names the server and why.

    ``not_answering``: the server did not answer (no answer in time, its address refused or
    unreachable, an HTTP 5xx), which a later start may get past, unlike a command that is not
    there or a server that refused us: ``kestrel serve`` exits 75 then, to be started again.
    """

    def __init__(self, message: str, *, not_answering: bool = False) -> None:
        super().__init__(message)
        self.not_answering = not_answering


def tool_name(server: str, remote: str) -> str:
    """The model-facing name of ``remote`` on ``server`` (see the module docstring)."""
    name = f"{server}{SEPARATOR}{remote}"
    if len(name) <= MAX_NAME and not _INVALID.search(remote):
        return name
    digest = sha256(remote.encode()).hexdigest()[:8]
    room = MAX_NAME - len(server) - len(SEPARATOR) - len(digest) - 1
    return f"{server}{SEPARATOR}{_INVALID.sub('_', remote)[:room]}_{digest}"


def tool_flags(
    annotations: types.ToolAnnotations | None, gated: bool, timeout: float, server: str = ""
) -> ToolFlags:
    """Flags from MCP's hints: unset hints take MCP's defaults (not read-only, destructive).

    Tags ``mcp`` and ``mcp:{server}`` let the policy name approvers per server.
    """
    hints = annotations or types.ToolAnnotations()
    read_only = hints.read_only_hint is True
    destructive = hints.destructive_hint is not False
    approval = ApprovalPolicy(
        confirm=gated or (destructive and not read_only),
        tags=mcp_tags(server),
    )
    traits = ToolTraits(idempotent=read_only or hints.idempotent_hint is True, timeout=timeout)
    return ToolFlags(approval, traits)


def render(result: types.CallToolResult) -> str:
    """The result as text: text parts joined, other parts summarized, else structured content."""
    parts = [_render_block(block) for block in result.content]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content)
    return "\n".join(parts)


def _render_block(block: types.ContentBlock) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        return f"[{block.type}: {block.mime_type}]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link: {block.uri}]"
    resource = block.resource
    if isinstance(resource, types.TextResourceContents):
        return f"[resource: {resource.uri}]\n{resource.text}"
    return f"[resource: {resource.uri} ({resource.mime_type or 'binary'})]"


def _reason(exc: BaseException) -> str:
    """One line for an error; anyio wraps a lone failure in a group, which says nothing."""
    exc = _unwrapped(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _unwrapped(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _not_answering(exc: BaseException) -> bool:
    """Whether a failed start is the server not answering: its address refused, unreachable or
    timing out, or the first request unanswered in time (not a missing command, a crash, or a
    refusal by a server that answered)."""
    exc = _unwrapped(exc)
    if isinstance(exc, MCPError):
        return exc.code == types.REQUEST_TIMEOUT
    # A stdio command that is not there is an OSError too: a mistake, however often retried.
    if isinstance(exc, FileNotFoundError | PermissionError):
        return False
    return isinstance(exc, httpx2.TransportError | ConnectionError | TimeoutError)


@dataclass(frozen=True)
class McpTool:
    """One tool of one MCP server, called through that server's open session."""

    name: str
    description: str
    parameters: dict[str, Any]
    flags: ToolFlags
    remote: str
    source: McpSource

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:  # noqa: ARG002
        """Call the server's tool; every failure, a vanished tool included, is an error result."""
        started = time.monotonic()
        result = await self.source.call(self.remote, arguments)
        # A call that changed the server's tool list hears of it before its own answer; waiting
        # for the re-listing means the model's next call sees the set this call produced.
        await self.source.settled(self._settle_budget(time.monotonic() - started))
        return result

    def _settle_budget(self, elapsed: float) -> float:
        """Never let the wait push a finished call past its own timeout."""
        if self.flags.traits.timeout <= 0:
            return SETTLE_SECONDS
        return min(SETTLE_SECONDS, (self.flags.traits.timeout - elapsed) / 2)


class McpSource:
    """One MCP server: a session open from ``start()`` to ``close()``, and its latest listing."""

    def __init__(
        self,
        settings: McpServerSettings,
        *,
        cwd: Path | None = None,
        redact: Redact = unchanged,
    ) -> None:
        self.settings = settings
        self._cwd = cwd
        # The PII guard, as it reads tool outputs: over the server's stderr in the log, and its
        # tools' descriptions and schemas before the model reads them.
        self._redact = redact
        self._tools: tuple[McpTool, ...] = ()
        self._session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        # A call failed: ask the server whether the session still stands (a connection closed
        # fails the ping at once; an HTTP server restarted since refuses every request of it,
        # saying only that it is unknown).
        self._doubt = asyncio.Event()
        self._lock = asyncio.Lock()
        self._relisting = 0
        self._settled = asyncio.Event()
        self._settled.set()
        self._on_change: Callable[[McpSource], None] = lambda _source: None
        self._on_error: Callable[[McpSource, str], None] = lambda _source, _reason: None
        self._stderr: ServerStderr | None = None
        self._http_status = 0
        self._strays = 0  # lines of stdout that were no message, this session

    @property
    def name(self) -> str:
        """The server's name, the prefix of its tools."""
        return self.settings.name

    @property
    def tools(self) -> tuple[McpTool, ...]:
        """The server's tools as last listed."""
        return self._tools

    async def start(
        self,
        on_change: Callable[[McpSource], None] | None = None,
        on_error: Callable[[McpSource, str], None] | None = None,
    ) -> None:
        """Connect, initialize and list; later re-listings report to the callbacks."""
        if self._task is not None:
            raise RuntimeError(f"MCP server {self.name} is already started")
        self._on_change = on_change or self._on_change
        self._on_error = on_error or self._on_error
        self._stop.clear()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # The session lives on a task of its own: anyio scopes must be entered and left by one
        # task, and the caller's task need not be the one that closes the source.
        self._task = asyncio.create_task(self._serve(ready), name=f"mcp:{self.name}")
        try:
            await asyncio.wait_for(ready, self.settings.timeout)
        except TimeoutError:
            await self._abort()
            raise McpStartError(
                f"MCP server {self.name}: no answer within {self.settings.timeout:g}s",
                not_answering=True,
            ) from None
        except BaseException:
            await self._abort()
            raise

    async def close(self) -> None:
        """End the session (and a stdio server's process); safe to call twice."""
        if self._session is None:
            # Between sessions, perhaps connecting again to a server that hangs: nothing to end
            # gently, and a shutdown must not wait out its timeout.
            await self._abort()
            return
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        try:
            await asyncio.wait_for(task, CLOSE_SECONDS)
        except TimeoutError:
            log.warning("MCP server %s did not close within %gs", self.name, CLOSE_SECONDS)

    async def _abort(self) -> None:
        """Stop a connect that failed, timed out or is cut short: cancel it rather than wait."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def call(self, remote: str, arguments: dict[str, Any]) -> ToolResult:
        """Call one tool by the server's own name; failures become error results."""
        session = self._session
        if session is None:
            return ToolResult(f"MCP server {self.name} is not connected", is_error=True)
        try:
            result = await session.call_tool(remote, arguments)
        except Exception as exc:
            if session is self._session:  # not a session already replaced
                self._doubt.set()
            if await _closed(session, exc, self.settings.timeout):
                # The server may have died doing it, as a timeout may cut a call: not undone.
                said = "the connection closed before it answered; what it did, if anything, stands"
                return ToolResult(f"MCP server {self.name}: {remote}: {said}", is_error=True)
            return ToolResult(f"MCP server {self.name}: {remote}: {_reason(exc)}", is_error=True)
        return ToolResult(capped(render(result)), is_error=result.is_error)

    async def settled(self, within: float) -> None:
        """Wait at most ``within`` seconds for re-listings in flight to land."""
        if within <= 0 or self._settled.is_set():
            return
        try:
            async with asyncio.timeout(within):
                await self._settled.wait()
        except TimeoutError:
            log.info("MCP server %s: tool re-listing still running after %gs", self.name, within)

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        """The session until ``close()``: a start that fails fails ``start()``; a session that
        ends later is connected again (re-listed, so a changed set is swapped in), after a wait
        that grows while the server keeps failing. Calls meanwhile say it is not connected."""
        failures = 0
        while True:
            connected: float | None = None
            try:
                async with AsyncExitStack() as stack:
                    await self._connect(stack, again=ready.done())
                    connected = time.monotonic()
                    if not ready.done():
                        ready.set_result(None)
                    if await self._stopped_or_lost(self._session):
                        return
                    raise ConnectionError("the connection closed")
            except Exception as exc:
                said = self._stderr.last if self._stderr is not None else ""
                said = f" (its stderr: {said})" if said else ""
                if not ready.done():
                    ready.set_exception(self._start_error(exc, said))
                    return
                if connected is not None and time.monotonic() - connected >= STEADY_SECONDS:
                    failures = 0
                wait = RECONNECT_SECONDS[min(failures, len(RECONNECT_SECONDS) - 1)]
                failures += 1
                log.warning(
                    "MCP server %s: the session ended: %s%s; connecting again in %gs",
                    self.name,
                    _reason(exc),
                    said,
                    wait,
                )
            finally:
                self._session = None
            if await _set_within(self._stop, wait):
                return

    def _start_error(self, exc: Exception, said: str) -> McpStartError:
        """Why the first start failed, with the HTTP status the SDK's error leaves out."""
        # The SDK answers a request whose POST got an error status with an MCPError.
        status = self._http_status if isinstance(_unwrapped(exc), MCPError) else 0
        http = f" (HTTP {status})" if status else ""
        return McpStartError(
            f"MCP server {self.name}: cannot start: {_reason(exc)}{http}{said}",
            not_answering=status >= 500 or _not_answering(exc),
        )

    async def _stopped_or_lost(self, session: ClientSession | None) -> bool:
        """Wait until ``close()`` (True) or the session is lost (False): a call failed, or a
        stdio server's stderr closed, and a ping then finds it gone (a server that closed its
        stderr itself answers, and is watched through its calls alone)."""
        stderr = self._stderr
        while True:
            waits: list[Awaitable[object]] = [self._stop.wait(), self._doubt.wait()]
            if stderr is not None:
                waits.append(stderr.closed())
            await _first(waits)
            if self._stop.is_set():
                return True
            doubted = self._doubt.is_set()
            self._doubt.clear()
            if not await _answers(session, self.settings.timeout):
                return False
            if not doubted:
                log.info("MCP server %s closed its stderr and still answers", self.name)
                stderr = None

    async def _connect(self, stack: AsyncExitStack, again: bool = False) -> None:
        transport = await self._transport(stack)
        stderr = self._stderr
        if stderr is not None:
            # Closed after the process ends (the stack unwinds in reverse): its last words land.
            stack.push_async_callback(stderr.finished)
        read, write = await stack.enter_async_context(transport)
        if stderr is not None:
            await stderr.started()
        self._strays = 0
        session = ClientSession(
            read,
            write,
            read_timeout_seconds=self.settings.timeout,
            message_handler=self._on_message,
            client_info=CLIENT_INFO,
        )
        await stack.enter_async_context(session)
        await session.initialize()
        # Under the lock, so a change announced during start is re-listed after this listing.
        async with self._lock:
            self._tools = await self._list(session)
            self._session = session
            self._doubt.clear()
        if again:
            log.warning("MCP server %s: connected again", self.name)
            self._on_change(self)  # the server may list other tools now

    async def _transport(self, stack: AsyncExitStack) -> Transport:
        settings = self.settings
        self._stderr = None
        self._http_status = 0
        if settings.transport == "http":
            assert settings.url is not None, "config validation requires url for http"
            # Our own client, to read each answer's status: the SDK turns every error status
            # but 404 into one "error response", which cannot tell a 401 from a 503.
            client = httpx2.AsyncClient(
                timeout=HTTP_TIMEOUT, event_hooks={"response": [self._note_status]}
            )
            await stack.enter_async_context(client)
            return streamable_http_client(settings.url, http_client=client)
        command, *args = settings.command
        # The stdio client passes only a safe subset of our environment, plus ``env``.
        params = StdioServerParameters(
            command=command, args=args, env=settings.env or None, cwd=self._cwd
        )
        self._stderr = ServerStderr(self.name, self._redact)
        return stdio_client(params, errlog=self._stderr.writer())

    async def _note_status(self, response: httpx2.Response) -> None:
        """Keep the last error status of a request's POST, to say why a start failed (the GET
        of the notification stream may be refused, as a server that offers none does)."""
        if response.status_code >= 400 and response.request.method == "POST":
            self._http_status = response.status_code

    async def _list(self, session: ClientSession) -> tuple[McpTool, ...]:
        listed: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            listed += page.tools
            cursor = page.next_cursor
            if cursor is None:
                break
        _check_listed_once(listed)
        return tuple(self._tool(tool) for tool in listed if self._usable(tool))

    def _usable(self, tool: types.Tool) -> bool:
        """Whether the tool's definition fits (``MAX_DEFINITION``) and its input schema is JSON
        Schema; a tool that fails either is left out, with why: the model's API would refuse
        every request offering it, and its calls could not be checked."""
        size = definition_size(tool)
        if size > MAX_DEFINITION:
            log.warning(
                "MCP server %s: tool %r left out: its description and inputSchema are %d"
                " characters, over %d (every request to the model would carry them)",
                self.name,
                tool.name,
                size,
                MAX_DEFINITION,
            )
            return False
        problem = schema_problem(tool.input_schema)
        if problem:
            log.warning(
                "MCP server %s: tool %r left out: its inputSchema is not valid JSON Schema (%s)",
                self.name,
                tool.name,
                problem,
            )
        return not problem

    def _tool(self, tool: types.Tool) -> McpTool:
        gated = tool.name in self.settings.confirm
        said = tool.description or tool.title or f"{tool.name} on MCP server {self.name}"
        description = self._redact(said)
        parameters = guarded_schema(dict(tool.input_schema), self._redact)
        if description != said or parameters != tool.input_schema:
            log.warning(
                "MCP server %s: tool %r: the PII guard rewrote sensitive data in its description"
                " or input schema before the model reads them",
                self.name,
                tool.name,
            )
        return McpTool(
            name=tool_name(self.name, tool.name),
            description=description,
            parameters=parameters,
            flags=tool_flags(tool.annotations, gated, self.settings.timeout, self.name),
            remote=tool.name,
            source=self,
        )

    async def _on_message(self, message: IncomingMessage) -> None:
        """Runs on the session's own task; only a tool-list change matters here."""
        if isinstance(message, Exception):
            line = _stray_line(message)
            if line is None:
                log.warning("MCP server %s: transport error: %s", self.name, _reason(message))
            else:
                self._stray(line)
            return
        if not isinstance(message, types.ToolListChangedNotification):
            return
        self._relisting += 1
        self._settled.clear()
        try:
            async with self._lock:
                await self._relist()
        finally:
            self._relisting -= 1
            if not self._relisting:
                self._settled.set()

    def _stray(self, line: str) -> None:
        """A line of stdout that is no message: the first of a session a warning (the server
        logs on the wrong stream), the rest info, as its stderr's lines are."""
        # Cut before the guard reads it (a line may be megabytes), and well past what is kept.
        text = self._redact(line[: 2 * MAX_LINE])[:MAX_LINE].rstrip()
        self._strays += 1
        if self._strays > 1:
            log.info("MCP server %s: on stdout: %s", self.name, text)
            return
        log.warning(
            "MCP server %s wrote a line on its stdout that is no JSON-RPC message (its own"
            " logs belong on stderr); it is dropped, as each such line, logged at info: %s",
            self.name,
            text,
        )

    async def _relist(self) -> None:
        session = self._session
        if session is None:
            return
        try:
            self._tools = await self._list(session)
        except Exception as exc:
            self._on_error(self, _reason(exc))
            return
        self._on_change(self)


class McpTools:
    """The process's tools: built-in ones, then each MCP server's in config order, as one set."""

    def __init__(self, builtin: Iterable[Tool], sources: Sequence[McpSource] = ()) -> None:
        self._builtin = tuple(builtin)
        self._sources = tuple(sources)
        self._accepted: dict[str, tuple[McpTool, ...]] = {}
        self._started = False
        self.source = ToolSource(ToolSet(self._builtin))

    async def start(self) -> ToolSource:
        """Start every server and assemble the set; any failure or collision closes them all."""
        _check_unique(self._sources)
        try:
            for server in self._sources:
                await server.start(self._changed, self._relist_failed)
            accepted = {server.name: server.tools for server in self._sources}
            self.source.replace(self._assemble(accepted))
        except BaseException:
            await self.close()
            raise
        self._accepted = accepted
        self._started = True
        return self.source

    async def close(self) -> None:
        """Close every server's session, side by side: a server that outlives its stdin is
        killed only after the stdio client's waits, which must not add up over servers."""
        self._started = False
        await asyncio.gather(*(server.close() for server in self._sources))

    def _assemble(self, accepted: Mapping[str, tuple[McpTool, ...]]) -> ToolSet:
        groups: list[tuple[str, Sequence[Tool]]] = [(BUILTIN_OWNER, self._builtin)]
        groups += [(f"MCP server {s.name}", accepted[s.name]) for s in self._sources]
        _check_owners(groups)
        return ToolSet.assemble(*(tools for _, tools in groups))

    # The two callbacks below run on an MCP session's task, not a run's. They share only the
    # ToolSource with the runs, and touch it without an await in between: a whole-set pointer
    # assignment and a list append on the event loop's one thread, so no run sees half a change.

    def _changed(self, server: McpSource) -> None:
        """Swap in a new whole set for the server's new listing, or refuse it with a reason."""
        if not self._started:
            return  # start() assembles from whatever listing it finds
        before, after = self._accepted[server.name], server.tools
        change = describe_change(before, after)
        if not change:
            return
        candidate = {**self._accepted, server.name: after}
        try:
            tools = self._assemble(candidate)
        except ToolCollision as exc:
            self._advise(f"MCP server {server.name}: refused a tool list change ({change}): {exc}")
            return
        self._accepted = candidate
        self.source.replace(tools, f"MCP server {server.name}: {change}")

    def _relist_failed(self, server: McpSource, reason: str) -> None:
        if not self._started:
            return  # a re-listing cut short by close() is no news
        self._advise(
            f"MCP server {server.name}: its tool list changed but could not be re-listed "
            f"({reason}); its previous tools stay"
        )

    def _advise(self, text: str) -> None:
        """Queue an advisory without changing the set (the same set, replaced by itself)."""
        self.source.replace(self.source.current(), text)


def describe_change(before: Sequence[Tool], after: Sequence[Tool]) -> str:
    """What changed between two listings, e.g. ``tools added: a; removed: b``; empty if nothing."""
    old = {tool.name: _shape(tool) for tool in before}
    new = {tool.name: _shape(tool) for tool in after}
    added = [name for name in new if name not in old]
    removed = [name for name in old if name not in new]
    changed = [name for name in new if name in old and new[name] != old[name]]
    parts = [
        f"{label}: {', '.join(names)}"
        for label, names in (("added", added), ("removed", removed), ("changed", changed))
        if names
    ]
    return ("tools " + "; ".join(parts)) if parts else ""


def _shape(tool: Tool) -> str:
    return json.dumps([tool.description, tool.parameters, repr(tool.flags)], sort_keys=True)


# JSON Schema's words for people, which validate nothing: a server's author may paste a key or
# an address into them as into a description.
_ANNOTATIONS = frozenset({"title", "description", "$comment", "default", "examples"})
# Keywords whose value maps names (a property's, a definition's) to schemas: those names are
# not keywords, so a property named ``description`` is a schema like any other.
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def guarded_schema(schema: Any, redact: Redact) -> Any:
    """``schema`` with ``redact`` over every string of its annotations (descriptions, titles,
    defaults, examples), at every depth; the keywords that validate are left as they are."""
    if isinstance(schema, list):
        return [guarded_schema(item, redact) for item in schema]
    if not isinstance(schema, dict):
        return schema
    guarded: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _ANNOTATIONS:
            guarded[key] = _guarded_strings(value, redact)
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            guarded[key] = {name: guarded_schema(item, redact) for name, item in value.items()}
        else:
            guarded[key] = guarded_schema(value, redact)
    return guarded


def _guarded_strings(value: Any, redact: Redact) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: _guarded_strings(item, redact) for key, item in value.items()}
    if isinstance(value, list):
        return [_guarded_strings(item, redact) for item in value]
    return value


def definition_size(tool: types.Tool) -> int:
    """How many characters of the tool's definition would reach the model."""
    said = (tool.description or "") + (tool.title or "")
    return len(said) + len(json.dumps(tool.input_schema))


def schema_problem(schema: dict[str, Any]) -> str:
    """Why ``schema`` is not valid JSON Schema (its draft's metaschema says); empty if it is."""
    # Imported here: jsonschema is slow to import, and only a configured server needs it.
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    from bot.tools.command import unresolved_refs

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(part) for part in exc.path)
        return f"{where}: {exc.message}" if where else exc.message
    for path, message in unresolved_refs(schema)[:1]:  # a call would fail in the validator
        return f"{'/'.join(str(part) for part in path)}: {message}"
    return ""


def _check_listed_once(listed: Sequence[types.Tool]) -> None:
    """Raise if the server lists a name twice: which of the two a call would reach (and with
    which hints, so gated or not) is not known."""
    seen: set[str] = set()
    for tool in listed:
        if tool.name in seen:
            raise ToolCollision(f"the server lists the tool {tool.name!r} twice")
        seen.add(tool.name)


def _stray_line(exc: Exception) -> str | None:
    """The line of stdout ``exc`` says is no JSON-RPC message; None for another error."""
    if not isinstance(exc, ValidationError):
        return None
    errors = exc.errors()
    if not errors:
        return None
    said = errors[0].get("input")
    return said if isinstance(said, str) else json.dumps(said, default=str)


async def _first(waits: list[Awaitable[object]]) -> None:
    """Wait until the first of ``waits`` is done; the others are cancelled."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def _closed(session: ClientSession, exc: Exception, within: float) -> bool:
    """Whether a call failed as its connection closed. The SDK says so with the code
    ``CONNECTION_CLOSED``, -32000: the first of the codes JSON-RPC leaves to servers, which
    many answer a failed call with. A server that answered that way answers a ping too."""
    if not isinstance(exc, MCPError) or exc.code != types.CONNECTION_CLOSED:
        return False
    return not await _answers(session, within)


async def _answers(session: ClientSession | None, within: float) -> bool:
    """Whether ``session``'s server answers a ping within ``within`` seconds."""
    if session is None:
        return False
    try:
        await asyncio.wait_for(session.send_ping(), within)
    except Exception:  # closed, timed out, refused: not there
        return False
    return True


async def _set_within(event: asyncio.Event, seconds: float) -> bool:
    """Whether ``event`` is set within ``seconds``."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()


def _check_unique(sources: Sequence[McpSource]) -> None:
    names = [source.name for source in sources]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise McpStartError(f"MCP server names must be unique: {', '.join(duplicates)}")


def _check_owners(groups: Sequence[tuple[str, Sequence[Tool]]]) -> None:
    """Raise on the first name two owners claim, naming both."""
    owners: dict[str, str] = {}
    for owner, tools in groups:
        for tool in tools:
            first = owners.setdefault(tool.name, owner)
            if first != owner:
                raise ToolCollision(
                    f"tool name collision: {tool.name!r} is declared by {first} and by {owner}"
                )


def mcp_tools(settings: Settings, builtin: Iterable[Tool], redact: Redact = unchanged) -> McpTools:
    """The configured servers over the built-in tools; a stdio ``cwd`` is config-relative;
    ``redact``: the PII guard, for what a server writes to its stderr."""
    sources = [
        McpSource(server, cwd=settings.resolve(server.cwd) if server.cwd else None, redact=redact)
        for server in settings.mcp_servers
    ]
    return McpTools(builtin, sources)
