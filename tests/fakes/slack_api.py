"""A local fake of the Slack Web API and of Slack's Socket Mode endpoint.

In-process: ``async with FakeSlackApi() as api: ...``; point the real client at it with
``AsyncWebClient(token="xoxb-test", base_url=api.url)`` (or ``SLACK_API_URL=api.url``).

Web API: every method is served at ``/api/<method>``. slack_sdk 3.48 sends three kinds of request
and all are parsed into one ``args`` dict (query string first, then the body on top):

* ``json=`` methods (``chat.postMessage``, ``chat.update``, ``chat.postEphemeral``,
  ``chat.startStream``/``appendStream``/``stopStream``, ``views.*``,
  ``assistant.threads.setStatus``): ``POST`` with a JSON body;
* ``params=`` methods (``auth.test``, ``apps.connections.open``, ``chat.delete``): ``POST`` with
  the arguments in the *query string* and no body (booleans sent as ``"1"``/``"0"``);
* ``http_verb="GET"`` methods (``conversations.replies``, ``chat.getPermalink``, ``users.info``,
  ``usergroups.users.list``): ``GET`` with a query string;
* ``data=`` (forms, e.g. hand-made ``api_call(..., data=...)``): form bodies, where JSON-encoded
  strings in :data:`JSON_FIELDS` (``blocks``, ``chunks``, ``metadata``, ...) are decoded.

The token arrives as ``Authorization: Bearer ...`` (see :attr:`Call.token`), never in ``args``.

Socket Mode: ``apps.connections.open`` hands out ``ws://127.0.0.1:<port>/socket``; a client
that connects there gets a ``hello`` and then whatever the test sends with
:meth:`FakeSlackApi.socket_send` (build envelopes with :func:`events_api_envelope`,
:func:`interactive_envelope`, :func:`slash_command_envelope`); what the client sends back (acks)
lands in ``api.socket_acks``.

Timestamps (``ts``) come from one process-wide clock (:func:`next_ts`) that the payload builders
in ``tests.fakes.slack_client`` share, so every ts is unique and later messages sort later.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

from aiohttp import WSCloseCode, WSMsgType, web

from tests.fakes import slack_limits

HOST = "127.0.0.1"

_T = TypeVar("_T")

#: Argument names whose values slack_sdk (or a form) may send as JSON-encoded strings.
JSON_FIELDS = frozenset(
    {
        "attachments",
        "blocks",
        "chunks",
        "metadata",
        "prompts",
        "unfurls",
        "user_auth_blocks",
        "view",
    }
)

#: Methods answered with a bare ``{"ok": true}`` (after being recorded).
OK_METHODS = frozenset(
    {
        "assistant.threads.setStatus",
        "assistant.threads.setSuggestedPrompts",
        "assistant.threads.setTitle",
        "reactions.add",
        "reactions.remove",
    }
)

_TS_STEP = 100  # microseconds between two generated timestamps
_clock_micros = 1_700_000_000_000_000  # the first ts handed out is "1700000000.000100"


def next_ts() -> str:
    """A new Slack-style ``ts`` ("1700000000.000100"), unique and increasing in this process."""
    global _clock_micros
    _clock_micros += _TS_STEP
    return _format_ts(_clock_micros)


def observe_ts(ts: str) -> None:
    """Move the clock past ``ts`` (a timestamp chosen by a test) so generated ones stay later."""
    global _clock_micros
    micros = _parse_ts(ts)
    if micros is not None and micros > _clock_micros:
        _clock_micros = micros


def _format_ts(micros: int) -> str:
    return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"


def _parse_ts(ts: str) -> int | None:
    seconds, _, fraction = ts.partition(".")
    if not seconds.isdigit() or (fraction and not fraction.isdigit()):
        return None
    return int(seconds) * 1_000_000 + int((fraction or "0").ljust(6, "0")[:6])


def _ts_key(message: Mapping[str, Any]) -> tuple[int, str]:
    ts = str(message.get("ts", ""))
    return (_parse_ts(ts) or 0, ts)


@dataclass
class Call:
    """One request to the fake Web API (or to a fake ``response_url``).

    ``args`` merges the query string (``query``) and the body; ``headers`` has lower-cased
    names. ``status`` and ``response`` are filled in once the call is answered (they are None
    while it is delayed). For ``response_url`` posts ``method`` is ``"response_url"`` and
    ``path`` tells which URL was used.
    """

    method: str
    args: dict[str, Any]
    headers: dict[str, str]
    at: float  # time.monotonic() on arrival
    verb: str = "POST"
    path: str = ""
    query: dict[str, str] = field(default_factory=dict)  # the URL's part of ``args``
    status: int | None = None
    response: dict[str, Any] | None = None

    @property
    def token(self) -> str | None:
        """The bearer token the client sent, if any."""
        auth = self.headers.get("authorization", "")
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None

    @property
    def ok(self) -> bool | None:
        """The ``ok`` field of the answer (None while unanswered)."""
        return None if self.response is None else bool(self.response.get("ok"))


@dataclass
class _Fault:
    error: str
    status: int
    retry_after: int | None
    remaining: int | None  # None: every call
    channel: str | None = None  # None: calls into any channel


@dataclass
class _Limit:
    """Slack's per-method rate limit: ``calls`` answered a ``window``, then 429s."""

    calls: int
    window: float
    answered: list[float]


