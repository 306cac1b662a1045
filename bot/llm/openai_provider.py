"""The OpenAI-compatible provider: Chat Completions with tools through ``AsyncOpenAI``."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Collection, Mapping, Sequence
from http import HTTPStatus
from typing import Any, Final, cast
from urllib.parse import urlsplit

import openai
from openai import AsyncAPIResponse, AsyncOpenAI
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)

from bot.digest import sha256
from bot.domain import AssistantTurn, Reasoning, ToolCall, Usage
from bot.llm.base import (
    AssistantMessage,
    Message,
    ModelError,
    Notice,
    SystemMessage,
    ToolResultsMessage,
    ToolSpec,
    UserMessage,
    unique_call_ids,
)
from bot.llm.error_body import error_message
from bot.llm.http_client import http_client
from bot.llm.reply_words import words
from bot.llm.retry import MAX_SERVER_WAIT, backoff, out_of_quota, retryable, server_wait
from bot.llm.streamed import REASONING_FIELDS, EndedEarly, NotAStream, assembled, is_stream
from bot.llm.text_calls import text_calls
from bot.text import flattened, password_masked
from bot.user_agent import USER_AGENT

log = logging.getLogger("kestrel.llm")

PROVIDER = "openai"
OPENAI_API = "https://api.openai.com/v1"
# Local servers (Ollama, vLLM, LM Studio) ignore the key, but the client insists on one.
KEYLESS_PLACEHOLDER = "not-needed"
MISSING_KEY = (
    "OPENAI_API_KEY is not set: set it, or set OPENAI_BASE_URL alone for a local"
    " OpenAI-compatible server that needs no key"
)
# Said whatever the server's own words were: a proxy may keep OpenAI's code and not its message.
QUOTA_HINT = (
    "the account's quota is used up: check its plan and billing (the account of"
    " OPENAI_API_KEY); trying again cannot help"
)
_DETAIL_CHARS = 200
# Local servers load a model on its first request, which can outlast the default timeout.
SLOW_MODEL = "a slow model may need a longer model.timeout"
# Nothing answered: a local server not started, a mistyped address, or no route to OpenAI.
UNREACHABLE = "is the server running there? check OPENAI_BASE_URL"
UNREACHABLE_OPENAI = "check this host's network, or its proxy (HTTPS_PROXY)"
# A 200 that is no completion at all: a web server, a proxy's page or another service is there.
NOT_THE_API = (
    "OPENAI_BASE_URL answers, but not as an OpenAI-compatible API: point it at the server's"
    " API (most answer under /v1)"
)
_HINTS = {
    401: "check OPENAI_API_KEY",
    403: "check OPENAI_API_KEY and the model's access",
    404: "check the model name (model.name: {model}) and OPENAI_BASE_URL",
    # No POST taken there at all: a static web server (501) or a page behind a proxy (405).
    405: NOT_THE_API,
    429: "rate limited or out of quota",
    501: NOT_THE_API,
}
# A key refused when none was set: the client sent its placeholder.
NO_KEY_SENT = "OPENAI_API_KEY is not set, and this server wants one: set it"
# The largest legitimate reply (about 128k output tokens, JSON-escaped) stays under 4 MiB,
# while a runaway server's body is refused before it costs a parse, a journal row and a copy.
DEFAULT_MAX_REPLY_BYTES = 4 * 1024 * 1024
# Below this not even an empty completion fits; a smaller cap is a configuration mistake.
MIN_REPLY_BYTES = 1024


class OpenAIProvider:
    """A ``ModelProvider`` for any OpenAI-compatible Chat Completions server."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None,
        base_url: str | None,
        max_retries: int = 2,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        client: AsyncOpenAI | None = None,
    ) -> None:
        if max_reply_bytes < MIN_REPLY_BYTES:
            raise ValueError(f"max_reply_bytes must be at least {MIN_REPLY_BYTES}")
        self._model = model
        self._keyless = client is None and not api_key
        self._max_retries = max_retries
        self._max_reply_bytes = max_reply_bytes
        # Retries are the provider's (``_post_retrying``): the client's would sleep into the
        # call's timeout on a long Retry-After and then say only that time ran out.
        if client is not None:
            self._client = client.with_options(max_retries=0)
            return
        if not api_key and not base_url:
            raise ModelError(MISSING_KEY)
        self._client = AsyncOpenAI(
            api_key=api_key or KEYLESS_PLACEHOLDER,
            # Never None: the client would read OPENAI_BASE_URL again, and take an empty one
            # (which the settings read as unset) for the URL.
            base_url=base_url or OPENAI_API,
            max_retries=0,
            http_client=http_client(),
            # The client's own name and version stay, after ours, for whoever reads the logs.
            default_headers={"User-Agent": f"{USER_AGENT} AsyncOpenAI/Python {openai.__version__}"},
        )

    @property
    def provider(self) -> str:
        """Always ``openai``."""
        return PROVIDER

    @property
    def model(self) -> str:
        """The model's name as the server knows it."""
        return self._model

    @property
    def base_url(self) -> str:
        """Where requests go, without the trailing slash, as messages name it: a password in
        it (a proxy's basic auth) shows as ``***``, since a run's error quotes this URL to its
        thread, its page and the journal."""
        return password_masked(str(self._client.base_url), "***").rstrip("/")

    async def aclose(self) -> None:
        """Close the HTTP connections the client holds."""
        await self._client.close()

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        timeout: float,
        *,
        notice: Notice | None = None,
    ) -> AssistantTurn:
        """One Chat Completions call within ``timeout``; a failure is a one-line ``ModelError``;
        each retry's wait is a warning, and a line to ``notice``."""
        if timeout <= 0:
            raise ModelError(
                f"model call failed: no time left for it (timeout {_seconds(timeout)})"
            )
        failed: list[_Failure] = []
        try:
            # The client's own timeout is per attempt; this bounds retries and backoff as well,
            # so the loop's min(model timeout, time left) really is the most the call takes.
            async with asyncio.timeout(timeout):
                turn = await self._post_retrying(messages, tools, timeout, failed, notice)
        except TimeoutError:
            raise ModelError(self._timed_out(timeout, failed)) from None
        except _GaveUp as exc:
            raise ModelError(self._describe(exc, timeout)) from exc.error
        except _ReadFailed as exc:
            raise ModelError(f"model call failed: the reply from {self.base_url} {exc}") from None
        except _BadShape as exc:
            hint = f" — {NOT_THE_API}" if exc.not_the_api else ""
            raise ModelError(
                f"model call failed: bad response from {self.base_url}: {exc}{hint}"
            ) from None
        return self._with_unique_ids(turn, messages)

    def _turn(self, body: bytes, tools: Sequence[ToolSpec]) -> AssistantTurn:
        """The reply a 200's body holds; ``_BadShape`` if it holds none, ``_FailedReply`` if
        the server says the model failed while it wrote it."""
        # Scrubbed before any of it is quoted: a preview cut mid-key would keep part of it.
        data = decode_body(_scrub_body(body, self._client.api_key))
        return parse_completion(data, {tool.name: tool.parameters for tool in tools})

    async def _post_retrying(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        timeout: float,
        failed: list[_Failure],
        notice: Notice | None,
    ) -> AssistantTurn:
        """The reply, trying again as the server allows and the time left does; each failed
        attempt is added to ``failed``, and the last one raised as ``_GaveUp``."""
        wire_messages, wire_tools = to_wire_messages(messages), to_wire_tools(tools)
        clock = asyncio.get_running_loop().time
        deadline = clock() + timeout
        while True:
            try:
                # At least a moment: the whole call's bound (asyncio.timeout) is what ends it.
                body = await self._post(wire_messages, wire_tools, max(deadline - clock(), 0.001))
            except _BrokeOff as exc:
                # The connection dropped mid-reply, as it may before one: nothing of it was
                # kept, so asking again asks nothing twice.
                failed.append(exc)
            except _ReadFailed:
                raise
            except openai.APITimeoutError:
                # The attempt had all the time left: the whole call timed out, whichever of
                # the two timeouts noticed first.
                raise TimeoutError from None
            except openai.OpenAIError as exc:
                failed.append(exc)
            # The client wraps only some transport errors: an error page it cannot decode, or a
            # socket it cannot open, comes out raw; a failed attempt all the same, never a panic.
            except Exception as exc:
                failed.append(_Unusable(exc))
            else:
                try:
                    return self._turn(body, tools)
                except _FailedReply as exc:  # the model failed while it wrote it: as a cut one
                    failed.append(exc)
            wait = self._retry_wait(failed[-1], len(failed), deadline - clock())
            said = self._retrying(failed[-1], len(failed), wait, timeout)
            log.warning("%s", said)
            if notice is not None:  # people wait on the call: a rate limit can hold it a minute
                notice(f"model call: {said}")
            await asyncio.sleep(wait)

    def _retrying(self, exc: _Failure, retry: int, wait: float, timeout: float) -> str:
        cause = _scrub(_cause(exc, self.base_url, timeout, ""), self._client.api_key)
        return f"{cause}; trying again in {_seconds(wait)} (retry {retry} of {self._max_retries})"

    def _retry_wait(self, exc: _Failure, retry: int, left: float) -> float:
        """How long to wait before retry ``retry``; ``_GaveUp`` when there is to be none."""
        again = isinstance(exc, _Unusable | _BrokeOff | _FailedReply) or retryable(exc)
        if not again or retry > self._max_retries:
            raise _GaveUp(exc, retry - 1)
        asked = server_wait(exc) if isinstance(exc, openai.OpenAIError) else None
        if asked is not None and (asked > MAX_SERVER_WAIT or asked >= left):
            # Waiting would only run into the timeout: say now what the server said.
            raise _GaveUp(exc, retry - 1, asked=asked, left=left)
        return asked if asked else backoff(retry)

    async def _post(
        self,
        messages: list[ChatCompletionMessageParam],
        tools: list[ChatCompletionFunctionToolParam],
        timeout: float,
    ) -> bytes:
        """The 200 body's bytes, read no further than the cap (errors still raise as usual)."""
        # A streaming response leaves the body unread, so its size is checked before it is all
        # in memory; a status error still raises as the client's ``APIStatusError``.
        async with self._client.chat.completions.with_streaming_response.create(
            model=self._model,
            messages=messages,
            tools=tools if tools else openai.omit,
            timeout=timeout,
        ) as response:
            return await read_capped(response, self._max_reply_bytes)

    def _with_unique_ids(self, turn: AssistantTurn, messages: Sequence[Message]) -> AssistantTurn:
        unique = unique_call_ids(turn, messages)
        if unique is not turn:
            sent = _first_ids(turn.calls)
            kept = _first_ids(unique.calls)
            log.warning(
                "%s sent missing or repeated tool-call ids %s; kept %s", self.base_url, sent, kept
            )
        return unique

    def _timed_out(self, timeout: float, failed: Sequence[_Failure]) -> str:
        line = f"model call failed: timed out after {_seconds(timeout)} waiting for {self.base_url}"
        line += " (retries included)" if self._max_retries else ""
        if failed:  # time ran out on a retry: what the attempts before it got is the cause
            line += f"; before that: {_cause(failed[-1], self.base_url, timeout, '')}"
        else:
            line += f" — {SLOW_MODEL}"
        return _scrub(line, self._client.api_key)

    def _describe(self, gave_up: _GaveUp, timeout: float) -> str:
        """One readable line naming the cause, with the API key scrubbed out."""
        exc = gave_up.error
        line = f"model call failed: {_cause(exc, self.base_url, timeout, self._client.api_key)}"
        if gave_up.asked is not None:
            line += f" (the server asks to wait {_seconds(gave_up.asked)}, {gave_up.past()})"
        if gave_up.retries:
            line += f" (gave up after {_retries(gave_up.retries)})"
        hint = QUOTA_HINT if out_of_quota(exc) else self._hint(exc)
        if hint:
            line += f" — {hint}"
        return _scrub(line, self._client.api_key)

    def _hint(self, exc: _Failure) -> str:
        """What to check for a failure; a 404 from a base URL with no path is that path."""
        # A timeout is a connection error to the client, but something did answer.
        unreachable = not isinstance(exc, openai.APITimeoutError)
        if isinstance(exc, openai.APIConnectionError) and unreachable:
            return UNREACHABLE_OPENAI if self.base_url == OPENAI_API else UNREACHABLE
        moved = _redirected_to(exc)
        if moved:
            return moved
        status = getattr(exc, "status_code", 0)
        if status == HTTPStatus.NOT_FOUND and urlsplit(self.base_url).path in ("", "/"):
            return (
                "OPENAI_BASE_URL has no path: OpenAI-compatible servers answer under /v1"
                f" ({self.base_url}/v1)"
            )
        if self._keyless and status in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
            return NO_KEY_SENT
        return _HINTS.get(status, "").format(model=self._model)


