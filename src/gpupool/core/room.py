"""Room on one node once some of its pods are gone: the fit rules of ``fit.feasible_rows``
over one node's GPUs in plain integers, cheap enough to try many victim sets
(``victims`` tries them), and the core's own fit on a scratch copy of the node to check
the set chosen (``NodeRoom.verified``).

The request needs ``count`` GPUs it can use that have room (exclusive: untouched) plus
CPU and memory. ``NodeRoom.branches`` splits the search: the GPUs that have room already
count, the ``short`` more must come from the usable GPUs without room, so each branch is
one choice of ``short`` such *target* GPUs, whose pool is the pods on them (and, when the
node lacks CPU or memory, the pods that hold some). A minimal victim set always lies in
one branch's pool, and a branch needs at least as many victims as its most demanding
target: per GPU, the fewest of its pods whose memory (or compute) covers what it lacks,
largest first (``bound``).

A pod's *share* of the GPUs it holds, in milli-GPU (``share_milli``), is per GPU the
larger of its compute and memory fractions (an exclusive GPU: 1000), as
``ClusterState.usage`` counts it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations, islice

import numpy as np

from gpupool.core.allocation import Allocation
from gpupool.core.fit import Constraints, feasible_rows, need_milli
from gpupool.core.model import CORE_UNITS_PER_GPU
from gpupool.core.request import PodRequest, merged_demand
from gpupool.core.state import BoolArray, ClusterState

MILLI = 1000
BRANCHES = 64  # target choices tried per node (C(8, 4) = 70 at most on 8 GPUs)

Frees = tuple[int, int, dict[int, tuple[int, int]]]
"""What a pod frees on its node: CPU milli, memory MiB, per GPU position (units, core %)."""


def share_milli(state: ClusterState, alloc: Allocation) -> int:
    """The GPU share ``alloc`` holds, in milli-GPU."""
    i = state.index.get(alloc.gpu_node)
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


@dataclass(frozen=True, slots=True)
class Branch:
    """One choice of target GPUs and the fewest victims it needs (``bound``); its pool of
    pods is ``NodeRoom.pool_of(targets)``."""

    targets: tuple[int, ...]
    bound: int


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
    touching: dict[int, list[int]] = field(default_factory=dict)  # GPU -> removable on it
    capped: bool = False  # more target choices than BRANCHES: some were not tried
    _shares: list[int] | None = None

    @classmethod
    def of(cls, state: ClusterState, request: PodRequest, constraints: Constraints, row: int,
           removable: Sequence[Allocation], leaving: Sequence[Allocation]) -> NodeRoom | None:
        """The node's room; None when the request cannot fit even with every removable and
        leaving allocation gone (a GPU model or group it may not use, too small a node)."""
        c, i = constraints, row
        if (request.models is not None and state.nodes[i].model not in request.models) or (
                c.node_mask is not None and not c.node_mask[i]):
            return None
        n = len(state.nodes[i].gpus)
        usable = state.present[i, :n] & state.healthy[i, :n]
        if c.gpu_mask is not None:
            usable = usable & c.gpu_mask[i, :n]
        room = cls(state, request, constraints, i, usable.tolist(),
                   state.unit_free[i, :n].tolist(), state.core_free[i, :n].tolist(),
                   int(state.cpu_free[i]), int(state.mem_free[i]))
        room.units, room.core, room.cpu, room.memory = room._with(
            [room._frees(a) for a in leaving])
        room.leaving = {a.key for a in leaving}
        room.removable = list(removable)
        room.frees = [room._frees(a) for a in room.removable]
        for k, (_, _, per_gpu) in enumerate(room.frees):
            for j in per_gpu:
                room.touching.setdefault(j, []).append(k)
        return room if room.fits(tuple(range(len(room.removable)))) else None

    @property
    def shares(self) -> list[int]:
        """``share_milli`` of each removable allocation (worked out when first asked)."""
        if self._shares is None:
            self._shares = [share_milli(self.state, a) for a in self.removable]
        return self._shares

    @property
    def node(self) -> str:
        return self.state.nodes[self.row].name

    def _frees(self, alloc: Allocation) -> Frees:
        mine = alloc.part_on(self.node)  # a remote allocation frees part here, part there
        return mine.cpu_milli, mine.memory_mib, _per_gpu(self.state, mine)

    def _with(self, frees: Iterable[Frees]) -> tuple[list[int], list[int], int, int]:
        units, core, cpu, memory = list(self.units), list(self.core), self.cpu, self.memory
        for c_cpu, c_mem, per_gpu in frees:
            cpu, memory = cpu + c_cpu, memory + c_mem
            for j, (u, p) in per_gpu.items():
                units[j] += u
                core[j] += p
        return units, core, cpu, memory

    def _lacks(self, j: int, units: int, core: int) -> tuple[int, int]:
        """(memory units, core %) GPU ``j`` lacks to take the request at these free amounts."""
        d, i = merged_demand(self.request), self.row
        if d.exclusive:
            return (int(self.state.unit_cap[i, j]) - units, int(self.state.core_cap[i, j]) - core)
        return (max(0, self.state.units_for(d.memory_mib) - units), max(0, d.core_pct - core))

    def fits(self, chosen: tuple[int, ...]) -> bool:
        """Whether the request fits once the ``chosen`` removable allocations are gone."""
        request = self.request
        units, core, cpu, memory = self._with(self.frees[k] for k in chosen)
        if cpu < request.cpu_milli or memory < request.memory_mib:
            return False
        ok = sum(1 for j, use in enumerate(self.usable)
                 if use and self._lacks(j, units[j], core[j]) == (0, 0))
        return ok >= merged_demand(request).count

    def branches(self) -> Iterator[Branch]:
        """The target choices, fewest victims needed first (``BRANCHES`` at most)."""
        d = merged_demand(self.request)
        lacking = {j: self._lacks(j, self.units[j], self.core[j])
                   for j, use in enumerate(self.usable) if use}
        short = d.count - sum(1 for lack in lacking.values() if lack == (0, 0))
        extra = self._resource_pool()
        bounds = {j: b for j, lack in lacking.items() if lack != (0, 0)
                  if (b := self._bound(j, lack)) is not None}
        order = sorted(bounds, key=lambda j: (bounds[j], j))
        if short <= 0:
            yield Branch((), 1 if extra else 0)
            return
        picks = list(islice(combinations(order, short), BRANCHES + 1))
        self.capped = len(picks) > BRANCHES
        for targets in sorted(picks[:BRANCHES], key=lambda t: (max(bounds[j] for j in t), t)):
            yield Branch(targets, max(bounds[j] for j in targets))

    def pool_of(self, targets: tuple[int, ...]) -> tuple[int, ...]:
        """The pods worth choosing for ``targets``: those on them, and those holding CPU or
        memory the node lacks (indexes of ``removable``, in its order)."""
        chosen = set(self._resource_pool())
        for j in targets:
            chosen.update(self.touching.get(j, ()))
        return tuple(sorted(chosen))

    def _resource_pool(self) -> tuple[int, ...]:
        """The pods worth evicting for CPU or memory, when the node lacks them."""
        r = self.request
        cpu_short, mem_short = self.cpu < r.cpu_milli, self.memory < r.memory_mib
        return tuple(k for k, (cpu, mem, _) in enumerate(self.frees)
                     if (cpu_short and cpu > 0) or (mem_short and mem > 0))

    def _bound(self, j: int, lack: tuple[int, int]) -> int | None:
        """The fewest pods on GPU ``j`` that could cover ``lack`` (None: all of them
        cannot): per dimension, the largest first."""
        mine = [self.frees[k][2][j] for k in self.touching.get(j, ())]
        need = 0
        for dim, short in enumerate(lack):
            got, n = 0, 0
            for freed in sorted((m[dim] for m in mine), reverse=True):
                if got >= short:
                    break
                got, n = got + freed, n + 1
            if got < short:
                return None
            need = max(need, n)
        return need

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
                # every GPU healthy while the holders (their part here) are put back
                scratch.reserve(alloc.part_on(node.name))
        for j, gpu in enumerate(node.gpus):
            if not state.healthy[i, j]:
                scratch.set_health(node.name, gpu.uuid, False)
        c = self.constraints
        mine = Constraints(_row_of(c.node_mask, i), _row_of(c.gpu_mask, i), None, c.group)
        return bool(feasible_rows(scratch, self.request, mine, np.zeros(1, np.int64))[0][0])


def _row_of(mask: BoolArray | None, i: int) -> BoolArray | None:
    return None if mask is None else mask[i:i + 1]
