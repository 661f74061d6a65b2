"""Why filter refused each node: ``fit.explain`` reasons, cached per node version.

A node's reason is the one every node in the same situation gives
(``Reason.common``, behind ``gpupool:``): no node name, none of the node's own free
amounts. kube-scheduler counts identical reasons into the pod's event and condition,
``0/5000 nodes are available: 1211 gpupool: 2 GPUs with 40960 MiB + 50 % core
needed, 0 have room, ...``, and cuts that message at 1,024 bytes: reasons that named
their node would fill it with a handful of nodes and no counts. A node's own figures
are in bind's error, which is about one node. Every sentence is rendered through
``reasons.for_scheduler`` (kube-scheduler formats the counted reasons as a Go format: a
``%`` sign would be read as a verb).

A table per (request shape, class, group, quota refusal, catalogue version,
layout) holds, for every node row, the sentence, whether it is permanent and
the check that failed, with the node ``state.version`` it was computed at; a
filter call explains again only the refused nodes whose version moved. So a
busy cluster does not re-explain thousands of unchanged nodes for every pod.

Each row's sentence is kept rendered as its JSON object member (``"node":"why"``),
so an answer that refuses a thousand nodes is one join of bytes, not a dict of a
thousand strings encoded again for every pod. The scheduler sends each node once;
a name sent twice would be listed twice (Go's decoder keeps the last, the same).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass

import msgspec
import numpy as np

from gpupool.core.fit import Constraints, explain
from gpupool.core.reasons import Check, Reason, for_scheduler
from gpupool.core.request import PodRequest
from gpupool.core.state import ClusterState, IntArray
from gpupool.extender.metrics import Metrics

UNKNOWN_NODE = "gpupool has no GPU inventory here (no GPUDevice objects name this node)"
PREFIX = "gpupool: "  # which of the scheduler's filters refused, in its counted reasons
TABLES = 64
CHECKS = [c.value for c in Check] + ["other"]  # failure labels by code
OTHER = len(CHECKS) - 1
CODE = {name: k for k, name in enumerate(CHECKS)}


@dataclass(slots=True)
class ReasonTable:
    """Explanations of one request shape per node row, valid while the row's version holds:
    the ``"node":"sentence"`` JSON member, whether it is permanent, the failed check's code."""

    version: IntArray
    member: np.ndarray
    permanent: np.ndarray
    check: IntArray


def member(node: str, sentence: str) -> bytes:
    """One rendered ``"node":"sentence"`` JSON object member (the sentence as kube-scheduler
    can show it: ``reasons.for_scheduler``)."""
    return msgspec.json.encode(node) + b":" + msgspec.json.encode(for_scheduler(sentence))


def members_json(members: list[bytes]) -> bytes:
    """A JSON object of rendered ``"key":"value"`` members."""
    return b"{" + b",".join(members) + b"}"


NO_MEMBERS = members_json([])


