"""Tool calls a model wrote as text: a server without a tool-call parser for the model (vLLM
without ``--tool-call-parser``, Ollama or an older llama.cpp with some models) hands the model's
call markup back as the reply's content, and ``tool_calls`` stays empty.

Only the shapes chat templates write are read, and only as a whole, after the model's
reasoning (its ``<think>`` block):

- ``<tool_call>`` blocks at the start of a line after words, nothing after the last and,
  between two, blanks or words on lines of their own (a model saying what it does next):
  JSON in them (Hermes, Qwen), Qwen3-Coder's ``<function=…>`` or GLM's ``NAME<arg_key>…``
  (their values typed by the tool's schema);
- a reply that is nothing but its calls: a call's JSON object or a list of them, bare or
  after ``[TOOL_CALLS]`` or ``<|python_tag|>``; Mistral's ``[TOOL_CALLS]NAME[ARGS]{…}`` from
  v11 on, or ``NAME{…}`` as vLLM leaves them; Llama 3.2's pythonic ``[name(key=literal)]``;
- gpt-oss's harmony messages: its calls to ``functions.NAME``, after its reasoning and words;
- DeepSeek's calls between its markers, after its words.

Each must name one of the run's tools or, in a call's markup, none may (the loop tells the
model the tools there are, and runs nothing). Arguments after ``[ARGS]`` or in a harmony
message that do not read are left for the loop's check. One that does not read otherwise, a
mix of known and unknown names, or markup shown rather than written (words after it or before
it on its line, on a Markdown quote's line, or in a code span or block, fenced JSON included)
leaves the whole text an answer, as it was before.

Read so, a reply's words (``bot.llm.reply_words``) are what a person reads of it: without the
calls it wrote (shown as the calls they are) and without its reasoning; the journal keeps the
text as it was sent.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Collection, Mapping
from typing import Final

import msgspec

from bot.llm.reply_words import may_hold_markup
from bot.nesting import loads
from bot.patterns import on_use

OPEN_TAG: Final = "<tool_call>"
CLOSE_TAG: Final = "</tool_call>"
# What Mistral's and Llama 3.1's templates write before a call (the server strips neither).
_MISTRAL: Final = "[TOOL_CALLS]"
_PREFIXES: Final = (_MISTRAL, "<|python_tag|>")
# Mistral's tokenizers from v11 on write each call as [TOOL_CALLS]NAME[ARGS]{…}; early v11
# ones leave out [ARGS], and some write [CALL_ID]ID before it.
_ARGS: Final = "[ARGS]"
_CALL_ID: Final = "[CALL_ID]"
# gpt-oss's harmony format, its markup left in the text: a reply of messages, each
# [<|start|>assistant]<|channel|>CHANNEL[ to=functions.NAME][ <|constrain|>json]<|message|>…
# ended by <|end|>, or by <|call|> for a call (the server may leave the last end out).
_HARMONY: Final = ("<|channel|>", "<|start|>")
_HARMONY_START: Final = "<|start|>"
_HARMONY_CHANNEL: Final = "<|channel|>"
_HARMONY_MESSAGE: Final = "<|message|>"
_HARMONY_CONSTRAIN: Final = "<|constrain|>"
_HARMONY_ENDS: Final = ("<|end|>", "<|call|>", "<|return|>")
_HARMONY_TOOLS: Final = "to=functions."


_DEEPSEEK_BAR: Final = "\uff5c"  # fullwidth


def _deepseek_token(name: str) -> str:
    """One of DeepSeek's markers: its words between fullwidth bars, joined by U+2581."""
    return f"<{_DEEPSEEK_BAR}{name.replace(' ', chr(0x2581))}{_DEEPSEEK_BAR}>"


