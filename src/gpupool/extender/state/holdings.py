"""Holdings: what the extender's ``ClusterState`` holds, by pod UID and by source.

A holding is reserved once and kept while at least one *source* justifies it:
``pod`` (a bound pod's decision annotation), ``load`` (a bound pod's CPU and memory
without a gpupool decision), ``ledger`` (an entry in a node's GPULedger, possibly
another replica's), ``bind`` (this replica's bind in flight) and ``assume`` (a
placement handed to kube-scheduler's bind, ``assumptions``). A pod's own record
wins over a ledger entry or a guess. An assumption gives way to anything else: to the
pod's own record, and to any record that needs its room. A holding that does not fit
this replica's view yet (its own binds in flight took the room) waits per node and is
retried whenever something on that node is released; an assumption never waits. Quota
is charged per key alongside. ``ClusterCache`` is a ``Holdings``: it owns the state these
methods reserve in, and calls them under its lock.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import replace

from gpupool.core.allocation import Allocation
from gpupool.core.eligibility import Catalogue
from gpupool.core.errors import InvalidInput, OverCommit, UnknownName
from gpupool.core.placement import Placer
from gpupool.core.quota import Charge
from gpupool.core.request import PodRequest
from gpupool.core.state import BoolArray, ClusterState
from gpupool.extender.state import ledger
from gpupool.extender.state.assumptions import ASSUME, Assumptions, Basis

log = logging.getLogger(__name__)

FINISHED_MEMORY = 200_000  # pod UIDs remembered as gone (so late ledger entries are ignored)


class Holdings:
    """Holdings by key and source, waiting holdings per node, quota charges per key."""

    def __init__(self, state: ClusterState, catalogue: Catalogue):
        self.state = state
        self.catalogue = catalogue
        self.sources: dict[str, set[str]] = {}
        self.charges: dict[str, Charge] = {}
        self.finished: OrderedDict[str, None] = OrderedDict()
        self.conflicts = 0  # holdings that could not be reserved when they arrived
        self.waiting: dict[str, dict[str, tuple[Allocation, set[str], Charge | None]]] = {}
        self.waiting_on: dict[str, tuple[str, ...]] = {}  # key -> the nodes it waits on
        self.assumptions = Assumptions()

    def hold(self, alloc: Allocation, source: str, charge: Charge | None = None) -> bool:
        """Reserve ``alloc`` for ``source`` (idempotent). False if it cannot be held."""
        key = alloc.key
        if key in self.finished:
            return False
        if source not in (ASSUME, "bind") and ASSUME in self.sources.get(key, ()):
            self.unassume(key, "yielded")  # the pod's own record (another replica bound it)
        held = self.state.allocations.get(key)
        if held is not None:
            if held == alloc or (held.node == alloc.node and
                                 held.slices == self._positioned(alloc).slices):
                self.sources.setdefault(key, set()).add(source)
                return True
            if source != "pod":  # the pod's own record wins over a ledger or a guess
                return False
            self._release(key)
        if alloc.node not in self.state.index or alloc.gpu_node not in self.state.index:
            return False
        try:
            self._reserve(alloc)
        except OverCommit as exc:
            if source not in (ASSUME, "bind") and self._make_way(alloc.gpu_node):
                return self.hold(alloc, source, charge)  # no assumption is left in its way
            self.conflicts += 1
            if source == ASSUME:
                self.assumptions.forget(key, "dropped")
            elif source != "bind":  # a record of the cluster: hold it once room frees up
                self._wait(alloc, source, charge)
            log.debug("%s waits: %s", key, exc)
            return False
        except (UnknownName, InvalidInput) as exc:
            log.info("cannot hold %s: %s", key, exc)
            return False
        self._unwait(key)
        self.sources[key] = {source}
        if charge is not None:
            self._charge(key, charge)
        return True

    def assume(self, alloc: Allocation, charge: Charge | None, now: float,
               decided: tuple[PodRequest, Placer, BoolArray | None] | None = None) -> bool:
        """Hold ``alloc``, the placement handed to bind, as an assumption (``assumptions``),
        replacing the pod's earlier one; not while the pod holds anything else (a bind in
        flight, its own ledger entry or preemption hold) or assumptions are off.
        ``decided``: (request, placer, constraints' GPU mask) it was decided from, kept as
        its ``Basis`` with the node's row version once held."""
        key = alloc.key
        if not self.assumptions.expiry_s or set(self.sources.get(key, ())) - {ASSUME}:
            return False
        self.unassume(key, "dropped")
        if not self.hold(alloc, ASSUME, charge):
            return False
        row = self.state.index.get(alloc.node)
        basis = Basis(*decided, self.state.layout, int(self.state.version[row])) \
            if decided is not None and row is not None else None
        self.assumptions.add(key, alloc.node, now, basis)
        return True

    def assumed(self, request: PodRequest, node: str, placer: Placer
                ) -> tuple[Allocation, Basis] | None:
        """Pending pod ``request``'s assumed allocation on ``node`` and its basis, when
        nothing the placement rested on has changed (``assumptions``): held by the
        assumption alone, on that node's own GPUs, for an equal request and the same
        placer and layout, the node's row untouched since. None otherwise."""
        key = request.key
        basis = self.assumptions.basis_of(key)
        alloc = self.state.allocations.get(key)
        if basis is None or alloc is None or self.sources.get(key) != {ASSUME} or \
                alloc.node != node or alloc.gpu_node != node:
            return None
        row = self.state.index.get(node)
        if row is None or basis.layout is not self.state.layout or \
                int(self.state.version[row]) != basis.version or basis.placer is not placer \
                or basis.request != request:
            return None
        return alloc, basis

    def unassume(self, key: str, outcome: str) -> None:
        """End ``key``'s assumption (``outcome``: how it ended, ``assumptions.OUTCOMES``)."""
        self.assumptions.forget(key, outcome)
        self.unhold(key, ASSUME)

    def expire_assumptions(self, now: float) -> None:
        for key in self.assumptions.due(now):
            self.unassume(key, "expired")

    def _make_way(self, node: str) -> bool:
        """End the assumptions on ``node`` (a record of the cluster needs the room); False
        when there were none."""
        keys = self.assumptions.on_node(node)
        for key in keys:
            self.unassume(key, "yielded")
        return bool(keys)

    def _wait(self, alloc: Allocation, source: str, charge: Charge | None) -> None:
        """Park a holding that does not fit this replica's view yet (e.g. its own binds in
        flight took the room); it is retried whenever something is released on a node it
        needs: its own (CPU and memory) or the one whose GPUs hold its slices (a remote
        slice's serving node). One allocation waits per key, with the sources of all: the
        pod's own record if it is among them (it wins over a ledger's or a guess, as in
        ``hold``), else the newest."""
        earlier: set[str] = set()
        for node in self.waiting_on.get(alloc.key, ()):
            queued = self.waiting.get(node, {}).get(alloc.key)
            if queued is not None:
                earlier |= queued[1]
                if "pod" in queued[1] and source != "pod":
                    alloc, charge = queued[0], queued[2]
        self._unwait(alloc.key)
        for node in alloc.nodes:
            self.waiting.setdefault(node, {})[alloc.key] = (alloc, earlier | {source}, charge)
        self.waiting_on[alloc.key] = alloc.nodes

    def _unwait(self, key: str, source: str | None = None) -> None:
        nodes = self.waiting_on.get(key)
        if nodes is None:
            return
        for node in nodes:
            queue = self.waiting.get(node, {})
            entry = queue.get(key)
            if entry is not None and source is not None:
                entry[1].discard(source)
                if entry[1]:
                    continue
            queue.pop(key, None)
            if not queue:
                self.waiting.pop(node, None)
        if all(key not in self.waiting.get(n, {}) for n in nodes):
            del self.waiting_on[key]

    def _retry(self, node: str) -> None:
        queue = self.waiting.pop(node, {})
        for key, (alloc, sources, charge) in queue.items():
            for other in self.waiting_on.pop(key, ()):
                queue_there = self.waiting.get(other)
                if other != node and queue_there is not None:
                    queue_there.pop(key, None)
                    if not queue_there:
                        del self.waiting[other]
            for source in sorted(sources):
                self.hold(alloc, source, charge)

    def _reserve(self, alloc: Allocation) -> None:
        try:
            self.state.reserve(alloc)
        except UnknownName:  # positions differ (GPU indices with gaps): look up by uuid
            self.state.reserve(self._positioned(alloc))

    def _positioned(self, alloc: Allocation) -> Allocation:
        """``alloc`` with GPU positions looked up by uuid (indices may have gaps) on the
        node whose GPUs hold its slices."""
        node = self.state.nodes[self.state.index[alloc.gpu_node]]
        if all(s.gpu_position < len(node.gpus) and node.gpus[s.gpu_position].uuid == s.gpu_uuid
               for s in alloc.slices):
            return alloc
        return replace(alloc, slices=ledger.gpu_only(alloc, node).slices)

    def _charge(self, key: str, charge: Charge) -> None:
        try:
            self.catalogue.quotas.charge(key, charge)
            self.charges[key] = charge
        except InvalidInput as exc:
            log.info("quota charge of %s: %s", key, exc)

    def unhold(self, key: str, source: str) -> None:
        """Withdraw ``source``; the key is released when no source is left."""
        self._unwait(key, source)
        sources = self.sources.get(key)
        if sources is None:
            return
        sources.discard(source)
        if not sources:
            self._release(key)

    def _release(self, key: str) -> None:
        alloc = self.state.release(key)
        self.sources.pop(key, None)
        if self.charges.pop(key, None) is not None:
            self.catalogue.quotas.refund(key)
        if alloc is not None:
            for node in alloc.nodes:  # its own node's CPU and memory, its slices' GPUs
                if node in self.waiting:
                    self._retry(node)

    def _finish(self, key: str) -> None:
        self._unwait(key)
        self.assumptions.forget(key, "dropped")
        self._release(key)
        self.finished[key] = None
        while len(self.finished) > FINISHED_MEMORY:
            self.finished.popitem(last=False)
