"""A bare HTTP/1.1 client for tests and benchmarks of gpupool's HTTP servers: it sends a
request's body in the pieces it is told to (as a network may deliver them), over a
socket the caller connected (plain or TLS), and reads the answer with llhttp (httptools'
response parser), so a malformed or missing answer is told apart from a refusal. Not a
fake: a client, like httpx, that gives control of the chunking.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

import httptools


class Dropped(Exception):
    """The server closed the connection without a complete answer."""


@dataclass
class Answer:
    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    complete: bool = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


def pieces(size: int, rng: random.Random, largest: int = 65536) -> Iterator[int]:
    """Piece sizes adding up to ``size``: 1 byte to ``largest``, spread over the scales."""
    sent = 0
    while sent < size:
        piece = min(size - sent, max(1, int(2 ** rng.uniform(0, largest.bit_length() - 1))))
        yield piece
        sent += piece


def exchange(sock: socket.socket, method: str, path: str, body: bytes,
             cut: Iterator[int] | None = None, host: str = "gpupool") -> Answer:
    """Send one request with ``body`` in the pieces ``cut`` gives (at once if None) and
    read its answer; ``Dropped`` if the connection ends before the answer does."""
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head)
    at = 0
    try:
        for size in cut if cut is not None else iter([len(body)]):
            sock.sendall(body[at:at + size])
            at += size
    except (BrokenPipeError, ConnectionResetError):
        pass  # an early answer and close: read what was answered
    return read_answer(sock)


def read_answer(sock: socket.socket) -> Answer:
    answer = Answer()
    parser = httptools.HttpResponseParser(answer)
    while not answer.complete:
        try:
            data = sock.recv(262144)
        except (ConnectionResetError, TimeoutError) as exc:
            raise Dropped(f"no complete answer: {exc}") from None
        if not data:
            raise Dropped("the connection closed without a complete answer")
        parser.feed_data(data)
    answer.status = parser.get_status_code()
    return answer
