"""Model values (nodes, GPUs, cluster state) validate their input."""

from __future__ import annotations

import pytest

from gpupool.core.errors import InvalidInput, UnknownName
from gpupool.core.model import Gpu, Node, freeze_labels, uniform_node
from gpupool.core.state import ClusterState

from .builders import cluster, gpu, node


@pytest.mark.parametrize(("build", "needle"), [
    (lambda: Gpu("", 0, "A100", 1024), "needs a uuid"),
    (lambda: Gpu("g", 0, "A100", 0), "memory_mib must be positive, got 0"),
    (lambda: Gpu("g", -1, "A100", 1024), "index must be >= 0"),
    (lambda: Node("", 1000, 1024), "needs a name"),
    (lambda: Node("n", -1, 1024), "CPU and memory must be >= 0"),
    (lambda: Node("n", 1000, -1), "CPU and memory must be >= 0"),
    (lambda: Node("n", 1000, 1024, (gpu("g", 0), gpu("g", 1))), "duplicate GPU uuid"),
    (lambda: ClusterState([], memory_unit_mib=0), "memory unit must be a positive"),
    (lambda: ClusterState([Node("n", 1, 1, (Gpu("g", 0, "T4", 100),))]),
     "less memory than one 256 MiB unit"),
    (lambda: ClusterState([node("n"), node("n")]), "node n is already known"),
], ids=["GPU without uuid", "GPU without memory", "negative index", "node without name",
        "negative CPU", "negative memory", "duplicate uuid", "zero memory unit",
        "GPU smaller than a unit", "duplicate node"])
def test_bad_model_input_is_refused_with_the_reason(build: object, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        build()  # type: ignore[operator]


def test_a_gpu_exposes_builtin_facts_and_its_labels_to_selectors() -> None:
    g = Gpu("g", 3, "A100", 40960, labels=freeze_labels({"tier": "gold"}))
    assert g.label_map() == {"gpupool.io/model": "A100", "gpupool.io/memory": "40960Mi",
                             "gpupool.io/index": "3", "tier": "gold"}


def test_labels_are_frozen_sorted_so_equal_nodes_are_equal() -> None:
    assert freeze_labels({"b": "2", "a": "1"}) == (("a", "1"), ("b", "2"))
    assert freeze_labels(None) == ()
    assert node("n", labels={"x": "1", "y": "2"}) == node("n", labels={"y": "2", "x": "1"})


@pytest.mark.parametrize(("count", "numa"), [
    (1, [0]), (2, [0, 0]), (4, [0, 0, 1, 1]), (8, [0, 0, 0, 0, 1, 1, 1, 1])])
def test_a_uniform_node_splits_four_or_more_gpus_over_two_numa_nodes(count: int,
                                                                   numa: list[int]) -> None:
    n = uniform_node("n", 1000, 1024, count, "A100", 40960)
    assert [g.numa_node for g in n.gpus] == numa
    assert [g.index for g in n.gpus] == list(range(count)) and n.model == "A100"


def test_the_state_starts_with_everything_free_in_memory_units() -> None:
    s = cluster(node("n0", 2, gpu_gib=40), node("n1", 1, gpu_gib=16), unit_mib=512)
    assert s.unit_cap.tolist() == [[80, 80], [32, 0]]
    assert s.free_milli.tolist() == [[1000, 1000], [1000, -1]]
    assert s.present.tolist() == [[True, True], [True, False]]
    assert s.units_for(1) == 1 and s.units_for(512) == 1 and s.units_for(513) == 2
    assert s.usage().allocation_ratio == 0.0 and s.usage().gpus == 3


def test_unknown_nodes_and_gpus_are_named() -> None:
    s = cluster(node("n0", 1))
    with pytest.raises(UnknownName, match="node x is not known"):
        s.node_index("x")
    with pytest.raises(UnknownName, match="GPU nope is not on node n0"):
        s.gpu_position("n0", "nope")
