"""The snapshot victims are chosen on apart from the cache lock (``ClusterState.snapshot``):
it answers as the state it was taken of, and neither changes the other afterwards."""

from __future__ import annotations

import numpy as np

from gpupool.core.state import ClusterState
from gpupool.core.victims import Candidate, Room, Selection, below, select

from .builders import cluster, hold, hold_whole, node, pod, whole


def full() -> ClusterState:
    s = cluster(node("a", gpus=2), node("b", gpus=2), node("c", gpus=2))
    for name in ("a", "b", "c"):
        hold_whole(s, f"{name}0", name, 0)
        hold_whole(s, f"{name}1", name, 1)
    return s


def test_victims_chosen_on_a_snapshot_are_those_chosen_on_the_state() -> None:
    s = full()
    prio = {"a0": 5, "a1": 7, "b0": 3, "b1": 9, "c0": 4, "c1": 1}
    cands = [Candidate(a, prio[a.key]) for a in s.allocations.values()]
    request = pod("p", whole())
    on_state = select(Room(s, request, rows=[0, 1, 2]), cands, below(10))
    on_snapshot = select(Room(s.snapshot().state(), request, rows=[0, 1, 2]), cands,
                         below(10))
    assert isinstance(on_state, Selection) and on_state.keys == ("c1",)
    assert on_snapshot == on_state


def test_a_snapshot_holds_every_allocation_node_by_node() -> None:
    s = full()
    hold(s, "cpu-only", "b", cpu=1000)
    snap = s.snapshot().state()
    assert snap.allocations == s.allocations
    for name in ("a", "b", "c"):
        assert list(snap.allocations_on(name)) == list(s.allocations_on(name))
    assert np.array_equal(snap.unit_free, s.unit_free)
    assert np.array_equal(snap.free_milli, s.free_milli)


def test_changes_to_the_state_do_not_show_in_a_snapshot_nor_the_other_way() -> None:
    s = cluster(node("a", gpus=2))
    hold(s, "x", "a", (0, 10240, 50))
    snap = s.snapshot().state()
    s.release("x")
    hold_whole(s, "y", "a", 1)
    assert set(snap.allocations) == {"x"} and set(s.allocations) == {"y"}
    assert snap.unit_free[0, 1] == snap.unit_cap[0, 1] and s.unit_free[0, 1] == 0
    snap.release("x")  # a planner may release on its copy: the state does not move
    assert s.allocations.keys() == {"y"} and s.unit_free[0, 0] == s.unit_cap[0, 0]
    s.set_health("a", s.nodes[0].gpus[0].uuid, False)
    assert bool(snap.healthy[0, 0])


def test_a_snapshot_has_a_layout_of_its_own() -> None:
    s = full()
    snap = s.snapshot().state()
    assert snap.layout is not s.layout and snap.index == s.index
    assert snap.nodes == s.nodes and snap.nodes is not s.nodes


def test_a_snapshot_taken_while_changes_are_deferred_has_its_rows_up_to_date() -> None:
    s = cluster(node("a", gpus=2))
    with s.deferred():
        hold_whole(s, "x", "a", 0)
        snap = s.snapshot().state()
    assert snap.free_milli[0, 0] == 0 and snap.free_milli[0, 1] == 1000
    assert np.array_equal(snap.free_milli, s.free_milli)
