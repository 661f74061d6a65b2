"""TLS handshakes bounded in time and in number.

asyncio hands a TLS connection to the HTTP protocol only once its handshake is done, and
gives a handshake 60 s; until then the connection is held by nobody's rules, so
connections that never send a ClientHello could pile up by the thousand. ``GatedLoop``
(uvicorn's uvloop loop with its TLS servers gated) makes each accepted TLS connection
wait in ``Handshakes``:

* a handshake not done ``timeout_s`` after the connection was accepted closes it
  (counted ``handshake-timeout``);
* at most ``max_in_progress`` handshakes at once: one more closes the oldest still in
  progress (counted ``handshake-recycled``). A real client's handshake takes about a
  millisecond, so it is displaced only by that many connections opened within it.

Servers without ``HandshakeRules`` (the extender's ports) keep asyncio's own handling.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvloop
from prometheus_client import Counter
from uvloop.loop import SSLProtocol  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class HandshakeRules:
    timeout_s: float = 5.0
    max_in_progress: int = 64


class Handshakes:
    """The TLS handshakes in progress on one server, oldest first."""

    def __init__(self, rules: HandshakeRules, closed: Counter):
        self.rules = rules
        self.closed = closed
        self.pending: dict[Any, tuple[asyncio.BaseTransport, asyncio.TimerHandle]] = {}

    def started(self, key: Any, transport: asyncio.BaseTransport,
                loop: asyncio.AbstractEventLoop) -> None:
        if len(self.pending) >= self.rules.max_in_progress:
            self._close(next(iter(self.pending)), "handshake-recycled")
        timer = loop.call_later(self.rules.timeout_s, self._close, key, "handshake-timeout")
        self.pending[key] = (transport, timer)

    def ended(self, key: Any) -> None:
        """The handshake finished or failed (the connection is the protocol's now)."""
        entry = self.pending.pop(key, None)
        if entry is not None:
            entry[1].cancel()

    def _close(self, key: Any, reason: str) -> None:
        entry = self.pending.pop(key, None)
        if entry is None:
            return
        transport, timer = entry
        timer.cancel()
        self.closed.labels(reason).inc()
        transport.abort()  # type: ignore[attr-defined]


class GatedTls(SSLProtocol):  # type: ignore[misc]
    """uvloop's TLS protocol reporting its handshake to ``Handshakes``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, app: asyncio.BaseProtocol,
                 context: ssl.SSLContext, handshakes: Handshakes):
        waiter = loop.create_future()
        waiter.add_done_callback(self._handshake_done)
        # the gate closes first; asyncio's own bound stays as a backstop
        super().__init__(loop, app, context, waiter, server_side=True,
                         ssl_handshake_timeout=handshakes.rules.timeout_s + 5)
        self.handshakes = handshakes
        self.gated_loop = loop
        self.raw: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport
        self.handshakes.started(self, transport, self.gated_loop)
        super().connection_made(transport)

    def _handshake_done(self, waiter: asyncio.Future[None]) -> None:
        self.handshakes.ended(self)
        if waiter.exception() is not None and self.raw is not None:
            self.raw.close()


class GatedLoop(uvloop.Loop):  # type: ignore[misc]
    """uvloop whose TLS servers hold their handshakes to ``rules`` (closes counted in
    ``closed`` by reason)."""

    def __init__(self, rules: HandshakeRules, closed: Counter):
        super().__init__()
        self.handshake_rules = rules
        self.handshake_closed = closed

    async def create_server(  # type: ignore[override]
            self, protocol_factory: Callable[[], asyncio.BaseProtocol],
                            *args: Any, ssl: ssl.SSLContext | None = None,
                            **kwargs: Any) -> asyncio.AbstractServer:
        if ssl is None:
            return await super().create_server(protocol_factory, *args, **kwargs)
        context = ssl
        handshakes = Handshakes(self.handshake_rules, self.handshake_closed)

        def gated() -> asyncio.BaseProtocol:
            return GatedTls(self, protocol_factory(), context, handshakes)
        return await super().create_server(gated, *args, **kwargs)


def loop_factory(rules: HandshakeRules, closed: Counter
                 ) -> Callable[[], asyncio.AbstractEventLoop]:
    return lambda: GatedLoop(rules, closed)
