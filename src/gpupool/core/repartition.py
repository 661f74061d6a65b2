"""MIG on demand: which GPU to repartition, and into what, for a pod no MIG device fits.

``plan`` takes a pod that asks MIG devices of a profile (``GpuDemand.mig_profile``) and
that no node can take now, and finds the node whose GPUs in MIG mode can offer the
missing devices with the least harm:

* a GPU *grows*: a new MIG device is created in memory slices no device holds
  (``mig.free_starts``), beside the devices already there, busy or not;
* a GPU whose MIG devices are all idle (no pod holds any of them) and none of the asked
  profile may be *rebuilt*: its devices are destroyed and the new one created on the
  empty GPU. A GPU with a busy MIG device is never rebuilt, and a busy device is never
  destroyed.

Among the ways to create each missing device, the one chosen is the one whose resulting
layout strands the fewest compute slices for the demand to come (``mig.stranded``, FGD's
fragmentation measure over the profiles' shares ``weights``): growing before rebuilding,
then GPUs already cut before empty ones (packing), then node order, GPU index and
placement. A node is chosen for a pod only when it can take the pod whole (CPU, memory,
GPU model, the constraints' node mask) once its devices are made; among such nodes, the
least stranding, the fewest rebuilds, then node order.

The plan is a value (``Plan``: one ``Change`` per GPU, with the layout before and after
and the reason); the caller applies it — the simulator at once (``apply``), a cluster
through the node agent, which makes the change through NVML only if the GPU has no
client on a device it destroys. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpupool.core import mig
from gpupool.core.errors import InvalidInput
from gpupool.core.fit import NO_CONSTRAINTS, Constraints, gpu_fit_mask
from gpupool.core.mig import MigDevice, MigGeometry, MigMode
from gpupool.core.model import Gpu, Node
from gpupool.core.request import GpuDemand, PodRequest, merged_demand
from gpupool.core.state import ClusterState

Allowed = Callable[[Node, Gpu], bool]
"""Whether a pod may use MIG devices of a GPU (its class, permissions, group)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One GPU's repartition: the MIG devices destroyed and created, and why."""

    node: str
    gpu: str  # the uuid of the GPU in MIG mode
    index: int
    before: tuple[MigDevice, ...]
    destroy: tuple[MigDevice, ...]
    create: tuple[MigDevice, ...]
    reason: str

    @property
    def after(self) -> tuple[MigDevice, ...]:
        kept = [d for d in self.before if d not in self.destroy]
        return tuple(sorted(kept + list(self.create), key=lambda d: d.start))

    def describe(self) -> str:
        return (f"GPU {self.index} ({self.gpu}) on {self.node}: "
                f"{mig.describe_layout(self.before)} -> {mig.describe_layout(self.after)}")


@dataclass(frozen=True, slots=True)
class Plan:
    """The changes that let ``key`` run on ``node``; ``stranded`` is how many more compute
    slices the new layouts strand than the old ones (lower is better)."""

    key: str
    node: str
    changes: tuple[Change, ...]
    stranded: float

    def describe(self) -> str:
        return "; ".join(c.describe() for c in self.changes)


@dataclass(slots=True)
class _Gpu:
    """One GPU in MIG mode while a plan is worked out."""

    gpu: Gpu
    geometry: MigGeometry
    devices: list[MigDevice]
    busy: bool  # a device of it is held (or unhealthy): it only grows
    destroyed: list[MigDevice]
    created: list[MigDevice]

    def originals(self) -> list[MigDevice]:
        """Its devices from before the plan that are still there."""
        return [d for d in self.devices if d not in self.created]

    def before(self) -> tuple[MigDevice, ...]:
        return tuple(sorted(self.originals() + self.destroyed, key=lambda d: d.start))


def layouts(node: Node) -> dict[str, list[MigDevice]]:
    """The node's GPUs in MIG mode (uuid) -> their MIG devices (by placement)."""
    out: dict[str, list[MigDevice]] = {g.uuid: [] for g in node.gpus if g.in_mig_mode}
    for g in node.gpus:
        if isinstance(g.mig, MigDevice) and g.mig.parent in out:
            out[g.mig.parent].append(g.mig)
    return {k: sorted(v, key=lambda d: d.start) for k, v in out.items()}


