"""A local stand-in for Discord: the REST API (v10) and the gateway, for the *real* discord.py.

``async with FakeDiscord() as fake:`` listens on 127.0.0.1 and serves

* REST at ``fake.api_url`` (``http://127.0.0.1:<port>/api/v10``; any ``/api/v<n>`` works);
* the gateway at ``fake.gateway_url`` (``ws://127.0.0.1:<port>/gateway``), which
  ``GET /gateway/bot`` (and ``GET /gateway``) hand out and READY gives as
  ``resume_gateway_url``.

Pointing discord.py 2.7 at it takes two patches, both done by :func:`patched_route_base`:
``discord.http.Route.BASE`` (every REST call, *including* the interaction callback and
webhook follow-up routes, which build the same ``Route``) and
``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY``: a plain ``discord.Client`` never calls
``GET /gateway/bot``; it connects straight to ``DEFAULT_GATEWAY`` (only ``AutoShardedClient``
asks REST for the URL). An adapter honouring ``DISCORD_API_URL`` must therefore also point
``DEFAULT_GATEWAY`` at the URL ``GET /gateway/bot`` returns (or use ``AutoShardedClient``).

What discord.py 2.7.1 needs from the wire (verified against its source):

* JSON responses must carry ``Content-Type: application/json`` *exactly*
  (``http.json_or_text`` compares the whole header; aiohttp's ``text=`` responses add
  ``; charset=utf-8`` and the body then stays a string, which breaks login). This fake sends
  bytes with the bare type.
* A 429 is only treated as a rate limit if the response has a ``Via`` header (Discord's
  Cloudflare/Google front adds ``Via: 1.1 google``); without it discord.py assumes a Cloudflare
  ban and raises ``HTTPException`` at once. This fake sends ``Via`` on every answer. discord.py
  then sleeps ``retry_after`` from the *body* (not the header) and retries, up to 5 tries; a
  ``"global": true`` body also blocks every other request meanwhile. 500/502/504 are retried
  after 1 s, 3 s, 5 s...
* ``POST /interactions/{id}/{token}/callback`` is sent with ``?with_response=1`` and discord.py
  parses the answer (``InteractionCallbackResponse`` reads ``data['interaction']['id']``): a
  bare 204 there crashes ``defer``/``send_message``/``send_modal``. This fake answers 200 with
  ``{"interaction": {...}, "resource": {...}}`` (204 only without ``with_response``).
* The gateway URL gets ``?v=10&encoding=json&compress=zlib-stream``; discord.py decompresses
  *binary* frames (zlib stream, each message ending in ``00 00 ff ff``) and parses *text*
  frames as plain JSON, so both work. This fake honours ``compress=zlib-stream`` with binary
  frames (``FakeDiscord(gateway_compress=False)`` sends text frames instead).
* After READY discord.py waits ``guild_ready_timeout`` (default 2 s) after the last
  GUILD_CREATE before firing ``on_ready``; pass ``discord.Client(..., guild_ready_timeout=0.1)``
  in tests to shorten ``wait_until_ready``.
* discord.py sends one heartbeat right after HELLO, then one per ``heartbeat_interval`` (from
  a thread); ``client.close()`` asks for close code 1000 but its own reader task, woken by the
  close, sends ``close(4000)`` first, so the gateway sees 4000 (a resumable close).
* ``interaction.response.defer(ephemeral=True)`` on a *component* sends ``{"type": 6}``
  (DEFERRED_UPDATE_MESSAGE) and drops the flag; only ``defer(ephemeral=True, thinking=True)``
  sends ``{"type": 5, "data": {"flags": 64}}``. Follow-ups are ``POST
  /webhooks/{app}/{token}?wait=1&with_components=..`` without ``Authorization``.

REST calls are recorded in ``fake.calls`` as :class:`Call` (method, path relative to the API
base, parsed JSON body, lower-cased headers, arrival time, query, files, route name, status
and answer). Objects are kept in plain dicts a test may read or seed: ``channels``,
``messages`` (per channel, oldest first), ``members``, ``users``, ``commands``,
``interactions``, ``ephemeral``, ``modals``. See :class:`FakeDiscord`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import inspect
import json
import math
import re
import socket
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import Any, TypeVar

from aiohttp import BodyPartReader, WSCloseCode, WSMsgType, web

from tests.fakes import discord_limits
from tests.fakes import discord_payloads as p

HOST = "127.0.0.1"

_T = TypeVar("_T")

#: Gateway intents (bits of IDENTIFY's ``intents``).
INTENT_GUILDS = 1 << 0
INTENT_GUILD_MEMBERS = 1 << 1
INTENT_GUILD_PRESENCES = 1 << 8
INTENT_GUILD_MESSAGES = 1 << 9
INTENT_DIRECT_MESSAGES = 1 << 12
INTENT_MESSAGE_CONTENT = 1 << 15
PRIVILEGED_INTENTS = INTENT_GUILD_MEMBERS | INTENT_GUILD_PRESENCES | INTENT_MESSAGE_CONTENT

#: Gateway opcodes.
OP_DISPATCH, OP_HEARTBEAT, OP_IDENTIFY, OP_PRESENCE_UPDATE = 0, 1, 2, 3
OP_RESUME, OP_RECONNECT, OP_REQUEST_MEMBERS, OP_INVALID_SESSION = 6, 7, 8, 9
OP_HELLO, OP_HEARTBEAT_ACK = 10, 11

#: Interaction callback types.
CB_PONG, CB_MESSAGE, CB_DEFERRED_MESSAGE, CB_DEFERRED_UPDATE = 1, 4, 5, 6
CB_UPDATE_MESSAGE, CB_AUTOCOMPLETE, CB_MODAL = 7, 8, 9

_RATE_LIMIT_MESSAGE = "You are being rate limited."
_MAX_CONTENT = 2000

Reply = tuple[int, Any]  # (status, JSON body or None for an empty answer)
Handler = Callable[["Call"], Reply | Awaitable[Reply]]


@dataclass
class Call:
    """One REST request to the fake.

    ``path`` is relative to the API base (``/channels/200/messages``, as discord.py's
    ``Route.path`` with the parameters filled in); ``json`` is the parsed JSON body (for a
    multipart upload: its ``payload_json``; None without a body); ``headers`` have lower-cased
    names; ``files`` lists uploaded files (``field``, ``filename``, ``content_type``,
    ``size``, ``data``); ``route`` names the handler that answered (``"create_message"``,
    ``"interaction_callback"``, ... or ``"unknown"``). ``status`` and ``response`` (the JSON
    answer, None for 204) are filled in once answered.
    """

    method: str
    path: str
    json: Any
    headers: dict[str, str]
    at: float = field(default_factory=time.monotonic)
    query: dict[str, str] = field(default_factory=dict)
    files: list[dict[str, Any]] = field(default_factory=list)
    route: str = ""
    status: int | None = None
    response: Any = None

    @property
    def token(self) -> str | None:
        """The bot token of ``Authorization: Bot <token>`` (None on webhook/interaction routes,
        which discord.py calls without it)."""
        auth = self.headers.get("authorization", "")
        return auth[len("Bot ") :] if auth.startswith("Bot ") else None

    def __str__(self) -> str:
        return f"{self.method} {self.path} -> {self.status}"


@dataclass
class _Fault:
    method: str
    pattern: re.Pattern[str]
    status: int
    retry_after: float
    remaining: int | None  # None: every call
    global_: bool
    code: int
    message: str | None


@dataclass
class _Session:
    id: str
    intents: int
    seq: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Connection:
    ws: web.WebSocketResponse
    compressor: Any  # zlib compress object, or None for text frames
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    session: _Session | None = None
    ready: bool = False


def _truthy(value: str | None) -> bool:
    return str(value).lower() in ("1", "true")


def _error(status: int, code: int, message: str, errors: Any = None) -> Reply:
    body: dict[str, Any] = {"message": message, "code": code}
    if errors is not None:
        body["errors"] = errors
    return status, body


def _form_error(path: str, code: str, message: str) -> Reply:
    errors: dict[str, Any] = {}
    node = errors
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = {"_errors": [{"code": code, "message": message}]}
    return _error(400, 50035, "Invalid Form Body", errors)


def _unknown(what: str, code: int) -> Reply:
    return _error(404, code, f"Unknown {what}")


_ROUTES: list[tuple[str, str, str]] = [
    ("GET", r"/users/@me", "me"),
    ("GET", r"/users/(?P<user>\d+)", "get_user"),
    ("POST", r"/users/@me/channels", "create_dm"),
    ("GET", r"/oauth2/applications/@me", "application"),
    ("GET", r"/applications/@me", "application"),
    ("GET", r"/gateway", "gateway"),
    ("GET", r"/gateway/bot", "gateway_bot"),
    ("POST", r"/channels/(?P<channel>\d+)/messages", "create_message"),
    ("GET", r"/channels/(?P<channel>\d+)/messages", "list_messages"),
    ("GET", r"/channels/(?P<channel>\d+)/messages/(?P<message>\d+)", "get_message"),
    ("PATCH", r"/channels/(?P<channel>\d+)/messages/(?P<message>\d+)", "edit_message"),
    ("DELETE", r"/channels/(?P<channel>\d+)/messages/(?P<message>\d+)", "delete_message"),
    ("POST", r"/channels/(?P<channel>\d+)/messages/(?P<message>\d+)/threads", "start_thread"),
    ("POST", r"/channels/(?P<channel>\d+)/threads", "start_thread_without_message"),
    ("GET", r"/channels/(?P<channel>\d+)", "get_channel"),
    ("PATCH", r"/channels/(?P<channel>\d+)", "edit_channel"),
    ("POST", r"/channels/(?P<channel>\d+)/typing", "typing"),
    ("PUT", r"/channels/(?P<channel>\d+)/messages/(?P<message>\d+)/reactions/[^/]+/@me", "react"),
    (
        "DELETE",
        r"/channels/(?P<channel>\d+)/messages/(?P<message>\d+)/reactions/[^/]+/@me",
        "unreact",
    ),
    ("PUT", r"/channels/(?P<channel>\d+)/thread-members/@me", "join_thread"),
    ("GET", r"/channels/(?P<channel>\d+)/thread-members/(?P<user>\d+)", "get_thread_member"),
    (
        "POST",
        r"/interactions/(?P<interaction>\d+)/(?P<token>[^/]+)/callback",
        "interaction_callback",
    ),
    ("GET", r"/webhooks/(?P<app>\d+)/(?P<token>[^/]+)/messages/@original", "get_original"),
    ("PATCH", r"/webhooks/(?P<app>\d+)/(?P<token>[^/]+)/messages/@original", "edit_original"),
    ("DELETE", r"/webhooks/(?P<app>\d+)/(?P<token>[^/]+)/messages/@original", "delete_original"),
    ("POST", r"/webhooks/(?P<app>\d+)/(?P<token>[^/]+)", "followup"),
    ("GET", r"/webhooks/(?P<app>\d+)/(?P<token>[^/]+)/messages/(?P<message>\d+)", "get_followup"),
    (
        "PATCH",
        r"/webhooks/(?P<app>\d+)/(?P<token>[^/]+)/messages/(?P<message>\d+)",
        "edit_followup",
    ),
    (
        "DELETE",
        r"/webhooks/(?P<app>\d+)/(?P<token>[^/]+)/messages/(?P<message>\d+)",
        "delete_followup",
    ),
    ("GET", r"/applications/(?P<app>\d+)/commands", "get_commands"),
    ("PUT", r"/applications/(?P<app>\d+)/commands", "put_commands"),
    ("POST", r"/applications/(?P<app>\d+)/commands", "upsert_command"),
    ("GET", r"/applications/(?P<app>\d+)/guilds/(?P<guild>\d+)/commands", "get_commands"),
    ("PUT", r"/applications/(?P<app>\d+)/guilds/(?P<guild>\d+)/commands", "put_commands"),
    ("POST", r"/applications/(?P<app>\d+)/guilds/(?P<guild>\d+)/commands", "upsert_command"),
    ("GET", r"/guilds/(?P<guild>\d+)", "get_guild"),
    ("GET", r"/guilds/(?P<guild>\d+)/roles", "get_roles"),
    ("GET", r"/guilds/(?P<guild>\d+)/channels", "get_guild_channels"),
    ("GET", r"/guilds/(?P<guild>\d+)/members/(?P<user>\d+)", "get_member"),
]

#: Routes discord.py calls without ``Authorization`` (the token is in the URL).
_WEBHOOK_ROUTES = frozenset(
    {
        "interaction_callback",
        "get_original",
        "edit_original",
        "delete_original",
        "followup",
        "get_followup",
        "edit_followup",
        "delete_followup",
    }
)

_COMPILED = [(method, re.compile(pattern), name) for method, pattern, name in _ROUTES]

_DEFAULT_GUILDS: dict[str, dict[str, Any]] = {
    p.GUILD_ID: {
        "name": "Kestrel Test",
        "channels": {p.CHANNEL_ID: "ops"},
        "roles": {p.ROLE_ID: "sre"},
    }
}


def _bucket(method: str, route: str) -> str:
    return hashlib.md5(f"{method} {route}".encode()).hexdigest()


class FakeDiscord:
    """The fake Discord REST API + gateway (see the module docstring).

    ``guilds`` maps a guild id to its spec: ``name``; ``channels`` ({id: name or a channel
    dict} — text channels by default); ``roles`` ({id: name or role dict}; @everyone is added);
    ``members`` ({user id: {"roles": [...], "username": ...}}); ``threads`` (thread dicts, e.g.
    :func:`~tests.fakes.discord_payloads.thread_channel`); ``owner_id``. Default: guild "100"
    ("Kestrel Test") with text channel "200" ("ops") and role "300" ("sre"). The bot user is
    ``bot_id`` ("900", "kestrel"), the application ``app_id`` ("901"). ``token`` (None: any)
    is the bot token REST and IDENTIFY must present (else 401 / close 4004).

    State a test may read or set:

    * ``calls``: every REST :class:`Call`, in arrival order (faulted ones too);
    * ``channels``: channel id -> channel/thread/DM object; ``guilds``: guild id -> spec
      (``name``, ``owner_id``, ``roles`` {id: role}, ``channel_ids``);
    * ``messages``: channel id -> messages (dicts as REST returns them, oldest first): bot
      posts, non-ephemeral interaction responses and follow-ups, and MESSAGE_CREATEs the test
      dispatched;
    * ``members``: (guild id, user id) -> ``{"roles": [...], ...}`` (``GET
      /guilds/{g}/members/{u}``; set it to change roles; authors of dispatched messages and
      interactions are added); ``users``: user id -> user object;
    * ``thread_members``: thread id -> the ids of its members (``GET
      /channels/{t}/thread-members/{u}``; a thread not listed has none); a bot post in a
      private thread adds the users it mentions (those ``allowed_mentions`` lets it notify);
    * ``commands``: guild id (None: global) -> the registered application commands;
    * ``interactions``: interaction id -> record (``payload``, ``token``, ``channel_id``,
      ``response_type``, ``responses`` (callback bodies), ``original``, ``followups``) of
      every dispatched INTERACTION_CREATE; ``ephemeral``: ephemeral messages (never in
      ``messages``); ``modals``: the ``data`` of every modal callback (type 9);
    * gateway: ``identifies``, ``resumes`` (the ``d`` of each), ``heartbeats`` (arrival times),
      ``heartbeat_acks``, ``gateway_received`` (every frame the client sent, decoded),
      ``gateway_sent`` (every payload sent), ``gateway_connections`` (ever accepted),
      ``gateway_queries`` (each connection's URL query: ``v``, ``encoding``, ``compress``),
      ``gateway_closes`` (close codes of ended connections), ``presences``;
    * switches: ``echo`` (send the gateway events real Discord sends for REST changes —
      MESSAGE_CREATE/UPDATE/DELETE, THREAD_CREATE/UPDATE, CHANNEL_UPDATE — to an identified
      client whose intents cover them; default True), ``ack_heartbeats`` (default True),
      ``reject_archived_sends`` (False: a message to an archived, unlocked thread unarchives
      it, as Discord does; True: 400 code 50083), ``enforce_message_content`` (True: blank the
      content/embeds/attachments/components of dispatched messages that neither mention the bot
      nor come from it or a DM when the client identified without MESSAGE_CONTENT).
    """

    def __init__(
        self,
        *,
        guilds: Mapping[str, Mapping[str, Any]] | None = None,
        bot_id: str = p.BOT_ID,
        app_id: str = p.APP_ID,
        bot_name: str = "kestrel",
        token: str | None = None,
        heartbeat_interval_ms: int = 41250,
        gateway_compress: bool = True,
        disallowed_intents: int = 0,
        port: int = 0,
    ) -> None:
        self.bot_id = str(bot_id)
        self.app_id = str(app_id)
        self.token = token
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.gateway_compress = gateway_compress
        self.disallowed_intents = disallowed_intents
        self.bot = p.bot_user(self.bot_id, username=bot_name)
        self.echo = True
        self.ack_heartbeats = True
        self.reject_archived_sends = False
        self._nonces: dict[tuple[Any, str], dict[str, Any]] = {}
        self.enforce_message_content = False

        self.calls: list[Call] = []
        self.guilds: dict[str, dict[str, Any]] = {}
        self.channels: dict[str, dict[str, Any]] = {}
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.members: dict[tuple[str, str], dict[str, Any]] = {}
        self.thread_members: dict[str, set[str]] = {}
        self.users: dict[str, dict[str, Any]] = {self.bot_id: p.user(self.bot_id, bot=True)}
        self.users[self.bot_id]["username"] = bot_name
        self.commands: dict[str | None, list[dict[str, Any]]] = {}
        self.interactions: dict[str, dict[str, Any]] = {}
        self.ephemeral: list[dict[str, Any]] = []
        self.modals: list[dict[str, Any]] = []

        self.identifies: list[dict[str, Any]] = []
        self.resumes: list[dict[str, Any]] = []
        self.heartbeats: list[float] = []
        self.heartbeat_acks = 0
        self.gateway_received: list[Any] = []
        self.gateway_sent: list[dict[str, Any]] = []
        self.gateway_connections = 0
        # While true, a new gateway connection is refused (503): Discord unreachable for a while.
        self.gateway_refused = False
        self.gateway_refusals = 0  # how many were refused so
        self.gateway_queries: list[dict[str, str]] = []
        self.gateway_closes: list[int | None] = []
        self.presences: list[Any] = []

        self._connections: list[_Connection] = []
        self._sessions: dict[str, _Session] = {}
        self._faults: list[_Fault] = []
        self._delays: list[tuple[str, re.Pattern[str], float]] = []
        self._handlers: list[tuple[str, re.Pattern[str], Handler]] = []
        self._cond = asyncio.Condition()
        self._stopping = asyncio.Event()
        self._port = port
        self._runner: web.AppRunner | None = None

        for guild_id, spec in (guilds if guilds is not None else _DEFAULT_GUILDS).items():
            self.add_guild(str(guild_id), spec)

    # ----------------------------------------------------------------- lifecycle

    @property
    def port(self) -> int:
        """The listening port (0 before :meth:`start`)."""
        return self._port

    @property
    def base(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://{HOST}:{self._port}"

    @property
    def api_url(self) -> str:
        """The REST base, ``http://127.0.0.1:<port>/api/v10`` (for ``Route.BASE`` /
        ``DISCORD_API_URL``; no trailing slash, as discord.py appends ``/channels/...``)."""
        return f"{self.base}/api/v10"

    @property
    def gateway_url(self) -> str:
        """``ws://127.0.0.1:<port>/gateway`` (what ``GET /gateway/bot`` returns)."""
        return f"ws://{HOST}:{self._port}/gateway"

    async def start(self) -> None:
        """Listen on 127.0.0.1 (an ephemeral port unless one was given)."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/gateway", self._handle_gateway)
        app.router.add_route("*", r"/api/v{version:\d+}{path:/.*}", self._handle_rest)
        app.router.add_route("*", "/{path:.*}", self._handle_stray)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, self._port))
        self._port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        """Close gateway connections (close the client first, or it reconnects) and stop."""
        self._stopping.set()
        for conn in list(self._connections):
            with contextlib.suppress(Exception):
                await conn.ws.close(code=WSCloseCode.GOING_AWAY, message=b"server stopping")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeDiscord:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # ----------------------------------------------------------------- world setup

    def add_guild(self, guild_id: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Add (or replace) a guild from a spec (see the class docstring); sent in
        GUILD_CREATE to clients that identify afterwards. Returns the stored guild."""
        guild: dict[str, Any] = {
            "id": guild_id,
            "name": str(spec.get("name", f"guild-{guild_id}")),
            "owner_id": str(spec.get("owner_id", "1")),
            "roles": {guild_id: p.everyone_role(guild_id)},
            "channel_ids": [],
        }
        for position, (role_id, role) in enumerate(dict(spec.get("roles", {})).items(), 1):
            guild["roles"][str(role_id)] = (
                dict(role)
                if isinstance(role, Mapping)
                else p.role(str(role_id), str(role), position=position)
            )
        self.guilds[guild_id] = guild
        for position, (channel_id, channel) in enumerate(dict(spec.get("channels", {})).items()):
            data = (
                {**dict(channel), "guild_id": guild_id}
                if isinstance(channel, Mapping)
                else p.text_channel(
                    str(channel_id), guild=guild_id, name=str(channel), position=position
                )
            )
            data["id"] = str(channel_id)
            self.channels[str(channel_id)] = data
            guild["channel_ids"].append(str(channel_id))
        for thread in spec.get("threads", ()):
            self.channels[str(thread["id"])] = {**dict(thread), "guild_id": guild_id}
        members = spec.get("members", {})
        if not isinstance(members, Mapping):
            members = {str(m): {} for m in members}
        for user_id, info in members.items():
            info = dict(info or {})
            info.setdefault("roles", [])
            self.members[(guild_id, str(user_id))] = info
            self.users.setdefault(str(user_id), p.user(str(user_id), username=info.get("username")))
        self.members.setdefault((guild_id, self.bot_id), {"roles": []})
        return guild

    def add_thread(
        self,
        parent_id: str = p.CHANNEL_ID,
        *,
        name: str = "thread",
        thread_id: str | None = None,
        archived: bool = False,
        locked: bool = False,
        owner_id: str | None = None,
        type: int = p.PUBLIC_THREAD,
    ) -> dict[str, Any]:
        """Seed a thread under ``parent_id``, its owner a member (no event is sent; active
        threads are in the GUILD_CREATE of later connections). Returns the stored thread."""
        parent = self.channels[str(parent_id)]
        thread = p.thread_channel(
            thread_id,
            guild=str(parent["guild_id"]),
            parent_id=str(parent_id),
            owner_id=owner_id or self.bot_id,
            name=name,
            type=type,
            archived=archived,
            locked=locked,
        )
        self.channels[thread["id"]] = thread
        # Discord makes whoever starts a thread one of its members.
        self.thread_members.setdefault(thread["id"], set()).add(str(thread["owner_id"]))
        return thread

    def archive(self, thread_id: str, *, locked: bool = False) -> dict[str, Any]:
        """Mark a thread archived (and ``locked``) as if Discord auto-archived it; no event
        is sent (``await fake.dispatch("THREAD_UPDATE", fake.channels[thread_id])`` for
        that). Returns the thread."""
        thread = self.channels[str(thread_id)]
        if thread.get("type") not in p.THREAD_TYPES:
            raise ValueError(f"channel {thread_id} is not a thread")
        metadata = thread["thread_metadata"]
        metadata["archived"] = True
        metadata["locked"] = locked or metadata.get("locked", False)
        metadata["archive_timestamp"] = p.iso()
        return thread

    def member_object(self, guild_id: str, user_id: str) -> dict[str, Any] | None:
        """The full member object (with ``user``) of a known member, or None."""
        info = self.members.get((str(guild_id), str(user_id)))
        if info is None:
            return None
        extra = {k: v for k, v in info.items() if k not in ("roles", "username")}
        data = p.member(str(user_id), roles=info.get("roles", ()), with_user=False)
        data["user"] = dict(self._user(str(user_id)))
        data.update(extra)
        return data

    # ----------------------------------------------------------------- test controls

    def fail(
        self,
        method: str,
        path_regex: str,
        *,
        status: int = 429,
        retry_after: float = 0.5,
        times: int | None = 1,
        global_: bool = False,
        code: int = 0,
        message: str | None = None,
    ) -> None:
        """Answer the next ``times`` calls (None: all) matching ``method`` ("*": any) and
        ``path_regex`` (full match against :attr:`Call.path`) with ``status``.

        429: Discord's body ``{"message": "You are being rate limited.", "retry_after": ...,
        "global": ...}`` with ``Retry-After``, ``X-RateLimit-Limit``, ``X-RateLimit-Remaining:
        0``, ``X-RateLimit-Reset(-After)``, ``X-RateLimit-Bucket``, ``X-RateLimit-Scope``
        (``user``/``global``) and ``X-RateLimit-Global`` when global. Other statuses:
        ``{"message": message or "<status>: <reason>", "code": code}``. Faults are used in the
        order they were added; the call is still recorded.
        """
        self._faults.append(
            _Fault(
                method.upper(),
                re.compile(path_regex),
                status,
                retry_after,
                times,
                global_,
                code,
                message,
            )
        )

    def clear_faults(self) -> None:
        """Forget every pending fault."""
        self._faults.clear()

    def delay(self, method: str, path_regex: str, seconds: float) -> None:
        """Answer later calls matching ``method``/``path_regex`` after ``seconds`` (0 removes
        it). The call is recorded on arrival, so ``wait_for`` sees it while it is pending."""
        key = re.compile(path_regex)
        self._delays = [d for d in self._delays if not (d[0] == method.upper() and d[1] == key)]
        if seconds > 0:
            self._delays.append((method.upper(), key, seconds))

    def set_handler(self, method: str, path_regex: str, handler: Handler | None) -> None:
        """Answer calls matching ``method``/``path_regex`` with ``handler(call)`` — a
        ``(status, body)`` tuple (body None: empty answer) or an awaitable of one — before the
        built-in routes. None removes the handlers of that method and pattern."""
        key = re.compile(path_regex)
        self._handlers = [h for h in self._handlers if not (h[0] == method.upper() and h[1] == key)]
        if handler is not None:
            self._handlers.append((method.upper(), key, handler))

    # ----------------------------------------------------------------- queries

    def calls_to(self, method: str, path_regex: str = r".*") -> list[Call]:
        """The recorded calls with ``method`` ("*": any) whose path fully matches
        ``path_regex``, in arrival order."""
        return [call for call in self.calls if _matches(call, method, path_regex)]

    def message(self, channel_id: str, message_id: str) -> dict[str, Any] | None:
        """The stored message, or None."""
        for message in self.messages.get(str(channel_id), []):
            if message["id"] == str(message_id):
                return message
        return None

    def channel_messages(self, channel_id: str) -> list[dict[str, Any]]:
        """The stored messages of a channel, oldest first."""
        return list(self.messages.get(str(channel_id), []))

    def bot_messages(self, channel_id: str) -> list[dict[str, Any]]:
        """The stored messages the bot authored in a channel, oldest first."""
        return [m for m in self.channel_messages(channel_id) if m["author"]["id"] == self.bot_id]

    def interaction_for(self, token: str) -> dict[str, Any] | None:
        """The record of the interaction with ``token``, or None."""
        for record in self.interactions.values():
            if record["token"] == token:
                return record
        return None

    async def wait_for(
        self,
        what: str | Callable[[Call], bool],
        timeout: float = 5.0,
        count: int = 1,
        *,
        answered: bool = False,
    ) -> list[Call]:
        """Wait until ``count`` calls match ``what`` — a predicate, or ``"METHOD path_regex"``
        (e.g. ``r"POST /channels/\\d+/messages"``) — and return all matching calls.
        ``answered=True`` counts only answered calls. Raises AssertionError (listing the
        recorded calls) on timeout."""
        matches: Callable[[Call], bool]
        if isinstance(what, str):
            method, _, path_regex = what.partition(" ")

            def by_route(call: Call) -> bool:
                return _matches(call, method, path_regex or ".*")

            matches, description = by_route, repr(what)
        else:
            matches, description = what, getattr(what, "__name__", repr(what))

        def found() -> list[Call] | None:
            hits = [c for c in self.calls if matches(c) and (not answered or c.status is not None)]
            return hits if len(hits) >= count else None

        return await self.wait_until(
            found,
            timeout,
            lambda: (
                f"{count} call(s) matching {description}; recorded: {[str(c) for c in self.calls]}"
            ),
        )

    async def wait_until(
        self,
        probe: Callable[[], _T | bool | None],
        timeout: float = 5.0,
        describe: str | Callable[[], str] = "a condition",
    ) -> _T:
        """Wait until ``probe()`` returns something truthy (re-checked on every REST call,
        answer and gateway frame) and return it; AssertionError on timeout."""
        result: Any = None

        def ready() -> bool:
            nonlocal result
            result = probe()
            return bool(result)

        try:
            async with asyncio.timeout(timeout), self._cond:
                await self._cond.wait_for(ready)
        except TimeoutError:
            text = describe() if callable(describe) else describe
            raise AssertionError(f"timed out after {timeout}s waiting for {text}") from None
        return result  # type: ignore[no-any-return]

    # ----------------------------------------------------------------- gateway controls

    def _ready_connection(self) -> _Connection | None:
        for conn in reversed(self._connections):
            if conn.ready and not conn.ws.closed:
                return conn
        return None

    @property
    def sessions_connected(self) -> int:
        """How many identified (or resumed) gateway connections are open now: the sessions a
        dispatch with ``every`` reaches (a killed client's is gone once its socket closed)."""
        return sum(1 for c in self._connections if c.ready and not c.ws.closed)

    async def wait_for_gateway(self, timeout: float = 5.0, connections: int = 1) -> None:
        """Wait until ``connections`` gateway connections were ever accepted and one is
        identified (READY and GUILD_CREATEs sent) or resumed."""
        await self.wait_until(
            lambda: self.gateway_connections >= connections and self._ready_connection(),
            timeout,
            lambda: (
                f"gateway connection #{connections} to be ready (accepted so far: "
                f"{self.gateway_connections}, identifies: {len(self.identifies)})"
            ),
        )

    async def dispatch(
        self, event: str, data: Mapping[str, Any], timeout: float = 5.0, *, every: bool = False
    ) -> int:
        """Send a dispatch (op 0, ``t`` = ``event``) on the newest ready connection (waiting
        for one up to ``timeout``); return its sequence number. ``every``: on every ready
        connection, as Discord sends each event to every unsharded session of a bot.

        The fake also takes note, as Discord's state would: MESSAGE_CREATE/UPDATE store the
        message (without ``guild_id``/``member``), INTERACTION_CREATE registers the
        interaction (so its callback and webhooks are accepted), THREAD_/CHANNEL_CREATE and
        _UPDATE store the channel, and authors/members become known members.
        """
        await self.wait_for_gateway(timeout)
        conn = self._ready_connection()
        assert conn is not None
        self._observe(event, copy.deepcopy(dict(data)))
        if not every:
            return await self._send_dispatch(conn, event, dict(data))
        ready = [c for c in self._connections if c.ready and not c.ws.closed]
        seqs = [await self._send_dispatch(c, event, copy.deepcopy(dict(data))) for c in ready]
        return seqs[-1]

    def post(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """Take a MESSAGE_CREATE's ``data`` as sent while no session of the bot is connected:
        stored (history returns it, its author becomes a member) and dispatched to nobody; a
        session that IDENTIFYs later is not sent it either, as on Discord. The stored message."""
        self._observe("MESSAGE_CREATE", copy.deepcopy(dict(data)))
        stored = self.message(str(data["channel_id"]), str(data["id"]))
        assert stored is not None
        return stored

    def interaction_posted(self, data: Mapping[str, Any]) -> None:
        """Register an interaction sent to an HTTP endpoint instead of the gateway: its
        callback route is closed (the HTTP answer is its response), its follow-ups open."""
        if str(data["id"]) in self.interactions:
            return  # the same interaction posted again
        self._observe("INTERACTION_CREATE", copy.deepcopy(dict(data)))
        self.interactions[str(data["id"])]["response_type"] = 0  # answered over HTTP

    def interaction_answered(self, interaction_id: str, body: Mapping[str, Any]) -> None:
        """Record the HTTP answer to an interaction as its response (a later callback POST is
        then refused, as Discord does)."""
        record = self.interactions[str(interaction_id)]
        record["response_type"] = int(body.get("type", 0))
        record["responses"].append(dict(body))
        if record["response_type"] == CB_MODAL:
            self.modals.append(dict(body.get("data") or {}))

    async def reconnect_gateway(self) -> None:
        """Send op 7 RECONNECT: discord.py closes and RESUMEs at ``resume_gateway_url``."""
        for conn in list(self._connections):
            await self._send(conn, {"op": OP_RECONNECT, "d": None, "s": None, "t": None})

    async def invalidate_session(self, resumable: bool = False) -> None:
        """Send op 9 INVALID_SESSION (discord.py re-identifies, or resumes when
        ``resumable``)."""
        for conn in list(self._connections):
            await self._send(conn, {"op": OP_INVALID_SESSION, "d": resumable, "s": None, "t": None})

    async def close_gateway(self, code: int = 4000, message: str = "closed by test") -> None:
        """Close every gateway connection from the server side with ``code`` (4000 and 1000
        make discord.py reconnect; 4004, 4010-4014 are fatal)."""
        for conn in list(self._connections):
            await conn.ws.close(code=code, message=message.encode())

    # ----------------------------------------------------------------- internals

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    def _user(self, user_id: str) -> dict[str, Any]:
        return self.users.get(user_id) or p.user(user_id)

    def _guild_of(self, channel: Mapping[str, Any]) -> str | None:
        guild = channel.get("guild_id")
        return str(guild) if guild is not None else None

    def _take_fault(self, call: Call) -> _Fault | None:
        for fault in self._faults:
            if not _matches(call, fault.method, fault.pattern):
                continue
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._faults.remove(fault)
            return fault
        return None

    def _fault_reply(self, fault: _Fault, bucket: str) -> tuple[Reply, dict[str, str]]:
        if fault.status == 429:
            body = {
                "message": fault.message or _RATE_LIMIT_MESSAGE,
                "retry_after": fault.retry_after,
                "global": fault.global_,
            }
            if fault.code:
                body["code"] = fault.code
            headers = {
                "Retry-After": str(max(1, math.ceil(fault.retry_after))),
                "X-RateLimit-Limit": "5",
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": f"{time.time() + fault.retry_after:.3f}",
                "X-RateLimit-Reset-After": f"{fault.retry_after:.3f}",
                "X-RateLimit-Bucket": bucket,
                "X-RateLimit-Scope": "global" if fault.global_ else "user",
            }
            if fault.global_:
                headers["X-RateLimit-Global"] = "true"
            return (429, body), headers
        try:
            reason = HTTPStatus(fault.status).phrase
        except ValueError:
            reason = "Error"
        message = fault.message or f"{fault.status}: {reason}"
        return (fault.status, {"message": message, "code": fault.code}), {}

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _handle_stray(self, request: web.Request) -> web.StreamResponse:
        return _respond((404, {"message": "404: Not Found", "code": 0}), {})

    async def _handle_rest(self, request: web.Request) -> web.StreamResponse:
        path = request.match_info["path"]
        body, files = await _read_body(request)
        call = Call(
            method=request.method,
            path=path,
            json=body,
            headers={k.lower(): v for k, v in request.headers.items()},
            at=time.monotonic(),
            query=dict(request.query),
            files=files,
        )
        route_name, params = "unknown", {}
        for method, pattern, name in _COMPILED:
            match = pattern.fullmatch(path)
            if match is not None and method == request.method:
                route_name, params = name, match.groupdict()
                break
        call.route = route_name
        self.calls.append(call)
        await self._notify()

        for method, pattern, seconds in self._delays:
            if _matches(call, method, pattern):
                await self._pause(seconds)
                break

        bucket = _bucket(request.method, route_name)
        headers = {
            "X-RateLimit-Limit": "50",
            "X-RateLimit-Remaining": "49",
            "X-RateLimit-Reset": f"{time.time() + 1:.3f}",
            "X-RateLimit-Reset-After": "1.000",
            "X-RateLimit-Bucket": bucket,
        }
        reply: Reply
        fault = self._take_fault(call)
        custom = next(
            (h for m, pat, h in self._handlers if _matches(call, m, pat)),
            None,
        )
        if fault is not None:
            reply, headers = self._fault_reply(fault, bucket)
        elif (
            self.token is not None
            and route_name not in _WEBHOOK_ROUTES
            and call.token != self.token
        ):
            reply = (401, {"message": "401: Unauthorized", "code": 0})
        elif custom is not None:
            answer = custom(call)
            reply = await answer if inspect.isawaitable(answer) else answer
        elif route_name == "unknown":
            reply = (404, {"message": "404: Not Found", "code": 0})
        else:
            handler = getattr(self, f"_r_{route_name}")
            reply = await handler(call, **params)
        call.status, call.response = reply[0], copy.deepcopy(reply[1])
        await self._notify()
        return _respond(reply, headers)

    # ----------------------------------------------------------------- REST: users, app, gateway

    async def _r_me(self, call: Call) -> Reply:
        return 200, dict(self.bot)

    async def _r_get_user(self, call: Call, user: str) -> Reply:
        if user not in self.users:
            return _unknown("User", 10013)
        return 200, dict(self.users[user])

    async def _r_create_dm(self, call: Call) -> Reply:
        recipient = str((call.json or {}).get("recipient_id", ""))
        if not recipient:
            return _form_error("recipient_id", "BASE_TYPE_REQUIRED", "This field is required")
        for channel in self.channels.values():
            if channel.get("type") == p.DM and channel["recipients"][0]["id"] == recipient:
                return 200, dict(channel)
        channel = p.dm_channel(p.snowflake(), recipient=self._user(recipient))
        self.channels[channel["id"]] = channel
        return 200, dict(channel)

    async def _r_application(self, call: Call) -> Reply:
        return 200, p.application(self.app_id, bot=self.bot)

    async def _r_gateway(self, call: Call) -> Reply:
        return 200, {"url": self.gateway_url}

    async def _r_gateway_bot(self, call: Call) -> Reply:
        return 200, {
            "url": self.gateway_url,
            "shards": 1,
            "session_start_limit": {
                "total": 1000,
                "remaining": 1000 - len(self.identifies),
                "reset_after": 86_400_000,
                "max_concurrency": 1,
            },
        }

    # ----------------------------------------------------------------- REST: messages

    def _check_message(self, body: Mapping[str, Any], *, editing: bool) -> Reply | None:
        content = body.get("content")
        flags = int(body.get("flags") or 0)
        if content is not None and len(str(content)) > _MAX_CONTENT:
            return _form_error(
                "content", "BASE_TYPE_MAX_LENGTH", f"Must be {_MAX_CONTENT} or fewer in length."
            )
        if len(body.get("embeds") or []) > 10:
            return _form_error("embeds", "BASE_TYPE_MAX_LENGTH", "Must be 10 or fewer in length.")
        if flags & p.FLAG_IS_COMPONENTS_V2:
            if content or body.get("embeds"):
                return _form_error(
                    "content",
                    "MESSAGE_CANNOT_USE_LEGACY_FIELDS_WITH_COMPONENTS_V2",
                    "The 'content' and 'embeds' fields cannot be used when using the "
                    "IS_COMPONENTS_V2 flag",
                )
        elif len(body.get("components") or []) > 5:
            return _form_error(
                "components", "BASE_TYPE_MAX_LENGTH", "Must be 5 or fewer in length."
            )
        broken = discord_limits.message_problem(body)
        if broken:
            return _form_error(broken[0], "BASE_TYPE_MAX_LENGTH", broken[1])
        if not editing and not any(
            body.get(key)
            for key in ("content", "embeds", "components", "sticker_ids", "attachments", "poll")
        ):
            return _error(400, 50006, "Cannot send an empty message")
        return None

    def _mentions(
        self, content: str, allowed: Mapping[str, Any] | None, guild: str | None
    ) -> tuple[list[dict[str, Any]], list[str], bool]:
        users, roles, everyone = p.mentioned_ids(content)
        if allowed is not None:
            parse = set(allowed.get("parse") or [])
            allowed_users = {str(u) for u in allowed.get("users") or []}
            allowed_roles = {str(r) for r in allowed.get("roles") or []}
            users = [u for u in users if "users" in parse or u in allowed_users]
            roles = [r for r in roles if "roles" in parse or r in allowed_roles]
            everyone = everyone and "everyone" in parse
        mentions = []
        for user_id in users:
            data = dict(self._user(user_id))
            if guild is not None and (guild, user_id) in self.members:
                member = self.member_object(guild, user_id) or {}
                member.pop("user", None)
                data["member"] = member
            mentions.append(data)
        return mentions, roles, everyone

    def _build_message(
        self,
        channel_id: str,
        body: Mapping[str, Any],
        *,
        message_type: int = 0,
        extra: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> dict[str, Any]:
        channel = self.channels.get(channel_id, {})
        guild = self._guild_of(channel)
        content = str(body.get("content") or "")
        mentions, roles, everyone = self._mentions(content, body.get("allowed_mentions"), guild)
        message = p.message(
            channel=channel_id,
            author=self._user(self.bot_id),
            content=content,
            id=message_id,
            components=p.number_components(body.get("components") or []),
            embeds=[{"type": "rich", **e} for e in body.get("embeds") or []],
            attachments=[
                {
                    "id": p.snowflake(),
                    "filename": f["filename"],
                    "size": f["size"],
                    "content_type": f["content_type"],
                    "url": f"{self.base}/attachments/{channel_id}/{f['filename']}",
                    "proxy_url": f"{self.base}/attachments/{channel_id}/{f['filename']}",
                }
                for f in (extra or {}).get("_files", [])
            ],
            flags=int(body.get("flags") or 0),
            type=message_type,
            mentions=mentions,
            mention_roles=roles,
            mention_everyone=everyone,
        )
        if body.get("nonce") is not None:
            message["nonce"] = body["nonce"]
        if body.get("tts"):
            message["tts"] = True
        reference = body.get("message_reference")
        if isinstance(reference, Mapping) and reference.get("message_id"):
            ref_channel = str(reference.get("channel_id") or channel_id)
            referenced = self.message(ref_channel, str(reference["message_id"]))
            message["type"] = 19 if message_type == 0 else message_type
            message["message_reference"] = {
                "type": int(reference.get("type", 0)),
                "channel_id": ref_channel,
                "message_id": str(reference["message_id"]),
                **({"guild_id": guild} if guild else {}),
            }
            message["referenced_message"] = copy.deepcopy(referenced)
        if channel.get("type") in p.THREAD_TYPES:
            message["position"] = int(channel.get("total_message_sent", 0))
        for key, value in (extra or {}).items():
            if not key.startswith("_"):
                message[key] = value
        return message

    def _store(self, message: dict[str, Any]) -> None:
        channel_id = message["channel_id"]
        self.messages.setdefault(channel_id, []).append(message)
        channel = self.channels.get(channel_id)
        if channel is not None:
            channel["last_message_id"] = message["id"]
            if channel.get("type") in p.THREAD_TYPES:
                channel["message_count"] = int(channel.get("message_count", 0)) + 1
                channel["total_message_sent"] = int(channel.get("total_message_sent", 0)) + 1

    def _gateway_message(self, message: Mapping[str, Any]) -> dict[str, Any]:
        data = copy.deepcopy(dict(message))
        channel = self.channels.get(data["channel_id"], {})
        guild = self._guild_of(channel)
        if guild is not None:
            data["guild_id"] = guild
            author = data["author"]["id"]
            member = self.member_object(guild, author)
            if member is not None:
                member.pop("user", None)
                data["member"] = member
        return data

    def _message_intent(self, channel_id: str) -> int:
        guild = self._guild_of(self.channels.get(channel_id, {}))
        return INTENT_GUILD_MESSAGES if guild is not None else INTENT_DIRECT_MESSAGES

    async def _echo_message(self, event: str, message: Mapping[str, Any]) -> None:
        if message.get("flags", 0) & p.FLAG_EPHEMERAL:
            return
        await self._echo(
            event, self._gateway_message(message), self._message_intent(message["channel_id"])
        )

    def _archived_refusal(self, channel: dict[str, Any]) -> Reply | None:
        metadata = channel.get("thread_metadata")
        if channel.get("type") not in p.THREAD_TYPES or not metadata or not metadata["archived"]:
            return None
        if metadata.get("locked") or self.reject_archived_sends:
            return _error(400, 50083, "Thread is archived")
        return None

    async def _unarchive_for_send(self, channel: dict[str, Any]) -> None:
        metadata = channel.get("thread_metadata")
        if channel.get("type") in p.THREAD_TYPES and metadata and metadata["archived"]:
            metadata["archived"] = False
            metadata["archive_timestamp"] = p.iso()
            await self._echo("THREAD_UPDATE", dict(channel), INTENT_GUILDS)

    async def _r_create_message(self, call: Call, channel: str) -> Reply:
        target = self.channels.get(channel)
        if target is None:
            return _unknown("Channel", 10003)
        body = dict(call.json or {})
        if call.files:
            body.setdefault("attachments", [{"id": i} for i in range(len(call.files))])
        refusal = self._check_message(body, editing=False) or self._archived_refusal(target)
        if refusal is not None:
            return refusal
        nonce = body.get("nonce") if body.get("enforce_nonce") else None
        if nonce is not None and (nonce, channel) in self._nonces:
            # As Discord does for a few minutes: the same nonce answers the message it made.
            return 200, self._nonces[(nonce, channel)]
        await self._unarchive_for_send(target)
        message = self._build_message(channel, body, extra={"_files": call.files})
        self._store(message)
        if target.get("type") == p.PRIVATE_THREAD:
            # As Discord does: a user a message in a private thread mentions (and notifies:
            # ``allowed_mentions`` decides) becomes one of its members, and sees all of it.
            members = self.thread_members.setdefault(channel, set())
            members.update(str(user["id"]) for user in message["mentions"])
        if nonce is not None:
            self._nonces[(nonce, channel)] = message
        await self._echo_message("MESSAGE_CREATE", message)
        return 200, message

    async def _r_list_messages(self, call: Call, channel: str) -> Reply:
        if channel not in self.channels:
            return _unknown("Channel", 10003)
        try:
            limit = max(1, min(100, int(call.query.get("limit", "50"))))
        except ValueError:
            return _form_error("limit", "NUMBER_TYPE_COERCE", "Value is not int.")
        stored = sorted(self.messages.get(channel, []), key=lambda m: int(m["id"]))
        if "after" in call.query:
            after = int(call.query["after"])
            picked = [m for m in stored if int(m["id"]) > after][:limit]
        elif "around" in call.query:
            around = int(call.query["around"])
            older = [m for m in stored if int(m["id"]) < around][-(limit // 2) :]
            newer = [m for m in stored if int(m["id"]) >= around][: limit - len(older)]
            picked = older + newer
        else:
            before = int(call.query.get("before", str(1 << 63)))
            picked = [m for m in stored if int(m["id"]) < before][-limit:]
        return 200, [copy.deepcopy(m) for m in reversed(picked)]  # newest first, as Discord

    async def _r_get_message(self, call: Call, channel: str, message: str) -> Reply:
        if channel not in self.channels:
            return _unknown("Channel", 10003)
        found = self.message(channel, message)
        return (200, copy.deepcopy(found)) if found is not None else _unknown("Message", 10008)

    def _apply_edit(self, message: dict[str, Any], body: Mapping[str, Any]) -> None:
        if "content" in body:
            message["content"] = str(body["content"] or "")
            guild = self._guild_of(self.channels.get(message["channel_id"], {}))
            mentions, roles, everyone = self._mentions(
                message["content"], body.get("allowed_mentions"), guild
            )
            message.update(mentions=mentions, mention_roles=roles, mention_everyone=everyone)
        if "embeds" in body:
            message["embeds"] = [{"type": "rich", **e} for e in body["embeds"] or []]
        if "components" in body:
            message["components"] = p.number_components(body["components"] or [])
        if "flags" in body and body["flags"] is not None:
            keep = message.get("flags", 0) & (p.FLAG_EPHEMERAL | p.FLAG_HAS_THREAD)
            message["flags"] = (int(body["flags"]) & ~p.FLAG_LOADING) | keep
        else:
            message["flags"] = message.get("flags", 0) & ~p.FLAG_LOADING
        if "attachments" in body:
            kept = {str(a.get("id")) for a in body["attachments"] or []}
            message["attachments"] = [a for a in message["attachments"] if a["id"] in kept]
        message["edited_timestamp"] = p.iso()

    async def _r_edit_message(self, call: Call, channel: str, message: str) -> Reply:
        if channel not in self.channels:
            return _unknown("Channel", 10003)
        found = self.message(channel, message)
        if found is None:
            return _unknown("Message", 10008)
        body = dict(call.json or {})
        if found["author"]["id"] != self.bot_id and set(body) - {"flags"}:
            return _error(403, 50005, "Cannot edit a message authored by another user")
        refusal = self._check_message({**found, **body}, editing=True)
        if refusal is not None:
            return refusal
        self._apply_edit(found, body)
        await self._echo_message("MESSAGE_UPDATE", found)
        return 200, copy.deepcopy(found)

    async def _r_delete_message(self, call: Call, channel: str, message: str) -> Reply:
        if channel not in self.channels:
            return _unknown("Channel", 10003)
        found = self.message(channel, message)
        if found is None:
            return _unknown("Message", 10008)
        self.messages[channel].remove(found)
        event: dict[str, Any] = {"id": message, "channel_id": channel}
        guild = self._guild_of(self.channels[channel])
        if guild is not None:
            event["guild_id"] = guild
        await self._echo("MESSAGE_DELETE", event, self._message_intent(channel))
        return 204, None

    async def _r_typing(self, call: Call, channel: str) -> Reply:
        if channel not in self.channels:
            return _unknown("Channel", 10003)
        return 204, None

    async def _r_react(self, call: Call, channel: str, message: str) -> Reply:
        if self.message(channel, message) is None:
            return _unknown("Message", 10008)
        return 204, None

    async def _r_unreact(self, call: Call, channel: str, message: str) -> Reply:
        return await self._r_react(call, channel, message)

    async def _r_join_thread(self, call: Call, channel: str) -> Reply:
        if channel not in self.channels:
            return _unknown("Channel", 10003)
        return 204, None

    async def _r_get_thread_member(self, call: Call, channel: str, user: str) -> Reply:
        if channel not in self.channels:
            return _unknown("Channel", 10003)
        if user not in self.thread_members.get(channel, set()):
            return _unknown("Member", 10007)
        return 200, {"id": channel, "user_id": user, "join_timestamp": p.iso(), "flags": 0}

    # ----------------------------------------------------------------- REST: channels, threads

    async def _create_thread(
        self, parent: dict[str, Any], body: Mapping[str, Any], *, thread_id: str | None, kind: int
    ) -> Reply:
        name = str(body.get("name") or "")
        if not name:
            return _form_error("name", "BASE_TYPE_REQUIRED", "This field is required")
        too_long = discord_limits.name_problem(name)
        if too_long:
            return _form_error(too_long[0], "BASE_TYPE_MAX_LENGTH", too_long[1])
        thread = p.thread_channel(
            thread_id,
            guild=str(parent["guild_id"]),
            parent_id=str(parent["id"]),
            owner_id=self.bot_id,
            name=name,
            type=kind,
            auto_archive_duration=int(body.get("auto_archive_duration") or 4320),
            member_user_id=self.bot_id,
        )
        if body.get("rate_limit_per_user"):
            thread["rate_limit_per_user"] = int(body["rate_limit_per_user"])
        if kind == p.PRIVATE_THREAD and "invitable" in body:
            thread["thread_metadata"]["invitable"] = bool(body["invitable"])
        self.channels[thread["id"]] = thread
        await self._echo("THREAD_CREATE", {**thread, "newly_created": True}, INTENT_GUILDS)
        return 201, copy.deepcopy(thread)

    async def _r_start_thread(self, call: Call, channel: str, message: str) -> Reply:
        parent = self.channels.get(channel)
        if parent is None:
            return _unknown("Channel", 10003)
        if parent.get("type") not in (p.TEXT, 5):
            return _error(400, 50024, "Cannot execute action on this channel type")
        starter = self.message(channel, message)
        if starter is None:
            return _unknown("Message", 10008)
        if message in self.channels:
            return _error(400, 160004, "A thread has already been created for this message")
        kind = p.PUBLIC_THREAD if parent.get("type") == p.TEXT else 10
        status, thread = await self._create_thread(
            parent, call.json or {}, thread_id=message, kind=kind
        )
        if status < 300:
            starter["thread"] = copy.deepcopy(thread)
            starter["flags"] = starter.get("flags", 0) | p.FLAG_HAS_THREAD
        return status, thread

    async def _r_start_thread_without_message(self, call: Call, channel: str) -> Reply:
        parent = self.channels.get(channel)
        if parent is None:
            return _unknown("Channel", 10003)
        if parent.get("type") not in (p.TEXT, 5):
            return _error(400, 50024, "Cannot execute action on this channel type")
        body = call.json or {}
        kind = int(body.get("type") or p.PRIVATE_THREAD)
        return await self._create_thread(parent, body, thread_id=None, kind=kind)

    async def _r_get_channel(self, call: Call, channel: str) -> Reply:
        found = self.channels.get(channel)
        return (200, copy.deepcopy(found)) if found is not None else _unknown("Channel", 10003)

    async def _r_edit_channel(self, call: Call, channel: str) -> Reply:
        found = self.channels.get(channel)
        if found is None:
            return _unknown("Channel", 10003)
        body = dict(call.json or {})
        if found.get("type") in p.THREAD_TYPES:
            metadata = found["thread_metadata"]
            for key in ("archived", "locked", "auto_archive_duration", "invitable"):
                if key in body and body[key] is not None:
                    if key == "archived" and bool(body[key]) != metadata["archived"]:
                        metadata["archive_timestamp"] = p.iso()
                    metadata[key] = body[key]
            for key in ("name", "rate_limit_per_user", "flags", "applied_tags"):
                if key in body and body[key] is not None:
                    found[key] = body[key]
            await self._echo("THREAD_UPDATE", dict(found), INTENT_GUILDS)
        else:
            for key, value in body.items():
                if key != "id":
                    found[key] = value
            await self._echo("CHANNEL_UPDATE", dict(found), INTENT_GUILDS)
        return 200, copy.deepcopy(found)

    # ----------------------------------------------------------------- REST: interactions

    def _interaction_message(
        self, record: Mapping[str, Any], body: Mapping[str, Any], *, message_type: int
    ) -> dict[str, Any]:
        payload = record["payload"]
        invoker = (payload.get("member") or {}).get("user") or payload.get("user") or {}
        message = self._build_message(
            record["channel_id"],
            body,
            message_type=message_type,
            extra={
                "webhook_id": self.app_id,
                "application_id": self.app_id,
                "interaction_metadata": {
                    "id": record["id"],
                    "type": payload["type"],
                    "user": invoker,
                    "authorizing_integration_owners": payload.get(
                        "authorizing_integration_owners", {}
                    ),
                    **(
                        {"interacted_message_id": payload["message"]["id"]}
                        if payload.get("message")
                        else {}
                    ),
                },
            },
        )
        return message

    def _keep(self, message: dict[str, Any]) -> None:
        if message.get("flags", 0) & p.FLAG_EPHEMERAL:
            self.ephemeral.append(message)
        else:
            self._store(message)

    def _component_message(self, record: dict[str, Any]) -> dict[str, Any] | None:
        card = record["payload"].get("message")
        if card is None:
            return None
        stored = self.message(str(card.get("channel_id", record["channel_id"])), str(card["id"]))
        if stored is not None:
            return stored
        if record.get("card") is None:
            record["card"] = copy.deepcopy(card)
        return record["card"]  # type: ignore[no-any-return]

    async def _r_interaction_callback(self, call: Call, interaction: str, token: str) -> Reply:
        record = self.interactions.get(interaction)
        if record is None:
            return _unknown("interaction", 10062)
        if record["token"] != token:
            return _error(401, 50027, "Invalid Webhook Token")
        if record["response_type"] is not None:
            return _error(400, 40060, "Interaction has already been acknowledged.")
        body = dict(call.json or {})
        kind = int(body.get("type", 0))
        data = dict(body.get("data") or {})
        itype = record["payload"]["type"]
        component_based = record["payload"].get("message") is not None
        if kind in (CB_DEFERRED_UPDATE, CB_UPDATE_MESSAGE) and not component_based:
            return _form_error("type", "INTERACTION_RESPONSE_TYPE_INVALID", "Invalid type")
        if kind == CB_MODAL and itype == p.MODAL_SUBMIT:
            return _form_error("type", "INTERACTION_RESPONSE_TYPE_INVALID", "Invalid type")
        if kind not in (1, 4, 5, 6, 7, 8, 9, 10, 12):
            return _form_error("type", "BASE_TYPE_CHOICES", f"Value must be one of ... ({kind})")
        message: dict[str, Any] | None = None
        if kind == CB_MESSAGE:
            refusal = self._check_message(data, editing=False)
            if refusal is not None:
                return refusal
            mtype = 20 if itype == p.APPLICATION_COMMAND else 0
            message = self._interaction_message(record, data, message_type=mtype)
            self._keep(message)
            record["original"] = message
            await self._echo_message("MESSAGE_CREATE", message)
        elif kind == CB_DEFERRED_MESSAGE:
            flags = p.FLAG_LOADING | (int(data.get("flags") or 0) & p.FLAG_EPHEMERAL)
            mtype = 20 if itype == p.APPLICATION_COMMAND else 0
            message = self._interaction_message(record, {}, message_type=mtype)
            message["flags"] = flags
            self._keep(message)
            record["original"] = message
            await self._echo_message("MESSAGE_CREATE", message)
        elif kind in (CB_DEFERRED_UPDATE, CB_UPDATE_MESSAGE):
            message = self._component_message(record)
            if kind == CB_UPDATE_MESSAGE and message is not None:
                refusal = self._check_message({**message, **data}, editing=True)
                if refusal is not None:
                    return refusal
                self._apply_edit(message, data)
                await self._echo_message("MESSAGE_UPDATE", message)
            record["original"] = message
        elif kind == CB_MODAL:
            self.modals.append(data)
        record["response_type"] = kind
        record["responses"].append(body)
        if not _truthy(call.query.get("with_response")):
            return 204, None
        answer: dict[str, Any] = {
            "interaction": {
                "id": record["id"],
                "type": itype,
                "response_message_id": message["id"] if message else None,
                "response_message_loading": kind == CB_DEFERRED_MESSAGE,
                "response_message_ephemeral": bool(
                    message and message.get("flags", 0) & p.FLAG_EPHEMERAL
                ),
            },
            "resource": {"type": kind},
        }
        if message is not None and kind in (CB_MESSAGE, CB_DEFERRED_MESSAGE, CB_UPDATE_MESSAGE):
            answer["resource"]["message"] = copy.deepcopy(message)
        return 200, answer

    def _webhook_record(self, app: str, token: str) -> dict[str, Any] | Reply:
        record = self.interaction_for(token)
        if record is None or app != self.app_id:
            return _unknown("Webhook", 10015)
        return record

    async def _r_get_original(self, call: Call, app: str, token: str) -> Reply:
        record = self._webhook_record(app, token)
        if isinstance(record, tuple):
            return record
        original = record["original"]
        return (200, copy.deepcopy(original)) if original else _unknown("Message", 10008)

    async def _r_edit_original(self, call: Call, app: str, token: str) -> Reply:
        record = self._webhook_record(app, token)
        if isinstance(record, tuple):
            return record
        original = record["original"]
        if original is None:
            return _unknown("Message", 10008)
        body = dict(call.json or {})
        refusal = self._check_message({**original, **body}, editing=True)
        if refusal is not None:
            return refusal
        self._apply_edit(original, body)
        await self._echo_message("MESSAGE_UPDATE", original)
        return 200, copy.deepcopy(original)

    async def _r_delete_original(self, call: Call, app: str, token: str) -> Reply:
        record = self._webhook_record(app, token)
        if isinstance(record, tuple):
            return record
        original = record["original"]
        if original is None:
            return _unknown("Message", 10008)
        self._forget(original)
        record["original"] = None
        return 204, None

    def _forget(self, message: Mapping[str, Any]) -> None:
        if message in self.ephemeral:
            self.ephemeral.remove(message)  # type: ignore[arg-type]
        stored = self.messages.get(message["channel_id"], [])
        if message in stored:
            stored.remove(message)  # type: ignore[arg-type]

    async def _r_followup(self, call: Call, app: str, token: str) -> Reply:
        record = self._webhook_record(app, token)
        if isinstance(record, tuple):
            return record
        if record["response_type"] is None:
            return _unknown("Webhook", 10015)  # Discord: no follow-ups before the ack
        body = dict(call.json or {})
        refusal = self._check_message(body, editing=False)
        if refusal is not None:
            return refusal
        original = record["original"]
        if (
            record["response_type"] == CB_DEFERRED_MESSAGE
            and original is not None
            and original.get("flags", 0) & p.FLAG_LOADING
        ):
            # The first follow-up after a "thinking" defer replaces the loading message
            # (keeping its ephemerality), as Discord does.
            ephemeral = original.get("flags", 0) & p.FLAG_EPHEMERAL
            self._apply_edit(original, {**body, "flags": int(body.get("flags") or 0) | ephemeral})
            record["followups"].append(original)
            await self._echo_message("MESSAGE_UPDATE", original)
            message = original
        else:
            message = self._interaction_message(record, body, message_type=0)
            if call.query.get("thread_id"):
                message["channel_id"] = str(call.query["thread_id"])
            self._keep(message)
            record["followups"].append(message)
            await self._echo_message("MESSAGE_CREATE", message)
        if not _truthy(call.query.get("wait")):
            return 204, None
        return 200, copy.deepcopy(message)

    def _followup_message(self, record: Mapping[str, Any], message: str) -> dict[str, Any] | None:
        for candidate in [*record["followups"], record["original"]]:
            if candidate is not None and candidate["id"] == message:
                return candidate  # type: ignore[no-any-return]
        return None

    async def _r_get_followup(self, call: Call, app: str, token: str, message: str) -> Reply:
        record = self._webhook_record(app, token)
        if isinstance(record, tuple):
            return record
        found = self._followup_message(record, message)
        return (200, copy.deepcopy(found)) if found else _unknown("Message", 10008)

    async def _r_edit_followup(self, call: Call, app: str, token: str, message: str) -> Reply:
        record = self._webhook_record(app, token)
        if isinstance(record, tuple):
            return record
        found = self._followup_message(record, message)
        if found is None:
            return _unknown("Message", 10008)
        body = dict(call.json or {})
        refusal = self._check_message({**found, **body}, editing=True)
        if refusal is not None:
            return refusal
        self._apply_edit(found, body)
        await self._echo_message("MESSAGE_UPDATE", found)
        return 200, copy.deepcopy(found)

    async def _r_delete_followup(self, call: Call, app: str, token: str, message: str) -> Reply:
        record = self._webhook_record(app, token)
        if isinstance(record, tuple):
            return record
        found = self._followup_message(record, message)
        if found is None:
            return _unknown("Message", 10008)
        self._forget(found)
        record["followups"] = [m for m in record["followups"] if m["id"] != message]
        return 204, None

    # ----------------------------------------------------------------- REST: commands, guilds

    def _command(self, app: str, guild: str | None, spec: Mapping[str, Any]) -> dict[str, Any]:
        existing = next(
            (
                c
                for c in self.commands.get(guild, [])
                if c["name"] == spec.get("name") and c["type"] == spec.get("type", 1)
            ),
            None,
        )
        command = {
            "id": existing["id"] if existing else p.snowflake(),
            "application_id": app,
            "version": p.snowflake(),
            "default_member_permissions": None,
            "type": 1,
            "description": "",
            "dm_permission": True,
            "contexts": None,
            "integration_types": [0],
            "nsfw": False,
            "options": [],
            **dict(spec),
        }
        if guild is not None:
            command["guild_id"] = guild
        return command

    async def _r_get_commands(self, call: Call, app: str, guild: str | None = None) -> Reply:
        if app != self.app_id:
            return _error(403, 50001, "Missing Access")
        return 200, copy.deepcopy(self.commands.get(guild, []))

    async def _r_put_commands(self, call: Call, app: str, guild: str | None = None) -> Reply:
        if app != self.app_id:
            return _error(403, 50001, "Missing Access")
        if guild is not None and guild not in self.guilds:
            return _error(403, 50001, "Missing Access")
        specs = call.json if isinstance(call.json, list) else []
        commands = [self._command(app, guild, spec) for spec in specs]
        self.commands[guild] = commands
        return 200, copy.deepcopy(commands)

    async def _r_upsert_command(self, call: Call, app: str, guild: str | None = None) -> Reply:
        if app != self.app_id:
            return _error(403, 50001, "Missing Access")
        command = self._command(app, guild, dict(call.json or {}))
        commands = [c for c in self.commands.get(guild, []) if c["id"] != command["id"]]
        self.commands[guild] = [*commands, command]
        return 201, copy.deepcopy(command)

    def _roles(self, guild: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(r) for r in self.guilds[guild]["roles"].values()]

    async def _r_get_guild(self, call: Call, guild: str) -> Reply:
        if guild not in self.guilds:
            return _unknown("Guild", 10004)
        spec = self.guilds[guild]
        data = p.guild_object(guild, name=spec["name"], roles=self._roles(guild))
        data["owner_id"] = spec["owner_id"]
        if _truthy(call.query.get("with_counts")):
            data["approximate_member_count"] = self._member_count(guild)
            data["approximate_presence_count"] = 1
        return 200, data

    async def _r_get_roles(self, call: Call, guild: str) -> Reply:
        if guild not in self.guilds:
            return _unknown("Guild", 10004)
        return 200, self._roles(guild)

    async def _r_get_guild_channels(self, call: Call, guild: str) -> Reply:
        if guild not in self.guilds:
            return _unknown("Guild", 10004)
        return 200, [copy.deepcopy(self.channels[c]) for c in self.guilds[guild]["channel_ids"]]

    async def _r_get_member(self, call: Call, guild: str, user: str) -> Reply:
        if guild not in self.guilds:
            return _unknown("Guild", 10004)
        member = self.member_object(guild, user)
        return (200, member) if member is not None else _unknown("Member", 10007)

    def _member_count(self, guild: str) -> int:
        return sum(1 for g, _ in self.members if g == guild)

    # ----------------------------------------------------------------- gateway

    def _guild_create(self, guild: str, intents: int) -> dict[str, Any]:
        spec = self.guilds[guild]
        users = [u for (g, u) in self.members if g == guild and (u == self.bot_id or intents & 2)]
        threads = [
            c
            for c in self.channels.values()
            if c.get("guild_id") == guild
            and c.get("type") in p.THREAD_TYPES
            and not c["thread_metadata"]["archived"]
        ]
        return p.guild_create(
            guild,
            name=spec["name"],
            channels=[self.channels[c] for c in spec["channel_ids"]],
            threads=[{k: v for k, v in t.items() if k != "newly_created"} for t in threads],
            roles=self._roles(guild),
            members=[m for u in users if (m := self.member_object(guild, u)) is not None],
            member_count=self._member_count(guild),
            owner_id=spec["owner_id"],
        )

    async def _send(self, conn: _Connection, payload: dict[str, Any]) -> None:
        async with conn.lock:
            await self._send_locked(conn, payload)

    async def _send_locked(self, conn: _Connection, payload: dict[str, Any]) -> None:
        if conn.ws.closed:
            return
        text = json.dumps(payload, separators=(",", ":"))
        self.gateway_sent.append(payload)
        try:
            if conn.compressor is not None:
                frame = conn.compressor.compress(text.encode()) + conn.compressor.flush(
                    zlib.Z_SYNC_FLUSH
                )
                await conn.ws.send_bytes(frame)
            else:
                await conn.ws.send_str(text)
        except ConnectionError:
            return

    async def _send_dispatch(self, conn: _Connection, event: str, data: dict[str, Any]) -> int:
        async with conn.lock:
            session = conn.session
            assert session is not None
            data = self._filter_content(event, data, session.intents)
            session.seq += 1
            payload = {"op": OP_DISPATCH, "t": event, "s": session.seq, "d": data}
            session.log.append(payload)
            await self._send_locked(conn, payload)
            seq = session.seq
        await self._notify()
        return seq

    def _filter_content(self, event: str, data: dict[str, Any], intents: int) -> dict[str, Any]:
        if (
            not self.enforce_message_content
            or event not in ("MESSAGE_CREATE", "MESSAGE_UPDATE")
            or intents & INTENT_MESSAGE_CONTENT
            or "guild_id" not in data
            or (data.get("author") or {}).get("id") == self.bot_id
            or any(m.get("id") == self.bot_id for m in data.get("mentions") or [])
        ):
            return data
        return {**data, "content": "", "embeds": [], "attachments": [], "components": []}

    async def _echo(self, event: str, data: dict[str, Any], intent: int) -> None:
        if not self.echo:
            return
        for conn in list(self._connections):
            if conn.ready and conn.session is not None and conn.session.intents & intent:
                await self._send_dispatch(conn, event, copy.deepcopy(data))

    def _observe(self, event: str, data: dict[str, Any]) -> None:
        guild = data.get("guild_id")
        author = data.get("author") or (data.get("member") or {}).get("user") or data.get("user")
        if isinstance(author, Mapping) and author.get("id"):
            self.users.setdefault(str(author["id"]), dict(author))
            member = data.get("member")
            if guild is not None and isinstance(member, Mapping):
                self.members.setdefault(
                    (str(guild), str(author["id"])), {"roles": list(member.get("roles", []))}
                )
        if event in ("MESSAGE_CREATE", "MESSAGE_UPDATE"):
            message = {k: v for k, v in data.items() if k not in ("guild_id", "member")}
            channel = str(message["channel_id"])
            existing = self.message(channel, str(message["id"]))
            if existing is not None:
                existing.update(message)
            elif event == "MESSAGE_CREATE":
                self._store(message)
        elif event == "MESSAGE_DELETE":
            found = self.message(str(data["channel_id"]), str(data["id"]))
            if found is not None:
                self._forget(found)
        elif event == "INTERACTION_CREATE":
            self.interactions[str(data["id"])] = {
                "id": str(data["id"]),
                "token": data["token"],
                "payload": data,
                "channel_id": str(data.get("channel_id") or data.get("channel", {}).get("id")),
                "guild_id": guild,
                "response_type": None,
                "responses": [],
                "original": None,
                "followups": [],
                "card": None,
            }
        elif event in ("THREAD_CREATE", "THREAD_UPDATE", "CHANNEL_CREATE", "CHANNEL_UPDATE"):
            channel_data = {k: v for k, v in data.items() if k != "newly_created"}
            known = self.channels.get(str(data["id"]))
            if known is not None:
                known.update(channel_data)
            else:
                self.channels[str(data["id"])] = channel_data
                if event.startswith("CHANNEL") and guild in self.guilds:
                    self.guilds[str(guild)]["channel_ids"].append(str(data["id"]))
        elif event in ("GUILD_MEMBER_ADD", "GUILD_MEMBER_UPDATE") and guild is not None:
            user = data.get("user") or {}
            self.members[(str(guild), str(user.get("id")))] = {"roles": list(data.get("roles", []))}

    async def _handle_gateway(self, request: web.Request) -> web.StreamResponse:
        if self.gateway_refused:
            self.gateway_refusals += 1
            return web.Response(status=503, text="gateway unavailable (test)")
        ws = web.WebSocketResponse(max_msg_size=0, heartbeat=None)
        await ws.prepare(request)
        compress = request.query.get("compress") == "zlib-stream" and self.gateway_compress
        conn = _Connection(ws, zlib.compressobj() if compress else None)
        self.gateway_queries.append(dict(request.query))
        self._connections.append(conn)
        self.gateway_connections += 1
        await self._notify()
        try:
            if request.query.get("encoding", "json") != "json":
                await ws.close(code=4002, message=b"Error while decoding payload.")
                return ws
            await self._send(
                conn,
                {
                    "op": OP_HELLO,
                    "d": {
                        "heartbeat_interval": self.heartbeat_interval_ms,
                        "_trace": ['["fake-gateway",{"micros":0}]'],
                    },
                    "s": None,
                    "t": None,
                },
            )
            async for msg in ws:
                if msg.type is not WSMsgType.TEXT:
                    continue
                try:
                    frame = json.loads(msg.data)
                except ValueError:
                    await ws.close(code=4002, message=b"Error while decoding payload.")
                    break
                self.gateway_received.append(frame)
                await self._on_frame(conn, frame)
                await self._notify()
        finally:
            conn.ready = False
            self._connections.remove(conn)
            self.gateway_closes.append(ws.close_code)
            await self._notify()
        return ws

    async def _on_frame(self, conn: _Connection, frame: Any) -> None:
        if not isinstance(frame, dict):
            return
        op, data = frame.get("op"), frame.get("d")
        if op == OP_HEARTBEAT:
            self.heartbeats.append(time.monotonic())
            if self.ack_heartbeats:
                await self._send(conn, {"op": OP_HEARTBEAT_ACK, "d": None, "s": None, "t": None})
                self.heartbeat_acks += 1
        elif op == OP_IDENTIFY:
            await self._identify(conn, data if isinstance(data, dict) else {})
        elif op == OP_RESUME:
            await self._resume(conn, data if isinstance(data, dict) else {})
        elif op == OP_REQUEST_MEMBERS:
            await self._members_chunk(conn, data if isinstance(data, dict) else {})
        elif op == OP_PRESENCE_UPDATE:
            self.presences.append(data)
        elif conn.session is None:
            await conn.ws.close(code=4003, message=b"Not authenticated.")

    async def _identify(self, conn: _Connection, data: dict[str, Any]) -> None:
        if conn.session is not None:
            await conn.ws.close(code=4005, message=b"Already authenticated.")
            return
        self.identifies.append(data)
        if self.token is not None and data.get("token") != self.token:
            await conn.ws.close(code=4004, message=b"Authentication failed.")
            return
        intents = int(data.get("intents", 0))
        if intents & self.disallowed_intents & PRIVILEGED_INTENTS:
            await conn.ws.close(code=4014, message=b"Disallowed intent(s).")
            return
        session = _Session(uuid.uuid4().hex, intents)
        self._sessions[session.id] = session
        conn.session = session
        ready = p.ready(
            bot=self.bot,
            guild_ids=list(self.guilds),
            session_id=session.id,
            resume_gateway_url=self.gateway_url,
            app_id=self.app_id,
            shard=data.get("shard"),
        )
        await self._send_dispatch(conn, "READY", ready)
        if intents & INTENT_GUILDS:
            for guild in list(self.guilds):
                await self._send_dispatch(conn, "GUILD_CREATE", self._guild_create(guild, intents))
        conn.ready = True

    async def _resume(self, conn: _Connection, data: dict[str, Any]) -> None:
        self.resumes.append(data)
        session = self._sessions.get(str(data.get("session_id")))
        if session is None or (self.token is not None and data.get("token") != self.token):
            await self._send(conn, {"op": OP_INVALID_SESSION, "d": False, "s": None, "t": None})
            return
        conn.session = session
        last = int(data.get("seq") or 0)
        async with conn.lock:
            for payload in session.log:
                if payload["s"] > last:
                    await self._send_locked(conn, payload)
        await self._send_dispatch(conn, "RESUMED", {"_trace": ['["fake-gateway",{}]']})
        conn.ready = True

    async def _members_chunk(self, conn: _Connection, data: dict[str, Any]) -> None:
        guild = str(data.get("guild_id"))
        if conn.session is None or guild not in self.guilds:
            return
        wanted = {str(u) for u in data.get("user_ids") or []}
        query = str(data.get("query") or "").lower()
        members = []
        for g, user_id in list(self.members):
            if g != guild or (wanted and user_id not in wanted):
                continue
            member = self.member_object(guild, user_id)
            if member is None or not member["user"]["username"].lower().startswith(query):
                continue
            members.append(member)
        limit = int(data.get("limit") or 0)
        if limit:
            members = members[:limit]
        chunk: dict[str, Any] = {
            "guild_id": guild,
            "members": members,
            "chunk_index": 0,
            "chunk_count": 1,
            "not_found": sorted(wanted - {m["user"]["id"] for m in members}),
        }
        if data.get("nonce") is not None:
            chunk["nonce"] = data["nonce"]
        if data.get("presences"):
            chunk["presences"] = []
        await self._send_dispatch(conn, "GUILD_MEMBERS_CHUNK", chunk)


def _matches(call: Call, method: str, pattern: str | re.Pattern[str]) -> bool:
    if method not in ("*", "") and call.method != method.upper():
        return False
    return re.fullmatch(pattern, call.path) is not None


def _respond(reply: Reply, headers: Mapping[str, str]) -> web.Response:
    status, body = reply
    all_headers = {"Via": "1.1 google", **headers}
    if body is None:
        return web.Response(status=status, headers=all_headers)
    # bytes + bare content type: discord.py compares the header to "application/json" exactly
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers=all_headers,
    )


async def _read_body(request: web.Request) -> tuple[Any, list[dict[str, Any]]]:
    if not request.can_read_body:
        return None, []
    if request.content_type.startswith("multipart/"):
        payload: Any = None
        files: list[dict[str, Any]] = []
        reader = await request.multipart()
        while True:
            part = await reader.next()
            if part is None:
                break
            if not isinstance(part, BodyPartReader):
                continue  # a nested multipart: discord.py never sends one
            if part.name == "payload_json":
                payload = json.loads(await part.text())
            else:
                data = await part.read()
                files.append(
                    {
                        "field": part.name,
                        "filename": part.filename or str(part.name),
                        "content_type": part.headers.get("Content-Type", ""),
                        "size": len(data),
                        "data": bytes(data),
                    }
                )
        return payload, files
    text = await request.text()
    if not text.strip():
        return None, []
    try:
        return json.loads(text), []
    except ValueError:
        return text, []


@contextlib.contextmanager
def patched_route_base(fake: FakeDiscord) -> Iterator[None]:
    """Point discord.py at ``fake`` for the block: ``discord.http.Route.BASE`` (all REST,
    webhooks and interaction callbacks included) and
    ``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY`` (where a non-sharded
    ``discord.Client`` connects; it never asks ``GET /gateway/bot``). Restores both after."""
    import yarl
    from discord.gateway import DiscordWebSocket
    from discord.http import Route

    old_base, old_gateway = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    Route.BASE = fake.api_url
    DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(fake.gateway_url)
    try:
        yield
    finally:
        Route.BASE = old_base
        DiscordWebSocket.DEFAULT_GATEWAY = old_gateway
