"""Tool calls a model wrote as text: a server without a tool-call parser for the model (vLLM
without ``--tool-call-parser``, Ollama or an older llama.cpp with some models) hands the model's
call markup back as the reply's content, and ``tool_calls`` stays empty.

Only the shapes chat templates write are read, and only as a whole: tagged blocks
(``<tool_call>{…}</tool_call>``, Hermes and Qwen, after words, with nothing but blanks between
and after them, as a template writes them), or a reply that is nothing but a call's JSON (an
object or a list of them, bare, after ``[TOOL_CALLS]`` or ``<|python_tag|>``, or in one fenced
block), after the model's reasoning (its ``<think>`` block). Each must name one of the run's
tools; one that does not, one that does not read, or markup shown rather than written (words
after it, or in a code span or block) leaves the whole text an answer, as it was before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator, Mapping
from typing import Final

from bot.nesting import loads
from bot.patterns import on_use

OPEN_TAG: Final = "<tool_call>"
CLOSE_TAG: Final = "</tool_call>"
# What Mistral's and Llama 3.1's templates write before a call (the server strips neither).
_PREFIXES: Final = ("[TOOL_CALLS]", "<|python_tag|>")
_FENCED: Final = on_use(r"\A```(?:json)?[ \t]*\n(.*?)\n?[ \t]*```\Z", re.DOTALL)
_THINK: Final = "<think>"
_THOUGHT: Final = "</think>"
_FENCE: Final = "```"
# A call's object holds these and nothing else: one with more keys is an answer's data.
_CALL_KEYS: Final = frozenset({"name", "arguments", "parameters", "type", "id"})

TextCall = tuple[str, str]
"""One call read from text: the tool's name and its arguments as JSON text."""


def text_calls(text: str, tools: Collection[str]) -> list[TextCall]:
    """The calls ``text`` is made of, in order; none unless every one names a tool in
    ``tools`` and reads as a call (the first that does not ends the reading)."""
    if not tools:
        return []
    text = _after_thinking(text)
    tagged = OPEN_TAG in text
    calls: list[TextCall] = []
    for value in _tagged(text) if tagged else _bare(text.strip()):
        call = _call(value, tagged)
        if call is None or call[0] not in tools:
            return []
        calls.append(call)
    return calls


def _after_thinking(text: str) -> str:
    """What follows the model's reasoning: a reasoning model served without a reasoning parser
    writes its thinking first, which may weigh the very calls it then does not make. Its
    template may open the ``<think>`` block in the prompt, so the reply holds only the close;
    and thinking may name its closing tag, so only what follows the last one is read.
    Reasoning never closed is all there is, and calls nothing."""
    _, closed, after = text.rpartition(_THOUGHT)
    if closed:
        return after
    return "" if text.lstrip().startswith(_THINK) else text


def _tagged(text: str) -> Iterator[object]:
    """Each ``<tool_call>`` block's JSON, None for one that does not read or that was shown
    rather than written (the last may be left unclosed: a model can stop before it writes the
    closing tag)."""
    at = text.find(OPEN_TAG)
    if _in_code(text[:at]):
        yield None
        return
    while at >= 0:
        start = at + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, start)
        yield _json(text[start:] if end < 0 else text[start:end])
        if end < 0:
            return
        after = end + len(CLOSE_TAG)
        at = text.find(OPEN_TAG, after)
        # A template writes calls one after another and stops: words after one (a closing
        # backtick or fence too) mean it was quoted, explained or offered, not made.
        if text[after : at if at >= 0 else len(text)].strip():
            yield None
            return


def _in_code(words: str) -> bool:
    """Whether the words before the first block leave it in a code block or span (one opened
    and not closed: fences and backticks come in pairs)."""
    fences = words.count(_FENCE)
    return fences % 2 == 1 or (words.count("`") - 3 * fences) % 2 == 1


def _bare(text: str) -> list[object]:
    """The calls of a reply that is only JSON: one object, or a list of them."""
    for prefix in _PREFIXES:
        text = text.removeprefix(prefix).lstrip()
    fenced = _FENCED.match(text)
    if fenced:
        text = fenced.group(1).strip()
    if not text.startswith(("{", "[")):
        return []
    value = _json(text)
    return list(value) if isinstance(value, list) else [value]


def _json(text: str) -> object:
    """``text`` as JSON; None if it is none (nested too deep included)."""
    try:
        return loads(text)
    except ValueError:
        return None


def _call(value: object, tagged: bool) -> TextCall | None:
    """One call's name and arguments; None for anything else. Outside a tag the arguments
    must be there: ``{"name": …}`` alone is as likely an answer's data as a call."""
    if not isinstance(value, Mapping) or not value.keys() <= _CALL_KEYS:
        return None
    name = value.get("name")
    if not isinstance(name, str) or value.get("type", "function") != "function":
        return None
    if "arguments" in value and "parameters" in value:
        return None
    arguments = value.get("arguments", value.get("parameters"))
    if arguments is None:
        return (name, "{}") if tagged else None
    if isinstance(arguments, str):
        return name, arguments  # JSON text as the API sends it; the loop checks it
    if not isinstance(arguments, dict) or _schema(arguments):
        return None
    try:
        return name, json.dumps(arguments)
    except (ValueError, RecursionError):
        return None


def _schema(arguments: dict[str, object]) -> bool:
    """Whether ``arguments`` are a tool's JSON Schema, as a listing of the tools writes them:
    data about a tool, which no call's arguments look like."""
    return arguments.get("type") == "object" and isinstance(arguments.get("properties"), dict)
