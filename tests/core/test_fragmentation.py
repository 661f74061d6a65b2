"""``FragmentationModel.measure`` against the definition, node by node and shape by shape."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpupool.core.fragmentation import DENSE_ENTRIES, DeadShare, FragmentationModel
from gpupool.core.model import uniform_node
from gpupool.core.state import ClusterState
from gpupool.core.workload import TargetWorkload, TaskShape


def by_definition(workload: TargetWorkload, free: list[list[int]], cpu: list[int],
                  models: list[str] | None = None) -> list[int]:
    """F_n = Σ_t w_t · F_n(t), written out as the module docstring states it."""
    out = []
    for n, (gpus, cpu_free) in enumerate(zip(free, cpu, strict=True)):
        usable = [max(f, 0) for f in gpus]
        total = 0
        for shape, w in zip(workload.shapes, workload.weights, strict=True):
            fits = sum(1 for f in gpus if f >= shape.gpu_milli)
            access = shape.models is None or models is None or models[n] in shape.models
            runs = shape.gpu_count != 0 and fits >= shape.gpu_count and \
                cpu_free >= shape.cpu_milli and access
            left = sum(u for u, f in zip(usable, gpus, strict=True) if f < shape.gpu_milli) \
                if runs else sum(usable)
            total += w * left
        out.append(total)
    return out


MODELS = ("A", "B", "C", "D")
MODEL_SETS = (None, None, None, frozenset("A"), frozenset("AB"), frozenset("BCD"))


def random_workload(rng: random.Random, model_sets: tuple[frozenset[str] | None, ...] = (None,)
                    ) -> TargetWorkload:
    shapes = [TaskShape(rng.choice([0, 500, 1000, 4000, 8000, 16000, 64000]),
                        rng.choice([0, 1, 1, 2, 4, 8, 9, 12]),
                        rng.choice([1, 100, 250, 500, 750, 1000]), rng.choice(model_sets))
              for _ in range(rng.randint(1, 40))]
    return TargetWorkload(tuple(shapes), tuple(rng.randint(1, 50) for _ in shapes))


@pytest.mark.parametrize("dense_entries", [DENSE_ENTRIES, 0], ids=["table", "search"])
@pytest.mark.parametrize("seed", range(40))
def test_measure_matches_the_definition(seed: int, dense_entries: int) -> None:
    """Both ways of answering which shapes run: the precomputed table (every workload
    seen in practice) and the search a huge workload falls back to."""
    rng = random.Random(seed)
    workload = random_workload(rng)
    model = FragmentationModel(workload, dense_entries)
    for _ in range(3):  # one model, several widths and row counts (the tables per width)
        rows, width = rng.randint(0, 12), rng.randint(1, 10)
        free = [[rng.choice([-1, 0, 1, 99, 100, 250, 499, 500, 1000, rng.randint(0, 1000)])
                 for _ in range(width)] for _ in range(rows)]
        cpu = [rng.choice([-4000, 0, 500, 999, 1000, 16000, 10**12, rng.randint(0, 70000)])
               for _ in range(rows)]
        got = model.measure(np.array(free, np.int64).reshape(rows, width),
                            np.array(cpu, np.int64))
        assert got.dtype == np.int64
        assert got.tolist() == by_definition(workload, free, cpu)


def node_models(models: list[str]) -> ClusterState:
    return ClusterState([uniform_node(f"n{i}", 1000, 1024, 1, m, 16384)
                         for i, m in enumerate(models)])


@pytest.mark.parametrize("dense_entries", [DENSE_ENTRIES, 0], ids=["table", "search"])
@pytest.mark.parametrize("seed", range(30))
def test_a_shape_bound_to_other_gpu_models_counts_the_whole_free_share(
        seed: int, dense_entries: int) -> None:
    """Shapes that accept only some GPU models, on nodes of random models: each node's
    access class must give exactly the definition's answer, models seen late included."""
    rng = random.Random(1000 + seed)
    workload = random_workload(rng, MODEL_SETS)
    model = FragmentationModel(workload, dense_entries)
    for _ in range(3):
        rows, width = rng.randint(1, 12), rng.randint(1, 10)
        models = [rng.choice((*MODELS, "E")) for _ in range(rows)]
        free = [[rng.choice([-1, 0, 100, 250, 500, 999, 1000]) for _ in range(width)]
                for _ in range(rows)]
        cpu = [rng.choice([0, 999, 4000, 10**12]) for _ in range(rows)]
        classes = model.access(node_models(models))
        got = model.measure(np.array(free, np.int64), np.array(cpu, np.int64), classes)
        assert got.tolist() == by_definition(workload, free, cpu, models)


def test_a_workload_without_model_bound_shapes_has_one_access_class() -> None:
    model = FragmentationModel(TargetWorkload((TaskShape(1000, 1, 500),), (1,)))
    assert not model.model_bound
    assert model.access(node_models(["A", "B"])) is None


def test_a_node_where_every_shape_runs_keeps_only_its_slivers() -> None:
    workload = TargetWorkload((TaskShape(1000, 1, 500), TaskShape(2000, 2, 1000)), (3, 1))
    model = FragmentationModel(workload)
    got = model.measure(np.array([[1000, 1000, 200, -1]]), np.array([8000]))
    # 500-share tasks use the two idle GPUs, the 200 left is a sliver for both shapes
    assert got.tolist() == [3 * 200 + 1 * 200]
    starved = model.measure(np.array([[1000, 1000, 200, -1]]), np.array([0]))
    assert starved.tolist() == [4 * 2200]  # no CPU: nothing runs, all free share is lost


def test_cpu_only_shapes_count_the_whole_free_share() -> None:
    model = FragmentationModel(TargetWorkload((TaskShape(1000, 0, 0),), (5,)))
    assert model.measure(np.array([[300, -1], [0, 0]]), np.array([10**6, 0])).tolist() == \
        [5 * 300, 0]


def test_dead_share_counts_free_share_below_the_line_weight_times_more() -> None:
    workload = TargetWorkload((TaskShape(1000, 1, 500), TaskShape(0, 0, 0)), (3, 1))
    plain = FragmentationModel(workload)
    dead = FragmentationModel(workload, dead=DeadShare(below=220, weight=2.0))
    free = np.array([[210, 220, 1000, -1], [0, 50, 219, 600]])
    cpu = np.array([10**6, 10**6])
    extra = dead.measure(free, cpu) - plain.measure(free, cpu)
    assert extra.tolist() == [2 * 4 * 210, 2 * 4 * (50 + 219)]  # W = 4; 220 is not below
