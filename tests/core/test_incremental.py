"""Remembered work gives the answers fresh work gives: feasibility per shape and the
FGD-type scores, after random reservations, releases and health changes."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.errors import OverCommit
from gpupool.core.feasibility import FeasibilityMemo
from gpupool.core.fit import Constraints, feasible
from gpupool.core.placement import Placer
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.reasons import Check, Reason
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.workload import TargetWorkload, TaskShape

from .builders import cluster, node, pod, shared, whole

WORKLOAD = TargetWorkload((TaskShape(2000, 1, 300), TaskShape(4000, 1, 1000),
                           TaskShape(8000, 2, 1000)), (5, 3, 1))
SHAPES = [pod("a", shared(1, 4096, 20), cpu=2000), pod("b", shared(1, 10240, 50), cpu=4000),
          pod("c", whole(1), cpu=8000), pod("d", whole(2), cpu=4000),
          pod("e", shared(2, 2048, 10), cpu=1000), pod("f", cpu=3000)]


def _world(seed: int) -> tuple[ClusterState, list[Constraints]]:
    rng = random.Random(seed)
    s = cluster(*[node(f"n{i}", gpus=rng.choice([2, 4, 8]), gpu_gib=rng.choice([16, 40]),
                       cpu=rng.choice([16000, 32000])) for i in range(12)])
    n, w = s.present.shape
    masks = [Constraints(), Constraints(gpu_mask=np.array(
        [[rng.random() < 0.7 for _ in range(w)] for _ in range(n)])),
        Constraints(node_mask=np.array([rng.random() < 0.6 for _ in range(n)]))]
    for m in masks:  # as the catalogues hand them out: read-only, one object per mask
        for a in (m.gpu_mask, m.node_mask):
            if a is not None:
                a.flags.writeable = False
    return s, masks


def _mutate(s: ClusterState, rng: random.Random, step: int, held: list[str]) -> None:
    """One random change: a slice reserved, an allocation released, or a health flip."""
    roll = rng.random()
    if roll < 0.5 or not held:
        i = rng.randrange(len(s.nodes))
        n = s.nodes[i]
        j = rng.randrange(len(n.gpus))
        alloc = Allocation(f"x{step}", n.name, rng.choice([0, 1000, 4000]), 0, (Slice(
            n.gpus[j].uuid, j, rng.choice([0, 2048, 8192]), rng.choice([5, 20, 50])),))
        try:
            s.reserve(alloc)
            held.append(alloc.key)
        except OverCommit:
            pass
    elif roll < 0.8:
        s.release(held.pop(rng.randrange(len(held))))
    else:
        n = s.nodes[rng.randrange(len(s.nodes))]
        g = n.gpus[rng.randrange(len(n.gpus))]
        s.set_health(n.name, g.uuid, rng.random() < 0.7)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.integers(0, 5), min_size=5, max_size=40))
def test_remembered_feasibility_is_what_fit_says_after_every_change(
        seed: int, asks: list[int]) -> None:
    s, masks = _world(seed)
    rng = random.Random(seed)
    memo = FeasibilityMemo(shapes=4)  # fewer than the shapes asked: eviction is exercised
    held: list[str] = []
    for step, k in enumerate(asks):
        for _ in range(rng.choice([0, 1, 1, 2, 6])):
            _mutate(s, rng, step * 10 + _, held)
        r, c = SHAPES[k], masks[step % len(masks)]
        got, got_gpu = memo.feasible(s, r, c)
        want, want_gpu = feasible(s, r, c)
        assert (got == want).all()
        assert (got_gpu is None) == (want_gpu is None)
        if got_gpu is not None and want_gpu is not None:
            assert (got_gpu == want_gpu).all()


def test_only_changed_nodes_are_worked_out_again_and_answers_are_the_callers() -> None:
    s, _ = _world(7)
    memo = FeasibilityMemo()
    r = SHAPES[0]
    first, _gpu = memo.feasible(s, r, Constraints())
    assert memo.rows_worked == len(s.nodes)
    first[:] = False  # the caller's copy: the memo must not see this
    s.set_health("n3", s.nodes[3].gpus[0].uuid, False)
    again, _gpu = memo.feasible(s, r, Constraints())
    assert memo.rows_worked == len(s.nodes) + 1
    assert (again == feasible(s, r, Constraints())[0]).all() and again.any()


def test_a_new_layout_is_never_answered_from_the_old_one() -> None:
    memo = FeasibilityMemo()
    r = pod("p", whole(4))
    small = cluster(node("a", gpus=2))
    assert not memo.feasible(small, r, Constraints())[0].any()
    big = cluster(node("a", gpus=8))  # the same names, another layout
    assert memo.feasible(big, r, Constraints())[0].all()


def test_a_refused_request_fits_nowhere_and_is_not_remembered() -> None:
    s, _ = _world(3)
    memo = FeasibilityMemo()
    blocked = Constraints(blocked=Reason("", Check.QUOTA, "quota of tenant t exceeded", False))
    mask, gpu = memo.feasible(s, SHAPES[0], blocked)
    assert not mask.any() and gpu is None and memo.rows_worked == 0


def _placers(policy: str) -> tuple[Placer, Placer]:
    config = PolicyConfig(workload=WORKLOAD)
    return Placer(make_policy(policy, config)), Placer(make_policy(policy, config), shapes=0)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["fgd", "fgd-balance"]))
def test_remembered_scores_are_the_scores_a_fresh_policy_gives(seed: int, policy: str) -> None:
    s, masks = _world(seed)
    rng = random.Random(seed)
    reused, _ = _placers(policy)
    held: list[str] = []
    for step in range(30):
        for k in range(rng.choice([0, 1, 3])):
            _mutate(s, rng, step * 10 + k, held)
        r: PodRequest = SHAPES[rng.randrange(len(SHAPES) - 1)]
        c = masks[rng.randrange(2)]
        cands = reused.candidates(s, r, c)
        if cands.indices.size == 0:
            continue
        fresh, _ = _placers(policy)
        got = reused.score(s, r, cands, random.Random(1))
        want = fresh.score(s, r, fresh.candidates(s, r, c), random.Random(1))
        assert np.allclose(got.value, want.value)
        assert (got.gpu is None) == (want.gpu is None)
        if got.gpu is not None and want.gpu is not None:
            assert (got.gpu == want.gpu).all()


def test_two_classes_with_the_same_shape_do_not_share_gpu_choices() -> None:
    """The policy's cached GPU choice belongs to the GPU mask it was made under."""
    s = cluster(node("n", gpus=2))
    left = np.array([[True, False]])
    right = np.array([[False, True]])
    for m in (left, right):
        m.flags.writeable = False
    placer = Placer(make_policy("fgd-balance", PolicyConfig(workload=WORKLOAD)))
    r = pod("p", shared(1, 1024, 10))
    for mask, position in ((left, 0), (right, 1), (left, 0)):
        placement = placer.decide(s, r, random.Random(1), Constraints(gpu_mask=mask))
        assert placement.allocation is not None
        assert placement.allocation.slices[0].gpu_position == position
