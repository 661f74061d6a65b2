"""Serving the extender app with uvicorn on a thread (loopback tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
from typing import Any

import uvicorn


class ThreadedServer:
    """uvicorn on ``host`` (an ephemeral port) in a daemon thread; ``url`` once started."""

    def __init__(self, app: Any, host: str = "127.0.0.1"):
        self.app = app
        self.host = host
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off",
                                access_log=False, timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True, name="extender-http")
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the extender server did not start")
            threading.Event().wait(0.01)
        self.url = f"http://{self.host}:{port}"
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
