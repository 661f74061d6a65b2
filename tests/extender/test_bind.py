"""Bind: decision annotations + ledger entry + Binding, rollback, and release of finished pods."""

from __future__ import annotations

import json
import time
from typing import Any

from gpupool_testing.fake_apiserver import FakeApiServer
from waiting import wait_for

from gpupool.contract.annotations import decode

from .builders import Replica, gpu_obj, pod_obj, schedule


def shared(fake: FakeApiServer, name: str, memory: str = "8192", core: str = "25"
           ) -> dict[str, Any]:
    return fake.seed("pods", pod_obj(name, {"gpupool.io/gpu-memory": memory,
                                            "gpupool.io/gpu-core": core}))


def bind_body(pod: dict[str, Any], node: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
            "Node": node}


def test_bind_records_the_decision_on_the_pod_and_in_the_ledger(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    pod = shared(fake, "a")
    node, error = schedule(replica.extender, pod, nodes)
    assert error == "" and node is not None
    stored = fake.get("pods", "a", "default")
    assert stored["spec"]["nodeName"] == node
    decision = decode(pod["metadata"]["uid"], stored["metadata"]["annotations"])
    assert decision.phase == "allocating" and decision.allocation.node == node
    (s,) = decision.allocation.slices
    assert (s.memory_mib, s.core_pct, s.container) == (8192, 25, "c0")
    entries = fake.get("gpuledgers", node)["spec"]["entries"]
    assert json.loads(entries[pod["metadata"]["uid"]]["allocation"])["node"] == node


def test_a_failed_binding_rolls_back_the_ledger_and_the_cache(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    pod = fake.seed("pods", pod_obj("whole", {"gpupool.io/gpu": "2"}))
    uid = pod["metadata"]["uid"]
    fake.fail_next("POST", "/binding", 500, "the API server is unwell")
    answer = replica.extender.bind(bind_body(pod, nodes[0]))
    assert "the API server is unwell" in answer["Error"]
    assert fake.get("pods", "whole", "default")["spec"].get("nodeName") is None
    assert uid not in fake.get("gpuledgers", nodes[0])["spec"]["entries"]
    assert wait_for(lambda: uid not in replica.cache.state.allocations)
    assert replica.cache.state.usage().allocated_milli == 0
    assert replica.extender.bind(bind_body(pod, nodes[0]))["Error"] == ""  # the retry works


def test_bind_re_checks_a_node_that_filled_up_since_filter(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    first = fake.seed("pods", pod_obj("first", {"gpupool.io/gpu": "2"}))
    second = fake.seed("pods", pod_obj("second", {"gpupool.io/gpu": "1"}))
    ext = replica.extender
    replica.cache.assumptions.expiry_s = 0  # filter answers each pod as if the other's
    # placement were unknown (another replica's bind, or assumptions off)
    for pod in (first, second):
        answer = ext.filter({"Pod": pod, "NodeNames": [nodes[0]]})
        assert answer["NodeNames"] == [nodes[0]]
    assert ext.bind(bind_body(first, nodes[0]))["Error"] == ""
    error = ext.bind(bind_body(second, nodes[0]))["Error"]
    assert f"node {nodes[0]}: 1 idle GPUs needed, 0 idle" in error
    assert fake.get("pods", "second", "default")["spec"].get("nodeName") is None


def test_gpus_of_deleted_and_finished_pods_are_released(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    a, b = shared(fake, "a"), shared(fake, "b")
    for pod in (a, b):
        assert schedule(replica.extender, pod, nodes)[1] == ""
    state = replica.cache.state
    assert wait_for(lambda: {a["metadata"]["uid"], b["metadata"]["uid"]} <= set(
        replica.cache.state.allocations))
    before = state.usage().allocated_milli
    fake.delete("pods", "a", "default")
    fake.patch_status("pods", "b", {"phase": "Succeeded"}, "default")
    assert wait_for(lambda: replica.cache.state.usage().allocated_milli == 0)
    assert before > 0


def test_a_decision_the_node_agent_failed_is_released(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    pod = shared(fake, "a")
    assert schedule(replica.extender, pod, nodes)[1] == ""
    uid = pod["metadata"]["uid"]
    assert wait_for(lambda: "pod" in replica.cache.sources.get(uid, set()))
    fake.patch("pods", "a", {"metadata": {"annotations": {"gpupool.io/phase": "failed"}}},
               "default")
    assert wait_for(lambda: "pod" not in replica.cache.sources.get(uid, set()))


def test_a_gpu_with_a_stale_heartbeat_is_not_offered(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    for j in range(2):
        fake.seed("gpudevices", gpu_obj(nodes[0], j, heartbeat="2020-01-01T00:00:00Z"))
    pod = shared(fake, "a")

    def refused() -> str:
        answer = replica.extender.filter({"Pod": pod, "NodeNames": nodes})
        return str(answer["FailedNodes"].get(nodes[0], "")) if nodes[0] not in \
            answer["NodeNames"] else ""
    assert wait_for(lambda: "0 of 2 healthy" in refused())  # both GPUs replaced by now
    assert refused() == "gpupool: 1 healthy GPUs needed, 0 of 2 healthy"


def test_a_class_request_goes_only_to_gpus_of_the_class(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    fake.seed("gpudevices", gpu_obj(nodes[2], 0, model="H100", memory_mib=81920))
    fake.seed("resourceclasses", {"metadata": {"name": "big"}, "spec": {"selector": {
        "matchExpressions": [{"key": "gpupool.io/memory", "operator": "Gt",
                              "values": ["60Gi"]}]}}})
    assert wait_for(lambda: "big" in replica.cache.catalogue.classes)
    pod = fake.seed("pods", pod_obj("c", {"class.gpupool.io/big": "1"}))
    answer = replica.extender.filter({"Pod": pod, "NodeNames": nodes})
    assert answer["NodeNames"] == [nodes[2]]
    assert "1 GPUs of class big needed, 0 here" in answer["FailedAndUnresolvableNodes"][nodes[0]]
    node, error = schedule(replica.extender, pod, nodes)
    assert error == "" and node == nodes[2]
    stored = fake.get("pods", "c", "default")["metadata"]["annotations"]
    assert '"uuid":"GPU-' + nodes[2] + '-0"' in stored["gpupool.io/allocation"]


def test_a_group_quota_stops_a_tenant(fake: FakeApiServer, replica: Replica,
                                      nodes: list[str]) -> None:
    fake.seed("resourcegroups", {"metadata": {"name": "team-a"}, "spec": {
        "nodes": [nodes[0]], "tenants": ["team-a"], "quota": {"gpus": 1}}})
    assert wait_for(lambda: "team-a" in replica.cache.catalogue.groups)
    labels = {"gpupool.io/group": "team-a"}
    first = fake.seed("pods", pod_obj("one", {"gpupool.io/gpu": "1"}, ns="team-a", labels=labels))
    assert schedule(replica.extender, first, nodes) == (nodes[0], "")
    second = fake.seed("pods", pod_obj("two", {"gpupool.io/gpu": "1"}, ns="team-a",
                                       labels=labels))
    answer = replica.extender.filter({"Pod": second, "NodeNames": nodes})
    assert answer["NodeNames"] == []
    assert "quota of group team-a exceeded" in answer["FailedNodes"][nodes[0]]


def test_preemption_keeps_only_nodes_where_the_victims_free_enough_gpu(
        fake: FakeApiServer, replica: Replica, nodes: list[str]) -> None:
    holders = {}
    for k, node in enumerate([nodes[0], nodes[0], nodes[1], nodes[1]]):
        pod = fake.seed("pods", pod_obj(f"h{k}", {"gpupool.io/gpu": "1"}))
        assert replica.extender.bind(bind_body(pod, node))["Error"] == ""
        holders[k] = pod["metadata"]["uid"]
    big = fake.seed("pods", pod_obj("big", {"gpupool.io/gpu": "2"}))
    before = dict(replica.cache.state.allocations)
    answer = replica.extender.preempt({"Pod": big, "NodeNameToMetaVictims": {
        nodes[0]: {"Pods": [{"UID": holders[0]}, {"UID": holders[1]}], "NumPDBViolations": 1},
        nodes[1]: {"Pods": [{"UID": holders[2]}], "NumPDBViolations": 0},
        "elsewhere": {"Pods": [], "NumPDBViolations": 0}}})
    assert answer == {"NodeNameToMetaVictims": {nodes[0]: {
        "Pods": [{"UID": holders[0]}, {"UID": holders[1]}], "NumPDBViolations": 1}}}
    assert replica.cache.state.allocations == before  # the check changed nothing
    assert replica.extender.preempt({"Pod": big})["NodeNameToMetaVictims"] == {}


def test_the_sweep_marks_a_gpu_unhealthy_once_its_heartbeat_is_stale(fake: FakeApiServer) -> None:
    from gpupool.extender.state.cache import ClusterCache

    from .builders import seed_cluster
    nodes = seed_cluster(fake, 1, 2)
    now = [time.time()]
    replica = Replica(fake, stale_after_s=60)
    cache = ClusterCache(stale_after_s=60, clock=lambda: now[0])
    try:
        cache.sync_nodes(replica.api.list_nodes().items)
        cache.sync_devices(replica.api.list_gpu_devices().items)
        cache.sweep()
        assert cache.state.healthy[0].all()
        now[0] += 61  # no heartbeat for 61 s
        cache.sweep()
        assert not cache.state.healthy[0].any()
        fresh = [gpu_obj(nodes[0], j, heartbeat=time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime(now[0]))) for j in range(2)]
        for obj in fresh:
            cache.device_event("MODIFIED", obj)
        cache.sweep()
        assert cache.state.healthy[0].all()
    finally:
        replica.close()
