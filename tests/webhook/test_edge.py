"""The webhook's HTTPS edge under the probe the extender's edge passed: heads just under
and over the limit, bodies of 60-130 KiB and near ``MAX_BODY_BYTES`` in random pieces
(``CRLF CRLF``-heavy ones too), a slow head and a slow body, many idle keep-alive
connections while the probes and a real review must still be answered, deeply nested
JSON and huge integers in random pieces, an over-limit body refused before it is sent.
Every request the API server could send is answered; what no API server sends closes
the connection or gets a well-formed refusal, never a plain-text 500."""

from __future__ import annotations

import contextlib
import json
import random
import ssl
import time
from collections.abc import Iterator

import pytest
from gpupool_testing.rawhttp import Dropped, exchange, pieces, read_answer

from gpupool.contract.jsondepth import MAX_DEPTH
from gpupool.webhook.server import MAX_BODY_BYTES, WEBHOOK_RULES

from .builders import body, pod, review
from .conftest import HOST, Webhook

KIB = 1024
SEED = 20270114
HANG_GUARD_S = 60.0  # only a hang guard: the closes below come after seconds
HELD = 1000  # idle keep-alive connections held by someone else


def closed_by_server(sock: ssl.SSLSocket, within_s: float = HANG_GUARD_S) -> bool:
    """The server closed ``sock`` (end of stream or reset) within ``within_s``."""
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionError, ssl.SSLError):
        return True
    except TimeoutError:
        return False
    return True


