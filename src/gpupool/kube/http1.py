"""One HTTP/1.1 request and its answer on an open socket: the lean transport's exchange.

``http.client`` costs 0.14-0.16 ms of client CPU per write on the 2-core development
machine, most of it building headers one ``putheader`` at a time and parsing the
answer's headers through ``email.parser``; this exchange costs 0.06-0.07 ms (both
measured by ``bench/bench_kube_writes.py`` on one loopback server; lightkube: 0.42-0.45).
It is used for the extender's writes (the GPULedger compare-and-swap and the Binding of
every pod): two per pod. Connections (TCP, TLS) are still opened and closed by
``http.client``; watches, which stream, still read through it.

The answer is read as RFC 9112 says: informational (1xx) heads are skipped, the body
is chunked, sized by ``Content-Length`` or runs to the end of the connection; whether
the connection stays open follows the version and ``Connection``. Anything malformed
raises an ``http.client.HTTPException`` (the transport's callers turn it into a
``KubeError``); a connection that ends before the answer raises
``http.client.RemoteDisconnected``, as ``http.client`` does, so a dropped kept-alive
connection is retried the same way.
"""

from __future__ import annotations

import http.client
import io
import re
import socket
from collections.abc import Mapping

MAX_LINE = 65536
MAX_HEADERS = 100
_UNSAFE = re.compile(r"[\x00-\x20\x7f]")  # no space or control byte in a target or value


class Reader(io.BufferedReader):
    """A buffered reader of ``sock`` that does not keep the socket open after its
    connection is closed (``socket.makefile`` would, until the reader is closed too)."""

    def __init__(self, sock: socket.socket):
        super().__init__(socket.SocketIO(sock, "rb"), 65536)
        self.sock = sock


def request_bytes(method: str, host: str, target: str, headers: Mapping[str, str],
                  body: bytes | None) -> bytes:
    """The request's head and body in one buffer (one ``sendall``)."""
    if _UNSAFE.search(target) or _UNSAFE.search(method):
        raise http.client.InvalidURL(f"{target!r} is not a request target")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name} holds a line break")
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head


def read_answer(reader: io.BufferedReader, method: str) -> tuple[int, bytes, bool]:
    """(status, body, whether the connection can carry another request)."""
    while True:
        version, status = _status_line(reader)
        headers = _headers(reader)
        if not 100 <= status < 200:
            break
    connection = headers.get(b"connection", b"").lower()
    keep = b"close" not in connection and (
        version == b"HTTP/1.1" or b"keep-alive" in connection)
    if method == "HEAD" or status in (204, 304):
        return status, b"", keep
    coding = headers.get(b"transfer-encoding")
    if coding is not None:
        if coding.lower().rsplit(b",", 1)[-1].strip() != b"chunked":
            return status, reader.read(), False  # framed by the end of the connection
        return status, _chunked(reader), keep
    size = headers.get(b"content-length")
    if size is None:
        return status, reader.read(), False
    length = _length(size)
    body = reader.read(length)
    if len(body) < length:
        raise http.client.IncompleteRead(body, length - len(body))
    return status, body, keep


def _line(reader: io.BufferedReader, what: str) -> bytes:
    line = reader.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise http.client.LineTooLong(what)
    return line


def _status_line(reader: io.BufferedReader) -> tuple[bytes, int]:
    line = _line(reader, "status line")
    if not line:
        raise http.client.RemoteDisconnected("Remote end closed connection without response")
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit() \
            or len(parts[1]) != 3:
        raise http.client.BadStatusLine(repr(line))
    return parts[0], int(parts[1])


def _headers(reader: io.BufferedReader) -> dict[bytes, bytes]:
    """The header fields by lower-cased name (repeated fields joined by commas)."""
    fields: dict[bytes, bytes] = {}
    for _ in range(MAX_HEADERS + 1):
        line = _line(reader, "header line")
        if line in (b"\r\n", b"\n"):
            return fields
        if not line:
            raise http.client.IncompleteRead(b"")
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise http.client.HTTPException(f"malformed header line {line[:80]!r}")
        key, value = name.lower(), value.strip()
        fields[key] = fields[key] + b", " + value if key in fields else value
    raise http.client.HTTPException(f"more than {MAX_HEADERS} header fields")


def _length(text: bytes) -> int:
    values = {v.strip() for v in text.split(b",")}  # "5, 5" is allowed, "5, 6" is not
    if len(values) != 1 or not (value := values.pop()).isdigit():
        raise http.client.HTTPException(f"bad Content-Length {text[:40]!r}")
    return int(value)


def _chunked(reader: io.BufferedReader) -> bytes:
    parts: list[bytes] = []
    while True:
        line = _line(reader, "chunk size")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise http.client.HTTPException(f"bad chunk size {line[:40]!r}") from None
        if size < 0:
            raise http.client.HTTPException(f"bad chunk size {line[:40]!r}")
        if size == 0:
            _headers(reader)  # trailer fields, up to the blank line
            return b"".join(parts)
        chunk = reader.read(size)
        if len(chunk) < size or reader.read(2) != b"\r\n":
            raise http.client.IncompleteRead(b"".join(parts) + chunk)
        parts.append(chunk)
