"""Benchmark: what the extender's head/body framing costs on a body made of ``CRLF CRLF``
against a plain body of the same size, and on bodies of tiny chunks.

    .venv/bin/python bench/bench_framing.py [--repeat 3] [--piece-kib 64]

One POST of the preempt limit (``--max-nodes 5000``), followed by a small pipelined
request, is handed over in pieces of ``--piece-kib`` (as the network delivers them).
Bodies: ``x`` repeated (plain) and ``\\r\\n\\r\\n`` repeated, each with a Content-Length,
chunked in one chunk, in 16 KiB chunks, in 256-byte chunks (the smallest read chunk by
chunk in Python) and in 1-byte chunks (the most chunk headers a body can hold). Printed
per case, CPU ms, best of ``--repeat``:

* parser: llhttp (through httptools) alone, every piece fed straight to it, callbacks
  that keep nothing;
* framed: the same through ``Framing.feed``, and the slices it handed the parser;
* uvicorn: uvicorn's httptools protocol (what the extender runs, without its connection
  rules) reading the pieces, over a stand-in transport, the application not run;
* extender: the extender's connection protocol (``GuardedHttp``: uvicorn's plus the
  framing) reading them the same way;
* the ``CRLF CRLF`` body over the plain one, extender's protocol, same run.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

import httptools
import uvicorn
from prometheus_client import CollectorRegistry, Counter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gpupool.extender.edge.connections import ConnectionRules, guarded_protocol
from gpupool.extender.edge.framing import Framing
from gpupool.extender.edge.sizing import BodyLimits

from machine import line as machine_line

LIMIT = BodyLimits.for_cluster(5000).preempt_bytes
NEXT = b"POST /bind HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
CASES = (("Content-Length", None), ("chunked, one chunk", LIMIT),
         ("chunked, 16 KiB chunks", 16384), ("chunked, 256-byte chunks", 256),
         ("chunked, 1-byte chunks", 1))


class Quiet:
    """The parser's callbacks, wired to ``framing`` as the extender wires them."""

    def __init__(self, framing: Framing | None):
        self.framing = framing
        self.headers: list[tuple[bytes, bytes]] = []
        self.done = 0

    def on_message_begin(self) -> None:
        self.headers = []
        if self.framing is not None:
            self.framing.began()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self.framing is not None:
            self.framing.headers_done(self.headers)

    def on_body(self, body: bytes) -> None:
        pass

    def on_message_complete(self) -> None:
        self.done += 1
        if self.framing is not None:
            self.framing.completed()


class Transport(asyncio.Transport):
    """A stand-in for the socket's transport: takes what is written and drops it."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("10.0.0.1", 40000), "sockname": ("10.0.0.2", 8443)}.get(
            name, default)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def app(scope: Any, receive: Any, send: Any) -> None:
    """Waits (the bench never yields to the loop while the pieces are read)."""
    await asyncio.Event().wait()


def wire(body: bytes, chunk: int | None) -> bytes:
    """A POST of ``body``: with a Content-Length (``chunk`` None) or in chunks of
    ``chunk`` bytes; then ``NEXT``."""
    if chunk is None:
        return b"POST /preempt HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s%s" % (
            len(body), body, NEXT)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[at:at + chunk]), body[at:at + chunk])
                      for at in range(0, len(body), chunk))
    return (b"POST /preempt HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunks + b"0\r\n\r\n" + NEXT)


def best(repeat: int, read: Callable[[], None]) -> float:
    """The least CPU seconds of ``repeat`` calls of ``read``."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        read()
        times.append(time.process_time() - start)
    return min(times)


def parsed(pieces: list[bytes], framing: bool) -> tuple[Callable[[], None], list[int]]:
    """A reading of ``pieces`` by the parser (through a ``Framing`` or not), and where
    it counts the slices of its last run."""
    slices = [0]

    def read() -> None:
        reader = Quiet(Framing(64 * 1024) if framing else None)
        feed = httptools.HttpRequestParser(reader).feed_data
        slices[0] = 0

        def parse(piece: memoryview) -> None:
            slices[0] += 1
            feed(piece)  # type: ignore[arg-type]
        for piece in pieces:
            if reader.framing is None:
                parse(memoryview(piece))
            else:
                reader.framing.feed(piece, parse)
        assert reader.done == 2, reader.done
    return read, slices


def served(pieces: list[bytes], protocol: type[asyncio.Protocol],
           config: uvicorn.Config) -> Callable[[], None]:
    """A reading of ``pieces`` by a uvicorn protocol of class ``protocol``."""
    def read() -> None:
        connection: Any = protocol(config=config, server_state=ServerState(),  # type: ignore[call-arg]
                                   app_state={})
        connection.connection_made(Transport())
        for piece in pieces:
            connection.data_received(piece)
        # both requests read: the second queued behind the first, its body whole
        assert len(connection.pipeline) == 1 and not connection.cycle.more_body
        connection.connection_lost(None)
    return read


async def run(repeat: int, piece: int) -> None:
    config = uvicorn.Config(app, http="httptools", log_level="critical", lifespan="off")
    config.load()
    extender = guarded_protocol(ConnectionRules(), Counter(
        "closed", "closed", ["reason"], registry=CollectorRegistry()))
    bodies = {"plain": b"x" * LIMIT, "CRLF CRLF": b"\r\n\r\n" * (LIMIT // 4)}
    print(f"\none POST of {LIMIT / 2**20:.2f} MiB then a small one, in pieces of "
          f"{piece // 1024} KiB; CPU ms, best of {repeat}")
    print(f"  {'framing':26} {'body':10} {'parser':>8} {'framed':>8} {'slices':>7} "
          f"{'uvicorn':>8} {'extender':>8} {'CRLF/plain':>10}")
    for title, chunk in CASES:
        plain = 0.0
        for name, body in bodies.items():
            data = wire(body, chunk)
            pieces = [data[at:at + piece] for at in range(0, len(data), piece)]
            alone = best(repeat, parsed(pieces, False)[0])
            read, slices = parsed(pieces, True)
            framed = best(repeat, read)
            bare = best(repeat, served(pieces, HttpToolsProtocol, config))
            guarded = best(repeat, served(pieces, extender, config))
            plain = plain or guarded
            ratio = f"{guarded / plain:9.2f}×" if name != "plain" else ""
            print(f"  {title:26} {name:10} {alone * 1e3:8.1f} {framed * 1e3:8.1f} "
                  f"{slices[0]:7d} {bare * 1e3:8.1f} {guarded * 1e3:8.1f} {ratio:>10}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--piece-kib", type=int, default=64)
    args = parser.parse_args()
    print(machine_line("before"))
    asyncio.run(run(args.repeat, args.piece_kib * 1024))
    print("\n" + machine_line("after"))


if __name__ == "__main__":
    main()
