"""Hostile requests to a real ``kestrel serve slack``: ``/slack/events`` checks the size and the
signature before it parses anything, then the body's shape, and refuses each bad one with a
401, 413 or 400 and one log line naming the cause; the run pages on the same listener never
answer 500. No traceback reaches the log, and the bot still works afterwards."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import aiohttp

from adapters.slack import ids
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.serving import free_port, serve_env, start_serve, wait_healthy
from tests.fakes.slack_api import FakeSlackApi, events_api_envelope, interactive_envelope
from tests.fakes.slack_client import (
    FORM,
    SlackSender,
    app_mention,
    block_actions,
    event_callback,
    view_submission,
)
from tests.fakes.slack_world import REQUESTER, SECRET, restart_script, write_config

TOKEN = "operator-token-for-hostile-bodies"
MIB = 1024 * 1024
NESTED = b"[" * 100_000


@dataclass(frozen=True)
class Case:
    """A body, whether it is signed, the status expected and the cause the log names."""

    body: bytes
    status: int
    cause: str
    signed: bool = True
    content_type: str = "application/json"


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


def _payload(value: object) -> bytes:
    return urlencode({"payload": json.dumps(value)}).encode()


def _click(**changes: object) -> dict[str, object]:
    click = block_actions(REQUESTER, ids.APPROVE_ONCE, "x", channel="C0001", message_ts="1.2")
    return {**click, **changes}


CASES = {
    "unsigned": Case(
        _json(event_callback(app_mention(REQUESTER, "hi"))), 401, "no Slack signature", signed=False
    ),
    "unsigned, nested": Case(NESTED, 401, "no Slack signature", signed=False),
    "over 1 MiB": Case(b"{" + b" " * MIB, 413, "the body is over 1048576 bytes"),
    "not UTF-8": Case(b'{"type": "\xff"}', 400, "the body is not UTF-8"),
    "not JSON": Case(b"{not json", 400, "the body is not JSON"),
    "an array": Case(b"[1, 2]", 400, "the body is not a JSON object"),
    "nested": Case(NESTED, 400, "the body nests too deep"),
    "type 5": Case(b'{"type": 5}', 400, "type is not a string"),
    "event a string": Case(
        _json({"type": "event_callback", "event": "x"}), 400, "event is not an object"
    ),
    "team a number": Case(
        _json(event_callback({**app_mention(REQUESTER, "hi"), "team": 5})),
        400,
        "event.team is neither an id nor an object",
    ),
    "no actions": Case(
        _payload(_click(actions=[])), 400, "block_actions has no actions", content_type=FORM
    ),
    "actions a string": Case(
        _payload(_click(actions="x")), 400, "actions is not a list of objects", content_type=FORM
    ),
    "user a string": Case(
        _payload(_click(user="U1")), 400, "user is not an object", content_type=FORM
    ),
    "view a string": Case(
        _payload({**view_submission(REQUESTER, ids.DENY_MODAL, "", {}), "view": "x"}),
        400,
        "view is not an object",
        content_type=FORM,
    ),
    "payload not JSON": Case(b"payload=%7Bnope", 400, "the payload is not JSON", content_type=FORM),
    "form, no command": Case(b"text=hi", 400, "no type and no command", content_type=FORM),
}


async def _raw_http(port: int, data: bytes) -> int:
    """The status a raw request gets, read as soon as it comes (the body may never be sent)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout=5)
    finally:
        writer.close()
    return int(line.split()[1])


async def _slack_cases(sender: SlackSender, port: int) -> Counter[str]:
    """Send every hostile Slack request; the causes the log must name, counted."""
    causes: Counter[str] = Counter()
    for name, case in CASES.items():
        headers = {"Content-Type": case.content_type}
        response = await sender.raw(case.body, headers, sign=case.signed)
        assert (response.status, response.text.strip()) == (case.status, case.cause), name
        causes[case.cause] += 1
    bad = await sender.bad_signature()
    stale = await sender.stale()
    assert (bad.status, stale.status) == (401, 401)
    causes["the signature does not match"] += 1
    causes["the signature's timestamp is more than five minutes off"] += 1
    # A 100 MiB body is announced but never sent: the answer comes without it.
    announced = "POST /slack/events HTTP/1.1\r\nHost: k\r\nContent-Length: 104857600\r\n"
    assert await _raw_http(port, f"{announced}\r\n{{".encode()) == 401
    causes["no Slack signature"] += 1
    signed = "".join(f"{k}: {v}\r\n" for k, v in sender.sign(b"{").items())
    assert await _raw_http(port, f"{announced}{signed}\r\n{{".encode()) == 413
    causes["the body is over 1048576 bytes"] += 1
    return causes


