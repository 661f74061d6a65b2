"""Choosing GPUs on the chosen node and turning the choice into an ``Allocation``."""

from __future__ import annotations

import numpy as np

from gpupool.core import topology
from gpupool.core.allocation import Allocation, Slice
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.request import Affinity, GpuDemand, PodRequest
from gpupool.core.scoring import GpuOrder
from gpupool.core.state import BoolArray, ClusterState


def pick_gpus(
    state: ClusterState, i: int, demand: GpuDemand, fit_row: BoolArray, order: GpuOrder
) -> list[int]:
    """Positions of ``demand.count`` GPUs on node ``i``: the tightest (or loosest)
    combination, kept on one NUMA node when one has enough; on a node whose GPUs report
    their links, the best-joined set first (``core.topology.choose_set``)."""
    positions = np.flatnonzero(fit_row)
    free = state.free_milli[i, positions]
    sign = 1 if order is GpuOrder.TIGHTEST else -1
    ranked = [int(p) for _, p in sorted(zip(sign * free, positions, strict=True))]
    if demand.count == 1:
        return ranked[:1]
    gpus = state.nodes[i].gpus
    if topology.known(gpus) and len(ranked) > demand.count:
        return topology.choose_set(
            ranked, demand.count, gpus,
            lambda ps: sign * sum(int(state.free_milli[i, p]) for p in ps))
    by_numa: dict[int, list[int]] = {}
    for p in ranked:
        by_numa.setdefault(gpus[p].numa_node, []).append(p)
    fitting = [ps[: demand.count] for ps in by_numa.values() if len(ps) >= demand.count]
    if fitting:
        return min(fitting, key=lambda ps: (sign * sum(int(state.free_milli[i, p]) for p in ps),
                                            ps))
    return ranked[: demand.count]


def build_allocation(
    state: ClusterState, request: PodRequest, i: int, positions: list[int]
) -> Allocation:
    """Per-container slices on the chosen GPUs (see ``merged_demand`` for the rule)."""
    node = state.nodes[i]
    slices: list[Slice] = []
    exclusive = any(d.exclusive for d in request.gpus)
    owned: set[int] = set()  # exclusive GPUs already held whole by an earlier container
    start = 0
    for d in request.gpus:
        if request.affinity is Affinity.POD or len(request.gpus) == 1:
            mine = positions[: d.count]
        else:
            mine = positions[start : start + d.count]
            start += d.count
        for p in mine:
            if d.exclusive and p in owned:
                slices.append(Slice(node.gpus[p].uuid, p, 0, 0, d.container))
                continue
            owned.add(p)
            slices.append(_slice(state, node.gpus[p].uuid, p, d, i))
    return Allocation(request.key, node.name, request.cpu_milli, request.memory_mib,
                      tuple(slices), exclusive)


def _slice(state: ClusterState, uuid: str, p: int, d: GpuDemand, i: int) -> Slice:
    if d.exclusive:
        memory = int(state.unit_cap[i, p]) * state.memory_unit_mib
        return Slice(uuid, p, memory, CORE_UNITS_PER_GPU, d.container)
    memory = state.units_for(d.memory_mib) * state.memory_unit_mib
    if not d.bursts:
        return Slice(uuid, p, memory, d.core_pct, d.container)
    most = min(d.memory_limit_mib, state.nodes[i].gpus[p].memory_mib)  # a burst ends at the GPU
    return Slice(uuid, p, memory, d.core_pct, d.container, max(most - memory, 0),
                 max(d.core_limit_pct - d.core_pct, 0))