class Refusals:
    """The reason tables of one extender (use under the cache lock)."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self.tables: OrderedDict[tuple[object, ...], ReasonTable] = OrderedDict()
        self.layout: dict[str, int] | None = None  # the state.index the tables are of

    def clear(self) -> None:
        self.tables.clear()

    def of(self, state: ClusterState, request: PodRequest, c: Constraints, catalogue_version: int,
           node_names: Sequence[str],
           idx: IntArray, ok: np.ndarray) -> tuple[bytes, bytes]:
        """(FailedNodes, FailedAndUnresolvableNodes) as JSON objects, for the sent nodes
        not ``ok`` (``idx``: their state rows, -1 for nodes without GPU inventory)."""
        fail = np.flatnonzero(~ok)
        rows = idx[fail]
        unresolvable = [member(node_names[k], UNKNOWN_NODE) for k in fail[rows < 0].tolist()]
        rows = rows[rows >= 0]
        table = self._table(state, request, c, catalogue_version)
        self._explain_stale(state, request, c, table, rows)
        perm = table.permanent[rows]
        unresolvable += table.member[rows[perm]].tolist()
        counts = np.bincount(table.check[rows], minlength=len(CHECKS))
        for code in np.flatnonzero(counts).tolist():
            self.metrics.failures.labels(CHECKS[code]).inc(int(counts[code]))
        return members_json(table.member[rows[~perm]].tolist()), members_json(unresolvable)

    def listed(self, state: ClusterState, node_names: Sequence[str], idx: IntArray,
               ok: np.ndarray, why: Callable[[int], Reason | None]) -> tuple[bytes, bytes]:
        """(FailedNodes, FailedAndUnresolvableNodes) for the sent nodes not ``ok``, each
        explained by ``why(row)`` as it stands now (no table: the reason a node cannot be a
        remote slice's home depends on the room of other nodes too)."""
        failed: list[bytes] = []
        never: list[bytes] = []
        for k in np.flatnonzero(~ok).tolist():
            i = int(idx[k])
            if i < 0:
                never.append(member(node_names[k], UNKNOWN_NODE))
                continue
            reason = why(i)
            text = PREFIX + (reason.common() if reason is not None else "does not fit now")
            check = reason.check.value if reason is not None else "other"
            self.metrics.failures.labels(check).inc()
            (never if reason is not None and reason.permanent else failed).append(
                member(state.nodes[i].name, text))
        return members_json(failed), members_json(never)

    def alike(self, state: ClusterState, node_names: Sequence[str], idx: IntArray,
              ok: np.ndarray, reason: Reason) -> tuple[bytes, bytes]:
        """As ``listed``, every sent node not ``ok`` refused for the one ``reason`` (a gang
        member's: its slices are held elsewhere, or its gang waits), rendered once."""
        value = b":" + msgspec.json.encode(for_scheduler(PREFIX + reason.common()))
        refused = np.flatnonzero(~ok).tolist()
        nodes = state.nodes
        known = [msgspec.json.encode(nodes[int(idx[k])].name) + value for k in refused
                 if idx[k] >= 0]
        never = [member(node_names[k], UNKNOWN_NODE) for k in refused if idx[k] < 0]
        if known:
            self.metrics.failures.labels(reason.check.value).inc(len(known))
        if reason.permanent:
            return NO_MEMBERS, members_json(never + known)
        return members_json(known), members_json(never)

    def _table(self, state: ClusterState, request: PodRequest, c: Constraints,
               catalogue_version: int) -> ReasonTable:
        if self.layout is not state.index:  # another layout (id(state) and epoch can
            self.tables.clear()              # repeat after a rebuild; this reference cannot)
            self.layout = state.index
        blocked = c.blocked.message if c.blocked is not None else None
        key = (_explained(request), request.gpu_class, c.group, blocked, catalogue_version,
               c.permission)
        table = self.tables.get(key)
        if table is None:
            n = len(state.nodes)
            table = ReasonTable(np.full(n, -1, np.int64), np.empty(n, dtype=object),
                                np.zeros(n, np.bool_), np.full(n, OTHER, np.int64))
            self.tables[key] = table
            while len(self.tables) > TABLES:
                self.tables.popitem(last=False)
        self.tables.move_to_end(key)
        return table

    @staticmethod
    def _explain_stale(state: ClusterState, request: PodRequest, c: Constraints,
                       table: ReasonTable, rows: IntArray) -> None:
        stale = rows[table.version[rows] != state.version[rows]]
        for i in sorted(set(stale.tolist())):
            reason = explain(state, request, i, c)
            why = reason.common() if reason is not None else \
                f"{request.describe()} does not fit now"
            table.member[i] = member(state.nodes[i].name, PREFIX + why)
            table.permanent[i] = bool(reason is not None and reason.permanent)
            table.check[i] = CODE[reason.check.value] if reason is not None else OTHER
            table.version[i] = state.version[i]


def noted(failed: bytes, unresolvable: bytes, notes: dict[str, str], sent: Set[str]
          ) -> tuple[bytes, bytes]:
    """Filter's refusals with ``notes`` (node -> why) in place of the sent nodes' reasons:
    a node where room is being made is one to wait for, never unresolvable."""
    fails: dict[str, str] = msgspec.json.decode(failed)
    never: dict[str, str] = msgspec.json.decode(unresolvable)
    for node, why in notes.items():
        if node in sent:
            never.pop(node, None)
            fails[node] = PREFIX + why
    return (members_json([member(k, v) for k, v in fails.items()]),
            members_json([member(k, v) for k, v in never.items()]))


def _explained(request: PodRequest) -> tuple[object, ...]:
    """What a node's reason depends on, of the request: its shape without the tenant
    (what a tenant changes of a reason is in the constraints: its group, its permissions,
    its quota's refusal), so that the pods of many namespaces share their tables."""
    return (request.cpu_milli, request.memory_mib,
            tuple((d.count, d.memory_mib, d.core_pct, d.mode) for d in request.gpus),
            request.models, request.selector, request.group, request.affinity)
