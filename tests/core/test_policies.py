"""Every placement policy on tiny clusters whose right answer is known by hand."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpupool.core.errors import InvalidInput, UnknownName
from gpupool.core.model import uniform_node
from gpupool.core.placement import Placement, Placer
from gpupool.core.policies import POLICIES, make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.fgdbalance import dead_below, per_milli_gpu
from gpupool.core.policies.measure import gpu_demand
from gpupool.core.policies.scarcity import ModelScarcity
from gpupool.core.request import GpuDemand, PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.workload import TargetWorkload, TaskShape

from .builders import cluster, hold, hold_whole, node, pod, shared, whole

SIXTY_PCT = TargetWorkload((TaskShape(0, 1, 600),), (1,))
"""A target workload of tasks that each need 60 % of one GPU."""


def place(policy: str, s: ClusterState, r: PodRequest, seed: int = 1,
          workload: TargetWorkload = SIXTY_PCT) -> Placement:
    placer = Placer(make_policy(policy, PolicyConfig(workload=workload)))
    return placer.decide(s, r, random.Random(seed))


def where(p: Placement) -> tuple[str, list[int]]:
    assert p.allocation is not None, p.summary()
    return p.allocation.node, [x.gpu_position for x in p.allocation.slices]


def _one_half_used_node() -> ClusterState:
    s = cluster(node("n0", 2), node("n1", 2))
    hold_whole(s, "a", "n0", 0)
    return s


@pytest.mark.parametrize(("policy", "expected"), [
    ("best-fit", ("n0", [1])), ("spread", ("n1", [0])), ("dot-product", ("n1", [0])),
    ("packing", ("n0", [1]))],
    ids=["best-fit fills the used node", "spread picks the emptiest node",
         "dot-product picks the node whose free GPUs align with the demand",
         "packing prefers a node already in use"])
def test_a_whole_gpu_pod_goes_where_the_policy_says(policy: str,
                                                    expected: tuple[str, list[int]]) -> None:
    assert where(place(policy, _one_half_used_node(), pod("p", whole(1)))) == expected


def test_packing_puts_a_slice_on_a_gpu_already_in_use() -> None:
    s = cluster(node("n0", 2), node("n1", 2))
    hold(s, "a", "n1", (1, 0, 30))
    assert where(place("packing", s, pod("p", shared(1, 0, 20)))) == ("n1", [1])


def test_clustering_pairs_a_slice_with_slices_of_the_same_size() -> None:
    s = cluster(node("n0", 2, gpu_gib=16), node("n1", 2, gpu_gib=16))
    hold(s, "a", "n0", (0, 4096, 0))  # a quarter of GPU 0
    hold(s, "b", "n1", (0, 6144, 0))  # three eighths of GPU 0
    assert where(place("clustering", s, pod("p", shared(1, 4096)))) == ("n0", [0])


def test_spread_takes_the_emptiest_gpu_of_the_emptiest_node() -> None:
    s = cluster(node("n0", 2), node("n1", 2))
    hold(s, "a", "n0", (0, 0, 10))
    hold(s, "b", "n1", (0, 0, 10), (1, 0, 10))
    assert where(place("spread", s, pod("p", shared(1, 0, 20)))) == ("n0", [1])


@pytest.mark.parametrize("policy", ["fgd", "fgd-balance"])
def test_fgd_prefers_the_gpu_that_leaves_no_unusable_fragment(policy: str) -> None:
    # GPU0 has 70 % free, GPU1 100 %; tasks need 60 %. A 30 % slice on GPU0 would
    # leave 40 % nobody can use; on GPU1 it leaves 70 % + 70 %, both usable.
    s = cluster(node("n", 2))
    hold(s, "a", "n", (0, 0, 30))
    assert where(place(policy, s, pod("p", shared(1, 0, 30), cpu=0))) == ("n", [1])
    assert where(place("best-fit", s, pod("p", shared(1, 0, 30), cpu=0))) == ("n", [0])


@pytest.mark.parametrize("policy", ["fgd", "fgd-balance"])
def test_fgd_prefers_the_node_whose_fragmentation_grows_least(policy: str) -> None:
    s = cluster(node("n0", 1), node("n1", 1))
    hold(s, "a", "n0", (0, 0, 30))
    assert where(place(policy, s, pod("p", shared(1, 0, 30), cpu=0))) == ("n1", [0])


def test_fgd_needs_a_target_workload() -> None:
    with pytest.raises(InvalidInput, match="target workload"):
        make_policy("fgd", PolicyConfig())


def test_random_draws_among_feasible_nodes_reproducibly() -> None:
    s = cluster(node("n0", 1), node("n1", 1), node("n2", 1))
    hold_whole(s, "a", "n2", 0)
    chosen = [where(place("random", s, pod("p", whole(1)), seed))[0] for seed in range(20)]
    assert set(chosen) == {"n0", "n1"}
    assert chosen == [where(place("random", s, pod("p", whole(1)), seed))[0]
                      for seed in range(20)]


def test_an_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(UnknownName, match=r"known policies: .*best-fit"):
        make_policy("worst-fit", PolicyConfig())


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("request_", [
    pod("p", whole(2)), pod("p", shared(1, 8192, 25)), pod("p", shared(3, 1024, 10)),
    pod("p", cpu=2000)], ids=["two whole GPUs", "one slice", "three slices", "CPU only"])
def test_every_policy_places_only_where_the_pod_fits(policy: str, request_: PodRequest) -> None:
    s = cluster(node("n0", 4), node("n1", 2, cpu=4000), node("n2", 8, "V100", 16))
    hold_whole(s, "a", "n0", 0, 1, 2)
    hold(s, "b", "n2", *((j, 8192, 50) for j in range(8)))
    workload = TargetWorkload.from_requests([request_, pod("q", whole(1))])
    for seed in range(3):
        p = place(policy, s, request_, seed, workload)
        assert p.allocation is not None, p.summary()
        s.reserve(p.allocation)  # raises if the policy chose something that does not fit
        s.release(p.allocation.key)



def test_gpu_demand_ignores_gpu_slots_a_narrower_node_does_not_have() -> None:
    """A 2-GPU node beside an 8-GPU node: its absent slots must not inflate a memory ask."""
    state = ClusterState([uniform_node("wide", 96_000, 1 << 20, 8, "A", 16384),
                          uniform_node("narrow", 96_000, 1 << 20, 2, "A", 16384)])
    demand = GpuDemand(1, memory_mib=4096, core_pct=10)
    # 4 GiB of a 16 GiB GPU = 250 milli-GPU on either node
    assert list(gpu_demand(state, demand, np.array([0, 1]))) == [250, 250]


def test_fgd_scores_a_second_state_as_a_fresh_policy_would() -> None:
    """Per-shape caches belong to one layout: a policy reused on another state recomputes."""
    workload = TargetWorkload((TaskShape(1000, 1, 500), TaskShape(1000, 1, 1000)), (3, 1))
    request = pod("p", shared(1, core=50))
    reused = Placer(make_policy("fgd", PolicyConfig(workload=workload)))
    first = cluster(node("a", gpus=2), node("b", gpus=2))
    reused.decide(first, request, random.Random(1))
    second = cluster(node("a", gpus=2), node("b", gpus=2))
    hold(second, "h", "b", (0, 0, 50))
    fresh = Placer(make_policy("fgd", PolicyConfig(workload=workload)))
    a = reused.decide(second, request, random.Random(1)).allocation
    b = fresh.decide(second, request, random.Random(1)).allocation
    assert a == b and a is not None and a.node == "b"


# -- fgd-balance's own terms -------------------------------------------------------------
def balance(s: ClusterState, r: PodRequest, workload: TargetWorkload,
            **weights: float) -> tuple[str, list[int]]:
    config = PolicyConfig(workload, {f"fgd-balance.{k.replace('_', '-')}": v
                                     for k, v in weights.items()})
    return where(Placer(make_policy("fgd-balance", config)).decide(s, r, random.Random(1)))


def test_fgd_balance_leaves_a_scarce_model_to_the_pods_bound_to_it() -> None:
    # Half the workload runs only on T4. The G2 node is short of CPU, so CPU balance
    # alone would send a CPU-heavy pod that runs anywhere to the roomy T4 node.
    s = cluster(node("t4", 2, "T4", cpu=104_000), node("g2", 8, "G2", cpu=24_000))
    workload = TargetWorkload((TaskShape(8000, 1, 1000, frozenset({"T4"})),
                               TaskShape(8000, 1, 1000)), (5, 5))
    anywhere = pod("p", whole(1), cpu=16_000)
    assert balance(s, anywhere, workload, scarcity=0)[0] == "t4"
    assert balance(s, anywhere, workload)[0] == "g2"


def test_fgd_balance_does_not_leave_a_sliver_no_common_pod_fits() -> None:
    # GPU 0 has 53 % free. A 32 % slice there leaves 21 %, less than any sharing pod of
    # the workload asks (the smallest is 23 %): FGD takes it, fgd-balance opens GPU 1.
    s = cluster(node("n", 2))
    hold(s, "a", "n", (0, 0, 47))
    workload = TargetWorkload((TaskShape(0, 1, 470), TaskShape(0, 1, 320),
                               TaskShape(0, 1, 230), TaskShape(0, 1, 1000)), (10, 5, 5, 10))
    slice32 = pod("p", shared(1, 0, 32), cpu=0)
    assert where(place("fgd", s, slice32, workload=workload)) == ("n", [0])
    assert balance(s, slice32, workload) == ("n", [1])
    assert balance(s, slice32, workload, dead=0) == ("n", [0])


def test_fgd_balance_keeps_memory_beside_free_gpus() -> None:
    # The pod would leave the lean node 4 GiB beside an idle GPU that a task of this
    # workload (32 GiB per GPU) could not use; with memory counted it goes to the roomy one.
    s = cluster(node("lean", 2, mem_gib=64), node("roomy", 2, mem_gib=512))
    workload = TargetWorkload((TaskShape(1000, 1, 1000),), (1,), memory_mib=(32 * 1024,))
    hungry = pod("p", whole(1), cpu=1000, mem=60 * 1024)
    assert balance(s, hungry, workload, memory=0)[0] == "lean"  # a tie: node order
    assert balance(s, hungry, workload)[0] == "roomy"


TRACE_LIKE = {810: 1000, 470: 700, 320: 300, 230: 130, 220: 45, 160: 45}
"""Sharing sizes of a trace-like target workload: 16 % pods are 2 % of sharing pods,
22 % pods and smaller 4.1 %, 23 % pods and smaller 9.9 %."""


@pytest.mark.parametrize(("sizes", "filler", "expected"), [
    ({470: 10, 320: 5, 230: 5}, 0.03, 230),
    (TRACE_LIKE, 0.03, 220),
    (TRACE_LIKE, 0.05, 230),
    (TRACE_LIKE, 0.01, 160),
    ({}, 0.03, 0)],
    ids=["a gap below the smallest sharing pod is dead",
         "a gap below 22 % only the rarest 3 % of sharing pods fit is dead",
         "a larger filler share moves the line up to the next size",
         "a smaller filler share lets the 16 % pods count",
         "a workload that shares no GPU has no dead share"])
def test_dead_share_line_is_where_the_rarest_sharing_pods_end(
        sizes: dict[int, int], filler: float, expected: int) -> None:
    shapes = (*(TaskShape(1000, 1, m) for m in sizes), TaskShape(1000, 1, 1000))
    workload = TargetWorkload(shapes, (*sizes.values(), 100))
    assert dead_below(workload, filler) == expected


def test_cpu_and_memory_per_gpu_count_cpu_only_tasks_only_when_asked() -> None:
    workload = TargetWorkload((TaskShape(8000, 1, 1000), TaskShape(4000, 0, 0)), (1, 1),
                              memory_mib=(16384, 8192))
    assert per_milli_gpu(workload, False) == (8.0, 16.384)
    assert per_milli_gpu(workload, True) == (12.0, 24.576)


@pytest.mark.parametrize(("bound", "expected"), [
    ({}, {"T4": 0.0, "G2": 0.0}),
    ({frozenset({"T4"}): 0.1}, {"T4": 0.5, "G2": 0.0}),
    ({frozenset({"T4"}): 0.5}, {"T4": 1.0, "G2": 0.0}),
    ({frozenset({"T4", "G2"}): 0.5}, {"T4": 0.5, "G2": 0.5}),
    ({frozenset({"A100"}): 0.5}, {"T4": 0.0, "G2": 0.0})],
    ids=["nothing bound: nothing reserved", "a tenth of the demand fills half the T4s",
         "more than a model holds is capped at all of it",
         "a list of models is split by capacity",
         "a model the cluster does not have reserves nothing"])
def test_scarcity_reserves_the_share_of_each_model_bound_tasks_need(
        bound: dict[frozenset[str], float], expected: dict[str, float]) -> None:
    scarcity = ModelScarcity(TargetWorkload((TaskShape(1000, 1, 1000),), (1,)))
    scarcity.bound = bound
    got = scarcity.reserved({"T4": 200, "G2": 800})
    assert got == pytest.approx(expected)


def test_scarcity_of_a_workload_is_its_bound_tasks_gpu_share() -> None:
    workload = TargetWorkload((TaskShape(1000, 1, 500, frozenset({"T4"})),
                               TaskShape(1000, 2, 1000), TaskShape(1000, 0, 0)), (4, 1, 9))
    assert ModelScarcity(workload).bound == {frozenset({"T4"}): pytest.approx(0.5)}
    s = cluster(node("t4", 2, "T4"), node("g2", 8, "G2"))
    assert ModelScarcity(workload).per_node(s).tolist() == [1.0, 0.0]  # 5 GPUs asked of 2
