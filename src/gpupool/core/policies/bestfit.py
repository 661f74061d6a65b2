"""Best-fit: the node with the least resources left after placing the pod.

    score(n) = -( w_gpu · gpu_free'(n)/gpu_cap(n) + w_cpu · cpu_free'(n)/cpu_cap(n)
                  + w_mem · mem_free'(n)/mem_cap(n) )

where ' marks the state after placement; GPUs are picked tightest first.
Weights: ``bestfit.gpu`` (1), ``bestfit.cpu`` (1), ``bestfit.memory`` (0).
"""

from __future__ import annotations

from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.measure import gpu_capacity, gpu_demand, gpu_free, ratio
from gpupool.core.scoring import GpuOrder, ScoreInput, Scores


class BestFit:
    name = "best-fit"
    gpu_order = GpuOrder.TIGHTEST

    def __init__(self, config: PolicyConfig):
        self.w_gpu = config.weight("bestfit.gpu", 1.0)
        self.w_cpu = config.weight("bestfit.cpu", 1.0)
        self.w_mem = config.weight("bestfit.memory", 0.0)

    def score(self, inp: ScoreInput) -> Scores:
        s, rows, r = inp.state, inp.candidates, inp.request
        gpu_left = gpu_free(s, rows) - gpu_demand(s, inp.demand, rows)
        left = (self.w_gpu * ratio(gpu_left, gpu_capacity(s, rows))
                + self.w_cpu * ratio(s.cpu_free[rows] - r.cpu_milli, s.cpu_cap[rows])
                + self.w_mem * ratio(s.mem_free[rows] - r.memory_mib, s.mem_cap[rows]))
        return Scores(-left)
