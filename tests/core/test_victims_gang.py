"""Room for a whole gang (``core.victims_gang``): the pods of lower priority whose eviction
lets every member of the quorum be placed, a victim gang only whole, disruption budgets
honoured, and nobody when the room would still not suffice."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.allocation import Allocation
from gpupool.core.eligibility import Catalogue
from gpupool.core.errors import OverCommit
from gpupool.core.gang import Gang, Together, reserve_gang
from gpupool.core.policies import make_policy
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.quota import Limit
from gpupool.core.state import ClusterState
from gpupool.core.victims import Candidate, NoVictims, below
from gpupool.core.victims_gang import GangRoom, GangSelection, select_gang

from .builders import cluster, hold, hold_whole, node, pod, shared, whole

POLICY = make_policy("best-fit", PolicyConfig())
HIGH = 1000


def gang_of(n: int, *demand: object, together: Together = Together.ANYWHERE,
            tenant: str | None = None) -> Gang:
    return Gang("new", tuple(pod(f"g{i}", *demand, tenant=tenant)  # type: ignore[arg-type]
                             for i in range(n)), together=together)


def cand(alloc: Allocation, priority: int = 0, budgets: tuple[str, ...] = (),
         gang: str = "", leaving: bool = False) -> Candidate:
    return Candidate(alloc, priority, None, budgets, leaving, 0.0, gang)


def choose(state: ClusterState, gang: Gang, cands: list[Candidate],
           budgets: dict[str, int] | None = None, catalogue: Catalogue | None = None
           ) -> GangSelection | NoVictims:
    return select_gang(GangRoom(state, gang, POLICY, random.Random(0), catalogue), cands,
                       below(HIGH), budgets)


def placed_after(state: ClusterState, chosen: GangSelection) -> None:
    """The placement holds on the state once the victims are gone (never over-commits)."""
    for v in chosen.victims:
        assert state.release(v.key) == v.allocation
    reserve_gang(state, chosen.placement)
    assert int(state.core_free.min()) >= 0 and int(state.unit_free.min()) >= 0


def full(state: ClusterState, name: str, gpus: int = 4, priority: int = 0,
         gang: str = "", prefix: str = "") -> list[Candidate]:
    """Every GPU of ``name`` held whole by one pod each."""
    return [cand(hold_whole(state, f"{prefix or name}-{j}", name, j), priority, gang=gang)
            for j in range(gpus)]


def test_a_gang_of_higher_priority_gets_room_for_every_member_from_the_fewest_pods() -> None:
    state = cluster(node("a"), node("b"))
    cands = full(state, "a") + full(state, "b")
    chosen = choose(state, gang_of(3, whole(1)), cands)
    assert isinstance(chosen, GangSelection), chosen
    assert len(chosen.victims) == 3 and len(chosen.placement.allocations) == 3
    placed_after(state, chosen)


def test_only_pods_of_lower_priority_are_victims() -> None:
    state = cluster(node("a"))
    cands = full(state, "a", priority=HIGH)  # equal to the gang's: never a victim
    chosen = choose(state, gang_of(2, whole(1)), cands)
    assert isinstance(chosen, NoVictims)
    assert "would still not make room for 2 of its members" in chosen.message


def test_nothing_is_chosen_when_the_room_would_still_not_suffice() -> None:
    state = cluster(node("a"))
    cands = [*full(state, "a", gpus=3),
             cand(hold_whole(state, "vip", "a", 3), priority=HIGH)]  # one GPU stays taken
    assert isinstance(choose(state, gang_of(4, whole(1)), cands), NoVictims)
    assert isinstance(choose(state, gang_of(5, whole(1)), full(cluster(node("b")), "b")),
                      NoVictims)  # more GPUs than the cluster has


def test_a_disruption_budget_is_honoured_across_the_members() -> None:
    state = cluster(node("a"), node("b"))
    guarded = [cand(hold_whole(state, f"db-{j}", "a", j), budgets=("db",)) for j in range(4)]
    cands = guarded + full(state, "b", priority=HIGH)
    assert isinstance(choose(state, gang_of(2, whole(1)), cands, {"db": 1}), NoVictims)
    chosen = choose(state, gang_of(2, whole(1)), cands, {"db": 2})
    assert isinstance(chosen, GangSelection) and len(chosen.victims) == 2


def test_leaving_pods_make_the_room_and_nobody_is_chosen() -> None:
    state = cluster(node("a"))
    cands = [cand(hold_whole(state, f"p{j}", "a", j), leaving=j < 2) for j in range(4)]
    chosen = choose(state, gang_of(2, whole(1)), cands)
    assert isinstance(chosen, GangSelection) and chosen.victims == ()
    assert len(chosen.placement.allocations) == 2


def test_a_gang_over_its_quota_is_not_helped_by_evictions() -> None:
    state = cluster(node("a"))
    catalogue = Catalogue()
    catalogue.quotas.set_tenant_limit("lab", Limit(gpus=1))
    chosen = choose(state, gang_of(2, whole(1), tenant="lab"), full(state, "a"),
                    catalogue=catalogue)
    assert isinstance(chosen, NoVictims) and "quota of tenant lab exceeded" in chosen.message


def test_a_gang_member_is_a_victim_only_with_its_whole_gang() -> None:
    state = cluster(node("a"), node("b"))  # one GPU per node held by gang old, the rest
    old = [cand(hold_whole(state, "old-0", "a", 0), gang="old"),
           cand(hold_whole(state, "old-1", "b", 0), gang="old")]
    cands = old + [cand(hold_whole(state, f"{n}-{j}", n, j), HIGH)  # by pods of higher
                   for n in ("a", "b") for j in (1, 2, 3)]  # priority
    chosen = choose(state, gang_of(1, whole(1)), cands)
    assert isinstance(chosen, GangSelection)
    assert set(chosen.keys) == {"old-0", "old-1"}  # one GPU needed, the gang goes whole
    placed_after(state, chosen)


def test_a_gang_with_a_member_that_may_not_go_is_never_a_victim_in_part() -> None:
    state = cluster(node("a"), node("b"))
    cands = [cand(hold_whole(state, "old-0", "a", 0), gang="old"),
             cand(hold_whole(state, "old-1", "b", 0), HIGH, gang="old")]  # may not go
    cands += [cand(hold_whole(state, f"{n}-{j}", n, j), HIGH)
              for n in ("a", "b") for j in (1, 2, 3)]
    assert isinstance(choose(state, gang_of(1, whole(1)), cands), NoVictims)
    budgeted = [cand(c.allocation, c.priority, ("db",), c.gang) for c in cands[:2]]
    cands[:2] = [cand(c.allocation, 0, c.budgets, c.gang) for c in budgeted]
    assert isinstance(choose(state, gang_of(1, whole(1)), cands, {"db": 1}), NoVictims)
    assert isinstance(choose(state, gang_of(1, whole(1)), cands, {"db": 2}), GangSelection)


def test_pods_outside_gangs_are_taken_before_a_gang() -> None:
    state = cluster(node("a"))
    cands = [cand(hold_whole(state, "old-0", "a", 0), priority=0, gang="old"),
             cand(hold_whole(state, "single", "a", 1), priority=500)]
    cands += [cand(hold_whole(state, f"vip-{j}", "a", j), HIGH) for j in (2, 3)]
    chosen = choose(state, gang_of(1, whole(1)), cands)
    assert isinstance(chosen, GangSelection) and chosen.keys == ("single",)


def test_a_gang_together_on_one_node_takes_its_victims_there() -> None:
    state = cluster(node("a"), node("b"))
    cands = [cand(hold(state, f"a-{j}", "a", (j, 20480, 50)), priority=10) for j in range(4)]
    cands += [cand(hold(state, f"b-{j}", "b", (j, 20480, 50)), priority=0) for j in range(2)]
    cands += [cand(hold_whole(state, f"vip-{j}", "b", j), HIGH) for j in (2, 3)]
    gang = gang_of(4, shared(1, 30720, 60), together=Together.NODE)
    chosen = choose(state, gang, cands)
    assert isinstance(chosen, GangSelection)
    assert chosen.placement.where == "a" and {a.node for a in chosen.placement.allocations} \
        == {"a"}
    assert set(chosen.keys) == {f"a-{j}" for j in range(4)}
    placed_after(state, chosen)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1500), st.integers(0, 2)),
                min_size=12, max_size=20),
       st.integers(2, 6), st.sampled_from([10240, 20480, 40960]))
def test_a_selection_always_places_the_quorum_and_takes_gangs_whole(
        pods: list[tuple[int, int, int]], size: int, mib: int) -> None:
    state = cluster(node("a"), node("b"))
    cands: list[Candidate] = []
    gangs: dict[str, list[Candidate]] = {}
    for k, (position, priority, team) in enumerate(pods):
        n = "ab"[k % 2]
        try:
            alloc = hold(state, f"p{k}", n, (position, 20480, 50))
        except OverCommit:  # the GPU is full: this pod is not there
            continue
        gang = f"team{team}" if team else ""
        cands.append(cand(alloc, priority, gang=gang))
        gangs.setdefault(gang, []).append(cands[-1])
    chosen = choose(state, gang_of(size, shared(1, mib, 50)), cands)
    if isinstance(chosen, NoVictims):
        return
    assert all(v.priority < HIGH for v in chosen.victims)
    for name, members in gangs.items():
        if name:
            taken = {m.key for m in members} & set(chosen.keys)
            assert taken in (set(), {m.key for m in members})  # whole or not at all
    placed_after(state, chosen)
    assert len(chosen.placement.allocations) == size
