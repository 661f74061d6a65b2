"""Fit masks and the reasons a pod does not fit a node (every check, with numbers)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.fit import Constraints, explain, feasible, need_milli
from gpupool.core.model import Gpu, Node
from gpupool.core.reasons import Check, Reason
from gpupool.core.request import Affinity, GpuDemand, Mode, PodRequest
from gpupool.core.state import ClusterState

from .builders import cluster, hold, hold_whole, node, pod, shared, whole

Setup = Callable[[ClusterState], Constraints]


def nothing(s: ClusterState) -> Constraints:
    return Constraints()


def quota_blocked(s: ClusterState) -> Constraints:
    return Constraints(blocked=Reason("", Check.QUOTA, "quota of tenant t exceeded: 2 GPUs "
                                      "asked, 3 of 4 in use, 1 left", False))


def outside_group(s: ClusterState) -> Constraints:
    return Constraints(node_mask=np.zeros(1, np.bool_), group="g")


def one_gpu_of_class(s: ClusterState) -> Constraints:
    mask = np.zeros(s.present.shape, np.bool_)
    mask[0, 2] = True
    return Constraints(gpu_mask=mask)


def busy_cpu(s: ClusterState) -> Constraints:
    hold(s, "other", "n", cpu=30000, mem=250 * 1024)
    return Constraints()


def three_unhealthy(s: ClusterState) -> Constraints:
    for j in range(3):
        s.set_health("n", f"GPU-n-{j}", False)
    return Constraints()


def three_busy(s: ClusterState) -> Constraints:
    hold_whole(s, "other", "n", 0, 1, 2)
    return Constraints()


def every_gpu_70_pct(s: ClusterState) -> Constraints:
    hold(s, "other", "n", *((j, 0, 70) for j in range(4)))
    return Constraints()


def memory_only_slice(s: ClusterState) -> Constraints:
    hold(s, "other", "n", *((j, 1024, 0) for j in range(4)))
    return Constraints()


def class_gpu_busy(s: ClusterState) -> Constraints:
    hold_whole(s, "other", "n", 2)
    return one_gpu_of_class(s)


def other_path(s: ClusterState) -> Constraints:
    return Constraints(node_mask=np.zeros(1, np.bool_), excluded=np.ones(1, np.bool_),
                       excluded_why="the node serves its GPUs another way")


CASES: list[tuple[str, PodRequest, Setup, Check, str, bool]] = [
    ("a quota refusal applies to every node", pod("p", whole(2)), quota_blocked, Check.QUOTA,
     "quota of tenant t exceeded: 2 GPUs asked, 3 of 4 in use, 1 left", False),
    ("a node outside the group", pod("p", whole(1)), outside_group, Check.GROUP,
     "not in group g", True),
    ("a node another path serves", pod("p", whole(1)), other_path, Check.NODE_MODE,
     "the node serves its GPUs another way", True),
    ("another GPU model", pod("p", whole(1), models={"V100", "T4"}), nothing, Check.MODEL,
     "GPU model A100 is not one of T4|V100", True),
    ("too few GPUs of the class", pod("p", whole(2), gpu_class="big"), one_gpu_of_class,
     Check.CLASS, "2 GPUs of class big needed, 1 here", True),
    ("more GPUs than the node has", pod("p", whole(8)), nothing, Check.GPU_COUNT,
     "8 GPUs needed, node has 4", True),
    ("no MIG device of the profile", pod("p", GpuDemand(1, mode=Mode.EXCLUSIVE,
                                                       mig_profile="1g.10gb")),
     nothing, Check.MIG, "1 MIG devices 1g.10gb needed, node has 0", True),
    ("GPUs too small for the slice", pod("p", shared(1, 50000)), nothing, Check.GPU_SIZE,
     "1 GPUs with 50000 MiB needed, 0 GPUs here are that large", True),
    ("more CPU than the node has", pod("p", whole(1), cpu=40000), nothing, Check.CPU,
     "40000m CPU needed, 32000m of 32000m free", True),
    ("more CPU than is free", pod("p", whole(1), cpu=4000), busy_cpu, Check.CPU,
     "4000m CPU needed, 2000m of 32000m free", False),
    ("more memory than the node has", pod("p", whole(1), mem=300 * 1024), nothing,
     Check.MEMORY, "307200 MiB memory needed, 262144 of 262144 MiB free", True),
    ("more memory than is free", pod("p", whole(1), cpu=0, mem=8192), busy_cpu,
     Check.MEMORY, "8192 MiB memory needed, 6144 of 262144 MiB free", False),
    ("unhealthy GPUs", pod("p", whole(2)), three_unhealthy, Check.GPU_HEALTH,
     "2 healthy GPUs needed, 1 of 4 healthy", False),
    ("GPUs held by others", pod("p", whole(2)), three_busy, Check.GPU_FREE,
     "2 idle GPUs needed, 1 idle", False),
    ("no GPU with room for the slice", pod("p", shared(1, 0, 50)), every_gpu_70_pct,
     Check.GPU_FREE, "1 GPUs with 0 MiB + 50 % core needed, 0 have room (roomiest GPU: "
     "40960 MiB, 30 % core free)", False),
    ("a GPU with memory held is not idle", pod("p", whole(1)), memory_only_slice,
     Check.GPU_FREE, "1 idle GPUs needed, 0 idle", False),
    ("idle GPUs outside the class do not count", pod("p", whole(1), gpu_class="big"),
     class_gpu_busy, Check.GPU_FREE, "1 idle GPUs needed, 0 idle", False),
]


@pytest.mark.parametrize(("request_", "setup", "check", "message", "permanent"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_explain_names_the_failed_check_with_its_numbers(
        request_: PodRequest, setup: Setup, check: Check, message: str, permanent: bool) -> None:
    s = cluster(node("n", 4, "A100", 40))
    c = setup(s)
    reason = explain(s, request_, 0, c)
    assert reason is not None
    assert (reason.check, reason.message, reason.permanent) == (check, message, permanent)
    assert reason.sentence() == f"node n: {message}"
    assert not feasible(s, request_, c)[0][0]


COMMON = {  # what nodes in the same situation share: the node's own free amounts left out
    "more CPU than the node has": "40000m CPU needed, node has 32000m",
    "more memory than the node has": "307200 MiB memory needed, node has 262144 MiB",
    "more CPU than is free": "4000m CPU needed, less free",
    "more memory than is free": "8192 MiB memory needed, less free",
    "no GPU with room for the slice": "1 GPUs with 0 MiB + 50 % core needed, 0 have room",
    "no MIG device of the profile": "1 MIG devices 1g.10gb needed, fewer on the node",
}


@pytest.mark.parametrize(("name", "request_", "setup"), [c[:3] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_common_reason_leaves_out_what_only_this_node_has(
        name: str, request_: PodRequest, setup: Setup) -> None:
    s = cluster(node("n", 4, "A100", 40))
    reason = explain(s, request_, 0, setup(s))
    assert reason is not None
    assert reason.common() == COMMON.get(name, reason.message)
    assert "node n" not in reason.common()


MADE_ELSEWHERE = {Check.REMOTE, Check.GANG}
"""Checks ``explain`` never makes: ``core.serving``'s (cases in tests/core/test_serving.py)
and the extender's answers to gang members (tests/extender/test_gangs.py)."""