# DeepSeek's calls (V3, R1, V3.1): after its words, between "tool calls begin" and "end",
# each call as "tool call begin" NAME "tool sep" {…} "tool call end" (V3.1), or with
# "function" before the separator and the name and a ```json block after it (V3 and R1).
_DEEPSEEK: Final = _deepseek_token("tool calls begin")
_DEEPSEEK_END: Final = _deepseek_token("tool calls end")
_DEEPSEEK_CALL: Final = _deepseek_token("tool call begin")
_DEEPSEEK_CALL_END: Final = _deepseek_token("tool call end")
_DEEPSEEK_SEP: Final = _deepseek_token("tool sep")
_DEEPSEEK_EOS: Final = _deepseek_token("end of sentence")
# Qwen3-Coder's call inside the tag: <function=NAME>, then <parameter=KEY>VALUE</parameter> each.
_FUNCTION: Final = "<function="
_FUNCTION_END: Final = "</function>"
_PARAMETER: Final = "<parameter="
_PARAMETER_END: Final = "</parameter>"
# GLM-4.5's and later's, inside the tag: NAME, then <arg_key>KEY</arg_key><arg_value>VALUE…
_ARG_KEY: Final = "<arg_key>"
_ARG_KEY_END: Final = "</arg_key>"
_ARG_VALUE: Final = "<arg_value>"
_ARG_VALUE_END: Final = "</arg_value>"
_THINK: Final = "<think>"
_THOUGHT: Final = "</think>"
_FENCE: Final = "```"
_TILDES: Final = "~~~"  # Markdown's other fence
# A call's object holds these and nothing else: one with more keys is an answer's data.
_CALL_KEYS: Final = frozenset({"name", "arguments", "parameters", "type", "id"})
# Python's parser holds some 500 bytes of tree for each byte of a list of short items: a
# runaway reply of 4 MiB would take seconds and gigabytes. Calls are far shorter than this.
_PYTHONIC_CHARS: Final = 64 * 1024

# How a bare call opens, its tool named: {"name": "…" or [{"name": "…", or [name( .
_OPENING: Final = on_use(
    r'(?:\[\s*)?\{\s*"name"\s*:\s*"(?P<json>[^"\\]+)"|\[\s*(?P<pythonic>[A-Za-z_]\w*)\s*\('
)
_OPENING_CHARS: Final = 512  # far past any tool's name; the rest is never looked at

TextCall = tuple[str, str]
"""One call read from text: the tool's name and its arguments as JSON text."""


class Written(msgspec.Struct, frozen=True):
    """What a reply is made of: the calls it wrote (none if it wrote no call of the run's
    tools), and its words without them (the whole reply when it made none)."""

    calls: list[TextCall]
    words: str


def text_calls(text: str, tools: Collection[str]) -> list[TextCall]:
    """The calls ``text`` is made of, in order; none unless every one names a tool in
    ``tools`` and reads as a call (the first that does not ends the reading). ``tools`` may
    map each name to its parameters' JSON Schema: Qwen3-Coder writes each value as text, and
    the schema's type says what it is (a number, a truth value, an object)."""
    return read(text, tools).calls


def read(text: str, tools: Collection[str]) -> Written:
    """``text``'s calls of ``tools`` (as ``text_calls``) and its words without them: the
    model's reasoning, what it said before its first call and between its calls."""
    if not tools or not may_hold_markup(text):
        return Written([], text)
    start = thought_end(text)
    if _in_final(text, start):
        return Written([], text)
    at, values, between = _markup(text[start:], tools)
    calls: list[TextCall] = []
    for value in values:
        call = _call(value, tagged=at >= 0)
        if call is None:
            return Written([], text)
        calls.append(call)
    if not calls or not _ours(calls, tools, marked=at >= 0):
        return Written([], text)
    said = [text[: start + max(at, 0)].rstrip(), *(gap.strip() for gap in between)]
    return Written(calls, "\n".join(piece for piece in said if piece))


def _ours(calls: list[TextCall], tools: Collection[str], *, marked: bool) -> bool:
    """Whether ``calls`` are the run's to take: each names one of ``tools``; or, written in a
    call's markup (``marked``), none does. Those go to the loop, which tells the model the
    tools there are and runs nothing; a call of a tool beside them would run, so a reply
    mixing the two stays an answer, as does bare JSON naming none (likely an answer's data)."""
    known = [name in tools for name, _ in calls]
    return all(known) or (marked and not any(known))


