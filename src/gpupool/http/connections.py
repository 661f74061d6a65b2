"""HTTP/1.1 connections: who may hold one, and for how long.

``guarded_protocol`` makes a subclass of uvicorn's httptools protocol (the one uvicorn
uses for ``http="httptools"``) that

* closes a TLS connection at once when the client's certificate (already verified
  against the CA by the TLS handshake) does not name one of ``client_names`` (the
  extender: another certificate of the same CA, a server's or a node's, is not
  kube-scheduler's);
* closes a connection that sends nothing for ``idle_s`` after it opened or after its
  last answer (uvicorn's keep-alive timer, armed at the start as well);
* closes a connection whose request (headers and body) has not fully arrived
  ``read_s`` after its first byte (a slow or half-sent request), and one whose request
  head (request line and headers) grows past ``header_bytes``: the parser reads what
  arrives in slices that each belong to one phase of a request (``framing``), so a
  body's bytes never count as a head's, whatever the chunking.

A server holds at most ``max_connections``. Beyond, either uvicorn answers 503 (the
extender's verbs: only kube-scheduler gets past the certificate check), or, with
``recycle``, the connection that has been quiet longest and is not being answered is
closed to make room (a port anyone the network lets in can reach, where the kubelet's
probe or the API server must always get a connection: the extender's probe port, the
webhook's port).

Each close is counted in the server's ``closed`` counter by ``reason``
(``client-certificate``, ``idle``, ``slow-request``, ``header-too-large``, ``recycled``).
The TLS handshake comes before: asyncio bounds it (60 s), unless the rules bound it
(``handshakes``: ``gpupool.http.handshakes``).

The defaults (``HEADER_BYTES``, ``MAX_CONNECTIONS``, 30 s idle, 10 s to read a request)
are the extender's verbs'; other servers pass their own ``ConnectionRules``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpupool.http.framing import Framing
from gpupool.http.handshakes import HandshakeRules

log = logging.getLogger(__name__)
_EVENTS = itertools.count()  # orders connections' activity (the loop's clock ticks in ms)

HEADER_BYTES = 64 * 1024
MAX_CONNECTIONS = 768  # connections + calls at once on the verbs' port; beyond, 503:
# kube-scheduler's binds in flight at 50 pods/s lasting 15 s each, within the 1,024
# file descriptors a container commonly gets (docs/operations.md)


@dataclass(frozen=True, slots=True)
class ConnectionRules:
    idle_s: float = 30.0
    read_s: float = 10.0
    header_bytes: int = HEADER_BYTES
    client_names: frozenset[str] | None = None  # None: no client certificate asked
    max_connections: int = MAX_CONNECTIONS
    recycle: bool = False  # at max_connections: close the quietest (else uvicorn's 503)
    handshakes: HandshakeRules | None = None  # None: asyncio's 60 s, unbounded in number


def guarded_protocol(rules: ConnectionRules, closed: Counter) -> type[asyncio.Protocol]:
    """A uvicorn ``http`` protocol class that applies ``rules``."""

    class Guarded(GuardedHttp):
        pass
    Guarded.rules = rules
    Guarded.closed = closed
    return Guarded


class GuardedHttp(HttpToolsProtocol):
    rules: ConnectionRules = ConnectionRules()
    closed: Counter

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self.framing = Framing(self.rules.header_bytes)
        self.heard = 0  # when it was last heard from or answered, in order of events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.heard = next(_EVENTS)
        names = self.rules.client_names
        if names is not None and not allowed(transport.get_extra_info("peercert"), names):
            self._close("client-certificate", "a client certificate of %s, not of %s",
                        peer_name(transport.get_extra_info("peercert")) or "nobody",
                        ", ".join(sorted(names)))
            return
        if self.rules.recycle and len(self.connections) > self.rules.max_connections:
            self._make_room()
        self.timeout_keep_alive_task = self.loop.call_later(self.rules.idle_s,
                                                            self._idle)

    def _make_room(self) -> None:
        """Close the connection quiet longest that is not being answered (this one when
        every other is)."""
        quiet = [c for c in self.connections if isinstance(c, GuardedHttp) and c is not self
                 and not c.answering() and not c.transport.is_closing()]
        victim = min(quiet, key=lambda c: c.heard) if quiet else self
        victim.closed.labels("recycled").inc()
        victim.transport.close()

    def answering(self) -> bool:
        """A request of this connection is being answered."""
        return self.cycle is not None and not self.cycle.response_complete

    def on_response_complete(self) -> None:
        self.heard = next(_EVENTS)
        super().on_response_complete()

    def data_received(self, data: bytes) -> None:
        """The parser reads ``data`` in slices that each belong to one phase of a request
        (``framing``), so a body's bytes are never counted as a head's."""
        self.heard = next(_EVENTS)
        if not self.framing.feed(data, super().data_received,  # type: ignore[arg-type]
                                 self.transport.is_closing):
            self._close("header-too-large", "a request head over %d bytes",
                        self.rules.header_bytes)

    def on_message_begin(self) -> None:
        self.framing.began()
        super().on_message_begin()
        self._cancel_deadline()
        self._deadline = self.loop.call_later(self.rules.read_s, self._too_slow)

    def on_headers_complete(self) -> None:
        self.framing.headers_done(self.headers)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.framing.completed()
        super().on_message_complete()
        self._cancel_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def timeout_keep_alive_handler(self) -> None:
        self._idle()

    def _idle(self) -> None:
        if not self.transport.is_closing():
            self.closed.labels("idle").inc()
            self.transport.close()

    def _too_slow(self) -> None:
        self._deadline = None
        self._close("slow-request", "a request not complete %.0fs after it began",
                    self.rules.read_s)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _close(self, reason: str, why: str, *args: Any) -> None:
        self.closed.labels(reason).inc()
        where = f"{self.client[0]}:{self.client[1]}" if self.client else "?"
        log.info("closing the connection from %s: " + why, where, *args)
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.abort()


def allowed(peercert: Any, names: Iterable[str]) -> bool:
    """Whether a verified peer certificate's subject common name is one of ``names``."""
    name = peer_name(peercert)
    return name is not None and name in set(names)


def peer_name(peercert: Any) -> str | None:
    """The subject common name of a peer certificate as ``getpeercert()`` returns it."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
