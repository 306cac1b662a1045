"""A catalog command run by a real ``kestrel serve slack`` finds none of Kestrel's secrets: not
in its ``/proc`` entries, its configuration, ``.env`` or a hidden file (as root in CI)."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.serving import free_port, start_serve, wait_healthy
from tests.fakes.slack_api import FakeSlackApi, events_api_envelope
from tests.fakes.slack_client import app_mention, event_callback
from tests.fakes.snoop import SCRIPT, SECRETS, found, prepare

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/ns/pid").exists(), reason="needs Linux namespaces"
)


async def test_a_command_run_by_serve_finds_none_of_its_secrets(tmp_path: Path) -> None:
    async with FakeOpenAI(SCRIPT) as model, FakeSlackApi() as api:
        env = prepare(tmp_path, {"provider": "openai", "name": "fake", "max_retries": 0})
        env.update(OPENAI_BASE_URL=model.base_url, SLACK_API_URL=api.url)
        port = free_port()
        process = start_serve(tmp_path, port, env, "slack")
        try:
            await wait_healthy(port, process)
            await api.wait_for_socket(timeout=20)  # .env holds SLACK_APP_TOKEN: Socket Mode
            mention = event_callback(app_mention("U0REQ", "find the secrets"))
            await api.wait_for_ack(await api.socket_send(events_api_envelope(mention)))
            await api.wait_for(lambda c: "done" in json.dumps(c.args), timeout=20)
        finally:
            process.send_signal(signal.SIGTERM)
            out, err = await asyncio.to_thread(process.communicate, timeout=30)
    output = json.dumps(model.requests[-1]["messages"][-1])
    assert "SNOOP-DONE" in output and "ppid=1 processes=" in output, output
    posted = json.dumps([c.args for c in api.calls])
    journal = (tmp_path / "kestrel.db").read_bytes().decode(errors="replace")
    assert "SNOOP-DONE" in journal
    assert found(output) == found(posted) == found(journal) == found(out + err) == []
    assert len(SECRETS) == 9
