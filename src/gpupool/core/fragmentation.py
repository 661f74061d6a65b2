"""GPU fragmentation of nodes against a target workload (Weng et al., ATC 2023).

For node n and task shape t with per-GPU share ``m_t``, GPU count ``k_t`` and
CPU ``c_t``::

    F_n(t) = Σ_g free_g                         if t cannot run on n
                                                  (k_t = 0, CPU short, or fewer
                                                   than k_t GPUs with free_g ≥ m_t)
    F_n(t) = Σ_g free_g · [free_g < m_t]        otherwise

    F_n = Σ_t w_t · F_n(t)

i.e. the expected free GPU share a task drawn from the target workload cannot
use. ``free_g`` is the free share in milli-GPU (absent/unhealthy GPUs: -1,
counted as 0). Weights ``w_t`` are pod counts, so sums are exact integers.
"""

from __future__ import annotations

import numpy as np

from gpupool.core.state import IntArray
from gpupool.core.workload import TargetWorkload


class FragmentationModel:
    """Precomputed per-workload arrays; ``measure`` is vectorised over many nodes."""

    def __init__(self, workload: TargetWorkload):
        self.workload = workload
        groups: dict[int, list[tuple[int, int, int]]] = {}
        cpu_only = 0
        for shape, w in zip(workload.shapes, workload.weights, strict=True):
            if shape.gpu_count == 0:
                cpu_only += w
            else:
                groups.setdefault(shape.gpu_milli, []).append((shape.gpu_count, shape.cpu_milli, w))
        self._cpu_only_weight = cpu_only
        self._groups = [
            (milli, np.array([c for c, _, _ in g]), np.array([cpu for _, cpu, _ in g]),
             np.array([w for _, _, w in g], np.int64))
            for milli, g in sorted(groups.items())
        ]

    def measure(self, free: IntArray, cpu_free: IntArray) -> IntArray:
        """Fragmentation (weighted milli-GPU) of each row of ``free`` [rows, gpus]."""
        usable = np.maximum(free, 0)
        total = usable.sum(axis=1)
        out = total * self._cpu_only_weight
        for milli, counts, cpus, weights in self._groups:
            ge = free >= milli
            n_ge = ge.sum(axis=1)
            below = (usable * ~ge).sum(axis=1)
            # rows × shapes: can shape t run here?
            runs = (n_ge[:, None] >= counts[None, :]) & (cpu_free[:, None] >= cpus[None, :])
            frag = np.where(runs, below[:, None], total[:, None])
            out = out + frag @ weights
        return np.asarray(out, np.int64)
