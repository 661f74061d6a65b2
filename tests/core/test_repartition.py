"""MIG on demand: the repartition the core chooses, and what it never touches."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core import mig
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.fit import Constraints, feasible
from gpupool.core.model import Node
from gpupool.core.placement import Placer
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.repartition import apply, layouts, plan
from gpupool.core.state import ClusterState

from .builders import pod, whole
from .test_mig import asks, mig_node


def hold_device(s: ClusterState, key: str, node: str, uuid: str) -> None:
    i = s.node_index(node)
    j = s.gpu_position(node, uuid)
    s.reserve(Allocation(key, node, 0, 0, (Slice(uuid, j, int(s.unit_cap[i, j]) * 256, 100),),
                         True))


def test_nothing_is_planned_for_a_pod_that_fits_or_asks_no_mig_device() -> None:
    s = ClusterState([mig_node(layout={0: [("1g.10gb", 0)]})])
    assert plan(s, asks("1g.10gb")) is None
    assert plan(s, pod("w", whole(1))) is None


def test_a_busy_gpu_grows_beside_its_held_devices() -> None:
    s = ClusterState([mig_node(layout={0: [("1g.10gb", 0), ("1g.10gb", 1)]}, gpus=1)])
    hold_device(s, "a", "n", "MIG-GPU-n-0-1g.10gb@0")
    chosen = plan(s, asks("3g.40gb"))
    assert chosen is not None and len(chosen.changes) == 1
    change = chosen.changes[0]
    assert change.destroy == ()
    assert mig.describe_layout(change.after) == "1g.10gb@0,1g.10gb@1,3g.40gb@4"
    assert change.reason \
        == "pod p asks 1 MIG device 3g.40gb and no GPU offers them: 3g.40gb@4 created"
    apply(s, chosen)
    assert feasible(s, asks("3g.40gb"))[0][0]
    assert "a" in s.allocations


def test_a_gpu_with_a_held_device_is_never_rebuilt() -> None:
    s = ClusterState([mig_node(layout={0: [("4g.40gb", 0), ("3g.40gb", 4)]}, gpus=1)])
    hold_device(s, "a", "n", "MIG-GPU-n-0-3g.40gb@4")
    assert plan(s, asks("7g.80gb")) is None
    assert plan(s, asks("1g.10gb")) is None


def test_an_idle_gpu_is_rebuilt_when_no_gpu_can_grow() -> None:
    s = ClusterState([mig_node(layout={0: [("4g.40gb", 0), ("3g.40gb", 4)],
                                       1: [("7g.80gb", 0)]})])
    hold_device(s, "a", "n", "MIG-GPU-n-1-7g.80gb@0")
    chosen = plan(s, asks("2g.20gb"))
    assert chosen is not None
    (change,) = chosen.changes
    assert change.gpu == "GPU-n-0"
    assert mig.describe_layout(change.destroy) == "4g.40gb@0,3g.40gb@4"
    assert mig.describe_layout(change.after) == "2g.20gb@4"  # 4g.40gb@0 can still come
    assert "its idle MIG devices 4g.40gb@0,3g.40gb@4 destroyed" in change.reason


def test_growing_is_preferred_to_rebuilding_and_cut_gpus_to_empty_ones() -> None:
    s = ClusterState([mig_node(layout={0: [("1g.10gb", 0)], 1: [], 2: [("7g.80gb", 0)]},
                               gpus=3)])
    chosen = plan(s, asks("2g.20gb"))
    assert chosen is not None
    assert [c.gpu for c in chosen.changes] == ["GPU-n-0"]
    assert chosen.changes[0].destroy == ()


def test_the_layout_chosen_strands_least_for_the_demand_to_come() -> None:
    s = ClusterState([mig_node(layout={0: []}, gpus=1)])
    # 3g at 0 leaves 4..7 free: a 4g cannot start there, a 3g can (stranding nothing for 3g)
    chosen = plan(s, asks("3g.40gb"), weights={"3g.40gb": 1.0})
    assert chosen is not None and chosen.changes[0].create[0].start == 0
    for_small = plan(s, asks("1g.10gb"), weights={"4g.40gb": 1.0, "1g.10gb": 1.0})
    assert for_small is not None and for_small.changes[0].create[0].start == 4


def test_a_pod_asking_several_devices_gets_them_on_one_node() -> None:
    s = ClusterState([mig_node("a", layout={0: [("3g.40gb", 0)]}, gpus=1),
                      mig_node("b", layout={0: [], 1: []})])
    chosen = plan(s, asks("4g.40gb", 2))
    assert chosen is not None and chosen.node == "b"
    assert sorted(c.gpu for c in chosen.changes) == ["GPU-b-0", "GPU-b-1"]
    apply(s, chosen)
    decision = Placer(make_policy("best-fit", PolicyConfig())).decide(
        s, asks("4g.40gb", 2), random.Random(0))
    assert decision.allocation is not None and decision.allocation.node == "b"


def test_nodes_the_pod_cannot_use_are_not_repartitioned() -> None:
    s = ClusterState([mig_node("a", layout={0: []}, gpus=1), mig_node("b", layout={0: []})])
    only_b = Constraints(node_mask=np.array([False, True]))
    chosen = plan(s, asks("1g.10gb"), only_b)
    assert chosen is not None and chosen.node == "b"
    assert plan(s, asks("1g.10gb", cpu=64000)) is None
    by_rule = plan(s, asks("1g.10gb"), allowed=lambda node, gpu: node.name == "b")
    assert by_rule is not None and by_rule.node == "b"
    assert plan(s, asks("1g.10gb"), allowed=lambda node, gpu: False) is None


def test_gpus_without_the_profile_or_unhealthy_are_left_alone() -> None:
    h200 = mig_node("h", layout={0: []}, gpus=1, model="H200", gib=141)
    assert plan(ClusterState([h200]), asks("1g.10gb")) is None
    assert plan(ClusterState([h200]), asks("1g.18gb")) is not None
    sick = ClusterState([mig_node(layout={0: []}, gpus=1)])
    node = sick.nodes[0]
    from dataclasses import replace
    sick.replace_node(replace(node, gpus=(replace(node.gpus[0], healthy=False),)))
    assert plan(sick, asks("1g.10gb")) is None


PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PROFILES), st.integers(1, 2), st.booleans()),
                min_size=1, max_size=25))
def test_repartitions_never_break_nvidias_rules_nor_touch_a_held_device(
        steps: list[tuple[str, int, bool]]) -> None:
    s = ClusterState([mig_node("a", layout={0: [], 1: []}), mig_node("b", layout={0: []},
                                                                    gpus=1)])
    placer = Placer(make_policy("best-fit", PolicyConfig()))
    for k, (profile, count, release) in enumerate(steps):
        held = {sl.gpu_uuid for a in s.allocations.values() for sl in a.slices}
        request = asks(profile, count, key=f"p{k}")
        chosen = plan(s, request)
        if chosen is not None:
            gone = {f"MIG-{d.parent}-{d.profile}@{d.start}" for c in chosen.changes
                    for d in c.destroy}
            assert not gone & held
            apply(s, chosen)  # raises if an allocation were dropped
            assert feasible(s, request)[0].any()
        decision = placer.decide(s, request, random.Random(k))
        assert (decision.allocation is not None) == (chosen is not None or
                                                      feasible(s, request)[0].any())
        if decision.allocation is not None:
            s.reserve(decision.allocation)
        if release and s.allocations:
            s.release(sorted(s.allocations)[0])
        for node in s.nodes:
            _layouts_are_valid(node)


def _layouts_are_valid(node: Node) -> None:
    for parent, devices in layouts(node).items():
        gpu = next(g for g in node.gpus if g.uuid == parent)
        geometry = mig.geometry_of(gpu.model, gpu.memory_mib)
        assert geometry is not None
        assert mig.layout_problem(geometry, devices) == ""