def _markup(after: str, tools: Collection[str]) -> tuple[int, list[object], list[str]]:
    """Where the calls in what follows the reasoning begin (-1 for bare ones, 0 for ones
    after a marker), each call's value, and the words between them: the first marker found
    says whose they are."""
    at = after.find(OPEN_TAG)
    opening = after.lstrip()
    if opening.startswith(_HARMONY):
        # gpt-oss keeps its reasoning in messages of its own: none of it is its words.
        return 0, *_harmony(opening)
    # DeepSeek's markers hold a fullwidth bar: a reply without one costs no look for them.
    marked = after.find(_DEEPSEEK) if _DEEPSEEK_BAR in after else -1
    if marked >= 0 and (at < 0 or marked < at):
        return marked, _deepseek(after, marked), []
    if at >= 0:
        return at, *_tagged(after, at, tools if isinstance(tools, Mapping) else {})
    return (0 if opening.startswith(_PREFIXES) else -1), _bare(opening.rstrip()), []


def before_cut_call(text: str, tools: Collection[str]) -> str | None:
    """The words of a reply cut at the output limit before a call it had begun to write as
    text (a ``<tool_call>`` tag as a template writes it, DeepSeek's markers out of code, a
    reply opening as Mistral's and Llama's calls do, as a bare call of one of ``tools``, or
    as gpt-oss's messages naming a function), reasoning included; None if it had begun none."""
    start = thought_end(text)
    if _in_final(text, start):
        return None
    after = text[start:]
    opening = after.lstrip()
    harmony = opening.startswith(_HARMONY) and _HARMONY_TOOLS in opening
    if harmony or opening.startswith(_PREFIXES) or _opens_call(opening, tools):
        return text[:start].rstrip()
    at = after.find(OPEN_TAG)
    if at >= 0 and _written_at(after[:at]):
        return text[: start + at].rstrip()
    marked = after.find(_DEEPSEEK) if _DEEPSEEK_BAR in after else -1
    if marked >= 0 and not _quoted_at(after[:marked]):
        return text[: start + marked].rstrip()
    return None


def _in_final(text: str, start: int) -> bool:
    """Whether what follows the reasoning, from ``start``, is gpt-oss's ``final`` message: its
    answer, which calls nothing whatever it shows."""
    return start > 0 and text.lstrip().startswith(_HARMONY)


def _opens_call(text: str, tools: Collection[str]) -> bool:
    """Whether ``text`` opens as a bare call of one of ``tools``: its JSON object (alone or
    first in a list), the first of Llama's pythonic list, or Mistral's ``NAME{`` without its
    markers."""
    opened = _OPENING.match(text[:_OPENING_CHARS])
    if opened is not None:
        return (opened["json"] or opened["pythonic"]) in tools
    brace = text.find("{", 0, _NAME_CHARS)
    return brace > 0 and text[:brace].strip() in tools


def thought_end(text: str) -> int:
    """Where what follows the model's reasoning starts: a reasoning model served without a
    reasoning parser writes its thinking first, which may weigh the very calls it then does
    not make. Its template may open the ``<think>`` block in the prompt, so the reply holds only
    the close (a reply that names ``<think>`` before that is an answer naming the tags); and
    thinking may name its closing tag, so only what follows the last one is read. Reasoning
    never closed is all there is, and calls nothing (the end of the text). gpt-oss's harmony
    messages put its answer in a ``final`` message after its reasoning: what follows is it."""
    opening = text.lstrip()
    if opening.startswith(_HARMONY):
        return _harmony_final(text)
    opened = opening.startswith(_THINK)
    first = text.find(_THOUGHT)
    if first < 0:
        return len(text) if opened else 0
    if not opened and _THINK in text[:first]:
        return 0  # an answer naming the tags, not a block its template opened
    return text.rfind(_THOUGHT) + len(_THOUGHT)


def _harmony_final(text: str) -> int:
    """Where the text of gpt-oss's ``final`` message starts: the first message of that channel,
    read message by message (reasoning, or the answer itself, may name its marker); 0 if
    there is none. Each message before it ended, as the model ends each one."""
    at = 0
    while (opened := text.find(_HARMONY_MESSAGE, at)) >= 0:
        if _channel(text[at:opened]) == ["final"]:
            return opened + len(_HARMONY_MESSAGE)
        ended = _HARMONY_END.search(text, opened)
        if ended is None:
            return 0
        at = ended.end()
    return 0


