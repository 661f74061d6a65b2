"""uvicorn configured for a server others can reach: its C stack (httptools, uvloop) with
``ConnectionRules`` applied to every connection (``connections.guarded_protocol``) and,
where the rules bound them, TLS handshakes held to ``handshakes.HandshakeRules``."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any

import uvicorn
from prometheus_client import Counter

from gpupool.http.connections import ConnectionRules, guarded_protocol
from gpupool.http.handshakes import loop_factory


class EdgeConfig(uvicorn.Config):
    """uvicorn's configuration whose event loop comes from ``loop``."""

    def __init__(self, *args: Any, loop: Callable[[], asyncio.AbstractEventLoop],
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.edge_loop = loop

    def get_loop_factory(self) -> Callable[[], asyncio.AbstractEventLoop]:
        return self.edge_loop


def uvicorn_config(app: Any, closed: Counter, rules: ConnectionRules | None = None,
                   tls: ssl.SSLContext | None = None, *, graceful_s: int = 1,
                   **kwargs: Any) -> uvicorn.Config:
    """uvicorn on its C stack with ``rules`` applied to every connection (closes counted
    in ``closed`` by reason), TLS from ``tls`` (a listening context) when given, and
    ``graceful_s`` for the requests in flight at shutdown; ``kwargs`` go to uvicorn."""
    rules = rules or ConnectionRules()
    factory = (lambda _config, _default: tls) if tls is not None else None
    settings: dict[str, Any] = dict(
        log_level="warning", lifespan="off", access_log=False,
        http=guarded_protocol(rules, closed), timeout_keep_alive=max(1, round(rules.idle_s)),
        timeout_graceful_shutdown=graceful_s,
        limit_concurrency=None if rules.recycle else rules.max_connections, ws="none",
        ssl_context_factory=factory, **kwargs)
    if rules.handshakes is None:
        return uvicorn.Config(app, loop="uvloop", **settings)
    return EdgeConfig(app, loop=loop_factory(rules.handshakes, closed), **settings)
