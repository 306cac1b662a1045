"""A store with real runs (the scripted model, in-process tools, the real supervisor) and the
run pages served over HTTP on localhost."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from adapters.web.app import web_routes
from adapters.web.auth import WebConfig
from bot.chat.service import ChatService
from bot.config.settings import WebSettings
from bot.domain import Session
from bot.people.policy import Actor, Policy, PolicyRules
from bot.prompter import DeferringPrompter
from bot.run.supervisor import Supervisor
from tests.fakes.runtime import Counter, counting_tools, make_runtime

TOKEN = "operator-token-0123456789"
SECRET = "link-secret-0123456789abcdef"
PUBLIC_URL = "https://kestrel.example.com"
THREAD = Session(
    id="slack:T0001:C0001:1700000000.000100",
    platform="slack",
    channel="C0001",
    thread="1700000000.000100",
)
HOSTILE = "<script>alert(1)</script>"
LONG = "".join(f"line {n}\n" for n in range(40))

POLICY = PolicyRules(
    requesters=["U0REQ"],
    approvers={"deploy": ["U0BOSS", "group:S0SRE"]},
)

# Position 0 by the prompt, position 1 by the tools' outputs.
SCRIPT: list[dict[str, Any]] = [
    {
        "one_of": [
            {
                "match": "^inspect",
                "text": "Looking at checkout.",
                "calls": [
                    {"name": "echo", "arguments": {"text": HOSTILE}},
                    {"name": "echo", "arguments": {"text": "mail <EMAIL_ADDRESS> now"}},
                    {"name": "echo", "arguments": {"text": LONG}},
                    {"name": "boom", "arguments": {"text": "x"}},
                ],
            },
            {
                "match": "^ship",
                "text": "Deploying v2 needs an approval.",
                "calls": [{"name": "deploy", "arguments": {"text": "v2"}}],
            },
        ]
    },
    {
        "one_of": [
            {"match": "deployed", "text": "Shipped v2."},
            {"text": 'All good.\n```json\n{"ok": true, "note": "<b>fine</b>"}\n```'},
        ]
    },
]


@dataclass
class Site:
    """The pages on localhost over a store with a completed and a suspended run."""

    url: str
    chat: ChatService
    config: WebConfig
    done: str  # a completed run
    waiting: str  # a run suspended on an approval of deploy
    request_id: str  # its open request
    clock: list[float] = field(default_factory=lambda: [1_700_000_000.0])

    def bearer(self, token: str = TOKEN) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def chat(tmp_path: Path) -> AsyncIterator[tuple[ChatService, str, str, str]]:
    rt, _ = await make_runtime(tmp_path / "k.db", SCRIPT, counting_tools(Counter()))
    rt.policy = Policy(POLICY)
    service = ChatService(Supervisor(rt))
    user = Actor("U0REQ")
    done = await service.submit_turn("inspect checkout", user=user, session=THREAD)
    await service.wait(done)
    waiting = await service.submit_turn(
        "ship v2", user=user, session=THREAD, prompter=DeferringPrompter()
    )
    state = await service.wait(waiting)
    (request,) = state.open_requests
    yield service, done.run_id, waiting.run_id, request.id
    await rt.store.close()


@pytest.fixture
async def site(chat: tuple[ChatService, str, str, str]) -> AsyncIterator[Site]:
    service, done, waiting, request_id = chat
    clock = [1_700_000_000.0]
    environ = {"KESTREL_WEB_TOKEN": TOKEN, "KESTREL_WEB_SECRET": SECRET}
    config = WebConfig.from_settings(
        WebSettings(public_url=PUBLIC_URL), environ, clock=lambda: clock[0]
    )
    runner, url = await serve(web_routes(service, config))
    yield Site(url, service, config, done, waiting, request_id, clock)
    await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