def test_every_check_the_core_makes_has_a_case() -> None:
    covered = {c[3] for c in CASES}
    assert covered | MADE_ELSEWHERE == set(Check)


@pytest.mark.parametrize("request_", [
    pod("p", whole(4)), pod("p", shared(4, 40960, 100)), pod("p", shared(1, 1, 1)),
    pod("p", cpu=32000, mem=256 * 1024), pod("p", shared(2, 100), shared(2, 100)),
    pod("p", shared(1, 0, 60), shared(1, 0, 40), affinity=Affinity.POD)],
    ids=["all GPUs whole", "all GPUs as full slices", "the smallest slice", "all CPU and memory",
         "two containers on two GPUs each", "two containers sharing one GPU"])
def test_a_request_that_fits_has_no_reason(request_: PodRequest) -> None:
    s = cluster(node("n", 4, "A100", 40))
    assert explain(s, request_, 0) is None and feasible(s, request_)[0][0]


# -- feasible and explain always agree ----------------------------------------------------


@st.composite
def worlds(draw: st.DrawFn) -> tuple[ClusterState, PodRequest, Constraints]:
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        gpus = tuple(Gpu(f"g{i}-{j}", j, draw(st.sampled_from(["A100", "V100"])),
                         draw(st.sampled_from([1024, 4096, 16384])), j % 2)
                     for j in range(draw(st.integers(0, 4))))
        nodes.append(Node(f"n{i}", draw(st.integers(0, 8)) * 1000, draw(st.integers(0, 8)) * 1024,
                          gpus))
    s = ClusterState(nodes, memory_unit_mib=draw(st.sampled_from([256, 1024])))
    for i, n in enumerate(nodes):
        for j, g in enumerate(n.gpus):
            mib, core = draw(st.integers(0, g.memory_mib)), draw(st.integers(0, 100))
            if mib or core:
                s.reserve(_slice(f"x{i}-{j}", n.name, g.uuid, j, mib, core))
            if draw(st.booleans()):
                s.set_health(n.name, g.uuid, False)
    return s, draw(requests()), draw(constraints(s))


