"""The target workload a policy learns from what a cluster runs.

A scheduler does not know the workload to come; it sees the pods it has
placed and the pods it is asked about. ``observed_workload`` derives FGD's
target workload (``TargetWorkload.from_shapes``: the popular shapes covering
95 % of pods, each with its pods' mean memory) from

* the task shape of every allocation the state holds (``allocation_shape``),
* and the pods recently asked about (``recent``), each counted once: a pod
  that is both held and recent counts by its request, which also knows the GPU
  models it accepts (an allocation does not).

Only GPU pods are seen (the extender is not asked about CPU-only pods). With
fewer than ``MIN_SAMPLES`` of them the built-in ``BUILTIN_WORKLOAD`` is used: a
mix of shared slices (10-50 % of a GPU) and whole 1/2/4/8-GPU tasks with CPU
growing with GPU share, loosely shaped like public GPU-sharing cluster traces.
It is a starting point, not a measurement. The extender calls this at start-up
and every ``--workload-every`` seconds; ``gpupool simulate --learn`` does the
same from the arrivals, to measure what not knowing the workload costs.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.core.allocation import Allocation
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.workload import TargetWorkload, TaskShape, shape_of

MIN_SAMPLES = 50
"""GPU pods needed before the observed workload replaces the built-in one."""
MILLI = 1000

BUILTIN_WORKLOAD = TargetWorkload(
    shapes=(TaskShape(2000, 1, 100), TaskShape(4000, 1, 250), TaskShape(6000, 1, 500),
            TaskShape(8000, 1, 1000), TaskShape(16000, 2, 1000), TaskShape(32000, 4, 1000),
            TaskShape(64000, 8, 1000)),
    weights=(10, 20, 20, 30, 8, 8, 4),
)


def allocation_shape(state: ClusterState, alloc: Allocation) -> TaskShape | None:
    """The task shape of a held allocation (None without GPUs). A shared slice's share is
    the larger of its compute share and its memory share of the GPU it is on."""
    if not alloc.slices:
        return None
    if alloc.exclusive:
        return TaskShape(alloc.cpu_milli, len(alloc.gpu_uuids), MILLI)
    i = state.index.get(alloc.gpu_node)
    share = 1
    for s in alloc.slices:
        cap = state.nodes[i].gpus[s.gpu_position].memory_mib if i is not None and \
            s.gpu_position < len(state.nodes[i].gpus) else 16384
        share = max(share, s.core_pct * MILLI // CORE_UNITS_PER_GPU,
                    min(MILLI, -(-s.memory_mib * MILLI // max(cap, 1))))
    return TaskShape(alloc.cpu_milli, len(alloc.gpu_uuids), share)


ShapeMemo = dict[str, tuple[Allocation, TaskShape | None]]
"""Shapes of allocations already looked at, by key (the caller's, kept between calls)."""


def observed_shapes(state: ClusterState, recent: Iterable[PodRequest],
                    memo: ShapeMemo | None = None) -> list[tuple[TaskShape, int]]:
    """(shape, memory MiB) of every GPU pod seen, each pod once."""
    asked = {r.key: r for r in recent if r.gpus}
    seen = [(shape_of(r), r.memory_mib) for r in asked.values()]
    memo = {} if memo is None else memo
    for key, alloc in state.allocations.items():
        if key in asked:
            continue
        held = memo.get(key)
        if held is None or held[0] is not alloc:
            held = memo[key] = (alloc, allocation_shape(state, alloc))
        if held[1] is not None:
            seen.append((held[1], alloc.memory_mib))
    return seen


def observed_workload(state: ClusterState, recent: Iterable[PodRequest],
                      memo: ShapeMemo | None = None) -> tuple[TargetWorkload, str]:
    """(workload, where it came from) for the policy; ``memo`` (optional, the caller's)
    spares working out again the shapes of allocations seen in an earlier call."""
    seen = observed_shapes(state, recent, memo)
    if len(seen) < MIN_SAMPLES:
        return BUILTIN_WORKLOAD, f"built-in (only {len(seen)} GPU pods seen)"
    workload = TargetWorkload.from_shapes(s for s, _ in seen).with_memory(seen)
    return workload, f"observed ({len(seen)} GPU pods, {len(workload.shapes)} shapes)"
