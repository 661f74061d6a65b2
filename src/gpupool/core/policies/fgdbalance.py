"""FGD-balance — gpupool's own policy: FGD plus what FGD's measure leaves out.

FGD (``fgd``) places a task where the node's expected fragmentation grows
least. Three things it does not see cost GPUs on real workloads
(docs/design/fgd-balance.md): CPU or memory running out ahead of a node's GPUs;
slivers of GPU that no common sharing task fits in; and tasks that can run
anywhere using up the GPU models that other tasks are bound to. FGD-balance
adds one term for each, in FGD's unit (expected milli-GPU), before the score
is put on kube-scheduler's integer scale:

    x_n       = ΔF'_n / W  +  λ · Δstrand_n  +  κ · d · u_{m(n)}
    primary   = ⌊ 100 · σ( −x_n / 1000 ) ⌋
    secondary = −( cpu_free'_n / max cpu_cap + gpu_free'_n / max gpu_cap ) / 2
    score(n)  = primary + ½ · (secondary rescaled to [0, 1] over the candidates)

* F'_n is FGD's fragmentation plus the *dead share*: free share on a GPU that
  is smaller than h*, counted μ times the workload's weight
  (``fragmentation.DeadShare``). h* is the smallest share such that sharing
  tasks of at most that size make up q of the workload's sharing tasks: a gap
  only the rarest tasks fit in is as good as lost, and keeping few of them keeps
  the rare small tasks for the holes only they can fill;
* strand_n = max(0, gpu_free_n − min(cpu_free_n / c̄, mem_free_n / m̄)) is the
  free GPU share the average task could not use for lack of CPU or memory; c̄
  and m̄ are the CPU and memory the workload's GPU tasks ask per milli-GPU —
  counting the CPU-only tasks' asks too when the workload asks more of that
  resource per GPU than the cluster has (then CPU-only tasks compete for it on
  the same nodes); m̄ only when the workload knows its memory
  (``TargetWorkload.memory_mib``);
* u_m is the share of model m's GPUs that the workload's model-bound tasks need
  (``scarcity.ModelScarcity``) and d the milli-GPU the task takes: a task that
  could run anywhere pays for using up a model others are bound to;
* ' is the state after placement; the secondary term only orders nodes whose
  primary score ties (the best fit, so equal nodes are filled one by one).

Weights (``PolicyConfig.weights``): ``fgd-balance.lambda`` λ (default 1),
``fgd-balance.dead`` μ (4), ``fgd-balance.filler`` q (0.03),
``fgd-balance.scarcity`` κ (2), ``fgd-balance.memory`` (1: count memory in
strand; 0: CPU only), ``fgd-balance.cpu-only-tasks`` (-1: when the resource is
short, as above; 1: always; 0: never). λ = 0.5 with μ, κ, memory and
cpu-only-tasks all 0 is the earlier formula (CPU stranding and the best-fit
tie-break only).

The per-node terms are cached per request shape (with its memory) and node
version (``rowcache``); a decision recomputes them only for the nodes that
changed and then rescales the secondary term over the candidates.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpupool.core.errors import InvalidInput
from gpupool.core.fragmentation import DeadShare
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.fgd import Fgd, quantised, shape_key
from gpupool.core.policies.measure import gpu_demand, gpu_free
from gpupool.core.policies.rowcache import RowCaches
from gpupool.core.policies.scarcity import ModelScarcity
from gpupool.core.scoring import FloatArray, GpuOrder, ScoreInput, Scores
from gpupool.core.state import ClusterState, IntArray
from gpupool.core.workload import TargetWorkload

SHAPES = 512
"""Request shapes whose per-node terms are kept (memory is part of the shape here)."""


def per_milli_gpu(workload: TargetWorkload, cpu_only_tasks: bool) -> tuple[float, float]:
    """(CPU milli-cores, memory MiB) the workload asks per milli-GPU it asks, counting
    CPU-only tasks or not; memory is 0 when the workload does not know it."""
    pairs = list(zip(workload.shapes, workload.weights, strict=True))
    gpu = sum(w * s.gpu_count * s.gpu_milli for s, w in pairs)
    if not gpu:
        return 0.0, 0.0
    cpu = sum(w * s.cpu_milli for s, w in pairs if cpu_only_tasks or s.gpu_count)
    memory = sum(w * m for (s, w), m in zip(pairs, workload.memory_mib, strict=True)
                 if cpu_only_tasks or s.gpu_count) if workload.memory_mib else 0
    return cpu / gpu, memory / gpu


def dead_below(workload: TargetWorkload, filler: float) -> int:
    """h*: the smallest share such that sharing tasks of at most that size are at least
    ``filler`` of the workload's sharing tasks (0: the workload shares no GPU)."""
    sizes: dict[int, int] = {}
    for s, w in zip(workload.shapes, workload.weights, strict=True):
        if s.gpu_count and s.gpu_milli < 1000:
            sizes[s.gpu_milli] = sizes.get(s.gpu_milli, 0) + w
    total, seen = sum(sizes.values()), 0
    for milli in sorted(sizes):
        seen += sizes[milli]
        if seen >= filler * total:
            return milli
    return 0


