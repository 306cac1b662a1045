"""Discord's side of HTTP interactions: an application key pair, and interactions posted to an
endpoint signed as Discord signs them (Ed25519 over the timestamp and the body)."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from tests.fakes.discord_api import FakeDiscord


class InteractionPoster:
    """Signs and posts interactions for one application, noting them in the fake Discord."""

    def __init__(self, fake: FakeDiscord) -> None:
        self._key = Ed25519PrivateKey.generate()
        self._fake = fake

    @property
    def public_key(self) -> str:
        """What ``DISCORD_PUBLIC_KEY`` is set to."""
        raw = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return raw.hex()

    def headers(self, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
        """The signature headers Discord sends with ``body``."""
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        signature = self._key.sign(stamp.encode() + body).hex()
        return {
            "Content-Type": "application/json",
            "X-Signature-Ed25519": signature,
            "X-Signature-Timestamp": stamp,
        }

    async def post(self, url: str, data: dict[str, Any]) -> tuple[int, Any]:
        """Post interaction ``data`` to ``url`` as Discord would; the status and the answer
        (JSON, or the text of a refusal). A 200's answer becomes the interaction's response."""
        if data.get("type") != 1:
            self._fake.interaction_posted(data)
        body = json.dumps(data).encode()
        status, answer = await self.raw(url, body, self.headers(body))
        if status == 200 and data.get("type") != 1:
            self._fake.interaction_answered(str(data["id"]), answer)
        return status, answer

    async def raw(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
        """Post ``body`` with ``headers`` as they are."""
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=body, headers=headers) as response,
        ):
            text = await response.text()
            if response.content_type == "application/json":
                return response.status, json.loads(text)
            return response.status, text
