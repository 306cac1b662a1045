"""Who may see the run pages, and the headers every response carries.

Two ways in, nothing else:

- ``Authorization: Bearer <KESTREL_WEB_TOKEN>``: an operator, who sees every page; a browser,
  which cannot send one, is asked for a Basic login instead, the token as its password (any
  user name), which opens reads (GET, HEAD) alone: credentials a browser sends by itself, to
  a form another site posts too, change nothing;
- a signed link (``?exp=…&sig=…``, made by ``bot.chat.links.LinkSigner`` with
  ``KESTREL_WEB_SECRET``): that one run's page and its live updates, until it expires.

With neither configured, every page is refused (never open). A missing bearer gets 401 with
``WWW-Authenticate: Bearer`` (and ``Basic``); a forged, altered or expired link gets 403 and
shows nothing. A wrong Basic login beside a link (one a browser kept from before the token
changed) leaves the link to decide; a wrong bearer is refused, link or not.

A browser sends its login with whatever another site makes it ask for (a link, a frame, an
image, a script, a ``fetch``). A request a browser says another site made (``Sec-Fetch-Site``
other than ``same-origin`` or ``none``) counts no login: a signed link still opens its run
(a chat message's link is opened from the chat's site), anything else gets 403; a person who
followed another site's link (an expired one too) is offered the same page from here, one
click away, where the browser's login counts. A client that sends no ``Sec-Fetch-Site`` (curl,
Prometheus) is no browser, and is unaffected.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass

from aiohttp import web
from markupsafe import escape

from bot.chat.contract import ConfigError, WebSettings
from bot.chat.links import MIN_SECRET_BYTES, LinkSigner, RunLink, run_links

TOKEN_VARIABLE = "KESTREL_WEB_TOKEN"
SECRET_VARIABLE = "KESTREL_WEB_SECRET"

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; script-src 'self';"
    " connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    # No other site's page gets a response of this listener (an image, a script), nor a
    # handle on the window of one it opened.
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
# What a browser says of a request its own person made (the address bar, a bookmark) or a
# page of this listener made; anything else (``cross-site``, ``same-site``) another site made.
_OWN_SITES = frozenset({"same-origin", "none"})
INVALID_LINK = "This link is not valid: it was altered, or it has expired."


@dataclass(frozen=True)
class WebConfig:
    """How the pages are guarded: the operators' token ("" for none), the link signer (None
    without ``KESTREL_WEB_SECRET``), and whether ``/metrics`` needs no token."""

    token: str = ""
    signer: LinkSigner | None = None
    metrics_public: bool = False
    public_url: str | None = None

    @classmethod
    def from_settings(
        cls,
        settings: WebSettings,
        environ: Mapping[str, str],
        *,
        clock: Callable[[], float] = time.time,
    ) -> WebConfig:
        """From the ``web:`` settings and the environment (``KESTREL_WEB_TOKEN``,
        ``KESTREL_WEB_SECRET``); a ``ConfigError`` names what is wrong."""
        token = environ.get(TOKEN_VARIABLE, "").strip()
        if token and len(token.encode()) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"{TOKEN_VARIABLE} must be at least {MIN_SECRET_BYTES} bytes: it opens every"
                f" page (it has {len(token.encode())})"
            )
        secret = environ.get(SECRET_VARIABLE, "")
        signer = None
        if secret:
            if len(secret.encode()) < MIN_SECRET_BYTES:
                raise ConfigError(
                    f"{SECRET_VARIABLE} must be at least {MIN_SECRET_BYTES} bytes"
                    f" (it has {len(secret.encode())})"
                )
            signer = LinkSigner(secret, settings.link_ttl_seconds, clock=clock)
        elif settings.public_url:
            raise ConfigError(
                f"web.public_url is set, but its signed 'View run' links need {SECRET_VARIABLE}"
                f" (a secret of at least {MIN_SECRET_BYTES} bytes) in the environment"
            )
        return cls(token, signer, settings.metrics_public, settings.public_url or None)

    @property
    def enabled(self) -> bool:
        """Whether anyone at all may see a page."""
        return bool(self.token) or self.signer is not None

    def links(self) -> RunLink | None:
        """The signed "View run" links chat messages carry (None without ``public_url``)."""
        return run_links(self.public_url, self.signer)


@dataclass(frozen=True)
class Access:
    """Who is looking: an operator (every page), or a link's holder (``run_id`` only)."""

    operator: bool
    run_id: str = ""
    query: str = ""  # the link's ``exp=…&sig=…``, to carry on the page's own URLs


OPERATOR = Access(operator=True)


def secure(headers: MutableMapping[str, str]) -> None:
    """Set the security headers every response of the pages carries."""
    headers.update(SECURITY_HEADERS)


def bearer_ok(request: web.BaseRequest, config: WebConfig) -> bool:
    """Whether the request carries the operators' token, as a bearer or, to a read (GET,
    HEAD), as a Basic login's password (constant-time comparison), and no other site made
    it."""
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    token_of = _TOKEN_OF.get(scheme.lower())
    if not config.token or token_of is None or from_elsewhere(request):
        return False
    # A browser sends its login with whatever any site makes it send, a posted form too: the
    # login opens reads alone, so that a route which changes something is never opened by it.
    if token_of is _basic_password and request.method not in _READS:
        return False
    given = token_of(value.strip().encode("utf-8", "surrogateescape"))
    return hmac.compare_digest(given, config.token.encode("utf-8", "surrogateescape"))


def from_elsewhere(request: web.BaseRequest) -> bool:
    """Whether a browser says another site's page made the request (``Sec-Fetch-Site``); a
    request that says nothing is from no browser, or its person."""
    site = request.headers.get("Sec-Fetch-Site")
    return site is not None and site.strip().lower() not in _OWN_SITES


