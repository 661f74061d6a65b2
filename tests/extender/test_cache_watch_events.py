"""Watch events that bring nothing new cost the cache little: a GPULedger version it
already took in is not decoded again, and a pod update that changes none of the facts it
keeps (a status update) does not wait for the cache lock."""

from __future__ import annotations

import json
import threading
from typing import Any

from lightkube.core.decoders import decode_object
from lightkube.resources.core_v1 import Node

from gpupool.contract import annotations as records
from gpupool.core.allocation import Allocation, Slice
from gpupool.extender.cache import ClusterCache
from gpupool.extender.ledger import Entry
from gpupool.kube.summaries import PodSummary

from .builders import gpu_obj, node_obj, pod_obj


def cache_with_node() -> ClusterCache:
    cache = ClusterCache()
    cache.sync_nodes([Node.from_dict(node_obj("n0"))])
    cache.sync_devices([gpu_obj("n0", j) for j in range(2)])
    return cache


def alloc(uid: str, gpu: int) -> Allocation:
    return Allocation(uid, "n0", 0, 0, (Slice(f"GPU-n0-{gpu}", gpu, 4096, 20, "c0"),))


def ledger(rv: str, *uids: str) -> dict[str, Any]:
    entries = {u: Entry(alloc(u, 0), f"default/{u}", "2099-01-01T00:00:00Z").to_json()
               for u in uids}
    return {"metadata": {"name": "n0", "resourceVersion": rv},
            "spec": {"node": "n0", "entries": entries}}


def test_a_ledger_version_already_taken_in_is_not_applied_again() -> None:
    cache = cache_with_node()
    cache.ledger_event("MODIFIED", ledger("7", "a"))
    assert set(cache.state.allocations) == {"a"}
    cache.ledger_event("MODIFIED", ledger("7", "a", "b"))  # same version: nothing new
    cache.ledger_event("MODIFIED", ledger("6", "c"))  # older: ignored
    assert set(cache.ledgers["n0"].entries) == {"a"}
    assert set(cache.state.allocations) == {"a"}
    cache.ledger_event("MODIFIED", ledger("8", "b"))
    assert set(cache.state.allocations) == {"b"}
    cache.ledger_event("DELETED", ledger("8", "b"))
    assert cache.state.allocations == {}


def summary(pod: dict[str, Any]) -> PodSummary:
    return decode_object(json.dumps(pod).encode(), PodSummary)


def bound_pod(phase: str) -> dict[str, Any]:
    pod = pod_obj("p", {"gpupool.io/gpu-memory": "4096"})
    pod["metadata"].update(uid="u1", resourceVersion="5",
                           annotations=records.encode(alloc("u1", 1), "2026-01-01T00:00:00Z"))
    pod["spec"]["nodeName"] = "n0"
    pod["status"]["phase"] = phase
    return pod


def test_a_status_update_that_changes_no_fact_does_not_wait_for_the_lock() -> None:
    cache = cache_with_node()
    cache.pod_event("MODIFIED", summary(bound_pod("Pending")))
    assert cache.state.allocations["u1"].slices[0].gpu_position == 1
    running, finished = summary(bound_pod("Running")), summary(bound_pod("Succeeded"))
    done = {name: threading.Event() for name in ("running", "finished")}

    def deliver(name: str, pod: PodSummary) -> None:
        cache.pod_event("MODIFIED", pod)
        done[name].set()

    with cache.lock:  # a decision in progress on another thread
        threading.Thread(target=deliver, args=("running", running)).start()
        threading.Thread(target=deliver, args=("finished", finished)).start()
        assert done["running"].wait(5)
        assert not done["finished"].wait(0.2)  # a fact changed: it waits for the lock
    assert done["finished"].wait(5)
    assert "u1" not in cache.state.allocations  # the finished pod released its GPU
