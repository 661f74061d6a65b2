"""A scripted HTTP/1.1 server on loopback, for what the fake API server cannot do: answer a
non-JSON error or a Status without its Content-Type, send a broken watch stream, go quiet
in the middle of a watch, stand in for a proxy.

Each request is answered by ``handler(request) -> Answer``; the server records every
request (method, path, headers) and how many connections it accepted.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Answer:
    status: int = 200
    body: bytes = b"{}"
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    close_after: bool = False  # close the connection after answering (no "Connection: close")
    drop: bool = False  # close the connection without answering
    raw: bytes | None = None  # the whole answer, sent as it is (status, head and body)


class RawServer:
    def __init__(self, handler: Callable[[Request], Answer]):
        self.handler = handler
        self.requests: list[Request] = []
        self.connections = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept
        self._sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        with conn, reader:
            while True:
                request = _read_request(reader)
                if request is None:
                    return
                self.requests.append(request)
                answer = self.handler(request)
                if answer.drop:
                    return
                if answer.raw is not None:
                    conn.sendall(answer.raw)
                else:
                    head = [f"HTTP/1.1 {answer.status} X",
                            f"Content-Length: {len(answer.body)}"]
                    head += [f"{k}: {v}" for k, v in answer.headers.items()]
                    conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + answer.body)
                if answer.close_after:
                    return


def _read_request(reader: BinaryIO) -> Request | None:
    line = reader.readline()
    if not line:
        return None
    method, path, _ = line.decode().split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        h = reader.readline().decode().rstrip("\r\n")
        if not h:
            break
        k, _, v = h.partition(":")
        headers[k.strip().lower()] = v.strip()
    body = reader.read(int(headers.get("content-length", "0")))
    return Request(method, path, headers, body)
