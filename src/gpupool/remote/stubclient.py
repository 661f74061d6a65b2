"""A client of the stub provider's protocol: the stand-in for a workload's CUDA calls.

Blocking (one socket, one request at a time), for demos, tests and benchmarks: point it
at the sidecar's data plane (``127.0.0.1:14833`` in the pod) or, on the GPU node, at the
stub itself. Answers that are not ``ok`` raise ``StubRefused`` with the stub's error
code and message.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from gpupool.core.errors import GpupoolError
from gpupool.remote.frames import MAX_HEADER, PREFIX, encode


class StubRefused(GpupoolError):
    """The stub answered with an error; ``code`` is its error code."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


class StubClient:
    def __init__(self, host: str, port: int, timeout_s: float = 30.0):
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def __enter__(self) -> StubClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def call(self, header: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        """One request and its answer; ``StubRefused`` for an error answer, ``ConnectionError``
        when the connection ends first."""
        self.sock.sendall(encode(header, payload))
        head_len, payload_len = PREFIX.unpack(self._exactly(PREFIX.size))
        if head_len > MAX_HEADER:
            raise ConnectionError(f"an answer header of {head_len} bytes")
        answer = json.loads(self._exactly(head_len))
        data = self._exactly(payload_len)
        if not answer.get("ok"):
            raise StubRefused(str(answer.get("error")), str(answer.get("message")))
        return answer, data

    def _exactly(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ConnectionError("the connection ended before the answer did")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def alloc(self, size: int) -> int:
        return int(self.call({"op": "alloc", "size": size})[0]["handle"])

    def free(self, handle: int) -> None:
        self.call({"op": "free", "handle": handle})

    def write(self, handle: int, data: bytes, offset: int = 0) -> None:
        self.call({"op": "write", "handle": handle, "offset": offset}, data)

    def read(self, handle: int, size: int, offset: int = 0) -> bytes:
        return self.call({"op": "read", "handle": handle, "offset": offset, "size": size})[1]

    def checksum(self, handle: int, rounds: int = 1) -> int:
        return int(self.call({"op": "checksum", "handle": handle, "rounds": rounds})[0]["crc32"])

    def usage(self) -> dict[str, Any]:
        return self.call({"op": "usage"})[0]

    def hello(self) -> dict[str, Any]:
        return self.call({"op": "hello"})[0]
