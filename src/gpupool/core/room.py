"""Room on one node once some of its pods are gone: the fit rules of ``fit.feasible_rows``
over one node's GPUs in plain integers, cheap enough to try thousands of victim sets
(``victims`` tries them), and the core's own fit on a scratch copy of the node to check
the set chosen (``NodeRoom.verified``).

A pod's *share* of the GPUs it holds, in milli-GPU (``share_milli``), is per GPU the
larger of its compute and memory fractions (an exclusive GPU: 1000), as
``ClusterState.usage`` counts it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from gpupool.core.allocation import Allocation
from gpupool.core.fit import Constraints, feasible_rows, need_milli
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.request import PodRequest, merged_demand
from gpupool.core.state import BoolArray, ClusterState

MILLI = 1000

Frees = tuple[int, int, dict[int, tuple[int, int]]]
"""What a pod frees on its node: CPU milli, memory MiB, per GPU position (units, core %)."""


def share_milli(state: ClusterState, alloc: Allocation) -> int:
    """The GPU share ``alloc`` holds, in milli-GPU."""
    i = state.index.get(alloc.node)
    total = 0
    for j, (units, core) in _per_gpu(state, alloc).items():
        cap = int(state.unit_cap[i, j]) if i is not None and 0 <= j < state.width else 0
        if alloc.exclusive:
            total += MILLI
        else:
            by_mem = -(-units * MILLI // cap) if cap > 0 else 0
            total += max(by_mem, core * MILLI // CORE_UNITS_PER_GPU)
    return total


def _per_gpu(state: ClusterState, alloc: Allocation) -> dict[int, tuple[int, int]]:
    """(memory units, core %) ``alloc`` holds on each GPU position."""
    out: dict[int, tuple[int, int]] = {}
    for s in alloc.slices:
        units, core = out.get(s.gpu_position, (0, 0))
        out[s.gpu_position] = (units + state.units_for(s.memory_mib), core + s.core_pct)
    return out


@dataclass(slots=True)
class NodeRoom:
    """Node ``row``'s free room with its ``leaving`` pods gone, and what each of its
    ``removable`` allocations (indexes: the sets ``fits`` is asked about) would free."""

    state: ClusterState
    request: PodRequest
    constraints: Constraints
    row: int
    usable: list[bool]
    units: list[int]
    core: list[int]
    cpu: int
    memory: int
    removable: list[Allocation] = field(default_factory=list)
    leaving: set[str] = field(default_factory=set)
    frees: list[Frees] = field(default_factory=list)
    shares: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, state: ClusterState, request: PodRequest, constraints: Constraints, row: int,
           removable: Sequence[Allocation], leaving: Sequence[Allocation]) -> NodeRoom | None:
        """The node's room; None when the request cannot fit even with every removable and
        leaving allocation gone (a GPU model or group it may not use, too small a node)."""
        c, i = constraints, row
        if not state.model_mask(request.models)[i] or (
                c.node_mask is not None and not c.node_mask[i]):
            return None
        n = len(state.nodes[i].gpus)
        usable = state.present[i, :n] & state.healthy[i, :n]
        if c.gpu_mask is not None:
            usable = usable & c.gpu_mask[i, :n]
        room = cls(state, request, constraints, i, [bool(v) for v in usable],
                   [int(v) for v in state.unit_free[i, :n]],
                   [int(v) for v in state.core_free[i, :n]], int(state.cpu_free[i]),
                   int(state.mem_free[i]))
        room.units, room.core, room.cpu, room.memory = room._with(
            [room._frees(a) for a in leaving])
        room.leaving = {a.key for a in leaving}
        room.removable = list(removable)
        room.frees = [room._frees(a) for a in room.removable]
        room.shares = [share_milli(state, a) for a in room.removable]
        return room if room.fits(tuple(range(len(room.removable)))) else None

    @property
    def node(self) -> str:
        return self.state.nodes[self.row].name

    def _frees(self, alloc: Allocation) -> Frees:
        return alloc.cpu_milli, alloc.memory_mib, _per_gpu(self.state, alloc)

    def _with(self, frees: Iterable[Frees]) -> tuple[list[int], list[int], int, int]:
        units, core, cpu, memory = list(self.units), list(self.core), self.cpu, self.memory
        for c_cpu, c_mem, per_gpu in frees:
            cpu, memory = cpu + c_cpu, memory + c_mem
            for j, (u, p) in per_gpu.items():
                units[j] += u
                core[j] += p
        return units, core, cpu, memory

    def fits(self, chosen: tuple[int, ...]) -> bool:
        """Whether the request fits once the ``chosen`` removable allocations are gone."""
        state, request, i = self.state, self.request, self.row
        units, core, cpu, memory = self._with(self.frees[k] for k in chosen)
        if cpu < request.cpu_milli or memory < request.memory_mib:
            return False
        d = merged_demand(request)
        if d.exclusive:
            cap_u, cap_c = state.unit_cap[i], state.core_cap[i]
            ok = sum(1 for j, use in enumerate(self.usable)
                     if use and units[j] == int(cap_u[j]) and core[j] == int(cap_c[j]))
        else:
            want = state.units_for(d.memory_mib)
            ok = sum(1 for j, use in enumerate(self.usable)
                     if use and units[j] >= want and core[j] >= d.core_pct)
        return ok >= d.count

    def needed(self) -> int:
        """The request's GPU share here (on its least demanding usable GPUs)."""
        d = merged_demand(self.request)
        n = len(self.usable)
        mask = np.array(self.usable, np.bool_)
        per_gpu = need_milli(self.state, d)[self.row, :n][mask]
        return d.count * int(per_gpu.min()) if per_gpu.size else 0

    def verified(self, chosen: tuple[int, ...]) -> bool:
        """The core's own fit on a scratch copy of the node without ``chosen`` and the
        leaving allocations (``fits`` must agree; a disagreement refuses the set)."""
        state, i = self.state, self.row
        node = state.nodes[i]
        gone = {self.removable[k].key for k in chosen} | self.leaving
        well = replace(node, gpus=tuple(replace(g, healthy=True) for g in node.gpus))
        scratch = ClusterState([well], state.memory_unit_mib)
        for alloc in state.allocations_on(node.name):
            if alloc.key not in gone:
                scratch.reserve(alloc)  # every GPU healthy while the holders are put back
        for j, gpu in enumerate(node.gpus):
            if not state.healthy[i, j]:
                scratch.set_health(node.name, gpu.uuid, False)
        c = self.constraints
        mine = Constraints(_row_of(c.node_mask, i), _row_of(c.gpu_mask, i), None, c.group)
        return bool(feasible_rows(scratch, self.request, mine, np.zeros(1, np.int64))[0][0])


def _row_of(mask: BoolArray | None, i: int) -> BoolArray | None:
    return None if mask is None else mask[i:i + 1]
