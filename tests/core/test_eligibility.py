"""Eligibility: classes, groups and quota turned into fit ``Constraints`` for a request."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.classes import ClassCatalog, ResourceClass
from gpupool.core.eligibility import Catalogue, charge_of, constraints_for, request_amount
from gpupool.core.fit import Constraints, explain, feasible
from gpupool.core.groups import GroupCatalog, ResourceGroup
from gpupool.core.placement import Placer
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.quota import Amount, Charge, Limit, QuotaBook
from gpupool.core.reasons import Check
from gpupool.core.request import PodRequest
from gpupool.core.selector import Selector
from gpupool.core.state import ClusterState

from .builders import cluster, hold_whole, node, pod, shared, whole

BIG = Selector.from_spec({"matchExpressions": [
    {"key": "gpupool.io/memory", "operator": "Gt", "values": ["40Gi"]}]})


def _world() -> tuple[ClusterState, Catalogue]:
    s = cluster(node("a80", 4, "A100", 80), node("a40", 2, "A100", 40), node("v16", 4, "V100", 16))
    groups = GroupCatalog([
        ResourceGroup("research", nodes=frozenset({"a80"}), tenants=frozenset({"lab"})),
        ResourceGroup("small", nodes=frozenset({"a40"})),
        ResourceGroup("volta", nodes=frozenset({"v16"}), models=frozenset({"V100"})),
    ])
    classes = ClassCatalog([ResourceClass("big", BIG)])
    quotas = QuotaBook()
    quotas.set_tenant_limit("lab", Limit(gpus=6))
    quotas.set_class_limit("web", "big", Limit(gpus=1))
    quotas.set_group_limit("small", Limit(core_pct=150))
    return s, Catalogue(groups, classes, quotas)


def test_without_classes_groups_or_quota_everything_is_eligible() -> None:
    s = cluster(node("n", 2))
    c = constraints_for(s, pod("p", whole(1), tenant="t"), Catalogue())
    assert c == Constraints()


def test_a_class_becomes_the_gpu_mask_of_its_gpus() -> None:
    s, cat = _world()
    cat.groups = GroupCatalog()
    c = constraints_for(s, pod("p", whole(1), gpu_class="big"), cat)
    assert c.blocked is None and c.gpu_mask is not None
    assert c.gpu_mask.tolist() == [[True] * 4, [False] * 4, [False] * 4]


def test_a_selector_on_the_request_narrows_the_class() -> None:
    s, cat = _world()
    cat.groups = GroupCatalog()
    first = Selector.from_spec({"matchLabels": {"gpupool.io/index": "0"}})
    c = constraints_for(s, pod("p", whole(1), gpu_class="big", selector=first), cat)
    assert c.gpu_mask is not None and c.gpu_mask.tolist()[0] == [True, False, False, False]
    assert int(c.gpu_mask.sum()) == 1


@pytest.mark.parametrize(("request_", "check", "needle", "permanent"), [
    (pod("p", whole(1), gpu_class="huge"), Check.CLASS,
     "resource class huge does not exist (known: big)", True),
    (pod("p", whole(7), tenant="lab"), Check.QUOTA,
     "quota of tenant lab exceeded: 7 GPUs asked, 0 of 6 in use", True),
    (pod("p", whole(2), tenant="web", gpu_class="big"), Check.QUOTA,
     "quota of tenant web for class big exceeded: 2 GPUs asked", True),
    (pod("p", whole(1), tenant="web", group="nope"), Check.GROUP,
     "resource group nope does not exist (known: research, small, volta)", True),
    (pod("p", whole(1), tenant="web", group="research"), Check.GROUP,
     "tenant web may not use group research (it is for lab)", True),
    (pod("p", whole(1), tenant="web", group="volta", models={"A100"}), Check.GROUP,
     "group volta is meant for V100, the pod allows A100", True),
    (pod("p", whole(2), tenant="web", group="small"), Check.QUOTA,
     "quota of group small exceeded: 200 % of GPU compute asked, 0 of 150 in use", True),
    (pod("p", whole(5), tenant="web"), Check.GROUP,
     "no resource group of tenant web can hold", True),
], ids=["unknown class", "tenant quota", "quota per class", "unknown group",
        "a group of another tenant", "a group for other GPU models", "group quota",
        "no group can ever hold the pod"])
def test_a_refused_request_is_blocked_on_every_node_with_the_reason(
        request_: PodRequest, check: Check, needle: str, permanent: bool) -> None:
    s, cat = _world()
    c = constraints_for(s, request_, cat)
    assert c.blocked is not None and c.blocked.check is check
    assert needle in c.blocked.message and c.blocked.permanent is permanent
    assert not feasible(s, request_, c)[0].any()
    reasons = [explain(s, request_, i, c) for i in range(len(s.nodes))]
    assert [r.node for r in reasons if r] == ["a80", "a40", "v16"]
    assert all(r is not None and r.message == c.blocked.message for r in reasons)


def test_a_named_group_limits_the_pod_to_its_members() -> None:
    s, cat = _world()
    r = pod("p", whole(1), tenant="lab", group="research")
    c = constraints_for(s, r, cat)
    assert c.group == "research" and c.node_mask is not None
    assert c.node_mask.tolist() == [True, False, False]
    reason = explain(s, r, 1, c)
    assert reason is not None and reason.check is Check.GROUP
    assert reason.sentence() == "node a40: not in group research"


def test_without_a_named_group_the_best_fit_group_of_the_tenant_is_chosen() -> None:
    s, cat = _world()
    assert constraints_for(s, pod("p", whole(1), tenant="lab"), cat).group == "small"
    assert constraints_for(s, pod("p", whole(3), tenant="lab"), cat).group == "research"
    assert constraints_for(s, pod("p", whole(3), tenant="web"), cat).group == "volta"
    hold_whole(s, "x", "a40", 0, 1)
    assert constraints_for(s, pod("p", whole(1), tenant="lab"), cat).group == "research"


def test_a_class_narrows_the_best_fit_choice_to_groups_with_gpus_of_the_class() -> None:
    s, cat = _world()
    c = constraints_for(s, pod("p", whole(1), tenant="lab", gpu_class="big"), cat)
    assert c.group == "research" and c.gpu_mask is not None and int(c.gpu_mask.sum()) == 4


def test_a_tenant_without_any_group_is_blocked_permanently() -> None:
    s, cat = _world()
    cat.groups = GroupCatalog([ResourceGroup("only-lab", nodes=frozenset({"a80"}),
                                             tenants=frozenset({"lab"}))])
    c = constraints_for(s, pod("p", whole(1), tenant="web"), cat)
    assert c.blocked is not None and c.blocked.permanent
    assert "tenant web may use no resource group (groups: only-lab)" in c.blocked.message


def test_groups_that_are_full_now_block_the_pod_for_now_only() -> None:
    s, cat = _world()
    hold_whole(s, "x", "a40", 0, 1)
    hold_whole(s, "y", "v16", 0, 1, 2, 3)
    c = constraints_for(s, pod("p", whole(1), tenant="web"), cat)
    assert c.blocked is not None and not c.blocked.permanent
    assert "group small: 0 of 2 GPUs free" in c.blocked.message


def test_a_pod_without_gpus_is_not_held_to_a_group_it_does_not_name() -> None:
    s, cat = _world()
    assert constraints_for(s, pod("p", tenant="web"), cat) == Constraints()


def test_the_group_reasons_name_the_numbers_of_every_group() -> None:
    s, cat = _world()
    c = constraints_for(s, pod("p", whole(5), tenant="web"), cat)
    assert c.blocked is not None
    assert "quota of group small exceeded: 500 % of GPU compute asked" in c.blocked.message
    assert "group volta: 4 of 4 GPUs free" in c.blocked.message


def test_exclusive_gpus_count_the_memory_of_the_smallest_eligible_gpu() -> None:
    s, cat = _world()
    mask = cat.classes.gpu_mask(s, "big")
    assert request_amount(s, pod("p", whole(2)), mask) == Amount(2, 2 * 80 * 1024, 200)
    assert request_amount(s, pod("p", whole(2)), None) == Amount(2, 2 * 16 * 1024, 200)
    assert request_amount(s, pod("p", shared(1, 1000, 5)), None) == Amount(1, 1024, 5)


def test_a_placement_under_the_constraints_stays_in_the_group_and_is_charged() -> None:
    s, cat = _world()
    r = pod("p", shared(1, 2048, 50), tenant="lab")
    c = constraints_for(s, r, cat)
    placement = Placer(make_policy("best-fit", PolicyConfig())).decide(s, r, random.Random(1), c)
    assert placement.allocation is not None and placement.allocation.node == "a40"
    charge = charge_of(r, placement.allocation, c)
    assert charge == Charge(Amount(1, 2048, 50), "lab", None, "small")
    cat.quotas.charge(r.key, charge)
    assert cat.quotas.used_by_group("small") == Amount(1, 2048, 50)
    again = constraints_for(s, pod("q", shared(2, 2048, 60), tenant="lab", group="small"), cat)
    assert again.blocked is not None and "quota of group small" in again.blocked.message


def test_masks_are_reused_between_requests_at_the_same_epoch() -> None:
    s, cat = _world()
    cat.groups = GroupCatalog()
    a = constraints_for(s, pod("p", whole(1), gpu_class="big"), cat)
    b = constraints_for(s, pod("q", whole(2), gpu_class="big"), cat)
    assert a.gpu_mask is b.gpu_mask


def test_narrowed_masks_are_one_object_per_class_selector_and_group() -> None:
    """Scorers key their caches on the mask's identity: equal asks must meet one object,
    and a class edited in between must not be answered with the old narrowing."""
    s, cat = _world()
    first = Selector.from_spec({"matchLabels": {"gpupool.io/index": "0"}})
    ask = pod("p", whole(1), gpu_class="big", selector=first, group="research", tenant="lab")
    a, b = constraints_for(s, ask, cat), constraints_for(s, ask, cat)
    assert a.gpu_mask is not None and a.gpu_mask is b.gpu_mask
    assert not a.gpu_mask.flags.writeable
    assert a.gpu_mask.tolist()[0] == [True, False, False, False]
    cat.classes.put(ResourceClass("big", Selector.from_spec({"matchLabels": {
        "gpupool.io/model": "V100"}})))  # no V100 in group research: nothing left
    c = constraints_for(s, ask, cat)
    assert c.gpu_mask is not None and c.gpu_mask is not a.gpu_mask and not c.gpu_mask.any()


# -- property: a placement under the constraints never leaves the group or the class ------


@st.composite
def grouped_worlds(draw: st.DrawFn) -> tuple[ClusterState, Catalogue, PodRequest]:
    nodes = [node(f"n{i}", draw(st.integers(1, 4)), draw(st.sampled_from(["A100", "V100"])),
                  draw(st.sampled_from([16, 40, 80]))) for i in range(draw(st.integers(1, 4)))]
    s = cluster(*nodes)
    uuids = [g.uuid for n in nodes for g in n.gpus]
    groups = [ResourceGroup(f"g{k}", nodes=frozenset(draw(st.sets(st.sampled_from(
                  [n.name for n in nodes]), max_size=2))),
                  gpus=frozenset(draw(st.sets(st.sampled_from(uuids), max_size=4))),
                  tenants=frozenset(draw(st.sets(st.sampled_from(["a", "b"]), max_size=1))))
              for k in range(draw(st.integers(0, 3)))]
    cat = Catalogue(GroupCatalog(groups), ClassCatalog([ResourceClass("big", BIG)]))
    for n in nodes:
        for j in range(len(n.gpus)):
            if draw(st.booleans()):
                hold_whole(s, f"x-{n.name}-{j}", n.name, j)
    demand = draw(st.sampled_from([whole(1), whole(2), shared(1, 4096, 20), shared(2, 0, 50)]))
    r = pod("p", demand, tenant=draw(st.sampled_from(["a", "b", None])),
            gpu_class=draw(st.sampled_from([None, "big"])))
    return s, cat, r


@settings(max_examples=200, deadline=None)
@given(grouped_worlds())
def test_a_placement_under_the_constraints_stays_in_its_group_and_class(
        world: tuple[ClusterState, Catalogue, PodRequest]) -> None:
    s, cat, r = world
    c = constraints_for(s, r, cat)
    if len(cat.groups) and c.blocked is None:
        assert c.group is not None and cat.groups.get(c.group).allows(r.tenant)
    p = Placer(make_policy("best-fit", PolicyConfig())).decide(s, r, random.Random(0), c)
    if p.allocation is None:
        return
    i = s.node_index(p.allocation.node)
    for x in p.allocation.slices:
        if c.gpu_mask is not None:
            assert c.gpu_mask[i, x.gpu_position]
        if r.gpu_class == "big":
            assert s.nodes[i].gpus[x.gpu_position].memory_mib > 40 * 1024
        if c.group is not None:
            assert cat.groups.get(c.group).holds(p.allocation.node, s.nodes[i].gpus[x.gpu_position])
    s.reserve(p.allocation)


@settings(max_examples=200, deadline=None)
@given(grouped_worlds())
def test_a_group_holds_the_pod_exactly_when_fit_finds_a_member_node(
        world: tuple[ClusterState, Catalogue, PodRequest]) -> None:
    s, cat, r = world
    class_mask = None if r.gpu_class is None else cat.classes.gpu_mask(s, r.gpu_class)
    for group in cat.groups:
        room = cat.groups.room(s, r, group, class_mask)
        c = cat.groups.constraints(s, group.name, class_mask)
        assert room.fits == bool(feasible(s, r, c)[0].any())
        assert room.free_milli <= room.capacity_milli
