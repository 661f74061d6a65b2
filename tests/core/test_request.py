"""Requests validate their input; ``merged_demand`` stands for all GPU containers."""

from __future__ import annotations

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.core.request import Affinity, GpuDemand, Mode, PodRequest, merged_demand

from .builders import pod, shared, whole


@pytest.mark.parametrize(("build", "needle"), [
    (lambda: GpuDemand(0), "GPU count must be 1..64, got 0"),
    (lambda: GpuDemand(65, mode=Mode.EXCLUSIVE), "GPU count must be 1..64, got 65"),
    (lambda: GpuDemand(1, 0, 101), "gpu-core must be 0..100"),
    (lambda: GpuDemand(1, -1, 10), "gpu-memory >= 0"),
    (lambda: GpuDemand(1, 0, 0), "must ask for gpu-memory or gpu-core"),
    (lambda: PodRequest(""), "needs a key"),
    (lambda: PodRequest("p", cpu_milli=-1), "must be >= 0"),
    (lambda: PodRequest("p", memory_mib=-1), "must be >= 0"),
    (lambda: PodRequest("p", models=frozenset()), "allowed GPU models is empty"),
    (lambda: PodRequest("p", gpus=(whole(64),) * 5), "absurd number of GPUs"),
], ids=["zero GPUs", "65 GPUs", "core over 100", "negative memory", "shared asking nothing",
        "no key", "negative CPU", "negative memory", "empty model list", "320 GPUs"])
def test_a_bad_request_is_refused_with_the_reason(build: object, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        build()  # type: ignore[operator]


def test_an_exclusive_demand_ignores_memory_and_core() -> None:
    d = GpuDemand(2, -5, 500, Mode.EXCLUSIVE)
    assert d.exclusive and d.describe() == "2 whole GPUs"
    assert shared(3, 1024, 20).describe() == "3 × (1024 MiB + 20 % core)"


@pytest.mark.parametrize(("request_", "merged"), [
    (pod("p", shared(2, 1024, 30)), GpuDemand(2, 1024, 30)),
    (pod("p", shared(1, 1024, 30), shared(2, 2048, 10)), GpuDemand(3, 2048, 30)),
    (pod("p", shared(1, 1024, 30), shared(2, 2048, 10), affinity=Affinity.POD),
     GpuDemand(2, 3072, 40)),
    (pod("p", shared(1, 1024, 30), whole(1)), GpuDemand(2, mode=Mode.EXCLUSIVE)),
    (pod("p", whole(2), whole(1), affinity=Affinity.POD), GpuDemand(2, mode=Mode.EXCLUSIVE)),
], ids=["one container is its own demand", "own GPUs: counts add, the larger slice",
        "pod affinity: the larger count, slices add", "any exclusive container: exclusive",
        "exclusive with pod affinity: the larger count"])
def test_merged_demand_covers_every_container(request_: PodRequest, merged: GpuDemand) -> None:
    assert merged_demand(request_) == merged
    assert request_.gpu_count == merged.count


@pytest.mark.parametrize(("request_", "needle"), [
    (pod("p"), "asks for no GPU"),
    (pod("p", shared(1, 0, 60), shared(1, 0, 50), affinity=Affinity.POD), "together ask 110 %"),
], ids=["no GPU container", "pod affinity over 100 % of one GPU"])
def test_merged_demand_refuses_what_cannot_be_merged(request_: PodRequest, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        merged_demand(request_)


def test_a_request_without_gpus_counts_zero_and_describes_itself() -> None:
    r = pod("p", cpu=500, mem=256)
    assert r.gpu_count == 0 and r.describe() == "500m CPU, 256 MiB, no GPU"
    assert pod("p", whole(1)).shape == pod("q", whole(1)).shape
