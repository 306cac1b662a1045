"""A streamed reply put back together: some servers and proxies (a gateway set to stream, a
server that only streams) answer a request that asked for one whole completion with its
server-sent events, ``data: {chunk}`` … ``data: [DONE]``. The chunks' deltas are joined into
the completion they make, for ``parse_completion`` to read as any other.
"""

from __future__ import annotations

import json
from typing import Any, Final

# Where servers send the reasoning apart from the text, the older name first.
REASONING_FIELDS: Final = ("reasoning_content", "reasoning")
_DATA = "data:"
_ERROR = "error:"
_DONE = "[DONE]"


class NotAStream(ValueError):
    """Events that do not make a completion; the message names why (of "it", the reply)."""


class EndedEarly(NotAStream):
    """Events that stopped before the reply did: what came is not all the model said."""


def is_stream(body: bytes) -> bool:
    """Whether ``body`` is server-sent events rather than one JSON value."""
    start = body.lstrip()[:16]
    return start.startswith((b"data:", b"event:", b"id:", b":", b"error:"))


def assembled(body: bytes) -> dict[str, Any]:
    """The completion the events of ``body`` make (its first choice's content, reasoning and tool
    calls joined in order, the last finish reason and usage), or the error one of them sent.
    ``NotAStream`` if an event's data is no JSON or no chunk, none made a chunk, or the events
    stopped before the reply ended."""
    completion = _Completion()
    for field, data in _events(body.decode("utf-8", errors="replace")):
        if field == _ERROR:
            return {"error": _error(data)}
        if data.strip() == _DONE:
            return completion.whole()
        try:
            chunk = json.loads(data, strict=False)  # a control character left unescaped
        except (ValueError, RecursionError):
            raise NotAStream(f"an event of it is no JSON: {data[:80]!r}") from None
        if not isinstance(chunk, dict):  # json's objects: dicts, cheaper checked than Mapping
            raise NotAStream("an event of it is not a chunk")
        if chunk.get("error"):
            return {"error": chunk["error"]}
        if chunk.get("object") == "error":  # older vLLM's error, sent mid-stream
            return {"error": chunk}
        completion.add(chunk)
    if completion.chunks and completion.finish is None:
        # The connection closed mid-reply: what came is not all the model said, and a call
        # of it may be one of several (a reply cut so runs none, as one cut by its limit).
        raise EndedEarly("it ended before the reply did (no finish reason, no [DONE])")
    return completion.whole()


def _events(text: str) -> list[tuple[str, str]]:
    """Each event's field and data: its ``data:`` lines joined, events ending at a blank line;
    an ``error:`` line (older llama.cpp's own field for an error) an event of its own."""
    events: list[tuple[str, str]] = []
    lines: list[str] = []
    # Only these end a line of events: str.splitlines would also split at a U+2028 or U+0085
    # that a JSON string may hold unescaped.
    for line in [*text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), ""]:
        if not line.strip():
            if lines:
                events.append((_DATA, "\n".join(lines)))
                lines = []
        elif line.startswith(_DATA):
            lines.append(_value(line, _DATA))
        elif line.startswith(_ERROR):
            events.append((_ERROR, _value(line, _ERROR)))
    return events


def _value(line: str, field: str) -> str:
    """A ``field:`` line's value, without the one space that may follow the colon."""
    value = line[len(field) :]
    return value[1:] if value.startswith(" ") else value


def _error(data: str) -> object:
    """An error event's data: its JSON object, else its text, as a 200's error body holds it."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return data
    return value if isinstance(value, dict) and value else data


class _Completion:
    """The chunks so far, as one completion's parts."""

    def __init__(self) -> None:
        self.chunks = 0
        self.id: object = None
        self.content: list[object] = []  # text, or parts (Mistral's) as they came
        self.reasoning: dict[str, list[str]] = {}
        self.calls: dict[int, _Call] = {}
        self.last = -1  # the highest index of a call so far
        self.finish: object = None
        self.usage: object = None

    def add(self, chunk: dict[str, Any]) -> None:
        """One chunk's parts, added to those before it."""
        self.chunks += 1
        self.id = self.id or chunk.get("id")
        self.usage = chunk.get("usage") or self.usage
        choices = chunk.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(first, dict):
            return  # the last chunk carries only the usage
        self.finish = first.get("finish_reason") or self.finish
        delta = first.get("delta")
        if not isinstance(delta, dict):
            return
        content = delta.get("content")
        if isinstance(content, list):
            self.content.extend(content)
        else:
            _append(self.content, content)
        for field in REASONING_FIELDS:
            _append(self.reasoning.setdefault(field, []), delta.get(field))
        calls = delta.get("tool_calls") or []
        if not isinstance(calls, list):
            raise NotAStream("an event's tool_calls is not a list")
        for call in calls:
            if isinstance(call, dict):
                self._call(call)

    def _call(self, delta: dict[str, Any]) -> None:
        """One call's delta: its first names the id and the tool, the rest add arguments."""
        given = delta.get("id")
        call_id = given if isinstance(given, str) else ""
        index = self._index(delta.get("index"), call_id)
        self.last = max(self.last, index)
        call = self.calls.setdefault(index, _Call())
        call.id = call_id or call.id
        if isinstance(delta.get("extra_content"), dict):
            call.extra_content = delta["extra_content"]  # Gemini 3's thought signature
        function = delta.get("function")
        if isinstance(function, dict):
            _append(call.name, function.get("name"))
            _append(call.arguments, function.get("arguments"))

    def _index(self, index: object, call_id: str) -> int:
        """Which call a delta adds to: the one its index names; without one (some servers send
        each call whole, unnumbered), a new call for an id not seen last, else the last."""
        if isinstance(index, int):
            return index
        last = self.last
        if last < 0 or (call_id and self.calls[last].id != call_id):
            return last + 1
        return last

    def _content(self) -> object:
        """The text; or, once a delta sent parts, all of it as parts, for ``parse_completion``
        to read as it reads a whole reply's."""
        texts = [part for part in self.content if isinstance(part, str)]
        if len(texts) == len(self.content):
            return "".join(texts) or None
        return [{"type": "text", "text": p} if isinstance(p, str) else p for p in self.content]

    def whole(self) -> dict[str, Any]:
        """The completion the chunks make; ``NotAStream`` if there were none."""
        if not self.chunks:
            raise NotAStream("it held no chunk")
        message: dict[str, Any] = {"role": "assistant", "content": self._content()}
        message.update((field, "".join(parts)) for field, parts in self.reasoning.items() if parts)
        if self.calls:
            message["tool_calls"] = [self.calls[index].whole() for index in sorted(self.calls)]
        return {
            "id": self.id,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish}],
            "usage": self.usage,
        }


class _Call:
    """One streamed call's parts so far (kept as pieces: joined once, in linear time)."""

    def __init__(self) -> None:
        self.id = ""
        self.extra_content: object = None
        self.name: list[str] = []
        self.arguments: list[str] = []

    def whole(self) -> dict[str, Any]:
        """The call as a whole reply's ``tool_calls`` entry."""
        function = {"name": "".join(self.name), "arguments": "".join(self.arguments)}
        call: dict[str, Any] = {"type": "function", "function": function}
        if self.id:
            call["id"] = self.id
        if self.extra_content is not None:
            call["extra_content"] = self.extra_content
        return call


def _append(parts: list[Any], value: object) -> None:
    """Add ``value`` to ``parts`` if it is text (a server may send null, or nothing)."""
    if isinstance(value, str):
        parts.append(value)
