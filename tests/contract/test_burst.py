"""Burstable slices through the contract: the annotations a user writes, the decision that
records request and limit, the limits an isolation provider enforces; the core places and
charges the request only."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.contract.isolation import hami_core_limits, mps_limits
from gpupool.contract.podspec_request import pod_request
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.errors import InvalidInput
from gpupool.core.model import uniform_node
from gpupool.core.placement import Placer
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.quota import amount_of_allocation
from gpupool.core.request import GpuDemand, Mode
from gpupool.core.state import ClusterState


def pod(*containers: tuple[str, dict[str, Any]], notes: dict[str, str] | None = None
        ) -> dict[str, Any]:
    return {"metadata": {"name": "serve", "namespace": "lab", "uid": "u1",
                         "annotations": notes or {}},
            "spec": {"containers": [{"name": n, "resources": {"limits": lim}}
                                    for n, lim in containers]}}


SLICE = {names.RESOURCE_MEMORY: "4096", names.RESOURCE_CORE: "20"}
MEM, CORE = names.ANNOTATION_MEMORY_LIMIT, names.ANNOTATION_CORE_LIMIT


def test_one_number_sets_the_limit_of_every_shared_container() -> None:
    asked = pod_request(pod(("a", SLICE), ("b", SLICE), notes={MEM: "12288", CORE: "60"}))
    assert [(d.memory_mib, d.memory_limit_mib, d.core_pct, d.core_limit_pct)
            for d in asked.gpus] == [(4096, 12288, 20, 60)] * 2
    assert "up to 12288 MiB + 60 % core" in asked.describe()


def test_pairs_set_each_named_containers_limit_and_leave_the_others_at_their_request() -> None:
    asked = pod_request(pod(("a", SLICE), ("b", SLICE), notes={MEM: "b=8192"}))
    assert [(d.container, d.memory_limit_mib, d.bursts) for d in asked.gpus] == [
        ("a", 0, False), ("b", 8192, True)]


@pytest.mark.parametrize("notes, containers, message", [
    ({MEM: "2048"}, [("a", SLICE)], "limit 2048 MiB is below its request of 4096 MiB"),
    ({CORE: "10"}, [("a", SLICE)], "compute limit 10 % must be 20..100"),
    ({CORE: "150"}, [("a", SLICE)], "gpu-core-limit=150 must be 1..100"),
    ({MEM: "lots"}, [("a", SLICE)], "gpu-memory-limit"),
    ({MEM: "a=8192,a=9000"}, [("a", SLICE)], "names container a twice"),
    ({MEM: "ghost=8192"}, [("a", SLICE)], "container ghost is not a container of the pod"),
    ({MEM: "side=8192"}, [("a", SLICE), ("side", {})], "container side asks no shared GPU"),
    ({MEM: "8192"}, [("a", {names.RESOURCE_GPU: "1"})], "no container asks a shared GPU"),
    ({MEM: "=8192"}, [("a", SLICE)], "must be a number or <container>=<number> pairs"),
    ({MEM: "8192"}, [("a", {"cpu": "1"})], "asks no gpupool GPU"),
])
def test_a_limit_that_cannot_be_honoured_is_refused_naming_pod_annotation_and_container(
        notes: dict[str, str], containers: list[tuple[str, dict[str, Any]]],
        message: str) -> None:
    with pytest.raises(InvalidInput, match="pod lab/serve") as err:
        pod_request(pod(*containers, notes=notes))
    assert message in str(err.value)


def test_whole_gpus_have_no_burst() -> None:
    with pytest.raises(InvalidInput, match="whole GPUs have no burst limit"):
        GpuDemand(1, mode=Mode.EXCLUSIVE, memory_limit_mib=1024)


def placed(memory_limit: int = 0, core_limit: int = 0) -> tuple[ClusterState, Allocation]:
    state = ClusterState([uniform_node("n1", 8000, 65536, 1, "A100", 16384)])
    asked = pod_request(pod(("a", SLICE), notes={
        **({MEM: str(memory_limit)} if memory_limit else {}),
        **({CORE: str(core_limit)} if core_limit else {})}))
    found = Placer(make_policy("best-fit", PolicyConfig())).decide(state, asked,
                                                                   random.Random(0))
    assert found.allocation is not None
    state.reserve(found.allocation)
    return state, found.allocation


def test_the_core_places_and_charges_the_request_and_records_the_limit() -> None:
    state, alloc = placed(memory_limit=12288, core_limit=70)
    (s,) = alloc.slices
    assert (s.memory_mib, s.core_pct, s.memory_limit_mib, s.core_limit_pct) == (4096, 20,
                                                                                12288, 70)
    assert amount_of_allocation(alloc).memory_mib == 4096
    assert int(state.unit_free[0, 0]) * state.memory_unit_mib == 16384 - 4096
    assert int(state.core_free[0, 0]) == 80


def test_a_limit_above_the_gpu_ends_at_the_gpus_memory() -> None:
    _, alloc = placed(memory_limit=100_000)
    assert alloc.slices[0].memory_limit_mib == 16384


def test_the_decision_carries_request_and_limit_and_reads_back_equal() -> None:
    _, alloc = placed(memory_limit=12288, core_limit=70)
    notes = records.encode(alloc, "2026-01-01T00:00:00Z")
    gpu = json.loads(notes[names.ANNOTATION_ALLOCATION])["containers"][0]["gpus"][0]
    assert (gpu["memoryMiB"], gpu["memoryLimitMiB"], gpu["corePct"], gpu["coreLimitPct"]) == (
        4096, 12288, 20, 70)
    assert records.decode("u1", notes).allocation == alloc


def test_a_decision_without_limits_reads_as_limits_equal_to_requests() -> None:
    plain = Allocation("u1", "n1", 0, 0, (Slice("GPU-a", 0, 4096, 20, "a"),))
    notes = records.encode(plain, "2026-01-01T00:00:00Z")
    assert "Limit" not in notes[names.ANNOTATION_ALLOCATION]
    (s,) = records.decode("u1", notes).allocation.slices
    assert (s.memory_limit_mib, s.core_limit_pct) == (4096, 20)


@pytest.mark.parametrize("entry", [{"memoryLimitMiB": 1024}, {"coreLimitPct": 10},
                                   {"coreLimitPct": 101}, {"memoryLimitMiB": -1}])
def test_a_recorded_limit_below_the_request_or_above_a_gpu_is_refused(entry: dict[str, int]
                                                                      ) -> None:
    gpu = {"uuid": "GPU-a", "index": 0, "memoryMiB": 4096, "corePct": 20, **entry}
    body = {"v": 1, "node": "n1", "cpuMilli": 0, "memoryMiB": 0, "exclusive": False,
            "containers": [{"name": "a", "gpus": [gpu]}]}
    with pytest.raises(InvalidInput, match="pod u1"):
        records.decode("u1", {names.ANNOTATION_ALLOCATION: json.dumps(body)})


def test_isolation_providers_enforce_the_limit_not_the_request() -> None:
    burst = Slice("GPU-a", 0, 4096, 20, "a", 8192, 50)
    assert mps_limits([burst]) == {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=12288M",
                                   "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "70"}
    assert hami_core_limits([burst]) == {"CUDA_DEVICE_MEMORY_LIMIT_0": "12288m",
                                         "CUDA_DEVICE_SM_LIMIT": "70"}
