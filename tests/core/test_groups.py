"""Resource groups (seed 001): values, masks, best-fit choice and automatic building."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.errors import InvalidInput, UnknownName
from gpupool.core.groupplan import DemandEstimate, GroupPlan, build_groups, slug
from gpupool.core.groups import GroupCatalog, ResourceGroup
from gpupool.core.model import Node
from gpupool.core.quota import Amount, Charge, Limit, QuotaBook
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState

from .builders import cluster, gpu, hold, hold_whole, mixed, node, pod, shared, whole


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"name": "Team-A"}, "lower-case"),
    ({"name": ""}, "lower-case"),
    ({"name": "a" * 64}, "1-63"),
    ({"name": "-a"}, "starting and ending"),
    ({"name": "ok", "nodes": "n1"}, "not the string"),
    ({"name": "ok", "gpus": {""}}, "empty name"),
], ids=["upper case", "empty", "64 characters", "leading dash", "a string as a set",
        "an empty uuid"])
def test_a_group_with_a_bad_field_is_refused_with_the_reason(kwargs: dict[str, object],
                                                             needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        ResourceGroup(**kwargs)  # type: ignore[arg-type]


def test_a_group_accepts_any_iterable_and_stores_frozensets() -> None:
    g = ResourceGroup("g", nodes=["n1", "n2"], tenants=("t",))  # type: ignore[arg-type]
    assert g.nodes == frozenset({"n1", "n2"}) and isinstance(g.tenants, frozenset)
    assert hash(g) == hash(ResourceGroup("g", nodes=frozenset({"n2", "n1"}),
                                         tenants=frozenset({"t"})))


@pytest.mark.parametrize(("tenants", "tenant", "allowed"), [
    ((), "anyone", True),
    ((), None, True),
    (("a", "b"), "a", True),
    (("a", "b"), "c", False),
    (("a",), None, False),
], ids=["open group, named tenant", "open group, no tenant", "listed tenant",
        "unlisted tenant", "closed group, no tenant"])
def test_who_may_draw_from_a_group(tenants: tuple[str, ...], tenant: str | None,
                                   allowed: bool) -> None:
    assert ResourceGroup("g", tenants=frozenset(tenants)).allows(tenant) is allowed


@pytest.mark.parametrize(("group_models", "pod_models", "suits"), [
    ((), None, True),
    ((), {"V100"}, True),
    (("A100",), None, True),
    (("A100",), {"A100", "H100"}, True),
    (("A100",), {"V100"}, False),
], ids=["any/any", "any group, V100 pod", "A100 group, any pod", "overlap", "disjoint"])
def test_a_group_suits_a_pod_when_gpu_models_overlap(group_models: tuple[str, ...],
                                                     pod_models: set[str] | None,
                                                     suits: bool) -> None:
    models = None if pod_models is None else frozenset(pod_models)
    assert ResourceGroup("g", models=frozenset(group_models)).suits(models) is suits


def test_updating_a_group_returns_a_new_value_and_keeps_the_old() -> None:
    g = ResourceGroup("g", nodes=frozenset({"n1", "n2"}), gpus=frozenset({"u1"}),
                      tenants=frozenset({"a"}))
    h = g.updated(add_nodes=["n3"], remove_nodes=["n1"], add_gpus=["u2"], remove_gpus=["u1"],
                  tenants=["b", "c"], models=["A100"])
    assert (h.nodes, h.gpus, h.tenants, h.models) == (
        frozenset({"n2", "n3"}), frozenset({"u2"}), frozenset({"b", "c"}), frozenset({"A100"}))
    assert g.nodes == {"n1", "n2"} and g.tenants == {"a"}
    assert g.updated(add_nodes=["n1"]) == g


# -- masks ------------------------------------------------------------------------------


def test_a_member_node_brings_all_its_gpus_and_a_member_gpu_only_itself() -> None:
    s = cluster(node("n0", 2), node("n1", 2), node("n2", 2))
    cat = GroupCatalog([ResourceGroup("g", nodes=frozenset({"n0"}),
                                      gpus=frozenset({"GPU-n2-1"}))])
    assert cat.gpu_mask(s, "g").tolist() == [[True, True], [False, False], [False, True]]
    assert cat.node_mask(s, "g").tolist() == [True, False, True]


def test_a_group_meant_for_a_model_holds_only_gpus_of_that_model() -> None:
    s = cluster(mixed("n0", gpu("a", 0, "A100"), gpu("v", 1, "V100")))
    cat = GroupCatalog([ResourceGroup("g", nodes=frozenset({"n0"}), models=frozenset({"V100"}))])
    assert cat.gpu_mask(s, "g").tolist() == [[False, True]]


def test_group_masks_are_cached_per_epoch_and_rebuilt_on_change() -> None:
    s = cluster(node("n0", 2))
    cat = GroupCatalog([ResourceGroup("g", nodes=frozenset({"n0", "n1"}))])
    first = cat.gpu_mask(s, "g")
    assert cat.gpu_mask(s, "g") is first
    assert not first.flags.writeable
    hold_whole(s, "p", "n0", 0)  # a reservation does not change membership
    assert cat.gpu_mask(s, "g") is first
    s.add_nodes([node("n1", 2)])  # a layout change does
    assert cat.node_mask(s, "g").tolist() == [True, True]
    cat.put(ResourceGroup("g", nodes=frozenset({"n1"})))  # so does an update of the group
    assert cat.node_mask(s, "g").tolist() == [False, True]


def test_an_unknown_group_is_named_with_the_known_ones() -> None:
    cat = GroupCatalog([ResourceGroup("a"), ResourceGroup("b")])
    with pytest.raises(UnknownName, match=r"group c does not exist \(known: a, b\)"):
        cat.get("c")
    assert cat.remove("a") is not None and cat.remove("a") is None and "a" not in cat


# -- best fit -----------------------------------------------------------------------------


def _best_fit_world() -> tuple[GroupCatalog, ClusterState]:
    s = cluster(node("big", 8), node("mid", 4), node("small", 2), node("tiny", 1),
                node("volta", 4, "V100", 16))
    cat = GroupCatalog([
        ResourceGroup("big", nodes=frozenset({"big"})),
        ResourceGroup("mid", nodes=frozenset({"mid"})),
        ResourceGroup("small", nodes=frozenset({"small"})),
        ResourceGroup("private", nodes=frozenset({"tiny"}), tenants=frozenset({"x"})),
        ResourceGroup("volta", nodes=frozenset({"volta"}), models=frozenset({"V100"})),
    ])
    return cat, s


@pytest.mark.parametrize(("request_", "chosen"), [
    (pod("p", whole(2), tenant="t"), "small"),
    (pod("p", whole(3), tenant="t"), "mid"),
    (pod("p", whole(5), tenant="t"), "big"),
    (pod("p", whole(1), tenant="t"), "small"),
    (pod("p", whole(1), tenant="x"), "private"),
    (pod("p", whole(1), tenant="t", models={"V100"}), "volta"),
    (pod("p", whole(4), tenant="t", models={"V100"}), "volta"),
    (pod("p", shared(1, core=50), tenant="t"), "small"),
], ids=["2 GPUs go to the 2-GPU group", "3 GPUs to the 4-GPU group", "5 GPUs to the 8-GPU group",
        "1 GPU to the smallest open group", "the private group is closest for its tenant",
        "a V100 pod to the V100 group", "4 V100 GPUs fill the V100 group",
        "a half-GPU slice to the smallest group"])
def test_best_fit_picks_the_group_whose_room_is_closest_above_the_demand(request_: PodRequest,
                                                                         chosen: str) -> None:
    cat, s = _best_fit_world()
    choice = cat.choose(s, request_, None)
    assert choice.group is not None and choice.group.name == chosen


def test_best_fit_moves_on_when_the_closest_group_is_full() -> None:
    cat, s = _best_fit_world()
    hold_whole(s, "a", "small", 0)
    choice = cat.choose(s, pod("p", whole(2), tenant="t"))
    assert choice.group is not None and choice.group.name == "mid"
    small = next(r for r in choice.rooms if r.group.name == "small")
    assert (small.free_milli, small.capacity_milli, small.fits) == (1000, 2000, False)
    assert "group small: 1 of 2 GPUs free" in small.refusal


def test_a_partly_used_group_is_the_best_fit_for_a_slice_that_fits_its_remainder() -> None:
    cat, s = _best_fit_world()
    hold(s, "a", "mid", (0, 0, 30), (1, 40960, 100), (2, 40960, 100),
         (3, 40960, 100))
    choice = cat.choose(s, pod("p", shared(1, core=50), tenant="t"))
    mid = next(r for r in choice.rooms if r.group.name == "mid")
    assert (mid.free_milli, mid.demand_milli) == (700, 500)
    assert choice.group is not None and choice.group.name == "mid"


def test_when_no_group_can_hold_the_pod_every_group_says_why_with_numbers() -> None:
    cat, s = _best_fit_world()
    choice = cat.choose(s, pod("p", whole(9), tenant="t"))
    assert choice.group is None
    refusals = choice.refusals()
    assert len(refusals) == 4  # private is not the tenant's
    assert any("group big: 8 of 8 GPUs free" in r for r in refusals)
    assert any("group volta: 4 of 4 GPUs free" in r for r in refusals)
    assert all(r.permanent for r in choice.rooms)


def test_a_gpu_model_the_group_is_not_meant_for_refuses_it_permanently() -> None:
    cat, s = _best_fit_world()
    choice = cat.choose(s, pod("p", whole(1), tenant="t", models={"H100"}))
    volta = next(r for r in choice.rooms if r.group.name == "volta")
    assert choice.group is None and volta.permanent
    assert "volta is meant for V100, the pod allows H100" in volta.refusal


def test_a_group_whose_quota_is_spent_is_skipped() -> None:
    cat, s = _best_fit_world()
    quotas = QuotaBook()
    quotas.set_group_limit("small", Limit(gpus=1))
    quotas.charge("a", Charge(Amount(1, 40960, 100), group="small"))
    choice = cat.choose(s, pod("p", whole(1), tenant="t"), None, quotas,
                        Charge(Amount(1, 40960, 100), "t"))
    assert choice.group is not None and choice.group.name == "mid"
    small = next(r for r in choice.rooms if r.group.name == "small")
    assert "quota of group small exceeded: 1 GPUs asked, 1 of 1 in use" in small.refusal


def test_a_class_mask_narrows_the_group_to_the_gpus_of_the_class() -> None:
    cat, s = _best_fit_world()
    only_mid = np.zeros(s.present.shape, np.bool_)
    only_mid[1, :] = True
    choice = cat.choose(s, pod("p", whole(1), tenant="t"), only_mid)
    assert choice.group is not None and choice.group.name == "mid"


# -- building groups --------------------------------------------------------------------------


def _fleet() -> list[Node]:
    return [node("a1", 8, "A100"), node("a2", 4, "A100"), node("v1", 4, "V100-SXM2", 16),
            node("v2", 2, "V100-SXM2", 16)]


def _members(plan: GroupPlan, name: str) -> list[str]:
    group = next(g for g in plan.groups if g.name == name)
    return sorted(group.gpus)


def test_automatic_groups_take_the_tightest_node_for_each_estimate_largest_first() -> None:
    plan = build_groups(_fleet(), [
        DemandEstimate("t1", 6, "A100"), DemandEstimate("t2", 4, "A100"),
        DemandEstimate("t3", 2, "V100-SXM2"), DemandEstimate("t4", 3)])
    assert _members(plan, "t1-a100") == [f"GPU-a1-{i}" for i in range(6)]
    assert _members(plan, "t2-a100") == [f"GPU-a2-{i}" for i in range(4)]
    assert _members(plan, "t4") == ["GPU-v1-0", "GPU-v1-1", "GPU-v1-2"]
    assert _members(plan, "t3-v100-sxm2") == ["GPU-v2-0", "GPU-v2-1"]
    assert _members(plan, "shared-a100") == ["GPU-a1-6", "GPU-a1-7"]
    assert _members(plan, "shared-v100-sxm2") == ["GPU-v1-3"]
    t1 = next(g for g in plan.groups if g.name == "t1-a100")
    assert t1.tenants == {"t1"} and t1.models == {"A100"}
    assert plan.unmet == ()


def test_an_estimate_larger_than_any_node_spans_nodes_biggest_first() -> None:
    plan = build_groups(_fleet(), [DemandEstimate("t", 10, "A100")],
                        shared=False)
    assert _members(plan, "t-a100") == [f"GPU-a1-{i}" for i in range(8)] + [
        "GPU-a2-0", "GPU-a2-1"]
    assert [g.name for g in plan.groups] == ["t-a100"]


def test_permissions_limit_the_nodes_an_estimate_may_take_and_shortfalls_are_reported() -> None:
    plan = build_groups(_fleet(), [DemandEstimate("t", 6, "A100")],
                        permitted={"t": frozenset({"a2"})}, shared=False)
    assert _members(plan, "t-a100") == [f"GPU-a2-{i}" for i in range(4)]
    assert plan.unmet == (("t", 2),)


def test_unhealthy_gpus_are_not_put_in_groups() -> None:
    n = mixed("n", gpu("ok", 0), gpu("bad", 1, healthy=False))
    plan = build_groups([n], [DemandEstimate("t", 2)])
    assert _members(plan, "t") == ["ok"] and plan.unmet == (("t", 1),)


@pytest.mark.parametrize(("estimates", "needle"), [
    ([DemandEstimate("t", 1, "A100"), DemandEstimate("t", 2, "A100")], "same group t-a100"),
], ids=["two estimates for one tenant and model"])
def test_conflicting_estimates_are_refused(estimates: list[DemandEstimate], needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        build_groups(_fleet(), estimates)


@pytest.mark.parametrize(("tenant", "gpus"), [("", 1), ("t", 0), ("t", -2)],
                         ids=["no tenant", "zero GPUs", "negative GPUs"])
def test_a_bad_estimate_is_refused(tenant: str, gpus: int) -> None:
    with pytest.raises(InvalidInput):
        DemandEstimate(tenant, gpus)


@pytest.mark.parametrize(("model", "expected"), [
    ("A100-SXM4-80GB", "a100-sxm4-80gb"), ("Tesla V100 (16 GB)", "tesla-v100-16-gb"),
    ("***", "any"), ("x" * 80, "x" * 40)])
def test_model_names_become_dns_label_fragments(model: str, expected: str) -> None:
    assert slug(model) == expected
