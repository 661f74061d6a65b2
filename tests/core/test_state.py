"""ClusterState updates that the state machine drives at random, pinned down by hand."""

from __future__ import annotations

from dataclasses import replace

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
