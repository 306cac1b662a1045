"""Hooks around the loop: UserPromptSubmit, PreToolUse, PostToolUse, RunEnd.

All run on the run's task, in the order registered, each under a timeout. A hook that
raises or times out fails closed: the prompt or call is denied and the cause goes to the
log and the event sink, never to the model.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from bot.domain import TerminalResult, ToolCall

log = logging.getLogger("kestrel.hooks")

T = TypeVar("T")


@dataclass(frozen=True)
class HookContext:
    """What every hook is told about the run it serves."""

    run_id: str
    requested_by: str = ""


@dataclass(frozen=True)
class PromptVerdict:
    """UserPromptSubmit's answer: allow (maybe with a rewritten text) or deny."""

    allow: bool = True
    text: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class ToolVerdict:
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
    """A hook raised or timed out; the caller fails closed."""


@dataclass
class Hooks:
    """The caller's hooks, by point, in the order they run."""

    user_prompt_submit: list[PromptHook] = field(default_factory=list)
    pre_tool_use: list[PreToolHook] = field(default_factory=list)
    post_tool_use: list[PostToolHook] = field(default_factory=list)
    run_end: list[RunEndHook] = field(default_factory=list)
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
        """These hooks first, then ``other``'s (how the PII guard composes after the caller's)."""
        return Hooks(
            self.user_prompt_submit + other.user_prompt_submit,
            self.pre_tool_use + other.pre_tool_use,
            self.post_tool_use + other.post_tool_use,
            self.run_end + other.run_end,
            min(self.timeout, other.timeout),
        )

    async def on_prompt(self, text: str, ctx: HookContext) -> PromptVerdict:
        """Run UserPromptSubmit hooks in turn; each sees the previous one's rewrite."""
        for hook in self.user_prompt_submit:
            verdict = await self._guarded(hook(text, ctx), hook)
            if not verdict.allow:
                return verdict
            text = verdict.text if verdict.text is not None else text
        return PromptVerdict(text=text)

    async def on_pre_tool(self, call: ToolCall, ctx: HookContext) -> ToolVerdict:
        """Run PreToolUse hooks in turn; a rewrite is passed on to the next hook."""
        for hook in self.pre_tool_use:
            verdict = await self._guarded(hook(call, ctx), hook)
            if not verdict.allow:
                return verdict
            call = ToolCall(
                id=call.id,
                name=verdict.tool if verdict.tool is not None else call.name,
                arguments=verdict.arguments if verdict.arguments is not None else call.arguments,
            )
        return ToolVerdict(tool=call.name, arguments=call.arguments)

    async def on_post_tool(self, call: ToolCall, output: str, ctx: HookContext) -> str:
        """Run PostToolUse hooks in turn; each may rewrite the output."""
        for hook in self.post_tool_use:
            rewritten = await self._guarded(hook(call, output, ctx), hook)
            output = rewritten if rewritten is not None else output
        return output

    async def on_run_end(self, result: TerminalResult, ctx: HookContext) -> None:
        """Run every RunEnd hook; one failing does not keep the others from running."""
        for hook in self.run_end:
            try:
                await self._guarded(hook(result, ctx), hook)
            except HookFailure as exc:
                log.warning("RunEnd hook failed for %s: %s", ctx.run_id, exc)

    async def _guarded(self, pending: Awaitable[T], hook: object) -> T:
        try:
            async with asyncio.timeout(self.timeout):
                return await pending
        except TimeoutError as exc:
            raise HookFailure(f"hook {_name(hook)} timed out after {self.timeout:g}s") from exc
        except Exception as exc:
            raise HookFailure(f"hook {_name(hook)} failed: {type(exc).__name__}: {exc}") from exc


def _name(hook: object) -> str:
    return getattr(hook, "__qualname__", repr(hook))


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
