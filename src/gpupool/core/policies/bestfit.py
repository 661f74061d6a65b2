"""Best-fit: the node with the least resources left after placing the pod.

    score(n) = -( w_cpu · cpu_free'(n) / max_n cpu_cap(n)
                + w_gpu · gpu_free'(n) / max_n gpu_cap(n)
                + w_mem · mem_free'(n) / max_n mem_cap(n) )

where ' marks the state after placement and the denominators are the largest
node of the cluster (absolute amounts, as in the FGD paper's best-fit baseline,
not per-node ratios). GPUs are picked tightest first. Weights:
``bestfit.cpu`` (0.5), ``bestfit.gpu`` (0.5), ``bestfit.memory`` (0).
"""

from __future__ import annotations

import numpy as np

from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.measure import gpu_demand, gpu_free
from gpupool.core.scoring import GpuOrder, ScoreInput, Scores


class BestFit:
    name = "best-fit"
    gpu_order = GpuOrder.TIGHTEST

    def __init__(self, config: PolicyConfig):
        self.w_gpu = config.weight("bestfit.gpu", 0.5)
        self.w_cpu = config.weight("bestfit.cpu", 0.5)
        self.w_mem = config.weight("bestfit.memory", 0.0)

    def score(self, inp: ScoreInput) -> Scores:
        s, rows, r = inp.state, inp.candidates, inp.request
        gpu_left = gpu_free(s, rows) - gpu_demand(s, inp.demand, rows)
        left = (self.w_gpu * gpu_left / s.max_gpu_milli
                + self.w_cpu * (s.cpu_free[rows] - r.cpu_milli) / s.max_cpu_milli
                + self.w_mem * (s.mem_free[rows] - r.memory_mib) / s.max_memory_mib)
        return Scores(-np.asarray(left, np.float64))