def _redirected_to(exc: _Failure) -> str:
    """Where the server sent the request, when it redirected it (an http:// address a proxy
    moves to https://): what answered there is not what the address names, and a POST
    redirected so arrives as a GET; "" when it was not redirected."""
    response = exc.response if isinstance(exc, openai.APIStatusError) else None
    if response is None or not response.history:
        return ""
    where = password_masked(str(response.request.url), "***")
    said = f"the server redirected the request to {where}"
    base = where.removesuffix(_COMPLETIONS)
    if base != where:
        said += f": set OPENAI_BASE_URL to {base}"
    return said


_COMPLETIONS = "/chat/completions"


class _Unusable(Exception):
    """An attempt that failed with an error the client left unwrapped, named by its innermost
    cause (anyio wraps a socket's error in an exception group)."""

    def __init__(self, error: Exception) -> None:
        cause: BaseException = error
        while isinstance(cause, BaseExceptionGroup) and cause.exceptions:
            cause = cause.exceptions[0]
        super().__init__(f"{type(cause).__name__}: {flattened(str(cause))}".rstrip(": "))


class _GaveUp(Exception):
    """The last failed attempt, after ``retries`` retries; ``asked``: the wait the server asked
    for, when it was too long to wait for with ``left`` seconds of the call's time."""

    def __init__(
        self,
        error: _Failure,
        retries: int,
        *,
        asked: float | None = None,
        left: float = 0.0,
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.retries = retries
        self.asked = asked
        self.left = left

    def past(self) -> str:
        """Why the asked wait was not waited for."""
        if self.asked is not None and self.asked > MAX_SERVER_WAIT:
            return f"longer than Kestrel waits ({_seconds(MAX_SERVER_WAIT)})"
        return f"more than the {_seconds(max(self.left, 0.0))} left for this call"


# A looping model can send thousands of calls in one reply: its log line names the first ones.
_IDS_LOGGED = 10


def _first_ids(calls: Sequence[ToolCall]) -> str:
    """The first calls' ids as a list, and how many there are in all when there are more."""
    shown = repr([call.id for call in calls[:_IDS_LOGGED]])
    return shown if len(calls) <= _IDS_LOGGED else f"{shown[:-1]}, …] ({len(calls)} in all)"


def _retries(count: int) -> str:
    return "1 retry" if count == 1 else f"{count} retries"


def _cause(exc: _Failure, where: str, timeout: float, secret: str) -> str:
    if isinstance(exc, _Unusable):
        return f"no usable reply from {where} ({exc})"
    if isinstance(exc, _BrokeOff | _FailedReply):
        return f"the reply from {where} {exc}"
    if isinstance(exc, openai.APITimeoutError):
        return f"timed out after {_seconds(timeout)} waiting for {where}"
    if isinstance(exc, openai.APIConnectionError):
        reason = exc.__cause__ or exc
        return f"cannot connect to {where} ({type(reason).__name__}: {flattened(str(reason))})"
    if isinstance(exc, openai.APIStatusError):
        return f"{_status_line(exc.status_code)} from {where}{_server_detail(exc.body, secret)}"
    if isinstance(exc, openai.APIResponseValidationError):
        return f"bad response from {where}: {flattened(exc.message)}"
    return flattened(str(exc))


def _seconds(value: float) -> str:
    # A timeout cut to the run's remaining time is e.g. 3.99996; nobody needs the digits.
    return f"{round(value, 2):g}s"


def _status_line(code: int) -> str:
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


def _server_detail(body: object, secret: str = "") -> str:
    """The server's own error message, if it sent one, scrubbed and shortened to one line."""
    message = error_message(body)
    if not message.strip():
        return ""
    return f": {flattened(_scrub(message, secret))[:_DETAIL_CHARS]}"


def _scrub(text: str, secret: str) -> str:
    """Remove the key from a message; servers sometimes echo what they were sent."""
    if not _is_secret(secret):
        return text
    # Also as the HTTP client's refusal of its header quotes it (h11's "Illegal header value
    # b'Bearer sk-…\\n'", a key read with its line break): escaped, and without that break.
    for form in (secret, repr(secret.encode())[2:-1], secret.strip()):
        if _is_secret(form):
            text = text.replace(form, "***")
    return text


def _scrub_body(body: bytes, secret: str) -> bytes:
    """Remove the key from a body (a proxy's page, a 200 error echoing the request)."""
    if not _is_secret(secret):
        return body
    return body.replace(secret.encode(), b"***")


def _is_secret(secret: str) -> bool:
    return len(secret) >= 4 and secret != KEYLESS_PLACEHOLDER


def to_wire_messages(messages: Sequence[Message]) -> list[ChatCompletionMessageParam]:
    """The conversation in Chat Completions form; tool results become one ``tool`` message each."""
    wire: list[ChatCompletionMessageParam] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            wire.append({"role": "system", "content": message.text})
        elif isinstance(message, UserMessage):
            wire.append({"role": "user", "content": message.text})
        elif isinstance(message, AssistantMessage):
            wire.append(_assistant_message(message.turn))
        else:
            wire.extend(_tool_messages(message))
    return wire


def _assistant_message(turn: AssistantTurn) -> ChatCompletionMessageParam:
    if not turn.calls:
        return {"role": "assistant", "content": turn.text or ""}
    calls = [_wire_call(call) for call in turn.calls]
    # Calls the model wrote as text go back as calls alone: its template writes them as it
    # wrote them, and the text's markup beside them would show the model each call twice.
    message: dict[str, Any] = {"role": "assistant", "content": words(turn) or None}
    if turn.reasoning is not None:
        # DeepSeek's thinking mode refuses the next request (400) unless the reasoning of a
        # reply that called tools comes back with it; vLLM's templates write it back too.
        message[turn.reasoning.field] = turn.reasoning.text
    message["tool_calls"] = calls
    return cast(ChatCompletionMessageParam, message)


def _wire_call(call: ToolCall) -> ChatCompletionMessageFunctionToolCallParam:
    """A call as it goes back to the server, with whatever the server added to it."""
    wired: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    if call.extra_content:
        # Gemini 3 refuses the next request (400) unless each call it signed comes back with
        # its thought signature.
        wired["extra_content"] = json.loads(call.extra_content)
    return cast(ChatCompletionMessageFunctionToolCallParam, wired)


def _tool_messages(message: ToolResultsMessage) -> list[ChatCompletionMessageParam]:
    return [
        {"role": "tool", "tool_call_id": result.call_id, "content": result.output}
        for result in message.results
    ]


def to_wire_tools(tools: Sequence[ToolSpec]) -> list[ChatCompletionFunctionToolParam]:
    """Tool specs as Chat Completions function tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
        for tool in tools
    ]


class _BadShape(Exception):
    """The server answered 200 with something that is not a usable chat completion;
    ``not_the_api`` when it is not one at all (what is at the base URL is something else)."""

    def __init__(self, message: str, *, not_the_api: bool = False) -> None:
        super().__init__(message)
        self.not_the_api = not_the_api


class _ReadFailed(Exception):
    """The 200's body could not be had whole: over the cap, or the connection broke."""


class _BrokeOff(_ReadFailed):
    """The connection broke before the 200's body was all read: an attempt worth repeating."""


class _FailedReply(Exception):
    """A 200 whose reply was not finished: the server says the model failed (its finish
    reason), or its stream stopped before the reply did."""


# What one failed attempt left: the client's error, one it left unwrapped, a reply cut off, or
# one that failed.
_Failure = openai.OpenAIError | _Unusable | _BrokeOff | _FailedReply


async def read_capped(response: AsyncAPIResponse[Any], limit: int) -> bytes:
    """The whole body, or ``_ReadFailed`` as soon as it is known to exceed ``limit`` bytes."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _ReadFailed(_too_large(limit, f"it declared {int(declared)} bytes"))
    body = bytearray()
    try:
        # Decoded bytes are counted, so a compressed body cannot slip a huge reply past the cap.
        async for chunk in response.iter_bytes():
            body += chunk
            if len(body) > limit:
                raise _ReadFailed(_too_large(limit, "reading stopped there"))
    except _ReadFailed:
        raise
    # The body is read outside the client's retry loop, so its transport errors arrive raw, as
    # httpx or httpx2 types depending on the openai version; any of them means a broken reply.
    except Exception as exc:
        cause = f"{type(exc).__name__}: {flattened(str(exc))}".rstrip(": ")
        raise _BrokeOff(f"broke off after {len(body)} bytes ({cause})") from exc
    return bytes(body)


def _too_large(limit: int, how: str) -> str:
    return f"is larger than {limit} bytes (model.max_reply_bytes); {how}, nothing was kept"


def decode_body(body: bytes) -> object:
    """The body as JSON, or the completion its events make when the server streamed it;
    anything else (HTML from a proxy, a cut body) is a bad response."""
    if is_stream(body):
        try:
            return assembled(body)
        except EndedEarly as exc:  # the server's stream stopped mid-reply: as a cut body
            raise _FailedReply(f"was streamed, and {exc}") from None
        except NotAStream as exc:
            raise _BadShape(f"the server streamed its reply, and {exc}") from None
    try:
        # Leniently: a server may cut a character's bytes between tokens (invalid UTF-8) or
        # leave a control character unescaped, in a completion that is otherwise whole; the
        # answer keeps U+FFFD there rather than the run failing as if no API were there.
        text = body.decode(json.detect_encoding(body), errors="replace")
        return json.loads(text, strict=False)
    # RecursionError: deeply nested arrays, which json gives up on rather than parse.
    except (ValueError, RecursionError):
        raise _BadShape(
            f"expected a chat completion, got {_preview(body)}", not_the_api=True
        ) from None


def parse_completion(data: object, tools: Collection[str] = ()) -> AssistantTurn:
    """The first choice of a decoded completion as an ``AssistantTurn``; arguments stay raw.
    Calls the model wrote as text, each naming one of ``tools``, are its calls (``text_calls``;
    ``tools`` may map each name to its parameters' schema, as ``text_calls`` reads them)."""
    if not isinstance(data, Mapping):
        got = _JSON_KINDS.get(type(data), "no JSON object")
        raise _BadShape(f"expected a chat completion, got {got}", not_the_api=True)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        # Some compatible servers report failures as a 200 with an OpenAI-style error body.
        error = data.get("error")
        if error:
            raise _BadShape(f"the server answered 200 with an error{_server_detail(error)}")
        # An empty list is a completion with nothing in it, not another service's page.
        raise _BadShape("the completion has no choices", not_the_api="choices" not in data)
    choice = choices[0] if isinstance(choices[0], Mapping) else {}
    message = choice.get("message")
    if not isinstance(message, Mapping):
        raise _BadShape("the first choice has no message")
    text = content = _content_text(message.get("content"))
    refusal = message.get("refusal")
    if not text and isinstance(refusal, str) and refusal.strip():
        text = refusal  # the model declined: its reason is the answer, not an empty one
    text = valid_text(text) if text is not None else None
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise _BadShape("the message's tool_calls is not a list")
    calls = tuple(_tool_call(raw) for raw in raw_calls)
    finish = choice.get("finish_reason")
    # Any other JSON there is no reason (and a list or an object cannot be looked up in a set).
    finish = finish if isinstance(finish, str) else None
    if finish in _FAILED_MID_REPLY:
        # Its words stop where the model failed, and its calls may be cut: no answer, no call.
        detail = _server_detail(choice.get("error") or data.get("error"))
        raise _FailedReply(
            f"ended with finish_reason {finish!r}: the model failed mid-reply{detail}"
        )
    legacy = message.get("function_call")  # the one look a reply without it costs
    if legacy and not calls:
        calls, finish = _function_call(legacy, data.get("id"), finish)
    if content and not calls and tools:
        calls, finish = _written_calls(valid_text(content), tools, data.get("id"), finish)
    return AssistantTurn(
        text=text,
        calls=calls,
        # Some compatible servers leave finish_reason empty; infer the obvious one.
        finish_reason=finish if isinstance(finish, str) else ("tool_calls" if calls else "stop"),
        usage=_usage(data.get("usage")),
        reasoning=_reasoning(message),
    )


# What a decoded body that is no object was, in JSON's words rather than Python's ("NoneType").
_JSON_KINDS: Final = {
    type(None): "JSON null",
    bool: "JSON true or false",
    int: "a JSON number",
    float: "a JSON number",
    str: "a JSON string",
    list: "a JSON array",
}


def _reasoning(message: Mapping[str, Any]) -> Reasoning | None:
    """The reasoning in the first field that holds text (an empty one kept: DeepSeek wants
    it back all the same)."""
    for field in REASONING_FIELDS:
        text = message.get(field)
        if isinstance(text, str):
            return Reasoning(field=field, text=valid_text(text))
    return None


def _content_text(content: object) -> str | None:
    """The reply's text: a string, or the ``text`` parts of a list of parts (Mistral's API and
    gateways before it send one; a ``thinking`` part is the model's, not the answer)."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _BadShape("the message content is not text")
    texts = [part.get("text") for part in content if _is_text_part(part)]
    if not all(isinstance(text, str) for text in texts):
        raise _BadShape("the message content is not text")
    return "".join(texts)


def _is_text_part(part: object) -> bool:
    if not isinstance(part, Mapping):
        raise _BadShape("the message content is not text")
    return part.get("type") == "text"


def _tool_call(raw: object) -> ToolCall:
    """One call; a missing id is kept empty here and given a fresh one by ``unique_call_ids``."""
    fields: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    function = fields.get("function")
    function = function if isinstance(function, Mapping) else {}
    call_id = fields.get("id")
    call_id = call_id if isinstance(call_id, str) else ""
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise _BadShape(f"tool call {call_id or '(no id)'} has no function name")
    arguments = _arguments_text(call_id, function)
    return ToolCall(
        id=valid_text(call_id),
        name=valid_text(name),
        arguments=valid_text(arguments),
        extra_content=_extra_content(fields.get("extra_content")),
    )


def _extra_content(extra: object) -> str:
    """What a server added to a call, as JSON text to send back (text, so the journal holds
    it however it nests); none unless it is an object."""
    if not isinstance(extra, Mapping) or not extra:
        return ""
    try:
        return json.dumps(extra)  # ASCII: every lone surrogate escaped
    except (TypeError, ValueError, RecursionError):
        return ""


def _function_call(
    raw: object, response_id: object, finish: object
) -> tuple[tuple[ToolCall, ...], object]:
    """The legacy ``message.function_call`` (older vLLM and LocalAI, proxies translating for
    them) as the turn's one call, and its finish reason ``function_call`` as ``tool_calls``."""
    if not isinstance(raw, Mapping):
        raise _BadShape("the message's function_call is not an object")
    call = _tool_call({"id": _reply_call_id(response_id), "function": raw})
    return (call,), ("tool_calls" if finish == "function_call" else finish)


def _written_calls(
    text: str, tools: Collection[str], response_id: object, finish: object
) -> tuple[tuple[ToolCall, ...], object]:
    """The calls the model wrote as text (none if it wrote none of ``tools``), and the finish
    reason ``tool_calls`` for them unless the reply was cut short or withheld."""
    found = text_calls(text, tools)
    if not found:
        return (), finish
    log.info("read %d tool call(s) from the reply's text: the server parsed none", len(found))
    calls = tuple(
        ToolCall(id=_reply_call_id(response_id, i), name=name, arguments=valid_text(arguments))
        for i, (name, arguments) in enumerate(found)
    )
    return calls, (finish if finish in _CUT_SHORT else "tool_calls")


# The loop runs no call of a reply that ended so, whatever it was read from.
_CUT_SHORT = frozenset({"length", "content_filter"})
# A reply the model failed to finish: OpenRouter's "error" (its provider failed mid-reply) and
# vLLM's "abort" (the engine dropped the request).
_FAILED_MID_REPLY = frozenset({"error", "abort"})


def _reply_call_id(response_id: object, index: int = 0) -> str:
    """``call_`` and a digest of the response's id (and the call's place in it, after the
    first): the same reply always gets the same ids, and ones of OpenAI's shape and length
    whatever the server's id holds (its size, its characters). Empty without a response id:
    ``unique_call_ids`` names it as any missing id."""
    if not isinstance(response_id, str) or not response_id:
        return ""
    key = response_id if index == 0 else f"{response_id}#{index}"
    digest = sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"call_{digest[:24]}"


def _arguments_text(call_id: str, function: Mapping[str, Any]) -> str:
    """The arguments exactly as sent; the loop, not the provider, decides whether they are valid."""
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        return arguments
    if arguments is None:
        return ""
    # A few compatible servers send an object instead of a JSON string.
    if isinstance(arguments, dict | list):
        return json.dumps(arguments)
    raise _BadShape(f"tool call {call_id} has arguments of type {type(arguments).__name__}")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with each lone surrogate (JSON lets a server send ``"\\ud800"``) as U+FFFD:
    no journal entry, request or message could carry it. ``json`` joins the valid pairs."""
    return text if text.isascii() else _LONE_SURROGATE.sub("\ufffd", text)


def _usage(usage: object) -> Usage:
    """Token counts; a server that reports none costs zero rather than failing the call."""
    counts: Mapping[str, Any] = usage if isinstance(usage, Mapping) else {}
    prompt = counts.get("prompt_tokens")
    completion = counts.get("completion_tokens")
    return Usage(input_tokens=_count(prompt), output_tokens=_count(completion))


def _count(value: object) -> int:
    # JSON true is an int to Python, and a negative count would lower the run's spend; one
    # past JSON's exact integers is no count either, and would overflow the store's 64-bit
    # sums (a PostgreSQL run page, `runs export`, failed on it).
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return value if 0 < value <= _MAX_COUNT else 0


_MAX_COUNT = 2**53


def _preview(body: bytes) -> str:
    """What a body that is no completion holds, in a few words: a web page (a sign-in proxy's,
    a captive portal's) by what it says, its markup naming no cause."""
    head = body[:_PAGE_BYTES].decode("utf-8", errors="replace")
    if head.lstrip().startswith("<"):
        said = flattened(error_message(head))
        return f"a web page: {said[:80]!r}" if said else "a web page that says nothing"
    text = flattened(head[:_PREVIEW_CHARS])
    return repr(text[:80]) if text else "an empty body"


_PREVIEW_CHARS = 320
# A page's title may follow a long head of styles; what ``error_message`` reads of it.
_PAGE_BYTES = 64 * 1024