_HARMONY_END: Final = on_use("|".join(re.escape(end) for end in _HARMONY_ENDS))


def _tagged(text: str, at: int, schemas: Mapping[str, object]) -> tuple[list[object], list[str]]:
    """Each ``<tool_call>`` block's call from ``at`` on (``_block``), None for one that was
    shown rather than written (the last may be left unclosed: a model can stop before it
    writes the closing tag); and the words written between them."""
    if not _written_at(text[:at]):
        return [None], []
    values: list[object] = []
    between: list[str] = []
    while at >= 0:
        start = at + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, start)
        values.append(_block(text[start:] if end < 0 else text[start:end], schemas))
        if end < 0:
            break
        after = end + len(CLOSE_TAG)
        at = text.find(OPEN_TAG, after)
        gap = text[after : at if at >= 0 else len(text)]
        if not gap.strip():
            continue
        # A template writes calls one after another and stops: words after the last one (a
        # closing backtick or fence too), or on a block's own line, mean it was quoted,
        # explained or offered, not made. Words on lines of their own between blocks are
        # the model saying what it does next ("Now the logs:"). The words before the gap are
        # out of code and end on a blank, so whether the next block is in code is the gap's
        # alone: looking at them all again for each block was quadratic in a runaway reply.
        if at < 0 or gap.partition("\n")[0].strip() or not _written_at(gap):
            values.append(None)
            break
        between.append(gap)
    return values, between


def _block(inside: str, schemas: Mapping[str, object]) -> object:
    """What a ``<tool_call>`` block holds: Qwen3-Coder's ``<function=…>`` or GLM's name and
    ``<arg_key>``s as a call object, else the JSON of Hermes and Qwen2.5; None if it is none."""
    body = inside.strip()
    if body.startswith(_FUNCTION):
        return _function(body, schemas)
    if not body.startswith(("{", "[")):
        return _glm(body, schemas)
    return _json(inside)


def _function(body: str, schemas: Mapping[str, object]) -> dict[str, object] | None:
    """Qwen3-Coder's ``<function=NAME><parameter=KEY>VALUE</parameter>…</function>`` as a call
    object, each value typed by the tool's schema (``_typed``); None unless it is only that."""
    head, opened, rest = body.removeprefix(_FUNCTION).partition(">")
    name = head.strip()
    if not opened or not name or "<" in name or not rest.endswith(_FUNCTION_END):
        return None
    pairs = _pairs(rest.removesuffix(_FUNCTION_END), (_PARAMETER, ">"), ("", _PARAMETER_END))
    if pairs is None:
        return None
    properties = _properties(schemas.get(name))
    # The template writes each value on lines of its own: those two line ends are its.
    return {
        "name": name,
        "arguments": {
            key: _typed(value.removeprefix("\n").removesuffix("\n"), properties.get(key))
            for key, value in pairs.items()
        },
    }


def _glm(body: str, schemas: Mapping[str, object]) -> dict[str, object] | None:
    """GLM-4.5's and later's ``NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>…`` as a
    call object, each value typed by the tool's schema (``_typed``: its template writes text
    as it is, anything else as JSON); None unless it is only that."""
    at = body.find(_ARG_KEY)
    name = (body if at < 0 else body[:at]).strip()
    if not name or len(name.split()) > 1 or "<" in name:
        return None
    pairs = _pairs(body[at:] if at >= 0 else "", (_ARG_KEY, _ARG_KEY_END), _GLM_VALUE)
    if pairs is None:
        return None
    properties = _properties(schemas.get(name))
    arguments = {key: _typed(value, properties.get(key)) for key, value in pairs.items()}
    return {"name": name, "arguments": arguments}


_GLM_VALUE: Final = (_ARG_VALUE, _ARG_VALUE_END)


