"""Serving the extender's apps with uvicorn: the configuration ``gpupool extender`` runs
(mutual TLS from a ``ReloadingContext``, guarded connections), and ``ThreadedServer``,
the same on a thread (the probe port, loopback tests, benchmarks)."""

from __future__ import annotations

import socket
import ssl
import threading
from typing import Any

import uvicorn
from prometheus_client import Counter

from gpupool.extender.edge.connections import PROBE_RULES, ConnectionRules, guarded_protocol


def uvicorn_config(app: Any, closed: Counter, rules: ConnectionRules | None = None,
                   tls: ssl.SSLContext | None = None, **kwargs: Any) -> uvicorn.Config:
    """uvicorn on its C stack (httptools, uvloop) with ``rules`` applied to every
    connection, and TLS from ``tls`` (a listening context, e.g. ``ReloadingContext``'s)."""
    rules = rules or ConnectionRules()
    factory = (lambda _config, _default: tls) if tls is not None else None
    return uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                          http=guarded_protocol(rules, closed), loop="uvloop",
                          timeout_keep_alive=max(1, round(rules.idle_s)),
                          timeout_graceful_shutdown=1,
                          limit_concurrency=None if rules.recycle else rules.max_connections,
                          ws="none",
                          ssl_context_factory=factory, **kwargs)


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
