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

from adapters.web.auth import SECURITY_HEADERS
from bot.domain import Session
from bot.records import RunRecord
from storage.sqlite import open_sqlite
from tests.adapters.web.test_pages import big_run
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.processes import KESTREL
from tests.fakes.serving import free_port, serve_env, start_serve, wait_healthy
from tests.fakes.slack_world import write_config
from tests.fakes.waiting import until

TOKEN = "operator-token-for-tests"
LONG = 3_000


async def _write_long_run(db: Path) -> int:
    """A finished run of a few thousand entries, written in bulk beside the real one."""
    store = await open_sqlite(db)
    try:
        _, records = big_run(LONG)
        session = Session(id="slack:T1:C1:1.1", platform="slack", channel="C1", thread="1.1")
        run = RunRecord(id="run_big", session_id=session.id, requested_by="U1")
        await store.create_run(run, "gone", 1.0, session, [r.entry for r in records])
    finally:
        await store.close()
    return len(records)


async def _long_page_while_healthy(
    http: aiohttp.ClientSession, base: str, bearer: dict[str, str]
) -> None:
    """The long run's page, an older page and its live fragment, while ``/healthz`` is asked
    every 10 ms: it answers throughout."""
    answered: list[int] = []
    stop = asyncio.Event()

    async def probe() -> None:
        while not stop.is_set():
            async with http.get(f"{base}/healthz") as response:
                answered.append(response.status)
            await asyncio.sleep(0.01)

    probing = asyncio.create_task(probe())
    try:
        for _ in range(3):
            async with http.get(f"{base}/runs/run_big", headers=bearer) as response:
                assert response.status == 200
                page = await response.text()
            assert 'id="earlier"' in page and 'id="seq-0"' not in page
            assert 'id="result-text">done<' in page
            version = page.split('data-version="', 1)[1].split('"', 1)[0]
            fragment = f"{base}/runs/run_big/fragment"
            async with http.get(f"{fragment}?v={version}", headers=bearer) as response:
                assert response.status == 204
            async with http.get(fragment, headers=bearer) as response:
                assert response.status == 200
            async with http.get(f"{base}/runs/run_big?before=10", headers=bearer) as response:
                assert response.status == 200 and 'id="seq-0"' in await response.text()
        after = len(answered)
        await until(lambda: len(answered) >= after + 2, timeout=10)  # probes after the last page
    finally:
        stop.set()
        await probing
    assert len(answered) >= 3 and set(answered) == {200}, answered


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
        long_entries = await _write_long_run(tmp_path / "kestrel.db")
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
                await _long_page_while_healthy(http, base, bearer)
                async with http.get(f"{base}/metrics") as response:
                    assert response.status == 401
                    # Opened first in a browser, it asks for the login the pages take.
                    challenges = response.headers.getall("WWW-Authenticate")
                    assert challenges[0].startswith("Bearer")
                    assert 'Basic realm="kestrel", charset="UTF-8"' in challenges
                    # Says what lets a scraper in, as the pages and the 403 do.
                    assert await response.text() == (
                        "Authorization required: a scraper sends Authorization: Bearer"
                        " $KESTREL_WEB_TOKEN (a browser asks for it: any user name, the token as"
                        " the password), or set web.metrics_public: true to serve /metrics"
                        " without it.\n"
                    )
                login = {"Authorization": aiohttp.encode_basic_auth("anyone", TOKEN)}
                async with http.get(f"{base}/metrics", headers=login) as response:
                    assert response.status == 200
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
        assert runs["completed"] == 2
        # No platform served: no backlog series; no _created series; the version is told.
        names = {family.name for family in text_string_to_metric_families(text)}
        assert "kestrel_outbox_backlog" in names and "kestrel_outbox_backlog{" not in text
        assert "_created" not in text and "kestrel_build_info{version=" in text
        assert "process_start_time_seconds" in names

        exported = tmp_path / "incident.html"
        done = await asyncio.to_thread(
            _kestrel, tmp_path, env, "runs", "export", run_id, "--html", str(exported)
        )
        assert done.returncode == 0, done.stderr
        html = exported.read_text()
        assert "&lt;script&gt;alert(1)" in html and "<script" not in html.lower()
        long = await asyncio.to_thread(
            _kestrel, tmp_path, env, "runs", "export", "run_big", "--html", str(exported)
        )
        assert long.returncode == 0, long.stderr
        # The whole timeline, streamed a chunk at a time: every call of the run.
        html = exported.read_text()
        assert html.count('<li class="call') == 3 * ((long_entries - 4) // 4)
        assert html.rstrip().endswith("</html>") and "<script>alert" not in html
        unknown = await asyncio.to_thread(
            _kestrel, tmp_path, env, "runs", "export", "run_nope", "--html", str(exported)
        )
        assert unknown.returncode == 2 and "run_nope" in unknown.stderr


async def _raw(port: int, request: bytes) -> bytes:
    """``request`` as sent, byte for byte (no client would send it), and the whole answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    return answer


async def test_a_request_serve_cannot_parse_never_puts_a_credential_in_the_log(
    tmp_path: Path,
) -> None:
    """aiohttp's parser quotes the line it refused; the log says what was wrong without it: a
    token a client sent with a stray byte, or a signed link with a query past 8 KiB."""
    secret = "link-secret-for-tests-0123456789"
    config = write_config(
        tmp_path, "http://127.0.0.1:9/v1", extra_config={"web": {"public_url": "https://k.test"}}
    )
    env = serve_env(
        config, "http://127.0.0.1:9/api/", KESTREL_WEB_TOKEN=TOKEN, KESTREL_WEB_SECRET=secret
    )
    signature = "5f" * 32
    link = f"/runs/run_x?exp=4102444800&sig={signature}"
    port = free_port()
    process = start_serve(tmp_path, port, env)
    try:
        await wait_healthy(port, process)
        bad = [
            f"GET /runs HTTP/1.1\r\nHost: k\r\nAuthorization: Bearer {TOKEN}\x01\r\n\r\n",
            f"GET /runs HTTP/1.1\r\nHost: k\r\nAuthorization : Bearer {TOKEN}\r\n\r\n",
            f"GET /runs HTTP/1.1\r\nHost: k\r\nAuthorization: Bearer {TOKEN}{'x' * 9000}\r\n\r\n",
            f"GET {link}&utm={'x' * 9000} HTTP/1.1\r\nHost: k\r\n\r\n",
            f"GET {link}\x00 HTTP/1.1\r\nHost: k\r\n\r\n",
        ]
        for request in bad:
            answer = await _raw(port, request.encode())
            assert answer.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400")), answer[:100]
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(process.communicate, timeout=30)
    refused = [line for line in err.splitlines() if "kestrel.http" in line]
    assert len(refused) == len(bad), err[-3000:]
    assert all("WARNING" in line and "400" in line for line in refused), refused
    assert TOKEN not in err and TOKEN[:12] not in err, err[-3000:]
    assert signature not in err and signature[:16] not in err, err[-3000:]


def _headers(answer: bytes) -> dict[str, str]:
    """A raw answer's headers, by their lower-cased names."""
    head = answer.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]
    return {
        name.strip().lower(): value.strip() for name, _, value in (h.partition(":") for h in head)
    }


