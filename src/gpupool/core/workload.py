"""The target workload FGD measures fragmentation against (Weng et al., ATC 2023).

The most popular task shapes — (CPU, GPU count, GPU share per GPU) — that
together cover at least ``coverage`` (default 95 %) of the pods, each weighted
by how many pods have it. Weights are integers so fragmentation sums are exact.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from gpupool.core.errors import InvalidInput
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.request import PodRequest, merged_demand


@dataclass(frozen=True, slots=True)
class TaskShape:
    cpu_milli: int
    gpu_count: int
    gpu_milli: int  # share of each GPU; 1000 = whole
    models: frozenset[str] | None = None  # GPU models the task accepts (None: any)

    def describe(self) -> str:
        only = "" if self.models is None else f" on {'|'.join(sorted(self.models))}"
        return f"{self.cpu_milli}m CPU × {self.gpu_count} GPU × {self.gpu_milli}‰{only}"


@dataclass(frozen=True, slots=True)
class TargetWorkload:
    shapes: tuple[TaskShape, ...]
    weights: tuple[int, ...]
    memory_mib: tuple[int, ...] = ()  # mean memory of each shape's pods; (): not known

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights) or not self.shapes:
            raise InvalidInput("a target workload needs at least one shape and one weight each")
        if any(w <= 0 for w in self.weights):
            raise InvalidInput("target workload weights must be positive")
        if self.memory_mib and len(self.memory_mib) != len(self.shapes):
            raise InvalidInput("a target workload's memory figures must be one per shape")

    @property
    def total_weight(self) -> int:
        return sum(self.weights)

    @staticmethod
    def from_shapes(shapes: Iterable[TaskShape], coverage: float = 0.95) -> TargetWorkload:
        """Most common shapes first until their pods cover ``coverage`` of all pods."""
        if not 0 < coverage <= 1:
            raise InvalidInput("coverage must be in (0, 1]")
        counts = Counter(shapes)
        total = sum(counts.values())
        if total == 0:
            raise InvalidInput("cannot build a target workload from no pods")
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], _order(kv[0])))
        chosen: list[tuple[TaskShape, int]] = []
        covered = 0
        for shape, n in ranked:
            chosen.append((shape, n))
            covered += n
            if covered >= coverage * total:
                break
        return TargetWorkload(tuple(s for s, _ in chosen), tuple(n for _, n in chosen))

    @staticmethod
    def from_requests(requests: Iterable[PodRequest], coverage: float = 0.95) -> TargetWorkload:
        """The popular shapes of ``requests``, with the mean memory each shape's pods ask."""
        pairs = [(shape_of(r), r.memory_mib) for r in requests]
        chosen = TargetWorkload.from_shapes((s for s, _ in pairs), coverage)
        return chosen.with_memory(pairs)

    def with_memory(self, observed: Iterable[tuple[TaskShape, int]]) -> TargetWorkload:
        """This workload with each shape's mean memory among ``observed`` (shape, MiB)."""
        totals = {s: [0, 0] for s in self.shapes}
        for shape, memory in observed:
            if shape in totals:
                totals[shape][0] += memory
                totals[shape][1] += 1
        means = tuple(round(t / n) if n else 0 for t, n in (totals[s] for s in self.shapes))
        return TargetWorkload(self.shapes, self.weights, means)


def _order(s: TaskShape) -> tuple[int, int, int, tuple[str, ...]]:
    return (s.gpu_count, s.gpu_milli, s.cpu_milli, tuple(sorted(s.models or ())))


def shape_of(request: PodRequest) -> TaskShape:
    """The FGD task shape of a request; GPU share = the larger of its two dimensions
    (memory share is taken against a 16 GiB GPU when the GPU is not known). A GPU
    task keeps the GPU models it accepts; a CPU-only task has none (it runs anywhere)."""
    if not request.gpus:
        return TaskShape(request.cpu_milli, 0, 0)
    d = merged_demand(request)
    if d.exclusive:
        return TaskShape(request.cpu_milli, d.count, 1000, request.models)
    by_core = d.core_pct * 1000 // CORE_UNITS_PER_GPU
    by_mem = min(1000, -(-d.memory_mib * 1000 // 16384))
    return TaskShape(request.cpu_milli, d.count, max(by_core, by_mem, 1), request.models)
