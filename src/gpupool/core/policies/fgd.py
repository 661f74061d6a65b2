"""FGD — fragmentation gradient descent (Weng et al., USENIX ATC 2023).

Place each task where the node's fragmentation (``gpupool.core.fragmentation``)
grows least:

    ΔF_n     = ( F_n(after placing on n) − F_n(before) ) / W      (expected milli-GPU)
    score(n) = ⌊ 100 · σ(−ΔF_n / 1000) ⌋                          (σ: logistic)

W is the target workload's total weight (``dead``: see
``fragmentation.DeadShare``; FGD itself counts none). The score is put on kube-scheduler's
integer 0–100 scale through the logistic function, as the authors' harness
does; nodes whose fragmentation changes by nearly the same amount then tie,
and ties go to the first node in node order (``placement.choose``). With the
weight ``fgd.exact`` = 1 the score is the unquantised −ΔF_n instead.

For a sharing task every GPU with room on the node is tried and the best one
kept (ties: tightest GPU, then lowest position); whole-GPU tasks take idle GPUs;
multi-GPU shared tasks take the tightest GPUs that fit.

Scores are cached per (task shape, node) and recomputed only for nodes whose
``state.version`` moved, so a decision costs a few vectorised passes over the
nodes that changed since the last task of the same shape.
"""

from __future__ import annotations

import numpy as np

from gpupool.core.errors import InvalidInput
from gpupool.core.fit import need_milli
from gpupool.core.fragmentation import DeadShare, FragmentationModel
from gpupool.core.policies.config import PolicyConfig
from gpupool.core.policies.rowcache import RowCache, RowCaches
from gpupool.core.scoring import GpuOrder, ScoreInput, Scores
from gpupool.core.state import ClusterState, IntArray

_BIG = np.int64(1) << 40


def shape_key(inp: ScoreInput) -> tuple[object, ...]:
    """What a node's FGD-type score depends on besides the node: the pod's CPU, its
    GPU demand and the class / group GPU mask (by identity: ``ScoreInput.gpu_mask``)."""
    d = inp.demand
    return (inp.request.cpu_milli,
            None if d is None else (d.count, d.memory_mib, d.core_pct, d.mode, d.mig_profile),
            id(inp.gpu_mask))


def quantised(expected_delta: np.ndarray) -> np.ndarray:
    """kube-scheduler's integer score of an expected fragmentation change."""
    return np.floor(100.0 / (1.0 + np.exp(expected_delta / 1000.0)))


class Fgd:
    name = "fgd"
    gpu_order = GpuOrder.TIGHTEST

    def __init__(self, config: PolicyConfig, dead: DeadShare | None = None):
        if config.workload is None:
            raise InvalidInput("policy fgd needs a target workload (the popular task shapes)")
        self.frag = FragmentationModel(config.workload, dead=dead)
        self._deltas = RowCaches({"value": np.int64, "gpu": np.int64})
        self._before: RowCache | None = None
        self.weight_total = float(config.workload.total_weight)
        self.exact = config.weight("fgd.exact", 0.0) > 0

    def score(self, inp: ScoreInput) -> Scores:
        delta, gpu = self.deltas(inp)
        expected = delta / self.weight_total
        if self.exact:
            return Scores(-expected, gpu)
        return Scores(quantised(expected), gpu)

    # -- cached fragmentation ----------------------------------------------------
    def before(self, state: ClusterState, rows: IntArray) -> IntArray:
        """Current fragmentation of nodes ``rows``."""
        cache = self._before
        if cache is None or cache.layout is not state.layout:
            cache = self._before = RowCache.fresh(state, {"value": np.int64})
        stale = cache.stale(state, rows)
        if stale.size:
            cache.store(state, stale, value=self.frag.measure(
                state.free_milli[stale], state.cpu_free[stale], self.access(state, stale)))
        return np.asarray(cache["value"][rows], np.int64)

    def access(self, state: ClusterState, rows: IntArray) -> IntArray | None:
        """The access classes of nodes ``rows`` (None when no shape is model-bound)."""
        classes = self.frag.access(state)
        return None if classes is None else classes[rows]

    def deltas(self, inp: ScoreInput) -> tuple[IntArray, IntArray]:
        """(fragmentation increase, chosen GPU or -1) for each candidate."""
        state, rows = inp.state, inp.candidates
        cache = self._deltas.get(state, shape_key(inp), inp.gpu_mask)
        stale = cache.stale(state, rows)
        if stale.size:
            value, gpu = self._compute(inp, stale)
            cache.store(state, stale, value=value - self.before(state, stale), gpu=gpu)
        return cache["value"][rows], cache["gpu"][rows]

    def _compute(self, inp: ScoreInput, rows: IntArray) -> tuple[IntArray, IntArray]:
        """Fragmentation after placing on each of ``rows``, and the GPU chosen."""
        state, d = inp.state, inp.demand
        free = state.free_milli[rows]
        cpu_after = state.cpu_free[rows] - inp.request.cpu_milli
        access = self.access(state, rows)
        no_gpu = np.full(rows.size, -1, np.int64)
        if d is None or inp.gpu_fit is None:
            return self.frag.measure(free, cpu_after, access), no_gpu
        fit = inp.gpu_fit[rows]
        need = need_milli(state, d)[rows]
        if d.count == 1 and not d.exclusive:
            return self._best_single_gpu(free, fit, need, cpu_after, access)
        order = np.argsort(np.where(fit, free, _BIG), axis=1, kind="stable")[:, : d.count]
        take = np.zeros_like(fit)
        np.put_along_axis(take, order, True, axis=1)
        after = np.where(take & fit, free - need, free)
        return self.frag.measure(after, cpu_after, access), no_gpu

    def _best_single_gpu(self, free: IntArray, fit: np.ndarray, need: IntArray,
                         cpu_after: IntArray, access: IntArray | None
                         ) -> tuple[IntArray, IntArray]:
        row, pos = np.nonzero(fit)
        after = free[row].copy()
        after[np.arange(row.size), pos] -= need[row, pos]
        frag = self.frag.measure(after, cpu_after[row], None if access is None else access[row])
        order = np.lexsort((pos, free[row, pos], frag, row))
        first = np.ones(order.size, np.bool_)
        first[1:] = row[order][1:] != row[order][:-1]
        best = order[first]
        return frag[best], pos[best].astype(np.int64)
