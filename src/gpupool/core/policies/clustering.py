"""Clustering (after Gandiva's affinity packing): put like with like.

Shared pods prefer nodes that already hold slices of the same size, so equal
fractions pair up on GPUs; whole-GPU pods prefer nodes with no fractional GPU.

    like(n)  = #GPUs on n whose used share is a positive multiple of the pod's
               share (shared pods), or #GPUs fully used or idle (whole-GPU pods)
    score(n) = like(n)/gpus(n) · w − gpu_free'(n)/gpu_cap(n)       (w = 10)
"""

from __future__ import annotations

import numpy as np

from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.measure import gpu_capacity, gpu_demand, gpu_free, ratio
from gpupool.core.scoring import GpuOrder, ScoreInput, Scores


class Clustering:
    name = "clustering"
    gpu_order = GpuOrder.TIGHTEST

    def __init__(self, config: PolicyConfig):
        self.like_weight = config.weight("clustering.like", 10.0)

    def score(self, inp: ScoreInput) -> Scores:
        s, rows = inp.state, inp.candidates
        free = s.free_milli[rows]
        present = s.present[rows]
        used = np.where(present, 1000 - np.maximum(free, 0), 0)
        share = int(gpu_demand(s, inp.demand, rows[:1])[0]) if rows.size else 0
        if inp.demand is not None and not inp.demand.exclusive:
            share //= max(inp.demand.count, 1)
            like = present & (used > 0) & (used % max(share, 1) == 0)
        else:
            like = present & ((used == 0) | (used == 1000))
        cap = gpu_capacity(s, rows)
        left = ratio(gpu_free(s, rows) - gpu_demand(s, inp.demand, rows), cap)
        return Scores(self.like_weight * ratio(like.sum(axis=1) * 1000, cap) - left)
