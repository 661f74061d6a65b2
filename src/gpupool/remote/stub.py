"""The STUB provider: a stand-in for a remote-GPU data plane, written in Python.

It is not a GPU and runs no CUDA: it is a small real network server that speaks a
documented toy remote-memory protocol (docs/remote.md, "The stub protocol") so that
gpupool's whole remote-slice path — slice server, mutual TLS, sidecar, heartbeats,
usage, over-use actions — runs end to end on a machine without GPUs, as the fake GPU
backend does for the node agent. Named ``stub`` wherever it appears (``gpupool
slice-server --provider stub``, ``gpupool slice-stub``), so that nobody mistakes it
for a data plane.

What it keeps and enforces, like a GPU context under an isolation provider would:

* **memory**: buffers allocated by handle, in host memory; an allocation that would
  take the slice past its memory limit is refused (``out-of-memory``), and reads and
  writes outside a buffer are refused (``out-of-range``);
* **compute**: the checksum "kernel" (CRC-32 of a buffer, ``rounds`` times) runs one
  at a time, as kernels of one context share the GPU; its busy time is counted, and
  the ``usage`` report gives it with the memory held, for the slice server to report
  against the slice's compute share (the stub does not throttle: like the node's
  over-use monitor, gpupool's monitor is what acts on compute over-use).

Requests on one connection are answered in order; memory belongs to the process (a
client may reconnect and find its buffers). Bad input — a malformed or oversized
frame, an unknown operation, a bad field — gets an error answer naming it; a frame
that cannot be delimited closes its connection; nothing crashes the server.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gpupool.remote import frames
from gpupool.remote.frames import Frame, FrameError
from gpupool.remote.listening import listen

log = logging.getLogger(__name__)

MIB = 1 << 20
PROTOCOL = 1
MAX_ROUNDS = 10_000

Answer = tuple[dict[str, Any], bytes]


@dataclass(frozen=True, slots=True)
class StubConfig:
    memory_limit_bytes: int
    max_payload: int = 16 * MIB
    frame_s: float = 30.0
    device: str = ""  # the GPU the process was pinned to (CUDA_VISIBLE_DEVICES), reported


class StubMemory:
    """The buffers of the slice, within its memory limit."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self.buffers: dict[int, bytearray] = {}
        self.held_bytes = 0
        self._next = 1

    def alloc(self, size: int) -> int:
        if self.held_bytes + size > self.limit_bytes:
            raise FrameError("out-of-memory", f"allocating {size} bytes would hold "
                             f"{self.held_bytes + size} of the slice's {self.limit_bytes} "
                             f"bytes ({self.held_bytes} held)", fatal=False)
        handle, self._next = self._next, self._next + 1
        self.buffers[handle] = bytearray(size)
        self.held_bytes += size
        return handle

    def buffer(self, handle: int) -> bytearray:
        found = self.buffers.get(handle)
        if found is None:
            raise FrameError("no-such-handle", f"no buffer has handle {handle}", fatal=False)
        return found

    def free(self, handle: int) -> int:
        size = len(self.buffer(handle))
        del self.buffers[handle]
        self.held_bytes -= size
        return size

    def span(self, handle: int, offset: int, size: int) -> bytearray:
        buf = self.buffer(handle)
        if offset + size > len(buf):
            raise FrameError("out-of-range", f"bytes {offset}..{offset + size} are outside "
                             f"buffer {handle} of {len(buf)} bytes", fatal=False)
        return buf

    def clear(self) -> None:
        self.buffers.clear()
        self.held_bytes = 0


