"""The webhook's port under bodies held at once and TLS handshakes that never finish:
bodies past the budget over all connections get 429 with Retry-After (the API server's
client retries it within its timeout) and are never read; the others are answered; TCP
connections that send no ClientHello are closed within the handshake bound and counted,
at most ``max_handshakes`` of them held, while a real review is still answered."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
from collections.abc import Iterator

import pytest
from gpupool_testing.rawhttp import read_answer

from gpupool.webhook.server import HttpsServer, Sizes, WebhookApp
from tests.waiting import wait_for

from .conftest import HOST, SETTINGS, Webhook
from .test_edge import HANG_GUARD_S, _annotated, assert_review_answered

KIB = 1024


@contextlib.contextmanager
def served(webhook: Webhook, sizes: Sizes) -> Iterator[Webhook]:
    """``webhook``'s certificate and metrics, served under ``sizes`` on another port."""
    app = WebhookApp(SETTINGS, webhook.metrics, lambda: True, sizes)
    server = HttpsServer(app.app, webhook.tls, "127.0.0.1", 0, sizes=sizes,
                         closed=webhook.metrics.closed)
    port = server.start()
    APPS[port] = app
    try:
        yield dataclasses.replace(webhook, port=port)
    finally:
        server.stop()
        del APPS[port]


APPS: dict[int, WebhookApp] = {}  # by port, while ``served``


def small_budget_reading(webhook: Webhook) -> int:
    """Bytes of bodies the server on ``webhook``'s port holds now."""
    return APPS[webhook.port].budget.reading


def sample(webhook: Webhook, name: str, labels: dict[str, str]) -> float:
    return webhook.metrics.registry.get_sample_value(name, labels) or 0.0


def started(webhook: Webhook, sent: bytes, first: int) -> socket.socket:
    """A connection that has sent the head and ``first`` bytes of a review of ``sent``."""
    sock = webhook.connect()
    sock.sendall(f"POST /validate HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json"
                 f"\r\nContent-Length: {len(sent)}\r\n\r\n".encode() + sent[:first])
    return sock


def test_a_body_past_the_budget_gets_429_with_retry_after_and_the_rest_are_answered(
        webhook: Webhook) -> None:
    sizes = Sizes(body_budget_bytes=150 * KIB)
    with served(webhook, sizes) as small:
        held = _annotated(100 * KIB, "held-1")
        first_part = len(held) - 10  # all but its last bytes: they are what it holds
        with started(small, held, first_part) as first:
            assert wait_for(lambda: small_budget_reading(small) >= first_part)
            with small.connect() as sock:  # 100 KiB more would pass 150 KiB
                sent = _annotated(100 * KIB, "over-1")
                sock.sendall(f"POST /validate HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: "
                             f"{len(sent)}\r\n\r\n".encode())
                sock.settimeout(HANG_GUARD_S)
                answer = read_answer(sock)  # answered before any byte of its body
            assert answer.status == 429
            assert answer.headers.get(b"retry-after") == b"1"
            assert "try again" in json.loads(answer.body)["error"]
            assert_review_answered(small, "small-1")  # a few KiB still fit
            first.sendall(held[first_part:])
            first.settimeout(HANG_GUARD_S)
            answer = read_answer(first)
            assert answer.status == 200
            assert json.loads(answer.body)["response"]["uid"] == "held-1"
        status, out = small.post("/validate", _annotated(100 * KIB, "after-1"))
        assert status == 200 and out["response"]["uid"] == "after-1"
    assert sample(webhook, "gpupool_webhook_over_budget_total", {"endpoint": "validate"}) == 1


def silent(webhook: Webhook) -> socket.socket:
    """A TCP connection to the webhook that never sends a ClientHello."""
    return socket.create_connection(("127.0.0.1", webhook.port), timeout=HANG_GUARD_S)


def closed(sock: socket.socket) -> bool:
    """The server closed ``sock`` within the hang guard."""
    sock.settimeout(HANG_GUARD_S)
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def test_a_connection_that_never_starts_its_handshake_is_closed_and_counted(
        webhook: Webhook) -> None:
    with silent(webhook) as sock:
        assert_review_answered(webhook, "meanwhile-1")
        assert closed(sock)
    timeouts = {"reason": "handshake-timeout"}
    assert sample(webhook, "gpupool_webhook_connections_closed_total", timeouts) == 1


def test_handshakes_in_progress_are_bounded_and_a_review_still_gets_through(
        webhook: Webhook) -> None:
    sizes = Sizes(handshake_s=2.0, max_handshakes=8)
    with served(webhook, sizes) as bounded:
        socks = [silent(bounded) for _ in range(20)]
        try:
            assert_review_answered(bounded, "through-1")
            assert all(closed(sock) for sock in socks)
        finally:
            for sock in socks:
                sock.close()
    recycled = sample(webhook, "gpupool_webhook_connections_closed_total",
                      {"reason": "handshake-recycled"})
    timeouts = sample(webhook, "gpupool_webhook_connections_closed_total",
                      {"reason": "handshake-timeout"})
    assert recycled >= 20 - 8 and recycled + timeouts == 20


@pytest.mark.parametrize("field", ["handshake_s", "max_handshakes", "body_budget_bytes"])
def test_the_sizes_default_to_the_documented_values(field: str) -> None:
    assert getattr(Sizes(), field) == {"handshake_s": 5.0, "max_handshakes": 64,
                                       "body_budget_bytes": 32 * 1024 * 1024}[field]
    assert Sizes().body_budget_bytes == 4 * Sizes().max_body_bytes


def test_clients_gone_mid_body_give_their_share_of_the_budget_back(webhook: Webhook) -> None:
    sizes = Sizes(body_budget_bytes=300 * KIB)
    with served(webhook, sizes) as small:
        for i in range(3):  # the whole budget declared, 10 bytes of each sent, then gone
            with started(small, _annotated(100 * KIB, f"gone-{i}"), 10) as sock:
                assert not closed_within(sock, 0.2)  # the server is reading its body
        assert wait_for(lambda: small.post("/validate", _annotated(100 * KIB, "after-1"))[0]
                        == 200)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def test_heads_that_declare_large_bodies_and_send_none_keep_no_review_out(
        webhook: Webhook) -> None:
    sizes = Sizes(body_budget_bytes=400 * KIB, max_body_bytes=100 * KIB)
    with served(webhook, sizes) as small:
        socks = [started(small, _annotated(100 * KIB - 512, f"head-{i}"), 0) for i in range(4)]
        try:
            assert_review_answered(small, "small-2")
            status, out = small.post("/validate", _annotated(100 * KIB - 512, "large-2"))
            assert status == 200 and out["response"]["uid"] == "large-2"
        finally:
            for sock in socks:
                sock.close()
