"""Does a request fit? Vectorised masks over all nodes, and reasons for the ones that fail."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.reasons import Check, Reason
from gpupool.core.request import GpuDemand, PodRequest, merged_demand
from gpupool.core.state import BoolArray, ClusterState, IntArray


@dataclass(frozen=True, slots=True)
class Constraints:
    """Masks from outside the node's own resources: classes, groups (may be None)."""

    node_mask: BoolArray | None = None
    gpu_mask: BoolArray | None = None
    blocked: Reason | None = None  # request-level refusal (quota), applies to every node
    group: str | None = None  # the resource group node_mask/gpu_mask stand for (for reasons)
    permission: str | None = None  # the tenant's GPU permissions that narrowed gpu_mask
    excluded: BoolArray | None = None  # nodes another path serves (already out of node_mask)
    excluded_why: str = ""  # why those nodes are out, as a sentence (for reasons)


NO_CONSTRAINTS = Constraints()
"""No class, group or quota restriction."""


def demand_of(request: PodRequest) -> GpuDemand | None:
    return merged_demand(request) if request.gpus else None


def kind_mask(state: ClusterState, demand: GpuDemand, rows: slice | IntArray = slice(None)
              ) -> BoolArray | None:
    """[node, gpu] -> the position is of the kind ``demand`` lands on: MIG devices of its
    ``mig_profile``, or ordinary GPUs for a demand without one (None: every position is,
    in a state without MIG devices)."""
    if not state.has_mig and not demand.mig_profile:
        return None
    return np.asarray(state.mig_kind[rows] == state.profile_id(demand.mig_profile))


def gpu_fit_mask(state: ClusterState, demand: GpuDemand, gpu_mask: BoolArray | None,
                 rows: slice | IntArray = slice(None)) -> BoolArray:
    """[node, gpu] -> this GPU can take one slice of ``demand`` now (only ``rows``)."""
    ok = state.present[rows] & state.healthy[rows]
    kind = kind_mask(state, demand, rows)
    if kind is not None:
        ok = ok & kind
    if demand.exclusive:
        ok = ok & (state.core_free[rows] == state.core_cap[rows]) & (
            state.unit_free[rows] == state.unit_cap[rows])
    else:
        units = state.units_for(demand.memory_mib)
        ok = ok & (state.core_free[rows] >= demand.core_pct) & (state.unit_free[rows] >= units)
    if gpu_mask is not None:
        ok = ok & gpu_mask[rows]
    return ok


class _NeedMemo:
    """``need_milli`` arrays of one layout (its ``unit_cap`` array, which a layout change
    replaces) per demand shape: the extender asks for the same few shapes many times."""

    LIMIT = 64

    def __init__(self) -> None:
        self.memo: tuple[IntArray | None, dict[tuple[int, int, bool], IntArray]] = (None, {})

    def get(self, state: ClusterState, demand: GpuDemand) -> IntArray:
        memo = self.memo  # read once: another thread may swap in another layout's memo
        if memo[0] is not state.unit_cap:
            memo = (state.unit_cap, {})
            self.memo = memo
        key = (state.units_for(demand.memory_mib), demand.core_pct, demand.exclusive)
        need = memo[1].get(key)
        if need is None:
            if len(memo[1]) >= self.LIMIT:
                memo[1].clear()
            need = _need_milli(state, demand)
            need.flags.writeable = False
            memo[1][key] = need
        return need


_NEED = _NeedMemo()


def need_milli(state: ClusterState, demand: GpuDemand) -> IntArray:
    """[node, gpu] -> share (milli-GPU) one slice of ``demand`` takes of that GPU
    (read-only: shared by the calls for the same shape on the same layout)."""
    return _NEED.get(state, demand)


