"""Where each request shape fits, kept up to date node by node.

``fit.feasible`` looks at every node. A scheduler asks about the same few
request shapes again and again while only the nodes it just placed on
change, so ``FeasibilityMemo`` keeps, per shape, the node verdicts and the
GPU verdicts with the node ``state.version`` they were worked out at, and
works out again only the rows whose version moved. The answer is always the
one ``fit.feasible`` gives on the current state (the property tests compare
them after random changes).

A shape is what ``fit.feasible`` reads of a request (CPU, memory, GPU models,
the merged GPU demand) plus the constraint masks, by identity: the class and
group catalogues hand out one read-only mask object per mask and cluster
epoch, so equal constraints meet the same entry, and an entry holds its masks
so that their identities cannot be reused while it lives. Requests refused as
a whole (``Constraints.blocked``) are not remembered: they fit nowhere.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from gpupool.core.fit import Constraints, demand_of, feasible, feasible_rows
from gpupool.core.request import PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray

SHAPES = 64
"""Shapes remembered (least recently used go first)."""
WHOLE = 4
"""When more than 1/WHOLE of the rows changed, all rows are worked out at once (one
contiguous pass is cheaper than gathering that many scattered rows)."""


@dataclass(slots=True)
class _Entry:
    layout: object
    node_mask: BoolArray | None  # held: the key uses these objects' identities
    gpu_mask: BoolArray | None
    seen: IntArray  # state.version of each row when its verdicts were worked out
    ok: BoolArray
    gpu_ok: BoolArray | None


class FeasibilityMemo:
    """``fit.feasible`` for every node, per request shape, recomputing changed rows only.

    Not thread-safe: use it under the lock that guards the state.
    """

    def __init__(self, shapes: int = SHAPES):
        self.shapes = shapes
        self._entries: OrderedDict[tuple[object, ...], _Entry] = OrderedDict()
        self.rows_worked = 0  # rows worked out again since creation (for tests and benches)

    def feasible(self, state: ClusterState, request: PodRequest,
                 constraints: Constraints) -> tuple[BoolArray, BoolArray | None]:
        """(node mask, GPU mask) as ``fit.feasible`` gives them; the arrays are the
        caller's (copies), so later changes do not show through them."""
        if constraints.blocked is not None or self.shapes <= 0:
            return feasible(state, request, constraints)
        key = self._key(state, request, constraints)
        entry = self._entries.get(key)
        stale = None if entry is None or entry.layout is not state.layout else \
            np.flatnonzero(entry.seen != state.version)
        if entry is None or stale is None or stale.size * WHOLE > len(state.nodes):
            entry = self._fresh(state, request, constraints)
            self._entries[key] = entry
            while len(self._entries) > self.shapes:
                self._entries.popitem(last=False)
        else:
            if stale.size:
                part, gpu_part = feasible_rows(state, request, constraints, stale)
                entry.ok[stale] = part
                if entry.gpu_ok is not None and gpu_part is not None:
                    entry.gpu_ok[stale] = gpu_part
                entry.seen[stale] = state.version[stale]
                self.rows_worked += int(stale.size)
        self._entries.move_to_end(key)
        return entry.ok.copy(), None if entry.gpu_ok is None else entry.gpu_ok.copy()

    def clear(self) -> None:
        self._entries.clear()

    def _fresh(self, state: ClusterState, request: PodRequest, c: Constraints) -> _Entry:
        ok, gpu_ok = feasible(state, request, c)
        self.rows_worked += len(state.nodes)
        return _Entry(state.layout, c.node_mask, c.gpu_mask, state.version.copy(), ok, gpu_ok)

    @staticmethod
    def _key(state: ClusterState, request: PodRequest, c: Constraints) -> tuple[object, ...]:
        d = demand_of(request)
        gpu = None if d is None else (d.count, state.units_for(d.memory_mib), d.core_pct,
                                      d.exclusive, d.mig_profile)
        return (request.cpu_milli, request.memory_mib, request.models, gpu,
                id(c.node_mask), id(c.gpu_mask))
