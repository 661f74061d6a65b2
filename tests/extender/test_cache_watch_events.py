"""Watch events cost the cache little: a GPULedger version it already took in is not
decoded again, a pod update that changes none of the facts it keeps (a status update) is
dropped, and no pod event waits for the cache lock (a decision holding it applies the
queued events at its next flush)."""

from __future__ import annotations

import json
import threading
from typing import Any

from lightkube.core.decoders import decode_object
from lightkube.resources.core_v1 import Node

from gpupool.contract import names
from gpupool.core.allocation import Allocation, Slice
from gpupool.extender.state.cache import ClusterCache
from gpupool.extender.state.ledger import Entry
from gpupool.extender.state.signatures import DecisionCheck
from gpupool.kube.summaries import PodSummary

from .builders import gpu_obj, local_keys, node_obj, pod_obj, signed

KEYS = local_keys()


def cache_with_node() -> ClusterCache:
    cache = ClusterCache(decisions=DecisionCheck(KEYS))
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
                           annotations=signed(KEYS, alloc("u1", 1), "default", "p"))
    pod["spec"]["nodeName"] = "n0"
    pod["status"]["phase"] = phase
    return pod


class LockHolder:
    """Holds the cache lock on another thread (a decision in progress) until released."""

    def __init__(self, cache: ClusterCache):
        self.held, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, args=(cache,))

    def _hold(self, cache: ClusterCache) -> None:
        with cache.lock:
            self.held.set()
            self.release.wait(30)

    def __enter__(self) -> LockHolder:
        self.thread.start()
        assert self.held.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(30)


def test_a_pod_event_never_waits_for_the_lock_and_the_next_flush_applies_it() -> None:
    cache = cache_with_node()
    cache.pod_event("MODIFIED", summary(bound_pod("Pending")))  # lock free: applied at once
    assert cache.state.allocations["u1"].slices[0].gpu_position == 1
    running, finished = summary(bound_pod("Running")), summary(bound_pod("Succeeded"))
    with LockHolder(cache):
        done = threading.Event()
        threading.Thread(target=lambda: (cache.pod_event("MODIFIED", running),
                                         cache.pod_event("MODIFIED", finished),
                                         done.set())).start()
        assert done.wait(30)  # neither event waited for the decision's lock
        assert "u1" in cache.state.allocations and len(cache.pending) == 1  # running: no news
    assert "u1" in cache.state.allocations  # queued until the state is next read
    with cache.lock:
        cache.flush()
    assert "u1" not in cache.state.allocations and not cache.pending


def test_queued_pod_events_apply_in_order_and_none_is_dropped_as_old_news() -> None:
    cache = cache_with_node()
    cache.pod_event("MODIFIED", summary(bound_pod("Pending")))
    failed = bound_pod("Pending")
    failed["metadata"]["annotations"] = signed(KEYS, alloc("u1", 1), "default", "p",
                                               phase=names.PHASE_FAILED)
    with LockHolder(cache):
        cache.pod_event("MODIFIED", summary(failed))  # queued: the decision failed
        cache.pod_event("MODIFIED", summary(bound_pod("Pending")))  # equals the cache's
        # facts, but an event is queued before it: queued too, not dropped
        assert len(cache.pending) == 2
    with cache.lock:
        cache.flush()
    assert cache.state.allocations["u1"].slices[0].gpu_position == 1  # the last word wins


def test_a_relisting_applies_the_queued_events_first() -> None:
    cache = cache_with_node()
    with LockHolder(cache):
        cache.pod_event("MODIFIED", summary(bound_pod("Pending")))  # queued
    cache.sync_pods([summary(bound_pod("Succeeded"))])  # the newer listing wins
    assert "u1" not in cache.state.allocations and not cache.pending
