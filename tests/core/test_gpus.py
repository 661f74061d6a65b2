"""Choosing GPUs on a node (tightest/loosest, NUMA) and building the allocation."""

from __future__ import annotations

import pytest

from gpupool.core.fit import feasible
from gpupool.core.gpus import build_allocation, pick_gpus
from gpupool.core.request import Affinity, GpuDemand
from gpupool.core.scoring import GpuOrder
from gpupool.core.state import ClusterState

from .builders import cluster, hold, node, pod, shared, whole


def _positions(s: ClusterState, demand: GpuDemand, order: GpuOrder) -> list[int]:
    r = pod("p", demand)
    _, fit = feasible(s, r)
    assert fit is not None
    return pick_gpus(s, 0, demand, fit[0], order)


def _four_gpus_half_and_thirty_used() -> ClusterState:
    s = cluster(node("n", 4, gpu_gib=40))
    hold(s, "a", "n", (1, 0, 50), (2, 0, 30))  # free: 1000, 500, 700, 1000
    return s


@pytest.mark.parametrize(("order", "expected"), [
    (GpuOrder.TIGHTEST, [1]), (GpuOrder.LOOSEST, [0])],
    ids=["tightest takes the GPU with least room", "loosest takes the emptiest, lowest first"])
def test_one_gpu_is_chosen_by_free_share(order: GpuOrder, expected: list[int]) -> None:
    assert _positions(_four_gpus_half_and_thirty_used(), shared(1, 0, 20), order) == expected


def test_a_gpu_without_room_is_never_chosen() -> None:
    s = _four_gpus_half_and_thirty_used()
    assert _positions(s, shared(1, 0, 60), GpuOrder.TIGHTEST) == [2]


def _eight_gpus() -> ClusterState:
    s = cluster(node("n", 8))  # NUMA 0: GPUs 0-3, NUMA 1: GPUs 4-7
    hold(s, "a", "n", (0, 0, 50), (5, 0, 60))  # free: GPU0 500, GPU5 400
    return s


@pytest.mark.parametrize(("order", "expected"), [
    (GpuOrder.TIGHTEST, [5, 4]), (GpuOrder.LOOSEST, [1, 2])],
    ids=["tightest pair on one NUMA node", "loosest pair on one NUMA node"])
def test_a_multi_gpu_request_stays_on_one_numa_node(order: GpuOrder, expected: list[int]) -> None:
    s = _eight_gpus()
    chosen = _positions(s, shared(2, 0, 20), order)
    assert chosen == expected
    assert len({s.nodes[0].gpus[p].numa_node for p in chosen}) == 1


def test_a_request_larger_than_a_numa_node_takes_the_tightest_gpus() -> None:
    chosen = _positions(_eight_gpus(), shared(6, 0, 20), GpuOrder.TIGHTEST)
    assert chosen[:2] == [5, 0] and len(set(chosen)) == 6


def test_exclusive_slices_hold_the_whole_gpu() -> None:
    s = cluster(node("n", 2, gpu_gib=40))
    alloc = build_allocation(s, pod("p", whole(2, "main")), 0, [1, 0])
    assert [(x.gpu_position, x.memory_mib, x.core_pct, x.container) for x in alloc.slices] == [
        (1, 40960, 100, "main"), (0, 40960, 100, "main")]
    assert alloc.exclusive


def test_shared_memory_is_rounded_up_to_memory_units() -> None:
    s = cluster(node("n", 1), unit_mib=256)
    alloc = build_allocation(s, pod("p", shared(1, 1000, 10)), 0, [0])
    assert (alloc.slices[0].memory_mib, alloc.slices[0].core_pct) == (1024, 10)
    assert not alloc.exclusive


@pytest.mark.parametrize(("affinity", "gpus_of"), [
    (Affinity.LEAST_LOADED, {"a": [0], "b": [1, 2]}),
    (Affinity.POD, {"a": [0], "b": [0, 1]}),
], ids=["containers get GPUs of their own", "pod affinity keeps containers together"])
def test_each_container_gets_its_slices(affinity: Affinity, gpus_of: dict[str, list[int]]) -> None:
    s = cluster(node("n", 4))
    r = pod("p", shared(1, 1024, 10, "a"), shared(2, 2048, 20, "b"), affinity=affinity)
    alloc = build_allocation(s, r, 0, [0, 1, 2])
    got: dict[str, list[int]] = {}
    for x in alloc.slices:
        got.setdefault(x.container, []).append(x.gpu_position)
    assert got == gpus_of
    s.reserve(alloc)
