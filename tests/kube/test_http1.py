"""The lean transport's HTTP/1.1 exchange: answers framed every way a server may frame
them, malformed ones refused with an ``http.client`` error, unsafe requests never sent."""

from __future__ import annotations

import http.client
import io

import pytest

from gpupool.kube import http1
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import KubeError

from .rawhttp import Answer, RawServer


def answer(raw: bytes, method: str = "GET") -> tuple[int, bytes, bool]:
    return http1.read_answer(io.BufferedReader(io.BytesIO(raw)), method)


@pytest.mark.parametrize("raw, expected", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", (200, b"{}", True)),
    (b"HTTP/1.1 201 Created\r\ncontent-length:  5 \r\nConnection: close\r\n\r\nhello",
     (201, b"hello", False)),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nTrailer: x\r\n\r\n", (200, b"abcdefg", True)),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 409 Conflict\r\nContent-Length: 1\r\n\r\nx",
     (409, b"x", True)),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", (200, b"x", False)),
    (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx",
     (200, b"x", True)),
    (b"HTTP/1.1 200 OK\r\n\r\nto the end", (200, b"to the end", False)),
    (b"HTTP/1.1 204 No Content\r\n\r\n", (204, b"", True)),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nX-A: 1\r\nX-A: 2\r\n\r\n{}",
     (200, b"{}", True)),
])
def test_answers_are_framed_as_the_server_framed_them(
        raw: bytes, expected: tuple[int, bytes, bool]) -> None:
    assert answer(raw) == expected


def test_the_rest_of_a_buffer_is_left_for_the_next_answer() -> None:
    reader = io.BufferedReader(io.BytesIO(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nb\r\n0\r\n\r\n"))
    assert http1.read_answer(reader, "GET")[1] == b"a"
    assert http1.read_answer(reader, "GET")[1] == b"b"


@pytest.mark.parametrize("raw, error", [
    (b"", http.client.RemoteDisconnected),
    (b"HTTP/1.1 20 OK\r\n\r\n", http.client.BadStatusLine),
    (b"SPDY/3 200 OK\r\n\r\n", http.client.BadStatusLine),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", http.client.IncompleteRead),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nx", http.client.HTTPException),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nx", http.client.HTTPException),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", http.client.HTTPException),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n", http.client.IncompleteRead),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", http.client.HTTPException),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", http.client.IncompleteRead),
    (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 101 + b"\r\n", http.client.HTTPException),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000 + b"\r\n\r\n", http.client.LineTooLong),
])
def test_malformed_answers_are_http_errors(raw: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        answer(raw)


def test_a_request_is_one_buffer_with_its_length() -> None:
    raw = http1.request_bytes("PATCH", "api:6443", "/apis/x?a=b", {"Accept": "j"}, b"{}")
    assert raw == (b"PATCH /apis/x?a=b HTTP/1.1\r\nHost: api:6443\r\nAccept: j\r\n"
                   b"Content-Length: 2\r\n\r\n{}")


@pytest.mark.parametrize("target, headers", [
    ("/pods/a b", {}), ("/pods/a\r\nX-Evil: 1", {}), ("/pods/a", {"Authorization": "t\r\nX: 1"}),
])
def test_unsafe_targets_and_header_values_are_refused(target: str, headers: dict[str, str]
                                                      ) -> None:
    with pytest.raises((http.client.InvalidURL, ValueError)):
        http1.request_bytes("GET", "h", target, headers, None)


def chunked(status: bytes, body: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\nTransfer-Encoding: chunked\r\n\r\n" +
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))


def test_chunked_answers_keep_the_connection_and_errors_keep_their_message() -> None:
    conflict = b'{"kind":"Status","reason":"Conflict","message":"the object was modified"}'
    answers = iter([chunked(b"409 Conflict", conflict),
                    chunked(b"200 OK", b'{"metadata":{"name":"n1"}}')])
    with RawServer(lambda r: Answer(raw=next(answers))) as server:
        api = KubeApi.connect(server=server.url)
        with pytest.raises(KubeError, match="get GPULedger n1: the object was modified"):
            api.get_ledger("n1")
        assert api.get_ledger("n1") == {"metadata": {"name": "n1"}}
        assert server.connections == 1 and len(server.requests) == 2
        api.close()


def test_an_answer_that_says_close_opens_a_new_connection_for_the_next() -> None:
    raw = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    with RawServer(lambda r: Answer(raw=raw, close_after=True)) as server:
        api = KubeApi.connect(server=server.url)
        for _ in range(3):
            assert api.get_ledger("n1") == {}
        assert server.connections == 3 and len(server.requests) == 3
        api.close()
