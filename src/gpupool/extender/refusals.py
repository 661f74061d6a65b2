"""Why filter refused each node: ``fit.explain`` sentences, cached per node version.

A table per (request shape, class, group, quota refusal, catalogue version,
layout) holds, for every node row, the sentence, whether it is permanent and
the check that failed, with the node ``state.version`` it was computed at; a
filter call explains again only the refused nodes whose version moved. So a
busy cluster does not re-explain thousands of unchanged nodes for every pod.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.fit import Constraints, explain
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState, IntArray
from gpupool.extender.metrics import Metrics

UNKNOWN_NODE = "gpupool has no GPU inventory here (no GPUDevice objects name this node)"
TABLES = 64


@dataclass(slots=True)
class ReasonTable:
    """Explanations of one request shape per node row, valid while the row's version holds."""

    version: IntArray
    sentence: np.ndarray
    permanent: np.ndarray
    check: np.ndarray


class Refusals:
    """The reason tables of one extender (use under the cache lock)."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self.tables: OrderedDict[tuple[object, ...], ReasonTable] = OrderedDict()
        self.layout: dict[str, int] | None = None  # the state.index the tables are of

    def clear(self) -> None:
        self.tables.clear()

    def of(self, state: ClusterState, request: PodRequest, c: Constraints, catalogue_version: int,
           names_of: Callable[[ClusterState], np.ndarray], node_names: Sequence[str],
           idx: IntArray, ok: np.ndarray) -> tuple[dict[str, str], dict[str, str]]:
        """(FailedNodes, FailedAndUnresolvableNodes) for the sent nodes not ``ok``
        (``idx``: their state rows, -1 for nodes without GPU inventory)."""
        fail = np.flatnonzero(~ok)
        rows = idx[fail]
        unresolvable = {node_names[k]: f"node {node_names[k]}: {UNKNOWN_NODE}"
                        for k in fail[rows < 0].tolist()}
        rows = rows[rows >= 0]
        table = self._table(state, request, c, catalogue_version)
        self._explain_stale(state, request, c, table, rows)
        perm = table.permanent[rows]
        names = names_of(state)
        failed = dict(zip(names[rows[~perm]].tolist(), table.sentence[rows[~perm]].tolist(),
                          strict=True))
        unresolvable.update(zip(names[rows[perm]].tolist(), table.sentence[rows[perm]].tolist(),
                                strict=True))
        for check, n in Counter(table.check[rows].tolist()).items():
            self.metrics.failures.labels(check).inc(n)
        return failed, unresolvable

    def _table(self, state: ClusterState, request: PodRequest, c: Constraints,
               catalogue_version: int) -> ReasonTable:
        if self.layout is not state.index:  # another layout (id(state) and epoch can
            self.tables.clear()              # repeat after a rebuild; this reference cannot)
            self.layout = state.index
        blocked = c.blocked.message if c.blocked is not None else None
        key = (request.shape, request.gpu_class, c.group, blocked, catalogue_version)
        table = self.tables.get(key)
        if table is None:
            n = len(state.nodes)
            table = ReasonTable(np.full(n, -1, np.int64), np.empty(n, dtype=object),
                                np.zeros(n, np.bool_), np.full(n, "", dtype=object))
            self.tables[key] = table
            while len(self.tables) > TABLES:
                self.tables.popitem(last=False)
        self.tables.move_to_end(key)
        return table

    @staticmethod
    def _explain_stale(state: ClusterState, request: PodRequest, c: Constraints,
                       table: ReasonTable, rows: IntArray) -> None:
        stale = rows[table.version[rows] != state.version[rows]]
        for i in np.unique(stale).tolist():
            reason = explain(state, request, i, c)
            name = state.nodes[i].name
            table.sentence[i] = reason.sentence() if reason is not None else \
                f"node {name}: {request.describe()} does not fit now"
            table.permanent[i] = bool(reason is not None and reason.permanent)
            table.check[i] = reason.check.value if reason is not None else "other"
            table.version[i] = state.version[i]