def elsewhere(request: web.BaseRequest, *, linked: bool = False) -> web.Response:
    """The refusal of a request another site made: 403; to a person who followed another
    site's link, a page offering the same address from here (a link of this listener, which
    the browser then sends with its login). ``linked``: its signed link opened nothing (an
    operator's login may open it from here)."""
    said = "Another site opened this page, and the run pages take no login with what another"
    said += " site asks for"
    navigated = request.headers.get("Sec-Fetch-Mode", "").lower() == "navigate"
    if not (navigated and request.headers.get("Sec-Fetch-Dest", "").lower() == "document"):
        if linked:
            return refusal(403, INVALID_LINK)
        return refusal(403, said + ": open the page by its address, or a chat message's link.")
    if linked:
        said = f"{INVALID_LINK} The operators' login may still open it, though not from another"
        said += " site"
    # One leading slash: "//host" would be another host's address.
    here = escape("/" + request.rel_url.raw_path_qs.lstrip("/"))
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="referrer" content="no-referrer"><meta name="robots" content="noindex">'
        "<title>Opened from another site · Kestrel</title>"
        '<link rel="stylesheet" href="/static/style.css"></head><body><main id="main">'
        f'<h1>Opened from another site</h1><p id="elsewhere">{said}: <a href="{here}">open it'
        " here</a>, or type its address.</p></main></body></html>"
    )
    response = web.Response(status=403, text=page, content_type="text/html", charset="utf-8")
    secure(response.headers)
    return response


def _basic_password(credentials: bytes) -> bytes:
    """The password of a Basic login (``base64(user:password)``); empty when it holds none."""
    try:
        decoded = base64.b64decode(credentials, validate=True)
    except binascii.Error:
        return b""
    _user, colon, password = decoded.partition(b":")
    return password if colon else b""


_READS = frozenset({"GET", "HEAD"})

# What the token is, by the Authorization header's scheme: a bearer's value, a Basic login's
# password.
_TOKEN_OF: Mapping[str, Callable[[bytes], bytes]] = {
    "bearer": lambda value: value,
    "basic": _basic_password,
}


def challenge(
    response: web.Response, config: WebConfig, error: str = "", *, basic: bool = True
) -> web.Response:
    """``response`` asking for the token: as a bearer, and (``basic``) as a Basic login's
    password, which makes a browser ask its person (only where there is a token to give)."""
    bearer = 'Bearer realm="kestrel"' + (f', error="{error}"' if error else "")
    response.headers.add("WWW-Authenticate", bearer)
    if basic and config.token:
        response.headers.add("WWW-Authenticate", 'Basic realm="kestrel", charset="UTF-8"')
    return response


def authorize(
    request: web.BaseRequest, config: WebConfig, run_id: str = ""
) -> Access | web.Response:
    """Who may see the page asked for (``run_id``: the run it shows, if any), or the refusal."""
    if not config.enabled:
        return refusal(
            403,
            f"The run pages are off: set {TOKEN_VARIABLE} (operators), or web.public_url"
            f" and {SECRET_VARIABLE} (signed links).",
        )
    query = request.rel_url.query
    linked = "exp" in query or "sig" in query
    if from_elsewhere(request):
        # Whatever login the browser sent, it sent by itself: the link alone decides. One
        # that opens nothing (expired) is offered from here, where an operator's login counts.
        access = _linked(query, config, run_id) if linked else None
        return access or elsewhere(request, linked=linked)
    if "Authorization" in request.headers:
        if bearer_ok(request, config):
            return OPERATOR
        basic = request.headers["Authorization"][:6].lower() == "basic "
        # A browser sends a login it was once given (a token since changed) by itself, with
        # a chat message's link too: the link decides. A bearer's client chose what it sent.
        if not (basic and linked):
            response = refusal(401, _NOT_VALID)
            # A bearer's client is told in its own scheme; a browser's login is asked again.
            return challenge(response, config, "invalid_token", basic=basic)
    if linked:
        return _linked(query, config, run_id) or refusal(403, INVALID_LINK)
    return challenge(refusal(401, _unauthorized(config)), config)


def _linked(query: Mapping[str, str], config: WebConfig, run_id: str) -> Access | None:
    """What a signed link (``exp``, ``sig``) opens: its run (``run_id``) alone, or nothing."""
    expires, signature = query.get("exp", ""), query.get("sig", "")
    if run_id and config.signer and config.signer.valid(run_id, expires, signature):
        return Access(operator=False, run_id=run_id, query=f"exp={expires}&sig={signature}")
    return None


# A wrong token, or the right one without its scheme (``Authorization: TOKEN``).
_NOT_VALID = (
    f"That token is not valid: send Authorization: Bearer ${TOKEN_VARIABLE}, the token this"
    " replica started with (a browser asks for it: any user name, the token as the password)."
)


def _unauthorized(config: WebConfig) -> str:
    """What a request without credentials is told: what would let it in (a browser opening a
    page sends no token, and its person would otherwise not know what the page wants)."""
    ways = []
    if config.token:
        ways.append(
            f"operators send Authorization: Bearer ${TOKEN_VARIABLE} (a browser asks for it:"
            " any user name, the token as the password)"
        )
    if config.links() is not None:
        ways.append("a chat message's signed View run link opens that run's page")
    elif config.signer is not None:  # links can be checked, but no chat message carries one
        ways.append(
            "a signed View run link opens one run's page, but chat messages carry none until"
            " web.public_url is set"
        )
    return "Authorization required: " + "; ".join(ways) + "."


def refusal(status: int, text: str) -> web.Response:
    """A one-line refusal that shows nothing else."""
    response = web.Response(status=status, text=text + "\n", content_type="text/plain")
    secure(response.headers)
    return response