def _pairs(text: str, key: tuple[str, str], value: tuple[str, str]) -> dict[str, str] | None:
    """Each key and value in ``text``, written between the ``key`` and ``value`` markers (an
    opening and a closing one each; blanks between them and between pairs); None unless the
    text is only these, each key said without markup, and once. Read by place in
    the text: cutting what was left after each pair made a runaway reply's pairs quadratic."""
    pairs: dict[str, str] = {}
    at = _blanks(text, 0)
    while at < len(text):
        if not text.startswith(key[0], at):
            return None
        key_end = text.find(key[1], at + len(key[0]))
        if key_end < 0:
            return None
        name = text[at + len(key[0]) : key_end].strip()
        at = key_end + len(key[1])
        if value[0]:
            at = _blanks(text, at)
            if not text.startswith(value[0], at):
                return None
            at += len(value[0])
        value_end = text.find(value[1], at)
        if value_end < 0 or not name or "<" in name or name in pairs:
            return None
        pairs[name] = text[at:value_end]
        at = _blanks(text, value_end + len(value[1]))
    return pairs


_BLANKS: Final = on_use(r"\s*")


def _blanks(text: str, at: int) -> int:
    """Where the blanks from ``at`` in ``text`` end (``at`` itself when there are none)."""
    blanks = _BLANKS.match(text, at)
    return blanks.end() if blanks is not None else at


def _properties(schema: object) -> Mapping[str, object]:
    """A tool's parameters by name, from its JSON Schema; none if it names none."""
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    return properties if isinstance(properties, Mapping) else {}


def _typed(text: str, schema: object) -> object:
    """A parameter's value written as text, as its schema's type says: the text itself where
    the type is text or unsaid, or where the text is not of its type (the tool's check then
    tells the model what it should be)."""
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    kinds = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()
    if not kinds or "string" in kinds:
        return text
    word = text.strip()
    if word == "null":
        return None
    if word in ("true", "false") and "boolean" in kinds:
        return word == "true"
    value = _json(word) if word[:1] in _JSON_STARTS else None
    for wanted, types in _JSON_TYPES.items():
        if wanted in kinds and isinstance(value, types) and not isinstance(value, bool):
            return value
    return text


# How a number, an object or an array opens; and which JSON values each type takes.
_JSON_STARTS: Final = frozenset("-0123456789{[")
_JSON_TYPES: Final[dict[str, type | tuple[type, ...]]] = {
    "integer": int,
    "number": (int, float),
    "object": dict,
    "array": list,
}


def _harmony(text: str) -> tuple[list[object], list[str]]:
    """gpt-oss's calls, each a ``commentary`` message to ``functions.NAME``, and its words
    before them (``commentary`` to no one: what it tells the user it is doing); its
    ``analysis`` is its reasoning. A ``final`` message (an answer), a call of one of its
    built-in tools, or markup that does not read is None: the whole text is the answer."""
    values: list[object] = []
    said: list[str] = []
    messages = [message for message in text.split(_HARMONY_START) if message.strip()]
    for index, message in enumerate(messages):
        header, opened, written = message.partition(_HARMONY_MESSAGE)
        body = _harmony_body(written, last=index == len(messages) - 1)
        fields = header.replace(_HARMONY_CHANNEL, " ").replace(_HARMONY_CONSTRAIN, " ").split()
        channel = _channel(header)
        if not opened or body is None or not channel:
            return [None], []
        recipients = [field for field in fields if field.startswith("to=")]
        if recipients:
            values.append(_harmony_call(recipients, body))
        elif channel == ["commentary"] and not values:
            said.append(body)
        elif channel != ["analysis"]:
            return [None], []
    return values, said


def _channel(header: str) -> list[str]:
    """A harmony message's channel, the word after ``<|channel|>`` in its header; none if none."""
    return header.partition(_HARMONY_CHANNEL)[2].split()[:1]


def _harmony_body(body: str, *, last: bool) -> str | None:
    """A harmony message's text without the token that ends it; None if text follows that, or
    if none ends a message before the last (the model ends each one before it starts the next:
    a message started inside another is markup it quotes, as from a tool's output)."""
    ended = _HARMONY_END.search(body)  # the first, of any kind: text after it was quoted
    if ended is None:
        return body if last else None
    return body[: ended.start()] if not body[ended.end() :].strip() else None


def _harmony_call(recipients: list[str], body: str) -> dict[str, object] | None:
    """A harmony message to ``functions.NAME`` as a call object; its text is the arguments,
    as the API would send them. None for any other recipient (a built-in tool's)."""
    if len(recipients) > 1 or not recipients[0].startswith(_HARMONY_TOOLS):
        return None
    value = _json(body)
    arguments = value if isinstance(value, dict) else body.strip()
    return {"name": recipients[0].removeprefix(_HARMONY_TOOLS), "arguments": arguments}


