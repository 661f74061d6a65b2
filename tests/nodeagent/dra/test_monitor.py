"""The usage monitor on a DRA node: grants from prepared claims, over-use injected through
the FAKE GPU backend reaching the same Events, annotation, metrics and actions as on the
device-plugin path (tests/nodeagent/test_monitor.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import dra
from gpupool.kube.api import KubeApi
from gpupool.nodeagent.actions import ANNOTATION_OVER_USE, OveruseAction
from gpupool.nodeagent.dra.checkpoint import PreparedClaim, PreparedDevice
from gpupool.nodeagent.dra.plugin import DraAgent
from gpupool.nodeagent.dra.pods import ClaimPods
from gpupool.nodeagent.dra.usage import claim_grants
from gpupool.nodeagent.dra.users import claim_uses
from gpupool.nodeagent.dra.watch import DraGuards
from gpupool.nodeagent.envs import ContainerEdits
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.inventory import device_name
from gpupool.nodeagent.kubeview import KubeEvents, KubeEvictions
from gpupool.nodeagent.metrics import NodeMetrics
from gpupool.nodeagent.monitor import MonitorConfig
from gpupool.nodeagent.overuse import OveruseConfig
from gpupool.nodeagent.pods import pod_from_json

from ..builders import NODE, cgroup_v2, container_id, pod_uid, running, uuid_of, wait_for
from ..builders import write_cgroup as cgroup
from .builders import NAMESPACE, allocated_claim, claim_pod, ref
from .conftest import DraFactory
from .kubelet_dra import FakeDraKubelet

PERIOD_S, GRACE_S = 0.1, 0.3


# -- pure: which containers use which claim, and what they were granted ----------------------
def two_container_pod() -> dict[str, Any]:
    p = claim_pod("p", "unused")
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"},
                                   {"name": "other", "resourceClaimName": "c2"}]
    p["spec"]["containers"] = [
        {"name": "a", "resources": {"claims": [{"name": "gpu"}]}},
        {"name": "b", "resources": {"claims": [{"name": "gpu"}, {"name": "other"}]}},
        {"name": "plain"}]
    p["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]}
    return p


def test_claim_uses_names_the_generated_and_direct_claims_of_each_container() -> None:
    assert claim_uses(two_container_pod()) == {"a": frozenset({"p-gpu-x"}),
                                               "b": frozenset({"p-gpu-x", "c2"})}
    templated = two_container_pod()
    del templated["status"]
    assert claim_uses(templated) == {"b": frozenset({"c2"})}  # generated name not known yet
    extended = two_container_pod()
    extended["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "p-extended-resources-x", "requestMappings": [
            {"containerName": "plain", "resourceName": "gpupool.io/gpu",
             "requestName": "container-2-request-0"}]}
    assert claim_uses(extended)["plain"] == frozenset({"p-extended-resources-x"})


def prepared(name: str, *devices: tuple[int, int, int, bool]) -> PreparedClaim:
    return PreparedClaim(f"uid-{name}", NAMESPACE, name, tuple(
        PreparedDevice("gpu", NODE, f"gpu-{i}", uuid_of(i), mib, pct, whole, ())
        for i, mib, pct, whole in devices), ContainerEdits({}, ()))


def test_containers_sharing_claims_on_a_gpu_are_granted_their_sum_once() -> None:
    pod = pod_from_json(two_container_pod())
    claims = [prepared("p-gpu-x", (0, 4096, 30, False)), prepared("c2", (0, 1024, 10, False),
                                                                  (1, 0, 100, True)),
              prepared("elsewhere", (0, 8192, 50, False))]
    other_ns = PreparedClaim("uid-o", "team-b", "c2", claims[1].devices, claims[1].edits)
    held, member = claim_grants([*claims, other_ns], [pod], claim_uses_of(two_container_pod()))
    g0 = held[(pod.uid, "a+b", uuid_of(0))]
    assert (g0.slice.memory_mib, g0.slice.core_pct, g0.exclusive) == (5120, 40, False)
    g1 = held[(pod.uid, "b", uuid_of(1))]
    assert g1.exclusive
    assert set(held) == {(pod.uid, "a+b", uuid_of(0)), (pod.uid, "b", uuid_of(1))}
    assert member[(pod.uid, "a", uuid_of(0))] == "a+b" == member[(pod.uid, "b", uuid_of(0))]
    assert (pod.uid, "plain", uuid_of(0)) not in member


def claim_uses_of(obj: dict[str, Any]) -> Any:
    uses = claim_uses(obj)
    return lambda _pod: uses


# -- end to end -------------------------------------------------------------------------------
@pytest.fixture
def guarded(make_dra: DraFactory, apiserver: FakeApiServer, short_dir: Path
            ) -> Iterator[Any]:
    opened: list[tuple[ClaimPods, KubeApi]] = []

    def make(action: OveruseAction = OveruseAction.WARN) -> DraAgent:
        api = KubeApi.connect(server=apiserver.url)
        pods = ClaimPods(api)
        pods.start(NODE)
        opened.append((pods, api))
        guards = DraGuards(pods, MonitorConfig(NODE, short_dir / "proc", PERIOD_S),
                           OveruseConfig(grace_s=GRACE_S, compute_window_s=1.0), action,
                           KubeEvents(api, NODE), KubeEvictions(api), NodeMetrics())
        return make_dra(gpus=1, inventory=True, guards=guards)

    yield make
    for pods, api in opened:
        pods.stop()
        api.close()


def serve(apiserver: FakeApiServer, kubelet: FakeDraKubelet, agent: DraAgent, claim: str,
          pod: dict[str, Any], mib: int = 4096) -> None:
    """The claim allocated on gpu-0 for ``pod``, prepared; the pod running on the node."""
    obj = allocated_claim(claim, ["gpu-0"], memory=f"{mib}Mi", cores="30",
                          pods=(pod["metadata"]["name"],))
    apiserver.seed("resourceclaims", obj)
    apiserver.seed("pods", pod)
    assert kubelet.prepare(ref(obj))[obj["metadata"]["uid"]].error == ""
    assert agent.watch is not None
    wait_for(lambda: any(q.uid == pod["metadata"]["uid"] and q.container_ids
                         for q in agent.watch.guards.pods.node_pods(NODE, False)))  # type: ignore


def user(name: str, n: int, containers: tuple[str, ...] = ("main",)) -> dict[str, Any]:
    p = claim_pod(name, f"{name}-claim")
    p["metadata"]["uid"] = pod_uid(n)
    p["spec"]["containers"] = [{"name": c, "image": "cuda",
                                "resources": {"claims": [{"name": "gpu"}]}} for c in containers]
    return running(p, {c: container_id(n * 10 + i) for i, c in enumerate(containers)})


def events(api: FakeApiServer, reason: str, name: str) -> list[str]:
    return [e["message"] for e in api.objects("events")
            if e["reason"] == reason and e["involvedObject"]["name"] == name]


def over_use(api: FakeApiServer, name: str) -> dict[str, Any] | None:
    raw = ((api.get("pods", name, NAMESPACE) or {}).get("metadata", {})
           .get("annotations", {}).get(ANNOTATION_OVER_USE))
    return json.loads(raw) if raw else None


def gauge(agent: DraAgent, name: str, **labels: str) -> float | None:
    assert agent.watch is not None and agent.watch.guards.metrics is not None
    return agent.watch.guards.metrics.registry.get_sample_value(name, labels)


def isolation(api: FakeApiServer) -> str:
    obj = api.get("gpudevices", device_name(uuid_of(0))) or {}
    return str(obj.get("status", {}).get("isolation", {}).get("state"))


def slice_taints(api: FakeApiServer) -> list[dict[str, Any]]:
    obj = api.get("resourceslices", dra.slice_name(NODE)) or {}
    device = next(d for d in obj["spec"]["devices"] if d["name"] == "gpu-0")
    return [{k: v for k, v in t.items() if k != "timeAdded"} for t in device.get("taints", [])]


def test_injected_over_use_of_a_claim_reaches_event_annotation_metric_and_isolation(
        guarded: Any, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    agent = guarded(OveruseAction.ISOLATE)
    dra_kubelet.discover()
    serve(apiserver, dra_kubelet, agent, "p1-claim", user("p1", 1))
    cgroup(short_dir / "proc", 4242, cgroup_v2(pod_uid(1), container_id(10)))
    backend: FakeGpuBackend = agent.backend  # type: ignore[assignment]
    start = time.monotonic()
    backend.set_processes(uuid_of(0), [(4242, 9000, 10)])
    wait_for(lambda: events(apiserver, "GpupoolOverUse", "p1"))
    # never before the grace; how soon after it is the tracker's rule, checked on a fake clock
    # in tests/nodeagent/test_monitor.py (a loaded machine delays threads, not the rule)
    assert time.monotonic() - start >= GRACE_S
    assert "uses 9000 MiB of GPU memory (slice 4096 MiB)" in events(
        apiserver, "GpupoolOverUse", "p1")[0]
    wait_for(lambda: over_use(apiserver, "p1") is not None)
    assert over_use(apiserver, "p1")["main"]["memoryLimitMiB"] == 4096  # type: ignore[index]
    labels = {"namespace": NAMESPACE, "pod": "p1", "container": "main", "gpu": uuid_of(0)}
    wait_for(lambda: gauge(agent, "gpupool_node_container_over_use", **labels) == 1)
    wait_for(lambda: gauge(agent, "gpupool_node_gpu_isolated", gpu=uuid_of(0)) == 1)
    assert gauge(agent, "gpupool_node_gpu_memory_allocated_mib", gpu=uuid_of(0)) == 4096
    assert gauge(agent, "gpupool_node_gpu_slices", gpu=uuid_of(0)) == 1
    wait_for(lambda: isolation(apiserver) == "Isolated")
    wait_for(lambda: slice_taints(apiserver) == [
        {"key": "gpu.gpupool.io/isolated", "effect": "NoSchedule", "value": "over-use"}])
    late = allocated_claim("late", ["gpu-0"], memory="1Gi", cores="5")
    apiserver.seed("resourceclaims", late)
    assert "is isolated" in dra_kubelet.prepare(ref(late))["uid-late"].error
    backend.set_processes(uuid_of(0), [(4242, 1000, 10)])
    wait_for(lambda: events(apiserver, "GpupoolOverUseEnded", "p1")
             and over_use(apiserver, "p1") is None)
    wait_for(lambda: isolation(apiserver) == "None")
    wait_for(lambda: slice_taints(apiserver) == [])
    assert dra_kubelet.prepare(ref(late))["uid-late"].error == ""
    wait_for(lambda: gauge(agent, "gpupool_node_container_over_use", **labels) == 0)


def test_two_containers_sharing_a_claim_share_its_slice(
        guarded: Any, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    agent = guarded()
    dra_kubelet.discover()
    serve(apiserver, dra_kubelet, agent, "p2-claim", user("p2", 2, ("a", "b")))
    cgroup(short_dir / "proc", 21, cgroup_v2(pod_uid(2), container_id(20)))
    cgroup(short_dir / "proc", 22, cgroup_v2(pod_uid(2), container_id(21)))
    agent.backend.set_processes(uuid_of(0), [(21, 3000, 10), (22, 3000, 10)])  # type: ignore
    wait_for(lambda: events(apiserver, "GpupoolOverUse", "p2"))
    message = events(apiserver, "GpupoolOverUse", "p2")[0]
    assert "container a+b uses 6000 MiB of GPU memory (slice 4096 MiB)" in message


def test_a_claim_used_within_its_slice_gets_no_action(
        guarded: Any, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    agent = guarded(OveruseAction.EVICT)
    dra_kubelet.discover()
    serve(apiserver, dra_kubelet, agent, "p3-claim", user("p3", 3))
    cgroup(short_dir / "proc", 31, cgroup_v2(pod_uid(3), container_id(30)))
    agent.backend.set_processes(uuid_of(0), [(31, 4000, 25)])  # type: ignore[attr-defined]
    labels = {"namespace": NAMESPACE, "pod": "p3", "container": "main", "gpu": uuid_of(0)}
    wait_for(lambda: gauge(agent, "gpupool_node_container_memory_used_mib", **labels) == 4000)
    time.sleep(PERIOD_S * 2 + GRACE_S)
    assert not events(apiserver, "GpupoolOverUse", "p3")
    assert apiserver.get("pods", "p3", NAMESPACE) is not None
    assert gauge(agent, "gpupool_node_container_memory_limit_mib", **labels) == 4096


def test_evict_goes_through_the_eviction_api_on_a_dra_node(
        guarded: Any, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    agent = guarded(OveruseAction.EVICT)
    dra_kubelet.discover()
    serve(apiserver, dra_kubelet, agent, "p4-claim", user("p4", 4))
    cgroup(short_dir / "proc", 41, cgroup_v2(pod_uid(4), container_id(40)))
    apiserver.fail_next("POST", "eviction", 429, "Cannot evict pod as it would violate the "
                                                 "pod's disruption budget.")
    agent.backend.set_processes(uuid_of(0), [(41, 9000, 10)])  # type: ignore[attr-defined]
    wait_for(lambda: events(apiserver, "GpupoolEvictionBlocked", "p4"))
    wait_for(lambda: apiserver.get("pods", "p4", NAMESPACE) is None)


def test_a_container_that_uses_no_claim_is_compared_with_zero(
        guarded: Any, dra_kubelet: FakeDraKubelet, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    agent = guarded()
    dra_kubelet.discover()
    p = user("p5", 5, ("main",))
    p["spec"]["containers"].append({"name": "side", "image": "cuda"})
    p = running(p, {"main": container_id(50), "side": container_id(51)})
    serve(apiserver, dra_kubelet, agent, "p5-claim", p)
    cgroup(short_dir / "proc", 51, cgroup_v2(pod_uid(5), container_id(51)))
    agent.backend.set_processes(uuid_of(0), [(51, 500, 5)])  # type: ignore[attr-defined]
    wait_for(lambda: events(apiserver, "GpupoolOverUse", "p5"))
    assert "container side uses 500 MiB of GPU memory (slice 0 MiB)" in events(
        apiserver, "GpupoolOverUse", "p5")[0]
