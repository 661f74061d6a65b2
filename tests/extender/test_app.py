"""The extender app in-process (starlette TestClient) on a replica fed by the fake API server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer
from starlette.testclient import TestClient
from waiting import wait_for

from gpupool.core.allocation import Allocation, Slice
from gpupool.extender.edge.app import build_app

from .builders import Replica, node_obj, pod_obj, signed


@pytest.fixture
def client(replica: Replica) -> Iterator[TestClient]:
    with TestClient(build_app(replica.extender)) as c:
        yield c


def shared(fake: FakeApiServer, name: str, memory: str = "8192", core: str = "20"
           ) -> dict[str, Any]:
    return fake.seed("pods", pod_obj(name, {"gpupool.io/gpu-memory": memory,
                                            "gpupool.io/gpu-core": core}))


def test_filter_with_node_names_answers_only_names_it_was_sent(
        client: TestClient, fake: FakeApiServer, nodes: list[str]) -> None:
    pod = shared(fake, "a")
    sent = [nodes[2], nodes[0], "not-a-gpu-node"]
    answer = client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": sent}).json()
    assert answer["Error"] == ""
    assert answer["NodeNames"] == [nodes[2], nodes[0]]
    assert answer["Nodes"] is None
    assert "no GPUDevice" in answer["FailedAndUnresolvableNodes"]["not-a-gpu-node"]


def test_filter_with_a_node_list_answers_a_node_list(client: TestClient, fake: FakeApiServer,
                                                     nodes: list[str]) -> None:
    pod = shared(fake, "a")
    items = [node_obj(n) for n in nodes]
    answer = client.post("/filter", json={"Pod": pod, "Nodes": {"metadata": {}, "items": items},
                                          "NodeNames": None}).json()
    assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == nodes
    assert answer["Nodes"]["items"][0] == items[0]


def test_keys_are_read_case_insensitively(client: TestClient, fake: FakeApiServer,
                                          nodes: list[str]) -> None:
    pod = shared(fake, "a")
    answer = client.post("/filter", json={"pod": pod, "nodenames": nodes}).json()
    assert answer["NodeNames"] == nodes
    bind = client.post("/bind", json={"podname": "a", "podNamespace": "default",
                                      "PODUID": pod["metadata"]["uid"], "node": nodes[0]})
    assert bind.json() == {"Error": ""}
    assert fake.get("pods", "a", "default")["spec"]["nodeName"] == nodes[0]


def test_refused_nodes_get_a_reason_that_says_what_is_missing(
        client: TestClient, fake: FakeApiServer, nodes: list[str]) -> None:
    pod = shared(fake, "huge", memory="65536", core="10")
    answer = client.post("/filter", json={"Pod": pod, "NodeNames": nodes}).json()
    assert answer["NodeNames"] == []
    reasons = answer["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(nodes)
    assert reasons[nodes[1]] == \
        "gpupool: 1 GPUs with 65536 MiB needed, 0 GPUs here are that large"


def test_nodes_in_the_same_situation_give_one_reason_whatever_each_has_free(
        client: TestClient, replica: Replica, fake: FakeApiServer, nodes: list[str]) -> None:
    """kube-scheduler counts identical reasons ("0/3 nodes are available: 3 <reason>")
    and cuts its message at 1,024 bytes: a reason per node's own figures would not add up."""
    for node, used in zip(nodes, (10240, 20480, 30720), strict=True):
        for j in range(2):  # both GPUs of the node partly used, each node differently
            uid = f"busy-{node}-{j}"
            busy = pod_obj(uid, {"gpupool.io/gpu-memory": str(used)})
            busy["metadata"].update(uid=uid, annotations=signed(replica.keys, Allocation(
                uid, node, 0, 0, (Slice(f"GPU-{node}-{j}", j, used, 10, "c0"),)),
                "default", uid))
            busy["spec"]["nodeName"] = node
            fake.seed("pods", busy)
    assert wait_for(lambda: len(replica.cache.state.allocations) == 6)
    pod = shared(fake, "big", memory="35840", core="10")
    answer = client.post("/filter", json={"Pod": pod, "NodeNames": nodes}).json()
    assert answer["NodeNames"] == [] and set(answer["FailedNodes"]) == set(nodes)
    assert set(answer["FailedNodes"].values()) == {
        "gpupool: 1 GPUs with 35840 MiB + 10 percent core needed, 0 have room"}


