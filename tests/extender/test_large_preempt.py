"""A preempt body as large as the limit allows stalls nothing: reading 200,000 node keys
(about 9 MB) leaves nothing per node for the garbage collector (whose passes stop every
thread, the probes' included, for as long as they take) and the verdict looks only at
nodes the cache knows; over kube-scheduler's mutual TLS, such a body naming more nodes
than the cluster has is refused unread, and the largest kube-scheduler sends is decided
while /healthz and a small filter are answered. Latency itself is measured by
bench/bench_probes.py."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.extender.edge.app import build_probes
from gpupool.extender.edge.server import probe_server
from gpupool.extender.edge.sizing import BodyLimits
from gpupool.extender.preemption import proposals

from .builders import pod_obj
from .test_tls import SERVICE_NAME, Served

NODES = 200_000


def preempt_body(nodes: list[str], victims: int = 0, pod: dict[str, Any] | None = None
                 ) -> bytes:
    """No victims proposed on ``NODES`` nodes that do not exist, ``victims`` on each of
    ``nodes``."""
    pods = b",".join(b'{"UID":"v-%d"}' % k for k in range(victims))
    entries = [b'"ghost-%06d":{"Pods":[],"NumPDBViolations":0}' % k for k in range(NODES)]
    entries += [b'"%s":{"Pods":[%s],"NumPDBViolations":1}' % (n.encode(), pods)
                for n in nodes]
    return b'{"Pod":' + msgspec.json.encode(pod or {"metadata": {"name": "p"}}) + \
        b',"NodeNameToMetaVictims":{' + b",".join(entries) + b"}}"


def tracked_objects_made(read: Callable[[], Any]) -> tuple[int, Any]:
    """(objects the garbage collector tracks that ``read`` made and left alive, its
    result), with the collector paused so none is collected meanwhile."""
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        result = read()
        return gc.get_count()[0] - before, result
    finally:
        gc.enable()


def test_a_200000_node_preempt_body_leaves_nothing_per_node_for_the_collector() -> None:
    body = preempt_body(["n0"])
    assert len(body) < BodyLimits.for_cluster().preempt_bytes
    made, args = tracked_objects_made(lambda: proposals.read_preemption(body))
    assert len(args.victims) == NODES + 1 and args.pdb_violations["n0"] == 1
    assert made < 100  # the tables themselves, not one object per node


def test_victims_are_kept_as_tuples_the_collector_lets_go_of() -> None:
    body = preempt_body([f"n{k}" for k in range(1000)], victims=2)
    args = proposals.read_preemption(body)
    assert args.victims["n999"] == ("v-0", "v-1")
    gc.collect()
    assert not any(gc.is_tracked(uids) for uids in args.victims.values())


def test_the_verdict_looks_only_at_nodes_the_cache_knows(
        fake: FakeApiServer, nodes: list[str], served: Served) -> None:
    body = preempt_body(nodes, 1, pods(fake)[0])
    assert len(body) < BodyLimits.for_cluster().preempt_bytes
    answer = served.replica.extender.preempt(body)
    assert set(answer["NodeNameToMetaVictims"]) == set(nodes)  # room on each


def largest_kube_scheduler_preempt(nodes: list[str], pod: dict[str, Any]) -> bytes:
    """What kube-scheduler sends at most: 500 candidate nodes (a tenth of 5,000) with 256
    victims each, the pod padded to the limit."""
    victims = [{"UID": f"{k:036d}"} for k in range(256)]
    table = {n: {"Pods": victims, "NumPDBViolations": 0} for n in nodes}
    table |= {f"ghost-{k:03d}": {"Pods": victims, "NumPDBViolations": 0}
              for k in range(500 - len(nodes))}
    pod["metadata"]["annotations"] = {"pad": ""}
    bare = len(msgspec.json.encode({"Pod": pod, "NodeNameToMetaVictims": table}))
    pod["metadata"]["annotations"]["pad"] = "x" * (BodyLimits.for_cluster().preempt_bytes - bare)
    return msgspec.json.encode({"Pod": pod, "NodeNameToMetaVictims": table})


def while_polled(served: Served, body: bytes, small: dict[str, Any], nodes: list[str]
                 ) -> tuple[httpx.Response, list[list[str]], bool]:
    """(the preempt's answer, the small filter's nodes, whether /healthz answered while
    the preempt was in flight)."""
    extender = served.replica.extender
    healthz: list[float] = []
    filtered: list[list[str]] = []
    stop = threading.Event()
    with probe_server(build_probes(extender), closed=extender.metrics.closed) as probes:
        def poll() -> None:
            with httpx.Client(base_url=probes.url, trust_env=False, timeout=30) as http:
                while not stop.is_set():
                    assert http.get("/healthz").status_code == 200
                    healthz.append(time.monotonic())

        def filter_meanwhile() -> None:
            with served.client(served.scheduler) as http:
                answer = http.post("/filter", json={"Pod": small, "NodeNames": nodes},
                                   extensions={"sni_hostname": SERVICE_NAME})
                filtered.append(answer.json()["NodeNames"])

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            with served.client(served.scheduler) as http:
                started = time.monotonic()
                other = threading.Thread(target=filter_meanwhile)
                other.start()
                answer = http.post("/preempt", content=body, timeout=60,
                                   extensions={"sni_hostname": SERVICE_NAME})
                ended = time.monotonic()
                other.join()
        finally:
            stop.set()
            poller.join()
    return answer, filtered, any(started < t < ended for t in healthz)


@pytest.fixture
def served(fake: FakeApiServer, nodes: list[str], tmp_path: Path) -> Iterator[Served]:
    s = Served(fake, tmp_path)
    yield s
    s.close()


def pods(fake: FakeApiServer) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the pod that preempts, stored; a small pod to filter meanwhile)."""
    small = pod_obj("small", {"gpupool.io/gpu": "1"})
    small["metadata"]["uid"] = "u-small"
    return fake.seed("pods", pod_obj("big", {"gpupool.io/gpu": "1"})), small


