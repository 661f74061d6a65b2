"""Listening ports: a clear error when one cannot be opened, and TLS ports that say why
a handshake failed."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from gpupool.core.errors import GpupoolError

log = logging.getLogger(__name__)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
TlsHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[None]]


class ListenError(GpupoolError):
    """A port that cannot be listened on; the message names it and why."""


async def listen(handler: Handler, host: str, port: int, what: str,
                 limit: int = 2 ** 16) -> asyncio.Server:
    """``asyncio.start_server`` for ``what`` (e.g. "the TLS port")."""
    try:
        return await asyncio.start_server(handler, host, port, limit=limit)
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port} for {what}: "
                          f"{exc.strerror or exc}") from None


class TlsListener:
    """A TLS port whose failed handshakes reach the caller (``refused``) with their reason.

    Each connection is accepted as a plain socket and the handshake is made on it
    (``connect_accepted_socket``), so a certificate refused by OpenSSL — expired, of
    another CA — is reported, not only logged by asyncio in debug mode."""

    def __init__(self, context: Callable[[], ssl.SSLContext], handler: TlsHandler,
                 refused: Callable[[str, BaseException], None], handshake_s: float = 10.0):
        self.context = context
        self.handler = handler
        self.refused = refused
        self.handshake_s = handshake_s
        self.port = 0
        self._sock: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int, what: str) -> None:
        try:
            self._sock = socket.create_server((host, port), backlog=128)
        except OSError as exc:
            raise ListenError(f"cannot listen on {host}:{port} for {what}: "
                              f"{exc.strerror or exc}") from None
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self._spawn(self._accept(self._sock))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(sock)
            except OSError as exc:
                log.warning("accepting a connection failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            self._spawn(self._handshake(conn, address))

    async def _handshake(self, conn: socket.socket, address: Any) -> None:
        peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2 ** 16)
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, conn, ssl=self.context(),
                ssl_handshake_timeout=self.handshake_s)
        except (OSError, ConnectionError, TimeoutError) as exc:
            conn.close()
            self.refused(peer, exc)
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        await self.handler(reader, writer, peer)

    def close(self) -> None:
        """Stop accepting and drop connections still in their handshake or handler."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for task in list(self._tasks):
            task.cancel()
