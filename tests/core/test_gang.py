"""A gang placed whole: all its members (or its quorum) together, or none of them."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.eligibility import Catalogue
from gpupool.core.errors import InvalidInput, OverCommit
from gpupool.core.gang import Gang, Together, place_gang, reserve_gang
from gpupool.core.placement import Placer
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.quota import Limit
from gpupool.core.reasons import Check
from gpupool.core.request import PodRequest
from gpupool.core.scoring import Policy

from .builders import cluster, hold, hold_whole, node, pod, shared, whole

POLICY = make_policy("best-fit", PolicyConfig())
RNG = random.Random(0)


def members(n: int, *demand: object, tenant: str | None = None, prefix: str = "w"
            ) -> tuple[PodRequest, ...]:
    return tuple(pod(f"{prefix}{i}", *demand, tenant=tenant) for i in range(n))  # type: ignore[arg-type]


def place(state: object, gang: Gang, catalogue: Catalogue | None = None,
          policy: Policy = POLICY) -> object:
    return place_gang(state, gang, policy, random.Random(0), catalogue)  # type: ignore[arg-type]


def test_a_gang_that_fits_is_placed_whole_and_reserves_together() -> None:
    state = cluster(node("a"), node("b"))
    gang = Gang("train", members(8, shared(1, 10240, 40)))
    placed = place_gang(state, gang, POLICY, RNG)
    assert placed.ok and len(placed.allocations) == 8 and placed.waiting == ()
    assert [a.key for a in placed.allocations] == [f"w{i}" for i in range(8)]
    assert state.allocations == {}  # the caller reserves
    reserve_gang(state, placed)
    assert len(state.allocations) == 8 and int(state.core_free.min()) >= 0
    assert "8 of 8 placed" in placed.summary()


def test_a_gang_that_does_not_fit_places_nothing_where_per_pod_placement_holds_gpus_idle(
        ) -> None:
    state = cluster(node("a"), node("b"))  # 8 GPUs, 800 % of compute
    gang = Gang("train", members(9, shared(1, 1024, 60)))  # 540 % asked, one per GPU fits
    placed = place_gang(state, gang, POLICY, RNG)
    assert not placed.ok and placed.allocations == ()
    assert placed.reason is not None and "only 8 of its members fit together, 9 needed" in \
        placed.reason.message
    assert not placed.reason.permanent and state.allocations == {}
    one_by_one, started = Placer(POLICY), 0
    for m in gang.members:
        alone = one_by_one.decide(state, m, RNG).allocation
        if alone is not None:
            state.reserve(alone)
            started += 1
    assert started == 8  # what a gang avoids: 8 GPUs held by a job that cannot start


def test_a_gang_the_clusters_free_room_cannot_hold_is_refused_before_any_member_is_tried(
        ) -> None:
    placed = place_gang(cluster(node("a"), node("b")), Gang("big", members(9, whole(1))),
                        POLICY, RNG)
    assert placed.reason is not None and "free GPU compute or memory is less than its 9 " \
        "members ask together" in placed.reason.message


def test_a_quorum_is_placed_and_the_members_beyond_it_wait() -> None:
    state = cluster(node("a"), node("b"))
    placed = place_gang(state, Gang("train", members(10, whole(1)), min_count=8), POLICY, RNG)
    assert placed.ok and len(placed.allocations) == 8 and len(placed.waiting) == 2


def test_the_largest_members_go_first_so_a_mixed_gang_packs() -> None:
    state = cluster(node("a", gpus=2))
    small = tuple(pod(f"s{i}", shared(1, 4096, 50)) for i in range(2))
    gang = Gang("mixed", (*small, pod("big", whole(1))))  # in member order the slices would
    placed = place_gang(state, gang, POLICY, RNG)       # spread onto both GPUs first
    assert placed.ok and [a.key for a in placed.allocations] == ["s0", "s1", "big"]
    assert len({a.slices[0].gpu_uuid for a in placed.allocations[:2]}) == 1


def test_members_asked_onto_one_node_get_the_tightest_node_that_holds_them() -> None:
    state = cluster(node("roomy", gpus=8), node("snug", gpus=4), node("small", gpus=2))
    placed = place_gang(state, Gang("tp", members(4, whole(1)), together=Together.NODE),
                        POLICY, RNG)
    assert placed.ok and placed.where == "snug"
    assert {a.node for a in placed.allocations} == {"snug"}


def test_members_asked_into_one_domain_stay_in_it_and_nodes_without_the_label_are_out() -> None:
    zone = "topology.kubernetes.io/zone"
    state = cluster(node("a1", labels={zone: "a"}), node("a2", labels={zone: "a"}),
                    node("b1", labels={zone: "b"}), node("loose", gpus=8))
    hold_whole(state, "other", "a1", 0, 1, 2)
    placed = place_gang(state, Gang("job", members(5, whole(1)), together=Together.DOMAIN),
                        POLICY, RNG)
    assert placed.ok and placed.where == f"{zone}=a"
    assert {a.node for a in placed.allocations} <= {"a1", "a2"}
    refused = place_gang(state, Gang("big", members(9, whole(1)), together=Together.DOMAIN),
                         POLICY, RNG)
    assert refused.reason is not None and "no domain of topology.kubernetes.io/zone holds 9" in \
        refused.reason.message


def test_a_gang_over_its_tenants_quota_waits_whole_with_one_reason() -> None:
    state = cluster(node("a"), node("b"))
    catalogue = Catalogue()
    catalogue.quotas.set_tenant_limit("lab", Limit(gpus=6))
    gang = Gang("train", members(4, whole(2), tenant="lab"))  # 2 GPUs each fit; 8 do not
    placed = place_gang(state, gang, POLICY, RNG, catalogue)
    assert placed.reason is not None and placed.reason.check is Check.QUOTA
    assert placed.reason.message.startswith("gang train: quota of tenant lab exceeded: 8 GPUs")
    assert placed.allocations == ()
    fits = place_gang(state, Gang("small", members(3, whole(2), tenant="lab")), POLICY, RNG,
                      catalogue)
    assert fits.ok and [c.amount.gpus for c in fits.charges] == [2, 2, 2]


def test_a_gang_whose_members_may_not_be_placed_is_refused_for_good() -> None:
    state = cluster(node("a"))
    gang = Gang("x", tuple(PodRequest(f"m{i}", gpus=(whole(1),), gpu_class="nope")
                           for i in range(2)))
    placed = place_gang(state, gang, POLICY, RNG, Catalogue())
    assert placed.reason is not None and placed.reason.permanent
    assert "2 of its members may not be placed (resource class nope does not exist" in \
        placed.reason.message


def test_the_same_state_and_gang_give_the_same_placement() -> None:
    state = cluster(*(node(f"n{i}", gpus=4) for i in range(6)))
    hold(state, "busy", "n2", (0, 20480, 50), (1, 8192, 30))
    gang = Gang("g", members(12, shared(1, 8192, 30)) + members(3, whole(2), prefix="x"))
    policy = make_policy("dot-product", PolicyConfig())
    first = place_gang(state, gang, policy, random.Random(1))
    assert first == place_gang(state, gang, policy, random.Random(1))


def test_reserving_a_placement_the_state_outran_changes_nothing() -> None:
    state = cluster(node("a", gpus=2))
    placed = place_gang(state, Gang("g", members(2, whole(1))), POLICY, RNG)
    hold_whole(state, "late", "a", 1)
    with pytest.raises(OverCommit):
        reserve_gang(state, placed)
    assert set(state.allocations) == {"late"}


@pytest.mark.parametrize("kwargs, message", [
    ({"members": ()}, "needs members"),
    ({"min_count": 5}, "minCount 5 must be 1..2"),
    ({"members": (pod("same"), pod("same"))}, "same key"),
])
def test_a_malformed_gang_is_refused_naming_it(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"name": "g", "members": (pod("a"), pod("b"))} | kwargs
    with pytest.raises(InvalidInput, match=message):
        Gang(**fields)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(gpus=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       asks=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 100)), min_size=1,
                     max_size=12),
       busy=st.integers(0, 60), quorum=st.integers(0, 12),
       together=st.sampled_from(list(Together)))
def test_a_gang_never_over_commits_and_is_all_or_nothing(
        gpus: list[int], asks: list[tuple[int, int]], busy: int, quorum: int,
        together: Together) -> None:
    state = cluster(*(node(f"n{i}", gpus=g, gpu_gib=16) for i, g in enumerate(gpus)))
    hold(state, "busy", "n0", (0, busy * 100, busy))
    gang_members = tuple(pod(f"m{i}", whole(1) if gib == 0 else shared(1, gib * 4096, core))
                         for i, (gib, core) in enumerate(asks))
    gang = Gang("g", gang_members, min(quorum, len(asks)), together,
                domain_label="gpupool.io/unused")
    placed = place_gang(state, gang, POLICY, RNG)
    if placed.ok:
        assert len(placed.allocations) >= gang.quorum
        reserve_gang(state, placed)  # never OverCommit: the members were placed together
        assert int(state.core_free.min()) >= 0 and int(state.unit_free.min()) >= 0
        if together is Together.NODE:
            assert len({a.node for a in placed.allocations}) == 1
    else:
        assert placed.allocations == () and set(state.allocations) == {"busy"}
