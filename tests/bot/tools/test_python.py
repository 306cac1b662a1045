"""In-process tools: schema from the Struct or model, validation errors, context detection,
``echo``."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest
from pydantic import BaseModel, Field

from bot.domain import RequestKind
from bot.tools.base import DEFAULT_MAX_OUTPUT, Deferral, ToolContext, ToolResult, capped
from bot.tools.builtin import builtin_tools, echo
from bot.tools.python import PythonTool, function_tool
from tests.fakes.fresh import fresh_json

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


def test_first_parameter_must_be_a_struct_or_a_model() -> None:
    async def untyped(args: dict) -> str:  # type: ignore[type-arg]
        """Untyped."""
        return ""

    with pytest.raises(TypeError, match="msgspec Struct or a pydantic BaseModel"):
        PythonTool.from_function(untyped)


def test_bad_name_and_missing_description_are_refused() -> None:
    with pytest.raises(ValueError, match="1 to 64 letters, digits, _ and -"):
        PythonTool.from_function(ask, name="no spaces")

    async def bare(args: Greeting) -> str:
        return ""

    with pytest.raises(ValueError, match="description"):
        PythonTool.from_function(bare)


class Wave(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Arguments of ``wave``."""

    name: Annotated[str, msgspec.Meta(description="Who to wave at")]
    times: Annotated[int, msgspec.Meta(ge=1)] = 1


@function_tool
async def wave(args: Wave) -> str:
    """Wave at someone."""
    return " ".join([f"wave {args.name}"] * args.times)


class Hand(msgspec.Struct):
    fingers: int


class Hands(msgspec.Struct):
    hands: list[Hand]


@function_tool
async def count(args: Hands) -> str:
    """Count fingers."""
    return str(sum(hand.fingers for hand in args.hands))


class Branch(msgspec.Struct):
    leaves: list[Branch] = []


@function_tool
async def grow(args: Branch) -> str:
    """Grow a tree."""
    return str(len(args.leaves))


def test_struct_schema_is_an_object_schema() -> None:
    assert wave.parameters == {
        "title": "Wave",
        "description": "Arguments of ``wave``.",
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "Who to wave at"},
            "times": {"type": "integer", "minimum": 1, "default": 1},
        },
        "required": ["name"],
        "additionalProperties": False,
    }


def test_struct_schema_keeps_only_the_definitions_it_refers_to() -> None:
    assert count.parameters["properties"]["hands"]["items"] == {"$ref": "#/$defs/Hand"}
    assert list(count.parameters["$defs"]) == ["Hand"]
    # A Struct that nests itself keeps its own definition for the inner references.
    assert grow.parameters["properties"]["leaves"]["items"] == {"$ref": "#/$defs/Branch"}
    assert list(grow.parameters["$defs"]) == ["Branch"]
    assert "$defs" not in wave.parameters


async def test_call_builds_the_struct() -> None:
    assert await wave.call({"name": "bo", "times": 2}, CTX) == ToolResult("wave bo wave bo")
    assert await count.call({"hands": [{"fingers": 5}, {"fingers": 4}]}, CTX) == ToolResult("9")


async def test_struct_errors_are_field_lines() -> None:
    result = await wave.call({"name": "bo", "times": 0}, CTX)
    assert result == ToolResult("invalid arguments:\ntimes: Expected `int` >= 1", is_error=True)
    assert wave.argument_errors({}) == ["name: Object missing required field `name`"]
    assert count.argument_errors({"hands": [{"fingers": "5"}]}) == [
        "hands.0.fingers: Expected `int`, got `str`"
    ]
    assert count.argument_errors([]) == ["(arguments): Expected `object`, got `array`"]  # type: ignore[arg-type]
    assert wave.argument_errors({"name": "bo"}) == []


async def test_struct_refuses_unknown_fields_when_it_forbids_them() -> None:
    assert wave.argument_errors({"name": "bo", "loud": True}) == [
        "loud: Object contains unknown field `loud`"
    ]
    result = await wave.call({"name": "bo", "loud": True}, CTX)
    assert isinstance(result, ToolResult)
    assert result.is_error


async def test_echo_builtin() -> None:
    assert echo.name == "echo"
    assert echo.flags.traits.idempotent
    assert echo.parameters == {
        "title": "EchoArgs",
        "description": "Arguments of ``echo``.",
        "type": "object",
        "properties": {"text": {"type": "string", "description": "The text to return unchanged."}},
        "required": ["text"],
        "additionalProperties": False,
    }
    assert await echo.call({"text": "ping"}, CTX) == ToolResult("ping")
    assert echo.argument_errors({"text": "ping", "more": 1}) == [
        "more: Object contains unknown field `more`"
    ]
    assert builtin_tools() == [echo]


ECHO_WITHOUT_PYDANTIC = """
import asyncio, json, sys
from bot.tools.base import ToolContext
from bot.tools.builtin import echo
ctx = ToolContext(run_id="run_1", call_id="call_1", requested_by="ana")
result = asyncio.run(echo.call({"text": "ping"}, ctx))
print(json.dumps([result.output, "pydantic" in sys.modules]))
"""


def test_echo_runs_without_importing_pydantic() -> None:
    # A runtime composed in code with the built-in tools pays no ~8 MiB for pydantic.
    assert fresh_json(ECHO_WITHOUT_PYDANTIC) == ["ping", False]


async def test_a_huge_answer_is_cut_to_the_output_cap_with_a_marker() -> None:
    @function_tool
    async def flood(args: Greeting) -> str:
        """Answer with far too much."""
        return "é" * 100_000  # two bytes each in UTF-8

    @function_tool
    async def flood_result(args: Greeting) -> ToolResult:
        """Answer with far too much, as an error."""
        return ToolResult(output="x" * 200_000, is_error=True)

    cut = await flood.call({"name": "a"}, CTX)
    cut_result = await flood_result.call({"name": "a"}, CTX)
    small = await greet.call({"name": "a"}, CTX)

    assert isinstance(cut, ToolResult) and isinstance(cut_result, ToolResult)
    assert cut.output.endswith(
        f"[output truncated: 200000 bytes total, first {DEFAULT_MAX_OUTPUT} shown]"
    )
    assert len(cut.output.encode()) < DEFAULT_MAX_OUTPUT + 100
    assert cut_result.is_error
    assert cut_result.output.endswith("[output truncated: 200000 bytes total, first 65536 shown]")
    assert small == ToolResult(output="hello a")


def test_a_capped_output_ends_at_a_word_not_inside_a_card_number() -> None:
    # No line end near the cap: the cut goes back to the last blank, so the card number's first
    # digits are not left for the model without the rest the PII guard would know it by.
    text = "x" * 990 + " card 4111111111111111 " * 20
    assert capped(text, 1000) == (
        "x" * 990 + " card \n[output truncated: 1450 bytes total, first 996 shown]"
    )


def test_a_capped_output_is_not_cut_between_a_grouped_card_number_s_digits() -> None:
    # The blanks inside "4111 1111 1111 1111" are word ends too: cut at the last one, the first
    # twelve digits were left, too few for the PII guard to know them for a card.
    text = "x" * 990 + " card 4111 1111 1111 1111 exp 12/29" * 20
    shown = capped(text, 1012)
    assert "4111" not in shown
    assert shown.startswith("x" * 990 + " card \n[output truncated:")
