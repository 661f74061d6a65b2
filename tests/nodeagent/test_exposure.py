"""The GPUs a container gets cannot be widened by its own environment."""

from __future__ import annotations

import random
from typing import Any

import grpc
import pytest
from gpupool_testing.fake_apiserver import FakeApiServer

from gpupool.contract import names
from gpupool.nodeagent.exposure import (
    DEVICE_LIST_ROOT,
    Exposure,
    Strategy,
    env_override,
    unsafe_prefix,
)
from gpupool.nodeagent.pods import GpuContainer

from .builders import decision, pod, uuid_of
from .conftest import AgentFactory
from .kubelet_standin import FakeKubelet, runtime_gpus


def ready(kubelet: FakeKubelet, n: int) -> None:
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda d: len(d) == n)


def shared_pod(name: str, env: dict[str, str] | None = None,
               env_from: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    p = pod(name, [("main", 1, 1024, 5)],
            ann=decision(name, [(uuid_of(1), 1, 1024, 5, "main")]))
    c = p["spec"]["containers"][0]
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if env_from:
        c["envFrom"] = env_from
    return p


def test_volume_mounts_name_the_gpu_where_the_pod_cannot_write_it(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=2, split=2)
    ready(kubelet, 4)
    p = shared_pod("p1", env={"APP_MODE": "serve"})
    apiserver.seed("pods", p)
    got = kubelet.admit(p, random.Random(1))
    assert (f"{DEVICE_LIST_ROOT}/{uuid_of(1)}", "/dev/null") in got.mounts["main"]
    assert got.envs["main"]["NVIDIA_VISIBLE_DEVICES"] == DEVICE_LIST_ROOT
    assert runtime_gpus(got, "main") == [uuid_of(1)]


def test_cdi_devices_name_exactly_the_decided_gpus(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=2, split=2, exposure=Exposure(Strategy.CDI))
    ready(kubelet, 4)
    p = shared_pod("p1")
    apiserver.seed("pods", p)
    got = kubelet.admit(p, random.Random(1))
    assert got.cdi["main"] == [f"nvidia.com/gpu={uuid_of(1)}"]
    assert got.envs["main"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert runtime_gpus(got, "main") == [uuid_of(1)]


def test_the_envvar_strategy_is_what_a_pod_could_override(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=2, split=2, exposure=Exposure(Strategy.ENVVAR))
    ready(kubelet, 4)
    p = shared_pod("p1")
    apiserver.seed("pods", p)
    got = kubelet.admit(p, random.Random(1))
    assert runtime_gpus(got, "main", accept_envvar=True) == [uuid_of(1)]
    assert not Exposure(Strategy.ENVVAR).safe and Exposure().safe


@pytest.mark.parametrize("env, named", [
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, "NVIDIA_VISIBLE_DEVICES"),
    ({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80000M"}, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
    ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
    ({"CUDA_DEVICE_MEMORY_LIMIT_0": "80g"}, "CUDA_DEVICE_MEMORY_LIMIT_0"),
    ({"LD_PRELOAD": "/x.so"}, "LD_PRELOAD"),
    ({"LD_AUDIT": "/x.so"}, "LD_AUDIT"),
    ({"CUDA_DISABLE_CONTROL": "true"}, "CUDA_DISABLE_CONTROL"),
])
def test_a_container_that_sets_its_own_gpu_variables_is_refused_and_nothing_served(
        env: dict[str, str], named: str, kubelet: FakeKubelet, make_agent: AgentFactory,
        apiserver: FakeApiServer) -> None:
    make_agent(gpus=2, split=2)
    ready(kubelet, 4)
    p = shared_pod("p1", env=env)
    apiserver.seed("pods", p)
    with pytest.raises(grpc.RpcError) as err:
        kubelet.admit(p, random.Random(1))
    assert f"sets {named} itself" in str(err.value.details())
    ann = (apiserver.get("pods", "p1", "default") or {})["metadata"]["annotations"]
    assert ann[names.ANNOTATION_PHASE] == names.PHASE_FAILED and named in ann[
        names.ANNOTATION_REASON]
    assert "gpupool.io/devices" not in ann


def test_env_from_without_a_safe_prefix_is_refused_and_with_one_is_served(
        kubelet: FakeKubelet, make_agent: AgentFactory, apiserver: FakeApiServer) -> None:
    make_agent(gpus=2, split=2)
    ready(kubelet, 4)
    bad = shared_pod("bad", env_from=[{"configMapRef": {"name": "cfg"}}])
    apiserver.seed("pods", bad)
    with pytest.raises(grpc.RpcError) as err:
        kubelet.admit(bad, random.Random(1))
    assert "envFrom with prefix ''" in str(err.value.details())
    good = shared_pod("good", env_from=[{"configMapRef": {"name": "cfg"}, "prefix": "APP_"}])
    apiserver.seed("pods", good)
    assert runtime_gpus(kubelet.admit(good, random.Random(2)), "main") == [uuid_of(1)]


@pytest.mark.parametrize("prefix, unsafe", [
    ("", True), ("C", True), ("CUDA_", True), ("CUDA_MPS_X", True), ("NVIDIA_", True),
    ("LD_", True), ("GPU_", True), ("APP_", False), ("MY_CUDA_", False), ("X", False),
])
def test_which_env_from_prefixes_could_set_a_protected_variable(prefix: str,
                                                                unsafe: bool) -> None:
    assert unsafe_prefix(prefix) is unsafe


def test_a_container_with_harmless_variables_passes() -> None:
    assert env_override(GpuContainer("main", 1, 0, 0, ("CUDA_VISIBLE_DEVICES", "PATH"),
                                     ("APP_",))) is None


def test_a_cdi_kind_without_vendor_and_class_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="<vendor>/<class>"):
        Exposure(Strategy.CDI, "gpu")
