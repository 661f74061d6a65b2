"""The built-in synthetic cluster and workload follow the published trace figures."""

from __future__ import annotations

from collections import Counter

import pytest

from gpupool.core.workload import shape_of
from gpupool.sim.failure import kind_of
from gpupool.sim.synthetic import (
    CPU_MILLI_LADDER,
    MEMORY_MIB_LADDER,
    NODE_TYPES,
    apportion,
    ladder_mean,
    synthetic_nodes,
    synthetic_scenario,
)


def test_node_types_at_full_scale_are_the_published_gpu_node_list() -> None:
    nodes = synthetic_nodes(1213)
    assert len(nodes) == 1213
    assert sum(len(n.gpus) for n in nodes) == 6212
    assert sum(n.cpu_milli for n in nodes) == 107_018_000
    assert sum(n.memory_mib for n in nodes) == 503_828_480
    models = Counter(n.model for n in nodes)
    assert models == {"G2": 549, "T4": 404, "G3": 39, "P100": 134, "V100M32": 30,
                      "V100M16": 55, "A10": 2}


def test_cpu_per_gpu_ratios_match_the_published_list() -> None:
    ratios: Counter[float] = Counter()
    for t in NODE_TYPES:
        ratios[t.cores / t.gpus] += t.count
    assert ratios == {4: 2, 8: 164, 10.25: 1, 12: 579, 16: 39, 24: 17, 32: 22, 52: 387, 128: 2}


def test_scaling_keeps_the_node_count_and_the_mix() -> None:
    assert apportion(10, [5, 3, 2]) == [5, 3, 2]
    assert apportion(3, [1, 1, 1, 1]) == [1, 1, 1, 0]
    nodes = synthetic_nodes(200)
    assert len(nodes) == 200
    assert Counter(n.model for n in nodes)["G2"] == round(549 * 200 / 1213)


def test_cpu_and_memory_ladders_match_published_min_median_mean_max() -> None:
    for ladder, low, median, mean, high in ((CPU_MILLI_LADDER, 1000, 11300, 10480, 120200),
                                            (MEMORY_MIB_LADDER, 0, 41560, 37236, 737280)):
        values = [v for v, _ in ladder]
        assert (min(values), max(values)) == (low, high)
        below = sum(w for v, w in ladder if v < median)
        assert below < 0.5 <= below + dict(ladder)[median]
        assert ladder_mean(ladder) == pytest.approx(mean, rel=0.005)


def test_workload_mix_follows_the_published_gpu_request_classes() -> None:
    s = synthetic_scenario(1213)
    assert len(s.pods) == 8152
    kinds = Counter(kind_of(r) for r in s.requests)
    shares = {k: n / len(s.pods) for k, n in kinds.items()}
    # published: CPU-only 13.3 %, sharing 37.8 %, one GPU 48.0 %, multi-GPU 0.9 %
    assert shares["cpu-only"] == pytest.approx(0.133, abs=0.015)
    assert shares["gpu-share"] == pytest.approx(0.378, abs=0.015)
    assert shares["one-gpu"] == pytest.approx(0.480, abs=0.015)
    assert shares["multi-gpu"] == pytest.approx(0.009, abs=0.004)
    # total demand near the published 98.0 % of capacity
    assert s.gpu_demand_milli / s.gpu_capacity_milli == pytest.approx(0.98, abs=0.04)


def test_the_workload_is_a_fixed_draw_with_few_shapes_and_ordered_times() -> None:
    a, b = synthetic_scenario(100), synthetic_scenario(100)
    assert a == b
    shapes = {shape_of(r) for r in a.requests}  # FGD's task shapes (the trace has 91)
    assert 20 < len(shapes) < 150
    created = [p.creation_s for p in a.pods]
    assert created == sorted(created)
    assert all(p.deletion_s is not None and p.creation_s is not None
               and p.deletion_s >= p.creation_s for p in a.pods)
