"""ClusterState updates that the state machine drives at random, pinned down by hand."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gpupool.core.errors import OverCommit

from .builders import cluster, hold, hold_whole, node


def test_a_gpu_turning_unhealthy_keeps_the_pods_that_run_on_it() -> None:
    s = cluster(node("n", 2))
    hold_whole(s, "a", "n", 0)
    sick = node("n", 2)
    sick = replace(sick, gpus=(replace(sick.gpus[0], healthy=False), sick.gpus[1]))
    assert s.replace_node(sick) == []
    assert "a" in s.allocations and not s.healthy[0, 0]
    assert s.free_milli[0].tolist() == [-1, 1000]
    assert s.replace_node(node("n", 2)) == []  # healthy again: still held, not free
    assert s.free_milli[0].tolist() == [0, 1000]


def test_a_node_that_shrinks_gives_back_what_no_longer_fits() -> None:
    s = cluster(node("n", 4, cpu=8000))
    a = hold_whole(s, "a", "n", 3)
    b = hold(s, "b", "n", (0, 1024, 10), cpu=6000)
    lost = s.replace_node(node("n", 2, cpu=8000))
    assert lost == [a] and set(s.allocations) == {"b"}
    lost = s.replace_node(node("n", 2, cpu=4000))
    assert lost == [b] and not s.allocations
    assert s.cpu_free.tolist() == [4000]


def test_removing_a_node_releases_its_allocations() -> None:
    s = cluster(node("n0", 1), node("n1", 1))
    a = hold_whole(s, "a", "n1", 0)
    epoch = s.epoch
    assert s.remove_node("n1") == [a]
    assert list(s.allocations) == [] and [n.name for n in s.nodes] == ["n0"]
    assert s.epoch > epoch



def test_replacing_a_node_with_an_identical_one_keeps_the_layout() -> None:
    state = cluster(node("n", gpus=2))
    epoch = state.epoch
    assert state.replace_node(node("n", gpus=2)) == []
    assert state.epoch == epoch
    state.set_health("n", "GPU-n-0", False)
    state.replace_node(node("n", gpus=2))  # same value, but it brings GPU 0 back to healthy
    assert state.epoch > epoch and bool(state.healthy[0, 0])



def test_deferred_reservations_end_in_the_state_one_by_one_reaches() -> None:
    one_by_one, batched = (cluster(node("n0", 2), node("n1", 2)) for _ in range(2))
    plan = [("a", "n0", (0, 1024, 10)), ("b", "n0", (0, 2048, 30)), ("c", "n1", (1, 512, 5))]
    for key, name, piece in plan:
        hold(one_by_one, key, name, piece)
    untouched, before = batched.free_milli.copy(), batched.version.copy()
    with batched.deferred():
        for key, name, piece in plan:
            hold(batched, key, name, piece)
        with pytest.raises(OverCommit):  # checks stay exact inside: 40 % + 70 % > 100 %
            hold(batched, "d", "n0", (0, 1024, 70))
        assert np.array_equal(batched.free_milli, untouched)  # derived values lag inside
    for name in ("free_milli", "unit_free", "core_free", "cpu_free"):
        assert np.array_equal(getattr(batched, name), getattr(one_by_one, name)), name
    assert (batched.version > before).all() and batched.changes == int(batched.version.sum())
