"""A tiny MCP server over stdio for the MCP tool-source tests; run as ``python -m``."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

server = MCPServer("kestrel-test")

READ_ONLY = ToolAnnotations(read_only_hint=True)
DESTRUCTIVE = ToolAnnotations(destructive_hint=True)
# Changes what the server offers but destroys nothing: not gated by annotations.
ADDITIVE = ToolAnnotations(destructive_hint=False)


@server.tool(annotations=READ_ONLY)
def lookup(key: str) -> str:
    """Look a key up; an unknown key is a tool error."""
    if key == "missing":
        raise ToolError(f"no such key: {key}")
    return f"value of {key}"


@server.tool(annotations=DESTRUCTIVE)
def restart(service: str) -> str:
    """Restart a service."""
    return f"restarted {service}"


@server.tool()
def plain(text: str) -> str:
    """Echo the text; declares no annotations."""
    return f"plain {text}"


def extra() -> str:
    """A tool that exists only after ``mutate``."""
    return "extra"


@server.tool(annotations=ADDITIVE)
async def mutate(ctx: Context) -> str:
    """Add ``extra``, remove ``plain`` and tell the client the tool list changed."""
    server.add_tool(extra, annotations=READ_ONLY)
    server.remove_tool("plain")
    await ctx.session.send_tool_list_changed()
    return "mutated"


@server.tool()
def crash() -> str:
    """End this server's process at once, as a crash would."""
    os._exit(3)


# With ``--leaky``: a tool whose description and schema hold what a careless server's author
# pastes into them (a key, a password in a URL, an address), as a model must never read them.
LEAKY_KEY = "sk-proj-" + "Ab3dEf6hIj9lMn2pQr5tUv8xYz1bCd4fGh7jKl0nPq3sTv6wXy9zA2cE5gH8kM1p"
LEAKY_PASSWORD = "Tr0ub4dor-3xample"
LEAKY_EMAIL = "oncall.lead@example.com"


def deploy(
    target: Annotated[
        str, Field(description=f"A URL such as https://deploy:{LEAKY_PASSWORD}@ci.example.net/x")
    ],
) -> str:
    """Deploy a target."""
    return f"deployed {target}"


if "--leaky" in sys.argv:
    server.add_tool(
        deploy,
        annotations=DESTRUCTIVE,
        description=f"Deploy a target. Uses API key {LEAKY_KEY}; questions to {LEAKY_EMAIL}.",
    )


async def record(name: str) -> str:
    """Record a side effect in ``$EFFECTS_FILE`` (not idempotent; a crash test counts them)."""
    await anyio.sleep(0.05)  # an effect that takes a moment, as a command's does
    with open(os.environ["EFFECTS_FILE"], "a") as effects:  # noqa: ASYNC230 - one short line
        effects.write(f"{name}\n")
    return f"recorded {name}"


# With ``--effects``: ``record``, whose effects the crash tests count.
if "--effects" in sys.argv:
    server.add_tool(record, annotations=ADDITIVE)


if __name__ == "__main__":
    server.run("stdio")
