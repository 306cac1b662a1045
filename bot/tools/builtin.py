"""Built-in in-process tools shipped with the bot."""

# No ``from __future__ import annotations``: msgspec would evaluate the arguments' annotation
# text when it first builds their schema.

from typing import Annotated

import msgspec

from bot.tools.base import Tool
from bot.tools.python import function_tool


class EchoArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Arguments of ``echo``."""

    text: Annotated[str, msgspec.Meta(description="The text to return unchanged.")]


@function_tool(idempotent=True)
async def echo(args: EchoArgs) -> str:
    """Return the given text unchanged."""
    return args.text


def builtin_tools() -> list[Tool]:
    """Every built-in tool, in a stable order."""
    return [echo]
