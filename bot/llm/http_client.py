"""The HTTP client under the openai client, reading a failed request's body only so far.

The openai client reads the whole body of an error reply to quote it: a server or a proxy that
answers 500 with a runaway body (a log, a page that never ends) filled the memory before the
call's timeout could end it. A 200's body is capped where it is read (``read_capped``).
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from typing import Any, Final

import openai

# What an error says is near its top (``error_body`` reads 64 KiB of a page at most).
ERROR_BODY_BYTES: Final = 64 * 1024


def _library() -> Any:
    """The HTTP library the openai client runs on: httpx2, or httpx before openai moved to it
    (the package of its default client's first base that is not openai's own)."""
    bases = openai.DefaultAsyncHttpxClient.__mro__
    packages = (base.__module__.partition(".")[0] for base in bases)
    return importlib.import_module(next(p for p in packages if p not in ("openai", "builtins")))


# A response's body is read only if it is that library's stream type.
_HTTP: Any = _library()


class _Head(_HTTP.AsyncByteStream):  # type: ignore[misc]  # the base found above, typed Any
    """The first ``limit`` bytes of a body as it arrives; what follows is never read, and
    closing the response closes its connection."""

    def __init__(self, stream: Any, limit: int) -> None:
        self._stream = stream
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        left = self._limit
        async for chunk in self._stream:
            yield chunk[:left]
            left -= len(chunk)
            if left <= 0:
                return

    async def aclose(self) -> None:
        await self._stream.aclose()


async def cap_error_body(response: Any) -> None:
    """A response hook: an error reply's body is read no further than ``ERROR_BODY_BYTES``."""
    if response.status_code >= 400 and isinstance(response.stream, _HTTP.AsyncByteStream):
        response.stream = _Head(response.stream, ERROR_BODY_BYTES)


def http_client() -> Any:
    """The openai client's default HTTP client (its timeouts, pool and redirects), with error
    bodies capped."""
    return openai.DefaultAsyncHttpxClient(event_hooks={"response": [cap_error_body]})
