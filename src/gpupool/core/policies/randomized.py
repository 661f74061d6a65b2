"""Random: any feasible node, any fitting GPU, uniformly (seeded).

    score(n) = 1 for one node drawn uniformly from the feasible set, else 0
    GPU      = drawn uniformly among the node's GPUs with room
"""

from __future__ import annotations

import numpy as np

from gpupool.core.policies.config import PolicyConfig
from gpupool.core.scoring import GpuOrder, ScoreInput, Scores


class Randomized:
    name = "random"
    gpu_order = GpuOrder.TIGHTEST

    def __init__(self, config: PolicyConfig):
        self.config = config

    def score(self, inp: ScoreInput) -> Scores:
        n = inp.candidates.size
        value = np.zeros(n, np.float64)
        k = inp.rng.randrange(n)
        value[k] = 1.0
        gpu = None
        if inp.demand is not None and inp.demand.count == 1 and inp.gpu_fit is not None:
            fitting = np.flatnonzero(inp.gpu_fit[inp.candidates[k]])
            gpu = np.full(n, -1, np.int64)
            gpu[k] = int(fitting[inp.rng.randrange(fitting.size)])
        return Scores(value, gpu)
