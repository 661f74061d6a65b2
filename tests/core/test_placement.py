"""One decision end to end: the allocation, or per-node reasons and a summary."""

from __future__ import annotations

import random

import numpy as np

from gpupool.core.placement import Placer
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.reasons import Check

from .builders import cluster, hold_whole, node, pod, whole


def placer() -> Placer:
    return Placer(make_policy("best-fit", PolicyConfig()))


def test_a_pod_that_fits_gets_an_allocation_the_state_accepts() -> None:
    s = cluster(node("n0", 2), node("n1", 4))
    p = placer().decide(s, pod("p", whole(3), cpu=2000, mem=4096), random.Random(1))
    assert p.ok and p.feasible_nodes == 1 and p.allocation is not None
    assert p.allocation.node == "n1" and len(p.allocation.gpu_uuids) == 3
    s.reserve(p.allocation)
    assert s.usage().idle_gpus == 3
    assert p.summary().startswith("p on n1: 2000m CPU, 4096 MiB")


def test_a_pod_that_fits_nowhere_gets_a_reason_per_node_and_a_tally() -> None:
    s = cluster(node("n0", 2), node("n1", 4), node("n2", 4))
    hold_whole(s, "a", "n1", 0, 1)
    hold_whole(s, "b", "n2", 0, 1, 2)
    p = placer().decide(s, pod("p", whole(3)), random.Random(1), explain_limit=10)
    assert not p.ok and p.feasible_nodes == 0
    assert [(r.node, r.check) for r in p.reasons] == [
        ("n0", Check.GPU_COUNT), ("n1", Check.GPU_FREE), ("n2", Check.GPU_FREE)]
    assert p.summary() == ("p: 0 nodes fit (2 gpu-free, 1 gpu-count); e.g. node n0: "
                           "3 GPUs needed, node has 2")


def test_explain_limit_bounds_the_work_on_failure() -> None:
    s = cluster(*(node(f"n{i}", 1) for i in range(5)))
    p = placer().decide(s, pod("p", whole(2)), random.Random(1), explain_limit=2)
    assert [r.node for r in p.reasons] == ["n0", "n1"]
    assert placer().decide(s, pod("p", whole(2)), random.Random(1)).reasons == ()


def test_among_restricts_the_candidate_nodes() -> None:
    s = cluster(node("n0", 2), node("n1", 2), node("n2", 2))
    hold_whole(s, "a", "n0", 0)
    p = placer().decide(s, pod("p", whole(1)), random.Random(1), among=np.array([1, 2]))
    assert p.allocation is not None and p.allocation.node in ("n1", "n2")


def test_among_with_rows_repeated_and_unordered_counts_each_node_once() -> None:
    s = cluster(node("n0", 2), node("n1", 2), node("n2", 2), node("n3", 2))
    hold_whole(s, "a", "n2", 0, 1)
    p = placer().decide(s, pod("p", whole(1)), random.Random(1),
                        among=np.array([2, 3, 1, 3, 2, 1]))
    assert p.feasible_nodes == 2
    assert p.allocation is not None and p.allocation.node in ("n1", "n3")
