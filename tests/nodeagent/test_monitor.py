"""Usage monitoring: process -> cgroup -> pod and container, over-users, and what is done."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.nodeagent import cgroups
from gpupool.nodeagent.actions import ANNOTATION_OVER_USE, OveruseAction
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.inventory import device_name
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

PERIOD_S, GRACE_S = 0.1, 0.3
UID, CID, PID = pod_uid(1), container_id(1), 4242


# -- process -> pod --------------------------------------------------------------------------
@pytest.mark.parametrize("text, owner", [
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0c5d7a7e_1d1b_4c3e_"
     "9a8f_5b9d2a6f7e01.slice/cri-containerd-" + "a" * 64 + ".scope\n",
     ("0c5d7a7e-1d1b-4c3e-9a8f-5b9d2a6f7e01", "a" * 64)),
    ("12:memory:/kubepods/besteffort/pod0c5d7a7e-1d1b-4c3e-9a8f-5b9d2a6f7e01/" + "b" * 64
     + "\n11:cpu:/kubepods/besteffort/pod0c5d7a7e-1d1b-4c3e-9a8f-5b9d2a6f7e01/" + "b" * 64,
     ("0c5d7a7e-1d1b-4c3e-9a8f-5b9d2a6f7e01", "b" * 64)),
    ("0::/kubepods.slice/kubepods-pod0c5d7a7e_1d1b_4c3e_9a8f_5b9d2a6f7e01.slice/crio-"
     + "c" * 64 + ".scope", ("0c5d7a7e-1d1b-4c3e-9a8f-5b9d2a6f7e01", "c" * 64)),
    ("0::/../../kubepods-besteffort-pod0c5d7a7e_1d1b_4c3e_9a8f_5b9d2a6f7e01.slice/docker-"
     + "d" * 64 + ".scope", ("0c5d7a7e-1d1b-4c3e-9a8f-5b9d2a6f7e01", "d" * 64)),
    ("0::/system.slice/containerd.service\n", None),
    ("0::/user.slice/user-1000.slice/session-3.scope", None),
    ("garbage without colons", None),
    ("", None),
])
def test_a_processs_cgroup_names_its_pod_and_container_in_every_runtime_form(
        text: str, owner: tuple[str, str] | None) -> None:
    found = cgroups.parse(text)
    assert (found.pod_uid, found.container_id) == owner if owner else found is None


def test_a_process_whose_cgroup_cannot_be_read_says_why(tmp_path: Path) -> None:
    with pytest.raises(cgroups.CgroupUnreadable, match="process 7 is gone"):
        cgroups.owner(tmp_path, 7)
    (tmp_path / "8" / "cgroup").mkdir(parents=True)
    with pytest.raises(cgroups.CgroupUnreadable, match="cannot read"):
        cgroups.owner(tmp_path, 8)
    write_cgroup(tmp_path, 9, "0::/system.slice/sshd.service\n")
    with pytest.raises(cgroups.CgroupUnreadable, match="not in a pod's container"):
        cgroups.owner(tmp_path, 9)


# -- the tracker ------------------------------------------------------------------------------
def seen(mib: int, sm: int | None = 10, limit: int = 4096, pct: int = 30,
         gpu: str = "g0") -> Observation:
    return Observation("u1", "default/p1", "main", gpu, mib, sm, limit, pct)


def test_an_over_user_is_flagged_at_the_first_sample_after_the_grace_and_cleared_after() -> None:
    tracker = OveruseTracker(OveruseConfig(grace_s=30, compute_window_s=60))
    assert not tracker.update(0, [seen(9000)]).started
    assert not tracker.update(20, [seen(9000)]).started
    changes = tracker.update(30, [seen(9000)])  # period 10 s + grace 30 s after injection at 0
    assert [o.seen.memory_mib for o in changes.started] == [9000]
    assert "9000 MiB of GPU memory (slice 4096 MiB)" in changes.started[0].sentence()
    assert not tracker.update(40, [seen(9000)]).started and tracker.update(40, [seen(9000)]).current
    assert [o.seen.key for o in tracker.update(50, [seen(1000)]).ended] == [("u1", "main", "g0")]


def test_a_container_within_its_slice_is_never_flagged() -> None:
    tracker = OveruseTracker(OveruseConfig(grace_s=0, compute_window_s=60))
    for t in range(0, 100, 10):
        assert tracker.update(t, [seen(4096, sm=40)]) .current == ()  # 40 <= 30 + 10 tolerated


def test_compute_over_its_share_over_the_window_is_over_use() -> None:
    tracker = OveruseTracker(OveruseConfig(grace_s=10, compute_window_s=30))
    tracker.update(0, [seen(100, sm=20)])
    tracker.update(10, [seen(100, sm=90)])
    changes = tracker.update(20, [seen(100, sm=90)])  # mean 67 % > 30 + 10, since t=10
    assert changes.started and changes.started[0].compute_pct == 67


def test_an_interrupted_over_use_starts_its_grace_again() -> None:
    tracker = OveruseTracker(OveruseConfig(grace_s=20))
    tracker.update(0, [seen(9000)])
    tracker.update(10, [seen(100)])
    assert not tracker.update(20, [seen(9000)]).started
    assert tracker.update(40, [seen(9000)]).started


def test_a_gpu_whose_sample_failed_keeps_its_over_users() -> None:
    tracker = OveruseTracker(OveruseConfig(grace_s=0))
    assert tracker.update(0, [seen(9000)]).started
    changes = tracker.update(10, [], skipped=frozenset({"g0"}))
    assert not changes.ended and changes.current
    assert tracker.update(20, []).ended


def test_a_whole_gpu_cannot_be_exceeded() -> None:
    tracker = OveruseTracker(OveruseConfig(grace_s=0))
    whole = Observation("u1", "default/p1", "main", "g0", 99999, 100, 16384, 100, True)
    assert tracker.update(0, [whole]).current == ()


# -- end to end ---------------------------------------------------------------------------------
def ready(kubelet: FakeKubelet, n: int) -> None:
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda d: len(d) == n)


def served(kubelet: FakeKubelet, apiserver: FakeApiServer, agent: NodeAgent, name: str = "p1",
           uid: str = UID, cid: str = CID, mib: int = 4096, pct: int = 30) -> dict[str, Any]:
    """A running pod served a slice of GPU 0, its container's cgroup known."""
    p = running(pod(name, [("main", 1, mib, pct)], uid=uid,
                    ann=decision(name, [(uuid_of(0), 0, mib, pct, "main")], uid=uid)),
                {"main": cid})
    apiserver.seed("pods", p)
    kubelet.admit(p, random.Random(1))
    wait_for(lambda: any(q.uid == uid and q.container_ids
                         for q in agent.pods.node_pods(NODE, False)))
    return p


