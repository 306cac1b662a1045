"""A bare MCP server over stdio, written without the SDK so it can list what the SDK's own
server would refuse to: ``python raw_mcp_server.py TOOLS_JSON [LINE]``, where TOOLS_JSON is
the ``tools/list`` result's list of tools. A call answers ``ok NAME``, or its ``text`` argument
repeated ``times`` times; one given ``error`` (and ``code``, -32000 by default) answers that
JSON-RPC error. LINE, if given, is written on stdout before each answer, as a server that
logs to the wrong stream does."""

from __future__ import annotations

import json
import sys


def _send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    """Answer initialize, tools/list and tools/call until stdin closes."""
    tools = json.loads(sys.argv[1])
    stray = sys.argv[2] if len(sys.argv) > 2 else None
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue  # a notification
        result: dict[str, object] = {}
        arguments = (message.get("params") or {}).get("arguments") or {}
        if method == "tools/call" and "error" in arguments:
            error = {"code": arguments.get("code", -32000), "message": arguments["error"]}
            _send({"jsonrpc": "2.0", "id": request_id, "error": error})
            continue
        if method == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": tools}
        elif method == "tools/call":
            params = message["params"]
            arguments = params.get("arguments") or {}
            text = arguments.get("text", f"ok {params['name']}") * arguments.get("times", 1)
            result = {"content": [{"type": "text", "text": text}], "isError": False}
        if stray is not None:
            sys.stdout.write(stray + "\n")
        _send({"jsonrpc": "2.0", "id": request_id, "result": result})


if __name__ == "__main__":
    main()
