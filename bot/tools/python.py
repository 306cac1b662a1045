"""In-process tools: an async function of an arguments Struct or model (and maybe the context)."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, overload

from bot.tools.arguments import ArgumentsType, InvalidArguments, arguments_type
from bot.tools.base import (
    ApprovalPolicy,
    Deferral,
    ToolContext,
    ToolFlags,
    ToolResult,
    ToolTraits,
    capped,
    check_tool_name,
)

ToolReturn = str | ToolResult | Deferral
ToolFunction = Callable[..., Awaitable[ToolReturn]]


def _arguments_type(fn: ToolFunction) -> tuple[ArgumentsType, bool]:
    """The arguments type of the first parameter, and whether a second (the context) is taken."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"{fn.__qualname__} must be an async def")
    params = list(inspect.signature(fn).parameters.values())
    if len(params) not in (1, 2):
        raise TypeError(f"{fn.__qualname__} must take (args) or (args, ctx)")
    try:
        hints = typing.get_type_hints(fn)
    except NameError as exc:
        raise TypeError(f"{fn.__qualname__}: cannot resolve annotations: {exc}") from exc
    found = arguments_type(hints.get(params[0].name))
    if found is None:
        raise TypeError(
            f"{fn.__qualname__}: first parameter must be annotated with a msgspec Struct"
            " or a pydantic BaseModel"
        )
    return found, len(params) == 2


def _first_doc_line(fn: ToolFunction) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


class PythonTool:
    """A tool that runs in the bot's own process."""

    # Attributes, not properties, and never changed after __init__: a run reads them a dozen
    # times per call, and a property is a Python call each time on 3.11.
    name: str  # the unique name in the tool set
    description: str  # one line for the model
    parameters: dict[str, Any]  # the JSON Schema of the arguments, from their Struct or model
    flags: ToolFlags  # gating, idempotency, pacing and timeout

    def __init__(
        self,
        fn: ToolFunction,
        *,
        name: str,
        description: str,
        flags: ToolFlags,
    ) -> None:
        check_tool_name(name)
        if not description:
            raise ValueError(f"tool {name!r} needs a description (or a docstring)")
        self._fn = fn
        self._arguments, self._wants_ctx = _arguments_type(fn)
        self.name = name
        self.description = description
        self.parameters = self._arguments.schema()
        self.flags = flags

    @classmethod
    def from_function(
        cls,
        fn: ToolFunction,
        *,
        name: str | None = None,
        description: str | None = None,
        confirm: bool = False,
        idempotent: bool = True,
        operator_paced: bool = False,
        timeout: float = 30,
        tags: Sequence[str] = (),
        approvals: int = 1,
        deny: bool = False,
        needs_prompter: bool = False,
        needs_workdir: bool = False,
    ) -> PythonTool:
        """A tool from an async function; name and description default to its own."""
        approval = ApprovalPolicy(confirm=confirm, approvals=approvals, deny=deny, tags=tuple(tags))
        traits = ToolTraits(
            idempotent=idempotent,
            operator_paced=operator_paced,
            timeout=float(timeout),
            needs_prompter=needs_prompter,
            needs_workdir=needs_workdir,
        )
        return cls(
            fn,
            name=name or fn.__name__,
            description=description or _first_doc_line(fn),
            flags=ToolFlags(approval, traits),
        )

    def argument_errors(self, arguments: dict[str, Any]) -> list[str]:
        """Every way ``arguments`` break their type: the very check ``call`` makes."""
        try:
            self._arguments.convert(arguments)
        except InvalidArguments as exc:
            return exc.lines
        return []

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult | Deferral:
        """Build the arguments value and run the function; its exceptions propagate."""
        try:
            args = self._arguments.convert(arguments)
        except InvalidArguments as exc:
            output = "invalid arguments:\n" + "\n".join(exc.lines)
            return ToolResult(output=output, is_error=True)
        answer = await (self._fn(args, ctx) if self._wants_ctx else self._fn(args))
        if isinstance(answer, str):
            return ToolResult(output=capped(answer))
        if isinstance(answer, ToolResult):
            # An answer that is not text is refused where every tool's is (the loop's check).
            if not isinstance(answer.output, str):
                return answer
            output = capped(answer.output)
            return answer if output is answer.output else ToolResult(output, answer.is_error)
        if isinstance(answer, Deferral):
            return answer
        raise TypeError(f"tool {self.name!r} returned {type(answer).__name__}, not a str")


@overload
def function_tool(fn: ToolFunction, /) -> PythonTool: ...


@overload
def function_tool(
    *,
    name: str | None = None,
    description: str | None = None,
    confirm: bool = False,
    idempotent: bool = True,
    operator_paced: bool = False,
    timeout: float = 30,
    tags: Sequence[str] = (),
    approvals: int = 1,
    deny: bool = False,
    needs_prompter: bool = False,
    needs_workdir: bool = False,
) -> Callable[[ToolFunction], PythonTool]: ...


def function_tool(
    fn: ToolFunction | None = None, /, **options: Any
) -> PythonTool | Callable[[ToolFunction], PythonTool]:
    """Decorate an async function into a ``PythonTool``, bare or with ``from_function`` options."""
    if fn is not None:
        return PythonTool.from_function(fn, **options)

    def decorate(inner: ToolFunction) -> PythonTool:
        return PythonTool.from_function(inner, **options)

    return decorate
