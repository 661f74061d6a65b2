"""Cluster state: capacities and what is free, as arrays the policies score in bulk.

``ClusterState`` owns the only mutable truth of the core: free CPU, memory and
per-GPU memory units and compute. It changes only through ``reserve`` and
``release`` (idempotent, all-or-nothing, never over-commit) and through node
and health updates. Every change bumps the node's ``version`` so scorers can
cache per node; a change of layout (nodes added, removed, relabelled) bumps
``epoch``.

Arrays are indexed ``[node]`` or ``[node, gpu position]``; positions past a
node's GPU count are absent (``present`` is False, free share is -1), and so is a GPU
in MIG mode (``core.mig``): only its MIG devices, each a position of its own, are
handed out. ``mig_kind`` says what a position is: 0 an ordinary GPU, else the id of a
MIG device's profile in ``profiles`` (``fit`` keeps each demand to its kind).

A remote allocation (``Allocation.served_by``) takes CPU and memory on the pod's node
and its slices on the serving node, in the same arrays and the same all-or-nothing
``reserve``: local and remote slices are one account per GPU.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.core.allocation import Allocation, Slice
from gpupool.core.errors import InvalidInput, OverCommit, UnknownName
from gpupool.core.mig import MigDevice
from gpupool.core.model import CORE_UNITS_PER_GPU, DEFAULT_MEMORY_UNIT_MIB, Node

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
MILLI = 1000


@dataclass(frozen=True, slots=True)
class Usage:
    """Whole-cluster GPU usage in milli-GPU (1000 = one GPU)."""

    allocated_milli: int
    capacity_milli: int
    gpus: int
    idle_gpus: int

    @property
    def allocation_ratio(self) -> float:
        return self.allocated_milli / self.capacity_milli if self.capacity_milli else 0.0


class ClusterState:
    """Free resources of every node and GPU; the single owner of reservations."""

    def __init__(self, nodes: Iterable[Node] = (), memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB):
        if memory_unit_mib <= 0:
            raise InvalidInput("memory unit must be a positive number of MiB")
        self.memory_unit_mib = memory_unit_mib
        self.nodes: list[Node] = []
        self.index: dict[str, int] = {}
        self.allocations: dict[str, Allocation] = {}
        self._by_node: dict[str, dict[str, Allocation]] = {}
        self.epoch = 0
        self._deferred: set[int] | None = None  # rows whose refresh waits (see deferred)
        self.models: list[str] = []
        self._model_ids: dict[str, int] = {}
        self.profiles: list[str] = [""]  # MIG profiles by id (0: not a MIG device)
        self._profile_ids: dict[str, int] = {"": 0}
        self._alloc_arrays(0, 1)
        self.add_nodes(nodes)

    # -- layout ---------------------------------------------------------------
    def _alloc_arrays(self, n: int, g: int) -> None:
        self.layout = object()
        """Identity of this layout: replaced whenever nodes are added, removed or replaced,
        so a cache that holds it can never mistake another layout for its own."""
        self.width = g
        self.cpu_cap = np.zeros(n, np.int64)
        self.cpu_free = np.zeros(n, np.int64)
        self.mem_cap = np.zeros(n, np.int64)
        self.mem_free = np.zeros(n, np.int64)
        self.model_id = np.zeros(n, np.int64)
        self.version = np.zeros(n, np.int64)
        self.changes = 0
        """How many row changes this layout has seen (the sum of ``version``, kept as a
        number: a stamp that moves whenever any node does, without reading every row)."""
        self.present = np.zeros((n, g), np.bool_)
        self.healthy = np.zeros((n, g), np.bool_)
        self.core_cap = np.zeros((n, g), np.int64)
        self.core_free = np.zeros((n, g), np.int64)
        self.unit_cap = np.zeros((n, g), np.int64)
        self.unit_free = np.zeros((n, g), np.int64)
        self.free_milli = np.full((n, g), -1, np.int64)
        self.mig_kind = np.zeros((n, g), np.int64)
        self.has_mig = False
        """Whether any position is a MIG device (a layout fact)."""
        self._refresh_maxima()

    def _refresh_maxima(self) -> None:
        """The largest node's capacities (layout facts, fixed until the next rebuild)."""
        self.max_gpu_milli = max(int(self.present.sum(axis=1).max(initial=0)) * MILLI, 1)
        self.max_cpu_milli = max(int(self.cpu_cap.max(initial=0)), 1)
        self.max_memory_mib = max(int(self.mem_cap.max(initial=0)), 1)

    def add_nodes(self, nodes: Iterable[Node]) -> None:
        """Add nodes (names must be new); their GPUs start empty."""
        new = list(nodes)
        if not new:
            return
        seen: set[str] = set()
        for node in new:
            if node.name in self.index or node.name in seen:
                raise InvalidInput(f"node {node.name} is already known")
            seen.add(node.name)
        self._rebuild(self.nodes + new)

    def remove_node(self, name: str) -> list[Allocation]:
        """Forget a node; returns the allocations that held anything on it (now released,
        on the other node too when served remotely)."""
        i = self.node_index(name)
        dropped = list(self._by_node.get(name, {}).values())
        for alloc in dropped:
            self._forget(alloc)
        self._by_node.pop(name, None)
        self._rebuild(self.nodes[:i] + self.nodes[i + 1 :])
        return dropped

    def replace_node(self, node: Node) -> list[Allocation]:
        """Update a node's capacity, labels or GPU health, keeping what still fits.

        Allocations whose GPUs are gone (or no longer fit) are released and returned.
        A GPU turning unhealthy keeps its allocations, as ``set_health`` does: the
        pods still run there, and its room must not look free when it recovers.
        An identical node (health included) changes nothing, not even ``epoch``, so
        per-layout caches survive watch events that repeat what is known.
        """
        i = self.node_index(node.name)
        if node == self.nodes[i] and all(
                bool(self.healthy[i, j]) == g.healthy for j, g in enumerate(node.gpus)):
            return []
        kept = list(self._by_node.get(node.name, {}).values())
        if len(node.gpus) <= self.width:
            self._refill(i, node, kept)  # the other rows stay as they are
        else:
            for alloc in kept:
                self._forget(alloc)
            nodes = list(self.nodes)
            nodes[i] = node
            self._rebuild(nodes)
        sick = self.present[i] & ~self.healthy[i]
        self.healthy[i] |= sick  # re-seat existing allocations whatever the health
        lost = []
        for alloc in kept:
            try:
                self.reserve(self._remap(alloc, node))
            except (OverCommit, UnknownName, InvalidInput):
                lost.append(alloc)
        self.healthy[i] &= ~sick
        self._refresh_row(i)
        return lost

    def _refill(self, i: int, node: Node, kept: list[Allocation]) -> None:
        """Row ``i`` made ``node`` in place (its GPUs fit the arrays' width): what ``kept``
        held is given back and forgotten, the row emptied and filled again; a new layout,
        as after ``_rebuild``."""
        for alloc in kept:
            self._apply(alloc, +1)
            self._forget(alloc)
        self.unit_cap = self.unit_cap.copy()  # a new capacity array (``fit``'s memo keys on it)
        for flags in (self.present, self.healthy):
            flags[i] = False
        for amounts in (self.core_cap, self.core_free, self.unit_cap, self.unit_free,
                        self.mig_kind):
            amounts[i] = 0
        self.nodes[i] = node
        self.layout = object()
        self._fill_row(i, node)
        self._refresh_maxima()
        self.epoch += 1

    def set_health(self, node: str, gpu_uuid: str, healthy: bool) -> None:
        i = self.node_index(node)
        j = self.gpu_position(node, gpu_uuid)
        self.healthy[i, j] = healthy
        self._refresh_row(i)

    def _remap(self, alloc: Allocation, node: Node) -> Allocation:
        if alloc.gpu_node != node.name:  # only its CPU and memory are on this node
            return alloc
        positions = {g.uuid: p for p, g in enumerate(node.gpus)}
        slices = []
        for s in alloc.slices:
            if s.gpu_uuid not in positions:
                raise UnknownName(f"GPU {s.gpu_uuid} is gone from node {node.name}")
            slices.append(Slice(s.gpu_uuid, positions[s.gpu_uuid], s.memory_mib, s.core_pct,
                                s.container))
        return Allocation(alloc.key, alloc.node, alloc.cpu_milli, alloc.memory_mib,
                          tuple(slices), alloc.exclusive, alloc.served_by)

    def _rebuild(self, nodes: list[Node]) -> None:
        width = max([len(n.gpus) for n in nodes] + [1])
        self._alloc_arrays(len(nodes), width)
        self.nodes = nodes
        self.index = {n.name: i for i, n in enumerate(nodes)}
        for i, node in enumerate(nodes):
            self._fill_row(i, node)
        self._refresh_maxima()
        for alloc in self.allocations.values():
            self._apply(alloc, -1)
        self.epoch += 1

    def _fill_row(self, i: int, node: Node) -> None:
        self.cpu_cap[i] = self.cpu_free[i] = node.cpu_milli
        self.mem_cap[i] = self.mem_free[i] = node.memory_mib
        if node.model not in self._model_ids:
            self._model_ids[node.model] = len(self.models)
            self.models.append(node.model)
        self.model_id[i] = self._model_ids[node.model]
        parents = {g.mig.parent for g in node.gpus if isinstance(g.mig, MigDevice)}
        for j, gpu in enumerate(node.gpus):
            if gpu.in_mig_mode or gpu.uuid in parents:
                continue  # a GPU in MIG mode: its MIG devices are handed out, never itself
            if gpu.mig_profile:
                self.mig_kind[i, j] = self.profile_id(gpu.mig_profile, add=True)
                self.has_mig = True
            units = gpu.memory_mib // self.memory_unit_mib
            if units <= 0:
                raise InvalidInput(
                    f"GPU {gpu.uuid} has less memory than one {self.memory_unit_mib} MiB unit"
                )
            self.present[i, j] = True
            self.healthy[i, j] = gpu.healthy
            self.core_cap[i, j] = self.core_free[i, j] = CORE_UNITS_PER_GPU
            self.unit_cap[i, j] = self.unit_free[i, j] = units
        self._refresh_row(i)

    def _refresh_row(self, i: int) -> None:
        ok = self.present[i] & self.healthy[i]
        cap_u = np.maximum(self.unit_cap[i], 1)
        share = np.minimum(
            self.core_free[i] * MILLI // CORE_UNITS_PER_GPU, self.unit_free[i] * MILLI // cap_u
        )
        self.free_milli[i] = np.where(ok, share, -1)
        self.version[i] += 1
        self.changes += 1

    # -- lookups ----------------------------------------------------------------
    def node_index(self, name: str) -> int:
        try:
            return self.index[name]
        except KeyError:
            raise UnknownName(f"node {name} is not known") from None

    def gpu_position(self, node: str, gpu_uuid: str) -> int:
        for p, gpu in enumerate(self.nodes[self.node_index(node)].gpus):
            if gpu.uuid == gpu_uuid:
                return p
        raise UnknownName(f"GPU {gpu_uuid} is not on node {node}")

    def profile_id(self, profile: str, add: bool = False) -> int:
        """The ``mig_kind`` of MIG devices of ``profile`` (0: ordinary GPUs; -1: a profile
        no device of this state has had)."""
        known = self._profile_ids.get(profile)
        if known is not None or not add:
            return -1 if known is None else known
        self._profile_ids[profile] = len(self.profiles)
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def model_mask(self, models: frozenset[str] | None) -> BoolArray:
        if models is None:
            return np.ones(len(self.nodes), np.bool_)
        ids = [self._model_ids[m] for m in models if m in self._model_ids]
        return np.isin(self.model_id, ids)

    def units_for(self, memory_mib: int) -> int:
        """GPU memory units needed for ``memory_mib`` (rounded up)."""
        return -(-memory_mib // self.memory_unit_mib)

    def allocations_on(self, node: str) -> Iterator[Allocation]:
        """The allocations that hold anything on ``node``: its pods' and, when served
        remotely, the slices its GPUs serve to pods elsewhere (``Allocation.part_on``)."""
        return iter(list(self._by_node.get(node, {}).values()))

    # -- reservations -------------------------------------------------------------
    def reserve(self, alloc: Allocation) -> None:
        """Take what ``alloc`` names, all or nothing. Idempotent for the same value.

        Raises ``OverCommit`` (nothing changed) if any GPU, CPU or memory lacks room,
        ``InvalidInput`` if the key already holds a different allocation.
        """
        held = self.allocations.get(alloc.key)
        if held is not None:
            if held == alloc:
                return
            raise InvalidInput(f"{alloc.key} already holds {held.describe()}")
        self._check(alloc)
        self._apply(alloc, -1)
        self.allocations[alloc.key] = alloc
        for name in alloc.nodes:
            self._by_node.setdefault(name, {})[alloc.key] = alloc

    def release(self, key: str) -> Allocation | None:
        """Give back what ``key`` holds; releasing twice is harmless."""
        alloc = self.allocations.get(key)
        if alloc is None:
            return None
        self._forget(alloc)
        self._apply(alloc, +1)
        return alloc

    def _forget(self, alloc: Allocation) -> None:
        del self.allocations[alloc.key]
        for name in alloc.nodes:
            self._by_node.get(name, {}).pop(alloc.key, None)

    def _check(self, alloc: Allocation) -> None:
        i = self.node_index(alloc.node)
        if alloc.cpu_milli < 0 or alloc.memory_mib < 0:
            raise InvalidInput(f"{alloc.key}: negative CPU or memory")
        if alloc.cpu_milli > self.cpu_free[i] or alloc.memory_mib > self.mem_free[i]:
            raise OverCommit(
                f"{alloc.key}: node {alloc.node} has {self.cpu_free[i]}m CPU and "
                f"{self.mem_free[i]} MiB free, {alloc.cpu_milli}m and {alloc.memory_mib} MiB asked"
            )
        self._check_slices(alloc, self.node_index(alloc.gpu_node))

    def _check_slices(self, alloc: Allocation, i: int) -> None:
        node = self.nodes[i]
        need: dict[int, list[int]] = {}
        for s in alloc.slices:
            j = s.gpu_position
            if not (0 <= j < len(node.gpus)) or node.gpus[j].uuid != s.gpu_uuid:
                raise UnknownName(f"{alloc.key}: GPU {s.gpu_uuid} is not at {j} on {node.name}")
            if not self.present[i, j]:
                raise OverCommit(f"{alloc.key}: GPU {s.gpu_uuid} is in MIG mode: only its MIG "
                                 "devices are handed out")
            if s.memory_mib < 0 or s.core_pct < 0:
                raise InvalidInput(f"{alloc.key}: negative GPU slice")
            units, core = need.setdefault(j, [0, 0])
            need[j] = [units + self.units_for(s.memory_mib), core + s.core_pct]
        for j, (units, core) in need.items():
            if not self.healthy[i, j]:
                raise OverCommit(f"{alloc.key}: GPU {node.gpus[j].uuid} is unhealthy")
            if units > self.unit_free[i, j] or core > self.core_free[i, j]:
                raise OverCommit(
                    f"{alloc.key}: GPU {node.gpus[j].uuid} on {node.name} has "
                    f"{self.unit_free[i, j] * self.memory_unit_mib} MiB and "
                    f"{self.core_free[i, j]} % free, "
                    f"{units * self.memory_unit_mib} MiB and {core} % asked"
                )

    def _apply(self, alloc: Allocation, sign: int) -> None:
        i, k = self.index[alloc.node], self.index[alloc.gpu_node]
        self.cpu_free[i] += sign * alloc.cpu_milli
        self.mem_free[i] += sign * alloc.memory_mib
        for s in alloc.slices:
            self.unit_free[k, s.gpu_position] += sign * self.units_for(s.memory_mib)
            self.core_free[k, s.gpu_position] += sign * s.core_pct
        self._touched(i)
        if k != i:
            self._touched(k)

    def _touched(self, i: int) -> None:
        if self._deferred is None:
            self._refresh_row(i)
        else:
            self._deferred.add(i)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Reserve and release many allocations, refreshing each touched row's derived
        values (``free_milli``, ``version``) once at the end rather than after each one
        (a scratch state checking a dozen ledger entries). Inside, only ``reserve`` and
        ``release`` may be called: what they check (the free arrays) stays exact, what
        the rows derive from it lags until the block ends."""
        if self._deferred is not None:
            yield
            return
        self._deferred = set()
        try:
            yield
        finally:
            rows, self._deferred = self._deferred, None
            for i in sorted(rows):
                self._refresh_row(i)

    # -- measures -------------------------------------------------------------------
    def usage(self) -> Usage:
        """GPU allocation in milli-GPU: a GPU's used share is its larger used dimension."""
        ok = self.present
        cap_u = np.maximum(self.unit_cap, 1)
        used = np.maximum(
            (self.core_cap - self.core_free) * MILLI // CORE_UNITS_PER_GPU,
            -(-(self.unit_cap - self.unit_free) * MILLI // cap_u),
        )
        gpus = int(ok.sum())
        idle = int((ok & (used == 0)).sum())
        return Usage(int(np.where(ok, used, 0).sum()), gpus * MILLI, gpus, idle)

    # -- snapshots ------------------------------------------------------------------
    def snapshot(self) -> StateCopy:
        """A copy of this state, taken cheaply enough for its owner's lock: the arrays and
        the allocations are copied whole, without Python code per allocation.
        ``StateCopy.state`` makes it a ``ClusterState`` of its own (its index of
        allocations by node is built then, by the thread that uses it, and it has a
        ``layout`` of its own so no cache keyed by layout mistakes one for the other): read
        it or change it apart from this state, which goes on changing meanwhile."""
        snap = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, np.ndarray):
                setattr(snap, name, value.copy())
        snap.layout = object()
        snap.nodes, snap.index = list(self.nodes), dict(self.index)
        snap.models, snap._model_ids = list(self.models), dict(self._model_ids)
        snap.profiles, snap._profile_ids = list(self.profiles), dict(self._profile_ids)
        snap.allocations = self.allocations.copy()
        snap._by_node = {}
        snap._deferred = None
        for i in sorted(self._deferred or ()):  # rows whose derived values still lag
            snap._refresh_row(i)
        return StateCopy(snap)


class StateCopy:
    """A ``ClusterState.snapshot``; ``state()`` finishes it into a ``ClusterState`` the
    first time (one thread at a time)."""

    __slots__ = ("_ready", "_state")

    def __init__(self, state: ClusterState):
        self._state = state
        self._ready = False

    def state(self) -> ClusterState:
        if not self._ready:
            by_node: dict[str, dict[str, Allocation]] = {}
            for key, alloc in self._state.allocations.items():
                for name in alloc.nodes:
                    by_node.setdefault(name, {})[key] = alloc
            self._state._by_node = by_node
            self._ready = True
        return self._state
