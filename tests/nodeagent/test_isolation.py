"""Isolation providers: mps (real control protocol to a FAKE daemon), hami-core, none."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.core.allocation import Slice
from gpupool.core.errors import InvalidInput
from gpupool.nodeagent.fakegpus import FakeGpuBackend
from gpupool.nodeagent.isolation.hamicore import HamiCoreProvider
from gpupool.nodeagent.isolation.mps import MpsProvider
from gpupool.nodeagent.isolation.mpsdaemon import MpsLayout
from gpupool.nodeagent.isolation.provider import SliceGrant
from gpupool.nodeagent.proto import deviceplugin_pb2 as dp

from .builders import decision, fake_mps_control, mps_state, pod, uuid_of, wait_for
from .conftest import AgentFactory
from .kubelet_standin import FakeKubelet, runtime_gpus


def ready(kubelet: FakeKubelet, n: int) -> None:
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda d: len(d) == n)


def shared(name: str, gpu: int, mib: int, pct: int) -> dict[str, Any]:
    return pod(name, [("main", 1, mib, pct)],
               ann=decision(name, [(uuid_of(gpu), gpu, mib, pct, "main")]))


@pytest.fixture
def mps(short_dir: Path) -> Any:
    """A factory of ``mps`` providers on a FAKE ``nvidia-cuda-mps-control``."""
    control = fake_mps_control(short_dir)
    layout = MpsLayout(short_dir / "mps")
    made: list[MpsProvider] = []

    def make(backend: FakeGpuBackend, exe: str = str(control)) -> MpsProvider:
        provider = MpsProvider(layout, backend, exe, health_s=0.05, timeout_s=30)
        made.append(provider)
        return provider
    make.layout = layout  # type: ignore[attr-defined]
    yield make


# -- mps --------------------------------------------------------------------------------------
def test_mps_runs_one_control_daemon_per_gpu_seeing_only_that_gpu(
        kubelet: FakeKubelet, make_agent: AgentFactory, mps: Any) -> None:
    make_agent(gpus=2, split=2, provider_for=mps)
    ready(kubelet, 4)
    for i in range(2):
        state = mps_state(mps.layout.log(uuid_of(i)))
        assert state["visible"] == uuid_of(i)
        assert (mps.layout.pipe(uuid_of(i)) / "nvidia-cuda-mps-control.pid").exists()


def test_a_shared_slice_gets_its_gpus_daemon_and_limits_the_client_cannot_raise(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer,
        mps: Any) -> None:
    agent = make_agent(gpus=2, split=2, provider_for=mps)
    ready(kubelet, 4)
    p = shared("p1", 1, 4096, 30)
    apiserver.seed("pods", p)
    got = kubelet.admit(p, random.Random(1))
    env = got.envs["main"]
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["GPUPOOL_ISOLATION"] == "mps"
    mounts = dict(got.mounts["main"])
    assert mounts["/tmp/nvidia-mps"] == str(mps.layout.pipe(uuid_of(1)))
    assert mounts["/var/log/nvidia-mps"] == str(mps.layout.log(uuid_of(1)))
    assert got.read_only["main"]["/var/log/nvidia-mps"]
    assert mounts["/dev/shm"] == str(mps.layout.shm)
    state = mps_state(mps.layout.log(uuid_of(1)))  # in the daemon: where MPS enforces them
    assert state["defaultMemory"] == {"0": "4096M"} and state["defaultThreads"] == "30"
    assert agent.backend.compute_modes == {uuid_of(1): True}  # type: ignore[attr-defined]
    assert mps_state(mps.layout.log(uuid_of(0)))["defaultMemory"] == {}


def test_the_gpu_ceiling_is_the_largest_slice_and_follows_running_servers(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer,
        mps: Any) -> None:
    agent = make_agent(gpus=1, split=4, provider_for=mps)
    ready(kubelet, 4)
    daemon = agent.provider.daemons[uuid_of(0)]  # type: ignore[attr-defined]
    daemon.query("start_server -uid 1000")
    small, big = shared("small", 0, 2048, 20), shared("big", 0, 8192, 50)
    for p in (small, big):
        apiserver.seed("pods", p)
        kubelet.admit(p, random.Random(1))
    state = mps_state(mps.layout.log(uuid_of(0)))
    assert state["defaultMemory"] == {"0": "8192M"} and state["defaultThreads"] == "50"
    (server,) = state["servers"].values()
    assert server["memory"] == {"0": "8192M"} and server["threads"] == "50"
    apiserver.delete("pods", "big", "default")
    kubelet.forget("default/big")
    wait_for(lambda: all(q.name != "big" for q in agent.pods.node_pods("node-a", False)))
    agent.check_once()  # the big slice left: the ceiling comes down to the small one
    state = mps_state(mps.layout.log(uuid_of(0)))
    assert state["defaultMemory"] == {"0": "2048M"} and state["defaultThreads"] == "20"


def test_exclusive_pods_are_kept_off_mps(kubelet: FakeKubelet, make_agent: AgentFactory,
                                         apiserver: FakeApiServer, mps: Any) -> None:
    agent = make_agent(gpus=1, split=2, provider_for=mps)
    ready(kubelet, 2)
    p = pod("whole", [("main", 1, 0, 0)],
            ann=decision("whole", [(uuid_of(0), 0, 16384, 100, "main")], exclusive=True))
    apiserver.seed("pods", p)
    got = kubelet.admit(p, random.Random(1))
    assert not any(k.startswith("CUDA_MPS") for k in got.envs["main"])
    assert "/tmp/nvidia-mps" not in dict(got.mounts["main"])
    assert runtime_gpus(got, "main") == [uuid_of(0)]
    assert agent.backend.compute_modes == {uuid_of(0): False}  # type: ignore[attr-defined]


def test_a_shared_slice_over_two_gpus_is_refused_under_mps(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer,
        mps: Any) -> None:
    make_agent(gpus=2, split=2, provider_for=mps)
    ready(kubelet, 4)
    p = pod("two", [("main", 2, 1024, 10)], ann=decision(
        "two", [(uuid_of(0), 0, 1024, 10, "main"), (uuid_of(1), 1, 1024, 10, "main")]))
    apiserver.seed("pods", p)
    with pytest.raises(grpc.RpcError) as err:
        kubelet.admit(p, random.Random(1))
    assert "the client of one GPU's MPS daemon" in str(err.value.details())


def test_a_daemon_that_dies_is_restarted_with_its_limits(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer,
        mps: Any) -> None:
    agent = make_agent(gpus=1, split=2, provider_for=mps)
    ready(kubelet, 2)
    p = shared("p1", 0, 4096, 30)
    apiserver.seed("pods", p)
    kubelet.admit(p, random.Random(1))
    first = mps_state(mps.layout.log(uuid_of(0)))["pid"]
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: agent.provider.restarts[uuid_of(0)] >= 1  # type: ignore[attr-defined]
             and mps_state(mps.layout.log(uuid_of(0))).get("pid") != first
             and mps_state(mps.layout.log(uuid_of(0)))["defaultMemory"] == {"0": "4096M"}
             and mps_state(mps.layout.log(uuid_of(0)))["defaultThreads"] == "30")


def test_a_gpu_whose_daemon_cannot_start_is_unhealthy_and_takes_no_shared_slice(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer,
        mps: Any, short_dir: Path) -> None:
    missing = str(short_dir / "no-such-mps-control")
    agent = make_agent(gpus=1, split=2, provider_for=lambda b: mps(b, missing))
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda d: len(d) == 2 and all(h == "Unhealthy" for h, _ in d.values()))
    apiserver.seed("pods", shared("p1", 0, 1024, 10))
    kubelet.pod_manager["default/p1"] = {"main": []}  # as if kubelet still offered the device
    with pytest.raises(grpc.RpcError) as err:
        kubelet.stub().Allocate(dp.AllocateRequest(container_requests=[
            dp.ContainerAllocateRequest(devices_ids=["vgpu-0000"])]))
    assert f"GPU {uuid_of(0)} is unhealthy" in str(err.value.details())
    (gpu,) = agent.known_gpus()
    assert gpu.reason.startswith("MPS: cannot start") and "no-such-mps-control" in gpu.reason


def test_stopping_quits_every_daemon_and_gives_the_gpus_their_compute_mode_back(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer,
        mps: Any) -> None:
    agent = make_agent(gpus=1, split=2, provider_for=mps)
    ready(kubelet, 2)
    p = shared("p1", 0, 1024, 10)
    apiserver.seed("pods", p)
    kubelet.admit(p, random.Random(1))
    agent.provider.stop()
    assert mps_state(mps.layout.log(uuid_of(0)))["commands"][-1] == "quit"
    assert not (mps.layout.pipe(uuid_of(0)) / "control").exists()
    assert agent.backend.compute_modes == {uuid_of(0): False}  # type: ignore[attr-defined]


def test_a_compute_mode_the_driver_refuses_refuses_the_shared_slice(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer,
        mps: Any) -> None:
    agent = make_agent(gpus=1, split=2, provider_for=mps)
    ready(kubelet, 2)
    agent.backend.set_compute_mode_error("NVML: Insufficient Permissions")  # type: ignore
    p = shared("p1", 0, 1024, 10)
    apiserver.seed("pods", p)
    with pytest.raises(grpc.RpcError) as err:
        kubelet.admit(p, random.Random(1))
    assert "without it a container could bypass MPS" in str(err.value.details())


# -- hami-core --------------------------------------------------------------------------------
def grant(uid: str = "uid-p1", exclusive: bool = False) -> SliceGrant:
    return SliceGrant(uid, "default/p1", "main", (Slice(uuid_of(0), 0, 4096, 30, "main"),),
                      exclusive)


def test_hami_core_without_its_library_refuses_to_start_and_says_what_to_do(
        tmp_path: Path) -> None:
    provider = HamiCoreProvider(tmp_path / "libvgpu.so", tmp_path / "state")
    with pytest.raises(InvalidInput, match=r"needs HAMi-core's library at .*install HAMi-core"):
        provider.start([], lambda: None)


def test_hami_core_preloads_its_library_with_the_slices_limits(tmp_path: Path) -> None:
    lib = tmp_path / "libvgpu.so"
    lib.write_bytes(b"\x7fELF")
    provider = HamiCoreProvider(lib, tmp_path / "state")
    provider.start([], lambda: None)
    edits = provider.edits(grant())
    assert edits.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert edits.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    mounts = {m.container_path: m for m in edits.mounts}
    preload = mounts["/etc/ld.so.preload"]
    assert preload.read_only and Path(preload.host_path).read_text() == \
        "/usr/local/vgpu/libvgpu.so\n"
    assert mounts["/usr/local/vgpu/libvgpu.so"].host_path == str(lib)
    assert mounts["/usr/local/vgpu/libvgpu.so"].read_only
    cache = Path(mounts["/usr/local/vgpu/cache"].host_path)
    assert cache.is_dir() and "LD_PRELOAD" not in edits.envs
    assert provider.edits(grant(exclusive=True)).envs == {}
    provider.sync({}, {"uid-other"})
    assert not cache.exists()
    lib.unlink()
    assert "is gone" in provider.problems()["*"]


def test_hami_core_on_a_node_serves_containers_through_kubelet(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer,
        short_dir: Path) -> None:
    lib = short_dir / "libvgpu.so"
    lib.write_bytes(b"\x7fELF")
    make_agent(gpus=1, split=2, provider=HamiCoreProvider(lib, short_dir / "state"))
    ready(kubelet, 2)
    p = shared("p1", 0, 2048, 25)
    apiserver.seed("pods", p)
    got = kubelet.admit(p, random.Random(1))
    assert got.envs["main"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"
    assert got.envs["main"]["GPUPOOL_ISOLATION"] == "hami-core"
    assert got.read_only["main"]["/etc/ld.so.preload"]


# -- none ------------------------------------------------------------------------------------
def test_none_is_advisory_and_says_so(kubelet: FakeKubelet, make_agent: AgentFactory,
                                      apiserver: FakeApiServer) -> None:
    agent = make_agent(gpus=1, split=2)
    ready(kubelet, 2)
    p = shared("p1", 0, 1024, 10)
    apiserver.seed("pods", p)
    env = kubelet.admit(p, random.Random(1)).envs["main"]
    assert env["GPUPOOL_ISOLATION"] == "none" and not agent.provider.enforced
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M"  # honoured only under MPS


def test_a_gpu_failing_to_start_its_daemon_keeps_its_reason_while_a_restart_is_tried(
        tmp_path: Path) -> None:
    """Its reason does not flap to the health check's own failure while the next restart is
    tried (what Allocate's refusal and the GPU's condition say stays why)."""
    from gpupool.nodeagent.isolation.mps import MpsProvider
    from gpupool.nodeagent.isolation.mpsdaemon import MpsError

    seen: list[dict[str, str]] = []

    class Broken:
        uuid = "GPU-x"

        def problem(self) -> str:
            return "MPS control for GPU GPU-x: 'get_server_list' failed: no such file"

        def restart(self) -> None:
            seen.append(provider.problems())
            raise MpsError("cannot start nvidia-cuda-mps-control for GPU GPU-x: no such file")

    provider = MpsProvider(None, None, health_s=0.0)  # type: ignore[arg-type]
    daemon = Broken()
    provider._check(daemon)  # type: ignore[arg-type]
    provider._retry_at.clear()  # the backoff is over
    provider._check(daemon)  # type: ignore[arg-type]
    assert seen[1] == {"GPU-x": "MPS: cannot start nvidia-cuda-mps-control for GPU GPU-x: "
                                "no such file"}
    assert provider.problems()["GPU-x"].startswith("MPS: cannot start")
