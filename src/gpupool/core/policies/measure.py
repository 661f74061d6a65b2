"""Vectorised measures of candidate nodes that several policies share."""

from __future__ import annotations

import numpy as np

from gpupool.core.fit import need_milli
from gpupool.core.request import GpuDemand
from gpupool.core.scoring import FloatArray, ScoreInput
from gpupool.core.state import ClusterState, IntArray


def gpu_capacity(state: ClusterState, rows: IntArray) -> IntArray:
    return np.asarray(state.present[rows].sum(axis=1) * 1000, np.int64)


def gpu_free(state: ClusterState, rows: IntArray) -> IntArray:
    return np.asarray(np.maximum(state.free_milli[rows], 0).sum(axis=1), np.int64)


def gpu_demand(state: ClusterState, demand: GpuDemand | None, rows: IntArray) -> IntArray:
    """Milli-GPU the demand takes on each candidate (per-GPU share × count)."""
    if demand is None:
        return np.zeros(rows.size, np.int64)
    need = np.where(state.present[rows], need_milli(state, demand)[rows], 0).max(axis=1)
    return np.asarray(need * demand.count, np.int64)


def ratio(num: IntArray, den: IntArray) -> FloatArray:
    return np.asarray(np.divide(num, den, out=np.zeros(num.shape, np.float64),
                                where=den > 0), np.float64)


def remaining_share(inp: ScoreInput) -> FloatArray:
    """Σ over CPU, memory and GPU of the node's share still free after placing the pod."""
    s, rows, r = inp.state, inp.candidates, inp.request
    gpu_cap = gpu_capacity(s, rows)
    gpu_left = gpu_free(s, rows) - gpu_demand(s, inp.demand, rows)
    cpu_left = s.cpu_free[rows] - r.cpu_milli
    mem_left = s.mem_free[rows] - r.memory_mib
    return ratio(gpu_left, gpu_cap) + ratio(cpu_left, s.cpu_cap[rows]) + ratio(
        mem_left, s.mem_cap[rows])
