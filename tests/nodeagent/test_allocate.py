"""Allocate from the extender's decision to the container's environment (end to end)."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import annotations, names, slices
from gpupool.nodeagent.kubeview import KubePods
from gpupool.nodeagent.pods import ANNOTATION_DEVICES

from .builders import NODE, decision, pod, sign, uuid_of, wait_for
from .conftest import AgentFactory
from .kubelet_standin import FakeKubelet, runtime_gpus


def ready(kubelet: FakeKubelet, n: int) -> None:
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda d: len(d) == n)


def stored(api: FakeApiServer, name: str) -> dict[str, str]:
    obj = api.get("pods", name, "default")
    assert obj is not None
    return dict(obj["metadata"]["annotations"])


def refusal(kubelet: FakeKubelet, p: dict[str, Any]) -> str:
    with pytest.raises(grpc.RpcError) as err:
        kubelet.admit(p, random.Random(1))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return str(err.value.details())


def test_extender_decision_becomes_the_containers_gpu_slice(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    agent = make_agent(gpus=4, split=4)
    ready(kubelet, 16)
    p = pod("p1", [("main", 1, 4096, 30)],
            ann=decision("p1", [(uuid_of(2), 2, 4096, 30, "main")]))
    apiserver.seed("pods", p)
    got = kubelet.admit(p, random.Random(7))
    env = got.envs["main"]
    assert runtime_gpus(got, "main") == [uuid_of(2)]
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert (env["GPUPOOL_POD"], env["GPUPOOL_POD_UID"], env["GPUPOOL_MODE"]) == (
        "default/p1", "uid-p1", "shared")
    assert (env["GPUPOOL_GPU_MEMORY_MIB"], env["GPUPOOL_GPU_CORE_PCT"]) == ("4096", "30")
    ann = stored(apiserver, "p1")
    assert ann[names.ANNOTATION_PHASE] == names.PHASE_ALLOCATED
    served = json.loads(ann[ANNOTATION_DEVICES])
    assert served == {"main": {got.devices["main"][0]: uuid_of(2)}}
    assert agent.pool.owner(got.devices["main"][0]) == uuid_of(2)
    assert Counter(agent.pool.owners().values()) == {uuid_of(i): 4 for i in range(4)}


def test_swapped_logical_device_is_advertised_with_its_new_numa_node(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    agent = make_agent(gpus=2, split=2)
    ready(kubelet, 4)
    on_gpu0 = sorted(i for i, u in agent.pool.owners().items() if u == uuid_of(0))
    p = pod("p1", [("main", 1, 1024, 10)], ann=decision("p1", [(uuid_of(1), 1, 1024, 10, "main")]))
    apiserver.seed("pods", p)
    stub = kubelet.stub()
    from gpupool.nodeagent.proto import deviceplugin_pb2 as dp
    kubelet.pod_manager["default/p1"] = {"main": []}
    stub.Allocate(dp.AllocateRequest(container_requests=[
        dp.ContainerAllocateRequest(devices_ids=[on_gpu0[0]])]))
    moved = kubelet.wait_update(lambda d: d[on_gpu0[0]][1] == 1)
    assert sorted(n for _, n in moved.devices.values()) == [0, 0, 1, 1]


def test_exclusive_two_gpu_decision_gets_both_gpus_and_no_mps_limits(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=4, split=2)
    ready(kubelet, 8)
    p = pod("p1", [("main", 2, 0, 0)], ann=decision(
        "p1", [(uuid_of(1), 1, 16384, 100, "main"), (uuid_of(3), 3, 16384, 100, "main")],
        exclusive=True))
    apiserver.seed("pods", p)
    got = kubelet.admit(p, random.Random(3))
    env = got.envs["main"]
    assert runtime_gpus(got, "main") == [uuid_of(1), uuid_of(3)]
    assert env["GPUPOOL_MODE"] == "exclusive"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env


def test_two_containers_with_pod_affinity_share_the_decided_gpu(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=3, split=4)
    ready(kubelet, 12)
    p = pod("p1", [("a", 1, 2048, 20), ("b", 1, 1024, 10)], ann=decision(
        "p1", [(uuid_of(1), 1, 2048, 20, "a"), (uuid_of(1), 1, 1024, 10, "b")]))
    apiserver.seed("pods", p)
    got = kubelet.admit(p, random.Random(5))
    assert runtime_gpus(got, "a") == runtime_gpus(got, "b") == [uuid_of(1)]
    assert got.envs["b"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M"
    assert stored(apiserver, "p1")[names.ANNOTATION_PHASE] == names.PHASE_ALLOCATED


def holding(name: str, uuid: str, index: int, core: int) -> dict[str, Any]:
    """A running pod that already holds a slice of ``uuid``."""
    ann = decision(name, [(uuid, index, 4096, core, "main")])
    ann[names.ANNOTATION_PHASE] = names.PHASE_ALLOCATED
    ann[ANNOTATION_DEVICES] = json.dumps({"main": {"vgpu-9999": uuid}})
    return pod(name, [("main", 1, 4096, core)], ann=ann)


def test_without_a_decision_the_least_loaded_gpu_serves_and_the_choice_is_recorded(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=3, split=4, decide_unscheduled=True)
    ready(kubelet, 12)
    apiserver.seed("pods", holding("busy0", uuid_of(0), 0, 50))
    apiserver.seed("pods", holding("busy2", uuid_of(2), 2, 20))
    p = pod("p1", [("main", 1, 2048, 10)])
    apiserver.seed("pods", p)
    assert runtime_gpus(kubelet.admit(p, random.Random(2)), "main") == [uuid_of(1)]
    recorded = annotations.decode("uid-p1", stored(apiserver, "p1"))
    assert recorded.phase == names.PHASE_ALLOCATED
    assert [s.gpu_uuid for s in recorded.allocation.slices] == [uuid_of(1)]


def test_without_a_decision_pod_affinity_keeps_both_containers_on_one_gpu(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=3, split=4, decide_unscheduled=True)
    ready(kubelet, 12)
    apiserver.seed("pods", holding("busy0", uuid_of(0), 0, 50))
    p = pod("p1", [("a", 1, 1024, 10), ("b", 1, 1024, 10)],
            ann={names.ANNOTATION_AFFINITY: "pod"})
    apiserver.seed("pods", p)
    got = kubelet.admit(p, random.Random(4))
    assert runtime_gpus(got, "a") == runtime_gpus(got, "b") != [uuid_of(0)]


@pytest.mark.parametrize("case, expected", [
    ("wrong-index", "stale or inconsistent decision"),
    ("other-node", "made for node node-b"),
    ("too-many-slices", "gives container main 2 GPU(s) but kubelet allocates 1"),
    ("failed", "marked failed: extender gave up"),
    ("not-json", "is not JSON"),
])
def test_a_broken_decision_is_refused_naming_the_pod_and_the_reason(
        case: str, expected: str, kubelet: FakeKubelet, make_agent: AgentFactory,
        apiserver: FakeApiServer) -> None:
    make_agent(gpus=2, split=2)
    ready(kubelet, 4)
    slices = [(uuid_of(1), 0, 1024, 10, "main")] if case == "wrong-index" else \
        [(uuid_of(1), 1, 1024, 10, "main")] * (2 if case == "too-many-slices" else 1)
    ann = decision("p1", slices, node="node-b" if case == "other-node" else "node-a")
    if case == "other-node":
        ann[names.ANNOTATION_NODE] = "node-b"
    if case == "failed":
        ann.update(annotations.phase_patch(names.PHASE_FAILED, "extender gave up"))
    if case == "not-json":  # signed as it is: the agent must still read it safely
        ann = sign({**ann, names.ANNOTATION_ALLOCATION: "{not json"}, "p1")
    p = pod("p1", [("main", 1, 1024, 10)], ann=ann)
    apiserver.seed("pods", p)
    message = refusal(kubelet, p)
    assert "default/p1" in message and expected in message
    if case != "failed":
        after = stored(apiserver, "p1")
        assert after[names.ANNOTATION_PHASE] == names.PHASE_FAILED
        assert expected in after[names.ANNOTATION_REASON]


STUB_CLIENT = slices.client_env("stub")


def served_pod(name: str, by: str, gpu: int = 1) -> dict[str, Any]:
    """A remote-allowed pod on this node whose slice of GPU ``gpu`` (of node ``by``) a
    slice server serves: a signed version-2 decision."""
    local = annotations.decode(f"uid-{name}", decision(name, [(uuid_of(gpu), gpu, 1024, 10,
                                                                "main")]))
    served = replace(local.allocation, served_by=by)
    return pod(name, [("main", 1, 1024, 10)],
               ann=sign(annotations.encode(served, local.bind_time), name))


@pytest.mark.parametrize("by", ["gpu-node-7", NODE])
def test_a_slice_served_by_a_slice_server_gets_no_device_of_this_node(
        by: str, kubelet: FakeKubelet, make_agent: AgentFactory,
        apiserver: FakeApiServer) -> None:
    """Served by another node, or by a server beside the pod on this one: the container sees
    no GPU of this node (whatever the runtime reads) and the client's settings."""
    make_agent(gpus=2, split=2, slice_client=STUB_CLIENT)
    ready(kubelet, 4)
    p = apiserver.seed("pods", served_pod("p1", by))
    got = kubelet.admit(p, random.Random(3))
    assert runtime_gpus(got, "main", accept_envvar=True) == []
    assert got.mounts["main"] == [] and got.cdi["main"] == []
    env = got.envs["main"]
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["GPUPOOL_SLICE_ADDRESS"],
            env["GPUPOOL_SLICE_SERVED_BY"], env["GPUPOOL_ISOLATION"]) == (
        "void", "127.0.0.1:14833", by, "slice-server")
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env  # its server enforces the slice
    ann = stored(apiserver, "p1")
    assert ann[names.ANNOTATION_PHASE] == names.PHASE_ALLOCATED
    assert json.loads(ann[ANNOTATION_DEVICES]) == {"main": {got.devices["main"][0]: ""}}


