"""In-process tools: schema from the model, validation errors, context detection, ``echo``."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from bot.domain import RequestKind
from bot.tools.base import Deferral, ToolContext, ToolResult
from bot.tools.builtin import builtin_tools, echo
from bot.tools.python import PythonTool, function_tool

CTX = ToolContext(run_id="run_1", call_id="call_1", requested_by="ana")


class Greeting(BaseModel):
    name: str = Field(description="Who to greet")
    times: int = Field(default=1, ge=1)


@function_tool
async def greet(args: Greeting) -> str:
    """Greet someone.

    Longer text that the model is not shown.
    """
    return " ".join([f"hello {args.name}"] * args.times)


@function_tool(name="whoami", description="Say who asked", confirm=True, timeout=5)
async def who(args: Greeting, ctx: ToolContext) -> ToolResult:
    return ToolResult(output=f"{ctx.requested_by} asked for {args.name}")


async def ask(args: Greeting) -> Deferral:
    """Ask a person."""
    return Deferral(kind=RequestKind.WAIT_USER, prompt=f"what about {args.name}?")


def test_schema_and_description_come_from_model_and_docstring() -> None:
    assert greet.name == "greet"
    assert greet.description == "Greet someone."
    assert greet.parameters == Greeting.model_json_schema()
    assert greet.parameters["required"] == ["name"]
    assert greet.flags.traits.idempotent
    assert not greet.flags.approval.confirm


def test_options_override_defaults() -> None:
    assert who.name == "whoami"
    assert who.description == "Say who asked"
    assert who.flags.approval.confirm
    assert who.flags.traits.timeout == 5.0


async def test_call_builds_the_model() -> None:
    assert await greet.call({"name": "bo", "times": 2}, CTX) == ToolResult("hello bo hello bo")


async def test_context_is_passed_only_when_taken() -> None:
    assert await who.call({"name": "bo"}, CTX) == ToolResult("ana asked for bo")


async def test_validation_error_is_a_readable_error_result() -> None:
    result = await greet.call({"name": "bo", "times": 0}, CTX)
    assert isinstance(result, ToolResult)
    assert result.is_error
    assert "times: Input should be greater than or equal to 1" in result.output


async def test_deferral_passes_through() -> None:
    tool = PythonTool.from_function(ask)
    assert await tool.call({"name": "bo"}, CTX) == Deferral(
        kind=RequestKind.WAIT_USER, prompt="what about bo?"
    )


def test_sync_function_is_refused() -> None:
    def sync(args: Greeting) -> str:
        """Sync."""
        return ""

    with pytest.raises(TypeError, match="async"):
        PythonTool.from_function(sync)  # type: ignore[arg-type]


def test_first_parameter_must_be_a_model() -> None:
    async def untyped(args: dict) -> str:  # type: ignore[type-arg]
        """Untyped."""
        return ""

    with pytest.raises(TypeError, match="BaseModel"):
        PythonTool.from_function(untyped)


def test_bad_name_and_missing_description_are_refused() -> None:
    with pytest.raises(ValueError, match="must match"):
        PythonTool.from_function(ask, name="no spaces")

    async def bare(args: Greeting) -> str:
        return ""

    with pytest.raises(ValueError, match="description"):
        PythonTool.from_function(bare)


async def test_echo_builtin() -> None:
    assert echo.name == "echo"
    assert echo.flags.traits.idempotent
    assert echo.parameters["required"] == ["text"]
    assert await echo.call({"text": "ping"}, CTX) == ToolResult("ping")
    assert builtin_tools() == [echo]