def test_a_full_gpu_is_refused_for_now_not_forever(client: TestClient, fake: FakeApiServer,
                                                   nodes: list[str]) -> None:
    for k in range(6):  # six whole GPUs: the cluster is full
        pod = fake.seed("pods", pod_obj(f"w{k}", {"gpupool.io/gpu": "1"}))
        names = client.post("/filter", json={"Pod": pod, "NodeNames": nodes}).json()["NodeNames"]
        bind = client.post("/bind", json={"PodName": f"w{k}", "PodNamespace": "default",
                                          "PodUID": pod["metadata"]["uid"], "Node": names[0]})
        assert bind.json()["Error"] == ""
    pod = shared(fake, "late")
    answer = client.post("/filter", json={"Pod": pod, "NodeNames": nodes}).json()
    assert answer["NodeNames"] == [] and set(answer["FailedNodes"]) == set(nodes)
    assert "0 have room" in answer["FailedNodes"][nodes[0]]


@pytest.mark.parametrize("body", [
    b"this is not json", b"[1, 2, 3]", b'{"Pod": 7, "NodeNames": []}', b'{"NodeNames": ["a"]}',
    b'{"Pod": {"metadata": {"name": "x"}}, "NodeNames": "n0"}',
    b'{"Pod": {"metadata": {"name": "x"}}, "Nodes": {"items": [{"metadata": {}}]}}',
    b'{"Pod": {"metadata": {"name": "x"}, "spec": {"containers": [{"resources": {"limits": '
    b'{"gpupool.io/gpu-core": "9000"}}}]}}, "NodeNames": ["n0"]}',
    b"\xff\xfe",
])
def test_malformed_filter_bodies_get_200_with_an_error(client: TestClient, body: bytes) -> None:
    response = client.post("/filter", content=body)
    assert response.status_code == 200
    assert response.json()["Error"]
    assert response.json()["NodeNames"] is None


@pytest.mark.parametrize("body", [b"{}", b'{"PodName": "x"}', b"nope",
                                  b'{"PodName": "ghost", "Node": "n0", "PodUID": "u"}'])
def test_malformed_bind_bodies_get_200_with_an_error(client: TestClient, body: bytes) -> None:
    response = client.post("/bind", content=body)
    assert response.status_code == 200 and response.json()["Error"]


def test_malformed_prioritize_bodies_get_an_empty_list(client: TestClient) -> None:
    response = client.post("/prioritize", content=b"{]")
    assert response.status_code == 200 and response.json() == []


def test_prioritize_scores_sent_nodes_between_0_and_10(
        client: TestClient, fake: FakeApiServer, nodes: list[str]) -> None:
    first = shared(fake, "first")
    client.post("/bind", json={"PodName": "first", "PodNamespace": "default",
                               "PodUID": first["metadata"]["uid"], "Node": nodes[1]})
    pod = shared(fake, "second")
    scores = client.post("/prioritize", json={"Pod": pod, "NodeNames": nodes}).json()
    assert {h["Host"] for h in scores} <= set(nodes)
    assert all(isinstance(h["Score"], int) and 0 < h["Score"] <= 10 for h in scores)
    best = max(scores, key=lambda h: h["Score"])
    assert best["Host"] == nodes[1]  # packing: the node already in use


def test_health_readiness_and_metrics(client: TestClient, fake: FakeApiServer,
                                      nodes: list[str]) -> None:
    assert client.get("/healthz").text == "ok"
    assert client.get("/readyz").status_code == 200
    pod = shared(fake, "a")
    client.post("/filter", json={"Pod": pod, "NodeNames": nodes})
    client.post("/bind", json={"PodName": "a", "PodNamespace": "default",
                               "PodUID": pod["metadata"]["uid"], "Node": nodes[0]})
    text = client.get("/metrics").text
    assert 'gpupool_extender_request_seconds_count{verb="filter"} 1.0' in text
    assert 'gpupool_extender_decisions_total{outcome="bound",verb="bind"} 1.0' in text
    assert "gpupool_gpus_allocated 0.2" in text
