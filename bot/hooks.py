"""Hooks around the loop: UserPromptSubmit, PreToolUse, PostToolUse, RunEnd.

All run on the run's task, in the order registered, each under a timeout. A hook that
raises or times out fails closed: the prompt or call is denied and the cause goes to the
log and the event sink, never to the model.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import msgspec

from bot.domain import TerminalResult, ToolCall
from bot.eager import started

log = logging.getLogger("kestrel.hooks")

T = TypeVar("T")


class HookContext(msgspec.Struct, frozen=True):
    """What every hook is told about the run it serves."""

    run_id: str
    requested_by: str = ""


class PromptVerdict(msgspec.Struct, frozen=True):
    """UserPromptSubmit's answer: allow (maybe with a rewritten text) or deny."""

    allow: bool = True
    text: str | None = None
    reason: str = ""


class ToolVerdict(msgspec.Struct, frozen=True):
    """PreToolUse's answer: allow, deny, or rewrite the tool and its raw JSON arguments."""

    allow: bool = True
    tool: str | None = None
    arguments: str | None = None
    reason: str = ""


PromptHook = Callable[[str, HookContext], Awaitable[PromptVerdict]]
PreToolHook = Callable[[ToolCall, HookContext], Awaitable[ToolVerdict]]
PostToolHook = Callable[[ToolCall, str, HookContext], Awaitable[str | None]]
RunEndHook = Callable[[TerminalResult, HookContext], Awaitable[None]]


class HookFailure(Exception):
    """A hook raised, timed out or answered with something unusable; the caller fails closed.
    ``hook`` names it (what a person may be told; the cause, which may quote what the hook
    read, is for the operator)."""

    def __init__(self, hook: object, what: str) -> None:
        self.hook = _name(hook)
        super().__init__(f"hook {self.hook} {what}")


class _Bounded(msgspec.Struct, frozen=True):
    """A hook composed from another ``Hooks``: it keeps that one's timeout."""

    hook: Callable[..., Awaitable[Any]]
    timeout: float

    def __call__(self, *args: Any) -> Awaitable[Any]:
        return self.hook(*args)


H = TypeVar("H", bound=Callable[..., Awaitable[Any]])


def _bounded(hooks: list[H], timeout: float) -> list[H]:
    """The hooks, each bound to ``timeout`` unless it already carries its own."""
    return [h if isinstance(h, _Bounded) else cast(H, _Bounded(h, timeout)) for h in hooks]


