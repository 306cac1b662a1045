"""A TCP forwarder the test controls: a store that goes away and comes back.

``async with TcpProxy(port) as proxy`` listens on a free local port and forwards each
connection to ``port`` on 127.0.0.1; ``cut()`` drops every connection and refuses new ones
until ``restore()``; ``hold()`` keeps every connection open but passes no byte either way (a
stalled network, a half-open connection) until ``restore()``; ``lose_commit_reply(marker)``
lets the next transaction whose statements carry ``marker`` commit, then drops the server's
answer to its ``COMMIT`` and the connection with it (the commit landed; the client never learns),
and with ``then_cut`` cuts every connection as it does; ``close_after_reply(marker)`` passes
the server's answer to the next statement carrying ``marker``, then closes that connection (a
backend terminated as it answered: ``pg_terminate_backend``, a pooler restarting);
``slow(seconds)`` holds each chunk of the server's answers that long before passing it on (a
store that answers, slowly).
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
        self.sent = 0  # chunks the clients sent in all (about one a round trip)
        self._flowing = asyncio.Event()  # cleared while held
        self._flowing.set()
        self._forwarding: set[asyncio.Task[object]] = set()
        # ``lose_commit_reply``: the marker looked for, and the connection (its client's
        # writer) whose COMMIT carried it, once seen.
        self._marker = b""
        self._marked: asyncio.StreamWriter | None = None
        self._losing: asyncio.StreamWriter | None = None
        self._cut_after_loss = False
        self.replies_lost = 0
        # ``close_after_reply``: the marker looked for, and the connection that sent it.
        self._close_marker = b""
        self._closing: asyncio.StreamWriter | None = None
        self.closed_after_reply = 0
        self.latency = 0.0  # ``slow``: seconds each chunk of the server's answers is held

    async def __aenter__(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._forward, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cut()
        # Held pipes wait for the flow, not for their sockets: woken, they find them aborted.
        self._flowing.set()
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

    def lose_commit_reply(self, marker: bytes, *, then_cut: bool = False) -> None:
        """Drop the answer to the next COMMIT sent after a statement carrying ``marker``, and
        that connection (once, then forward as before; ``then_cut``: ``cut()`` there, the
        store gone as it committed)."""
        self._marker = marker
        self._cut_after_loss = then_cut

    def close_after_reply(self, marker: bytes) -> None:
        """Pass the answer to the next statement sent carrying ``marker``, then close that
        connection (once, then forward as before)."""
        self._close_marker = marker

    def slow(self, seconds: float) -> None:
        """Hold each chunk the server sends ``seconds`` before passing it on (0: at once)."""
        self.latency = seconds

    def restore(self) -> None:
        """Accept connections again, and pass what was held."""
        self.up = True
        self._flowing.set()

    @property
    def tasks(self) -> frozenset[asyncio.Task[object]]:
        """The proxy's own tasks under way (a test waiting for the others' leaves these out:
        they end only as the proxy does)."""
        return frozenset(self._forwarding)

    def _track(self, task: asyncio.Task[object] | None) -> None:
        if task is not None:
            self._forwarding.add(task)
            task.add_done_callback(self._forwarding.discard)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._track(asyncio.current_task())
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
        pipes = [
            asyncio.ensure_future(self._pipe(reader, upstream_writer, sent=True, client=writer)),
            asyncio.ensure_future(self._pipe(upstream_reader, writer, sent=False, client=writer)),
        ]
        for pipe in pipes:
            self._track(pipe)
        await asyncio.gather(*pipes, return_exceptions=True)
        self._open -= {writer, upstream_writer}

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        sent: bool,
        client: asyncio.StreamWriter,
    ) -> None:
        """Pass ``reader``'s bytes to ``writer`` while flowing (``sent``: the client's, of the
        connection whose client side is ``client``)."""
        try:
            while data := await reader.read(65536):
                self.sent += sent
                if sent and not self._flowing.is_set():
                    self.held += 1
                await self._flowing.wait()
                if sent:
                    self._watch_for_commit(data, client)
                    self._watch_for_close(data, client)
                elif self._closing is client:
                    await self._close_after(data, client)
                    return
                elif self._losing is client:
                    self._lose(client)
                    return
                elif self.latency:
                    await asyncio.sleep(self.latency)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                writer.close()

    def _watch_for_commit(self, data: bytes, client: asyncio.StreamWriter) -> None:
        """``lose_commit_reply``: note the connection that sent the marker, then its COMMIT."""
        if self._marker and self._marked is None and self._marker in data:
            self._marked = client
        if self._marked is client and b"COMMIT" in data:
            self._marker, self._marked, self._losing = b"", None, client

    def _watch_for_close(self, data: bytes, client: asyncio.StreamWriter) -> None:
        """``close_after_reply``: note the connection that sent the marker."""
        if self._close_marker and self._close_marker in data:
            self._close_marker, self._closing = b"", client

    async def _close_after(self, data: bytes, client: asyncio.StreamWriter) -> None:
        """Pass the server's answer, then close the connection as the server would."""
        self._closing = None
        self.closed_after_reply += 1
        client.write(data)
        await client.drain()
        client.close()

    def _lose(self, client: asyncio.StreamWriter) -> None:
        """The server answered the COMMIT: drop the answer and the connection (its server side
        closes as the client side's pipe ends)."""
        self._losing = None
        self.replies_lost += 1
        client.transport.abort()
        if self._cut_after_loss:
            self.cut()


@contextlib.asynccontextmanager
async def proxied_dsn(dsn: str) -> AsyncIterator[tuple[str, TcpProxy]]:
    """A PostgreSQL ``dsn`` reached through a ``TcpProxy``: the DSN to use, and the proxy."""
    target = urlsplit(dsn)
    async with TcpProxy(target.port or 5432, target.hostname or "127.0.0.1") as proxy:
        yield dsn.replace(target.netloc, f"{target.username}@127.0.0.1:{proxy.port}", 1), proxy
