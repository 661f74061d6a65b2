"""The STUB provider: its protocol, its memory limit, its compute count, and bad input."""

from __future__ import annotations

import socket
import struct
import time
import zlib
from collections.abc import Iterator

import pytest

from gpupool.remote import stub
from gpupool.remote.frames import PREFIX, encode
from gpupool.remote.stubclient import StubClient, StubRefused

from .loops import LoopThread, loop_thread

LIMIT = 64 * 1024


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    with loop_thread() as lt:
        yield lt


def serve(loop: LoopThread, limit: int = LIMIT, **kw: object) -> tuple[stub.StubServer, int]:
    server = stub.StubServer(stub.StubConfig(limit, device="GPU-test", **kw))  # type: ignore[arg-type]
    listener = loop.run(server.start("127.0.0.1", 0))
    return server, listener.sockets[0].getsockname()[1]


def test_memory_written_is_read_back_and_checksummed(loop: LoopThread) -> None:
    _, port = serve(loop)
    with StubClient("127.0.0.1", port) as c:
        assert c.hello()["device"] == "GPU-test"
        h = c.alloc(1000)
        c.write(h, b"gpupool", offset=10)
        assert c.read(h, 7, offset=10) == b"gpupool"
        data = bytes(10) + b"gpupool" + bytes(983)
        assert c.checksum(h, rounds=2) == zlib.crc32(data, zlib.crc32(data))
        usage = c.usage()
        assert usage["memory_bytes"] == 1000 and usage["allocations"] == 1
        assert usage["busy_ns"] > 0
        c.free(h)
        assert c.usage()["memory_bytes"] == 0


def test_memory_beyond_the_slice_is_refused_and_nothing_changes(loop: LoopThread) -> None:
    server, port = serve(loop)
    with StubClient("127.0.0.1", port) as c:
        h = c.alloc(LIMIT - 100)
        with pytest.raises(StubRefused, match=r"out-of-memory.*would hold 65537 of the slice's "
                                              r"65536 bytes"):
            c.alloc(101)
        with pytest.raises(StubRefused, match="out-of-range"):
            c.write(h, b"x" * 200, offset=LIMIT - 250)
        assert c.usage()["memory_bytes"] == LIMIT - 100
        c.alloc(100)  # exactly the limit
    assert server.memory.held_bytes == LIMIT


def test_buffers_outlive_the_connection(loop: LoopThread) -> None:
    _, port = serve(loop)
    with StubClient("127.0.0.1", port) as c:
        h = c.alloc(16)
        c.write(h, b"kept")
    with StubClient("127.0.0.1", port) as c:
        assert c.read(h, 4) == b"kept"


@pytest.mark.parametrize(("header", "code"), [
    ({"op": "launch"}, "unknown-op"),
    ({"size": 3}, "unknown-op"),
    ({"op": "alloc", "size": -1}, "bad-request"),
    ({"op": "alloc", "size": True}, "bad-request"),
    ({"op": "alloc"}, "bad-request"),
    ({"op": "read", "handle": 99, "offset": 0, "size": 1}, "no-such-handle"),
    ({"op": "checksum", "handle": 1, "rounds": 10**9}, "bad-request"),
])
def test_a_bad_request_is_answered_with_its_reason_and_the_connection_goes_on(
        loop: LoopThread, header: dict[str, object], code: str) -> None:
    _, port = serve(loop)
    with StubClient("127.0.0.1", port) as c:
        with pytest.raises(StubRefused) as refused:
            c.call(header)
        assert refused.value.code == code
        assert c.hello()["provider"] == "gpupool-stub"


def raw_answer(sock: socket.socket) -> tuple[dict[str, object], bytes] | None:
    import json
    head = sock.recv(PREFIX.size, socket.MSG_WAITALL)
    if not head:
        return None
    hl, pl = PREFIX.unpack(head)
    body = sock.recv(hl + pl, socket.MSG_WAITALL)
    return json.loads(body[:hl]), body[hl:]


@pytest.mark.parametrize("head", [b"nope!", b'{"op":"alloc","size":' + b"9" * 5000 + b"}",
                                  b"[" * 5000 + b"]" * 5000],
                         ids=["not JSON", "a 5,000-digit number", "nested 5,000 deep"])
def test_a_header_that_is_not_json_is_refused_and_the_connection_goes_on(
        loop: LoopThread, head: bytes) -> None:
    _, port = serve(loop)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(struct.pack("!II", len(head), 0) + head)
        answer = raw_answer(s)
        assert answer is not None and answer[0]["error"] == "malformed-frame"
        s.sendall(encode({"op": "hello"}))
        answer = raw_answer(s)
        assert answer is not None and answer[0]["ok"] is True


@pytest.mark.parametrize("prefix", [struct.pack("!II", 10**6, 0),
                                    struct.pack("!II", 2, 2**31)])
def test_an_oversized_frame_is_refused_and_its_connection_closed_but_others_served(
        loop: LoopThread, prefix: bytes) -> None:
    _, port = serve(loop, max_payload=1024)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(prefix)
        answer = raw_answer(s)
        assert answer is not None and answer[0]["error"] == "frame-too-large"
        assert raw_answer(s) is None  # closed
    with StubClient("127.0.0.1", port) as c:
        assert c.hello()["ok"] is True


def test_a_slow_client_is_cut_off_and_the_server_keeps_serving(loop: LoopThread) -> None:
    _, port = serve(loop, frame_s=0.3)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
        slow.sendall(struct.pack("!II", 100, 0) + b'{"op":')  # and nothing more
        with StubClient("127.0.0.1", port) as c:
            assert c.hello()["ok"] is True
        started = time.monotonic()
        answer = raw_answer(slow)
        assert answer is not None and answer[0]["error"] == "timeout"
        assert raw_answer(slow) is None
        assert time.monotonic() - started < 30


def test_garbage_and_a_dropped_connection_never_stop_the_server(loop: LoopThread) -> None:
    _, port = serve(loop)
    for junk in (b"\x00" * 3, b"GET / HTTP/1.1\r\n\r\n", bytes(range(256))):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(junk)
    with StubClient("127.0.0.1", port) as c:
        assert c.hello()["ok"] is True
