"""Serving the extender's apps with uvicorn: the configuration ``gpupool extender`` runs
(``gpupool.http.serving.uvicorn_config``: mutual TLS from a ``ReloadingContext``, guarded
connections), and ``ThreadedServer``,
the same on a thread (the probe port, loopback tests, benchmarks)."""

from __future__ import annotations

import socket
import ssl
import threading
from typing import Any

import uvicorn
from prometheus_client import Counter

from gpupool.extender.edge.connections import PROBE_RULES, ConnectionRules
from gpupool.http.serving import uvicorn_config

__all__ = ["ThreadedServer", "probe_server", "uvicorn_config"]


class ThreadedServer:
    """uvicorn on ``host`` (``port``; 0: an ephemeral one) in a daemon thread; ``url``
    once started."""

    def __init__(self, app: Any, host: str = "127.0.0.1", *, port: int = 0,
                 tls: ssl.SSLContext | None = None, rules: ConnectionRules | None = None,
                 closed: Counter | None = None):
        self.app = app
        self.host = host
        self.port = port
        self.tls = tls
        self.rules = rules
        metrics = getattr(app, "metrics", None)  # an ExtenderApp counts on its metrics
        self.closed = closed or (metrics.closed if metrics is not None else _orphan_counter())
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        port = sock.getsockname()[1]
        config = uvicorn_config(self.app, self.closed, self.rules, self.tls)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True, name="extender-http")
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the extender server did not start")
            threading.Event().wait(0.01)
        self.url = f"{'https' if self.tls else 'http'}://{self.host}:{port}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> ThreadedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def probe_server(app: Any, host: str = "127.0.0.1", port: int = 0,
                 closed: Counter | None = None) -> ThreadedServer:
    """The probes' server (``/healthz``, ``/readyz``, ``/metrics``) with the probe port's
    connection rules (``connections.PROBE_RULES``), on its own thread and event loop."""
    return ThreadedServer(app, host, port=port, rules=PROBE_RULES, closed=closed)


def _orphan_counter() -> Counter:
    """A counter in no registry, for servers whose caller keeps no metrics."""
    return Counter("gpupool_extender_connections_closed_total", "closed connections",
                   ["reason"], registry=None)
