"""FGD-balance — gpupool's own policy: FGD plus CPU headroom per free GPU.

FGD counts a node's free GPUs as fragments only for the task shapes whose CPU
no longer fits, so it lets CPU run out ahead of GPUs on nodes with few cores
per GPU — the main loss left on the Alibaba trace (docs/design/fgd-balance.md).
FGD-balance adds the GPU share a node would strand for lack of CPU, measured
against the target workload's average CPU per GPU, and breaks the remaining
ties by best fit:

    strand_n  = max(0, free_gpu_n − cpu_free_n / c̄)       (milli-GPU)
    primary   = ⌊ 100 · σ( −(ΔF_n / W + λ · Δstrand_n) / 1000 ) ⌋
    secondary = −( cpu_free'_n / max cpu_cap + gpu_free'_n / max gpu_cap ) / 2
    score(n)  = primary + ½ · (secondary rescaled to [0, 1] over the candidates)

ΔF_n / W is FGD's expected fragmentation change (milli-GPU), c̄ the workload's
CPU per milli-GPU, λ = ``fgd-balance.lambda`` (default 0.5), ' the state after
placement. The secondary term only orders nodes whose primary score ties.

The per-node terms (primary, the share left, FGD's GPU) are cached per request
shape and node version (``rowcache``); a decision recomputes them only for the
nodes that changed and then rescales the secondary term over the candidates.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.fgd import Fgd, quantised, shape_key
from gpupool.core.policies.measure import gpu_demand, gpu_free
from gpupool.core.policies.rowcache import RowCaches
from gpupool.core.scoring import FloatArray, GpuOrder, ScoreInput, Scores
from gpupool.core.state import IntArray
from gpupool.core.workload import TargetWorkload


def cpu_per_milli_gpu(workload: TargetWorkload) -> float:
    """Average CPU (milli-cores) the workload's GPU tasks ask per milli-GPU."""
    pairs = list(zip(workload.shapes, workload.weights, strict=True))
    gpu = sum(w * s.gpu_count * s.gpu_milli for s, w in pairs)
    cpu = sum(w * s.cpu_milli for s, w in pairs if s.gpu_count)
    return cpu / gpu if gpu else 0.0


class FgdBalance:
    name = "fgd-balance"
    gpu_order = GpuOrder.TIGHTEST

    def __init__(self, config: PolicyConfig):
        self.fgd = Fgd(config)
        self.weight_total = self.fgd.weight_total
        assert config.workload is not None  # Fgd raised otherwise
        self.cpu_per_milli = cpu_per_milli_gpu(config.workload)
        self.lam = config.weight("fgd-balance.lambda", 0.5)
        self._parts = RowCaches({"primary": np.float64, "left": np.float64, "gpu": np.int64})

    def strand(self, gpu_free_milli: IntArray, cpu_free: IntArray) -> FloatArray:
        """Free GPU share (milli) the average task could not use for lack of CPU."""
        if self.cpu_per_milli <= 0:
            return np.zeros(gpu_free_milli.shape)
        return np.maximum(gpu_free_milli - np.maximum(cpu_free, 0) / self.cpu_per_milli, 0.0)

    def score(self, inp: ScoreInput) -> Scores:
        rows = inp.candidates
        cache = self._parts.get(inp.state, shape_key(inp), inp.gpu_mask)
        stale = cache.stale(inp.state, rows)
        if stale.size:
            cache.store(inp.state, stale, **self._parts_of(replace(inp, candidates=stale)))
        primary, left = cache["primary"][rows], cache["left"][rows]
        span = float(np.ptp(left)) if left.size else 0.0
        secondary = (left.max() - left) / span if span > 0 else np.zeros(left.shape)
        return Scores(primary + 0.5 * secondary, cache["gpu"][rows])

    def _parts_of(self, inp: ScoreInput) -> dict[str, np.ndarray]:
        """Each candidate's own terms: the quantised primary score, the share left after
        placing (the secondary term before rescaling) and FGD's GPU choice."""
        s, rows, r = inp.state, inp.candidates, inp.request
        delta, gpu = self.fgd.deltas(inp)
        free_now = gpu_free(s, rows)
        free_after = free_now - gpu_demand(s, inp.demand, rows)
        cpu_after = s.cpu_free[rows] - r.cpu_milli
        stranded = self.strand(free_after, cpu_after) - self.strand(free_now, s.cpu_free[rows])
        primary = quantised(delta / self.weight_total + self.lam * stranded)
        left = (free_after / s.max_gpu_milli + cpu_after / s.max_cpu_milli) / 2
        return {"primary": primary, "left": left, "gpu": gpu}
