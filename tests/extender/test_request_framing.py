"""A request's headers and its body are told apart whatever the chunking: over kube-
scheduler's mutual TLS, bodies of every size up to the verb's limit are answered (those
of 64-128 KiB were once counted as header bytes and the connection closed), headers over
the limit always close the connection and headers under it never do."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from prometheus_client import generate_latest

from gpupool.extender.edge.connections import HEADER_BYTES

from .builders import pod_obj
from .test_tls import SERVICE_NAME, Served

KIB = 1024
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


@pytest.fixture
def served(fake: FakeApiServer, nodes: list[str], tmp_path: Path) -> Iterator[Served]:
    s = Served(fake, tmp_path)
    yield s
    s.close()


def filter_body(size: int, nodes: list[str]) -> bytes:
    """A filter for a pod whose last-applied-configuration makes the body ``size`` bytes."""
    pod = pod_obj("big", {"gpupool.io/gpu": "1"})
    pod["metadata"]["uid"] = "u-big"
    pod["metadata"]["annotations"][LAST_APPLIED] = ""
    bare = len(msgspec.json.encode({"Pod": pod, "NodeNames": nodes}))
    pod["metadata"]["annotations"][LAST_APPLIED] = "x" * (size - bare)
    body = msgspec.json.encode({"Pod": pod, "NodeNames": nodes})
    assert len(body) == size
    return body


def closed_for(served: Served, reason: str) -> float:
    text = generate_latest(served.replica.extender.metrics.registry).decode()
    for line in text.splitlines():
        if line.startswith(f'gpupool_extender_connections_closed_total{{reason="{reason}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def post(http: httpx.Client, verb: str, body: bytes, **headers: str) -> httpx.Response:
    return http.post(f"/{verb}", content=body, extensions={"sni_hostname": SERVICE_NAME},
                     headers={"content-type": "application/json", **headers})


@pytest.mark.parametrize("kib", [60, 64, 66, 70, 80, 96, 110, 127, 128, 200])
def test_a_filter_of_64_to_128_kib_over_mutual_tls_is_answered(
        kib: int, served: Served, nodes: list[str]) -> None:
    body = filter_body(kib * KIB, nodes)
    with served.client(served.scheduler) as http:
        for _ in range(5):  # the same connection, kept alive: each one answered
            answer = post(http, "filter", body)
            assert answer.status_code == 200
            assert answer.json()["NodeNames"] == nodes
    assert closed_for(served, "header-too-large") == 0


def test_a_node_name_list_of_2500_names_over_mutual_tls_is_answered(
        served: Served, nodes: list[str]) -> None:
    names = nodes + [f"node-{k:020d}" for k in range(2500)]
    pod = pod_obj("p", {"gpupool.io/gpu": "1"})
    pod["metadata"]["uid"] = "u-p"
    body = msgspec.json.encode({"Pod": pod, "NodeNames": names})
    assert 64 * KIB < len(body) < 128 * KIB
    with served.client(served.scheduler) as http:
        for _ in range(5):
            answer = post(http, "filter", body)
            assert answer.status_code == 200 and answer.json()["NodeNames"] == nodes
    assert closed_for(served, "header-too-large") == 0


@pytest.mark.parametrize("kib", [70, 80, 100])
def test_headers_over_the_limit_close_the_connection_every_time(
        kib: int, served: Served, nodes: list[str]) -> None:
    for attempt in range(5):
        with served.client(served.scheduler) as http, pytest.raises(httpx.TransportError):
            post(http, "bind", b"{}", **{"x-padding": "p" * (kib * KIB)})
        assert closed_for(served, "header-too-large") == attempt + 1


def test_headers_just_under_the_limit_are_answered(served: Served) -> None:
    padding = "p" * (HEADER_BYTES - 1024)
    with served.client(served.scheduler) as http:
        for _ in range(5):
            assert post(http, "bind", b"{}", **{"x-padding": padding}).status_code == 200
    assert closed_for(served, "header-too-large") == 0