def _deepseek(text: str, at: int) -> list[object]:
    """DeepSeek's calls from ``at`` as call objects: ``[None]`` unless its words before leave
    them out of code and nothing but the calls follows."""
    inside, ended, rest = text[at + len(_DEEPSEEK) :].partition(_DEEPSEEK_END)
    if _quoted_at(text[:at]) or (ended and rest.strip() not in ("", _DEEPSEEK_EOS)):
        return [None]
    first, *written = inside.split(_DEEPSEEK_CALL)
    if first.strip() or not written:
        return [None]
    calls: list[object] = []
    for each in written:
        call, closed, after = each.partition(_DEEPSEEK_CALL_END)
        head, split, arguments = call.partition(_DEEPSEEK_SEP)
        if not closed or not split or after.strip():
            return [None]
        if head.strip() == "function":  # V3 and R1: the name, then its arguments fenced
            head, _, arguments = arguments.partition("\n")
            arguments = arguments.strip().removeprefix("```json").removesuffix("```")
        value = _json(arguments)
        name = head.strip()
        calls.append({"name": name, "arguments": value if isinstance(value, dict) else arguments})
    return calls


def _written_at(before: str) -> bool:
    """Whether a tag after ``before`` is where a template writes a call: outside code, and on a
    line of its own (one after words on its line ends the sentence that quotes it, "Earlier I
    ran <tool_call>…</tool_call>"), not indented as Markdown's code is."""
    line = before[before.rfind("\n") + 1 :]
    return not _in_code(before) and not line.strip(" \t") and len(line.expandtabs(4)) < 4


def _quoted_at(before: str) -> bool:
    """Whether markup written inline after ``before`` (DeepSeek's, after its words) is shown,
    not written: in code, or on a Markdown quote's line (a tool's output repeated)."""
    line = before[before.rfind("\n") + 1 :]
    return _in_code(before) or line.lstrip().startswith(">")


def _in_code(words: str) -> bool:
    """Whether the words before the first block leave it in a code block or span (one opened
    and not closed: fences and backticks come in pairs)."""
    fences = words.count(_FENCE)
    return (
        fences % 2 == 1 or words.count(_TILDES) % 2 == 1 or (words.count("`") - 3 * fences) % 2 == 1
    )


def _bare(text: str) -> list[object]:
    """The calls of a reply that is only calls: one JSON object, a list of them, or a pythonic
    list; or Mistral's calls from v11 on. A fenced block is none: a call's JSON shown in code
    is shown, as its markup would be."""
    if text.startswith(_MISTRAL) and not text[len(_MISTRAL) :].lstrip().startswith(("{", "[")):
        return _mistral(text)
    for prefix in _PREFIXES:
        text = text.removeprefix(prefix).lstrip()
    if not text.startswith(("{", "[")):
        return _named(text) if text.find("{", 0, _NAME_CHARS) > 0 else []
    value = _json(text)
    if value is None and text.startswith("["):
        return _pythonic(text)
    return list(value) if isinstance(value, list) else [value]


def _named(text: str) -> list[object]:
    """Mistral's calls from v11 on as a server that drops its control tokens leaves them (vLLM
    without a tool parser does): ``NAME{…}`` each, one after the other; none unless the text
    is only these, each name one word (a tool's, as ``read`` then checks)."""
    calls: list[object] = []
    at = 0
    while at < len(text):
        brace = text.find("{", at, at + _NAME_CHARS)
        name = text[at:brace].strip() if brace > at else ""
        if not name.replace("-", "_").replace(".", "_").isidentifier():
            return [None] if calls else []
        if len(text) > _NAMED_CHARS:
            return [None]
        try:
            value, at = _DECODER.raw_decode(text, brace)
        # The decoder's own limit: an object nested past the interpreter's recursion limit.
        except (ValueError, RecursionError):
            return [None]
        calls.append({"name": name, "arguments": value})
        while at < len(text) and text[at].isspace():  # in place: a runaway reply is long
            at += 1
    return calls


