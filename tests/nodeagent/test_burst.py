"""Bursts: granted while the GPU has room, reclaimed (most recent first) when requests need it.

The rule on a fake clock first (``BurstTracker``), then end to end: an agent on the FAKE GPU
backend, pods and Events in the FAKE API server, the over-use action reclaiming the room.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import names
from gpupool.nodeagent.actions import OveruseAction
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.burst import BurstTracker, Resource
from gpupool.nodeagent.gpu import GpuUsage
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.overuse import Observation, OveruseConfig, OveruseTracker

from .builders import (
    NODE,
    cgroup_v2,
    container_id,
    decision,
    pod,
    pod_uid,
    running,
    uuid_of,
    wait_for,
    write_cgroup,
)
from .conftest import AgentFactory
from .kubelet_standin import FakeKubelet

GPU_MIB = 16384
CONFIG = OveruseConfig(grace_s=20, compute_window_s=30, compute_tolerance_pct=0)


def slice_use(uid: str, mib: int, request: int = 4096, limit: int = 4096, sm: int | None = 0,
              core: int = 20, core_limit: int = 20) -> Observation:
    """One container's sample on GPU g0: its use, its request and its limit."""
    return Observation(uid, f"default/{uid}", "main", "g0", mib, sm, limit, core_limit,
                       False, limit - request, core_limit - core)


def gpu(*seen: Observation, other_mib: int = 0) -> list[GpuUsage]:
    return [GpuUsage("g0", sum(o.memory_mib for o in seen) + other_mib)]


def run(tracker: BurstTracker, now: float, *seen: Observation) -> Any:
    return tracker.update(now, seen, gpu(*seen), {"g0": GPU_MIB})


def test_a_burst_on_a_gpu_with_room_is_granted_and_never_reclaimed() -> None:
    tracker = BurstTracker(CONFIG)
    alone = slice_use("a", 12000, request=4096, limit=14336)
    judged, changes = run(tracker, 0, alone)
    assert [b.seen.key for b in changes.granted] == [alone.key]
    assert changes.granted[0].memory_mib == 12000 - 4096
    assert "request 4096 MiB, limit 14336 MiB" in changes.granted[0].sentence()
    assert judged == [alone] and changes.reclaimed == ()
    judged, changes = run(tracker, 10, alone)
    assert changes.granted == () and [b.since for b in changes.current] == [0]
    assert OveruseTracker(CONFIG).update(100, judged).current == ()


def test_a_burst_is_reclaimed_when_another_slices_request_needs_the_room() -> None:
    tracker = BurstTracker(CONFIG)
    burster = slice_use("a", 12000, request=4096, limit=14336)
    run(tracker, 0, burster)
    newcomer = slice_use("b", 0, request=8192, limit=8192)  # placed, not started yet
    judged, changes = run(tracker, 10, burster, newcomer)
    # 12000 + 8192 = 20192 MiB needed on a 16384 MiB GPU: 3808 MiB short
    assert [(r.burst.seen.key, r.resource, r.short) for r in changes.reclaimed] == [
        (burster.key, Resource.MEMORY, 3808)]
    assert "needs 3808 MiB of memory more" in changes.reclaimed[0].sentence()
    cut = next(o for o in judged if o.key == burster.key)
    assert (cut.memory_limit_mib, cut.burst_memory_mib) == (4096, 0)
    over = OveruseTracker(CONFIG)
    assert not over.update(10, judged).started
    assert [o.seen.key for o in over.update(30, run(tracker, 30, burster, newcomer)[0]).started
            ] == [burster.key]  # the over-use action applies after the grace
    assert run(tracker, 40, burster, newcomer)[1].reclaimed == ()  # reported once


def test_bursts_are_reclaimed_most_recent_first_and_only_as_many_as_the_room_needs() -> None:
    tracker = BurstTracker(CONFIG)
    early = slice_use("early", 5000, request=2048, limit=8192)
    late = slice_use("late", 5000, request=2048, limit=8192)
    run(tracker, 0, early)
    run(tracker, 10, early, late)
    waiting = slice_use("waiting", 0, request=8192, limit=8192)
    _, changes = run(tracker, 20, early, late, waiting)
    # 5000 + 5000 + 8192 = 18192: 1808 short; the later burst (2952 MiB above) covers it
    assert [r.burst.seen.pod_uid for r in changes.reclaimed] == ["late"]
    bigger = slice_use("waiting", 0, request=12288, limit=12288)
    _, changes = run(tracker, 30, early, late, bigger)
    assert [r.burst.seen.pod_uid for r in changes.reclaimed] == ["early"]  # late held already
    assert {k[0] for k, _ in changes.held_back} == {"early", "late"}


def test_a_reclaim_ends_when_the_gpu_has_room_again() -> None:
    tracker = BurstTracker(CONFIG)
    burster = slice_use("a", 12000, request=4096, limit=14336)
    run(tracker, 0, burster)
    assert run(tracker, 10, burster, slice_use("b", 0, request=8192))[1].held_back
    judged, changes = run(tracker, 20, burster)  # the other pod is gone
    assert changes.held_back == frozenset() and judged == [burster]


def test_memory_no_container_accounts_for_counts_against_the_room() -> None:
    tracker = BurstTracker(CONFIG)
    burster = slice_use("a", 12000, request=4096, limit=14336)
    _, changes = tracker.update(0, [burster], gpu(burster, other_mib=5000), {"g0": GPU_MIB})
    assert [r.short for r in changes.reclaimed] == [12000 + 5000 - GPU_MIB]


