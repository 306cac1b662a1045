"""The OpenAI-compatible provider: Chat Completions with tools through ``AsyncOpenAI``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

import openai
from openai import AsyncOpenAI
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)

from bot.domain import AssistantTurn, ToolCall, Usage
from bot.llm.base import (
    AssistantMessage,
    Message,
    ModelError,
    SystemMessage,
    ToolResultsMessage,
    ToolSpec,
    UserMessage,
)

PROVIDER = "openai"
# Local servers (Ollama, vLLM, LM Studio) ignore the key, but the client insists on one.
KEYLESS_PLACEHOLDER = "not-needed"
MISSING_KEY = "OPENAI_API_KEY is not set (set it, or OPENAI_BASE_URL for a local server)"
_RETRIED_STATUSES = frozenset({408, 409, 429})
_HINTS = {
    401: "check OPENAI_API_KEY",
    403: "check OPENAI_API_KEY and the model's access",
    404: "check the model name and OPENAI_BASE_URL",
    429: "rate limited or out of quota",
}
_DETAIL_CHARS = 200


class OpenAIProvider:
    """A ``ModelProvider`` for any OpenAI-compatible Chat Completions server."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None,
        base_url: str | None,
        max_retries: int = 2,
        client: AsyncOpenAI | None = None,
    ) -> None:
        self._model = model
        self._max_retries = max_retries
        if client is not None:
            self._client = client.with_options(max_retries=max_retries)
            return
        if not api_key and not base_url:
            raise ModelError(MISSING_KEY)
        self._client = AsyncOpenAI(
            api_key=api_key or KEYLESS_PLACEHOLDER,
            base_url=base_url or None,
            max_retries=max_retries,
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
        """Where requests go, without the trailing slash."""
        return str(self._client.base_url).rstrip("/")

    async def aclose(self) -> None:
        """Close the HTTP connections the client holds."""
        await self._client.close()

    # The protocol fixes ``timeout``; it bounds each HTTP attempt inside the client.
    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        timeout: float,
    ) -> AssistantTurn:
        """One Chat Completions call; every failure becomes a one-line ``ModelError``."""
        wire_tools = to_wire_tools(tools)
        try:
            completion = await self._client.chat.completions.create(
                model=self._model,
                messages=to_wire_messages(messages),
                tools=wire_tools if wire_tools else openai.omit,
                timeout=timeout,
            )
        except openai.OpenAIError as exc:
            raise ModelError(self._describe(exc, timeout)) from exc
        try:
            return parse_completion(completion)
        except _BadShape as exc:
            raise ModelError(
                f"model call failed: bad response from {self.base_url}: {exc}"
            ) from None

    def _describe(self, exc: openai.OpenAIError, timeout: float) -> str:
        """One readable line naming the cause, with the API key scrubbed out."""
        line = f"model call failed: {_cause(exc, self.base_url, timeout)}"
        if _was_retried(exc) and self._max_retries:
            line += f" (gave up after {self._max_retries} retries)"
        hint = _HINTS.get(getattr(exc, "status_code", 0))
        if hint:
            line += f" — {hint}"
        return _scrub(line, self._client.api_key)


def _cause(exc: openai.OpenAIError, where: str, timeout: float) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return f"timed out after {timeout:g}s waiting for {where}"
    if isinstance(exc, openai.APIConnectionError):
        reason = exc.__cause__ or exc
        return f"cannot connect to {where} ({type(reason).__name__}: {_one_line(str(reason))})"
    if isinstance(exc, openai.APIStatusError):
        return f"{_status_line(exc.status_code)} from {where}{_server_detail(exc.body)}"
    if isinstance(exc, openai.APIResponseValidationError):
        return f"bad response from {where}: {_one_line(exc.message)}"
    return _one_line(str(exc))


def _was_retried(exc: openai.OpenAIError) -> bool:
    """Whether the client retried before giving up: connection errors, 408/409/429, 5xx."""
    if isinstance(exc, openai.APIConnectionError):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in _RETRIED_STATUSES or exc.status_code >= 500
    return False


def _status_line(code: int) -> str:
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


def _server_detail(body: object) -> str:
    """The server's own error message, if it sent one, shortened to one line."""
    message = body.get("message") if isinstance(body, dict) else body
    if not isinstance(message, str) or not message.strip():
        return ""
    return f": {_one_line(message)[:_DETAIL_CHARS]}"


def _scrub(text: str, secret: str) -> str:
    """Remove the key from a message; servers sometimes echo what they were sent."""
    if len(secret) < 4 or secret == KEYLESS_PLACEHOLDER:
        return text
    return text.replace(secret, "***")


def _one_line(text: str) -> str:
    return " ".join(text.split())


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
    calls: list[ChatCompletionMessageFunctionToolCallParam] = [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call in turn.calls
    ]
    return {"role": "assistant", "content": turn.text, "tool_calls": calls}


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
    """The server answered 200 with something that is not a usable chat completion."""


def parse_completion(completion: object) -> AssistantTurn:
    """The first choice of a completion as an ``AssistantTurn``; arguments stay raw text."""
    # The client builds response models without validating them, so every field is checked here.
    if not isinstance(completion, ChatCompletion):
        raise _BadShape(f"expected a chat completion, got {_preview(completion)}")
    choices = getattr(completion, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise _BadShape("the completion has no choices")
    message = getattr(choices[0], "message", None)
    if message is None:
        raise _BadShape("the first choice has no message")
    text = getattr(message, "content", None)
    if text is not None and not isinstance(text, str):
        raise _BadShape("the message content is not text")
    calls = tuple(_tool_call(raw) for raw in getattr(message, "tool_calls", None) or ())
    finish = getattr(choices[0], "finish_reason", None)
    return AssistantTurn(
        text=text,
        calls=calls,
        # Some compatible servers leave finish_reason empty; infer the obvious one.
        finish_reason=finish if isinstance(finish, str) else ("tool_calls" if calls else "stop"),
        usage=_usage(getattr(completion, "usage", None)),
    )


def _tool_call(raw: object) -> ToolCall:
    function = getattr(raw, "function", None)
    call_id = getattr(raw, "id", None)
    name = getattr(function, "name", None)
    if not isinstance(call_id, str) or not call_id:
        raise _BadShape("a tool call has no id")
    if not isinstance(name, str) or not name:
        raise _BadShape(f"tool call {call_id} has no function name")
    return ToolCall(id=call_id, name=name, arguments=_arguments_text(call_id, function))


def _arguments_text(call_id: str, function: object) -> str:
    """The arguments exactly as sent; the loop, not the provider, decides whether they are valid."""
    arguments = getattr(function, "arguments", None)
    if isinstance(arguments, str):
        return arguments
    if arguments is None:
        return ""
    # A few compatible servers send an object instead of a JSON string.
    if isinstance(arguments, dict | list):
        return json.dumps(arguments)
    raise _BadShape(f"tool call {call_id} has arguments of type {type(arguments).__name__}")


def _usage(usage: Any) -> Usage:
    """Token counts; a server that reports none costs zero rather than failing the call."""
    prompt = getattr(usage, "prompt_tokens", None)
    completion = getattr(usage, "completion_tokens", None)
    return Usage(
        input_tokens=prompt if isinstance(prompt, int) else 0,
        output_tokens=completion if isinstance(completion, int) else 0,
    )


def _preview(value: object) -> str:
    text = _one_line(value if isinstance(value, str) else type(value).__name__)
    return repr(text[:80]) if text else "an empty body"