Handler = Callable[[Call], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]


def events_api_envelope(
    event_callback_body: Mapping[str, Any],
    *,
    retry_attempt: int = 0,
    retry_reason: str = "",
    envelope_id: str | None = None,
) -> dict[str, Any]:
    """A Socket Mode ``events_api`` envelope as Slack sends it (first delivery: attempt 0, "").

    slack_bolt 1.30 (``slack_bolt/adapter/socket_mode/internals.py: build_headers``) turns
    ``retry_attempt``/``retry_reason`` into the request headers ``x-slack-retry-num`` /
    ``x-slack-retry-reason`` *whenever they are not None*. Slack sends ``retry_attempt: 0`` and
    ``retry_reason: ""`` on a first delivery, so a socket-mode request carries
    ``x-slack-retry-num: ["0"]`` and ``x-slack-retry-reason: [""]`` even when it is no retry (in
    HTTP mode the headers are absent on a first delivery). Retry detection must test
    ``int(num) > 0``, not the header's presence. Bolt itself does nothing with the headers.
    """
    return {
        "envelope_id": envelope_id or str(uuid.uuid4()),
        "type": "events_api",
        "accepts_response_payload": False,
        "retry_attempt": retry_attempt,
        "retry_reason": retry_reason,
        "payload": dict(event_callback_body),
    }


def interactive_envelope(
    payload: Mapping[str, Any], *, envelope_id: str | None = None
) -> dict[str, Any]:
    """A Socket Mode ``interactive`` envelope (block_actions, view_submission, shortcut, ...)."""
    kind = payload.get("type")
    return {
        "envelope_id": envelope_id or str(uuid.uuid4()),
        "type": "interactive",
        "accepts_response_payload": kind in ("view_submission", "block_suggestion"),
        "payload": dict(payload),
    }


def slash_command_envelope(
    form: Mapping[str, str], *, envelope_id: str | None = None
) -> dict[str, Any]:
    """A Socket Mode ``slash_commands`` envelope; ``form`` is the command's fields as a dict."""
    return {
        "envelope_id": envelope_id or str(uuid.uuid4()),
        "type": "slash_commands",
        "accepts_response_payload": True,
        "payload": dict(form),
    }


def hello_message(app_id: str = "A0001") -> dict[str, Any]:
    """The first message Slack sends on a new Socket Mode connection."""
    return {
        "type": "hello",
        "num_connections": 1,
        "debug_info": {
            "host": "applink-fake",
            "build_number": 1,
            "approximate_connection_time": 18060,
        },
        "connection_info": {"app_id": app_id},
    }


def _truthy(value: Any) -> bool:
    return value is True or value == 1 or str(value).lower() in ("1", "true")


def _decode_json_fields(args: dict[str, Any]) -> dict[str, Any]:
    for key in JSON_FIELDS & args.keys():
        value = args[key]
        if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
            with contextlib.suppress(ValueError):
                args[key] = json.loads(value)
    return args


async def _read_args(request: web.Request) -> dict[str, Any]:
    args: dict[str, Any] = dict(request.query)
    if request.method == "POST" and request.can_read_body:
        if request.content_type == "application/json":
            text = await request.text()
            body = json.loads(text) if text.strip() else {}
            if isinstance(body, dict):
                args.update(body)
            else:
                args["_body"] = body
        else:
            form = await request.post()
            for key, value in form.items():
                if isinstance(value, web.FileField):  # an uploaded file
                    args[key] = value.file.read()
                else:
                    args[key] = value
    return _decode_json_fields(args)


