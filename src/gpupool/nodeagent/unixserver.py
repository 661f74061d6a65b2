"""A gRPC server on one unix socket (the device plugin's, the DRA plugin's, the
registration socket kubelet watches): restartable, and able to tell when its socket file
was removed or replaced by someone else (kubelet deletes the device-plugin socket when it
restarts), so the agent knows when to serve and register again."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

log = logging.getLogger(__name__)


class UnixServer:
    """A gRPC server on one unix socket; restartable."""

    def __init__(self, path: Path, add: Callable[[grpc.Server], None], workers: int = 4,
                 name: str = "dra"):
        self.path = Path(path)
        self.add = add
        self.workers = workers
        self.name = name
        self._server: grpc.Server | None = None
        self._inode = 0

    def start(self) -> None:
        self.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.workers,
                                                        thread_name_prefix=self.name))
        self.add(server)
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._server = server
        self._inode = _inode(self.path)
        log.info("%s serving on %s", self.name, self.path)

    def healthy(self) -> bool:
        """Is our socket still the file we created?"""
        return self._server is not None and _inode(self.path) == self._inode != 0

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait(2)
            self._server = None
            if _inode(self.path) == self._inode:
                self.path.unlink(missing_ok=True)


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except OSError:
        return 0
