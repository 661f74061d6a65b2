"""Packing: fill GPUs already in use, then nodes already in use, then idle nodes.

    tier(n) = 2 if a fitting GPU on n is already partly used (shared pods only)
              1 if n already runs something on a GPU
              0 otherwise
    score(n) = tier(n) · 10 − gpu_free'(n)/gpu_cap(n)     (best fit within a tier)
"""

from __future__ import annotations

import numpy as np

from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.measure import gpu_capacity, gpu_demand, gpu_free, ratio
from gpupool.core.scoring import GpuOrder, ScoreInput, Scores


class Packing:
    name = "packing"
    gpu_order = GpuOrder.TIGHTEST

    def __init__(self, config: PolicyConfig):
        self.tier_weight = config.weight("packing.tier", 10.0)

    def score(self, inp: ScoreInput) -> Scores:
        s, rows = inp.state, inp.candidates
        cap = gpu_capacity(s, rows)
        free = gpu_free(s, rows)
        used_gpu = s.present[rows] & (s.free_milli[rows] < 1000)
        tier = (free < cap).astype(np.float64)
        if inp.demand is not None and not inp.demand.exclusive and inp.gpu_fit is not None:
            tier += (used_gpu & inp.gpu_fit[rows]).any(axis=1)
        left = ratio(free - gpu_demand(s, inp.demand, rows), cap)
        return Scores(self.tier_weight * tier - left)
