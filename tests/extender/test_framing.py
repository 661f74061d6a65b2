"""``Framing`` with the real HTTP parser (llhttp, through httptools, as uvicorn runs it):
whatever the chunking of a stream of pipelined requests, with bodies of a declared length
or chunked, from 1 byte to a verb's limit, every head and body is read intact and a head
is cut off exactly when it is longer than the limit, never because of a body; and a body
costs one slice per piece the network delivers whatever it holds (an example's time is
linear in its bytes: no body, however made, multiplies the parser's calls)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import httptools
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.extender.edge.framing import END, Framing
from gpupool.extender.edge.sizing import BodyLimits

LIMITS = BodyLimits.for_cluster()
SMALL_HEAD = 2048


@dataclass
class Reader:
    """The parser's callbacks as the extender's connection protocol wires them."""

    framing: Framing
    heads: list[list[tuple[bytes, bytes]]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    slices: int = 0  # handed to the parser

    def __post_init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)

    def on_message_begin(self) -> None:
        self.framing.began()
        self.headers, self.body = [], bytearray()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.framing.headers_done(self.headers)
        self.heads.append(self.headers)

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.framing.completed()
        self.bodies.append(bytes(self.body))

    def read(self, chunks: list[bytes]) -> bool:
        """False once the framing cut the stream off."""
        return all(self.framing.feed(c, self.parse) for c in chunks)

    def parse(self, piece: memoryview) -> None:
        self.slices += 1
        self.parser.feed_data(piece)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Sent:
    head: bytes
    body: bytes
    wire: bytes


def request(head_bytes: int, body: bytes, chunked: bool, rng: random.Random,
            blank_lines: int = 0) -> Sent:
    """A POST whose head (blank lines before it included) is ``head_bytes`` long or, when
    the fixed part is longer, as short as it can be."""
    framing = b"Transfer-Encoding: chunked\r\n" if chunked else \
        b"Content-Length: %d\r\n" % len(body)
    fixed = b"\r\n" * blank_lines + b"POST /filter HTTP/1.1\r\nHost: x\r\n" + framing
    pad = head_bytes - len(fixed) - len(b"X-Pad: \r\n\r\n")
    head = fixed + (b"X-Pad: " + b"p" * pad + b"\r\n" if pad >= 0 else b"") + b"\r\n"
    return Sent(head, body, head + (encoded(body, rng) if chunked else body))


# size lines as llhttp accepts them: any case, leading zeros, extensions
SIZE_LINES = (b"%x\r\n", b"%X\r\n", b"000%x\r\n", b"%x;ext\r\n",
              b"%x;a=1;q=\"x y\\\"z\"\r\n")


def encoded(body: bytes, rng: random.Random, most: int = 2**17) -> bytes:
    """``body`` chunked at random (chunks of 1 byte to ``most``), with a trailer now and
    then."""
    out, at = bytearray(), 0
    while at < len(body):
        size = min(len(body) - at, int(2 ** rng.uniform(0, math.log2(most))))
        out += rng.choice(SIZE_LINES) % size + body[at:at + size] + b"\r\n"
        at += size
    out += rng.choice([b"0", b"000", b"0;last"]) + b"\r\n" + \
        (b"X-Trailer: t\r\nX-Other: \r\n" if rng.random() < 0.3 else b"") + b"\r\n"
    return bytes(out)


def chunked_at_random(data: bytes, rng: random.Random) -> list[bytes]:
    """``data`` cut where the network might: pieces of 1 byte to 256 KiB."""
    out, at = [], 0
    while at < len(data):
        size = int(2 ** rng.uniform(0, 18))
        out.append(data[at:at + size])
        at += size
    return out


def body_of(size: int, rng: random.Random) -> bytes:
    """``size`` bytes that look like a head to a careless reader (CRLFs, headers)."""
    unit = rng.choice([b"x", b"\r\n\r\n", b"Host: y\r\n", b"0\r\n\r\nPOST / HTTP/1.1\r\n"])
    return (unit * (size // len(unit) + 1))[:size]


@settings(max_examples=150)
@given(seed=st.integers(0, 2**32), requests=st.integers(1, 4),
       head=st.integers(40, 2 * SMALL_HEAD), body=st.integers(0, 200_000))
def test_heads_are_cut_off_only_past_the_limit_and_bodies_never_count(
        seed: int, requests: int, head: int, body: int) -> None:
    rng = random.Random(seed)
    sent = [request(rng.choice([head, rng.randint(40, SMALL_HEAD)]),
                    body_of(rng.choice([0, 1, body, rng.randint(0, 5000)]), rng),
                    rng.random() < 0.4, rng, blank_lines=rng.choice([0, 0, 0, 1, 3]))
            for _ in range(requests)]
    reader = Reader(Framing(SMALL_HEAD))
    read = reader.read(chunked_at_random(b"".join(s.wire for s in sent), rng))
    fits = [len(s.head) <= SMALL_HEAD for s in sent]
    whole = fits.index(False) if False in fits else len(sent)
    assert read == (whole == len(sent))
    assert reader.bodies == [s.body for s in sent[:whole]]
    assert len(reader.heads) == whole  # the head over the limit was never completed


@settings(max_examples=40)
@given(seed=st.integers(0, 2**32), verb=st.sampled_from(["filter", "preempt", "bind"]),
       fraction=st.floats(0, 1), chunked=st.booleans())
def test_every_body_size_up_to_the_verbs_limit_is_read_whole(
        seed: int, verb: str, fraction: float, chunked: bool) -> None:
    rng = random.Random(seed)
    limit = LIMITS.of(verb)
    size = max(1, round(limit ** fraction))  # 1 byte to the limit, spread over the scales
    heads = [rng.randint(40, SMALL_HEAD), SMALL_HEAD]
    sent = [request(rng.choice(heads), body_of(size, rng), chunked, rng),
            request(rng.choice(heads), b"{}", False, rng)]
    reader = Reader(Framing(SMALL_HEAD))
    assert reader.read(chunked_at_random(b"".join(s.wire for s in sent), rng))
    assert reader.bodies == [s.body for s in sent]
    assert not reader.framing.chunks.lost  # a chunked body was read chunk by chunk


@pytest.mark.parametrize(("chunks", "size"), [
    (None, LIMITS.of("preempt")), (0, LIMITS.of("preempt")), (2**17, LIMITS.of("preempt")),
    (16, 256 * 1024)], ids=["content-length", "one chunk", "random chunks", "tiny chunks"])
def test_a_body_of_crlf_crlf_costs_one_slice_per_piece(chunks: int | None, size: int
                                                        ) -> None:
    """A body of END repeated up to the verb's limit (each one once cost a slice of its
    own: millions of parser calls for a preempt) is sliced only where the pieces end and
    the phases change; so is one of tiny chunks (smaller: the parser's own callbacks per
    chunk, in Python here, would make the test slow, not the framing)."""
    rng = random.Random(5)
    body = END * (size // len(END))
    framing = b"Content-Length: %d\r\n" % len(body) if chunks is None else \
        b"Transfer-Encoding: chunked\r\n"
    head = b"POST /preempt HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n"
    wire = body if chunks is None else \
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if chunks == 0 else \
        encoded(body, rng, most=chunks)
    after = request(SMALL_HEAD, b"{}", False, rng)  # a head of exactly the limit behind it
    pieces = chunked_at_random(head + wire + after.wire, rng)
    reader = Reader(Framing(SMALL_HEAD))
    assert reader.read(pieces)
    assert reader.bodies == [body, b"{}"]
    # each slice ends where a piece ends or a phase does (empty lines, head, body)
    assert reader.slices <= len(pieces) + 3 * 2
    assert not reader.framing.chunks.lost  # the chunks were read, not searched


@pytest.mark.parametrize("line", [*SIZE_LINES, b'%x;e="1";f\r\n', b"0%X;x=y\r\n"])
@pytest.mark.parametrize("size", [1, 15, 16, 255, 256, 4099])
def test_a_chunked_body_ends_where_llhttp_ends_it_however_it_is_cut(
        line: bytes, size: int) -> None:
    """Read chunk by chunk, the body ends exactly where the parser ends it: the request
    behind it, whose head is exactly the limit, is read whole wherever the stream is cut
    in two (a body that ended a byte late would push that head over the limit)."""
    rng = random.Random(size)
    body = b"\r\n\r\n0\r\n\r\n"[:size] * (size // 9 + 1)
    chunked = b"".join(line % len(part) + part + b"\r\n"
                       for part in (body[:size], body[:3], body[:size]))
    first = b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    stream = first + chunked + b"0;z\r\nX-T: a\r\n\r\n"
    after = request(SMALL_HEAD, b"{}", False, rng)
    for cut in range(len(first) + 1, len(stream) + 2):
        reader = Reader(Framing(SMALL_HEAD))
        data = stream + after.wire
        assert reader.read([data[:cut], data[cut:]]), cut
        assert reader.bodies == [body[:size] + body[:3] + body[:size], b"{}"]
        assert reader.framing.chunks.ended and not reader.framing.chunks.lost


@pytest.mark.parametrize("line", [b";a\r\n", b" 1\r\n", b"10000000000000000\r\n"])
def test_a_size_line_llhttp_refuses_leaves_it_to_the_parser(line: bytes) -> None:
    reader = Reader(Framing(SMALL_HEAD))
    head = b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    with pytest.raises(httptools.HttpParserError):
        reader.read([head + line + b"x\r\n0\r\n\r\n"])
    assert reader.framing.chunks.lost and reader.bodies == []


def test_a_head_of_exactly_the_limit_is_read_and_one_byte_more_is_cut_off() -> None:
    rng = random.Random(7)
    for size, whole in ((SMALL_HEAD, True), (SMALL_HEAD + 1, False)):
        sent = request(size, b"{}", False, rng)
        assert len(sent.head) == size
        for cut in range(1, len(sent.wire)):
            reader = Reader(Framing(SMALL_HEAD))
            assert reader.read([sent.wire[:cut], sent.wire[cut:]]) is whole
            assert reader.bodies == ([b"{}"] if whole else [])


def test_blank_lines_alone_count_as_head() -> None:
    reader = Reader(Framing(SMALL_HEAD))
    assert not reader.read([b"\r\n" * SMALL_HEAD])
    assert reader.heads == []