class StubServer:
    """The stub's network server (asyncio)."""

    def __init__(self, config: StubConfig):
        self.config = config
        self.memory = StubMemory(config.memory_limit_bytes)
        self.busy_ns = 0
        self._kernel = asyncio.Lock()
        self._ops: dict[str, Callable[[Frame], Awaitable[Answer]]] = {
            "hello": self._hello, "alloc": self._alloc, "free": self._free,
            "write": self._write, "read": self._read, "checksum": self._checksum,
            "usage": self._usage}
        self.limits = frames.Limits(config.max_payload, config.frame_s)

    async def start(self, host: str, port: int) -> asyncio.Server:
        return await listen(self.serve, host, port, "the stub provider")

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    frame = await frames.read(reader, self.limits)
                    if frame is None:
                        return
                    header, payload = await self._answer(frame)
                except FrameError as exc:
                    header, payload = frames.error(exc.code, str(exc)), b""
                    if exc.fatal:
                        await frames.send(writer, header)
                        return
                await frames.send(writer, header, payload)
        except (ConnectionError, OSError) as exc:
            log.debug("stub connection ended: %s", exc)
        except Exception:  # a bug: log it, drop this connection, keep serving the others
            log.exception("stub connection failed")
        finally:
            await frames.close(writer)

    async def _answer(self, frame: Frame) -> Answer:
        op = frame.header.get("op")
        handler = self._ops.get(op) if isinstance(op, str) else None
        if handler is None:
            raise FrameError("unknown-op", f"unknown operation {op!r} (known: "
                             f"{', '.join(sorted(self._ops))})", fatal=False)
        return await handler(frame)

    async def _hello(self, frame: Frame) -> Answer:
        return {"ok": True, "provider": "gpupool-stub", "protocol": PROTOCOL,
                "memory_limit_bytes": self.memory.limit_bytes, "device": self.config.device}, b""

    async def _alloc(self, frame: Frame) -> Answer:
        size = frames.whole(frame.header, "size", 1)
        return {"ok": True, "handle": self.memory.alloc(size)}, b""

    async def _free(self, frame: Frame) -> Answer:
        return {"ok": True, "size": self.memory.free(frames.whole(frame.header, "handle"))}, b""

    async def _write(self, frame: Frame) -> Answer:
        handle, offset = frames.whole(frame.header, "handle"), frames.whole(frame.header,
                                                                            "offset")
        buf = self.memory.span(handle, offset, len(frame.payload))
        buf[offset:offset + len(frame.payload)] = frame.payload
        return {"ok": True, "size": len(frame.payload)}, b""

    async def _read(self, frame: Frame) -> Answer:
        handle, offset = frames.whole(frame.header, "handle"), frames.whole(frame.header,
                                                                            "offset")
        size = frames.whole(frame.header, "size", 0, self.config.max_payload)
        buf = self.memory.span(handle, offset, size)
        return {"ok": True, "size": size}, bytes(buf[offset:offset + size])

    async def _checksum(self, frame: Frame) -> Answer:
        rounds = frames.whole(frame.header, "rounds", 1, MAX_ROUNDS) if "rounds" in \
            frame.header else 1
        buf = self.memory.buffer(frames.whole(frame.header, "handle"))
        async with self._kernel:
            start = time.perf_counter_ns()
            crc = await asyncio.to_thread(_crc_rounds, bytes(buf), rounds)
            took = time.perf_counter_ns() - start
            self.busy_ns += took
        return {"ok": True, "crc32": crc, "busy_ns": took}, b""

    async def _usage(self, frame: Frame) -> Answer:
        return {"ok": True, "memory_bytes": self.memory.held_bytes,
                "memory_limit_bytes": self.memory.limit_bytes,
                "allocations": len(self.memory.buffers), "busy_ns": self.busy_ns}, b""


def _crc_rounds(data: bytes, rounds: int) -> int:
    crc = 0
    for _ in range(rounds):
        crc = zlib.crc32(data, crc)
    return crc


async def run(config: StubConfig, host: str, port: int,
              started: Callable[[int], None] = lambda port: None) -> None:
    """Serve until cancelled; ``started`` is told the port (0 asks the system for one)."""
    stub = StubServer(config)
    server = await stub.start(host, port)
    bound = server.sockets[0].getsockname()[1]
    log.info("stub provider (a stand-in, not a GPU) on %s:%d, memory limit %d bytes, device "
             "%s", host, bound, config.memory_limit_bytes, config.device or "-")
    started(bound)
    async with server:
        try:
            await server.serve_forever()
        finally:
            stub.memory.clear()