# A tool's name is shorter than this: where a reply opening NAME{ looks for its brace.
_NAME_CHARS: Final = 128
# Calls written NAME{…} take a few bytes each: a runaway reply of them, millions of calls in
# the reply's 4 MiB, would hold the event loop for seconds. Real ones are far shorter.
_NAMED_CHARS: Final = 64 * 1024
_DECODER: Final = json.JSONDecoder()


def _mistral(text: str) -> list[object]:
    """Mistral's calls from v11 on, ``[TOOL_CALLS]NAME[ARGS]{…}`` each, as call objects; a
    name that is not one word is None. What follows ``[ARGS]`` (or the name, without it) is
    the call's arguments: JSON text as the API sends it, which the loop checks."""
    calls: list[object] = []
    for written in text.split(_MISTRAL)[1:]:
        head, tagged, arguments = written.partition(_ARGS)
        if not tagged:
            brace = written.find("{")
            head, arguments = (written[:brace], written[brace:]) if brace >= 0 else (written, "")
        name = head.partition(_CALL_ID)[0].strip()
        if not name or len(name.split()) > 1:
            return [None]
        value = _json(arguments)
        calls.append({"name": name, "arguments": value if isinstance(value, dict) else arguments})
    return calls


def _pythonic(text: str) -> list[object]:
    """Llama 3.2's and 3.3's calls, ``[name(key=value, …), …]``, as call objects; ``[None]``
    unless the text is only such a list, each call a plain name with keyword arguments whose
    values are literals (the text is parsed, never run)."""
    if len(text) > _PYTHONIC_CHARS:
        return [None]
    try:
        tree = ast.parse(text, mode="eval").body
    # The parser's own limits: a text nested too deep, or too big for its stack.
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [None]
    if not isinstance(tree, ast.List):
        return [None]
    lines = text.encode("utf-8", "surrogatepass").splitlines()
    try:
        return [_pythonic_call(node, lines) for node in tree.elts]
    except (_NotLiteral, ValueError, RecursionError):  # ValueError: inf or nan, no JSON
        return [None]


def _pythonic_call(node: ast.expr, lines: list[bytes]) -> dict[str, str]:
    """One ``name(key=literal, …)`` of the list as a call object; ``_NotLiteral`` otherwise."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        raise _NotLiteral
    _as_written(node.func.id, node, lines)
    arguments: dict[str, object] = {}
    for keyword in node.keywords:
        if keyword.arg is None:  # **mapping
            raise _NotLiteral
        _as_written(keyword.arg, keyword, lines)
        arguments[keyword.arg] = _literal(keyword.value)
    return {"name": node.func.id, "arguments": json.dumps(arguments, allow_nan=False)}


def _as_written(name: str, node: ast.Call | ast.keyword, lines: list[bytes]) -> None:
    """``_NotLiteral`` unless ``name`` (a call's or a keyword's) is spelled at ``node`` as
    Python reads it: the parser folds a name to its NFKC form, so "delete" in fullwidth
    letters would name the tool ``delete``, which a call's JSON of that name does not."""
    spelled = name.encode()
    at = node.col_offset  # in UTF-8 bytes, as the parser counts
    if lines[node.lineno - 1][at : at + len(spelled)] != spelled:
        raise _NotLiteral


class _NotLiteral(Exception):
    """A pythonic call that is not a name and literal keyword arguments."""


def _literal(node: ast.expr) -> object:
    """A JSON value written as a Python literal: a string, a number, a truth value or None,
    or a list, tuple or dict (string keys) of them."""
    match node:
        case ast.Constant(value=str() | int() | float() | None as value):
            return value
        case ast.UnaryOp(op=ast.USub(), operand=ast.Constant(value=int() | float() as number)):
            if isinstance(number, bool):
                raise _NotLiteral
            return -number
        case ast.List(elts=items) | ast.Tuple(elts=items):
            return [_literal(item) for item in items]
        case ast.Dict(keys=keys, values=values):
            return {_key(key): _literal(value) for key, value in zip(keys, values, strict=True)}
    raise _NotLiteral


def _key(node: ast.expr | None) -> str:
    """A dict literal's key: a string, or ``_NotLiteral``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    raise _NotLiteral  # a key that is no string, or a **mapping


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
