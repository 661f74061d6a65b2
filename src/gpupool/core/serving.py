"""Where a pod's GPU slices are served: its own node, its topology domain, then any node.

A pod that allows remote slices (``Serving.REMOTE_ALLOWED``) or requires them
(``Serving.REMOTE_REQUIRED``) runs on its *home* node (kube-scheduler's choice) and may
have its slices served by a slice server on another GPU node. ``ServingPlacer.decide``
tries the serving nodes in tiers, in this order:

0. the home itself (remote-allowed: through its own devices, a local pod;
   remote-required: through a slice server beside the pod);
1. for each label of ``ServingConfig.domains`` (most specific first: a rack label, then
   ``topology.kubernetes.io/zone``), the other nodes with the home's value of that label
   (a home without the label skips that tier);
2. any other node.

Within a tier the placer's policy scores the candidate GPUs as it does for a local pod,
on the slice alone (the home holds the pod's CPU and memory). Classes, groups, GPU
permissions and quota reach the serving GPU through the same ``Constraints`` (a group's
nodes are then the nodes that may *serve* the pod; its home is kube-scheduler's). The
outcome is one ``Allocation`` with ``served_by`` set, which ``ClusterState.reserve``
takes whole, so nothing can be over-committed across local and remote slices.

``ServingPlacer.homes`` gives, per node, the best tier the pod would get running there:
the extender's filter keeps the nodes that have one (``explain_home`` says why the others
do not) and its prioritize ranks them by it; bind calls ``decide`` with the node
kube-scheduler chose. docs/design/remote.md.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from gpupool.core.allocation import Allocation
from gpupool.core.errors import InvalidInput
from gpupool.core.fit import NO_CONSTRAINTS, Constraints, demand_of, explain
from gpupool.core.placement import Placer, choose
from gpupool.core.reasons import Check, Reason
from gpupool.core.request import PodRequest, Serving
from gpupool.core.state import BoolArray, ClusterState, IntArray

ZONE_LABEL = "topology.kubernetes.io/zone"
"""The well-known node label of a zone (the default topology domain)."""
NOT_ENABLED = "remote GPU slices are not enabled on this cluster (no data-plane provider)"


@dataclass(frozen=True, slots=True)
class ServingConfig:
    """Whether remote slices can be served, and the node labels that make up topology
    domains, most specific first (policy as data: the CLI builds it once)."""

    remote: bool = False
    domains: tuple[str, ...] = (ZONE_LABEL,)

    def __post_init__(self) -> None:
        if any(not label for label in self.domains):
            raise InvalidInput("a topology domain label must not be empty")
        twice = sorted({label for label in self.domains if self.domains.count(label) > 1})
        if twice:
            raise InvalidInput(f"topology domain label {twice[0]} is listed twice")


@dataclass(frozen=True, slots=True)
class Tier:
    """A tier of serving nodes: 0 the home, then one per domain label, then any node."""

    rank: int
    label: str = ""  # a domain tier's node label
    value: str = ""  # the home's value of it

    def describe(self) -> str:
        if self.rank == 0:
            return "own node"
        return f"{self.label}={self.value}" if self.label else "any node"


OWN_NODE = Tier(0)


@dataclass(frozen=True, slots=True)
class Served:
    """The outcome for a pod on ``home``: an allocation and its tier, or why not.

    ``misses`` are the tiers tried before (or instead of) a result, each with why it had
    no room; ``refusal`` is why no tier could be tried at all (the home lacks CPU or
    memory, a quota, remote slices not enabled).
    """

    request: PodRequest
    home: str
    allocation: Allocation | None
    tier: Tier | None = None
    misses: tuple[tuple[Tier, str], ...] = ()
    refusal: Reason | None = None

    @property
    def ok(self) -> bool:
        return self.allocation is not None

    def summary(self) -> str:
        """One sentence: "pod p on n3: own node: ...; zone=a: ...; served from n7"."""
        parts = [f"{tier.describe()}: {why}" for tier, why in self.misses]
        alloc = self.allocation
        if alloc is not None and alloc.gpu_node != self.home:
            tier = self.tier.describe() if self.tier is not None else "another node"
            parts.append(f"served from {alloc.gpu_node} ({tier})")
        elif alloc is not None:
            parts.append("served by a slice server on its own node" if alloc.remote
                         else "served by its own node")
        elif self.refusal is not None:
            parts.append(self.refusal.message)
        elif not parts:
            parts.append("no room")
        return f"pod {self.request.key} on {self.home}: {'; '.join(parts)}"


@dataclass(frozen=True, slots=True)
class Homes:
    """Per node (state rows): the best tier the pod gets if it runs there; -1: none."""

    rank: IntArray

    @property
    def fits(self) -> BoolArray:
        return np.asarray(self.rank >= 0, np.bool_)


class ServingPlacer:
    """Places slices local-or-remote with one ``Placer`` (its policy decides within a
    tier). Use it from one thread at a time, as the ``Placer``."""

    def __init__(self, placer: Placer, config: ServingConfig):
        self.placer = placer
        self.config = config
        self._domains: tuple[object, tuple[IntArray, ...]] = (None, ())

    def remote_for(self, request: PodRequest) -> bool:
        """Whether ``request`` may be served from another node here."""
        return bool(request.gpus) and self.config.remote and request.serving is not Serving.LOCAL

    # -- bind: one home ---------------------------------------------------------------------
    def decide(self, state: ClusterState, request: PodRequest, home: str, rng: random.Random,
               constraints: Constraints = NO_CONSTRAINTS) -> Served:
        """The allocation of ``request`` running on ``home``, tier by tier (never
        reserves: the caller does)."""
        i = state.node_index(home)
        refusal = self._refusal(state, request, i, constraints)
        if refusal is not None:
            return Served(request, home, None, refusal=refusal)
        own = self.placer.decide(state, request, rng, constraints, np.array([i], np.int64), 1)
        if own.allocation is not None:
            return Served(request, home, self.as_asked(own.allocation, request), OWN_NODE)
        misses = [(OWN_NODE, own.reasons[0].message if own.reasons else "no room")]
        if not self.remote_for(request):
            if request.gpus and request.serving is Serving.REMOTE_ALLOWED:
                misses.append((Tier(1 + len(self.config.domains)), NOT_ENABLED))
            return Served(request, home, None, misses=tuple(misses))
        part = slice_of(request)
        cands = self.placer.candidates(state, part, constraints)
        tried = np.zeros(len(state.nodes), np.bool_)
        tried[i] = True
        for tier, mask in self._tiers(state, i):
            narrowed = cands.among(mask & ~tried)
            if narrowed.indices.size == 0:
                misses.append((tier, _no_room(state, part, mask & ~tried)))
                tried |= mask
                continue
            scores = self.placer.score(state, part, narrowed, rng)
            on = self.placer.allocate_on(state, part, narrowed, scores, choose(scores.value, rng))
            alloc = Allocation(request.key, home, request.cpu_milli, request.memory_mib,
                               on.slices, on.exclusive, on.node)
            return Served(request, home, alloc, tier, tuple(misses))
        return Served(request, home, None, misses=tuple(misses))

    def as_asked(self, alloc: Allocation, request: PodRequest) -> Allocation:
        """A local allocation as ``request`` asks it served: a remote-required pod's by a
        slice server on the same node (``served_by`` is the node), any other as it is."""
        if self.remote_for(request) and request.serving is Serving.REMOTE_REQUIRED:
            return replace(alloc, served_by=alloc.node)
        return alloc

    # -- filter and prioritize: every home at once --------------------------------------------
    def homes(self, state: ClusterState, request: PodRequest,
              constraints: Constraints = NO_CONSTRAINTS) -> Homes:
        """The tier ``decide`` would reach on each node as home (-1: it would refuse)."""
        if self._refused_everywhere(request, constraints):
            return Homes(np.full(len(state.nodes), -1, np.int64))
        local = self.placer.candidates(state, request, constraints).mask
        rank = np.where(local, 0, -1).astype(np.int64)
        if not self.remote_for(request):
            return Homes(rank)
        open_ = _hosts(state, request) & ~local
        slots = self.placer.candidates(state, slice_of(request), constraints).mask
        for r, ids in enumerate(self._domain_ids(state), start=1):
            known = ids >= 0
            counts = np.bincount(ids[slots & known], minlength=int(ids.max(initial=0)) + 1)
            others = np.where(known, counts[np.maximum(ids, 0)] - slots, 0)
            hit = open_ & known & (others > 0)
            rank[hit] = r
            open_ &= ~hit
        others = int(slots.sum()) - slots
        rank[open_ & (others > 0)] = len(self.config.domains) + 1
        return Homes(rank)

    def explain_home(self, state: ClusterState, request: PodRequest, i: int,
                     constraints: Constraints = NO_CONSTRAINTS, homes: Homes | None = None
                     ) -> Reason | None:
        """Why node ``i`` cannot be the pod's home (None: it can), for the filter; pass
        the ``homes`` already worked out for this request, or they are worked out here."""
        name = state.nodes[i].name
        refusal = self._refusal(state, request, i, constraints)
        if refusal is not None:
            return replace(refusal, node=name)
        if homes is None or homes.rank[i] >= 0 or not self.remote_for(request):
            reason = explain(state, request, i, constraints)
            if reason is None or not self.remote_for(request):
                return reason
            if (homes or self.homes(state, request, constraints)).rank[i] >= 0:
                return None
        demand = demand_of(request)
        what = demand.describe() if demand is not None else "its GPUs"
        return Reason(name, Check.REMOTE, f"{what}: no room on this node's GPUs nor, as a "
                      "remote slice, on any other node's", False)

    # -- helpers ------------------------------------------------------------------------------
    def _refused_everywhere(self, request: PodRequest, constraints: Constraints) -> bool:
        return constraints.blocked is not None or self._not_enabled(request)

    def _not_enabled(self, request: PodRequest) -> bool:
        return (bool(request.gpus) and request.serving is Serving.REMOTE_REQUIRED
                and not self.config.remote)

    def _refusal(self, state: ClusterState, request: PodRequest, i: int,
                 constraints: Constraints) -> Reason | None:
        if constraints.blocked is not None:
            return constraints.blocked
        if self._not_enabled(request):
            return Reason("", Check.REMOTE, f"{Serving.REMOTE_REQUIRED.value}: {NOT_ENABLED}",
                          True)
        if self.remote_for(request) and not (state.cpu_free[i] >= request.cpu_milli and
                                             state.mem_free[i] >= request.memory_mib):
            return explain(state, replace(request, gpus=(), models=None), i)
        return None

    def _tiers(self, state: ClusterState, i: int) -> Iterator[tuple[Tier, BoolArray]]:
        for r, (label, ids) in enumerate(zip(self.config.domains, self._domain_ids(state),
                                             strict=True), start=1):
            if ids[i] >= 0:
                yield Tier(r, label, _label(state, i, label)), np.asarray(ids == ids[i])
        yield Tier(1 + len(self.config.domains)), np.ones(len(state.nodes), np.bool_)

    def _domain_ids(self, state: ClusterState) -> tuple[IntArray, ...]:
        """Per domain label, each node's value as a number (-1: the node lacks the label);
        worked out once per cluster layout (relabelling a node changes the layout)."""
        layout, ids = self._domains
        if layout is not state.layout:
            ids = tuple(_value_ids(state, label) for label in self.config.domains)
            self._domains = (state.layout, ids)
        return ids


def slice_of(request: PodRequest) -> PodRequest:
    """The part of ``request`` a serving node holds: its GPUs, without CPU or memory."""
    return replace(request, cpu_milli=0, memory_mib=0)


def _hosts(state: ClusterState, request: PodRequest) -> BoolArray:
    """Nodes with the CPU and memory to run the pod (its home, whatever serves its GPUs)."""
    return np.asarray((state.cpu_free >= request.cpu_milli)
                      & (state.mem_free >= request.memory_mib), np.bool_)


def _label(state: ClusterState, i: int, label: str) -> str:
    return dict(state.nodes[i].labels).get(label, "")


def _value_ids(state: ClusterState, label: str) -> IntArray:
    seen: dict[str, int] = {}
    out = np.full(len(state.nodes), -1, np.int64)
    for i, node in enumerate(state.nodes):
        value = dict(node.labels).get(label)
        if value is not None:
            out[i] = seen.setdefault(value, len(seen))
    return out


def _no_room(state: ClusterState, part: PodRequest, rows: BoolArray) -> str:
    """Why a tier's nodes (``rows``) cannot serve ``part``: "none of its 3 other nodes
    with GPUs has room for 1 × (8192 MiB)"."""
    with_gpus = int((rows & state.present.any(axis=1)).sum())
    demand = demand_of(part)
    what = demand.describe() if demand is not None else "the slice"
    if with_gpus == 0:
        return "no other node with GPUs"
    nodes = "node" if with_gpus == 1 else "nodes"
    return f"none of its {with_gpus} other {nodes} with GPUs has room for {what}"
