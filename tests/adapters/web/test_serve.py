"""The run pages, /metrics and the export as a user meets them: a real ``kestrel serve`` and a
real ``kestrel runs export``, on a store with a real run."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.processes import KESTREL
from tests.fakes.serving import free_port, serve_env, start_serve, wait_healthy
from tests.fakes.slack_world import write_config

TOKEN = "operator-token-for-tests"


def _kestrel(folder: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KESTREL, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=60
    )


async def test_pages_and_metrics_of_a_finished_run(tmp_path: Path) -> None:
    script = [{"text": "Checkout is fine: <script>alert(1)</script>"}]
    async with FakeOpenAI(script) as model:
        config = write_config(tmp_path, model.base_url)
        env = serve_env(config, "http://127.0.0.1:9/api/", KESTREL_WEB_TOKEN=TOKEN)
        done = await asyncio.to_thread(_kestrel, tmp_path, env, "run", "how is checkout?", "--json")
        assert done.returncode == 0, done.stderr
        run_id = json.loads(done.stdout)["run_id"]
        port = free_port()
        process = start_serve(tmp_path, port, env)
        try:
            await wait_healthy(port, process)
            base = f"http://127.0.0.1:{port}"
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{base}/runs/{run_id}") as response:
                    assert response.status == 401
                async with http.get(f"{base}/runs/{run_id}", headers=bearer) as response:
                    assert response.status == 200
                    page = await response.text()
                    assert "Content-Security-Policy" in response.headers
                assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
                assert "<script>alert(1)" not in page
                async with http.get(f"{base}/metrics") as response:
                    assert response.status == 401
                async with http.get(f"{base}/metrics", headers=bearer) as response:
                    assert response.status == 200
                    text = await response.text()
        finally:
            process.send_signal(signal.SIGTERM)
            await asyncio.to_thread(process.communicate, timeout=30)
        runs = {
            sample.labels["status"]: sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "kestrel_runs"
            for sample in family.samples
        }
        assert runs["completed"] == 1

        exported = tmp_path / "incident.html"
        done = await asyncio.to_thread(
            _kestrel, tmp_path, env, "runs", "export", run_id, "--html", str(exported)
        )
        assert done.returncode == 0, done.stderr
        html = exported.read_text()
        assert "&lt;script&gt;alert(1)" in html and "<script" not in html.lower()
        unknown = await asyncio.to_thread(
            _kestrel, tmp_path, env, "runs", "export", "run_nope", "--html", str(exported)
        )
        assert unknown.returncode == 2 and "run_nope" in unknown.stderr
