"""Hostile tests of who may see the run pages and /metrics: header tricks, link tricks, path
tricks, and what /metrics labels carry."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.web.app import web_routes
from adapters.web.auth import WebConfig
from bot.chat.service import ChatService
from bot.cli.serving import ChatFront, front_settings
from bot.config.settings import ConfigError, WebSettings
from bot.domain import Session
from bot.people.policy import Actor, Policy
from bot.run.supervisor import Supervisor
from tests.adapters.web.conftest import POLICY, PUBLIC_URL, SCRIPT, SECRET, TOKEN, Site, serve
from tests.fakes.runtime import Counter, counting_tools, make_runtime


def signed(site: Site, run_id: str) -> str:
    assert site.config.signer is not None
    return site.config.signer.link(PUBLIC_URL, run_id).removeprefix(PUBLIC_URL)


async def fetch(
    http: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    async with http.request(method, url, headers=headers or {}, allow_redirects=False) as r:
        return r.status, await r.text()


# ------------------------------------------------------------------------------- the bearer


async def test_bearer_variants(site: Site, http: aiohttp.ClientSession) -> None:
    path = f"{site.url}/runs/{site.done}"
    for headers, expected in [
        ({"Authorization": f"bearer {TOKEN}"}, 200),  # RFC 7235: the scheme is case-insensitive
        ({"Authorization": f"Bearer {TOKEN}  "}, 200),
        ({"Authorization": f"Bearer  {TOKEN}"}, 200),
        ({"Authorization": f"Bearer {TOKEN}x"}, 401),
        ({"Authorization": f"Bearer {TOKEN[:-1]}"}, 401),
        ({"Authorization": f"Basic {TOKEN}"}, 401),
        ({"Authorization": f"Bearer{TOKEN}"}, 401),
        ({"Authorization": "Bearer"}, 401),
        ({"Authorization": ""}, 401),
        ({"Authorization": f"Bearer {TOKEN.upper()}"}, 401),
    ]:
        status, body = await fetch(http, "GET", path, headers)
        assert status == expected, headers
        if status != 200:
            assert "checkout" not in body


async def test_head_is_guarded_like_get(site: Site, http: aiohttp.ClientSession) -> None:
    for path in ("/runs", f"/runs/{site.done}", f"/runs/{site.done}/fragment", "/pending"):
        status, _ = await fetch(http, "HEAD", site.url + path)
        assert status == 401, path
        status, _ = await fetch(http, "HEAD", site.url + path, site.bearer())
        assert status == 200, path


async def test_an_empty_or_blank_token_opens_nothing(
    chat: tuple[ChatService, str, str, str], http: aiohttp.ClientSession
) -> None:
    service, done, _, _ = chat
    for token in ("", " ", "\t"):
        config = WebConfig.from_settings(WebSettings(), {"KESTREL_WEB_TOKEN": token})
        assert not config.enabled
        runner, url = await serve(web_routes(service, config))
        try:
            for auth in ("Bearer ", "Bearer", f"Bearer {token}", "Bearer \t"):
                status, body = await fetch(
                    http, "GET", f"{url}/runs/{done}", {"Authorization": auth}
                )
                assert status in (401, 403) and "checkout" not in body
        finally:
            await runner.cleanup()


def test_a_weak_operator_token_is_refused_at_startup() -> None:
    """KESTREL_WEB_SECRET must have 16 bytes; the operators' token, which opens every page of
    a listener that may face a network, has no minimum at all (and no rate limit)."""
    for weak in ("a", "1234", "token"):
        with pytest.raises(ConfigError):
            WebConfig.from_settings(WebSettings(), {"KESTREL_WEB_TOKEN": weak})


def test_the_bearer_comparison_is_constant_time() -> None:
    import inspect

    from adapters.web import auth

    source = inspect.getsource(auth.bearer_ok)
    assert "compare_digest" in source and "==" not in source.replace("!=", "")


# ------------------------------------------------------------------------------- signed links


async def test_link_tricks(site: Site, http: aiohttp.ClientSession) -> None:
    link = signed(site, site.done)
    query = link.partition("?")[2]
    exp = re.search(r"exp=(\d+)", query).group(1)  # type: ignore[union-attr]
    sig = re.search(r"sig=([0-9a-f]+)", query).group(1)  # type: ignore[union-attr]
    refused = [
        f"/runs/{site.waiting}/fragment?{query}",  # another run's live updates
        f"/runs/{site.waiting}/fragment?{query}&v=0",
        f"/runs?{query}&status=completed",  # the list
        f"/runs?{query}&status=",
        f"/pending?{query}",
        f"/runs/{site.done}?exp=1&exp={exp}&sig={sig}",  # duplicated, first one wrong
        f"/runs/{site.done}?exp={exp}&sig={sig.upper()}",
        f"/runs/{site.done}?exp=+{exp}&sig={sig}",
        f"/runs/{site.done}?exp={exp}.0&sig={sig}",
        f"/runs/{site.done}?exp={exp}&sig={sig}%00",
        f"/runs/{quote(site.done + chr(10))}?{query}",
        f"/runs/{site.done}%20?{query}",
        f"/runs/{site.done.upper()}?{query}",
    ]
    for path in refused:
        status, body = await fetch(http, "GET", site.url + path)
        assert status in (403, 404), (path, status)
        assert "Looking at checkout" not in body and "Deploying" not in body, path
    # The link with a bearer that is wrong: refused (never falls back to the link).
    status, _ = await fetch(http, "GET", site.url + link, site.bearer("wrong"))
    assert status == 401
    # Its own run and live updates: fine, also with a harmless extra parameter.
    for path in (link, f"/runs/{site.done}/fragment?{query}&v=x", f"{link}&x=1"):
        status, _ = await fetch(http, "GET", site.url + path)
        assert status == 200, path


async def test_a_link_signed_for_one_run_never_shows_another_through_the_fragment_version(
    site: Site, http: aiohttp.ClientSession
) -> None:
    query = signed(site, site.done).partition("?")[2]
    status, body = await fetch(http, "GET", f"{site.url}/runs/{site.waiting}/fragment?{query}&v=")
    assert status == 403 and site.request_id not in body


# ------------------------------------------------------------------------------- path tricks


async def test_path_tricks_get_404_or_400_never_500_nor_content(
    site: Site, http: aiohttp.ClientSession
) -> None:
    for path in [
        "/runs/..%2f",
        "/runs/..%2fpending",
        "/runs/%2e%2e",
        "/runs/%00",
        "/runs/run%00",
        f"/runs/{site.done}%00",
        "/runs/" + "a" * 7000,
        "/runs/%ff%fe",
        "/runs/%c0%ae%c0%ae",
        "/static/..%2fapp.py",
        "/static/%2e%2e/app.py",
        "/static/style.css%00.py",
        "/static//etc/passwd",
    ]:
        status, body = await fetch(http, "GET", site.url + path, site.bearer())
        if path == "/runs/%2e%2e":  # "/runs/..", which is "/": led to /runs, with nothing
            assert (status, body) == (302, ""), path
            continue
        assert status in (400, 404, 414, 431), (path, status, body[:200])
        assert "Traceback" not in body and "/work/" not in body, path


async def test_a_huge_limit_is_clamped(site: Site, http: aiohttp.ClientSession) -> None:
    for limit in ("100000", "-5", "0", "1_000", " 7 "):
        status, _ = await fetch(http, "GET", f"{site.url}/runs?limit={limit}", site.bearer())
        assert status in (200, 400), limit
    status, _ = await fetch(http, "GET", f"{site.url}/runs?may_answer={'x' * 201}", site.bearer())
    assert status == 400


# ------------------------------------------------------------------------------- /metrics


@pytest.fixture
async def front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[str, ChatService, list[str]]]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KESTREL_WEB_TOKEN", TOKEN)
    monkeypatch.setenv("KESTREL_WEB_SECRET", SECRET)
    rt, _ = await make_runtime(tmp_path / "k.db", SCRIPT, counting_tools(Counter()))
    rt.policy = Policy(POLICY)
    checked = front_settings([], WebSettings())
    front = ChatFront(Supervisor(rt), checked, host="127.0.0.1", port=0)
    await front.start()
    line = next(line for line in front.describe() if "listening" in line)
    port = re.search(r":(\d+) ", line).group(1)  # type: ignore[union-attr]
    chat = front._chat
    run_ids = []
    for n in range(3):
        session = Session(
            id=f"slack:T0001:C0001:17000000{n:02d}.000100",
            platform="slack",
            channel="C0001",
            thread=f"17000000{n:02d}.000100",
        )
        live = await chat.submit_turn("inspect checkout", user=Actor("U0REQ"), session=session)
        await chat.wait(live)
        run_ids.append(live.run_id)
    yield f"http://127.0.0.1:{port}", chat, run_ids
    await front.stop()
    await rt.store.close()


async def test_metrics_needs_the_token_and_labels_carry_no_ids(
    front: tuple[str, ChatService, list[str]], http: aiohttp.ClientSession
) -> None:
    url, _, run_ids = front
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {TOKEN}"}):
        status, body = await fetch(http, "GET", url + "/metrics", headers)
        assert status == 401 and "kestrel_" not in body
    status, _ = await fetch(http, "HEAD", url + "/metrics")
    assert status == 401
    async with http.get(url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        assert r.status == 200
        text = await r.text()
    values = {
        value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        for value in sample.labels.values()
    }
    assert values, text
    for run_id in run_ids:
        assert run_id not in text
    assert not {v for v in values if v.startswith(("run_", "req_", "U0", "slack:"))}, values
    assert len(values) < 60, values


async def test_metrics_and_readiness_count_no_login_another_site_sent(
    front: tuple[str, ChatService, list[str]], http: aiohttp.ClientSession
) -> None:
    url, _, _ = front
    browser = {"Authorization": aiohttp.encode_basic_auth("anyone", TOKEN)}
    elsewhere = browser | {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
    status, body = await fetch(http, "GET", url + "/metrics", elsewhere)
    assert status == 403 and "kestrel_" not in body and "another site" in body, body
    status, body = await fetch(http, "GET", url + "/metrics", browser)
    assert status == 200 and "kestrel_" in body
    _, detailed = await fetch(http, "GET", url + "/readyz", browser)
    _, plain = await fetch(http, "GET", url + "/readyz", elsewhere)
    assert plain != detailed and len(plain) < len(detailed), (plain, detailed)


async def test_metrics_responses_are_not_cached(
    front: tuple[str, ChatService, list[str]], http: aiohttp.ClientSession
) -> None:
    """/metrics is added beside the pages but not through ``_guarded``: its 200 (operational
    figures, fetched with the operators' token) carries no Cache-Control: no-store."""
    url, _, _ = front
    async with http.get(url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        assert r.status == 200
        assert r.headers.get("Cache-Control") == "no-store"
        assert r.headers.get("X-Content-Type-Options") == "nosniff"


async def test_the_real_listener_guards_every_page(
    front: tuple[str, ChatService, list[str]], http: aiohttp.ClientSession
) -> None:
    url, _, run_ids = front
    for path in ("/runs", f"/runs/{run_ids[0]}", f"/runs/{run_ids[0]}/fragment", "/pending"):
        for method in ("GET", "HEAD"):
            status, body = await fetch(http, method, url + path)
            assert status == 401, (method, path)
            assert "checkout" not in body
    status, body = await fetch(http, "GET", url + "/healthz")
    assert status == 200 and "run_" not in body


def test_link_expiry_default_is_a_day() -> None:
    config = WebConfig.from_settings(
        WebSettings(public_url=PUBLIC_URL), {"KESTREL_WEB_SECRET": SECRET}, clock=lambda: 1000.0
    )
    assert config.signer is not None
    query = config.signer.query("run_1")
    assert query.startswith(f"exp={1000 + 86400}&")
    assert config.signer.valid("run_1", str(1000 + 86400), query.partition("sig=")[2])
    assert not config.signer.valid("run_2", str(1000 + 86400), query.partition("sig=")[2])
    assert time.time() > 0