async def test_what_serve_cannot_parse_is_answered_with_the_security_headers(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    env = serve_env(config, "http://127.0.0.1:9/api/", KESTREL_WEB_TOKEN=TOKEN)
    port = free_port()
    process = start_serve(tmp_path, port, env)
    try:
        await wait_healthy(port, process)
        bad = [
            b"GET /runs HTTP/9.x\r\nHost: k\r\n\r\n",  # a bad request line
            b"NOT HTTP AT ALL\r\n\r\n",
            b"GET /runs HTTP/1.1\r\nHost: k\r\nBad Header: x\r\n\r\n",
            b"GET /runs HTTP/1.1\r\nHost: k\r\nX-Long: " + b"x" * 9000 + b"\r\n\r\n",
        ]
        for request in bad:
            answer = await _raw(port, request)
            assert answer.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400")), answer[:100]
            headers = _headers(answer)
            for name, value in SECURITY_HEADERS.items():
                assert headers.get(name.lower()) == value, (request[:30], answer[:400])
            assert "server" not in headers, answer[:400]
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.communicate, timeout=30)


async def test_metrics_without_a_token_configured_say_how_to_turn_them_on(tmp_path: Path) -> None:
    # Asking for a token nobody could have sent left a newcomer guessing which token.
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    port = free_port()
    process = start_serve(tmp_path, port, serve_env(config, "http://127.0.0.1:9/api/"))
    try:
        await wait_healthy(port, process)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/metrics") as response,
        ):
            status, text = response.status, await response.text()
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.communicate, timeout=30)
    assert status == 403
    assert text == (
        "The metrics are off: set KESTREL_WEB_TOKEN (operators), or web.metrics_public: true"
        " (a scraper without the token).\n"
    )
