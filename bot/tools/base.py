"""The ``Tool`` protocol: what a tool declares, what it is given, what it answers."""

from __future__ import annotations

import string
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

import msgspec

from bot.domain import Request, RequestKind, RequestMaker, unstamped
from bot.prompter import Prompter

# What a tool's output may hold, in bytes of UTF-8, unless its catalog says otherwise: it is
# journaled, and sent to the model with every later turn of the run.
DEFAULT_MAX_OUTPUT = 65536


# How far back from the cap a cut looks for a line's end, else a word's. A value cut in two (a
# key, a card number) would leave its first part, too short for the PII guard to know it by.
_CUT_REACH = 1024
_LINE_END = b"\n"
_WORD_ENDS = (b" ", b"\t", b",", b";")


def cut(kept: bytes) -> bytes:
    """The first bytes of an output cut short, ended after their last line end, else their
    last blank, comma or semicolon, within the last ``_CUT_REACH`` (as they are without one)."""
    floor = max(0, len(kept) - _CUT_REACH)
    end = kept.rfind(_LINE_END, floor)
    if end < 0:
        end = _word_end(kept, floor)
    return kept[: end + 1] if end >= 0 else kept


def _word_end(kept: bytes, floor: int) -> int:
    """The last blank, comma or semicolon from ``floor`` on that does not stand between two
    digits: a grouped card or account number (4111 1111 1111 1111) is one value, whose first
    groups alone the PII guard would not know. Any last one if all do; -1 if there is none."""
    last = end = max(kept.rfind(mark, floor) for mark in _WORD_ENDS)
    while end >= 0:
        if not (kept[end - 1 : end].isdigit() and kept[end + 1 : end + 2].isdigit()):
            return end
        end = max(kept.rfind(mark, floor, end) for mark in _WORD_ENDS)
    return last


def cut_marker(total: int, shown: int) -> str:
    """The line a cut output ends in."""
    return f"[output truncated: {total} bytes total, first {shown} shown]"


def capped(text: str, cap: int = DEFAULT_MAX_OUTPUT) -> str:
    """``text`` cut to its first ``cap`` bytes of UTF-8 (at a line's or a word's end, see
    ``cut``), with the marker a command's cut output ends in."""
    if len(text) <= cap // 4:
        return text  # no UTF-8 character takes more than 4 bytes
    data = text.encode("utf-8", errors="replace")
    if len(data) <= cap:
        return text
    shown = cut(data[:cap])
    kept = shown.decode("utf-8", errors="ignore").removesuffix("\n")
    return f"{kept}\n{cut_marker(len(data), len(shown))}"


# The model APIs' ``^[a-zA-Z0-9_-]{1,64}$`` as a set of characters: compiling it as a regex
# was 0.25 M instructions of every process that loads a catalog (``runs approve``).
_NAME_CHARACTERS = frozenset(string.ascii_letters + string.digits + "_-")


def check_tool_name(name: str) -> None:
    """Refuse a name the model APIs would refuse (``ValueError``, saying why in words)."""
    if 0 < len(name) <= 64 and _NAME_CHARACTERS.issuperset(name):
        return
    odd = sorted(
        {char for char in name if not (char.isascii() and (char.isalnum() or char in "_-"))}
    )
    why = f"has {', '.join(map(repr, odd))}" if odd else f"has {len(name)} characters"
    raise ValueError(
        f"a tool's name is 1 to 64 letters, digits, _ and -, as the model APIs take it:"
        f" {name!r} {why}"
    )


def mcp_tags(server: str) -> tuple[str, ...]:
    """The tags every tool of MCP server ``server`` carries (``mcp``, ``mcp:SERVER``): the
    policy names approvers per server with them."""
    return ("mcp", f"mcp:{server}") if server else ("mcp",)


class ApprovalPolicy(msgspec.Struct, frozen=True):
    """Who must let a call of the tool run: the policy's half of a tool's flags."""

    confirm: bool = False
    approvals: int = 1
    deny: bool = False
    # The policy names approvers per tag (``tag:prod``) as well as per tool.
    tags: tuple[str, ...] = ()