def _slice(key: str, node_name: str, uuid: str, j: int, mib: int, core: int) -> Allocation:
    return Allocation(key, node_name, 0, 0, (Slice(uuid, j, mib, core),))


@st.composite
def requests(draw: st.DrawFn) -> PodRequest:
    demands = []
    for _ in range(draw(st.integers(0, 2))):
        if draw(st.booleans()):
            demands.append(GpuDemand(draw(st.integers(1, 3)), mode=Mode.EXCLUSIVE))
        else:
            demands.append(GpuDemand(draw(st.integers(1, 3)), draw(st.integers(1, 20000)),
                                     draw(st.integers(0, 50))))
    models = draw(st.sampled_from([None, frozenset({"A100"}), frozenset({"V100", "T4"})]))
    return PodRequest("p", draw(st.integers(0, 9)) * 1000, draw(st.integers(0, 9)) * 1024,
                      tuple(demands), models)


@st.composite
def constraints(draw: st.DrawFn, s: ClusterState) -> Constraints:
    n, w = s.present.shape
    node_mask = draw(st.none() | st.lists(st.booleans(), min_size=n, max_size=n).map(
        lambda v: np.array(v, np.bool_)))
    gpu_mask = draw(st.none() | st.lists(st.booleans(), min_size=n * w, max_size=n * w).map(
        lambda v: np.array(v, np.bool_).reshape(n, w)))
    return Constraints(node_mask, gpu_mask, None, group="g" if node_mask is not None else None)


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_a_node_is_feasible_exactly_when_explain_finds_no_reason(
        world: tuple[ClusterState, PodRequest, Constraints]) -> None:
    s, r, c = world
    mask, _ = feasible(s, r, c)
    for i in range(len(s.nodes)):
        reason = explain(s, r, i, c)
        assert bool(mask[i]) == (reason is None), (s.nodes[i], r, reason)
        if reason is not None:
            assert reason.node == s.nodes[i].name and reason.message


@pytest.mark.parametrize(("request_", "setup"), [c[1:3] for c in CASES] + [
    (pod("p", whole(1)), nothing), (pod("p", shared(2, 1024, 20)), every_gpu_70_pct)],
    ids=[c[0] for c in CASES] + ["fits whole", "fits shared"])
def test_feasible_among_rows_matches_the_full_masks_on_those_rows(
        request_: PodRequest, setup: Setup) -> None:
    s = cluster(node("n", 4, "A100", 40), node("m", 4, "A100", 40), node("k", 2, "T4", 16))
    c = setup(s)
    if c.node_mask is not None:
        c = Constraints(node_mask=np.resize(c.node_mask, 3), group=c.group)
    full, full_gpu = feasible(s, request_, c)
    for among in ([0], [2], [1, 2], [0, 1, 2], []):
        rows = np.array(among, np.int64)
        mask, gpu = feasible(s, request_, c, rows)
        keep = np.isin(np.arange(3), rows)
        assert (mask == (full & keep)).all()
        assert (gpu is None) == (full_gpu is None)
        if gpu is not None and full_gpu is not None:
            assert (gpu[rows] == full_gpu[rows]).all() and not gpu[~keep].any()


def test_need_milli_follows_the_layout_and_is_shared_read_only() -> None:
    s = cluster(node("n", 2, gpu_gib=40))
    demand = shared(1, 10 * 1024, 10)
    first = need_milli(s, demand)
    assert first.tolist() == [[250, 250]] and need_milli(s, demand) is first
    with pytest.raises(ValueError):
        first[0, 0] = 0
    s.replace_node(node("n", 2, gpu_gib=80))
    assert need_milli(s, demand).tolist() == [[125, 125]]
    assert need_milli(cluster(node("m", 1, gpu_gib=20)), demand).tolist() == [[500]]
    assert need_milli(s, shared(1, 10 * 1024, 60)).tolist() == [[600, 600]]
    assert need_milli(s, whole(1)).tolist() == [[1000, 1000]]
