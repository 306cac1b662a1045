"""A PostgreSQL server that only asks for a password: ``async with PasswordTaker() as pg`` listens
on ``pg.port``, asks each client for its password in clear text (as a server with
``password`` authentication does), keeps it in ``pg.passwords``, and refuses the login.

What a client sends as its password can be seen here, which a server that trusts local
connections would never show."""

from __future__ import annotations

import asyncio
import struct
from types import TracebackType

_SSL_REQUEST = 80877103
_CLEARTEXT_PASSWORD = 3


class PasswordTaker:
    """Asks for a password, notes it, refuses the login."""

    def __init__(self) -> None:
        self.passwords: list[str] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> PasswordTaker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._login(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _login(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        length, code = struct.unpack("!ii", await reader.readexactly(8))
        if code == _SSL_REQUEST:  # no TLS here: the client goes on in the clear
            writer.write(b"N")
            length, code = struct.unpack("!ii", await reader.readexactly(8))
        await reader.readexactly(length - 8)  # the startup message's parameters
        writer.write(b"R" + struct.pack("!ii", 8, _CLEARTEXT_PASSWORD))
        await writer.drain()
        kind, length = struct.unpack("!ci", await reader.readexactly(5))
        assert kind == b"p", kind
        password = await reader.readexactly(length - 4)
        self.passwords.append(password.rstrip(b"\0").decode())
        fields = b"SFATAL\0C28P01\0Mpassword authentication failed\0\0"
        writer.write(b"E" + struct.pack("!i", len(fields) + 4) + fields)
        await writer.drain()
