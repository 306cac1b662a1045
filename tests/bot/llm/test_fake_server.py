"""The fake OpenAI server as a separate process, as crash tests use it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

from bot.domain import AssistantTurn, ToolCall
from bot.llm.base import (
    AssistantMessage,
    Message,
    ToolResultItem,
    ToolResultsMessage,
    UserMessage,
)
from bot.llm.openai_provider import OpenAIProvider

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = """\
- calls: [{name: service_status, arguments: {service: checkout}}]
- text: done
"""


def _wait_for(path: Path, seconds: float = 10.0) -> str:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text(encoding="utf-8")


async def test_standalone_server_logs_every_request(tmp_path: Path) -> None:
    script, port_file, log = tmp_path / "s.yaml", tmp_path / "port", tmp_path / "requests.jsonl"
    script.write_text(SCRIPT, encoding="utf-8")
    command = [sys.executable, "-m", "tests.fakes.openai_server", "--script", str(script)]
    command += ["--port-file", str(port_file), "--log", str(log), "--fail", "503"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = await asyncio.create_subprocess_exec(*command, cwd=ROOT, env=env)
    try:
        port = int(await asyncio.to_thread(_wait_for, port_file))
        model = OpenAIProvider("m", api_key="k", base_url=f"http://127.0.0.1:{port}/v1")
        first = await model.complete([UserMessage("checkout?")], [], timeout=5)
        call = ToolCall(id="call_1", name="service_status", arguments="{}")
        resumed: list[Message] = [
            UserMessage("checkout?"),
            AssistantMessage(AssistantTurn(calls=(call,), finish_reason="tool_calls")),
            ToolResultsMessage((ToolResultItem(call_id="call_1", name="x", output="down"),)),
        ]
        second = await model.complete(resumed, [], timeout=5)
        await model.aclose()
    finally:
        server.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(server.wait(), 10) == 0

    assert [c.name for c in first.calls] == ["service_status"]
    assert second.text == "done"
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 3  # the injected 503, its retry, and the second call
    assert lines[2]["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "down"}
