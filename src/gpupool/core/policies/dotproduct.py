"""Dot-product (Tetris, Grandl et al. SIGCOMM 2014): align demand with what is free.

    score(n) = d_cpu·f_cpu(n) + d_mem·f_mem(n) + d_gpu·f_gpu(n)

with d_x = request_x / capacity_x(n) and f_x(n) = free_x(n) / capacity_x(n):
the node whose free vector points most like the pod's demand wins.
"""

from __future__ import annotations

from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.measure import gpu_capacity, gpu_demand, gpu_free, ratio
from gpupool.core.scoring import GpuOrder, ScoreInput, Scores


class DotProduct:
    name = "dot-product"
    gpu_order = GpuOrder.TIGHTEST

    def __init__(self, config: PolicyConfig):
        self.config = config

    def score(self, inp: ScoreInput) -> Scores:
        s, rows, r = inp.state, inp.candidates, inp.request
        cap = gpu_capacity(s, rows)
        value = (ratio(gpu_demand(s, inp.demand, rows), cap) * ratio(gpu_free(s, rows), cap)
                 + ratio(r.cpu_milli + 0 * rows, s.cpu_cap[rows])
                 * ratio(s.cpu_free[rows], s.cpu_cap[rows])
                 + ratio(r.memory_mib + 0 * rows, s.mem_cap[rows])
                 * ratio(s.mem_free[rows], s.mem_cap[rows]))
        return Scores(value)
