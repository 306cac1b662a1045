"""A TCP forwarder the test controls: a store that goes away and comes back.

``async with TcpProxy(port) as proxy`` listens on a free local port and forwards each
connection to ``port`` on 127.0.0.1; ``cut()`` drops every connection and refuses new ones
until ``restore()``; ``hold()`` keeps every connection open but passes no byte either way (a
stalled network, a half-open connection) until ``restore()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import TracebackType
from urllib.parse import urlsplit


class TcpProxy:
    """Forwards 127.0.0.1:``port`` (the listening port is ``self.port``), and can be cut."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self.up = True
        self.port = 0
        self.refused = 0  # connections refused while cut
        self.accepted = 0  # connections taken, held ones' included
        self.held = 0  # chunks a client sent while held (a statement, a cancel request)
        self._flowing = asyncio.Event()  # cleared while held
        self._flowing.set()
        self._forwarding: set[asyncio.Task[object]] = set()

    async def __aenter__(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._forward, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._forwarding:  # cut: each ends as its sockets do
            await asyncio.wait(self._forwarding, timeout=5)

    def cut(self) -> None:
        """Drop every connection (a reset, as when the server goes) and refuse new ones."""
        self.up = False
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    def hold(self) -> None:
        """Pass no more bytes, new connections' included, and close nothing."""
        self._flowing.clear()

    def restore(self) -> None:
        """Accept connections again, and pass what was held."""
        self.up = True
        self._flowing.set()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.up:
            self.refused += 1
            writer.transport.abort()
            return
        self.accepted += 1
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._open |= {writer, upstream_writer}
        task = asyncio.current_task()
        if task is not None:
            self._forwarding.add(task)
            task.add_done_callback(self._forwarding.discard)
        await asyncio.gather(
            self._pipe(reader, upstream_writer, sent=True),
            self._pipe(upstream_reader, writer, sent=False),
            return_exceptions=True,
        )
        self._open -= {writer, upstream_writer}

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, sent: bool
    ) -> None:
        """Pass ``reader``'s bytes to ``writer`` while flowing (``sent``: the client's)."""
        try:
            while data := await reader.read(65536):
                if sent and not self._flowing.is_set():
                    self.held += 1
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                writer.close()


@contextlib.asynccontextmanager
async def proxied_dsn(dsn: str) -> AsyncIterator[tuple[str, TcpProxy]]:
    """A PostgreSQL ``dsn`` reached through a ``TcpProxy``: the DSN to use, and the proxy."""
    target = urlsplit(dsn)
    async with TcpProxy(target.port or 5432, target.hostname or "127.0.0.1") as proxy:
        yield dsn.replace(target.netloc, f"{target.username}@127.0.0.1:{proxy.port}", 1), proxy
