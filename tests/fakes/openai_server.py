"""A local fake OpenAI-compatible server (``POST /v1/chat/completions``) playing a script.

In-process: ``async with FakeOpenAI(script) as fake: ... fake.base_url``.
As a process (crash tests): ``python -m tests.fakes.openai_server --port-file F --log FILE
--script SCRIPT.yaml``; every request body is appended to the log as one JSON line before it
is answered, so another process can count requests even after the client was killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web
from msgspec.structs import replace

from bot.domain import AssistantTurn
from bot.llm.scripted import Reply, Script, load_script, parse_script, reply_turn

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Canned:
    """An answer that takes precedence over the script for one request.

    Waits ``delay`` seconds, then answers ``status`` with ``body`` (JSON) or ``raw`` (text, or
    bytes sent as they are, invalid UTF-8 included; as ``content_type``); with ``status`` None
    it answers the scripted reply after the delay (a slow server). ``chunked`` sends the body
    without a Content-Length, in pieces; with ``cut_after`` it drops the connection after that
    many bytes of it; ``pad`` bytes of spaces follow the body (JSON still), made as they are
    sent; ``gzip`` compresses it as it is sent (a proxy's ``Content-Encoding: gzip``).
    """

    status: int | None = 500
    delay: float = 0.0
    body: Any = None
    raw: str | bytes | None = None
    content_type: str = "text/plain"
    chunked: bool = False
    cut_after: int | None = None
    pad: int = 0
    gzip: bool = False
    # A tiny Retry-After keeps the client's retry backoff from slowing tests down.
    headers: Mapping[str, str] = field(default_factory=lambda: {"retry-after-ms": "1"})


def non_json_200(text: str = '{"choices": [') -> Canned:
    """A 200 that claims to be JSON but is not (a proxy, a crashed worker, a cut body)."""
    return Canned(status=200, raw=text, content_type="application/json")


def chat_completion(
    text: str | None = None,
    calls: Sequence[tuple[str | None, str, str]] = (),
) -> dict[str, Any]:
    """A ``chat.completion`` body with exactly these tool calls: (id or None, name, arguments).

    Unlike scripted replies, ids are taken as given, so duplicates and missing ids can be sent.
    """
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {
                **({"id": call_id} if call_id is not None else {}),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            for call_id, name, arguments in calls
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def function_call_completion(
    name: str, arguments: str, *, response_id: str = "chatcmpl-legacy"
) -> dict[str, Any]:
    """A ``chat.completion`` in the legacy shape (older vLLM, LocalAI, some proxies): one
    ``message.function_call`` and finish reason ``function_call``, no ``tool_calls``."""
    body = chat_completion()
    body["id"] = response_id
    choice = body["choices"][0]
    choice["message"]["function_call"] = {"name": name, "arguments": arguments}
    choice["finish_reason"] = "function_call"
    return body


def huge_reply(size: int, *, chunked: bool = False) -> Canned:
    """A 200 whose body is a valid completion of about ``size`` bytes (a runaway model)."""
    return Canned(status=200, body=chat_completion(text="x" * size), chunked=chunked)


def error_body(status: int) -> dict[str, Any]:
    """An OpenAI-style error body for a status code."""
    return {
        "error": {
            "message": f"fake server error {status}",
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": None,
            "code": None,
        }
    }


# OpenAI's answer for an account whose credit or monthly limit is spent, word for word.
QUOTA_MESSAGE = (
    "You exceeded your current quota, please check your plan and billing details. For more"
    " information on this error, read the docs:"
    " https://platform.openai.com/docs/guides/error-codes/api-errors."
)


def insufficient_quota(
    message: str = QUOTA_MESSAGE, headers: Mapping[str, str] | None = None
) -> Canned:
    """OpenAI's 429 for an exhausted quota: a rate limit's status, but no wait ends it."""
    body = {
        "error": {
            "message": message,
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
    return Canned(status=429, body=body, headers={"retry-after-ms": "1", **(headers or {})})


def account_error(
    status: int,
    message: str,
    *,
    kind: str | None = None,
    code: str | int | None = None,
    headers: Mapping[str, str] | None = None,
) -> Canned:
    """Another provider's refusal of an account (out of credit, or only rate limited), in
    OpenAI's error shape with its own words; no Retry-After unless given, as they send it."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return Canned(status=status, body=body, headers=dict(headers or {}))


class FakeOpenAI:
    """The fake server; replies are picked by the number of assistant messages in a request.

    With ``hang`` every request is read and then never answered until the server stops.
    """

    def __init__(
        self,
        script: Script | Sequence[Reply | Mapping[str, Any]] = (),
        *,
        canned: Sequence[Canned] = (),
        delay: float = 0.0,
        hang: bool = False,
        log_path: str | Path | None = None,
        port: int = 0,
    ) -> None:
        self.script = (
            script
            if isinstance(script, Script)
            else parse_script(list(script), name="fake", source="<fake>")
        )
        self.requests: list[dict[str, Any]] = []
        # The bytes each chunked answer wrote before it ended or the client went away.
        self.sent: list[int] = []
        # Each request's headers, names lower-cased, in the order the requests arrived.
        self.headers: list[dict[str, str]] = []
        self.delay = delay
        self.hang = hang
        self._stopping = asyncio.Event()
        self._canned: deque[Canned] = deque(canned)
        self._log_path = Path(log_path) if log_path else None
        self._port = port
        self._runner: web.AppRunner | None = None

    @property
    def count(self) -> int:
        """How many requests arrived."""
        return len(self.requests)

    @property
    def port(self) -> int:
        """The listening port (ephemeral unless one was given)."""
        return self._port

    @property
    def base_url(self) -> str:
        """The ``base_url`` for ``AsyncOpenAI``."""
        return f"http://{HOST}:{self._port}/v1"

    def add_canned(self, *answers: Canned) -> None:
        """Queue answers for the next requests, in order."""
        self._canned.extend(answers)

    async def start(self) -> None:
        """Listen on 127.0.0.1."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, self._port))
        self._port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        """Stop listening."""
        # Hanging handlers return first, or cleanup would wait for them.
        self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeOpenAI:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append({name.lower(): value for name, value in request.headers.items()})
        self._log(body)
        if self.hang:
            await self._stopping.wait()
            return web.Response(status=503)
        canned = self._canned.popleft() if self._canned else None
        delay = canned.delay if canned else self.delay
        if delay:
            # Cut short when the server stops: a slow reply would otherwise hold up its stop.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
        if canned is not None and canned.status is not None:
            return await _canned_response(canned, request, self.sent)
        return _json(completion_body(self.script, body, self.count))

    def _log(self, body: dict[str, Any]) -> None:
        if self._log_path is None:
            return
        # Open, write, close per request: the line is on disk for other processes at once.
        with self._log_path.open("a", encoding="utf-8") as log:
            log.write(json.dumps(body) + "\n")
            log.flush()


def _json(
    payload: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(payload),
        content_type="application/json",
        headers=dict(headers or {}),
    )


async def _canned_response(
    canned: Canned, request: web.Request, sent: list[int]
) -> web.StreamResponse:
    assert canned.status is not None
    if canned.chunked:
        return await _chunked(canned, request, sent)
    if canned.raw is not None:
        text, raw = (None, canned.raw) if isinstance(canned.raw, bytes) else (canned.raw, None)
        return web.Response(
            status=canned.status,
            text=text,
            body=raw,
            content_type=canned.content_type,
            headers=dict(canned.headers),
        )
    body = canned.body if canned.body is not None else error_body(canned.status)
    return _json(body, canned.status, canned.headers)


_CHUNK = 64 * 1024


async def _chunked(canned: Canned, request: web.Request, sent: list[int]) -> web.StreamResponse:
    """The body in pieces with no Content-Length, so a client cannot know its size up front."""
    assert canned.status is not None
    raw = canned.raw if canned.raw is not None else json.dumps(canned.body)
    data = raw if isinstance(raw, bytes) else raw.encode()
    response = web.StreamResponse(status=canned.status, headers=dict(canned.headers))
    response.content_type = "application/json" if canned.raw is None else canned.content_type
    response.enable_chunked_encoding()
    if canned.gzip:
        response.enable_compression(web.ContentCoding.gzip)
    await response.prepare(request)
    if canned.cut_after is not None:
        data = data[: canned.cut_after]
    written = 0
    try:
        for piece in _pieces(data, canned.pad):
            await response.write(piece)
            written += len(piece)
        if canned.cut_after is not None and request.transport is not None:
            request.transport.close()  # no final chunk: the client sees a broken body
            return response
        await response.write_eof()
    except ConnectionError:
        pass  # the client gave up reading, as a capped client should
    finally:
        sent.append(written)
    return response


def _pieces(data: bytes, pad: int) -> Iterator[bytes]:
    """``data``, then ``pad`` spaces, in pieces of at most ``_CHUNK`` bytes."""
    for start in range(0, len(data), _CHUNK):
        yield data[start : start + _CHUNK]
    spaces = b" " * _CHUNK
    for start in range(0, pad, _CHUNK):
        yield spaces[: min(_CHUNK, pad - start)]


def completion_body(script: Script, request: dict[str, Any], serial: int) -> dict[str, Any]:
    """A realistic ``chat.completion`` for the scripted reply this request's position calls for."""
    messages = request.get("messages") or []
    index = sum(1 for m in messages if m.get("role") == "assistant")
    turn = reply_turn(
        script,
        index,
        latest_input=_latest_input(messages),
        prompt_chars=len(json.dumps(messages)),
    )
    turn = _with_prompt(turn, _first_user_text(messages))
    return {
        "id": f"chatcmpl-fake-{serial}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "fake"),
        "system_fingerprint": "fake",
        "choices": [
            {
                "index": 0,
                "message": _wire_message(turn),
                "logprobs": None,
                "finish_reason": turn.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": turn.usage.input_tokens,
            "completion_tokens": turn.usage.output_tokens,
            "total_tokens": turn.usage.total,
        },
    }


PROMPT_MARK = "$PROMPT"


def _with_prompt(turn: AssistantTurn, prompt: str) -> AssistantTurn:
    """``$PROMPT`` in a scripted call's arguments becomes the run's first user text, so one
    script can drive many runs whose effects stay distinguishable."""
    if not any(PROMPT_MARK in call.arguments for call in turn.calls):
        return turn
    calls = tuple(
        replace(call, arguments=call.arguments.replace(PROMPT_MARK, prompt)) for call in turn.calls
    )
    return replace(turn, calls=calls)


def _first_user_text(messages: Sequence[dict[str, Any]]) -> str:
    return next((_content_text(m.get("content")) for m in messages if m.get("role") == "user"), "")


def _wire_message(turn: AssistantTurn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text, "refusal": None}
    if turn.calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in turn.calls
        ]
    return message


def _latest_input(messages: Sequence[dict[str, Any]]) -> str:
    """The trailing tool results, or else the newest user text (what ``expect`` checks)."""
    tool_outputs: list[str] = []
    for message in reversed(messages):
        role = message.get("role")
        if role == "tool":
            tool_outputs.insert(0, _content_text(message.get("content")))
            continue
        if tool_outputs:
            break
        if role == "user":
            return _content_text(message.get("content"))
    return "\n".join(tool_outputs)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _write_port(path: Path, port: int) -> None:
    """Write atomically so a test polling for the file never reads half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(port), encoding="utf-8")
    os.replace(tmp, path)


async def _serve(args: argparse.Namespace) -> None:
    script = load_script(args.script) if args.script else Script(name="fake")
    canned = [Canned(status=status) for status in args.fail]
    async with FakeOpenAI(
        script,
        canned=canned,
        delay=args.delay,
        hang=args.hang,
        log_path=args.log,
        port=args.port,
    ) as fake:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if args.port_file:
            _write_port(Path(args.port_file), fake.port)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    """Run the fake as a process until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--script", help="YAML script (the scripted provider's format)")
    parser.add_argument("--port", type=int, default=0, help="port (default: ephemeral)")
    parser.add_argument("--port-file", help="write the listening port here once ready")
    parser.add_argument("--log", help="append each request body here as one JSON line")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each reply")
    parser.add_argument("--hang", action="store_true", help="never answer any request")
    parser.add_argument(
        "--fail",
        type=int,
        action="append",
        default=[],
        help="answer the next request with this status (repeatable)",
    )
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
