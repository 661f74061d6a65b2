"""The serving certificate, swapped for new connections when it is renewed.

``ServingTls`` holds the current ``ssl.SSLContext``. The server's own context (the
one uvicorn builds from the first files) gets ``attach``'s SNI callback, which runs
for every TLS handshake (with or without a server name) and hands the connection the
newest context: a renewed certificate is served from the next handshake on, and
connections already open keep theirs. Key files are written with mode 0600 into a
directory of the process's own (an ``emptyDir`` in the Deployment).
"""

from __future__ import annotations

import os
import ssl
import threading
from pathlib import Path
from typing import Any


class ServingTls:
    """The webhook's current server certificate (thread-safe)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.cert_file = directory / "tls.crt"
        self.key_file = directory / "tls.key"
        self._lock = threading.Lock()
        self._pem: tuple[str, str] | None = None
        self._context: ssl.SSLContext | None = None

    @property
    def loaded(self) -> bool:
        return self._context is not None

    def install(self, cert_pem: str, key_pem: str) -> bool:
        """Serve this certificate from the next handshake on; False when it is the one
        already served. A pair that does not load raises ``ssl.SSLError``/``ValueError``
        and changes nothing."""
        with self._lock:
            if self._pem == (cert_pem, key_pem):
                return False
            self.directory.mkdir(parents=True, exist_ok=True)
            staged = (self.directory / ".tls.crt.new", self.directory / ".tls.key.new")
            for path, text in zip(staged, (cert_pem, key_pem), strict=True):
                _write_private(path, text)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(str(staged[0]), str(staged[1]))
            os.replace(staged[0], self.cert_file)
            os.replace(staged[1], self.key_file)
            self._pem, self._context = (cert_pem, key_pem), context
            return True

    def attach(self, server_context: ssl.SSLContext) -> None:
        """Make ``server_context`` hand each handshake the newest certificate."""
        server_context.sni_callback = self._pick

    def _pick(self, connection: Any, _name: str | None, current: ssl.SSLContext) -> None:
        newest = self._context
        if newest is not None and newest is not current:
            connection.context = newest


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
