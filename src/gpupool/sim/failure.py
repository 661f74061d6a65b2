"""Counting pods that found no node, cheaply (the hot loop never explains per node).

A failure is counted by the *kind* of pod (CPU-only, GPU-sharing, one whole
GPU, several GPUs) and by a coarse *reason* the core answers with one extra
feasibility mask: ``gpu`` when no node has the GPU room even ignoring CPU and
memory, ``cpu-memory`` when some node has the GPU room but not the CPU or
memory beside it. (Per-node sentences come from ``gpupool.core.fit.explain``;
the simulator does not ask for them, they cost a pass per node.) The reason is
cached per GPU demand until the state changes (``changed``): past 100 % of
capacity most pods fail, many in a row.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from gpupool.core.fit import feasible
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.workload import shape_of

KINDS = ("cpu-only", "gpu-share", "one-gpu", "multi-gpu")
REASONS = ("gpu", "cpu-memory")


def kind_of(request: PodRequest) -> str:
    """CPU-only, GPU-sharing (a fraction of one GPU), one whole GPU, or several GPUs."""
    if not request.gpus:
        return "cpu-only"
    shape = shape_of(request)
    if shape.gpu_count > 1:
        return "multi-gpu"
    return "one-gpu" if shape.gpu_milli >= 1000 else "gpu-share"


class FailureTally:
    """Failed pods of one run: arrival index, kind and reason."""

    def __init__(self, state: ClusterState):
        self.state = state
        self.at: list[int] = []
        self.kinds: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self._known: dict[tuple[object, ...], str] = {}

    def changed(self) -> None:
        """The cluster state moved on (a reservation or a release): forget cached reasons."""
        if self._known:
            self._known = {}

    def record(self, index: int, request: PodRequest) -> None:
        self.at.append(index)
        self.kinds[kind_of(request)] += 1
        self.reasons[self.reason(request)] += 1

    def reason(self, request: PodRequest) -> str:
        if not request.gpus:
            return "cpu-memory"
        key = (request.gpus, request.models, request.selector, request.gpu_class,
               request.affinity)
        known = self._known.get(key)
        if known is None:
            gpu_only = dataclasses.replace(request, cpu_milli=0, memory_mib=0)
            mask, _ = feasible(self.state, gpu_only)
            known = self._known[key] = "cpu-memory" if mask.any() else "gpu"
        return known

    @property
    def total(self) -> int:
        return len(self.at)

    def before(self, count: int) -> int:
        """Failures among the first ``count`` pods."""
        return sum(1 for i in self.at if i < count)

    def by_kind(self) -> dict[str, int]:
        return {k: self.kinds[k] for k in KINDS}

    def by_reason(self) -> dict[str, int]:
        return {r: self.reasons[r] for r in REASONS}
