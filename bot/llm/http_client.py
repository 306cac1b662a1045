"""The HTTP client under the openai client, reading a failed request's body only so far.

The openai client reads the whole body of an error reply to quote it: a server or a proxy that
answers 500 with a runaway body (a log, a page that never ends) filled the memory before the
call's timeout could end it. A 200's body is capped where it is read (``read_capped``). The
cap counts an error body's bytes as they are read: a gzip or deflate body is inflated here,
since a proxy's compression shrinks a runaway page of blanks a thousandfold.
"""

from __future__ import annotations

import importlib
import zlib
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


class _Inflated(_Head):
    """The first ``limit`` bytes of a gzip or deflate body once inflated; each piece is
    inflated no further than the bytes still wanted, so no piece can be a bomb."""

    def __init__(self, stream: Any, limit: int, wbits: int) -> None:
        super().__init__(stream, limit)
        self._wbits = wbits

    async def __aiter__(self) -> AsyncIterator[bytes]:
        inflater = zlib.decompressobj(self._wbits)
        left = self._limit
        async for chunk in self._stream:
            try:
                piece = inflater.decompress(chunk, left)
            except zlib.error as exc:  # as the library says it of a body it cannot inflate
                raise _HTTP.DecodingError(str(exc)) from exc
            yield piece
            left -= len(piece)
            if left <= 0 or inflater.eof:
                return


# Each encoding inflated here, by zlib's window bits: gzip's, and deflate's (zlib's wrapper,
# or gzip's, as servers send under that name).
_WBITS: Final = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16}
_WBITS_DEFLATE: Final = zlib.MAX_WBITS | 32


async def cap_error_body(response: Any) -> None:
    """A response hook: an error reply's body is read no further than ``ERROR_BODY_BYTES``,
    counted once inflated."""
    if response.status_code < 400 or not isinstance(response.stream, _HTTP.AsyncByteStream):
        return
    encoding = response.headers.get("content-encoding", "").strip().lower()
    wbits = _WBITS_DEFLATE if encoding == "deflate" else _WBITS.get(encoding)
    if wbits is None:
        # Unencoded, or an encoding the library would not inflate either (or, installed,
        # would): the bytes as sent are capped.
        response.stream = _Head(response.stream, ERROR_BODY_BYTES)
        return
    response.stream = _Inflated(response.stream, ERROR_BODY_BYTES, wbits)
    del response.headers["content-encoding"]  # inflated here, so not again by the library


def http_client() -> Any:
    """The openai client's default HTTP client (its timeouts, pool and redirects), with error
    bodies capped."""
    return openai.DefaultAsyncHttpxClient(event_hooks={"response": [cap_error_body]})