def plan(state: ClusterState, request: PodRequest, constraints: Constraints = NO_CONSTRAINTS,
         weights: Mapping[str, float] | None = None, allowed: Allowed | None = None
         ) -> Plan | None:
    """The best repartition that lets ``request`` run, or None: it asks no MIG device, it
    fits somewhere already, or no node's idle or growable GPUs can offer its devices."""
    return Planner().plan(state, request, constraints, weights, allowed)


_Found = tuple[tuple[float, int, int], Plan] | None


class Planner:
    """``plan``, remembering each node's best change until the node's row changes (its
    ``state.version``): the simulator asks for thousands of pods while one node changes at
    a time. Not thread-safe; only calls without ``allowed`` are remembered."""

    def __init__(self) -> None:
        self._versions: object = None
        self._memo: dict[tuple[object, ...], _Found] = {}

    def plan(self, state: ClusterState, request: PodRequest,
             constraints: Constraints = NO_CONSTRAINTS,
             weights: Mapping[str, float] | None = None, allowed: Allowed | None = None
             ) -> Plan | None:
        if not request.gpus or constraints.blocked is not None:
            return None
        demand = merged_demand(request)
        if not demand.mig_profile:
            return None
        nodes = _candidate_nodes(state, request, constraints)
        fit = gpu_fit_mask(state, demand, constraints.gpu_mask)
        if bool((fit[nodes].sum(axis=1) >= demand.count).any()):
            return None
        if self._versions is not state.version:  # a new layout: every row is new
            self._versions, self._memo = state.version, {}
        mix = tuple(sorted((weights or {}).items()))
        best: _Found = None
        for i in nodes:
            key = (int(i), int(state.version[i]), demand.mig_profile, demand.count,
                   int(fit[i].sum()), mix)
            if allowed is None and key in self._memo:
                found = self._memo[key]
            else:
                found = _plan_node(state, int(i), request.key, demand, int(fit[i].sum()),
                                   dict(mix), allowed)
                if allowed is None:
                    self._memo[key] = found
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        if best is None:
            return None
        return replace(best[1], key=request.key, changes=tuple(
            replace(c, reason=_reason(request.key, demand, c.destroy, c.create))
            for c in best[1].changes))


def _candidate_nodes(state: ClusterState, request: PodRequest, constraints: Constraints
                     ) -> np.ndarray:
    ok = (state.cpu_free >= request.cpu_milli) & (state.mem_free >= request.memory_mib)
    ok &= state.model_mask(request.models)
    if constraints.node_mask is not None:
        ok &= constraints.node_mask
    return np.flatnonzero(ok)


def _plan_node(state: ClusterState, i: int, key: str, demand: GpuDemand, have: int,
               weights: Mapping[str, float], allowed: Allowed | None
               ) -> tuple[tuple[float, int, int], Plan] | None:
    node = state.nodes[i]
    gpus = _mig_gpus(state, i, demand.mig_profile, allowed)
    cost = 0.0
    for _ in range(demand.count - have):
        step = _best_step(gpus, demand.mig_profile, weights)
        if step is None:
            return None
        cost += step
    changed = [g for g in gpus if g.created]
    changes = tuple(Change(node.name, g.gpu.uuid, g.gpu.index, g.before(),
                           tuple(g.destroyed), tuple(g.created),
                           _reason(key, demand, g.destroyed, g.created)) for g in changed)
    rebuilds = sum(1 for g in changed if g.destroyed)
    return (cost, rebuilds, i), Plan(key, node.name, changes, cost)


def _reason(key: str, demand: GpuDemand, destroyed: Sequence[MigDevice],
            created: Sequence[MigDevice]) -> str:
    made = ", ".join(d.describe() for d in created)
    how = (f"its idle MIG devices {mig.describe_layout(destroyed)} destroyed, "
           if destroyed else "")
    return (f"pod {key} asks {demand.describe()} and no GPU offers them: {how}{made} "
            "created")


def _mig_gpus(state: ClusterState, i: int, profile: str, allowed: Allowed | None
              ) -> list[_Gpu]:
    node = state.nodes[i]
    held = ~((state.core_free[i] == state.core_cap[i]) & (state.unit_free[i] == state.unit_cap[i]))
    busy_parents = {g.mig.parent for j, g in enumerate(node.gpus) if isinstance(g.mig, MigDevice)
                    and (bool(held[j]) or not bool(state.healthy[i, j]))}
    out = []
    current = layouts(node)
    for g in node.gpus:
        geometry = mig.geometry_of(g.model, g.memory_mib) if g.in_mig_mode else None
        if geometry is None or not geometry.has(profile) or not g.healthy:
            continue
        if allowed is not None and not allowed(node, g):
            continue
        out.append(_Gpu(g, geometry, list(current[g.uuid]), g.uuid in busy_parents, [], []))
    return out