def test_healthz_and_a_small_filter_are_answered_while_the_largest_preempt_is_decided(
        fake: FakeApiServer, nodes: list[str], served: Served) -> None:
    pod, small = pods(fake)
    body = largest_kube_scheduler_preempt(nodes, pod)
    assert len(body) == BodyLimits.for_cluster().preempt_bytes
    answer, filtered, probed = while_polled(served, body, small, nodes)
    assert answer.status_code == 200
    assert set(answer.json()["NodeNameToMetaVictims"]) == set(nodes)  # read and decided
    assert filtered == [nodes]
    assert probed


def test_a_preempt_naming_more_nodes_than_the_cluster_has_is_refused_unread(
        fake: FakeApiServer, nodes: list[str], served: Served) -> None:
    pod, small = pods(fake)
    answer, filtered, _ = while_polled(served, preempt_body(nodes, 1, pod), small, nodes)
    refused = served.replica.extender.metrics.registry.get_sample_value(
        "gpupool_extender_refused_requests_total", {"verb": "preempt"})
    assert answer.status_code == 200 and answer.json() == {"NodeNameToMetaVictims": {}}
    assert refused == 1
    assert filtered == [nodes]


def test_the_count_of_candidate_nodes_is_never_below_the_nodes_named() -> None:
    most = 5000
    for named in (most, most + 1):
        body = b'{"Pod":{},"NodeNameToMetaVictims":{' + b",".join(
            b'"n%d":{"Pods":[],"NumPDBViolations":0}' % k for k in range(named)) + b"}}"
        assert bool(proposals.too_many_nodes(body, most)) is (named > most)
    escaped = b'{"Pod":{"a":"' + b'\\"NumPDBViolations\\":' * 10_000 + b'"}}'
    assert proposals.too_many_nodes(escaped, 100) == ""  # inside a string: not a key
