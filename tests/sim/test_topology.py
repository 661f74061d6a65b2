"""The trace's boards by GPU model, and multi-GPU placements graded by their weakest link:
links first never packs worse and never picks a weaker set than NUMA and packing alone."""

from __future__ import annotations

import random

import pytest

from gpupool.core import topology
from gpupool.core.model import uniform_node
from gpupool.core.policies import DEFAULT_POLICY
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.topology import Link, PciePath
from gpupool.core.workload import TargetWorkload
from gpupool.sim.scenario import Scenario, TracePod
from gpupool.sim.topology import board, link_run


@pytest.mark.parametrize(("model", "count", "nvlink_pairs", "weakest"), [
    ("V100M16", 8, 16, Link(pcie=PciePath.SYSTEM)),
    ("V100M32", 4, 6, Link(2, 2, PciePath.NUMA_NODE)),
    ("G2", 8, 0, Link(pcie=PciePath.SYSTEM)),
    ("T4", 4, 0, Link(pcie=PciePath.SYSTEM)),
    ("P100", 2, 0, Link(pcie=PciePath.SWITCH)),
])
def test_each_trace_model_gets_its_board(model: str, count: int, nvlink_pairs: int,
                                         weakest: Link) -> None:
    node = board(uniform_node("n", 64000, 262144, count, model, 16384))
    pairs = [(a, b) for a in range(count) for b in range(a + 1, count)]
    links = [topology.link_between(node.gpus[a], node.gpus[b]) for a, b in pairs]
    assert sum(link.nvlinks > 0 for link in links) == nvlink_pairs
    assert topology.worst_link(node.gpus, list(range(count))) == weakest


def test_a_model_without_a_board_keeps_an_unknown_topology() -> None:
    node = uniform_node("n", 64000, 262144, 1, "A10", 24576)
    assert board(node) is node


def scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    nodes = tuple(uniform_node(f"n{i}", 96000, 512 * 1024, 8, model, 16384)
                  for i, model in enumerate(["V100M16", "G2"] * 3))
    pods = []
    for i in range(60):
        count = rng.choice([1, 1, 2, 2, 4])
        demand = GpuDemand(count, mode=Mode.EXCLUSIVE) if count > 1 or rng.random() < .5 \
            else GpuDemand(1, 0, rng.choice([30, 50]), Mode.SHARED)
        pods.append(TracePod(PodRequest(f"p{i}", 1000, 1024, (demand,))))
    return Scenario("boards", nodes, tuple(pods))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_links_first_keeps_the_packing_and_joins_pairs_no_worse(seed: int) -> None:
    s = scenario(seed)
    config = PolicyConfig(workload=TargetWorkload.from_requests(s.requests))
    today, aware = (link_run(s, DEFAULT_POLICY, seed, 1.3, config, a) for a in (False, True))
    assert (aware.unallocated_gpu_pct, aware.failed_pods) == (today.unallocated_gpu_pct,
                                                              today.failed_pods)
    assert [g.gpus for g in aware.placements] == [g.gpus for g in today.placements]
    assert aware.placements and aware.mean_gbps(2) >= today.mean_gbps(2)
    assert aware.share(2, "PCIe switches") <= today.share(2, "PCIe switches")
    assert sum(g.numa_nodes for g in aware.placements) <= \
        sum(g.numa_nodes for g in today.placements)


def test_links_first_joins_pairs_better_where_the_board_allows() -> None:
    s = scenario(3)
    config = PolicyConfig(workload=TargetWorkload.from_requests(s.requests))
    today, aware = (link_run(s, DEFAULT_POLICY, 3, 1.3, config, a) for a in (False, True))
    assert aware.mean_gbps(2) > today.mean_gbps(2)
    assert aware.share(2, "PCIe switches") < today.share(2, "PCIe switches")
