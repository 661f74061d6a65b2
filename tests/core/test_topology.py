"""Multi-GPU sets chosen by link quality, then NUMA is never worse, then fragmentation."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core import topology
from gpupool.core.fit import feasible
from gpupool.core.gpus import pick_gpus
from gpupool.core.model import Gpu, Node
from gpupool.core.request import GpuDemand
from gpupool.core.scoring import GpuOrder
from gpupool.core.state import ClusterState
from gpupool.core.topology import Link, PciePath

from .builders import GIB, cluster, hold, hold_whole, node, pod, shared, whole

ACROSS_SOCKETS = Link(pcie=PciePath.SYSTEM)
NV = {1: Link(1, 2, PciePath.SYSTEM), 2: Link(2, 2, PciePath.SYSTEM)}
HYBRID_CUBE_MESH = {  # DGX-1V: NVLink 2, one or two links per pair
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2,
    (5, 7): 1, (6, 7): 2}


def board(name: str, links: Mapping[tuple[int, int], Link], count: int = 8,
          default: Link = ACROSS_SOCKETS) -> Node:
    """``count`` GPUs, NUMA 0 for the first half; pairs not in ``links`` get ``default``."""
    def link(p: int, q: int) -> Link:
        return links.get((min(p, q), max(p, q)), default)

    uuids = [f"GPU-{name}-{i}" for i in range(count)]
    gpus = tuple(Gpu(uuids[i], i, "V100", 16 * GIB, i * 2 // count,
                     links=topology.freeze_links((uuids[j], link(i, j))
                                                 for j in range(count) if j != i))
                 for i in range(count))
    return Node(name, 64000, 512 * GIB, gpus, (), 2)


def nvswitch() -> Node:
    return board("hgx", {}, default=Link(18, 4, PciePath.NUMA_NODE))


def pcie_4_4() -> Node:
    near = {(a, b): Link(pcie=PciePath.SWITCH) for a, b in ((0, 1), (2, 3), (4, 5), (6, 7))}
    mid = {(a, b): Link(pcie=PciePath.SWITCHES)
           for q in (0, 4) for a, b in combinations(range(q, q + 4), 2) if (a, b) not in near}
    return board("pcie", {**near, **mid})


def mixed() -> Node:
    return board("dgx1", {pair: NV[n] for pair, n in HYBRID_CUBE_MESH.items()})


def chosen(state: ClusterState, demand: GpuDemand,
           order: GpuOrder = GpuOrder.TIGHTEST) -> list[int]:
    _, fit = feasible(state, pod("p", demand))
    assert fit is not None
    return pick_gpus(state, 0, demand, fit[0], order)


def worst(state: ClusterState, positions: list[int]) -> Link | None:
    return topology.worst_link(state.nodes[0].gpus, positions)


def test_link_quality_orders_nvlink_above_every_pcie_path_and_pcie_paths_nearest_first(
        ) -> None:
    ranks = [Link(18, 4).quality, Link(2, 2).quality, Link(1, 2).quality,
             *(Link(pcie=p).quality for p in PciePath)]
    assert ranks == sorted(ranks, reverse=True) and len(set(ranks)) == len(ranks)


def test_on_the_mixed_board_a_pair_gets_two_nvlinks_where_numa_alone_took_one() -> None:
    s = cluster(mixed())
    pair = chosen(s, whole(2))
    assert worst(s, pair) == NV[2]
    assert len({s.nodes[0].gpus[p].numa_node for p in pair}) == 1
    unknown = cluster(node("n", 8, model="V100"))  # same shape, no links: NUMA rule only
    assert chosen(unknown, whole(2)) == [0, 1]


def test_on_the_mixed_board_four_gpus_take_a_quad_that_nvlink_joins_fully() -> None:
    s = cluster(mixed())
    hold_whole(s, "a", "dgx1", 0)
    four = chosen(s, whole(4))
    assert sorted(four) == [4, 5, 6, 7] and worst(s, four) == NV[1]


def test_on_the_pcie_board_a_pair_stays_under_one_switch_as_the_board_fills() -> None:
    s = cluster(pcie_4_4())
    hold_whole(s, "a", "pcie", 0, 3)  # NUMA 0 keeps 1 and 2: different switches
    pair = chosen(s, whole(2))
    assert sorted(pair) in ([4, 5], [6, 7]) and worst(s, pair) == Link(pcie=PciePath.SWITCH)
    numa_only = cluster(node("pcie", 8, model="V100", gpu_gib=16))
    hold_whole(numa_only, "a", "pcie", 0, 3)
    assert chosen(numa_only, whole(2)) == [1, 2]  # what choosing by NUMA alone gives


def test_on_the_nvswitch_board_every_pair_is_equal_so_fragmentation_decides() -> None:
    s = cluster(nvswitch())
    hold(s, "a", "hgx", (5, 0, 60))
    assert chosen(s, shared(2, 0, 30)) == [5, 4]  # the tightest pair on one NUMA node
    assert chosen(s, shared(2, 0, 30), GpuOrder.LOOSEST) == [0, 1]


def test_numa_comes_before_links_never_worse_than_choosing_by_numa_alone() -> None:
    s = cluster(mixed())
    hold_whole(s, "a", "dgx1", 1, 2, 5, 6)  # left: 0, 3 (NUMA 0, NV2), 4, 7 (NUMA 1, NV2)
    pair = chosen(s, whole(2))
    assert len({s.nodes[0].gpus[p].numa_node for p in pair}) == 1
    three = chosen(s, whole(3))  # no NUMA node has three: span two, best links among them
    assert len({s.nodes[0].gpus[p].numa_node for p in three}) == 2


def test_many_gpus_are_grown_greedily_and_stay_within_the_best_clique() -> None:
    links = {(a, b): Link(12, 3, PciePath.SYSTEM)
             for q in (0, 8) for a, b in combinations(range(q, q + 8), 2)}
    s = cluster(board("big", links, count=16))
    eight = chosen(s, whole(8))
    assert sorted(eight) in (list(range(8)), list(range(8, 16)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=8, max_size=8), st.integers(2, 5))
def test_the_choice_never_spans_more_numa_nodes_than_needed(used: list[int], count: int
                                                          ) -> None:
    s = cluster(mixed())
    taken = [p for p, u in enumerate(used) if u]
    if taken:
        hold_whole(s, "a", "dgx1", *taken)
    free = [p for p in range(8) if p not in taken]
    if len(free) < count:
        return
    got = chosen(s, whole(count))
    gpus = s.nodes[0].gpus
    per_numa = [sum(1 for p in free if gpus[p].numa_node == n) for n in (0, 1)]
    span = len({gpus[p].numa_node for p in got})
    assert len(set(got)) == count and set(got) <= set(free)
    assert span == (1 if max(per_numa) >= count else 2)
    best = max(topology.set_quality(ps, topology.quality_matrix(gpus))
               for ps in combinations(free, count)
               if len({gpus[p].numa_node for p in ps}) == span)
    assert topology.set_quality(got, topology.quality_matrix(gpus)) == best


def test_a_link_reported_by_one_side_only_counts_for_both() -> None:
    a = Gpu("GPU-a", 0, "m", 1024, links=(("GPU-b", Link(4, 3)),))
    b = Gpu("GPU-b", 1, "m", 1024)
    assert topology.link_between(b, a) == Link(4, 3)
    assert topology.link_between(a, Gpu("GPU-c", 2, "m", 1024)) == topology.UNKNOWN_LINK


@pytest.mark.parametrize("text", ["Board", "Switch", "Switches", "HostBridge", "NUMANode",
                                  "System", "Unknown"])
def test_pcie_paths_are_spelled_and_read_back(text: str) -> None:
    assert PciePath.parse(text, "here").spelling == text


def test_a_misspelled_pcie_path_names_the_choices() -> None:
    with pytest.raises(Exception, match=r"here: PCIe path 'PIX' is not one of Board, Switch"):
        PciePath.parse("PIX", "here")