class Hooks(msgspec.Struct):
    """The caller's hooks, by point, in the order they run."""

    user_prompt_submit: list[PromptHook] = msgspec.field(default_factory=list)
    pre_tool_use: list[PreToolHook] = msgspec.field(default_factory=list)
    post_tool_use: list[PostToolHook] = msgspec.field(default_factory=list)
    run_end: list[RunEndHook] = msgspec.field(default_factory=list)
    timeout: float = 10.0

    @classmethod
    def from_references(
        cls,
        *,
        user_prompt_submit: list[str],
        pre_tool_use: list[str],
        post_tool_use: list[str],
        run_end: list[str],
        timeout: float,
    ) -> Hooks:
        """Hooks named as ``module:function`` references; raises ValueError naming a bad one."""
        return cls(
            [load_hook(ref) for ref in user_prompt_submit],  # type: ignore[misc]
            [load_hook(ref) for ref in pre_tool_use],  # type: ignore[misc]
            [load_hook(ref) for ref in post_tool_use],  # type: ignore[misc]
            [load_hook(ref) for ref in run_end],  # type: ignore[misc]
            timeout,
        )

    def then(self, other: Hooks) -> Hooks:
        """These hooks first, then ``other``'s (how the PII guard composes after the caller's).

        Each hook keeps the timeout of the ``Hooks`` it came from: composing the guard neither
        cuts a caller's patient hook short nor lets a caller's short timeout bound the guard.
        """
        return Hooks(
            self.user_prompt_submit + _bounded(other.user_prompt_submit, other.timeout),
            self.pre_tool_use + _bounded(other.pre_tool_use, other.timeout),
            self.post_tool_use + _bounded(other.post_tool_use, other.timeout),
            self.run_end + _bounded(other.run_end, other.timeout),
            self.timeout,
        )

    async def on_prompt(self, text: str, ctx: HookContext) -> PromptVerdict:
        """Run UserPromptSubmit hooks in turn; each sees the previous one's rewrite."""
        for hook in self.user_prompt_submit:
            verdict = await self._guarded(hook, text, ctx)
            if not isinstance(verdict, PromptVerdict) or not _optional_str(verdict.text):
                raise HookFailure(hook, _misanswered(verdict, "PromptVerdict"))
            if not verdict.allow:
                return verdict
            text = verdict.text if verdict.text is not None else text
        return PromptVerdict(text=text)

    async def on_pre_tool(self, call: ToolCall, ctx: HookContext) -> ToolVerdict:
        """Run PreToolUse hooks in turn; a rewrite is passed on to the next hook."""
        for hook in self.pre_tool_use:
            verdict = await self._guarded(hook, call, ctx)
            if not (
                isinstance(verdict, ToolVerdict)
                and _optional_str(verdict.tool)
                and _optional_str(verdict.arguments)
            ):
                raise HookFailure(hook, _misanswered(verdict, "ToolVerdict"))
            if not verdict.allow:
                return verdict
            call = ToolCall(
                id=call.id,
                name=verdict.tool if verdict.tool is not None else call.name,
                arguments=verdict.arguments if verdict.arguments is not None else call.arguments,
            )
        return ToolVerdict(tool=call.name, arguments=call.arguments)

    async def on_post_tool(self, call: ToolCall, output: str, ctx: HookContext) -> str:
        """Run PostToolUse hooks in turn; each may rewrite the output (None keeps it)."""
        for hook in self.post_tool_use:
            rewritten = await self._guarded(hook, call, output, ctx)
            if not _optional_str(rewritten):
                raise HookFailure(hook, _misanswered(rewritten, "str or None"))
            output = rewritten if rewritten is not None else output
        return output

    async def on_run_end(self, result: TerminalResult, ctx: HookContext) -> None:
        """Run every RunEnd hook; one failing does not keep the others from running."""
        for hook in self.run_end:
            try:
                await self._guarded(hook, result, ctx)
            except HookFailure as exc:
                log.warning("RunEnd hook failed for %s: %s", ctx.run_id, exc)

    async def _guarded(self, hook: Callable[..., Awaitable[T]], *args: object) -> T:
        """Call and await one hook under its timeout; anything it raises is a HookFailure.

        The call itself is inside the guard: a hook that is not a coroutine function, or
        takes the wrong arguments, raises when called, not when awaited.
        """
        limit = hook.timeout if isinstance(hook, _Bounded) else self.timeout
        # The limit counts from the call: a first step that blocks (a synchronous client) is
        # part of the hook's time, as it was when the timer was armed before the call.
        called_at = time.monotonic()  # for the time its first step took; cheaper than the loop's
        scope: asyncio.Timeout | None = None
        try:
            pending = hook(*args)
            # Its first step at once: a hook that answers without waiting (the PII guard's)
            # arms no timer; one that waits goes on under the timeout.
            first = started(pending)
            if first is not None and first.done:
                return cast(T, first.result)
            scope = asyncio.timeout(limit - (time.monotonic() - called_at))
            async with scope:
                return await (pending if first is None else first)
        except TimeoutError as exc:
            if scope is not None and scope.expired():
                raise HookFailure(hook, f"timed out after {limit:g}s") from exc
            raise HookFailure(hook, f"failed: TimeoutError: {exc}") from exc
        except Exception as exc:
            raise HookFailure(hook, f"failed: {type(exc).__name__}: {exc}") from exc


def _optional_str(value: object) -> bool:
    return value is None or isinstance(value, str)


def _misanswered(answer: object, expected: str) -> str:
    """Why an answer is unusable, by type only: its content may be what must not leak."""
    return f"answered with an unusable {type(answer).__name__} (expected {expected})"


def _name(hook: object) -> str:
    if isinstance(hook, _Bounded):
        hook = hook.hook
    return getattr(hook, "__qualname__", None) or repr(hook)


def load_hook(reference: str) -> Callable[..., Awaitable[object]]:
    """Import a ``module:function`` reference; raises ValueError naming what is wrong."""
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise ValueError(f"hook reference {reference!r} is not of the form module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"hook {reference!r}: cannot import {module_name}: {exc}") from exc
    target = getattr(module, attr, None)
    if not callable(target):
        raise ValueError(f"hook {reference!r}: {module_name} has no callable {attr!r}")
    return target  # type: ignore[no-any-return]