def head(path: str, size: int, method: str = "GET", extra: str = "") -> bytes:
    """A request head of exactly ``size`` bytes (padded by one header)."""
    bare = (f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\n{extra}X-Padding: \r\n\r\n").encode()
    return bare.replace(b"X-Padding: ", b"X-Padding: " + b"p" * (size - len(bare)))


def crlf_padded(size: int, uid: str) -> bytes:
    """A review of ``size`` bytes whose padding is JSON whitespace made of ``CRLF CRLF``
    runs (valid JSON between tokens): every piece holds what ends a head."""
    base = body(review(pod(), uid=uid))
    gap = size - len(base)
    pad = (b"\r\n\r\n" * (gap // 4 + 1))[:gap]
    return base[:1] + pad + base[1:]


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    return random.Random(f"{SEED}-{request.node.name}")


def assert_review_answered(webhook: Webhook, uid: str = "ok-1") -> None:
    status, out = webhook.post("/validate", body(review(pod(), uid=uid)))
    assert status == 200 and out["response"] == {"uid": uid, "allowed": True}


# -- heads ------------------------------------------------------------------------------


def test_a_head_just_under_the_limit_is_answered_on_a_kept_alive_connection(
        webhook: Webhook) -> None:
    near = head("/healthz", WEBHOOK_RULES.header_bytes - 64)
    with webhook.connect() as sock:
        for _ in range(5):
            sock.sendall(near)
            answer = read_answer(sock)
            assert answer.status == 200 and bytes(answer.body) == b"ok"


@pytest.mark.parametrize("kib", [17, 80, 1024])
def test_a_head_over_the_limit_closes_the_connection_unanswered(
        webhook: Webhook, kib: int) -> None:
    with webhook.connect() as sock:
        with contextlib.suppress(ConnectionError, ssl.SSLError):  # closed while sent
            sock.sendall(head("/healthz", kib * KIB))
        with pytest.raises(Dropped):
            read_answer(sock)
    closed = webhook.metrics.registry.get_sample_value(
        "gpupool_webhook_connections_closed_total", {"reason": "header-too-large"})
    assert closed == 1.0
    assert webhook.get("/healthz") == (200, "ok")


# -- bodies -----------------------------------------------------------------------------


@pytest.mark.parametrize("kib", [60, 64, 66, 80, 96, 127, 128, 130])
@pytest.mark.parametrize("padding", ["annotation", "crlf"])
def test_a_review_of_60_to_130_kib_in_random_pieces_is_answered_on_one_connection(
        webhook: Webhook, rng: random.Random, kib: int, padding: str) -> None:
    with webhook.connect() as sock:
        for k in range(4):  # kept alive, as the API server keeps its connections
            size = kib * KIB + rng.randrange(-512, 512)
            uid = f"big-{k}"
            sent = crlf_padded(size, uid) if padding == "crlf" else _annotated(size, uid)
            answer = exchange(sock, "POST", "/validate", sent, pieces(len(sent), rng, 4096),
                              host=HOST)
            assert answer.status == 200, bytes(answer.body[:200])
            assert json.loads(answer.body)["response"] == {"uid": uid, "allowed": True}


def _annotated(size: int, uid: str) -> bytes:
    obj = pod(annotations={"pad": ""})
    bare = len(body(review(obj, uid=uid)))
    obj["metadata"]["annotations"]["pad"] = "x" * (size - bare)
    sent = body(review(obj, uid=uid))
    assert len(sent) == size
    return sent


@pytest.mark.parametrize("size", [MAX_BODY_BYTES - 1, MAX_BODY_BYTES])
def test_a_review_at_the_body_limit_in_random_crlf_heavy_pieces_is_answered(
        webhook: Webhook, rng: random.Random, size: int) -> None:
    sent = crlf_padded(size, "max-1")
    with webhook.connect() as sock:
        answer = exchange(sock, "POST", "/mutate", sent, pieces(len(sent), rng), host=HOST)
    assert answer.status == 200
    assert json.loads(answer.body)["response"]["uid"] == "max-1"


def test_a_body_over_the_limit_is_refused_before_it_is_sent(webhook: Webhook) -> None:
    with webhook.connect() as sock:
        sock.sendall(head("/validate", 256, "POST", "Content-Type: application/json\r\n"
                          f"Content-Length: {MAX_BODY_BYTES + 1}\r\n"))
        sock.settimeout(10)
        answer = read_answer(sock)  # no byte of the body sent
    assert answer.status == 413 and "larger than" in json.loads(answer.body)["error"]
    assert_review_answered(webhook)


# -- slow and idle connections ----------------------------------------------------------


def trickle(sock: ssl.SSLSocket, start: bytes, every_s: float = 1.0) -> float:
    """Send ``start``, then a byte every ``every_s`` until the server closes; seconds
    until then (``HANG_GUARD_S`` and more when it never does)."""
    began = time.monotonic()
    sock.sendall(start)
    while time.monotonic() - began < HANG_GUARD_S:
        try:
            sock.sendall(b"a")
        except (ConnectionError, ssl.SSLError):
            return time.monotonic() - began
        if closed_by_server(sock, within_s=every_s):
            return time.monotonic() - began
    return time.monotonic() - began


@pytest.mark.parametrize("start", [
    b"POST /validate HTTP/1.1\r\nHost: x\r\nX-Slow: ",  # a head never finished
    b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{",  # a slow body
], ids=["slow head", "slow body"])
def test_a_request_trickled_byte_by_byte_is_closed_and_others_are_answered_meanwhile(
        webhook: Webhook, start: bytes) -> None:
    with webhook.connect() as slow:
        took = trickle(slow, start)
    assert took < HANG_GUARD_S
    closed = webhook.metrics.registry.get_sample_value(
        "gpupool_webhook_connections_closed_total", {"reason": "slow-request"})
    assert closed == 1.0
    assert_review_answered(webhook)


@pytest.fixture
def held(webhook: Webhook) -> Iterator[list[ssl.SSLSocket]]:
    """``HELD`` connections, each answered once and then kept alive, idle."""
    socks: list[ssl.SSLSocket] = []
    try:
        for _ in range(HELD):
            sock = webhook.connect()
            sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
            assert read_answer(sock).status == 200
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def test_idle_keep_alive_connections_of_others_never_block_probes_or_reviews(
        webhook: Webhook, held: list[ssl.SSLSocket]) -> None:
    for k in range(20):
        assert webhook.get("/healthz") == (200, "ok")
        assert webhook.get("/readyz") == (200, "ok")
        assert_review_answered(webhook, f"while-held-{k}")
    # the server holds at most its limit: the quietest were closed to make room
    still_open = [s for s in held if not closed_by_server(s, within_s=0.001)]
    assert len(still_open) <= WEBHOOK_RULES.max_connections
    recycled = webhook.metrics.registry.get_sample_value(
        "gpupool_webhook_connections_closed_total", {"reason": "recycled"})
    assert recycled is not None and recycled >= HELD - WEBHOOK_RULES.max_connections


# -- bodies no API server sends -----------------------------------------------------------


def _hostile(kind: str, rng: random.Random) -> bytes:
    obj = pod()
    obj["spec"]["x"] = "@"
    text = body(review(obj, uid="hostile-1")).decode()
    depth = rng.choice([MAX_DEPTH, MAX_DEPTH + 1, 5_000, 100_000])
    value = {"deep": "[" * depth + "]" * depth,
             "deep-objects": '{"a":' * depth + "1" + "}" * depth,
             "huge-integer": "7" * rng.choice([4_300, 4_301, 100_000]),
             "huge-float": "7" * 50_000 + ".5e999999"}[kind]
    return text.replace('"@"', value).encode()


@pytest.mark.parametrize("kind", ["deep", "deep-objects", "huge-integer", "huge-float"])
def test_deep_json_and_huge_numbers_in_random_pieces_get_a_review_or_400(
        webhook: Webhook, rng: random.Random, kind: str) -> None:
    for path in ("/validate", "/mutate"):
        for _ in range(3):
            sent = _hostile(kind, rng)
            with webhook.connect() as sock:
                answer = exchange(sock, "POST", path, sent, pieces(len(sent), rng, 8192),
                                  host=HOST)
            assert answer.headers.get(b"content-type") == b"application/json"
            out = json.loads(answer.body)
            if answer.status == 200:
                assert out["response"]["uid"] == "hostile-1"
                assert isinstance(out["response"]["allowed"], bool)
            else:
                assert answer.status == 400 and isinstance(out["error"], str), out
    assert_review_answered(webhook)


def test_the_socket_helpers_see_a_close(webhook: Webhook) -> None:
    """``closed_by_server`` tells an open connection from one the server closed."""
    with webhook.connect() as sock:
        assert not closed_by_server(sock, within_s=0.05)
        sock.sendall(b"NOT HTTP\r\n\r\n")
        assert closed_by_server(sock, within_s=10)
