"""The three example boards, read by the FAKE GPU backend, give the core the choice their
topology calls for: the best-joined GPUs on one NUMA node, then packing."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import pytest

from gpupool.core import topology
from gpupool.core.allocation import Allocation
from gpupool.core.fit import feasible
from gpupool.core.gpus import build_allocation, pick_gpus
from gpupool.core.model import Node
from gpupool.core.request import GpuDemand, Mode, PodRequest
from gpupool.core.scoring import GpuOrder
from gpupool.core.state import ClusterState
from gpupool.nodeagent.fakegpus import FakeGpuBackend

BOARDS = Path(__file__).resolve().parents[2] / "examples" / "boards"


def state(board: str, taken: tuple[int, ...] = ()) -> ClusterState:
    gpus = tuple(g.to_core() for g in FakeGpuBackend(BOARDS / board).discover())
    s = ClusterState([Node("n", 64000, 512 * 1024, gpus, (), 2)])
    for i, p in enumerate(taken):
        s.reserve(_whole(s, f"t{i}", [p]))
    return s


def _whole(s: ClusterState, key: str, positions: list[int]) -> Allocation:
    request = PodRequest(key, 0, 0, (GpuDemand(len(positions), mode=Mode.EXCLUSIVE),))
    return build_allocation(s, request, 0, positions)


def pair(s: ClusterState) -> list[int]:
    request = PodRequest("p", 0, 0, (GpuDemand(2, mode=Mode.EXCLUSIVE),))
    _, fit = feasible(s, request)
    assert fit is not None
    return pick_gpus(s, 0, request.gpus[0], fit[0], GpuOrder.TIGHTEST)


def best(s: ClusterState, free: list[int]) -> int:
    gpus = s.nodes[0].gpus
    return max(topology.link_between(gpus[a], gpus[b]).quality
               for a, b in combinations(free, 2) if gpus[a].numa_node == gpus[b].numa_node)


@pytest.mark.parametrize(("board", "taken"), [
    ("nvswitch-8x-h100.yaml", ()), ("nvswitch-8x-h100.yaml", (0, 5, 6)),
    ("pcie-4-4-l40s.yaml", ()), ("pcie-4-4-l40s.yaml", (0, 3)),
    ("pcie-4-4-l40s.yaml", (0, 2, 4, 7)), ("mixed-dgx1-v100.yaml", ()),
    ("mixed-dgx1-v100.yaml", (0, 2)), ("mixed-dgx1-v100.yaml", (3, 7)),
])
def test_a_pair_is_the_best_joined_on_one_numa_node(board: str, taken: tuple[int, ...]
                                                     ) -> None:
    s = state(board, taken)
    a, b = pair(s)
    gpus = s.nodes[0].gpus
    assert gpus[a].numa_node == gpus[b].numa_node
    free = [p for p in range(8) if p not in taken]
    assert topology.link_between(gpus[a], gpus[b]).quality == best(s, free)