def _need_milli(state: ClusterState, demand: GpuDemand) -> IntArray:
    if demand.exclusive:
        return np.full(state.free_milli.shape, 1000, np.int64)
    units = state.units_for(demand.memory_mib)
    by_mem = -(-units * 1000 // np.maximum(state.unit_cap, 1))
    return np.asarray(np.maximum(by_mem, demand.core_pct * 1000 // CORE_UNITS_PER_GPU), np.int64)


def feasible(
    state: ClusterState, request: PodRequest, constraints: Constraints = NO_CONSTRAINTS,
    among: IntArray | None = None,
) -> tuple[BoolArray, BoolArray | None]:
    """(node mask, gpu mask) of where ``request`` fits now; with ``among``, only those
    node rows are looked at (every other row is False)."""
    n = len(state.nodes)
    if constraints.blocked is not None:
        return np.zeros(n, np.bool_), None
    if among is not None:
        return _feasible_among(state, request, constraints, among)
    ok = (state.cpu_free >= request.cpu_milli) & (state.mem_free >= request.memory_mib)
    ok &= state.model_mask(request.models)
    if constraints.node_mask is not None:
        ok &= constraints.node_mask
    demand = demand_of(request)
    if demand is None:
        return ok, None
    gpu_ok = gpu_fit_mask(state, demand, constraints.gpu_mask)
    ok &= gpu_ok.sum(axis=1) >= demand.count
    return ok, gpu_ok


def _feasible_among(state: ClusterState, request: PodRequest, constraints: Constraints,
                    rows: IntArray) -> tuple[BoolArray, BoolArray | None]:
    """``feasible`` computed on ``rows`` only (bind re-checks one node of thousands)."""
    rows = _distinct(np.asarray(rows, np.int64))
    part, gpu_part = feasible_rows(state, request, constraints, rows)
    ok = np.zeros(len(state.nodes), np.bool_)
    ok[rows] = part
    if gpu_part is None:
        return ok, None
    gpu_ok = np.zeros(state.present.shape, np.bool_)
    gpu_ok[rows] = gpu_part
    return ok, gpu_ok


def _distinct(rows: IntArray) -> IntArray:
    """``rows`` sorted, each once (``np.unique`` without its first-call import of
    ``numpy.ma``, 10-25 ms inside the first bind of a process)."""
    rows = np.sort(rows)
    if rows.size < 2:
        return rows
    return rows[np.concatenate(([True], rows[1:] != rows[:-1]))]


def feasible_rows(state: ClusterState, request: PodRequest, constraints: Constraints,
                  rows: IntArray) -> tuple[BoolArray, BoolArray | None]:
    """(node verdicts, GPU verdicts) of node ``rows`` alone, in their order (``blocked``
    is the caller's business: it refuses every node whatever the rows say)."""
    part = (state.cpu_free[rows] >= request.cpu_milli) & (
        state.mem_free[rows] >= request.memory_mib)
    if request.models is not None:
        part &= state.model_mask(request.models)[rows]
    if constraints.node_mask is not None:
        part &= constraints.node_mask[rows]
    demand = demand_of(request)
    if demand is None:
        return part, None
    gpu_part = gpu_fit_mask(state, demand, constraints.gpu_mask, rows)
    part &= gpu_part.sum(axis=1) >= demand.count
    return part, gpu_part


def explain(
    state: ClusterState, request: PodRequest, i: int, constraints: Constraints = NO_CONSTRAINTS
) -> Reason | None:
    """The first failed check of ``request`` on node ``i``, or None if it fits."""
    node = state.nodes[i]
    name = node.name
    if constraints.blocked is not None:
        return Reason(name, constraints.blocked.check, constraints.blocked.message,
                      constraints.blocked.permanent)
    if constraints.excluded is not None and constraints.excluded[i]:
        return Reason(name, Check.NODE_MODE, constraints.excluded_why, True)
    if constraints.node_mask is not None and not constraints.node_mask[i]:
        return Reason(name, Check.GROUP, f"not in group {constraints.group or request.group}",
                      True)
    if request.models is not None and node.model not in request.models:
        allowed = "|".join(sorted(request.models))
        return Reason(name, Check.MODEL,
                      f"GPU model {node.model or 'none'} is not one of {allowed}", True)
    demand = demand_of(request)
    if demand is not None:
        reason = _explain_capacity(state, request, demand, i, constraints)
        if reason is not None:
            return reason
    if request.cpu_milli > state.cpu_free[i]:
        need, cap = f"{request.cpu_milli}m CPU needed", f"{state.cpu_cap[i]}m"
        never = request.cpu_milli > state.cpu_cap[i]
        return Reason(name, Check.CPU, f"{need}, {state.cpu_free[i]}m of {cap} free", never,
                      f"{need}, node has {cap}" if never else f"{need}, less free")
    if request.memory_mib > state.mem_free[i]:
        need, cap = f"{request.memory_mib} MiB memory needed", f"{state.mem_cap[i]} MiB"
        never = request.memory_mib > state.mem_cap[i]
        return Reason(name, Check.MEMORY, f"{need}, {state.mem_free[i]} of {cap} free", never,
                      f"{need}, node has {cap}" if never else f"{need}, less free")
    if demand is not None:
        return _explain_gpu_free(state, demand, i, constraints)
    return None


def _explain_capacity(
    state: ClusterState, request: PodRequest, demand: GpuDemand, i: int, c: Constraints
) -> Reason | None:
    name = state.nodes[i].name
    kind = kind_mask(state, demand, slice(i, i + 1))
    present = state.present[i] if kind is None else state.present[i] & kind[0]
    if c.gpu_mask is not None:
        matching = int((present & c.gpu_mask[i]).sum())
        if matching < demand.count:
            return Reason(name, Check.CLASS, f"{demand.count} {_mask_words(request, c)} needed, "
                          f"{matching} here", True)
    total = int(present.sum())
    if total < demand.count:
        return _too_few(state, demand, i, total)
    if not demand.exclusive:
        big = int((present & (state.unit_cap[i] >= state.units_for(demand.memory_mib))).sum())
        if big < demand.count:
            return Reason(name, Check.GPU_SIZE, f"{demand.count} GPUs with {demand.memory_mib} "
                          f"MiB needed, {big} GPUs here are that large", True)
    healthy = int((present & state.healthy[i]).sum())
    if healthy < demand.count:
        return Reason(name, Check.GPU_HEALTH, f"{demand.count} healthy GPUs needed, "
                      f"{healthy} of {total} healthy", False)
    return None


def _too_few(state: ClusterState, demand: GpuDemand, i: int, total: int) -> Reason:
    name = state.nodes[i].name
    if demand.mig_profile:
        need = f"{demand.count} MIG devices {demand.mig_profile} needed"
        return Reason(name, Check.MIG, f"{need}, node has {total}", True,
                      f"{need}, fewer on the node")
    mig = int((state.mig_kind[i] > 0).sum()) if state.has_mig else 0
    why = f" (and {mig} MIG devices, only for pods that ask their profile)" if mig else ""
    return Reason(name, Check.GPU_COUNT, f"{demand.count} GPUs needed, node has {total}{why}",
                  True, f"{demand.count} GPUs needed, node has {total}")


def _mask_words(request: PodRequest, c: Constraints) -> str:
    """What the GPU mask stands for: "GPUs of class a100 in group g" and the like."""
    if request.gpu_class:
        words = f"GPUs of class {request.gpu_class}"
    elif request.selector is not None or c.group is None:
        words = "GPUs of the selector"
    else:
        words = "GPUs"
    words = words if c.group is None else f"{words} in group {c.group}"
    return words if c.permission is None else f"{words} permitted by {c.permission}"


def _explain_gpu_free(state: ClusterState, demand: GpuDemand, i: int, c: Constraints
                      ) -> Reason | None:
    name = state.nodes[i].name
    row = gpu_fit_mask(state, demand, c.gpu_mask, slice(i, i + 1))[0]  # one row, not all
    have = int(row.sum())
    if have >= demand.count:
        return None
    ok = state.present[i] & state.healthy[i]
    kind = kind_mask(state, demand, slice(i, i + 1))
    if kind is not None:
        ok = ok & kind[0]
    if c.gpu_mask is not None:  # count only GPUs the class or group lets the pod use
        ok = ok & c.gpu_mask[i]
    if demand.exclusive:
        idle = int((ok & (state.core_free[i] == state.core_cap[i])
                    & (state.unit_free[i] == state.unit_cap[i])).sum())
        what = f"MIG devices {demand.mig_profile}" if demand.mig_profile else "GPUs"
        return Reason(name, Check.GPU_FREE, f"{demand.count} idle {what} needed, {idle} idle",
                      False)
    unit = state.memory_unit_mib
    best = int(np.argmax(np.where(ok, state.free_milli[i], -1)))
    common = (f"{demand.count} GPUs with {demand.memory_mib} MiB + {demand.core_pct} % core "
              f"needed, {have} have room")
    return Reason(name, Check.GPU_FREE, f"{common} (roomiest GPU: "
                  f"{state.unit_free[i, best] * unit} MiB, {state.core_free[i, best]} % core "
                  "free)", False, common)