class FgdBalance:
    name = "fgd-balance"
    gpu_order = GpuOrder.TIGHTEST

    def __init__(self, config: PolicyConfig):
        if config.workload is None:
            raise InvalidInput("policy fgd-balance needs a target workload (the popular task "
                               "shapes)")
        workload = config.workload
        mu = config.weight("fgd-balance.dead", 4.0)
        below = dead_below(workload, config.weight("fgd-balance.filler", 0.03))
        self.fgd = Fgd(config, DeadShare(below, mu) if mu > 0 and below > 0 else None)
        self.weight_total = self.fgd.weight_total
        self.gpu_tasks = per_milli_gpu(workload, False)
        self.all_tasks = per_milli_gpu(workload, True)
        self.cpu_only_tasks = config.weight("fgd-balance.cpu-only-tasks", -1.0)
        self.memory = config.weight("fgd-balance.memory", 1.0) > 0 and bool(workload.memory_mib)
        self._per_milli: tuple[object, float, float] | None = None
        self.lam = config.weight("fgd-balance.lambda", 1.0)
        self.kappa = config.weight("fgd-balance.scarcity", 2.0)
        self.scarcity = ModelScarcity(workload)
        self._parts = RowCaches({"primary": np.float64, "left": np.float64, "gpu": np.int64},
                                SHAPES)

    def per_milli(self, state: ClusterState) -> tuple[float, float]:
        """(c̄, m̄) on this cluster: a resource counts the CPU-only tasks' asks when the
        workload asks more of it per GPU than the cluster has (``cpu-only-tasks`` -1, the
        default; 1: always, 0: never); m̄ is 0 when memory is not counted."""
        held = self._per_milli
        if held is None or held[0] is not state.layout:
            gpus = max(int(state.present.sum()) * 1000, 1)
            has = (int(state.cpu_cap.sum()) / gpus, int(state.mem_cap.sum()) / gpus)
            figures = [all_ if self.cpu_only_tasks > 0 or (
                self.cpu_only_tasks < 0 and all_ > cap) else only
                for only, all_, cap in zip(self.gpu_tasks, self.all_tasks, has, strict=True)]
            held = self._per_milli = (state.layout, figures[0],
                                      figures[1] if self.memory else 0.0)
        return held[1], held[2]

    def strand(self, state: ClusterState, gpu_free_milli: IntArray, cpu_free: IntArray,
               mem_free: IntArray) -> FloatArray:
        """Free GPU share (milli) the average task could not use for lack of CPU or memory."""
        cpu, memory = self.per_milli(state)
        if cpu <= 0:
            return np.zeros(gpu_free_milli.shape)
        usable = np.maximum(cpu_free, 0) / cpu
        if memory > 0:
            usable = np.minimum(usable, np.maximum(mem_free, 0) / memory)
        return np.maximum(gpu_free_milli - usable, 0.0)

    def score(self, inp: ScoreInput) -> Scores:
        rows = inp.candidates
        key = (*shape_key(inp), inp.request.memory_mib if self.memory else 0)
        cache = self._parts.get(inp.state, key, inp.gpu_mask)
        stale = cache.stale(inp.state, rows)
        if stale.size:
            cache.store(inp.state, stale, **self._parts_of(replace(inp, candidates=stale)))
        primary, left = cache["primary"][rows], cache["left"][rows]
        span = float(np.ptp(left)) if left.size else 0.0
        secondary = (left.max() - left) / span if span > 0 else np.zeros(left.shape)
        return Scores(primary + 0.5 * secondary, cache["gpu"][rows])

    def _parts_of(self, inp: ScoreInput) -> dict[str, np.ndarray]:
        """Each candidate's own terms: the quantised primary score, the share left after
        placing (the secondary term before rescaling) and the GPU chosen."""
        s, rows, r = inp.state, inp.candidates, inp.request
        delta, gpu = self.fgd.deltas(inp)
        taken = gpu_demand(s, inp.demand, rows)
        free_now = gpu_free(s, rows)
        free_after = free_now - taken
        cpu_after = s.cpu_free[rows] - r.cpu_milli
        stranded = self.strand(s, free_after, cpu_after, s.mem_free[rows] - r.memory_mib) - \
            self.strand(s, free_now, s.cpu_free[rows], s.mem_free[rows])
        x = delta / self.weight_total + self.lam * stranded
        if self.kappa > 0:
            x = x + self.kappa * taken * self.scarcity.per_node(s)[rows]
        left = (free_after / s.max_gpu_milli + cpu_after / s.max_cpu_milli) / 2
        return {"primary": quantised(x), "left": left, "gpu": gpu}
