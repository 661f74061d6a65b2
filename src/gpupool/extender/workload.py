"""The target workload FGD-type policies measure fragmentation against, in the extender.

Derived from what the cluster runs: the task shape (CPU, GPU count, GPU share)
of every gpupool allocation the cache holds plus the pods recently seen in
filter calls, via ``TargetWorkload.from_shapes`` (the popular shapes covering
95 % of pods). With fewer than ``MIN_SAMPLES`` such pods the built-in
``BUILTIN_WORKLOAD`` is used: a mix of shared slices (10-50 % of a GPU) and
whole 1/2/4/8-GPU tasks with CPU growing with GPU share, loosely shaped like
public GPU-sharing cluster traces. It is a starting point, not a measurement;
the extender re-derives the workload from the live cluster as pods arrive
(``Extender.refresh_policy``).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.core.allocation import Allocation
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.workload import TargetWorkload, TaskShape, shape_of

MIN_SAMPLES = 50
MILLI = 1000

BUILTIN_WORKLOAD = TargetWorkload(
    shapes=(TaskShape(2000, 1, 100), TaskShape(4000, 1, 250), TaskShape(6000, 1, 500),
            TaskShape(8000, 1, 1000), TaskShape(16000, 2, 1000), TaskShape(32000, 4, 1000),
            TaskShape(64000, 8, 1000)),
    weights=(10, 20, 20, 30, 8, 8, 4),
)


def allocation_shape(state: ClusterState, alloc: Allocation) -> TaskShape | None:
    """The task shape of a held allocation (None without GPUs)."""
    if not alloc.slices:
        return None
    if alloc.exclusive:
        return TaskShape(alloc.cpu_milli, len(alloc.gpu_uuids), MILLI)
    i = state.index.get(alloc.node)
    share = 1
    for s in alloc.slices:
        cap = state.nodes[i].gpus[s.gpu_position].memory_mib if i is not None and \
            s.gpu_position < len(state.nodes[i].gpus) else 16384
        share = max(share, s.core_pct * MILLI // CORE_UNITS_PER_GPU,
                    min(MILLI, -(-s.memory_mib * MILLI // max(cap, 1))))
    return TaskShape(alloc.cpu_milli, len(alloc.gpu_uuids), share)


def observed_workload(state: ClusterState, recent: Iterable[PodRequest]
                      ) -> tuple[TargetWorkload, str]:
    """(workload, where it came from) for the policy."""
    shapes = [s for s in (allocation_shape(state, a) for a in state.allocations.values())
              if s is not None]
    shapes += [shape_of(r) for r in recent if r.gpus]
    if len(shapes) < MIN_SAMPLES:
        return BUILTIN_WORKLOAD, f"built-in (only {len(shapes)} GPU pods seen)"
    workload = TargetWorkload.from_shapes(shapes)
    return workload, f"observed ({len(shapes)} GPU pods, {len(workload.shapes)} shapes)"