def events(api: FakeApiServer, reason: str, name: str = "p1") -> list[str]:
    return [e["message"] for e in api.objects("events")
            if e["reason"] == reason and e["involvedObject"]["name"] == name]


def over_use(api: FakeApiServer, name: str = "p1") -> dict[str, Any] | None:
    obj = api.get("pods", name, "default")
    raw = (obj or {}).get("metadata", {}).get("annotations", {}).get(ANNOTATION_OVER_USE)
    return json.loads(raw) if raw else None


def gauge(metrics: NodeMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


@pytest.fixture
def watched(make_agent: AgentFactory, short_dir: Path) -> Any:
    def make(action: OveruseAction = OveruseAction.WARN, inventory: bool = False) -> NodeAgent:
        return make_agent(gpus=1, split=4, monitor_s=PERIOD_S, inventory=inventory,
                          heartbeat_s=0.2, proc_root=short_dir / "proc", action=action,
                          overuse=OveruseConfig(grace_s=GRACE_S, compute_window_s=1.0),
                          metrics=NodeMetrics())
    return make


def test_injected_over_use_reaches_event_annotation_metric_and_isolation_then_clears(
        kubelet: FakeKubelet, watched: Any, apiserver: FakeApiServer, short_dir: Path) -> None:
    agent = watched(OveruseAction.ISOLATE, inventory=True)
    ready(kubelet, 4)
    served(kubelet, apiserver, agent)
    write_cgroup(short_dir / "proc", PID, cgroup_v2(UID, CID))
    backend: FakeGpuBackend = agent.backend  # type: ignore[assignment]
    start = time.monotonic()
    backend.set_processes(uuid_of(0), [(PID, 9000, 10)])
    wait_for(lambda: events(apiserver, "GpupoolOverUse"))
    # never before the grace; how soon after it is the tracker's rule, checked on a fake clock
    # above (a loaded machine delays the agent's threads and the API, not the rule)
    assert time.monotonic() - start >= GRACE_S
    assert "uses 9000 MiB of GPU memory (slice 4096 MiB)" in events(apiserver,
                                                                   "GpupoolOverUse")[0]
    wait_for(lambda: over_use(apiserver) is not None)
    assert over_use(apiserver)["main"]["memoryMiB"] == 9000  # type: ignore[index]
    labels = {"namespace": "default", "pod": "p1", "container": "main", "gpu": uuid_of(0)}
    wait_for(lambda: gauge(agent.metrics, "gpupool_node_container_over_use", **labels) == 1)
    name = device_name(uuid_of(0))
    wait_for(lambda: (apiserver.get("gpudevices", name) or {}).get("status", {}).get(
        "isolation", {}).get("state") == "Isolated")
    assert (apiserver.get("gpudevices", name) or {})["status"]["isolation"]["pods"] == [
        "default/p1"]
    backend.set_processes(uuid_of(0), [(PID, 1000, 10)])
    wait_for(lambda: events(apiserver, "GpupoolOverUseEnded") and over_use(apiserver) is None)
    wait_for(lambda: (apiserver.get("gpudevices", name) or {})["status"]["isolation"][
        "state"] == "None")
    assert gauge(agent.metrics, "gpupool_node_container_over_use", **labels) == 0


def test_a_container_within_its_slice_gets_no_action(
        kubelet: FakeKubelet, watched: Any, apiserver: FakeApiServer, short_dir: Path) -> None:
    agent = watched(OveruseAction.EVICT)
    ready(kubelet, 4)
    served(kubelet, apiserver, agent)
    write_cgroup(short_dir / "proc", PID, cgroup_v2(UID, CID))
    agent.backend.set_processes(uuid_of(0), [(PID, 4000, 25)])  # type: ignore[attr-defined]
    labels = {"namespace": "default", "pod": "p1", "container": "main", "gpu": uuid_of(0)}
    wait_for(lambda: gauge(agent.metrics, "gpupool_node_container_memory_used_mib",
                           **labels) == 4000)
    time.sleep(PERIOD_S * 2 + GRACE_S)
    assert not events(apiserver, "GpupoolOverUse") and over_use(apiserver) is None
    assert apiserver.get("pods", "p1", "default") is not None
    assert gauge(agent.metrics, "gpupool_node_container_memory_limit_mib", **labels) == 4096


def test_evict_goes_through_the_eviction_api_and_waits_for_a_disruption_budget(
        kubelet: FakeKubelet, watched: Any, apiserver: FakeApiServer, short_dir: Path) -> None:
    agent = watched(OveruseAction.EVICT)
    ready(kubelet, 4)
    served(kubelet, apiserver, agent)
    write_cgroup(short_dir / "proc", PID, cgroup_v2(UID, CID))
    apiserver.fail_next("POST", "eviction", 429, "Cannot evict pod as it would violate the "
                                                 "pod's disruption budget.")
    agent.backend.set_processes(uuid_of(0), [(PID, 9000, 10)])  # type: ignore[attr-defined]
    wait_for(lambda: events(apiserver, "GpupoolEvictionBlocked"))
    assert "disruption budget" in events(apiserver, "GpupoolEvictionBlocked")[0]
    wait_for(lambda: apiserver.get("pods", "p1", "default") is None)  # evicted next time


def test_a_process_in_a_pod_without_a_slice_of_the_gpu_is_an_over_user(
        kubelet: FakeKubelet, watched: Any, apiserver: FakeApiServer, short_dir: Path) -> None:
    agent = watched()
    ready(kubelet, 4)
    sneaky = running(pod("sneaky", [], uid=pod_uid(2)), {"main": container_id(2)})
    sneaky["spec"]["containers"] = [{"name": "main", "image": "cuda"}]
    apiserver.seed("pods", sneaky)
    wait_for(lambda: any(q.name == "sneaky" for q in agent.pods.node_pods(NODE, False)))
    write_cgroup(short_dir / "proc", 77, cgroup_v2(pod_uid(2), container_id(2)))
    agent.backend.set_processes(uuid_of(0), [(77, 500, 50)])  # type: ignore[attr-defined]
    wait_for(lambda: events(apiserver, "GpupoolOverUse", "sneaky"))
    assert "500 MiB of GPU memory (slice 0 MiB)" in events(apiserver, "GpupoolOverUse",
                                                           "sneaky")[0]


def test_nvml_errors_and_unreadable_processes_skip_the_sample_and_never_crash(
        kubelet: FakeKubelet, watched: Any, apiserver: FakeApiServer, short_dir: Path) -> None:
    agent = watched()
    ready(kubelet, 4)
    served(kubelet, apiserver, agent)
    backend: FakeGpuBackend = agent.backend  # type: ignore[assignment]
    write_cgroup(short_dir / "proc", 9, "0::/system.slice/nvidia-persistenced.service\n")
    (short_dir / "proc" / "10" / "cgroup").mkdir(parents=True)
    backend.set_processes(uuid_of(0), [(8, 9000, 90), (9, 100, 1), (10, 100, 1)])
    skipped = "gpupool_node_monitor_skipped_total"
    for reason in ("process-gone", "not-in-a-pod", "cgroup-unreadable"):
        wait_for(lambda r=reason: (gauge(agent.metrics, skipped, reason=r) or 0) >= 1)
    backend.set_usage_error(uuid_of(0), "GPU is lost")
    wait_for(lambda: (gauge(agent.metrics, skipped, reason="gpu-sample-failed") or 0) >= 2)
    time.sleep(GRACE_S + PERIOD_S)
    assert not events(apiserver, "GpupoolOverUse")  # nothing was attributed to p1
    assert agent.workers.alive("usage-monitor")  # the monitor thread is still sampling
