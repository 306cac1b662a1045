"""Built-in in-process tools shipped with the bot."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from bot.tools.base import Tool
from bot.tools.python import function_tool


class EchoArgs(BaseModel):
    """Arguments of ``echo``."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="The text to return unchanged.")


@function_tool(idempotent=True)
async def echo(args: EchoArgs) -> str:
    """Return the given text unchanged."""
    return args.text


def builtin_tools() -> list[Tool]:
    """Every built-in tool, in a stable order."""
    return [echo]
