"""Bounded work per request, over real sockets: oversized bodies are refused with an
``Error`` without being buffered while ``/healthz`` keeps answering; idle, half-sent and
header-flooding connections are closed; a legitimate largest body is still served."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import msgspec
import pytest
from prometheus_client import generate_latest

from gpupool.extender.edge.app import build_probes, build_verbs
from gpupool.extender.edge.connections import ConnectionRules
from gpupool.extender.edge.server import ThreadedServer
from gpupool.extender.edge.sizing import MIB, BodyLimits

from .builders import Replica, pod_obj

QUICK = ConnectionRules(idle_s=0.5, read_s=0.5, header_bytes=8192)


@contextmanager
def serving(replica: Replica, rules: ConnectionRules) -> Iterator[tuple[str, str]]:
    """(verbs URL, probes URL), plain HTTP (TLS is exercised in test_tls)."""
    limits = BodyLimits.for_cluster(max_nodes=1000)
    with ThreadedServer(build_verbs(replica.extender, limits), rules=rules) as verbs, \
            ThreadedServer(build_probes(replica.extender), rules=rules,
                           closed=replica.extender.metrics.closed) as probes:
        yield verbs.url, probes.url


@pytest.fixture
def servers(replica: Replica) -> Iterator[tuple[str, str]]:
    with serving(replica, ConnectionRules()) as urls:
        yield urls


@pytest.fixture
def quick(replica: Replica) -> Iterator[tuple[str, str]]:
    """Servers whose connection timeouts are half a second."""
    with serving(replica, QUICK) as urls:
        yield urls


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def closed_by_server(sock: socket.socket, within_s: float = 30.0) -> bool:
    sock.settimeout(within_s)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def big_preempt(victims: int) -> bytes:
    pods = b",".join(b'{"UID":"%036d"}' % k for k in range(victims))
    return b'{"Pod":{"metadata":{"name":"p"}},"NodeNameToMetaVictims":{"n0":{"Pods":[' + \
        pods + b'],"NumPDBViolations":0}}}'


@pytest.mark.parametrize("chunked", [False, True], ids=["declared length", "chunked"])
def test_an_oversized_body_is_refused_with_an_error_while_healthz_answers(
        chunked: bool, servers: tuple[str, str], replica: Replica) -> None:
    verbs, probes = servers
    body = b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":[' + b'"n",' * (16 * MIB) + b'"n"]}'
    answered: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=probes, trust_env=False) as http:
            while not stop.is_set():
                assert http.get("/healthz").text == "ok"
                answered.append(time.monotonic())
                time.sleep(0.005)

    poller = threading.Thread(target=poll)
    poller.start()
    content = (body[i:i + MIB] for i in range(0, len(body), MIB)) if chunked else body
    started = time.monotonic()
    with httpx.Client(base_url=verbs, trust_env=False, timeout=30) as http:
        answer = http.post("/filter", content=content).json()
    ended = time.monotonic()
    stop.set()
    poller.join()
    assert "larger than" in answer["Error"] or "more than the" in answer["Error"]
    assert any(started < t < ended for t in answered)  # the probe answered meanwhile
    assert 'gpupool_extender_refused_requests_total{verb="filter"} 1.0' in \
        generate_latest(replica.extender.metrics.registry).decode()


def test_two_million_victims_are_refused_unread(servers: tuple[str, str]) -> None:
    verbs, _ = servers
    with httpx.Client(base_url=verbs, trust_env=False, timeout=60) as http:
        answer = http.post("/preempt", content=big_preempt(2_000_000))
    assert answer.status_code == 200 and answer.json() == {"NodeNameToMetaVictims": {}}


def test_the_largest_legitimate_names_body_is_served(servers: tuple[str, str],
                                                     nodes: list[str]) -> None:
    verbs, _ = servers
    names = nodes + [f"node-{k:0250d}" for k in range(997)]  # 1,000 names of 253 characters
    pod = pod_obj("p", {"gpupool.io/gpu": "1"})
    pod["metadata"]["uid"] = "u1"
    body = msgspec.json.encode({"Pod": pod, "NodeNames": names})
    assert len(body) > 250_000
    with httpx.Client(base_url=verbs, trust_env=False) as http:
        answer = http.post("/filter", content=body).json()
    assert answer["Error"] == "" and answer["NodeNames"] == nodes


@pytest.mark.parametrize("sent", [
    b"",  # connected, silent
    b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Le",  # headers half sent
    b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"Pod\":",  # body half
], ids=["idle", "half-sent headers", "half-sent body"])
def test_idle_and_half_sent_connections_are_closed(sent: bytes, quick: tuple[str, str],
                                                   replica: Replica) -> None:
    verbs, _ = quick
    with socket.create_connection(address(verbs)) as sock:
        sock.sendall(sent)
        assert closed_by_server(sock)
    reason = "idle" if not sent else "slow-request"
    assert f'gpupool_extender_connections_closed_total{{reason="{reason}"}}' in \
        generate_latest(replica.extender.metrics.registry).decode()


def test_a_kept_alive_connection_is_closed_once_idle(quick: tuple[str, str]) -> None:
    verbs, _ = quick
    with socket.create_connection(address(verbs)) as sock:
        sock.sendall(b"POST /bind HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        sock.settimeout(30)
        assert b"200 OK" in sock.recv(65536)
        assert closed_by_server(sock)


def test_a_header_flood_is_cut_off(quick: tuple[str, str], replica: Replica) -> None:
    verbs, _ = quick
    with socket.create_connection(address(verbs)) as sock:
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n")
        with pytest.raises(OSError):
            for _ in range(100):
                sock.sendall(b"X-Junk: " + b"y" * 1000 + b"\r\n")
                time.sleep(0.001)
        assert closed_by_server(sock)
    assert 'gpupool_extender_connections_closed_total{reason="header-too-large"} 1.0' in \
        generate_latest(replica.extender.metrics.registry).decode()
