"""Two extender replicas racing on one API server never over-commit a GPU; a restarted
replica rebuilds every allocation from pod annotations."""

from __future__ import annotations

import random
import threading
from typing import Any

from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract.annotations import decode, has_decision
from gpupool.core.errors import OverCommit
from gpupool.core.model import uniform_node
from gpupool.core.state import ClusterState

from .builders import Replica, pod_obj, schedule, seed_cluster

PODS = 1000
SHAPES: list[dict[str, str]] = [
    {"gpupool.io/gpu-memory": "10240", "gpupool.io/gpu-core": "25"},
    {"gpupool.io/gpu-memory": "20480", "gpupool.io/gpu-core": "50"},
    {"gpupool.io/gpu-memory": "4096", "gpupool.io/gpu-core": "10"},
    {"gpupool.io/gpu": "1"},
    {"gpupool.io/gpu": "2"},
]


def recorded_state(fake: FakeApiServer, nodes: list[str], gpus: int) -> ClusterState:
    """Every decision recorded on a bound pod, reserved into one fresh state: raises
    ``OverCommit`` if any GPU holds more than it has."""
    state = ClusterState([uniform_node(n, 10**9, 10**9, gpus, "A100", 40960) for n in nodes])
    for pod in fake.objects("pods"):
        notes = pod["metadata"].get("annotations") or {}
        if pod["spec"].get("nodeName") and has_decision(notes):
            state.reserve(decode(pod["metadata"]["uid"], notes).allocation)
    return state


def run_replica(replica: Replica, pods: list[dict[str, Any]], nodes: list[str],
                outcome: dict[str, str]) -> None:
    for pod in pods:
        node, error = schedule(replica.extender, pod, nodes)
        outcome[pod["metadata"]["name"]] = node or f"unschedulable: {error}"


def test_two_replicas_racing_over_1000_pods_never_over_commit_a_gpu(fake: FakeApiServer
                                                                    ) -> None:
    nodes = seed_cluster(fake, 40, 8)  # 320 GPUs: about 400 of the pods fit
    rng = random.Random(7)
    pods = [fake.seed("pods", pod_obj(f"p{k}", rng.choice(SHAPES), cpu="100m"))
            for k in range(PODS)]
    replicas = [Replica(fake, seed=1), Replica(fake, seed=2)]
    outcome: dict[str, str] = {}
    try:
        threads = [threading.Thread(target=run_replica, args=(r, pods[k::2], nodes, outcome))
                   for k, r in enumerate(replicas)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
        conflicts = sum(r.extender.metrics.conflicts._value.get() for r in replicas)
    finally:
        for r in replicas:
            r.close()
    assert len(outcome) == PODS
    state = recorded_state(fake, nodes, 8)  # raises OverCommit on any over-committed GPU
    bound = [p for p in fake.objects("pods") if p["spec"].get("nodeName")]
    assert len(bound) == len(state.allocations) > 300
    assert conflicts > 0  # the replicas did race for the same nodes
    assert state.usage().allocated_milli > 0.95 * state.usage().capacity_milli  # packed full
    assert all(v in nodes or v.startswith("unschedulable") for v in outcome.values())
    print(f"bound {len(bound)} of {PODS}, ledger conflicts retried: {conflicts:.0f}")


def test_the_over_commit_check_itself_catches_a_double_booking(fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 1, 1)
    replica = Replica(fake)
    try:
        pod = fake.seed("pods", pod_obj("a", {"gpupool.io/gpu": "1"}))
        assert schedule(replica.extender, pod, nodes)[1] == ""
    finally:
        replica.close()
    twin = fake.get("pods", "a", "default")
    twin["metadata"] = {**twin["metadata"], "name": "b", "uid": "other-uid"}
    notes = twin["metadata"]["annotations"]
    notes["gpupool.io/allocation"] = notes["gpupool.io/allocation"]
    fake.seed("pods", twin)
    try:
        recorded_state(fake, nodes, 1)
    except OverCommit:
        return
    raise AssertionError("two pods on one whole GPU were not detected")


def test_a_restarted_replica_rebuilds_every_allocation_from_annotations(
        fake: FakeApiServer) -> None:
    nodes = seed_cluster(fake, 4, 4)
    first = Replica(fake)
    rng = random.Random(3)
    try:
        for k in range(40):
            pod = fake.seed("pods", pod_obj(f"p{k}", rng.choice(SHAPES), cpu="100m"))
            schedule(first.extender, pod, nodes)
        with first.cache.lock:
            before = dict(first.cache.state.allocations)
            usage = first.cache.state.usage()
    finally:
        first.close()
    fake.delete("gpuledgers", nodes[0])  # even without a ledger, pods are the record
    second = Replica(fake)
    try:
        after = second.cache.state.allocations
        gpu_keys = {k for k, a in before.items() if a.slices}
        assert gpu_keys and {k: after[k] for k in gpu_keys} == {k: before[k] for k in gpu_keys}
        assert second.cache.state.usage() == usage
    finally:
        second.close()