def test_a_remote_slice_is_refused_by_an_agent_without_a_provider(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=2, split=2)
    ready(kubelet, 4)
    p = apiserver.seed("pods", served_pod("p1", "gpu-node-7"))
    message = refusal(kubelet, p)
    assert ("its GPUs are served by a slice server on gpu-node-7 (a remote slice) and this "
            "node agent has no data-plane provider (--remote-provider)") in message


def test_a_remote_slices_device_never_takes_a_local_slices_gpu(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    """Two GPUs with one logical device each: the remote pod holds one, a local pod decided
    onto that very device's GPU still gets that GPU (the remote pod's device moves)."""
    agent = make_agent(gpus=2, split=1, slice_client=STUB_CLIENT)
    ready(kubelet, 2)
    remote = apiserver.seed("pods", served_pod("remote", "gpu-node-7"))
    (lid,) = kubelet.admit(remote, random.Random(1)).devices["main"]
    gpu = 0 if agent.pool.owner(lid) == uuid_of(0) else 1
    p = apiserver.seed("pods", pod("p1", [("main", 1, 4096, 30)], ann=decision(
        "p1", [(uuid_of(gpu), gpu, 4096, 30, "main")])))
    got = kubelet.admit(p, random.Random(2))
    assert runtime_gpus(got, "main") == [uuid_of(gpu)]
    assert agent.pool.owner(lid) == uuid_of(1 - gpu)  # traded for the local pod's device
    assert Counter(agent.pool.owners().values()) == {uuid_of(0): 1, uuid_of(1): 1}


def test_a_decision_that_no_longer_fits_is_refused(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=2, split=4)
    ready(kubelet, 8)
    apiserver.seed("pods", holding("busy", uuid_of(0), 0, 80))
    p = pod("p1", [("main", 1, 4096, 30)], ann=decision("p1", [(uuid_of(0), 0, 4096, 30, "main")]))
    apiserver.seed("pods", p)
    message = refusal(kubelet, p)
    assert "default/p1" in message and "20 % free, 4096 MiB and 30 % asked" in message


def test_a_decision_on_an_unhealthy_gpu_is_refused(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    agent = make_agent(gpus=2, split=2)
    ready(kubelet, 4)
    agent.backend.set_health(uuid_of(1), False, "XID 48")  # type: ignore[attr-defined]
    kubelet.wait_update(lambda d: sum(h == "Unhealthy" for h, _ in d.values()) == 2)
    p = pod("p1", [("main", 1, 1024, 10)], ann=decision("p1", [(uuid_of(1), 1, 1024, 10, "main")]))
    apiserver.seed("pods", p)
    assert f"GPU {uuid_of(1)} is unhealthy" in refusal(kubelet, p)


def test_allocate_with_no_waiting_pod_says_so(kubelet: FakeKubelet,
                                              make_agent: AgentFactory) -> None:
    make_agent(gpus=1, split=2)
    ready(kubelet, 2)
    from gpupool.nodeagent.proto import deviceplugin_pb2 as dp
    with pytest.raises(grpc.RpcError) as err:
        kubelet.stub().Allocate(dp.AllocateRequest(container_requests=[
            dp.ContainerAllocateRequest(devices_ids=["vgpu-0000"])]))
    assert "no pod known to kubelet is waiting" in str(err.value.details())


def test_prestart_refuses_a_container_whose_devices_were_served_to_another_pod(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    agent = make_agent(gpus=2, split=2)
    ready(kubelet, 4)
    p = pod("p1", [("main", 1, 1024, 10)], ann=decision("p1", [(uuid_of(0), 0, 1024, 10, "main")]))
    apiserver.seed("pods", p)
    got = kubelet.admit(p, random.Random(1))
    elsewhere = {"main": {"vgpu-0003": uuid_of(1)}}
    apiserver.patch("pods", "p1", {"metadata": {"annotations": {
        ANNOTATION_DEVICES: json.dumps(elsewhere)}}}, "default")
    # the agent's watch-fed cache may lag the write (it trusts a cache that agrees)
    wait_for(lambda: [q.served() for q in agent.pods.node_pods(NODE, fresh=False)]
             == [elsewhere])
    from gpupool.nodeagent.proto import deviceplugin_pb2 as dp
    with pytest.raises(grpc.RpcError) as err:
        kubelet.stub().PreStartContainer(dp.PreStartContainerRequest(
            devices_ids=got.devices["main"]))
    assert "default/p1" in str(err.value.details())
    assert "the GPU environment is wrong" in str(err.value.details())
    assert stored(apiserver, "p1")[names.ANNOTATION_PHASE] == names.PHASE_FAILED


def test_preferred_allocation_spreads_over_gpus_and_keeps_must_include(
        kubelet: FakeKubelet, make_agent: AgentFactory) -> None:
    agent = make_agent(gpus=3, split=3)
    ready(kubelet, 9)
    from gpupool.nodeagent.proto import deviceplugin_pb2 as dp
    available = sorted(kubelet.devices())
    must = available[0]
    resp = kubelet.stub().GetPreferredAllocation(dp.PreferredAllocationRequest(
        container_requests=[dp.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=[must], allocation_size=3)]))
    ids = list(resp.container_responses[0].deviceIDs)
    assert ids[0] == must and len(ids) == 3
    assert len({agent.pool.owner(i) for i in ids}) == 3


def test_a_restarted_agent_restores_the_logical_mapping_from_the_pods(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    first = make_agent(gpus=2, split=2)
    ready(kubelet, 4)
    on_gpu0 = sorted(i for i, u in first.pool.owners().items() if u == uuid_of(0))
    p = pod("p1", [("main", 1, 1024, 10)], ann=decision("p1", [(uuid_of(1), 1, 1024, 10, "main")]))
    apiserver.seed("pods", p)
    kubelet.pod_manager["default/p1"] = {"main": []}
    from gpupool.nodeagent.proto import deviceplugin_pb2 as dp
    kubelet.stub().Allocate(dp.AllocateRequest(container_requests=[
        dp.ContainerAllocateRequest(devices_ids=[on_gpu0[0]])]))
    assert first.pool.owner(on_gpu0[0]) == uuid_of(1)
    first.stop()
    second = make_agent(gpus=2, split=2)
    assert second.pool.owner(on_gpu0[0]) == uuid_of(1)
    assert Counter(second.pool.owners().values()) == {uuid_of(0): 2, uuid_of(1): 2}


def test_a_pod_the_cache_has_not_seen_yet_is_served_from_a_fresh_list(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    agent = make_agent(gpus=2, split=2)
    ready(kubelet, 4)
    cache = agent.pods
    assert isinstance(cache, KubePods)
    informer = cache._informer
    assert informer is not None and informer.synced.is_set()
    # the watch ends but the cache stays in use: it lags, it never sees p1
    threading.Thread(target=informer.stop, daemon=True).start()
    assert informer._stopping.wait(30)
    p = pod("p1", [("main", 1, 1024, 10)], ann=decision("p1", [(uuid_of(1), 1, 1024, 10, "main")]))
    apiserver.seed("pods", p)
    assert cache.node_pods("node-a", fresh=False) == []
    assert runtime_gpus(kubelet.admit(p, random.Random(1)), "main") == [uuid_of(1)]
    assert [q.name for q in cache.node_pods("node-a", fresh=False)] == ["p1"]  # our own write


@pytest.mark.parametrize("state, fits", [("running", False), ("terminating", False),
                                         ("succeeded", True)])
def test_a_slice_is_held_until_its_pod_is_gone_or_finished(
        state: str, fits: bool, kubelet: FakeKubelet, make_agent: AgentFactory,
        apiserver: FakeApiServer) -> None:
    make_agent(gpus=1, split=4)
    ready(kubelet, 4)
    old = holding("old", uuid_of(0), 0, 80)
    if state == "terminating":
        old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if state == "succeeded":
        old["status"] = {"phase": "Succeeded"}
    apiserver.seed("pods", old)
    p = pod("p1", [("main", 1, 4096, 30)], ann=decision("p1", [(uuid_of(0), 0, 4096, 30, "main")]))
    apiserver.seed("pods", p)
    if fits:
        assert runtime_gpus(kubelet.admit(p, random.Random(1)), "main") == [uuid_of(0)]
    else:
        assert "20 % free" in refusal(kubelet, p)


def test_without_pod_resources_the_oldest_waiting_pod_is_served(
        short_dir: Path, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    kubelet = FakeKubelet(short_dir / "kubelet", serve_pod_resources=False).start()
    try:
        make_agent(gpus=2, split=2)
        ready(kubelet, 4)
        older = pod("older", [("main", 1, 1024, 10)], created="2026-01-01T00:00:01Z",
                    ann=decision("older", [(uuid_of(0), 0, 1024, 10, "main")]))
        newer = pod("newer", [("main", 1, 1024, 10)], created="2026-01-01T00:00:02Z",
                    ann=decision("newer", [(uuid_of(1), 1, 1024, 10, "main")]))
        apiserver.seed("pods", newer)
        apiserver.seed("pods", older)
        got = [kubelet.admit(p, random.Random(2)).envs["main"]["GPUPOOL_POD"]
               for p in (older, newer)]
        assert got == ["default/older", "default/newer"]
    finally:
        kubelet.stop()