def _json(
    payload: Mapping[str, Any], status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(payload),
        content_type="application/json",
        headers=dict(headers or {}),
    )


def _error(error: str) -> dict[str, Any]:
    return {"ok": False, "error": error}


def _markdown_of(args: Mapping[str, Any]) -> str:
    text = str(args.get("markdown_text") or "")
    for chunk in args.get("chunks") or []:
        if isinstance(chunk, Mapping) and chunk.get("type") == "markdown_text":
            text += str(chunk.get("text") or "")
    return text


class FakeSlackApi:
    """The fake Slack Web API + Socket Mode server (see the module docstring).

    State a test may read or set directly:

    * ``calls``: every :class:`Call`, in arrival order (failed and refused ones too);
    * ``messages``: channel -> list of message dicts (bot posts, streams, seeded user messages);
      each has ``ts``, ``channel``, ``text``, ``user`` and, when set, ``blocks``, ``thread_ts``,
      ``metadata``, ``bot_id``; stream messages also ``chunks`` and ``streaming`` (True until
      ``chat.stopStream``);
    * ``ephemerals``: the ``chat.postEphemeral`` messages (with ``message_ts``);
    * ``users``: user id -> fields merged into the ``users.info`` answer (``team_id``, ``name``,
      ``is_bot``, ``profile``...); unknown users are ordinary members of the home team;
    * ``usergroups``: usergroup id -> member ids, for ``usergroups.users.list``;
    * ``channel_members``: channel id -> member ids, for ``conversations.members``, paged by
      ``limit`` and ``cursor`` as Slack pages them (a channel not listed is
      ``channel_not_found``);
    * ``views``: view id -> the last view opened/updated/published under that id;
    * ``socket_acks``: the JSON messages with an ``envelope_id`` a Socket Mode client sent;
      ``socket_received`` the other ones.
    """

    def __init__(
        self,
        *,
        team: str = "T0001",
        bot_user: str = "UBOT",
        bot_id: str = "B0001",
        app_id: str = "A0001",
        port: int = 0,
    ) -> None:
        self.team = team
        # An Enterprise Grid org the workspace is in ("": none), as auth.test says it.
        self.enterprise = ""
        self.bot_user = bot_user
        self.bot_id = bot_id
        self.app_id = app_id
        self.calls: list[Call] = []
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.ephemerals: list[dict[str, Any]] = []
        self.users: dict[str, dict[str, Any]] = {}
        self.usergroups: dict[str, list[str]] = {}
        self.channel_members: dict[str, list[str]] = {}
        self.views: dict[str, dict[str, Any]] = {}
        self.socket_acks: list[dict[str, Any]] = []
        self.socket_received: list[Any] = []
        self.socket_sent: list[dict[str, Any]] = []
        self.socket_connections = 0  # connections ever accepted
        self._sockets: list[web.WebSocketResponse] = []
        self._faults: dict[str, list[_Fault]] = {}
        self._limits: dict[str, _Limit] = {}
        self._delays: dict[str, float] = {}
        self._handlers: dict[str, Handler] = {
            method: getattr(self, name) for method, name in self._default_methods.items()
        }
        self._home_views: dict[str, str] = {}  # user id -> App Home view id
        self._response_urls = itertools.count(1)
        self._view_ids = itertools.count(1)
        self._cond = asyncio.Condition()
        self._stopping = asyncio.Event()
        self._port = port
        self._runner: web.AppRunner | None = None

    # ----------------------------------------------------------------- lifecycle

    @property
    def port(self) -> int:
        """The listening port."""
        return self._port

    @property
    def base(self) -> str:
        """``http://127.0.0.1:<port>`` (no trailing slash)."""
        return f"http://{HOST}:{self._port}"

    @property
    def url(self) -> str:
        """The Web API base URL, ending in ``/api/`` (``AsyncWebClient(base_url=...)``)."""
        return f"{self.base}/api/"

    @property
    def socket_url(self) -> str:
        """The Socket Mode URL ``apps.connections.open`` hands out."""
        return f"ws://{HOST}:{self._port}/socket"

    async def start(self) -> None:
        """Listen on 127.0.0.1 (an ephemeral port unless one was given)."""
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_get("/socket", self._handle_socket)
        app.router.add_post("/response_url/{n}", self._handle_response_url)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, self._port))
        self._port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        """Close Socket Mode connections (close the client first, or it reconnects) and stop."""
        self._stopping.set()
        for ws in list(self._sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server stopping")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeSlackApi:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # ----------------------------------------------------------------- test controls

    def fail(
        self,
        method: str,
        *,
        error: str = "ratelimited",
        status: int = 429,
        retry_after: int = 1,
        times: int | None = 1,
        channel: str | None = None,
    ) -> None:
        """Answer the next ``times`` calls (None: all) to ``method`` (into ``channel`` only,
        if given) with HTTP ``status`` and ``{"ok": false, "error": error}``, plus
        ``Retry-After: retry_after`` when status is 429.

        Faults registered for a method are used in order; the call is still recorded.
        """
        self._faults.setdefault(method, []).append(
            _Fault(error, status, retry_after if status == 429 else None, times, channel)
        )

    def limit(self, method: str, calls: int, window: float = 60.0) -> None:
        """Rate-limit ``method`` as Slack's tiers do: past ``calls`` answered within the last
        ``window`` seconds, ``ratelimited`` (HTTP 429, ``Retry-After`` the wait left)."""
        self._limits[method] = _Limit(calls, window, [])

    def refuse(
        self, method: str, error: str = "not_allowed_token_type", times: int | None = None
    ) -> None:
        """Answer HTTP 200 ``{"ok": false, "error": error}`` to ``method`` (``times`` None:
        always), e.g. a workspace that refuses streaming."""
        self._faults.setdefault(method, []).append(_Fault(error, 200, None, times))

    def clear_faults(self, method: str | None = None) -> None:
        """Forget the faults of ``method`` (None: of every method)."""
        if method is None:
            self._faults.clear()
        else:
            self._faults.pop(method, None)

    def delay(self, method: str, seconds: float) -> None:
        """Answer every later call to ``method`` after ``seconds`` (0 removes the delay).

        The call is recorded on arrival, so ``wait_for`` sees it while it is still pending.
        """
        if seconds > 0:
            self._delays[method] = seconds
        else:
            self._delays.pop(method, None)

    def set_handler(self, method: str, handler: Handler | None) -> None:
        """Answer ``method`` with ``handler(call)`` (a dict, or an awaitable of one); None
        restores the default (or ``unknown_method``)."""
        if handler is not None:
            self._handlers[method] = handler
        elif method in self._default_methods:
            self._handlers[method] = getattr(self, self._default_methods[method])
        else:
            self._handlers.pop(method, None)

    def new_response_url(self) -> str:
        """A fresh ``response_url`` served by this fake; posts to it are recorded as
        ``Call(method="response_url", path="/response_url/<n>")``."""
        return f"{self.base}/response_url/{next(self._response_urls)}"

    def add_message(
        self,
        channel: str,
        *,
        user: str,
        text: str,
        ts: str | None = None,
        thread_ts: str | None = None,
        team: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Seed a message as if a person had posted it (so ``conversations.replies`` returns it).

        A message with the same channel and ts is updated instead of duplicated.
        """
        if ts is not None:
            observe_ts(ts)
        message: dict[str, Any] = {
            "type": "message",
            "channel": channel,
            "ts": ts or next_ts(),
            "user": user,
            "team": team or self.team,
            "text": text,
            **fields,
        }
        if thread_ts is not None:
            message["thread_ts"] = thread_ts
        existing = self.message(channel, message["ts"])
        if existing is not None:
            existing.update(message)
            return existing
        self.messages.setdefault(channel, []).append(message)
        return message

    # ----------------------------------------------------------------- queries

    def calls_to(self, method: str) -> list[Call]:
        """The recorded calls to ``method``, in order."""
        return [call for call in self.calls if call.method == method]

    def count(self, method: str) -> int:
        """How many calls to ``method`` arrived."""
        return len(self.calls_to(method))

    def message(self, channel: str, ts: str) -> dict[str, Any] | None:
        """The stored message ``ts`` in ``channel``, or None."""
        for message in self.messages.get(channel, []):
            if message["ts"] == ts:
                return message
        return None

    def thread(self, channel: str, thread_ts: str) -> list[dict[str, Any]]:
        """The parent (if stored) and the replies of a thread, oldest first."""
        parent = self.message(channel, thread_ts)
        replies = sorted(
            (
                m
                for m in self.messages.get(channel, [])
                if m.get("thread_ts") == thread_ts and m["ts"] != thread_ts
            ),
            key=_ts_key,
        )
        return ([parent] if parent is not None else []) + replies

    async def wait_for(
        self,
        what: str | Callable[[Call], bool],
        timeout: float = 5.0,
        count: int = 1,
    ) -> list[Call]:
        """Wait until ``count`` calls match ``what`` (a method name or a predicate); return all
        matching calls. Raises AssertionError listing the recorded methods on timeout."""
        matches: Callable[[Call], bool]
        if isinstance(what, str):
            method = what

            def matches_method(call: Call) -> bool:
                return call.method == method

            matches, description = matches_method, repr(what)
        else:
            matches, description = what, getattr(what, "__name__", repr(what))

        def found() -> list[Call] | None:
            hits = [call for call in self.calls if matches(call)]
            return hits if len(hits) >= count else None

        return await self._wait_until(
            found,
            timeout,
            lambda: (
                f"{count} call(s) matching {description}; recorded: "
                f"{[call.method for call in self.calls]}"
            ),
        )

    async def wait_for_answered(
        self, method: str, timeout: float = 5.0, count: int = 1
    ) -> list[Call]:
        """Like :meth:`wait_for` but only counts calls that have been answered."""

        def answered(call: Call) -> bool:
            return call.method == method and call.status is not None

        answered.__name__ = f"answered {method!r}"
        return await self.wait_for(answered, timeout, count)

    # ----------------------------------------------------------------- socket mode

    async def wait_for_socket(self, timeout: float = 5.0, connections: int = 1) -> None:
        """Wait until ``connections`` Socket Mode connections were ever accepted and one is open."""

        def ready() -> bool | None:
            return (self.socket_connections >= connections and bool(self._sockets)) or None

        await self._wait_until(
            ready,
            timeout,
            lambda: (
                f"socket connection #{connections} (accepted so far: "
                f"{self.socket_connections}, open: {len(self._sockets)}); recorded: "
                f"{[call.method for call in self.calls]}"
            ),
        )

    @property
    def open_sockets(self) -> int:
        """How many Socket Mode connections are open now."""
        return len(self._sockets)

    async def socket_send(self, envelope: Mapping[str, Any], timeout: float = 5.0) -> str:
        """Send ``envelope`` on the newest open connection (waiting for one); return its
        ``envelope_id`` (or "")."""
        await self.wait_for_socket(timeout)
        self.socket_sent.append(dict(envelope))
        await self._sockets[-1].send_str(json.dumps(envelope))
        return str(envelope.get("envelope_id", ""))

    async def socket_disconnect(self, reason: str = "refresh_requested") -> None:
        """Send Slack's ``disconnect`` message to every open connection (the client reconnects)."""
        message = {"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-fake"}}
        for ws in list(self._sockets):
            await ws.send_str(json.dumps(message))

    async def close_sockets(self) -> None:
        """Close every open connection from the server side."""
        for ws in list(self._sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY)

    async def wait_for_ack(self, envelope_id: str, timeout: float = 5.0) -> dict[str, Any]:
        """Wait for the client's answer to ``envelope_id`` and return it (``{"envelope_id": ..,
        "payload"?: ..}``)."""

        def ack() -> dict[str, Any] | None:
            for message in self.socket_acks:
                if message.get("envelope_id") == envelope_id:
                    return message
            return None

        return await self._wait_until(
            ack,
            timeout,
            lambda: (
                f"an ack of envelope {envelope_id!r}; acks so far: "
                f"{[m.get('envelope_id') for m in self.socket_acks]}"
            ),
        )

    # ----------------------------------------------------------------- internals

    async def _wait_until(
        self, probe: Callable[[], _T | None], timeout: float, describe: Callable[[], str]
    ) -> _T:
        result: _T | None = None

        def ready() -> bool:
            nonlocal result
            result = probe()
            return result is not None

        try:
            async with asyncio.timeout(timeout), self._cond:
                await self._cond.wait_for(ready)
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout}s waiting for {describe()}") from None
        assert result is not None
        return result

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    async def _record(self, call: Call) -> None:
        self.calls.append(call)
        await self._notify()

    def _take_fault(self, call: Call) -> _Fault | None:
        faults = self._faults.get(call.method) or []
        for fault in faults:
            if fault.channel is not None and fault.channel != call.args.get("channel"):
                continue
            if fault.remaining is None:
                return fault
            if fault.remaining > 0:
                fault.remaining -= 1
                if fault.remaining == 0:
                    faults.remove(fault)
                return fault
        return None

    def _limited(self, call: Call) -> _Fault | None:
        limit = self._limits.get(call.method)
        if limit is None:
            return None
        limit.answered = [at for at in limit.answered if call.at - at < limit.window]
        if len(limit.answered) < limit.calls:
            limit.answered.append(call.at)
            return None
        wait = limit.window - (call.at - limit.answered[0])
        return _Fault("ratelimited", 429, max(1, int(wait + 0.999)), 1)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        call = Call(
            method=method,
            args=await _read_args(request),
            headers={k.lower(): v for k, v in request.headers.items()},
            at=time.monotonic(),
            verb=request.method,
            path=request.path,
            query=dict(request.query),
        )
        await self._record(call)
        if method in self._delays:
            await self._pause(self._delays[method])
        status, headers = 200, {}
        fault = self._take_fault(call) or self._limited(call)
        if fault is not None:
            status, body = fault.status, _error(fault.error)
            if fault.retry_after is not None:
                headers["Retry-After"] = str(fault.retry_after)
        elif method in self._handlers:
            answer = self._handlers[method](call)
            if inspect.isawaitable(answer):
                answer = await answer
            body = dict(answer)
        else:
            body = _error("unknown_method")
        call.status, call.response = status, body
        await self._notify()
        return _json(body, status, headers)

    async def _handle_response_url(self, request: web.Request) -> web.StreamResponse:
        text = await request.text()
        try:
            args = json.loads(text) if text.strip() else {}
        except ValueError:
            args = {"_raw": text}
        call = Call(
            method="response_url",
            args=args if isinstance(args, dict) else {"_body": args},
            headers={k.lower(): v for k, v in request.headers.items()},
            at=time.monotonic(),
            verb=request.method,
            path=request.path,
            status=200,
            response={"ok": True},
        )
        await self._record(call)
        return web.Response(text="ok", content_type="text/plain")

    async def _handle_socket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(timeout=1.0)
        await ws.prepare(request)
        await ws.send_str(json.dumps(hello_message(self.app_id)))
        self._sockets.append(ws)
        self.socket_connections += 1
        await self._notify()
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    data = json.loads(msg.data)
                except ValueError:
                    data = msg.data
                if isinstance(data, dict) and "envelope_id" in data:
                    self.socket_acks.append(data)
                else:
                    self.socket_received.append(data)
                await self._notify()
        finally:
            self._sockets.remove(ws)
            await self._notify()
        return ws

    # ----------------------------------------------------------------- methods

    def _ok(self, call: Call) -> dict[str, Any]:
        return {"ok": True}

    def _auth_test(self, call: Call) -> dict[str, Any]:
        return {
            "ok": True,
            "url": "https://test.slack.com/",
            "team": "Test",
            "user": "kestrel",
            "team_id": self.team,
            "user_id": self.bot_user,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
            **({"enterprise_id": self.enterprise} if self.enterprise else {}),
        }

    def _connections_open(self, call: Call) -> dict[str, Any]:
        return {"ok": True, "url": self.socket_url}

    def _bot_message(self, channel: str, args: Mapping[str, Any]) -> dict[str, Any]:
        thread_ts = args.get("thread_ts")
        if thread_ts:
            observe_ts(str(thread_ts))  # a reply is always newer than its parent
        message: dict[str, Any] = {
            "type": "message",
            "channel": channel,
            "ts": next_ts(),
            "user": self.bot_user,
            "bot_id": self.bot_id,
            "app_id": self.app_id,
            "team": self.team,
            "text": str(args.get("text") or ""),
        }
        for key in ("blocks", "attachments", "metadata", "thread_ts"):
            if args.get(key) is not None:
                message[key] = args[key]
        return message

    @staticmethod
    def _public(message: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in message.items() if k != "channel"}

    def _post_message(self, call: Call) -> dict[str, Any]:
        args = call.args
        channel = args.get("channel")
        if not channel:
            return _error("channel_not_found")
        if not (args.get("text") or args.get("blocks") or args.get("attachments")):
            return _error("no_text")
        refused = slack_limits.message_problem(args)
        if refused:
            return _error(refused)
        message = self._bot_message(str(channel), args)
        self.messages.setdefault(str(channel), []).append(message)
        return {
            "ok": True,
            "channel": channel,
            "ts": message["ts"],
            "message": self._public(message),
        }

    def _update(self, call: Call) -> dict[str, Any]:
        args = call.args
        channel, ts = str(args.get("channel") or ""), str(args.get("ts") or "")
        message = self.message(channel, ts)
        if message is None:
            return _error("message_not_found")
        refused = slack_limits.message_problem(args)
        if refused:
            return _error(refused)
        for key in ("text", "blocks", "attachments", "metadata"):
            if key in args:
                message[key] = args[key]
        message["edited"] = {"user": self.bot_user, "ts": next_ts()}
        return {
            "ok": True,
            "channel": channel,
            "ts": ts,
            "text": message.get("text", ""),
            "message": self._public(message),
        }

    def _post_ephemeral(self, call: Call) -> dict[str, Any]:
        args = call.args
        if not args.get("channel"):
            return _error("channel_not_found")
        if not args.get("user"):
            return _error("user_not_in_channel")
        message_ts = next_ts()
        self.ephemerals.append({**args, "message_ts": message_ts})
        return {"ok": True, "message_ts": message_ts}

    def _delete(self, call: Call) -> dict[str, Any]:
        channel, ts = str(call.args.get("channel") or ""), str(call.args.get("ts") or "")
        message = self.message(channel, ts)
        if message is None:
            return _error("message_not_found")
        self.messages[channel].remove(message)
        return {"ok": True, "channel": channel, "ts": ts}

    def _permalink(self, call: Call) -> dict[str, Any]:
        channel = str(call.args.get("channel") or "")
        ts = str(call.args.get("message_ts") or "")
        if not channel or not ts:
            return _error("invalid_arguments")
        return {
            "ok": True,
            "channel": channel,
            "permalink": f"https://test.slack.com/archives/{channel}/p{ts.replace('.', '')}",
        }

    def _replies(self, call: Call) -> dict[str, Any]:
        channel, ts = str(call.args.get("channel") or ""), str(call.args.get("ts") or "")
        thread = self.thread(channel, ts)
        if not thread:
            return _error("thread_not_found")
        with_metadata = _truthy(call.args.get("include_all_metadata"))
        out = []
        for message in thread:
            public = self._public(message)
            if not with_metadata:
                public.pop("metadata", None)
            if public["ts"] == ts and len(thread) > 1:
                public.update(thread_ts=ts, reply_count=len(thread) - 1)
            out.append(public)
        return {
            "ok": True,
            "messages": out,
            "has_more": False,
            "response_metadata": {"next_cursor": ""},
        }

    def _start_stream(self, call: Call) -> dict[str, Any]:
        args = call.args
        channel = str(args.get("channel") or "")
        if not channel:
            return _error("channel_not_found")
        if not args.get("thread_ts"):
            return _error("invalid_arguments")
        message = self._bot_message(channel, {"thread_ts": args["thread_ts"]})
        message["text"] = _markdown_of(args)
        message["chunks"] = list(args.get("chunks") or [])
        message["streaming"] = True
        for key in ("recipient_team_id", "recipient_user_id"):
            if args.get(key):
                message[key] = args[key]
        self.messages.setdefault(channel, []).append(message)
        return {"ok": True, "channel": channel, "ts": message["ts"]}

    def _stream_message(self, call: Call) -> dict[str, Any] | str:
        channel, ts = str(call.args.get("channel") or ""), str(call.args.get("ts") or "")
        message = self.message(channel, ts)
        if message is None or "streaming" not in message:
            return "message_not_found"
        if not message["streaming"]:
            return "message_not_in_streaming_state"
        return message

    def _append_stream(self, call: Call) -> dict[str, Any]:
        message = self._stream_message(call)
        if isinstance(message, str):
            return _error(message)
        message["text"] += _markdown_of(call.args)
        message["chunks"].extend(call.args.get("chunks") or [])
        return {"ok": True, "channel": message["channel"], "ts": message["ts"]}

    def _stop_stream(self, call: Call) -> dict[str, Any]:
        message = self._stream_message(call)
        if isinstance(message, str):
            return _error(message)
        refused = slack_limits.message_problem({"blocks": call.args.get("blocks")})
        if refused:
            return _error(refused)
        message["text"] += _markdown_of(call.args)
        message["chunks"].extend(call.args.get("chunks") or [])
        for key in ("blocks", "metadata"):
            if call.args.get(key) is not None:
                message[key] = call.args[key]
        message["streaming"] = False
        return {
            "ok": True,
            "channel": message["channel"],
            "ts": message["ts"],
            "message": self._public(message),
        }

    def _users_info(self, call: Call) -> dict[str, Any]:
        user_id = str(call.args.get("user") or "")
        if not user_id:
            return _error("user_not_found")
        configured = dict(self.users.get(user_id, {}))
        name = str(configured.get("name", user_id.lower()))
        profile = {
            "display_name": name,
            "real_name": name.title(),
            "email": f"{name}@example.com",
            "team": configured.get("team_id", self.team),
            **configured.pop("profile", {}),
        }
        user: dict[str, Any] = {
            "id": user_id,
            "team_id": self.team,
            "name": name,
            "real_name": profile["real_name"],
            "deleted": False,
            "is_bot": user_id == self.bot_user,
            "is_admin": False,
            "tz": "UTC",
            **configured,
            "profile": profile,
        }
        if user_id == self.bot_user:
            profile.setdefault("bot_id", self.bot_id)
        return {"ok": True, "user": user}

    def _usergroup_users(self, call: Call) -> dict[str, Any]:
        group = str(call.args.get("usergroup") or "")
        if group not in self.usergroups:
            return _error("no_such_subteam")
        return {"ok": True, "users": list(self.usergroups[group])}

    def _channel_members(self, call: Call) -> dict[str, Any]:
        # Paged as Slack pages it: ``limit`` members (100 unless asked; 1000 at most) from
        # ``cursor``, and the cursor of the next page ("" after the last).
        channel = str(call.args.get("channel") or "")
        if channel not in self.channel_members:
            return _error("channel_not_found")
        members = list(self.channel_members[channel])
        start = int(call.args.get("cursor") or 0)
        end = start + min(int(call.args.get("limit") or 100), 1000)
        return {
            "ok": True,
            "members": members[start:end],
            "response_metadata": {"next_cursor": str(end) if end < len(members) else ""},
        }

    def _store_view(self, view_id: str, view: Any) -> dict[str, Any]:
        refused = slack_limits.view_problem(view)
        if refused:
            return _error(refused)
        stored: dict[str, Any] = {
            "id": view_id,
            "team_id": self.team,
            "app_id": self.app_id,
            "bot_id": self.bot_id,
            "state": {"values": {}},
            "hash": f"{int(time.time())}.{view_id}",
            **(view if isinstance(view, Mapping) else {}),
        }
        stored["id"] = view_id
        self.views[view_id] = stored
        return {"ok": True, "view": stored}

    def _new_view_id(self) -> str:
        return f"V{next(self._view_ids):04d}"

    def _views_open(self, call: Call) -> dict[str, Any]:
        if not call.args.get("trigger_id"):
            return _error("invalid_trigger_id")
        if not isinstance(call.args.get("view"), Mapping):
            return _error("invalid_arguments")
        return self._store_view(self._new_view_id(), call.args["view"])

    def _views_update(self, call: Call) -> dict[str, Any]:
        view_id = call.args.get("view_id")
        if not view_id:
            external = call.args.get("external_id")
            view_id = next(
                (
                    v["id"]
                    for v in self.views.values()
                    if external and v.get("external_id") == external
                ),
                None,
            )
        if not view_id:
            return _error("not_found")
        return self._store_view(str(view_id), call.args.get("view"))

    def _views_publish(self, call: Call) -> dict[str, Any]:
        user_id = str(call.args.get("user_id") or "")
        if not user_id:
            return _error("invalid_arguments")
        view_id = self._home_views.get(user_id) or self._new_view_id()
        self._home_views[user_id] = view_id
        return self._store_view(view_id, call.args.get("view"))

    _default_methods: dict[str, str] = {
        "auth.test": "_auth_test",
        "apps.connections.open": "_connections_open",
        "chat.postMessage": "_post_message",
        "chat.update": "_update",
        "chat.postEphemeral": "_post_ephemeral",
        "chat.delete": "_delete",
        "chat.getPermalink": "_permalink",
        "chat.startStream": "_start_stream",
        "chat.appendStream": "_append_stream",
        "chat.stopStream": "_stop_stream",
        "conversations.replies": "_replies",
        "users.info": "_users_info",
        "usergroups.users.list": "_usergroup_users",
        "conversations.members": "_channel_members",
        "views.open": "_views_open",
        "views.update": "_views_update",
        "views.publish": "_views_publish",
        **dict.fromkeys(OK_METHODS, "_ok"),
    }
