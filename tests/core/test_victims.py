"""Victim selection: whom to evict so a pod fits (Room) or a quota amount comes back (Quota).

Table tests over small clusters (priorities, disruption budgets, multi-GPU and exclusive
pods, pods already leaving, needs no victim set can meet), then properties on random
clusters: the chosen set makes the pod fit by the core's own fit rules, it is the best set
by the documented order (checked against brute force), and the integer room model agrees
with the core on every set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.allocation import Allocation
from gpupool.core.fit import Constraints, feasible
from gpupool.core.quota import Amount, Charge
from gpupool.core.request import PodRequest
from gpupool.core.room import NodeRoom, share_milli
from gpupool.core.state import ClusterState
from gpupool.core.victims import (
    Candidate,
    Limits,
    NoVictims,
    Quota,
    Room,
    Selection,
    all_of,
    below,
    in_tenant,
    select,
)

from .builders import cluster, hold, hold_whole, node, pod, shared, whole

HIGH = 1000
DEFAULT = Limits()


@dataclass
class Case:
    """A cluster, the pods on it (key -> (priority, budgets, leaving)), a preemptor."""

    state: ClusterState
    request: PodRequest
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = field(default_factory=dict)
    budgets: dict[str, int] = field(default_factory=dict)
    priority: int = HIGH

    def run(self, limits: Limits = DEFAULT) -> Selection | NoVictims:
        return select(Room(self.state, self.request), self.candidates(), below(self.priority),
                      self.budgets, limits)

    def candidates(self) -> list[Candidate]:
        out = []
        for key, (prio, budgets, leaving) in self.pods.items():
            alloc = self.state.allocations[key]
            out.append(Candidate(alloc, prio, budgets=budgets, leaving=leaving))
        return out


def on(state: ClusterState, case_pods: dict[str, tuple[int, tuple[str, ...], bool]],
       alloc: Allocation, priority: int, budgets: tuple[str, ...] = (),
       leaving: bool = False) -> None:
    case_pods[alloc.key] = (priority, budgets, leaving)


def chosen(result: Selection | NoVictims) -> tuple[str | None, set[str]]:
    assert isinstance(result, Selection), result
    return result.node, set(result.keys)


# -- priorities ---------------------------------------------------------------------------------
def test_the_lowest_priority_pod_is_preempted_when_victim_counts_tie() -> None:
    s = cluster(node("a", gpus=1), node("b", gpus=1))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold_whole(s, "pa", "a", 0), 50)
    on(s, pods, hold_whole(s, "pb", "b", 0), 10)
    assert chosen(Case(s, pod("x", whole()), pods).run()) == ("b", {"pb"})


def test_fewer_victims_win_over_lower_priorities() -> None:
    s = cluster(node("a", gpus=1), node("b", gpus=1))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold_whole(s, "big", "a", 0), 50)
    on(s, pods, hold(s, "half1", "b", (0, 20480, 50)), 1)
    on(s, pods, hold(s, "half2", "b", (0, 20480, 50)), 1)
    assert chosen(Case(s, pod("x", whole()), pods).run()) == ("a", {"big"})


def test_the_highest_victim_priority_decides_then_the_next() -> None:
    s = cluster(node("a", gpus=2), node("b", gpus=2))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold_whole(s, "a0", "a", 0), 30)
    on(s, pods, hold_whole(s, "a1", "a", 1), 5)
    on(s, pods, hold_whole(s, "b0", "b", 0), 30)
    on(s, pods, hold_whole(s, "b1", "b", 1), 1)
    assert chosen(Case(s, pod("x", whole(2)), pods).run()) == ("b", {"b0", "b1"})


def test_pods_of_equal_or_higher_priority_are_never_preempted() -> None:
    s = cluster(node("a", gpus=1))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold_whole(s, "peer", "a", 0), HIGH)
    result = Case(s, pod("x", whole()), pods).run()
    assert isinstance(result, NoVictims) and "no node has room" in result.message


def test_least_share_freed_beyond_the_need_breaks_a_tie() -> None:
    s = cluster(node("a", gpus=1), node("b", gpus=1))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold(s, "fat", "a", (0, 30720, 60)), 1)
    on(s, pods, hold(s, "lean", "b", (0, 12288, 20)), 1)
    hold(s, "keep-a", "a", (0, 8192, 30))  # higher priority, not a candidate
    hold(s, "keep-b", "b", (0, 26624, 70))
    result = Case(s, pod("x", shared(1, 8192, 10)), pods).run()
    assert chosen(result) == ("b", {"lean"})
    assert isinstance(result, Selection) and result.freed_milli < 750 and result.exact


# -- disruption budgets ---------------------------------------------------------------------------
def test_a_budget_allowing_one_disruption_is_not_asked_for_two() -> None:
    s = cluster(node("a", gpus=2), node("b", gpus=2))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold_whole(s, "web0", "a", 0), 1, ("web",))
    on(s, pods, hold_whole(s, "web1", "a", 1), 1, ("web",))
    on(s, pods, hold_whole(s, "db0", "b", 0), 20)
    on(s, pods, hold_whole(s, "db1", "b", 1), 20)
    assert chosen(Case(s, pod("x", whole(2)), pods, budgets={"web": 1}).run()) == \
        ("b", {"db0", "db1"})
    assert chosen(Case(s, pod("x", whole(2)), pods, budgets={"web": 2}).run()) == \
        ("a", {"web0", "web1"})


def test_a_budget_that_allows_no_disruption_protects_its_pods() -> None:
    s = cluster(node("a", gpus=1))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold_whole(s, "guarded", "a", 0), 1, ("web",))
    result = Case(s, pod("x", whole()), pods, budgets={"web": 0}).run()
    assert isinstance(result, NoVictims)
    unknown = Case(s, pod("x", whole()), pods, budgets={}).run()  # a budget never read
    assert isinstance(unknown, NoVictims)


def test_budgets_counted_across_a_set_refuse_what_no_order_could_do() -> None:
    s = cluster(node("a", gpus=2))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold_whole(s, "w0", "a", 0), 1, ("web",))
    on(s, pods, hold_whole(s, "w1", "a", 1), 1, ("web",))
    result = Case(s, pod("x", whole(2)), pods, budgets={"web": 1}).run()
    assert isinstance(result, NoVictims) and "budgets" in result.message


# -- multi-GPU and exclusive pods -----------------------------------------------------------------
def test_one_two_gpu_victim_beats_two_one_gpu_victims() -> None:
    s = cluster(node("a", gpus=2), node("b", gpus=2))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold_whole(s, "pair", "a", 0, 1), 10)
    on(s, pods, hold_whole(s, "one0", "b", 0), 1)
    on(s, pods, hold_whole(s, "one1", "b", 1), 1)
    assert chosen(Case(s, pod("x", whole(2)), pods).run()) == ("a", {"pair"})


def test_an_exclusive_preemptor_needs_every_slice_of_its_gpu_gone() -> None:
    s = cluster(node("a", gpus=1))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold(s, "s1", "a", (0, 1024, 10)), 1)
    on(s, pods, hold(s, "s2", "a", (0, 1024, 10)), 2)
    on(s, pods, hold(s, "s3", "a", (0, 1024, 10)), 3)
    assert chosen(Case(s, pod("x", whole()), pods).run()) == ("a", {"s1", "s2", "s3"})
    assert chosen(Case(s, pod("x", shared(1, 38912, 50)), pods).run()) == ("a", {"s1"})


def test_a_shared_preemptor_of_two_gpus_frees_room_on_two_different_gpus() -> None:
    s = cluster(node("a", gpus=3))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold(s, "g0", "a", (0, 30720, 80)), 1)
    on(s, pods, hold(s, "g1", "a", (1, 30720, 80)), 2)
    on(s, pods, hold(s, "g2", "a", (2, 30720, 80)), 3)
    assert chosen(Case(s, pod("x", shared(2, 20480, 30)), pods).run()) == ("a", {"g0", "g1"})


def test_pods_on_gpus_the_preemptor_may_not_use_are_never_victims() -> None:
    s = cluster(node("a", gpus=2))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold_whole(s, "allowed", "a", 0), 20)
    on(s, pods, hold_whole(s, "other", "a", 1), 1)
    mask = np.zeros(s.present.shape, np.bool_)
    mask[0, 0] = True  # a class of one GPU
    result = select(Room(s, pod("x", whole()), Constraints(gpu_mask=mask)),
                    Case(s, pod("x", whole()), pods).candidates(), below(HIGH))
    assert chosen(result) == ("a", {"allowed"})


def test_cpu_is_freed_too_when_the_node_lacks_it() -> None:
    s = cluster(node("a", gpus=2, cpu=4000))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold(s, "gpu-light", "a", (0, 1024, 10), cpu=500), 1)
    on(s, pods, hold(s, "cpu-heavy", "a", (1, 1024, 10), cpu=3000), 5)
    assert chosen(Case(s, pod("x", shared(1, 1024, 10), cpu=2000), pods).run()) == \
        ("a", {"cpu-heavy"})


# -- leaving pods, and needs that cannot be met ---------------------------------------------------
def test_pods_already_leaving_make_room_and_are_never_chosen() -> None:
    s = cluster(node("a", gpus=1))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold_whole(s, "going", "a", 0), 1, leaving=True)
    result = Case(s, pod("x", whole()), pods).run()
    assert isinstance(result, Selection) and result.victims == () and result.node == "a"


@pytest.mark.parametrize("request_", [
    pod("x", shared(1, 50 * 1024, 10)),       # larger than any GPU
    pod("x", whole(3)),                        # more GPUs than a node has
    pod("x", whole(), cpu=64000),              # more CPU than a node has
    pod("x", whole(), models={"H100"}),        # a model no node has
    pod("x"),                                  # no GPU at all
], ids=["gpu-too-small", "too-few-gpus", "too-little-cpu", "wrong-model", "no-gpu"])
def test_a_need_no_victim_set_can_meet_is_refused_with_a_reason(request_: PodRequest) -> None:
    s = cluster(node("a", gpus=2))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold_whole(s, "p0", "a", 0), 1)
    on(s, pods, hold_whole(s, "p1", "a", 1), 1)
    result = Case(s, request_, pods).run()
    assert isinstance(result, NoVictims) and result.message


def test_an_unhealthy_gpu_is_not_worth_emptying() -> None:
    s = cluster(node("a", gpus=1))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold_whole(s, "p0", "a", 0), 1)
    s.set_health("a", s.nodes[0].gpus[0].uuid, False)
    assert isinstance(Case(s, pod("x", whole()), pods).run(), NoVictims)


def test_candidates_the_state_does_not_hold_are_ignored() -> None:
    s = cluster(node("a", gpus=1))
    hold_whole(s, "real", "a", 0)
    ghost = Candidate(Allocation("ghost", "a", 0, 0, s.allocations["real"].slices), 1)
    assert isinstance(select(Room(s, pod("x", whole())), [ghost], below(HIGH)), NoVictims)


def test_only_the_nodes_asked_about_are_searched() -> None:
    s = cluster(node("a", gpus=1), node("b", gpus=1))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    on(s, pods, hold_whole(s, "pa", "a", 0), 1)
    on(s, pods, hold_whole(s, "pb", "b", 0), 50)
    case = Case(s, pod("x", whole()), pods)
    assert chosen(select(Room(s, case.request, rows=[1]), case.candidates(), below(HIGH))) \
        == ("b", {"pb"})


def test_past_the_trial_limit_the_answer_is_minimal_and_says_it_may_not_be_the_best() -> None:
    s = cluster(node("a", gpus=1))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    for k in range(10):
        on(s, pods, hold(s, f"s{k}", "a", (0, 4096, 5)), k)
    case = Case(s, pod("x", shared(1, 12288, 10)), pods)
    exact = case.run()
    cut = case.run(Limits(trials=3))
    assert isinstance(exact, Selection) and exact.exact and len(exact.victims) == 3
    assert isinstance(cut, Selection) and not cut.exact
    for spared in cut.victims:  # minimal: sparing any victim leaves too little room
        rest = [c.allocation for c in cut.victims if c is not spared]
        assert NodeRoom.of(s, case.request, Constraints(), 0, rest, []) is None


# -- Quota: an amount back, scoped by a predicate -------------------------------------------------
def quota_pool(s: ClusterState) -> list[Candidate]:
    out = []
    for key, node_name, gpus, tenant, prio in [("t1-a", "a", 1, "t1", 1), ("t1-b", "a", 2, "t1", 5),
                                               ("t2-a", "b", 1, "t2", 1)]:
        alloc = hold_whole(s, key, node_name, *range(len(s.nodes[0].gpus) - gpus,
                                                     len(s.nodes[0].gpus))) \
            if key != "t1-a" else hold_whole(s, key, node_name, 0)
        out.append(Candidate(alloc, prio, Charge(Amount(gpus, 0, 100 * gpus), tenant)))
    return out


def test_an_amount_of_quota_comes_back_from_the_fewest_pods_of_the_scope() -> None:
    s = cluster(node("a", gpus=3), node("b", gpus=3))
    pool = quota_pool(s)
    result = select(Quota(s, Amount(gpus=2)), pool, in_tenant("t1"))
    assert isinstance(result, Selection) and set(result.keys) == {"t1-b"} and result.node is None
    both = select(Quota(s, Amount(gpus=3)), pool, all_of(in_tenant("t1"), below(10)))
    assert isinstance(both, Selection) and set(both.keys) == {"t1-a", "t1-b"}
    assert isinstance(select(Quota(s, Amount(gpus=4)), pool, in_tenant("t1")), NoVictims)
    low = select(Quota(s, Amount(gpus=1)), pool)
    assert isinstance(low, Selection) and set(low.keys) == {"t1-a"}  # lowest priority, first key


# -- properties ------------------------------------------------------------------------------
@st.composite
def random_case(draw: st.DrawFn) -> Case:
    s = cluster(node("a", gpus=2), node("b", gpus=2), node("c", gpus=3))
    pods: dict[str, tuple[int, tuple[str, ...], bool]] = {}
    for k in range(draw(st.integers(0, 9))):
        name = draw(st.sampled_from(["a", "b", "c"]))
        j = draw(st.integers(0, 1))
        mib, core = draw(st.sampled_from([(4096, 10), (10240, 25), (20480, 50), (40960, 100)]))
        try:
            alloc = hold(s, f"p{k}", name, (j, mib, core), cpu=draw(st.sampled_from([0, 8000])))
        except Exception:  # no room for it: the cluster is as full as it gets
            continue
        pods[alloc.key] = (draw(st.integers(0, 3)), draw(st.sampled_from([(), ("web",)])),
                           draw(st.booleans()) and k % 4 == 0)
    request = pod("x", draw(st.sampled_from([whole(), whole(2), shared(1, 20480, 30),
                                             shared(2, 10240, 20), shared(1, 4096, 90)])),
                  cpu=draw(st.sampled_from([1000, 20000])))
    return Case(s, request, pods, {"web": draw(st.integers(0, 2))}, priority=2)


def brute_force(case: Case) -> tuple[object, ...] | None:
    """The best rank over every subset of eligible pods on every node (the module's order)."""
    s = case.state
    best: tuple[object, ...] | None = None
    cands = case.candidates()
    for i, n in enumerate(s.nodes):
        here = [c for c in cands if c.allocation.node == n.name and not c.leaving and
                c.priority < case.priority and all(case.budgets.get(b, 0) > 0 for b in c.budgets)]
        leaving = [c.allocation for c in cands if c.allocation.node == n.name and c.leaving]
        room = NodeRoom.of(s, case.request, Constraints(), i, [c.allocation for c in here],
                           leaving)
        if room is None:
            continue
        for size in range(len(here) + 1):
            for chosen_ in combinations(range(len(here)), size):
                used = sum(1 for k in chosen_ if "web" in here[k].budgets)
                if used > case.budgets.get("web", 0) or not room.fits(chosen_):
                    continue
                victims = [here[k] for k in chosen_]
                rank = (len(victims), tuple(sorted((c.priority for c in victims), reverse=True)),
                        sum(room.shares[k] for k in chosen_) - room.needed(), i)
                best = rank if best is None or rank < best else best
    return best


@settings(max_examples=150, deadline=None)
@given(random_case())
def test_the_choice_makes_the_pod_fit_and_no_set_is_better(case: Case) -> None:
    result = case.run()
    expected = brute_force(case)
    if isinstance(result, NoVictims):
        assert expected is None
        return
    assert expected is not None and result.exact
    s = case.state
    i = s.index[result.node or ""]
    gone = [c for c in case.candidates() if c.allocation.node == result.node and c.leaving]
    for victim in (*result.victims, *gone):
        s.release(victim.key)
    assert feasible(s, case.request)[0][i], "the pod fits once the victims are gone"
    victims = result.victims
    room_share = sum(share_milli(s, v.allocation) for v in victims)
    assert room_share == result.freed_milli
    assert (len(victims), tuple(sorted((v.priority for v in victims), reverse=True)),
            result.freed_milli - result.needed_milli, i) == expected


@settings(max_examples=150, deadline=None)
@given(random_case(), st.data())
def test_the_integer_room_model_agrees_with_the_core_on_every_set(case: Case,
                                                                   data: st.DataObject) -> None:
    s = case.state
    for i, n in enumerate(s.nodes):
        allocs = [a for a in s.allocations_on(n.name)]
        room = NodeRoom.of(s, case.request, Constraints(), i, allocs, [])
        if room is None:
            continue
        chosen_ = tuple(sorted(data.draw(st.sets(st.integers(0, max(len(allocs) - 1, 0)),
                                                 max_size=len(allocs)))))
        chosen_ = tuple(k for k in chosen_ if k < len(allocs))
        assert room.fits(chosen_) == room.verified(chosen_)
