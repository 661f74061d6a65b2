"""FGD-balance — gpupool's own policy: FGD plus CPU headroom per free GPU.

FGD counts a node's free GPUs as fragments only for the task shapes whose CPU
no longer fits, so it lets CPU and memory run out ahead of GPUs on nodes with
few cores per GPU (the main loss on the Alibaba trace, see
docs/design/fgd-balance.md). FGD-balance adds the GPUs a node would strand for
lack of CPU or memory, measured against the target workload's average CPU and
memory per GPU:

    strand_n   = max(0, free_gpu_n − cpu_free_n / c̄, free_gpu_n − mem_free_n / m̄)
                 (milli-GPU that the average task could not use for lack of CPU/memory)
    score(n)   = −( ΔF_n / W  +  λ · Δstrand_n )

with ΔF_n the FGD fragmentation increase, W the workload's total weight (so
ΔF_n / W is expected milli-GPU), c̄ / m̄ the workload's CPU / memory per
milli-GPU, and λ = ``fgd-balance.lambda`` (default 0.5).
"""

from __future__ import annotations

import numpy as np

from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.fgd import Fgd
from gpupool.core.policies.measure import gpu_demand, gpu_free
from gpupool.core.scoring import GpuOrder, ScoreInput, Scores
from gpupool.core.state import ClusterState, IntArray
from gpupool.core.workload import TargetWorkload


def cpu_per_milli_gpu(workload: TargetWorkload) -> float:
    """Average CPU (milli-cores) the workload asks per milli-GPU."""
    gpu = sum(w * s.gpu_count * s.gpu_milli for s, w in zip(workload.shapes, workload.weights,
                                                            strict=True))
    cpu = sum(w * s.cpu_milli for s, w in zip(workload.shapes, workload.weights, strict=True)
              if s.gpu_count)
    return cpu / gpu if gpu else 0.0


class FgdBalance:
    name = "fgd-balance"
    gpu_order = GpuOrder.TIGHTEST

    def __init__(self, config: PolicyConfig):
        self.fgd = Fgd(config)
        assert config.workload is not None  # Fgd raised otherwise
        self.weight_total = float(config.workload.total_weight)
        self.cpu_per_milli = cpu_per_milli_gpu(config.workload)
        self.lam = config.weight("fgd-balance.lambda", 0.5)

    def strand(self, state: ClusterState, rows: IntArray, gpu_free_milli: IntArray,
               cpu_free: IntArray) -> np.ndarray:
        if self.cpu_per_milli <= 0:
            return np.zeros(rows.size)
        by_cpu = gpu_free_milli - np.maximum(cpu_free, 0) / self.cpu_per_milli
        return np.maximum(by_cpu, 0.0)

    def score(self, inp: ScoreInput) -> Scores:
        s, rows, r = inp.state, inp.candidates, inp.request
        delta, gpu = self.fgd.deltas(inp)
        free_now = gpu_free(s, rows)
        free_after = free_now - gpu_demand(s, inp.demand, rows)
        before = self.strand(s, rows, free_now, s.cpu_free[rows])
        after = self.strand(s, rows, free_after, s.cpu_free[rows] - r.cpu_milli)
        value = delta / self.weight_total + self.lam * (after - before)
        return Scores(-value, gpu)
