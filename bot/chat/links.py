"""Signed links to one run's page: what a chat message carries so that its readers can open
that run, and no other, for a while.

A link is ``{public_url}/runs/{run_id}?exp=EXPIRES&sig=HMAC``: the HMAC-SHA256 of the run id
and the expiry, with a secret only the servers hold (``KESTREL_WEB_SECRET``). Changing the
run, the expiry or the signature makes it worthless.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable
from datetime import datetime
from urllib.parse import quote

MIN_SECRET_BYTES = 16
_EXPIRES = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")


class LinkSigner:
    """Makes and checks run links with one secret."""

    def __init__(
        self, secret: str, ttl_seconds: float, *, clock: Callable[[], float] = time.time
    ) -> None:
        if len(secret.encode()) < MIN_SECRET_BYTES:
            raise ValueError(f"the link secret must be at least {MIN_SECRET_BYTES} bytes")
        self._key = secret.encode()
        self._ttl = ttl_seconds
        self._clock = clock

    def query(self, run_id: str, issued: float | None = None) -> str:
        """``exp=…&sig=…`` for a link to ``run_id`` that expires the TTL after ``issued``
        (default: now). A message issues its link once: the same message, the same link."""
        expires = int((self._clock() if issued is None else issued) + self._ttl)
        return f"exp={expires}&sig={self._sign(run_id, expires)}"

    def link(self, public_url: str, run_id: str, issued: float | None = None) -> str:
        """The whole link to ``run_id``'s page."""
        path = f"{public_url.rstrip('/')}/runs/{quote(run_id, safe='')}"
        return f"{path}?{self.query(run_id, issued)}"

    def valid(self, run_id: str, expires: str, signature: str) -> bool:
        """Whether ``signature`` signs ``run_id`` until ``expires`` and that is still ahead;
        anything malformed is simply not valid."""
        if not _EXPIRES.fullmatch(expires) or not _SIGNATURE.fullmatch(signature):
            return False
        if int(expires) < self._clock():
            return False
        return hmac.compare_digest(self._sign(run_id, int(expires)), signature)

    def _sign(self, run_id: str, expires: int) -> str:
        message = f"{run_id}\n{expires}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()


RunLink = Callable[[str, datetime], str]
"""A run's "View run" link, issued at a moment (a card's request, an answer's end)."""


def run_links(public_url: str | None, signer: LinkSigner | None) -> RunLink | None:
    """The links chat messages carry, when pages are public and links can be signed."""
    if not public_url or signer is None:
        return None
    base = public_url

    def link(run_id: str, issued: datetime) -> str:
        return signer.link(base, run_id, issued.timestamp())

    return link
