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

MAX_HANDSHAKES = 64
"""Connections a TLS port lets be in their handshake at once; more are closed at once
(a peer that opens connections and says nothing holds at most this many)."""


def _peer(address: Any) -> str:
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


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
                 refused: Callable[[str, BaseException], None], handshake_s: float = 10.0,
                 max_handshakes: int = MAX_HANDSHAKES):
        self.context = context
        self.handler = handler
        self.refused = refused
        self.handshake_s = handshake_s
        self.max_handshakes = max_handshakes
        self.handshaking = 0
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
            if self.handshaking >= self.max_handshakes:
                conn.close()
                self.refused(_peer(address), ConnectionRefusedError(
                    f"{self.handshaking} connections are in their TLS handshake already (at "
                    f"most {self.max_handshakes})"))
                continue
            self._spawn(self._handshake(conn, address))

    async def _handshake(self, conn: socket.socket, address: Any) -> None:
        peer = _peer(address)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2 ** 16)
        protocol = asyncio.StreamReaderProtocol(reader)
        self.handshaking += 1
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, conn, ssl=self.context(),
                ssl_handshake_timeout=self.handshake_s)
        except (OSError, ConnectionError, TimeoutError) as exc:
            conn.close()
            self.refused(peer, exc)
            return
        finally:
            self.handshaking -= 1
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        await self.handler(reader, writer, peer)

    def close(self) -> None:
        """Stop accepting and drop connections still in their handshake or handler."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for task in list(self._tasks):
            task.cancel()


def tls_reason(exc: BaseException) -> str:
    """A failed TLS connection's reason, as a person reads it."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return exc.verify_message or str(exc)
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, TimeoutError):
        return "no handshake within the time allowed"
    if isinstance(exc, ConnectionError) and not str(exc):
        return f"the peer closed the connection ({type(exc).__name__})"
    return str(exc) or type(exc).__name__
