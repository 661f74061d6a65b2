"""The probe port cannot be starved by other pods: it is served as ``gpupool extender``
serves it (``probe_server``), and however many connections others hold open there, idle
or half-sent, the kubelet's next probe gets a connection and an answer; the quietest
connections are closed to make room, and idle ones soon."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from prometheus_client import generate_latest

from gpupool.extender.edge.app import build_probes
from gpupool.extender.edge.connections import PROBE_CONNECTIONS, PROBE_IDLE_S, PROBE_RULES
from gpupool.extender.edge.server import ThreadedServer, probe_server

from .builders import Replica
from .test_bounded_requests import address, closed_by_server

HELD = 300  # far more than the probe port's limit


@pytest.fixture
def probes(replica: Replica) -> Iterator[ThreadedServer]:
    with probe_server(build_probes(replica.extender),
                      closed=replica.extender.metrics.closed) as server:
        yield server


def held_connections(url: str, count: int, first: bytes) -> list[socket.socket]:
    """``count`` connections to ``url``, each having sent ``first`` (and kept open)."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(address(url))
        if first:
            sock.sendall(first)
            if first.endswith(b"\r\n\r\n"):
                sock.settimeout(10)
                assert b"200 OK" in sock.recv(65536)
        socks.append(sock)
    return socks


@pytest.mark.parametrize("first", [
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",  # answered, then kept alive
    b"",  # connected, silent
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow:",  # a head never finished
], ids=["kept alive", "silent", "half-sent"])
def test_connections_held_by_others_do_not_make_healthz_or_readyz_fail(
        first: bytes, probes: ThreadedServer, replica: Replica) -> None:
    socks = held_connections(probes.url, HELD, first)
    try:
        with httpx.Client(base_url=probes.url, trust_env=False, timeout=10,
                          headers={"connection": "close"}) as kubelet:
            for _ in range(20):
                assert kubelet.get("/healthz").status_code == 200
                assert kubelet.get("/readyz").status_code == 200
    finally:
        for sock in socks:
            sock.close()
    recycled = generate_latest(replica.extender.metrics.registry).decode()
    assert 'gpupool_extender_connections_closed_total{reason="recycled"}' in recycled


def test_the_probe_port_holds_at_most_its_limit_and_closes_the_quietest_first(
        replica: Replica) -> None:
    patient = replace(PROBE_RULES, idle_s=300, read_s=300)  # nothing closed for idleness
    with ThreadedServer(build_probes(replica.extender), rules=patient,
                        closed=replica.extender.metrics.closed) as probes:
        socks = held_connections(probes.url, PROBE_CONNECTIONS + 10, b"")
        try:
            # the first ten opened were the quietest: they are the ones closed
            assert all(closed_by_server(s, within_s=10) for s in socks[:10])
            assert not any(closed_by_server(s, within_s=0.01) for s in socks[10:])
            assert_answers(socks[-1])
        finally:
            for sock in socks:
                sock.close()


def assert_answers(sock: socket.socket) -> None:
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(10)
    assert b"200 OK" in sock.recv(65536)


def test_an_idle_probe_connection_is_closed_within_seconds(probes: ThreadedServer) -> None:
    assert PROBE_RULES.idle_s == PROBE_IDLE_S <= 5
    with socket.create_connection(address(probes.url)) as sock:
        assert_answers(sock)
        assert closed_by_server(sock, within_s=30)