def test_compute_counts_only_the_slices_that_are_busy() -> None:
    tracker = BurstTracker(CONFIG)
    burster = slice_use("a", 1000, sm=90, core=20, core_limit=100)
    idle = slice_use("b", 1000, sm=0, core=50, core_limit=50)
    _, changes = run(tracker, 0, burster, idle)
    assert changes.granted and changes.reclaimed == ()
    busy = slice_use("b", 1000, sm=30, core=50, core_limit=50)
    judged, changes = run(tracker, 10, burster, busy)  # 90 + 50 = 140 %: 40 short
    assert [(r.resource, r.short) for r in changes.reclaimed] == [(Resource.COMPUTE, 40)]
    cut = next(o for o in judged if o.pod_uid == "a")
    assert (cut.core_limit_pct, cut.memory_limit_mib) == (20, 4096)


def test_a_gpu_of_unknown_memory_or_a_failed_sample_is_never_short() -> None:
    tracker = BurstTracker(CONFIG)
    burster = slice_use("a", 12000, request=4096, limit=14336)
    waiting = slice_use("b", 0, request=8192)
    assert tracker.update(0, [burster, waiting], gpu(burster), {})[1].reclaimed == ()
    failed = [GpuUsage("g0", error="lost")]
    assert tracker.update(10, [burster, waiting], failed, {"g0": GPU_MIB})[1].reclaimed == ()


def test_a_slice_without_a_burst_limit_is_never_a_burst() -> None:
    tracker = BurstTracker(CONFIG)
    plain = slice_use("a", 9000, request=4096, limit=4096)
    assert run(tracker, 0, plain)[1].current == ()


# -- end to end --------------------------------------------------------------------------------
PERIOD_S, GRACE_S = 0.1, 0.3


def serve(kubelet: FakeKubelet, apiserver: FakeApiServer, agent: NodeAgent, n: int,
          mib: int, burst_mib: int = 0) -> dict[str, Any]:
    """Pod p<n> running with a slice of GPU 0 (``mib`` asked, ``burst_mib`` above it)."""
    name, uid = f"p{n}", pod_uid(n)
    slices = [(uuid_of(0), 0, mib, 20, "main")]
    ann = decision(name, slices, uid=uid, bursts=[(burst_mib, 0)] if burst_mib else None)
    obj = pod(name, [("main", 1, mib, 20)], uid=uid, ann=ann)
    if burst_mib:
        obj["metadata"]["annotations"][names.ANNOTATION_MEMORY_LIMIT] = str(mib + burst_mib)
    p = running(obj, {"main": container_id(n)})
    apiserver.seed("pods", p)
    kubelet.admit(p, random.Random(n))
    wait_for(lambda: any(q.uid == uid and q.container_ids
                         for q in agent.pods.node_pods(NODE, False)))
    return p


def events(api: FakeApiServer, reason: str, name: str) -> list[str]:
    return [e["message"] for e in api.objects("events")
            if e["reason"] == reason and e["involvedObject"]["name"] == name]


def value(metrics: NodeMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def agent(make_agent: AgentFactory, short_dir: Path, kubelet: FakeKubelet) -> NodeAgent:
    made = make_agent(gpus=1, split=4, memory_mib=GPU_MIB, monitor_s=PERIOD_S,
                      proc_root=short_dir / "proc", action=OveruseAction.EVICT,
                      overuse=OveruseConfig(grace_s=GRACE_S, compute_window_s=1.0),
                      metrics=NodeMetrics())
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda d: len(d) == 4)
    return made


def test_a_burst_is_granted_on_an_idle_gpu_then_reclaimed_by_eviction_for_a_new_request(
        kubelet: FakeKubelet, agent: NodeAgent, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    serve(kubelet, apiserver, agent, 1, 4096, burst_mib=10240)
    write_cgroup(short_dir / "proc", 101, cgroup_v2(pod_uid(1), container_id(1)))
    agent.backend.set_processes(uuid_of(0), [(101, 12000, 10)])  # type: ignore[attr-defined]
    wait_for(lambda: events(apiserver, "GpupoolBurst", "p1"))
    assert "uses 12000 MiB of GPU memory (request 4096 MiB, limit 14336 MiB)" in events(
        apiserver, "GpupoolBurst", "p1")[0]
    labels = {"namespace": "default", "pod": "p1", "container": "main", "gpu": uuid_of(0)}
    m = agent.metrics
    assert m is not None
    wait_for(lambda: value(m, "gpupool_node_container_burst_memory_mib", **labels) == 12000 - 4096)
    assert value(m, "gpupool_node_bursts_total") == 1
    assert value(m, "gpupool_node_container_memory_limit_mib", **labels) == 14336
    assert not events(apiserver, "GpupoolOverUse", "p1")  # within its limit: no over-use
    serve(kubelet, apiserver, agent, 2, 8192)  # its request needs what the burst holds
    wait_for(lambda: events(apiserver, "GpupoolBurstReclaimed", "p1"))
    assert "needs 3808 MiB of memory more" in events(apiserver, "GpupoolBurstReclaimed", "p1")[0]
    assert "the over-use action (evict) applies after 0.3 s" in events(
        apiserver, "GpupoolBurstReclaimed", "p1")[0]
    assert value(m, "gpupool_node_burst_reclaims_total", resource="memory") == 1
    wait_for(lambda: apiserver.get("pods", "p1", "default") is None)  # the room is reclaimed
    assert "12000 MiB of GPU memory (slice 4096 MiB)" in events(apiserver, "GpupoolOverUse",
                                                                "p1")[0]
    assert apiserver.get("pods", "p2", "default") is not None