def _best_step(gpus: Sequence[_Gpu], profile: str, weights: Mapping[str, float]
               ) -> float | None:
    """Create one ``profile`` device where it strands least; its extra stranding."""
    options = []
    for n, g in enumerate(gpus):
        before = mig.stranded(g.geometry, g.devices, weights)
        kept = g.devices
        starts = mig.free_starts(g.geometry, kept, profile)
        originals = g.originals()
        rebuild = (not starts and not g.busy and bool(originals)
                   and not any(d.profile == profile for d in originals))  # those count already
        if rebuild:
            kept = list(g.created)
            starts = mig.free_starts(g.geometry, kept, profile)
        for start in starts:
            new = mig.device_at(g.geometry, g.gpu.uuid, profile, start)
            delta = mig.stranded(g.geometry, [*kept, new], weights) - before
            empty = 0 if g.devices or g.created else 1
            options.append(((rebuild, delta, empty, g.gpu.index, start), n, new, rebuild))
    if not options:
        return None
    (rebuild, delta, *_), n, new, _ = min(options, key=lambda o: o[0])
    g = gpus[n]
    if rebuild:
        g.destroyed += g.originals()
        g.devices = list(g.created)
    g.devices.append(new)
    g.created.append(new)
    return delta


# -- applying a plan (the simulator; tests) ---------------------------------------------------
def device_gpu(parent: Gpu, device: MigDevice, memory_mib: int, uuid: str) -> Gpu:
    """A MIG device as a ``Gpu`` of its own: its parent's index, model, NUMA node, health
    and labels (so classes and permissions that select the GPU select its devices)."""
    return Gpu(uuid, parent.index, parent.model, memory_mib, parent.numa_node, parent.healthy,
               parent.labels, (), device)


def partitioned(node: Node, layout: Mapping[str, Iterable[MigDevice]],
                uuid_of: Callable[[MigDevice], str] | None = None) -> Node:
    """``node`` with each GPU named in ``layout`` in MIG mode and cut into those devices
    (checked against the GPU's geometry), replacing the MIG devices it had; device memory
    is the profile's, uuids from ``uuid_of`` (default ``MIG-<gpu>-<profile>@<start>``)."""
    name = uuid_of or (lambda d: f"MIG-{d.parent}-{d.profile}@{d.start}")
    by_uuid = {g.uuid: g for g in node.gpus}
    gpus = [g for g in node.gpus
            if not (isinstance(g.mig, MigDevice) and g.mig.parent in layout)]
    for uuid, devices in layout.items():
        parent = by_uuid.get(uuid)
        if parent is None:
            raise InvalidInput(f"node {node.name} has no GPU {uuid}")
        geometry = mig.geometry_of(parent.model, parent.memory_mib)
        if geometry is None:
            raise InvalidInput(f"GPU {uuid} ({parent.model}) has no MIG profiles gpupool knows")
        devices = list(devices)
        mig.check_layout(geometry, devices, f"GPU {uuid} on {node.name}")
        gpus[gpus.index(parent)] = replace(parent, mig=MigMode())
        gpus += [device_gpu(parent, d, geometry.profile(d.profile).memory_mib, name(d))
                 for d in devices]
    gpus.sort(key=lambda g: (g.index, g.mig.start if isinstance(g.mig, MigDevice) else -1))
    return replace(node, gpus=tuple(gpus))


def apply(state: ClusterState, chosen: Plan, uuid_of: Callable[[MigDevice], str] | None = None
          ) -> Node:
    """Make ``chosen``'s changes in ``state`` (its node replaced; no allocation is lost,
    since only idle devices are destroyed). Returns the new node."""
    node = state.nodes[state.node_index(chosen.node)]
    new = partitioned(node, {c.gpu: c.after for c in chosen.changes}, uuid_of)
    lost = state.replace_node(new)
    if lost:
        raise InvalidInput(f"repartition of {chosen.node} would drop {lost[0].key}")
    return new
