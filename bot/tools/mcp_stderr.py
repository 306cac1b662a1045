"""A stdio MCP server's stderr, read line by line into Kestrel's log.

Left to the SDK, a server's stderr is Kestrel's own: its lines land raw in a JSON log, and
interleave with ``kestrel chat``. Here each line is an info record naming the server (servers
such as the SDK's own log every request there, which at warning would fill a chat), and the
last one is kept to say why a server that died at start did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import TextIO

log = logging.getLogger("kestrel.mcp")

# A line longer than this is cut: a server must not fill the log with one record.
MAX_LINE = 2000
# How far past the cut a line is scanned, so that a secret lying across it is known whole
# (its first part alone is too short for the PII guard to know it by).
_SCAN_PAST = 1024

Redact = Callable[[str], str]


def unchanged(text: str) -> str:
    """No redaction: the PII guard is off."""
    return text


class _Lines(asyncio.Protocol):
    """Splits what the pipe delivers into lines, each logged as it completes."""

    def __init__(self, server: str, redact: Redact) -> None:
        self.server = server
        self.redact = redact
        self.last = ""
        self.closed = asyncio.get_running_loop().create_future()
        self._partial = b""
        self._rest = False  # the rest of a line already logged (cut) comes: it is dropped

    def data_received(self, data: bytes) -> None:
        *lines, partial = (self._partial + data).split(b"\n")
        if self._rest:
            if not lines:  # still in that line
                self._partial = b""
                return
            self._rest = False
            del lines[0]  # its end: logged on its own, it might start with a secret's tail
        for line in lines:
            self._emit(line)
        self._partial = partial
        if len(partial) > MAX_LINE + _SCAN_PAST:  # no newline coming: log what there is
            self._emit(partial)
            self._partial = b""
            self._rest = True

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002
        if self._partial:
            self._emit(self._partial)
            self._partial = b""
        if not self.closed.done():
            self.closed.set_result(None)

    def _emit(self, raw: bytes) -> None:
        text = raw[: MAX_LINE + _SCAN_PAST].decode("utf-8", errors="replace")
        # A server logs what it was asked and found: the log holds no more than the model.
        # Scanned before it is cut, so that a secret across the cut is redacted whole.
        text = self.redact(text)[:MAX_LINE].rstrip()
        if text:
            self.last = text
            log.info("MCP server %s: %s", self.server, text)


class ServerStderr:
    """A pipe for the server's stderr: ``writer()`` for the child, ``started()`` once it runs."""

    def __init__(self, server: str, redact: Redact = unchanged) -> None:
        self._server = server
        self._redact = redact
        read_fd, write_fd = os.pipe()
        self._read = os.fdopen(read_fd, "rb", buffering=0)
        self._write: TextIO | None = os.fdopen(write_fd, "w")
        self._lines: _Lines | None = None
        self._transport: asyncio.ReadTransport | None = None

    @property
    def last(self) -> str:
        """The last line the server wrote, if any."""
        return self._lines.last if self._lines is not None else ""

    async def closed(self) -> None:
        """Wait until the pipe is closed: the server's process (and all it left) ended."""
        if self._lines is not None:
            await asyncio.shield(self._lines.closed)

    def writer(self) -> TextIO:
        """The write end, for the child's stderr."""
        assert self._write is not None, "the writer is handed over once"
        return self._write

    async def started(self) -> None:
        """The child holds the write end: drop ours, so its exit ends the reading."""
        self._close_writer()
        lines = _Lines(self._server, self._redact)
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.connect_read_pipe(lambda: lines, self._read)
        self._lines = lines

    async def finished(self, within: float = 1.0) -> None:
        """Read what the exited server left (at most ``within`` seconds), then close."""
        self._close_writer()
        if self._lines is None:
            self._read.close()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._lines.closed), within)
        if self._transport is not None:
            self._transport.close()  # a process the server left behind may hold it open

    def _close_writer(self) -> None:
        if self._write is not None:
            self._write.close()
            self._write = None