class ToolTraits(msgspec.Struct, frozen=True):
    """What the tool is: how the loop runs, times and retries a call of it."""

    idempotent: bool = False
    operator_paced: bool = False
    timeout: float = 30.0
    needs_prompter: bool = False
    needs_workdir: bool = False
    # Argument path -> the tools whose output is an expected source of its value
    # (``list_units`` for ``restart_unit.unit``): such a value needs no decision of its own.
    trusted_from: tuple[tuple[str, tuple[str, ...]], ...] = ()


class ToolFlags(msgspec.Struct, frozen=True):
    """How the loop must treat a tool: who must approve a call, and what the tool is."""

    approval: ApprovalPolicy = ApprovalPolicy()
    traits: ToolTraits = ToolTraits()


class ToolResult(msgspec.Struct, frozen=True):
    """A tool's answer; a command's non-zero exit is an answer too, not an error."""

    output: str
    is_error: bool = False


class Deferral(msgspec.Struct, frozen=True):
    """The tool will answer later: the run suspends on a request of this kind."""

    kind: RequestKind
    prompt: str = ""
    options: tuple[str, ...] = ()
    # The id of the request already asked inline (``ToolContext.request``): the deferred one
    # keeps it, made afresh (its deadline runs from now, not from when the question was put).
    request_id: str = ""


class ToolContext(msgspec.Struct, frozen=True):
    """What one call is given; the prompter and work directory only if the tool asked for them."""

    run_id: str
    call_id: str
    requested_by: str = ""
    prompter: Prompter | None = None
    workdir: Path | None = None
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    # Told a command's process group once it runs, for a dispatch whose outcome must be known.
    started: Callable[[int], None] | None = None
    # The run's stamp for its requests (deadline, platform options).
    stamp: Callable[[Request], Request] = unstamped

    def request(
        self, kind: RequestKind, tool: str, arguments: dict[str, Any], **details: Any
    ) -> Request:
        """A request of this run about this call, made as every request of the run is."""
        maker = RequestMaker(self.run_id, self.requested_by, self.stamp)
        return maker(kind, self.call_id, tool, arguments, **details)


# Whether a tool has a protocol's method, as a runtime-checkable protocol's ``isinstance`` asks
# (the attribute is there and not None), without its machinery: typing's protocol check and
# abc's subclass hook cost a fresh process 0.2 M instructions each, first asked in its first run.
# The protocols themselves are the type checker's (creating one costs 0.16 M).
if TYPE_CHECKING:

    class ChecksArguments(Protocol):
        """A tool that checks its own arguments, faster or more exactly than its JSON Schema."""

        def argument_errors(self, arguments: dict[str, Any]) -> list[str]:
            """Every way ``arguments`` are invalid, one readable line each; empty when valid."""
            ...

    class RunsSomething(Protocol):
        """A tool whose effect its name, schema and flags do not say (a command's argv): a run's
        fingerprint holds it too, so a call approved for one program never runs another."""

        def definition(self) -> dict[str, Any]:
            """What a call runs, as plain JSON (the same on every replica of one configuration)."""
            ...


def checks_arguments(tool: object) -> TypeGuard[ChecksArguments]:
    """Whether ``tool`` checks its own arguments (``ChecksArguments``)."""
    return getattr(tool, "argument_errors", None) is not None


def runs_something(tool: object) -> TypeGuard[RunsSomething]:
    """Whether ``tool`` says what a call runs (``RunsSomething``)."""
    return getattr(tool, "definition", None) is not None


class Tool(Protocol):
    """A named capability the model may call."""

    @property
    def name(self) -> str:
        """The unique name in the tool set."""
        ...

    @property
    def description(self) -> str:
        """One line for the model."""
        ...

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON Schema of the arguments."""
        ...

    @property
    def flags(self) -> ToolFlags:
        """Gating, idempotency, pacing and timeout."""
        ...

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult | Deferral:
        """Run once with validated arguments."""
        ...