async def _web_cases(base: str, port: int) -> int:
    """Hostile requests to the run pages: none answers 500; how many aiohttp refused itself."""
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    expected = {
        "/runs?status=%ff%fe": 400,
        "/runs?may_answer=%ff%fe%c0%ae": 200,
        "/runs?limit=" + "9" * 4000: 200,  # clamped to 500
        "/runs?limit=" + "9" * 5000: 400,  # more digits than int() reads
        "/runs/%ff%fe": 404,
        "/runs/" + "%5B" * 2000: 404,
        "/runs/" + "9" * 4000 + "/fragment?v=%ff": 404,
        "/pending?%%%=%": 200,
        "/metrics?x=%zz": 200,
    }
    async with aiohttp.ClientSession() as http:
        for path, status in expected.items():
            async with http.get(base + path, headers=bearer) as response:
                assert response.status == status, path[:80]
        async with http.get(f"{base}/runs/r?exp=%ff&sig=" + "%5B" * 2000) as response:
            assert response.status == 403
    # What aiohttp refuses before any page sees it: a URL or a header over 8 KiB, bytes that
    # are not a URL, an Authorization header that is not UTF-8.
    unparsed = [
        b"GET /runs?status=" + b"x" * 9000 + b" HTTP/1.1\r\nHost: k\r\n\r\n",
        b"GET /runs HTTP/1.1\r\nHost: k\r\nAuthorization: Bearer " + b"a" * 9000 + b"\r\n\r\n",
        b"GET /runs/\xff\xfe HTTP/1.1\r\nHost: k\r\n\r\n",
    ]
    for data in unparsed:
        assert await _raw_http(port, data) == 400
    not_utf8 = b"GET /runs HTTP/1.1\r\nHost: k\r\nAuthorization: Bearer \xff\xfe\r\n\r\n"
    assert await _raw_http(port, not_utf8) == 401
    return len(unparsed)


async def test_hostile_bodies_and_queries_get_one_line_refusals(tmp_path: Path) -> None:
    async with FakeOpenAI(restart_script()) as model, FakeSlackApi() as api:
        config = write_config(tmp_path, model.base_url)
        port = free_port()
        env = serve_env(config, api.url, KESTREL_WEB_TOKEN=TOKEN)
        process = start_serve(tmp_path, port, env, "slack", verbose=True)
        try:
            await wait_healthy(port, process)
            base = f"http://127.0.0.1:{port}"
            sender = SlackSender(f"{base}/slack/events", SECRET, api=api)
            causes = await _slack_cases(sender, port)
            unparsed = await _web_cases(base, port)
            # After all that, the bot still takes a mention to its card.
            assert (await sender.event(app_mention(REQUESTER, "checkout is failing"))).status == 200
            await api.wait_for(
                lambda c: c.ok is True and ids.APPROVE_ONCE in json.dumps(c.args), timeout=20
            )
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=30)
        assert "Traceback" not in err, err[-3000:]
        logged = Counter(
            re.findall(r"kestrel.slack: slack: refused a request from \S+: (.*) \(\d+\)", err)
        )
        assert logged == causes
        assert len(re.findall(r"WARNING kestrel.http: .*400", err)) == unparsed, err[-3000:]


async def test_hostile_socket_mode_envelopes_are_acknowledged_and_refused(tmp_path: Path) -> None:
    async with FakeOpenAI(restart_script()) as model, FakeSlackApi() as api:
        config = write_config(tmp_path, model.base_url)
        refused = {
            "type is not a string": events_api_envelope({"type": 5}),
            "event is not an object": events_api_envelope({"type": "event_callback", "event": "x"}),
            "block_actions has no actions": interactive_envelope(_click(actions=[])),
            "user is not an object": interactive_envelope(_click(user="U1")),
            "the payload nests more than 64 levels": events_api_envelope(
                {
                    "type": "event_callback",
                    "event": {"type": "x", "deep": json.loads("[" * 80 + "]" * 80)},
                }
            ),
        }
        env = serve_env(config, api.url, SLACK_APP_TOKEN="xapp-1-test")
        process = start_serve(tmp_path, free_port(), env, "slack", verbose=True)
        try:
            await api.wait_for_socket(timeout=20)
            for envelope in refused.values():
                await api.wait_for_ack(await api.socket_send(envelope))
            # A payload the Socket Mode client itself cannot read: never acknowledged, one line.
            await api.socket_send(
                {"envelope_id": str(uuid.uuid4()), "type": "events_api", "payload": [1]}
            )
            mention = events_api_envelope(
                event_callback(app_mention(REQUESTER, "checkout is failing"))
            )
            await api.wait_for_ack(await api.socket_send(mention))
            await api.wait_for(
                lambda c: c.ok is True and ids.APPROVE_ONCE in json.dumps(c.args), timeout=20
            )
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=30)
        assert "Traceback" not in err, err[-3000:]
        logged = re.findall(r"refused a Socket Mode \S+ envelope: (.*)", err)
        assert sorted(logged) == sorted(refused)
        assert "Unsupported payload data type" in err
