"""Who may see the run pages: the operators' bearer token, or a link signed for one run."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web

from adapters.web.app import web_routes
from adapters.web.auth import CONTENT_SECURITY_POLICY, WebConfig, authorize
from bot.chat.service import ChatService
from bot.config.settings import ConfigError, WebSettings
from tests.adapters.web.conftest import PUBLIC_URL, SECRET, TOKEN, Site, serve

SECURITY = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def pages(site: Site) -> list[str]:
    return [
        "/runs",
        f"/runs/{site.done}",
        f"/runs/{site.done}/fragment",
        "/pending",
        "/runs?status=suspended",
    ]


def signed(site: Site, run_id: str) -> str:
    """The path and query of the signed link to ``run_id`` (the public URL's host stripped)."""
    assert site.config.signer is not None
    link = site.config.signer.link(PUBLIC_URL, run_id)
    assert link.startswith(PUBLIC_URL)
    return link.removeprefix(PUBLIC_URL)


async def get(
    http: aiohttp.ClientSession, url: str, **kwargs: object
) -> tuple[int, str, dict[str, str]]:
    async with http.get(url, allow_redirects=False, **kwargs) as response:  # type: ignore[arg-type]
        return response.status, await response.text(), dict(response.headers)


def login(user: str, password: str) -> dict[str, str]:
    """The header of a browser's Basic login (``aiohttp.BasicAuth`` is deprecated)."""
    return {"Authorization": aiohttp.encode_basic_auth(user, password)}


async def test_nothing_is_served_without_authorization(
    site: Site, http: aiohttp.ClientSession
) -> None:
    for path in pages(site):
        status, body, headers = await get(http, site.url + path)
        assert status == 401, path
        assert headers["WWW-Authenticate"].startswith("Bearer")
        assert "checkout" not in body and site.done not in body
        # Opened in a browser, which sends no token: the refusal says what gets one in.
        assert body == (
            "Authorization required: operators send Authorization: Bearer $KESTREL_WEB_TOKEN"
            " (a browser asks for it: any user name, the token as the password);"
            " a chat message's signed View run link opens that run's page.\n"
        ), body
        for name, value in SECURITY.items():
            assert headers[name] == value


async def test_a_wrong_bearer_is_refused_and_the_right_one_sees_every_page(
    site: Site, http: aiohttp.ClientSession
) -> None:
    # Either way, what is refused says what to send: the right token, or the scheme forgotten.
    said = (
        "That token is not valid: send Authorization: Bearer $KESTREL_WEB_TOKEN, the token this"
        " replica started with (a browser asks for it: any user name, the token as the"
        " password).\n"
    )
    for path in pages(site):
        status, body, headers = await get(http, site.url + path, headers=site.bearer("nope"))
        assert status == 401 and "invalid_token" in headers["WWW-Authenticate"]
        assert body == said
        status, body, headers = await get(http, site.url + path, headers={"Authorization": TOKEN})
        assert status == 401, "a token without the Bearer scheme"
        assert body == said
        status, _, headers = await get(http, site.url + path, headers=site.bearer())
        assert status == 200, path
        assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert headers["Cache-Control"] == "no-store"


async def test_a_signed_link_opens_its_run_and_nothing_else(
    site: Site, http: aiohttp.ClientSession
) -> None:
    link = signed(site, site.done)
    status, body, headers = await get(http, site.url + link)
    assert status == 200
    assert "Looking at checkout." in body
    assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert 'href="/pending"' not in body and 'href="/runs"' not in body  # no navigation
    query = link.partition("?")[2]
    status, _, _ = await get(http, f"{site.url}/runs/{site.done}/fragment?{query}")
    assert status == 200

    for path in (f"/runs/{site.waiting}", f"/runs/{site.waiting}/fragment", "/runs", "/pending"):
        status, body, _ = await get(http, f"{site.url}{path}?{query}")
        assert status == 403, path
        assert "Deploying" not in body and site.request_id not in body


async def test_a_live_run_opened_by_link_carries_the_signature_on_its_updates(
    site: Site, http: aiohttp.ClientSession
) -> None:
    link = signed(site, site.waiting)
    query = link.partition("?")[2].replace("&", "&amp;")
    status, body, _ = await get(http, site.url + link)
    assert status == 200
    assert f'data-live-url="/runs/{site.waiting}/fragment?{query}"' in body
    assert f'href="/runs/{site.waiting}?{query}"' in body  # Reload


async def test_an_altered_or_expired_link_gets_403(site: Site, http: aiohttp.ClientSession) -> None:
    link = signed(site, site.done)
    path, _, query = link.partition("?")
    params = dict(part.split("=", 1) for part in query.split("&"))
    exp, sig = params["exp"], params["sig"]
    flipped = ("0" if sig[0] != "0" else "1") + sig[1:]
    altered = [
        f"{path}?exp={exp}&sig={flipped}",
        f"{path}?exp={int(exp) + 1}&sig={sig}",
        f"{path}?exp={exp}",
        f"{path}?sig={sig}",
        f"{path}?exp=&sig=",
        f"{path}?exp={quote('²')}&sig={sig}",
        f"{path}?exp={exp}&sig={quote('é' * 64)}",
        f"{path}x?exp={exp}&sig={sig}",
        f"/runs/{site.waiting}?exp={exp}&sig={sig}",
    ]
    for url in altered:
        status, body, headers = await get(http, site.url + url)
        assert status == 403, url
        assert "checkout" not in body
        assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY

    site.clock[0] += 86400 + 1
    status, body, _ = await get(http, site.url + link)
    assert status == 403 and "expired" in body


async def test_without_token_or_secret_every_page_is_refused(
    chat: tuple[ChatService, str, str, str], http: aiohttp.ClientSession
) -> None:
    service, done, _, _ = chat
    config = WebConfig.from_settings(WebSettings(), {})
    assert not config.enabled
    runner, url = await serve(web_routes(service, config))
    try:
        for path in ("/runs", f"/runs/{done}", "/pending"):
            for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer x"}):
                status, body, _ = await get(http, url + path, headers=headers)
                assert status in (401, 403), (path, headers)
                assert "checkout" not in body
            status, body, _ = await get(http, url + path)
            assert status == 403 and "KESTREL_WEB_TOKEN" in body
        status, _, _ = await get(http, url + "/static/style.css")
        assert status == 200
    finally:
        await runner.cleanup()


async def test_a_refusal_names_no_link_that_no_chat_message_carries(
    chat: tuple[ChatService, str, str, str], http: aiohttp.ClientSession
) -> None:
    # With KESTREL_WEB_SECRET but no web.public_url, chat messages carry no "View run" link,
    # yet a page opened without credentials said that one "opens that run's page".
    service, done, _, _ = chat
    for environ, said in (
        (
            {"KESTREL_WEB_SECRET": SECRET},
            "Authorization required: a signed View run link opens one run's page, but chat"
            " messages carry none until web.public_url is set.\n",
        ),
        (
            {"KESTREL_WEB_SECRET": SECRET, "KESTREL_WEB_TOKEN": TOKEN},
            "Authorization required: operators send Authorization: Bearer $KESTREL_WEB_TOKEN"
            " (a browser asks for it: any user name, the token as the password);"
            " a signed View run link opens one run's page, but chat messages carry none until"
            " web.public_url is set.\n",
        ),
    ):
        config = WebConfig.from_settings(WebSettings(), environ)
        runner, url = await serve(web_routes(service, config))
        try:
            for path in ("/runs", f"/runs/{done}", "/pending"):
                status, body, _ = await get(http, url + path)
                assert (status, body) == (401, said), path
        finally:
            await runner.cleanup()


async def test_the_static_files_are_open_and_nothing_else_is(
    site: Site, http: aiohttp.ClientSession
) -> None:
    status, css, headers = await get(http, site.url + "/static/style.css")
    assert status == 200 and headers["Content-Type"].startswith("text/css")
    assert ".redacted" in css
    status, js, headers = await get(http, site.url + "/static/live.js")
    assert 'getElementById("run")' in js
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    for path in ("/static/", "/static/../app.py", "/static/templates/run.html", "/static/x.css"):
        status, _, _ = await get(http, site.url + path)
        assert status == 404, path


async def test_the_icon_is_served_to_anyone_where_browsers_ask_for_it(
    site: Site, http: aiohttp.ClientSession
) -> None:
    # A browser asks for /favicon.ico by itself (for a refusal's page too): a 404 there was an
    # error in its console on every page. The pages name the icon in their head.
    for path in ("/favicon.ico", "/static/favicon.svg"):
        status, svg, headers = await get(http, site.url + path)
        assert status == 200 and headers["Content-Type"].startswith("image/svg+xml"), path
        assert svg.startswith("<svg") and "<script" not in svg
    status, html, _ = await get(http, site.url + "/runs", headers=site.bearer())
    assert status == 200 and '<link rel="icon" href="/static/favicon.svg"' in html


def test_web_config_from_settings() -> None:
    settings = WebSettings(public_url=PUBLIC_URL, link_ttl_seconds=60, metrics_public=True)
    config = WebConfig.from_settings(settings, {"KESTREL_WEB_SECRET": SECRET})
    assert config.signer is not None and config.token == "" and config.metrics_public
    links = config.links()
    assert links is not None
    assert links("run_1", datetime.now(UTC)).startswith(f"{PUBLIC_URL}/runs/run_1?exp=")

    only_token = WebConfig.from_settings(WebSettings(), {"KESTREL_WEB_TOKEN": f" {TOKEN} "})
    assert only_token.token == TOKEN and only_token.signer is None and only_token.links() is None

    with pytest.raises(ConfigError, match="KESTREL_WEB_SECRET must be at least 16 bytes"):
        WebConfig.from_settings(WebSettings(), {"KESTREL_WEB_SECRET": "short"})
    with pytest.raises(ConfigError, match=r"web.public_url .* need KESTREL_WEB_SECRET"):
        WebConfig.from_settings(WebSettings(public_url=PUBLIC_URL), {"KESTREL_WEB_TOKEN": TOKEN})


async def test_the_listeners_root_leads_to_the_runs(
    site: Site, http: aiohttp.ClientSession
) -> None:
    # http://127.0.0.1:3000/ answered "404: Not Found": the pages are at /runs.
    status, _, headers = await get(http, site.url + "/")
    assert status == 302 and headers["Location"] == "/runs"
    assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY


async def test_a_browser_is_asked_for_the_token_as_its_password(
    site: Site, http: aiohttp.ClientSession
) -> None:
    # A browser cannot send a bearer token, but it asks its person for a Basic login when
    # told to: any user name, the operators' token as the password.
    async with http.get(site.url + "/runs", allow_redirects=False) as response:
        assert response.status == 401
        challenges = response.headers.getall("WWW-Authenticate")
    assert challenges[0].startswith("Bearer")
    assert 'Basic realm="kestrel", charset="UTF-8"' in challenges
    for path in pages(site):
        status, _body, _ = await get(http, site.url + path, headers=login("anyone", TOKEN))
        assert status == 200, path
    refused = [
        {"headers": login("anyone", "not-the-token-0123456789")},
        {"headers": login(TOKEN, "")},
        {"headers": {"Authorization": "Basic !!not base64!!"}},
        {"headers": {"Authorization": "Basic " + "b25seS1hLW5hbWU="}},  # "only-a-name", no colon
    ]
    for kwargs in refused:
        async with http.get(site.url + "/runs", allow_redirects=False, **kwargs) as response:  # type: ignore[arg-type]
            assert response.status == 401, kwargs
            assert "checkout" not in await response.text()
            # Asked again: the browser shows its login once more.
            assert any(c.startswith("Basic") for c in response.headers.getall("WWW-Authenticate"))


async def test_a_login_a_browser_sends_by_itself_opens_no_change(
    http: aiohttp.ClientSession,
) -> None:
    # A browser sends its Basic login with any request to the site, a form another site
    # posts included: the token as a login's password lets in reads (GET, HEAD) alone, so
    # a route that changes something, added later, is not opened by it. A bearer, which no
    # browser sends by itself, still is.
    config = WebConfig(token=TOKEN)

    async def change(request: web.Request) -> web.StreamResponse:
        access = authorize(request, config)
        return access if isinstance(access, web.Response) else web.Response(text="changed")

    app = web.Application()
    app.router.add_route("*", "/change", change)
    runner, url = await serve(app)
    try:
        browser = login("anyone", TOKEN)
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            async with http.request(method, url + "/change", headers=browser) as response:
                assert response.status == 401, method
                assert "changed" not in await response.text(), method
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            async with http.request(method, url + "/change", headers=bearer) as response:
                assert response.status == 200, method
        for method in ("GET", "HEAD"):
            async with http.request(method, url + "/change", headers=browser) as response:
                assert response.status == 200, method
    finally:
        await runner.cleanup()


async def test_a_signed_link_opens_its_run_in_a_browser_holding_a_stale_login(
    site: Site, http: aiohttp.ClientSession
) -> None:
    # A browser sends the login it was once given with every request to the listener; after
    # the token changed, that login must not shut the chat message's link out of its run.
    stale = login("anyone", "the-token-before-it-was-changed")
    link = signed(site, site.done)
    status, body, _ = await get(http, site.url + link, headers=stale)
    assert status == 200 and "Looking at checkout." in body
    query = link.partition("?")[2]
    status, _, _ = await get(http, f"{site.url}/runs/{site.done}/fragment?{query}", headers=stale)
    assert status == 200
    # The link opens its run alone; elsewhere the stale login is asked again.
    other = f"{site.url}/runs/{site.waiting}?{query}"
    status, body, _ = await get(http, other, headers=stale)
    assert status == 403 and "checkout" not in body
    async with http.get(site.url + "/runs", headers=stale) as response:
        assert response.status == 401 and "checkout" not in await response.text()
        challenges = response.headers.getall("WWW-Authenticate")
    assert 'Basic realm="kestrel", charset="UTF-8"' in challenges
    # A bearer's client says who it is: a wrong one is refused, link or not.
    wrong = {"Authorization": "Bearer not-the-token-0123456789"}
    status, body, _ = await get(http, site.url + link, headers=wrong)
    assert status == 401 and "checkout" not in body


async def test_with_links_alone_no_login_is_asked_for_and_none_opens_a_page(
    chat: tuple[ChatService, str, str, str], http: aiohttp.ClientSession
) -> None:
    # KESTREL_WEB_SECRET without KESTREL_WEB_TOKEN: there is no token to type, so a browser
    # is not asked for a login, and an empty one (the empty token) opens nothing.
    service, done, _, _ = chat
    config = WebConfig.from_settings(WebSettings(), {"KESTREL_WEB_SECRET": SECRET})
    runner, url = await serve(web_routes(service, config))
    try:
        for headers in (
            {},
            login("", ""),
            login("anyone", ""),
            {"Authorization": "Bearer "},
            {"Authorization": "Basic "},
            {"Authorization": "BASIC " + aiohttp.encode_basic_auth("a", "").split()[1]},
        ):
            for path in ("/runs", f"/runs/{done}", "/pending"):
                async with http.get(url + path, headers=headers) as response:
                    assert response.status == 401, (path, headers)
                    assert "checkout" not in await response.text()
                    challenges = response.headers.getall("WWW-Authenticate")
                assert not any(c.startswith("Basic") for c in challenges), (path, challenges)
    finally:
        await runner.cleanup()


def sent_from(site: str, *, navigation: bool = False) -> dict[str, str]:
    """The fetch metadata a browser adds to a request a page of ``site`` made (``navigation``:
    a link followed, else a fetch)."""
    if navigation:
        return {"Sec-Fetch-Site": site, "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
    return {"Sec-Fetch-Site": site, "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}


async def test_a_login_sent_with_another_sites_request_opens_nothing(
    site: Site, http: aiohttp.ClientSession
) -> None:
    # A browser sends its login with what any site makes it ask for: an image, a frame, a
    # fetch, a link followed. Said by the browser (Sec-Fetch-Site), none of those counts it.
    for credentials in (login("anyone", TOKEN), site.bearer()):
        for other in ("cross-site", "same-site", "Cross-Site"):
            for path in pages(site):
                headers = credentials | sent_from(other)
                status, body, answered = await get(http, site.url + path, headers=headers)
                assert status == 403, (other, path)
                assert "another site" in body and "checkout" not in body, body
                assert site.done not in body and site.request_id not in body
                for name, value in SECURITY.items():
                    assert answered[name] == value
        # What the person typed or bookmarked, and what the pages ask for themselves, count it.
        for own in ("none", "same-origin"):
            for path in pages(site):
                headers = credentials | sent_from(own, navigation=True)
                assert (await get(http, site.url + path, headers=headers))[0] == 200, path


async def test_a_person_who_followed_another_sites_link_is_offered_the_page_from_here(
    site: Site, http: aiohttp.ClientSession
) -> None:
    headers = login("anyone", TOKEN) | sent_from("cross-site", navigation=True)
    status, body, answered = await get(
        http, site.url + "/runs?status=failed&may_answer=%22%3E%3Cb%3E", headers=headers
    )
    assert status == 403 and answered["Content-Type"].startswith("text/html")
    assert "checkout" not in body and "<b>" not in body
    assert 'href="/runs?status=failed&amp;may_answer=%22%3E%3Cb%3E"' in body, body
    # A path that starts with two slashes stays on this listener: "//host" is another host.
    status, body, _ = await get(http, site.url + "//evil.example/runs", headers=headers)
    assert 'href="//' not in body


async def test_another_sites_link_to_a_run_opens_it_by_its_signature_alone(
    site: Site, http: aiohttp.ClientSession
) -> None:
    # A chat message's link is opened from the chat's site: the signature opens its run, the
    # browser's login (sent by itself) adds nothing, and another run stays shut.
    link = signed(site, site.done)
    query = link.partition("?")[2]
    headers = login("anyone", TOKEN) | sent_from("cross-site", navigation=True)
    status, body, _ = await get(http, site.url + link, headers=headers)
    assert status == 200 and "Looking at checkout." in body
    assert 'href="/pending"' not in body  # a link holder's page, not an operator's
    status, body, _ = await get(http, f"{site.url}/runs/{site.waiting}?{query}", headers=headers)
    assert status == 403 and "Deploying" not in body
